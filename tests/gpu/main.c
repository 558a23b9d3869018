/* make test-gpu: the CUDA backend against the CPU backend op by op, then the
   seed programs and every collective through NCCL on the visible GPUs: one
   process with a thread per GPU, or (with --processes, under torchrun,
   mpirun or srun) one process per GPU. The cases are the CPU suite's, on
   another platform. The last line is "N passed, N failed". */
#define _GNU_SOURCE /* syscall, tgkill: the hang watchdog */
#ifndef HOSTIR_CUDA
#define HOSTIR_CUDA
#endif
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../../hostir_nccl.h"
#include "../test.h"
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_build.c"
#include "../test_print.c"
#include "../test_lower.c"
#include "../test_eval.c"
#include "../test_stream.c"
#include "../test_tune.c"
#include "../test_ops.c"
#include "../test_reshard.c"
#include "../test_split.c"
#include "../test_fp8.c"
#include "../test_mesh2d.c"
#include "../test_diff.c"

/* ---- the CUDA backend against the CPU backend ---- */
static double dtype_tol(hir_dtype d) { return d == HIR_F64 ? 1e-11 : d == HIR_F32 ? 2e-5 : d == HIR_F16 ? 2e-2 : 6e-2; }

/* Runs f on one device with `b` (NULL: CPU), inputs from host, outputs back to host. */
static hir_status run_single(const hir_fusion *f, hir_backend *b, int nin, const hir_tensor *in, int nout, hir_tensor *out,
                             char *err, size_t cap) {
  hir_lower_desc ld;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_tensor din[16], dout[16];
  hir_status s;
  int i;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(dout, 0, sizeof dout);
  ed.backend = b;
  if ((s = hir_lower(f, &ld, &p)) != HIR_OK) {
    snprintf(err, cap, "lower: %.400s", hir_program_error(p));
    hir_program_free(p);
    return s;
  }
  for (i = 0; i < nin; i++) din[i] = to_backend(b, &in[i]);
  if ((s = hir_evaluator_create(p, &ed, &ev)) == HIR_OK && (s = hir_run(ev, din, nin, dout, nout)) == HIR_OK &&
      (s = hir_evaluator_sync(ev)) == HIR_OK) {
    for (i = 0; i < nout; i++) {
      hir_tensor h = to_host(b, &dout[i]);
      out[i] = tn(h.dtype, h.ndims, h.sizes);
      memcpy(out[i].data, h.data, (size_t)tnumel(&h) * hir_dtype_size(h.dtype));
      if (h.data != dout[i].data) tfree(&h);
    }
  } else {
    snprintf(err, cap, "%s", hir_evaluator_error(ev));
  }
  for (i = 0; i < nin; i++) backend_free(b, &in[i], &din[i]);
  hir_evaluator_free(ev);
  hir_program_free(p);
  return s;
}

/* f's one output on the CUDA backend against the CPU backend's, within tol;
   a failure counted and said, naming `what`. */
static void gpu_against_cpu(const hir_fusion *f, hir_backend *be, int nin, const hir_tensor *in, double tol, const char *what) {
  hir_tensor cpu, gpu;
  char err[512] = "";
  if (run_single(f, NULL, nin, in, 1, &cpu, err, sizeof err) != HIR_OK) {
    fprintf(stderr, "  %s on the CPU: %s\n", what, err);
    hir_test_failures++;
    return;
  }
  if (run_single(f, be, nin, in, 1, &gpu, err, sizeof err) != HIR_OK || !compare(&gpu, &cpu, tol, err, sizeof err, what)) {
    fprintf(stderr, "  %s\n", err);
    hir_test_failures++;
  } else {
    tfree(&gpu);
  }
  tfree(&cpu);
}

/* Every op (set, add, sub with broadcasting, sum over one and two axes,
   broadcast, matmul 2-D / batched / broadcast batch / 1-D) in every dtype. */
TEST(test_gpu_ops, "gpu/ops", TEST_GPU) {
  int dt;
  for (dt = 0; dt <= HIR_BF16; dt++) { /* the dtypes ops compute in (fp8: tests/test_fp8.c) */
    hir_fusion *f = hir_fusion_create();
    hir_dtype d = (hir_dtype)dt;
    int64_t s46[2] = {4, 6}, s6[1] = {6}, s345[3] = {3, 4, 5}, s65[2] = {6, 5}, s246[3] = {2, 4, 6}, s263[3] = {2, 6, 3};
    int f1[2] = {1, 0}, ax0 = 0, ax02[2] = {0, 2}, k, i;
    hir_tv *a = hir_input(f, d, 2), *b = hir_input(f, d, 2), *v = hir_input(f, d, 1), *c3 = hir_input(f, d, 3);
    hir_tv *w = hir_input(f, d, 2), *x = hir_input(f, d, 3), *y = hir_input(f, d, 3);
    hir_tv *vb = hir_broadcast(f, v, 2, f1);
    hir_tv *outs[11];
    hir_tensor in[7], cpu[11], gpu[11];
    char err[512] = "";
    hir_backend *be = hir_backend_cuda_create(0);
    outs[0] = hir_add(f, a, b);
    outs[1] = hir_sub(f, a, vb);                      /* a broadcast operand */
    outs[2] = hir_sum(f, a, 1, &ax0);
    outs[3] = hir_sum(f, c3, 2, ax02);
    outs[4] = hir_matmul(f, a, w);
    outs[5] = hir_matmul(f, x, w);                    /* a broadcast batch */
    outs[6] = hir_matmul(f, v, w);                    /* 1-D x 2-D */
    outs[7] = hir_set(f, c3);
    outs[8] = hir_matmul(f, x, y);                    /* batched */
    outs[9] = hir_add(f, vb, b);
    outs[10] = hir_sum(f, c3, 1, &ax0);               /* the outermost axis, as the P2P reduce-scatter sums */
    for (k = 0; k < 11; k++) hir_output(f, outs[k]);
    in[0] = trand(d, 2, s46);
    in[1] = trand(d, 2, s46);
    in[2] = trand(d, 1, s6);
    in[3] = trand(d, 3, s345);
    in[4] = trand(d, 2, s65);
    in[5] = trand(d, 3, s246);
    in[6] = trand(d, 3, s263);
    CHECK(be != NULL);
    if (run_single(f, NULL, 7, in, 11, cpu, err, sizeof err) != HIR_OK || run_single(f, be, 7, in, 11, gpu, err, sizeof err) != HIR_OK) {
      fprintf(stderr, "  gpu ops (%s): %s\n", hir_dtype_name(d), err);
      hir_test_failures++;
    } else {
      for (k = 0; k < 11; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s output %d", hir_dtype_name(d), k);
        if (!compare(&gpu[k], &cpu[k], dtype_tol(d), err, sizeof err, what)) {
          fprintf(stderr, "  gpu ops: %s\n", err);
          hir_test_failures++;
        }
        tfree(&cpu[k]);
        tfree(&gpu[k]);
      }
    }
    { /* mul and div: the elementwise kernel (NVRTC), every dtype */
      int op;
      for (op = 0; op < 2; op++) {
        hir_fusion *g = hir_fusion_create();
        hir_tv *p = hir_input(g, d, 2), *q = hir_input(g, d, 2);
        hir_tensor o1[1], o2[1];
        hir_status s1, s2;
        hir_output(g, op ? hir_div(g, p, q) : hir_mul(g, p, q));
        s1 = run_single(g, NULL, 2, in, 1, o1, err, sizeof err);
        s2 = run_single(g, be, 2, in, 1, o2, err, sizeof err);
        CHECK(s1 == HIR_OK && s2 == HIR_OK);
        if (s2 != HIR_OK) fprintf(stderr, "  gpu ops (%s): %s\n", hir_dtype_name(d), err);
        if (s1 == HIR_OK && s2 == HIR_OK && !compare(&o2[0], &o1[0], dtype_tol(d), err, sizeof err, op ? "div" : "mul")) {
          fprintf(stderr, "  gpu ops (%s): %s\n", hir_dtype_name(d), err);
          hir_test_failures++;
        }
        if (s1 == HIR_OK) tfree(&o1[0]);
        if (s2 == HIR_OK) tfree(&o2[0]);
        hir_fusion_free(g);
      }
    }
    for (i = 0; i < 7; i++) tfree(&in[i]);
    hir_backend_free(be);
    hir_fusion_free(f);
  }
}

/* add and sub of long tensors: cublasLt's transform sees them as matrices of
   65536 rows where halving allows (2^18 elements), else as one column (an
   odd length). */
/* linear + bias through cuBLASLt's BIAS epilogue, and relu(linear) and
   gelu_tanh(linear) through RELU_BIAS and GELU_BIAS, a NaN in a row of the
   input kept in every output as the CPU keeps it (counted: they must
   take f32, f16 and bf16; f64 falls back to a GEMM, an add and the op), a
   transpose and elementwise ops through the NVRTC kernels, against the CPU;
   the time of the first elementwise op (NVRTC's compile) is printed. */
static int epilogue_calls, epilogue_ok, epilogue_ops;
static hir_status (*cuda_matmul_bias)(hir_backend *, void *, const hir_tensor *, const hir_tensor *, const hir_tensor *,
                                      const hir_tensor *, hir_unary_op);
static hir_status counting_matmul_bias(hir_backend *b, void *s, const hir_tensor *d, const hir_tensor *x, const hir_tensor *y,
                                       const hir_tensor *bias, hir_unary_op op) {
  hir_status st = cuda_matmul_bias(b, s, d, x, y, bias, op);
  epilogue_calls++;
  epilogue_ok += st == HIR_OK;
  epilogue_ops |= 1 << (op == HIR_UNARY_RELU ? 1 : op == HIR_UNARY_GELU_TANH ? 2 : 0);
  return st;
}

#define EXPECT_NOTES(be, want) ((be)->notes && !strcmp((be)->notes, want) ? 1 : (hir_test_failures++, 0))

TEST(test_gpu_linear_and_kernels, "gpu/linear_and_kernels", TEST_GPU) {
  char cache[] = "/tmp/hostir-kernel-cache-XXXXXX", saved[512] = "";
  int dt, had = getenv("HOSTIR_CACHE_DIR") != NULL;
  if (had) snprintf(saved, sizeof saved, "%s", getenv("HOSTIR_CACHE_DIR"));
  if (!mkdtemp(cache)) {
    CHECK(0);
    return;
  }
  setenv("HOSTIR_CACHE_DIR", cache, 1); /* empty: the first backend compiles, the next ones load its file */
  for (dt = 0; dt <= HIR_BF16; dt++) { /* the dtypes ops compute in (fp8: tests/test_fp8.c) */
    hir_dtype d = (hir_dtype)dt;
    hir_fusion *f = hir_fusion_create();
    int64_t sa[3] = {2, 37, 64}, sw[2] = {48, 64}, sb[1] = {48}, k;
    int perm[3] = {2, 0, 1};
    hir_tv *a = hir_input(f, d, 3), *w = hir_input(f, d, 2), *b = hir_input(f, d, 1);
    hir_tv *outs[6];
    hir_tensor in[3], cpu[6], gpu[6];
    char err[512] = "";
    double t0 = hir__now_ms();
    hir_backend *be = hir_backend_cuda_create(0); /* it compiles or loads the kernels */
    double create_ms = hir__now_ms() - t0;
    outs[0] = hir_linear(f, a, w, b);
    outs[1] = hir_permute(f, a, perm);
    outs[2] = hir_unary(f, HIR_UNARY_GELU, hir_scalar_binary(f, HIR_BINARY_SUB, 0.25, a));
    outs[3] = hir_cast(f, hir_unary(f, HIR_UNARY_TANH, a), d == HIR_F32 ? HIR_BF16 : HIR_F32);
    outs[4] = hir_unary(f, HIR_UNARY_RELU, hir_linear(f, a, w, b));
    outs[5] = hir_unary(f, HIR_UNARY_GELU_TANH, hir_linear(f, a, w, b));
    for (k = 0; k < 6; k++) hir_output(f, outs[k]);
    in[0] = trand(d, 3, sa);
    in[1] = trand(d, 2, sw);
    in[2] = trand(d, 1, sb);
    tset(&in[0], 70, NAN); /* row 1 of batch 0: a NaN in every output of that row, kept by relu (torch's too) */
    CHECK(be != NULL);
    if (!be) return;
    cuda_matmul_bias = be->matmul_bias;
    be->matmul_bias = counting_matmul_bias;
    epilogue_calls = epilogue_ok = epilogue_ops = 0;
    if (run_single(f, NULL, 3, in, 6, cpu, err, sizeof err) != HIR_OK ||
        run_single(f, be, 3, in, 6, gpu, err, sizeof err) != HIR_OK) {
      fprintf(stderr, "  gpu linear (%s): %s\n", hir_dtype_name(d), err);
      hir_test_failures++;
    } else {
      if (dt < 2)
        printf("  a new backend, the elementwise kernels %s: %.1f ms\n",
               dt ? "loaded from the disk cache" : "compiled by NVRTC", create_ms);
      for (k = 0; k < 6; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s output %d", hir_dtype_name(d), (int)k);
        if (!compare(&gpu[k], &cpu[k], k == 0 || k >= 4 ? dtype_tol(d) * 4 : dtype_tol(d), err, sizeof err, what)) {
          fprintf(stderr, "  gpu linear and kernels: %s\n", err);
          hir_test_failures++;
        }
        tfree(&cpu[k]);
        tfree(&gpu[k]);
      }
    }
    CHECK(epilogue_calls == 3 && epilogue_ok == (d != HIR_F64) * 3 && epilogue_ops == 7);
    if (!EXPECT_NOTES(be, "")) fprintf(stderr, "  backend notes: %s\n", be->notes);
    for (k = 0; k < 3; k++) tfree(&in[k]);
    hir_backend_free(be);
    hir_fusion_free(f);
  }
  { /* the cache's entries: ours, 0600; altered, each is refused, compiled again and replaced */
    char cmd[600], err[300] = "";
    hir_backend *be = NULL;
    FILE *ls;
    int n = 0, mode_ok = 1;
    struct stat st;
    char line[700];
    snprintf(cmd, sizeof cmd, "ls %s/kernel-*.cubin 2>/dev/null", cache);
    if ((ls = popen(cmd, "r"))) {
      while (fgets(line, sizeof line, ls)) {
        FILE *e;
        line[strcspn(line, "\n")] = 0;
        n++;
        mode_ok &= stat(line, &st) == 0 && (st.st_mode & 0777) == 0600;
        if ((e = fopen(line, "r+b"))) fseek(e, HIR__KCACHE_HEADER + 100, SEEK_SET), fputc(0x5a ^ fgetc(e), e), fclose(e);
      }
      pclose(ls);
    }
    CHECK(n == HIR__MAP_KERNELS && mode_ok);
    CHECK(hir_backend_cuda_open(0, &be, err, sizeof err) == HIR_OK && be && be->notes && strstr(be->notes, "refused") &&
          strstr(be->notes, "compiled again"));
    if (be) printf("  altered cache entries: %s\n", be->notes);
    hir_backend_free(be);
    be = NULL;
    CHECK(hir_backend_cuda_open(0, &be, err, sizeof err) == HIR_OK && be && be->notes && !be->notes[0]); /* replaced: taken */
    hir_backend_free(be);
    be = NULL;
    CHECK(hir_backend_cuda_open(999, &be, err, sizeof err) == HIR_ERR_BACKEND && !be && strstr(err, "device 999 is not there"));
    chmod(cache, 0777); /* others may write it: not used, and said */
    CHECK(hir_backend_cuda_open(0, &be, err, sizeof err) == HIR_OK && be && strstr(be->notes, "writable by group or others"));
    hir_backend_free(be);
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    CHECK(system(cmd) == 0);
  }
  if (had) setenv("HOSTIR_CACHE_DIR", saved, 1);
  else unsetenv("HOSTIR_CACHE_DIR");
}

/* A [2, 3, R, K] whose batch axes run on from its rows (dense: one GEMM's
   M), whose two batch axes share a stride (batches [1, 0] and [0, 1] are
   the same rows: read as one M they would not be), or are swapped; through
   hir_linear with a bias (cuBLASLt's epilogue) and hir_scaled_linear (its
   fp8 GEMM, and the widened one for K 20), against the CPU backend. */
TEST(test_gpu_batches_fold, "gpu/batches_fold", TEST_GPU) {
  static const char *const layouts[3] = {"dense", "overlapping", "swapped"};
  hir_backend *be = hir_backend_cuda_create(0);
  int layout, op, k;
  CHECK(be != NULL);
  for (op = 0; be && op < 3; op++)
    for (layout = 0; layout < 3; layout++) {
      int64_t R = 5, K = op == 2 ? 20 : 32, N = 16, sa[4] = {2, 3, R, K}, sw[2] = {N, K}, sb[1] = {N}, one[1] = {1};
      hir_dtype adt = op ? HIR_F8E4M3 : HIR_F32;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, adt, 4), *w = hir_input(f, adt, 2);
      hir_tensor in[4];
      char what[96];
      int nin = op ? 4 : 3;
      if (op)
        hir_output(f, hir_scaled_linear(f, a, w, hir_input_sized(f, HIR_F32, 1, one), hir_input_sized(f, HIR_F32, 1, one), HIR_F32));
      else
        hir_output(f, hir_linear(f, a, w, hir_input(f, HIR_F32, 1)));
      in[0] = trand(adt, 4, sa); /* its 6 R K elements hold every layout's */
      in[0].strides[3] = 1, in[0].strides[2] = K;
      in[0].strides[1] = layout == 2 ? 2 * R * K : R * K;
      in[0].strides[0] = layout == 0 ? 3 * R * K : R * K;
      in[1] = trand(adt, 2, sw);
      if (op) in[2] = scale_values(1, one), in[3] = scale_values(1, one);
      else in[2] = trand(HIR_F32, 1, sb);
      snprintf(what, sizeof what, "%s, A's batches %s", op ? "scaled_linear" : "linear with a bias", layouts[layout]);
      gpu_against_cpu(f, be, nin, in, op ? 1e-3 : 8e-5, what);
      for (k = 0; k < nin; k++) tfree(&in[k]);
      hir_fusion_free(f);
    }
  hir_backend_free(be);
}

/* hir_layer_norm as one kernel (hir_backend.layer_norm, counted) against the
   CPU backend's, in every dtype: rows of 4096 (a block of 256 threads), of
   1000 and 96 (fewer threads, a row's tail), two normalized axes, rows
   longer than a block's pass, weight and bias of other dtypes or none. */
TEST(test_gpu_layer_norm, "gpu/layer_norm", TEST_GPU) {
  static const struct { hir_dtype x, w, b; int nd, naxes; int64_t sizes[3]; } cases[] = {
      {HIR_BF16, HIR_BF16, HIR_BF16, 2, 1, {333, 4096}},
      {HIR_F32, HIR_DTYPE_COUNT, HIR_DTYPE_COUNT, 2, 1, {7, 1000}},
      {HIR_F16, HIR_F32, HIR_F32, 2, 1, {64, 96}},
      {HIR_F64, HIR_F64, HIR_F64, 3, 2, {5, 3, 40}},
      {HIR_BF16, HIR_F32, HIR_DTYPE_COUNT, 2, 1, {3, 100003}},
  };
  int k;
  hir_backend *be = hir_backend_cuda_create(0);
  CHECK(be != NULL);
  if (!be) return;
  count_layer_norm(be);
  for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
    hir_fusion *f = hir_fusion_create();
    int nd = cases[k].nd, nw = cases[k].naxes, n = 1, i;
    hir_tv *x = hir_input(f, cases[k].x, nd), *w = NULL, *b = NULL;
    hir_tensor in[3];
    char what[96];
    in[0] = trand(cases[k].x, nd, cases[k].sizes);
    if (cases[k].w != HIR_DTYPE_COUNT) w = hir_input(f, cases[k].w, nw), in[n++] = trand(cases[k].w, nw, cases[k].sizes + nd - nw);
    if (cases[k].b != HIR_DTYPE_COUNT) b = hir_input(f, cases[k].b, nw), in[n++] = trand(cases[k].b, nw, cases[k].sizes + nd - nw);
    hir_output(f, hir_layer_norm(f, x, nw, w, b, 1e-5));
    snprintf(what, sizeof what, "%s layer_norm, case %d", hir_dtype_name(cases[k].x), k);
    layer_norm_calls = 0;
    gpu_against_cpu(f, be, n, in, dtype_tol(cases[k].x), what);
    CHECK(layer_norm_calls == 1); /* one kernel, not the primitives */
    for (i = 0; i < n; i++) tfree(&in[i]);
    hir_fusion_free(f);
  }
  hir_backend_free(be);
}

/* Permutes against the CPU backend's, exactly, in every element size (fp8
   1 byte to f64 8): 2-D and batched transposes by the tiled kernel (sizes no
   multiple of its 32 x 32 tiles, more tile rows than its grid's 65535), a
   permute of three axes by whichever copy takes it. */
TEST(test_gpu_transpose, "gpu/transpose", TEST_GPU) {
  static const struct { int nd; int64_t sizes[3]; int perm[3]; } cases[] = {
      {2, {70, 33}, {1, 0}}, {3, {3, 100, 257}, {0, 2, 1}}, {2, {2, 2100000}, {1, 0}}, {3, {5, 40, 3}, {2, 1, 0}}};
  static const hir_dtype dts[5] = {HIR_F32, HIR_F64, HIR_F16, HIR_BF16, HIR_F8E4M3};
  int k, d;
  hir_backend *be = hir_backend_cuda_create(0);
  CHECK(be != NULL);
  for (k = 0; be && k < (int)(sizeof cases / sizeof cases[0]); k++)
    for (d = 0; d < 5; d++) {
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, dts[d], cases[k].nd);
      hir_tensor in = trand(dts[d], cases[k].nd, cases[k].sizes);
      char what[96];
      hir_output(f, hir_permute(f, a, cases[k].perm));
      snprintf(what, sizeof what, "%s permute, case %d", hir_dtype_name(dts[d]), k);
      gpu_against_cpu(f, be, 1, &in, 0, what);
      tfree(&in);
      hir_fusion_free(f);
    }
  hir_backend_free(be);
}

/* a - b and a * b with one or both operands broadcast, down the rows (a
   row, [cols]) or along them (a value a row, [rows]), against the CPU
   backend's, in every dtype: whole 16-byte vectors a row (the vector
   kernel), rows of other lengths (the element kernel), three axes that
   collapse into two. */
TEST(test_gpu_broadcast_binary, "gpu/broadcast_binary", TEST_GPU) {
  static const struct { int nd; int64_t sizes[3]; } shapes[] = {{2, {37, 64}}, {2, {37, 60}}, {3, {5, 3, 16}}};
  int k, dt, along;
  hir_backend *be = hir_backend_cuda_create(0);
  CHECK(be != NULL);
  for (k = 0; be && k < 3; k++)
    for (dt = 0; dt <= HIR_BF16; dt++)
      for (along = 0; along < 4; along++) { /* b a row [cols] (0) or a value a row (1); then a is the broadcast one (2, 3) */
        int nd = shapes[k].nd, flags[3] = {0, 0, 0}, i, per_row = along & 1;
        hir_fusion *f = hir_fusion_create();
        hir_tv *a = hir_input(f, (hir_dtype)dt, nd), *b = hir_input(f, (hir_dtype)dt, per_row ? nd - 1 : 1), *bb;
        hir_tensor in[2];
        char what[96];
        for (i = 0; i < nd; i++) flags[i] = per_row ? i == nd - 1 : i < nd - 1;
        bb = hir_broadcast(f, b, nd, flags);
        hir_output(f, along == 1 ? hir_mul(f, a, bb) : along == 0 ? hir_sub(f, a, bb) : hir_sub(f, bb, a));
        in[0] = trand((hir_dtype)dt, nd, shapes[k].sizes);
        in[1] = per_row ? trand((hir_dtype)dt, nd - 1, shapes[k].sizes) : trand((hir_dtype)dt, 1, shapes[k].sizes + nd - 1);
        snprintf(what, sizeof what, "%s %s, shape %d", hir_dtype_name((hir_dtype)dt),
                 along == 0 ? "a - b[col]" : along == 1 ? "a * b[row]" : along == 2 ? "b[col] - a" : "b[row] - a", k);
        gpu_against_cpu(f, be, 2, in, dtype_tol((hir_dtype)dt), what);
        tfree(&in[0]);
        tfree(&in[1]);
        hir_fusion_free(f);
      }
  hir_backend_free(be);
}

TEST(test_gpu_long_binary, "gpu/long_binary", TEST_GPU) {
  int64_t sizes[2][2] = {{4, 65536}, {3, 100003}};
  int k;
  for (k = 0; k < 2; k++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2);
    hir_tensor in[2], cpu[2], gpu[2];
    hir_backend *be = hir_backend_cuda_create(0);
    char err[512] = "";
    int i;
    hir_output(f, hir_add(f, a, b));
    hir_output(f, hir_sub(f, a, b));
    in[0] = trand(HIR_F32, 2, sizes[k]);
    in[1] = trand(HIR_F32, 2, sizes[k]);
    if (!be || run_single(f, NULL, 2, in, 2, cpu, err, sizeof err) != HIR_OK || run_single(f, be, 2, in, 2, gpu, err, sizeof err) != HIR_OK) {
      fprintf(stderr, "  long binary: %s\n", be ? err : "no GPU");
      hir_test_failures++;
    } else {
      for (i = 0; i < 2; i++) {
        if (!compare(&gpu[i], &cpu[i], dtype_tol(HIR_F32), err, sizeof err, i ? "long sub" : "long add")) {
          fprintf(stderr, "  %s\n", err);
          hir_test_failures++;
        }
        tfree(&cpu[i]);
        tfree(&gpu[i]);
      }
    }
    tfree(&in[0]);
    tfree(&in[1]);
    hir_backend_free(be);
    hir_fusion_free(f);
  }
}

/* Sums on every path of the CUDA backend, in every dtype: short axes of
   whole 16-byte rows by hostir's kernel (one launch, several for more than
   65535 rows outside, two axes in a row), the innermost axis by the rows
   kernel (aligned rows 16 bytes a thread, odd ones one value a thread, more
   rows than its grid), other long axes (over 256) and rows of an odd length
   by the GEMM against ones. */
TEST(test_gpu_sum, "gpu/sum", TEST_GPU) {
  static const struct { int nd; int64_t sizes[3]; int naxes, axes[2]; } cases[] = {
      {2, {4, 2048}, 1, {0}},        /* the partials of a reduce-scatter */
      {3, {3, 5, 264}, 1, {1}},      /* rows outside and inside */
      {3, {70000, 2, 8}, 1, {1}},    /* more than 65535 rows outside: two launches */
      {3, {4, 6, 16}, 2, {0, 2}},    /* the kernel, then the GEMM (rows of one value) */
      {3, {2, 300, 64}, 1, {1}},     /* a long axis: the GEMM */
      {3, {3, 7, 1001}, 1, {1}},     /* odd rows: the GEMM */
      {2, {1000, 4096}, 1, {1}},     /* the innermost axis: the rows kernel, 16 bytes a thread */
      {3, {9, 2, 1001}, 1, {2}},     /* odd rows: one value a thread */
      {2, {1100000, 3}, 1, {1}},     /* more rows than the rows kernel's grid */
      {2, {5, 300}, 2, {0, 1}},      /* everything: the short-axis kernel, then the rows kernel */
  };
  int dt, k;
  hir_backend *be = hir_backend_cuda_create(0);
  CHECK(be != NULL);
  for (dt = 0; be && dt <= HIR_BF16; dt++) /* the dtypes ops compute in */
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, (hir_dtype)dt, cases[k].nd);
      hir_tensor in = trand((hir_dtype)dt, cases[k].nd, cases[k].sizes);
      char what[96];
      hir_output(f, hir_sum(f, a, cases[k].naxes, cases[k].axes));
      snprintf(what, sizeof what, "%s sum, case %d", hir_dtype_name((hir_dtype)dt), k);
      gpu_against_cpu(f, be, 1, &in, dtype_tol((hir_dtype)dt), what);
      tfree(&in);
      hir_fusion_free(f);
    }
  hir_backend_free(be);
}

/* max_abs (how the tuner compares outputs on the GPU) against the CPU
   backend's, in every dtype, on a length that is no multiple of a block,
   and with a NaN planted (it counts as infinite). */
TEST(test_gpu_max_abs, "gpu/max_abs", TEST_GPU) {
  static const hir_dtype dts[4] = {HIR_F32, HIR_F64, HIR_F16, HIR_BF16};
  hir_backend *be = hir_backend_cuda_create(0), *cpu = hir_backend_cpu_create();
  int64_t sz[2] = {37, 1001};
  int k, nan;
  for (k = 0; k < 4; k++)
    for (nan = 0; nan < 2; nan++) {
      hir_tensor a = trand(dts[k], 2, sz), b = trand(dts[k], 2, sz), da, db;
      double want[2], got[2] = {-1, -1};
      tset(&a, 12345, tget(&a, 12345) + 7.5); /* the largest difference (over 5.5), somewhere inside */
      if (nan) tset(&a, 777, NAN);
      da = to_backend(be, &a), db = to_backend(be, &b);
      CHECK(cpu->max_abs(cpu, NULL, &a, &b, &want[0], &want[1]) == HIR_OK);
      CHECK(be->max_abs(be, NULL, &da, &db, &got[0], &got[1]) == HIR_OK);
      if (!(nan ? isinf(got[0]) && isinf(want[0]) : fabs(got[0] - want[0]) <= 1e-6 * want[0] && got[0] > 5.4) ||
          !(fabs(got[1] - want[1]) <= 1e-6 * want[1] && got[1] > 0.5)) {
        printf("  %s%s: %g %g, want %g %g\n", hir_dtype_name(dts[k]), nan ? " with a NaN" : "", got[0], got[1], want[0], want[1]);
        hir_test_failures++;
      }
      backend_free(be, &a, &da), backend_free(be, &b, &db);
      tfree(&a), tfree(&b);
    }
  hir_backend_free(be);
  hir_backend_free(cpu);
}

/* The caller's tensors in memory the GPU cannot reach: host memory from
   malloc (refused by name, unless the GPU reads pageable memory: then it
   runs), another GPU's (refused), pinned host memory (runs). Each refusal
   leaves the evaluator usable: the next run on device memory gives the
   numbers. out = in + 1.5 (an input, then an output in such memory). */
TEST(test_gpu_unreachable_memory, "gpu/unreachable_memory", TEST_GPU) {
  enum { N = 4096 };
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 1);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_lower_desc ld;
  hir_tensor in, out;
  float *host = (float *)malloc(N * sizeof(float)), *pinned = NULL, *dev = NULL, *dev_out = NULL, *other = NULL, got[N];
  int pageable = 0, ngpu = 0, where, k, i;
  hir_output(f, hir_scalar_binary(f, HIR_BINARY_ADD, 1.5, x));
  memset(&ed, 0, sizeof ed);
  memset(&ld, 0, sizeof ld);
  CHECK((ed.backend = hir_backend_cuda_create(0)) != NULL && host);
  if (!ed.backend || !host) {
    hir_backend_free(ed.backend);
    free(host);
    hir_fusion_free(f);
    return;
  }
  cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
  cudaGetDeviceCount(&ngpu);
  CHECK(cudaMallocHost((void **)&pinned, N * sizeof(float)) == cudaSuccess && cudaMalloc((void **)&dev, N * sizeof(float)) == cudaSuccess &&
        cudaMalloc((void **)&dev_out, N * sizeof(float)) == cudaSuccess);
  if (ngpu > 1) {
    cudaSetDevice(1);
    CHECK(cudaMalloc((void **)&other, N * sizeof(float)) == cudaSuccess);
    cudaSetDevice(0);
  }
  for (i = 0; i < N; i++) host[i] = pinned[i] = (float)(i % 97) - 40.0f;
  cudaMemcpy(dev, host, N * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize(); /* a pageable copy returns once staged; the evaluator's streams do not wait for it */
  CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  memset(&in, 0, sizeof in);
  in.dtype = HIR_F32, in.ndims = 1, in.sizes[0] = N;
  for (where = 0; ev && where < 3; where++)   /* host memory, pinned memory, another GPU's */
    for (k = 0; k < 2; k++) { /* the input there, then the output */
      float *there = where == 0 ? host : where == 1 ? pinned : other;
      int reach = where == 1 || (where == 0 && pageable);
      hir_status s;
      if (!there) continue;
      if (k == 1 && where != 2) for (i = 0; i < N; i++) there[i] = 1e30f; /* poisoned */
      in.data = k ? dev : there;
      out = in, out.data = k ? there : dev_out;
      s = hir_run(ev, &in, 1, &out, 1);
      if (s == HIR_OK) s = hir_evaluator_sync(ev);
      if (reach) {
        if (s != HIR_OK) fprintf(stderr, "  %s memory: %s\n", where ? "pinned" : "pageable", hir_evaluator_error(ev));
        CHECK(s == HIR_OK);
        if (k) memcpy(got, there, sizeof got);
        else cudaMemcpy(got, dev_out, sizeof got, cudaMemcpyDeviceToHost);
        for (i = 0; s == HIR_OK && i < N; i++)
          if (got[i] != (float)(i % 97) - 38.5f) {
            fprintf(stderr, "  %s memory, element %d: %g\n", where ? "pinned" : "pageable", i, got[i]);
            CHECK(0);
            break;
          }
      } else {
        const char *want = where == 0 ? "is host memory this GPU cannot read" : "is memory of GPU 1, and this backend runs on GPU 0";
        if (!(s == HIR_ERR_INVALID && strstr(hir_evaluator_error(ev), want) && strstr(hir_evaluator_error(ev), k ? "output 0 (T" : "input 0 (T")))
          fprintf(stderr, "  %s: %s\n", hir_status_str(s), hir_evaluator_error(ev)), hir_test_failures++;
        in.data = dev, out.data = dev_out; /* then device memory runs */
        cudaMemset(dev_out, 0, N * sizeof(float));
        cudaDeviceSynchronize();
        CHECK(hir_run(ev, &in, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
        cudaMemcpy(got, dev_out, sizeof got, cudaMemcpyDeviceToHost);
        CHECK(got[N - 1] == (float)((N - 1) % 97) - 38.5f);
      }
    }
  printf("  pageable host memory %s on this GPU; %s\n", pageable ? "readable" : "not readable", ngpu > 1 ? "another GPU's refused" : "one GPU");
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaFree(dev_out);
  if (other) cudaFree(other);
  free(host);
  hir_fusion_free(f);
}

/* An output larger than the GPU: HIR_ERR_NOMEM naming the allocation, and
   the evaluator (and the GPU's context) usable after it: the next run, of a
   shape that fits, gives the numbers. out [N, N] = x [N] * y [N], each
   broadcast along the other's axis. */
TEST(test_gpu_out_of_memory, "gpu/out_of_memory", TEST_GPU) {
  static const int column[2] = {0, 1}, row[2] = {1, 0};
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 1), *y = hir_input(f, HIR_F32, 1);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_lower_desc ld;
  hir_tensor in[2], hin[2], out, host;
  int k, i, j;
  hir_output(f, hir_mul(f, hir_broadcast(f, x, 2, column), hir_broadcast(f, y, 2, row)));
  memset(&ed, 0, sizeof ed);
  memset(&ld, 0, sizeof ld);
  CHECK((ed.backend = hir_backend_cuda_create(0)) != NULL);
  if (ed.backend) CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  for (k = 0; ev && k < 2; k++) {
    int64_t n = k ? 300 : 600000; /* 600000^2 floats: 1.44 TB */
    hir_status s;
    hin[0] = trand(HIR_F32, 1, &n), hin[1] = trand(HIR_F32, 1, &n);
    in[0] = to_backend(ed.backend, &hin[0]), in[1] = to_backend(ed.backend, &hin[1]);
    memset(&out, 0, sizeof out);
    s = hir_run(ev, in, 2, &out, 1);
    if (s == HIR_OK) s = hir_evaluator_sync(ev);
    if (!k) {
      if (!(s == HIR_ERR_NOMEM && strstr(hir_evaluator_error(ev), "cudaMalloc of 1440000000000 bytes failed")))
        fprintf(stderr, "  %s: %s\n", hir_status_str(s), hir_evaluator_error(ev)), hir_test_failures++;
    } else if (s != HIR_OK) {
      fprintf(stderr, "  after the failed run: %s\n", hir_evaluator_error(ev));
      CHECK(0);
    } else {
      host = to_host(ed.backend, &out);
      for (i = 0; i < n; i++)
        for (j = 0; j < n; j++)
          if (tget(&host, i * n + j) != (double)(float)(tget(&hin[0], i) * tget(&hin[1], j))) {
            fprintf(stderr, "  after the failed run, element [%d, %d]: %g\n", i, j, tget(&host, i * n + j));
            CHECK(0);
            i = j = (int)n;
          }
      tfree(&host);
    }
    for (i = 0; i < 2; i++) backend_free(ed.backend, &hin[i], &in[i]), tfree(&hin[i]);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(f);
}

/* TF32 is off by default (f32 matmuls exact to f32), and the option turns it on. */
TEST(test_gpu_tf32, "gpu/tf32", TEST_GPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2);
  int64_t sa[2] = {64, 512}, sb[2] = {512, 64};
  hir_tensor in[2], ref[1], off[1], on[1];
  char err[512];
  hir_backend *be = hir_backend_cuda_create(0);
  double e_off = 0, e_on = 0, norm = 0;
  int64_t i;
  hir_output(f, hir_matmul(f, a, b));
  in[0] = trand(HIR_F32, 2, sa);
  in[1] = trand(HIR_F32, 2, sb);
  CHECK(run_single(f, NULL, 2, in, 1, ref, err, sizeof err) == HIR_OK);
  CHECK(run_single(f, be, 2, in, 1, off, err, sizeof err) == HIR_OK);
  hir_backend_cuda_set_tf32(be, 1);
  CHECK(run_single(f, be, 2, in, 1, on, err, sizeof err) == HIR_OK);
  for (i = 0; i < 64 * 64; i++) {
    double r = tget(&ref[0], i);
    e_off += (tget(&off[0], i) - r) * (tget(&off[0], i) - r);
    e_on += (tget(&on[0], i) - r) * (tget(&on[0], i) - r);
    norm += r * r;
  }
  e_off = sqrt(e_off / norm);
  e_on = sqrt(e_on / norm);
  printf("  tf32: relative error %.2e off, %.2e on\n", e_off, e_on);
  CHECK(e_off < 1e-6);
  CHECK(e_on > 1e-5 && e_on < 1e-2);
  tfree(&in[0]);
  tfree(&in[1]);
  tfree(&ref[0]);
  tfree(&off[0]);
  tfree(&on[0]);
  hir_backend_free(be);
  hir_fusion_free(f);
}

/* The P2P schedules on a mesh that is not 0..D-1. */
TEST(test_gpu_odd_mesh_p2p, "gpu/odd_mesh_p2p", TEST_GPU_WORLDS) {
  static const int mesh[4] = {2, 0, 3, 1};
  static const char *names[2] = {"AG_matmul_P2p", "matmul_RS_p2p"};
  static const seed_fn fns[2] = {seed_ag_matmul_p2p, seed_matmul_rs_p2p};
  int k, ring, bounded;
  for (k = 0; k < 2; k++)
    for (ring = 0; ring < 2; ring++)
      for (bounded = 0; bounded < 2; bounded++) {
        lowered_case lc;
        spmd_case c;
        seed s;
        char what[128];
        fns[k](&s, hir_fusion_create(), 4, mesh);
        memset(&lc, 0, sizeof lc);
        lc.f = s.f;
        lc.d.stream.schedule = ring ? HIR_P2P_RING : HIR_P2P_LINEAR;
        lc.d.stream.bounded_buffers = bounded;
        case_init(&c, 4);
        c.nstreams = 2;
        c.tol = 1e-4;
        c.build = build_lowered_with;
        c.user = &lc;
        seed_data(&c, names[k], 4);
        snprintf(what, sizeof what, "%s on {2 0 3 1} (%s%s)", names[k], ring ? "ring" : "linear", bounded ? ", bounded" : "");
        RUN_CASE(&c, what);
        hir_fusion_free(s.f);
      }
}

/* Graph mode on one GPU: a GEMM pipelined over 4 chunks on 2 streams is
   captured on its second run (streams forked and joined inside the
   capture), replayed on the third without walking the host program, and
   captured again when its input moves, or comes again in other strides
   (after one eager run that makes the buffer it is copied through);
   the numbers are A x B every time (the output poisoned before each run),
   and replay's host cost is shown beside the eager run's. */
TEST(test_gpu_graph_replay, "gpu/graph_replay", TEST_GPU) {
  const int64_t S = 4, M = 64, K = 96, N = 80;
  int64_t sa[3] = {S, M, K}, sb[2] = {K, N}, so[3] = {S, M, N}, i, j, k;
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  hir_tensor in[2], din[2], out, dout, got, moved;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_backend *be = hir_backend_cuda_create(0);
  double host_us[4] = {0, 0, 0, 0};
  int run, ok = 1, graphs[4] = {0, 0, 0, 0};
  hir_output(f, c);
  hir_parallelize(c, 0, HIR_STREAM); /* the GEMM chunk by chunk, A read a chunk at a time */
  memset(&ed, 0, sizeof ed);
  ed.backend = be;
  ed.number_of_streams = 2;
  ed.graph = 1;
  in[0] = trand(HIR_F32, 3, sa);
  in[1] = trand(HIR_F32, 2, sb);
  out = tn(HIR_F32, 3, so);
  din[0] = to_backend(be, &in[0]);
  din[1] = to_backend(be, &in[1]);
  CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  for (run = 0; run < 4 && ev; run++) {
    double t0;
    if (run == 3) { /* the input moves: captured again */
      moved = to_backend(be, &in[0]);
      backend_free(be, &in[0], &din[0]);
      din[0] = moved;
    }
    for (i = 0; i < S * M * N; i++) tset(&out, i, NAN);
    dout = to_backend(be, &out);
    t0 = hir__now_ms();
    CHECK(hir_run(ev, din, 2, &dout, 1) == HIR_OK);
    host_us[run] = (hir__now_ms() - t0) * 1e3;
    CHECK(hir_evaluator_sync(ev) == HIR_OK);
    graphs[run] = ev->ngraphs;
    got = to_host(be, &dout);
    for (i = 0; i < S * M; i++)
      for (j = 0; j < N; j++) {
        double want = 0;
        for (k = 0; k < K; k++) want += tget(&in[0], i * K + k) * tget(&in[1], k * N + j);
        ok &= fabs(tget(&got, i * N + j) - want) < 1e-3;
      }
    tfree(&got);
    backend_free(be, &out, &dout);
  }
  for (run = 0; run < 2 && ev; run++) { /* A's buffer again, read as laid out [S, K, M]: copied through a buffer of
                                            the evaluator's, made by an eager run, then another graph */
    hir_tensor view[2];
    view[0] = din[0], view[1] = din[1];
    view[0].strides[0] = M * K, view[0].strides[1] = 1, view[0].strides[2] = M;
    for (i = 0; i < S * M * N; i++) tset(&out, i, NAN);
    dout = to_backend(be, &out);
    CHECK(hir_run(ev, view, 2, &dout, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK && ev->ngraphs == 2 + run);
    got = to_host(be, &dout);
    for (i = 0; i < S * M; i++)
      for (j = 0; j < N; j++) {
        double want = 0;
        for (k = 0; k < K; k++) want += tget(&in[0], (i / M) * M * K + i % M + k * M) * tget(&in[1], k * N + j);
        ok &= fabs(tget(&got, i * N + j) - want) < 1e-3;
      }
    tfree(&got);
    backend_free(be, &out, &dout);
  }
  CHECK(ok);
  CHECK(graphs[0] == 0 && graphs[1] == 1 && graphs[2] == 1 && graphs[3] == 2); /* eager, captured, replayed, captured */
  CHECK(p && !strstr(hir_program_plan(p), "graph: eager"));
  if (p && strstr(hir_program_plan(p), "graph: eager")) fprintf(stderr, "  plan: %s\n", hir_program_plan(p));
  printf("  host time of hir_run: eager %.0f us, capture %.0f us, replay %.0f us\n", host_us[0], host_us[1], host_us[2]);
  hir_evaluator_free(ev);
  hir_program_free(p);
  backend_free(be, &in[0], &din[0]);
  backend_free(be, &in[1], &din[1]);
  hir_backend_free(be);
  tfree(&in[0]);
  tfree(&in[1]);
  tfree(&out);
  hir_fusion_free(f);
}

/* A communicating program in graph mode whose input moves on one rank after
   the capture: that rank refuses the run (its graph would launch NCCL
   collectives its peers did not capture alike), and the peer replaying its
   own graph ends in an error too, within the timeout, not a hang. A world
   of its own: this one ends aborted. */
typedef struct graph_moved {
  hir_comm *comm[2];
  hir_fusion *f;
  hir_tensor in[2];
  hir_status status[2];
  char error[2][512];
} graph_moved;

static hir_status graph_moved_rank(int rank, void *user) {
  graph_moved *x = (graph_moved *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor d, out;
  hir_status s = HIR_OK;
  int run;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.comm = x->comm[rank];
  ed.backend = hir_backend_cuda_create(rank);
  ed.graph = 1;
  ed.timeout_ms = 5000;
  d = to_backend(ed.backend, &x->in[rank]);
  if (hir_lower(x->f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK) s = HIR_ERR_INTERNAL;
  for (run = 0; run < 4 && s == HIR_OK; run++) {
    if (run == 3 && rank == 0) { /* rank 0's input moves; rank 1 replays */
      hir_tensor moved = to_backend(ed.backend, &x->in[rank]);
      backend_free(ed.backend, &x->in[rank], &d);
      d = moved;
    }
    memset(&out, 0, sizeof out);
    if ((s = hir_run(ev, &d, 1, &out, 1)) == HIR_OK) s = hir_evaluator_sync(ev);
  }
  x->status[rank] = s;
  snprintf(x->error[rank], sizeof x->error[rank], "%s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  backend_free(ed.backend, &x->in[rank], &d);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  return s;
}

TEST(test_gpu_graph_moved, "gpu/graph_moved_refused", TEST_GPU_THREADS) {
  hir_nccl_world *w = NULL;
  graph_moved x;
  seed sd;
  int mesh[2] = {0, 1}, r;
  int64_t sz[2] = {1, 4096};
  double t0;
  if (platform->max_world < 2) {
    printf("  (skipped: one GPU)\n");
    return;
  }
  memset(&x, 0, sizeof x);
  if (hir_nccl_world_create(2, &w) != HIR_OK) {
    CHECK(w == NULL);
    hir_nccl_world_free(w);
    return;
  }
  seed_allgather_p2p(&sd, hir_fusion_create(), 2, mesh);
  x.f = sd.f;
  for (r = 0; r < 2; r++) x.comm[r] = hir_nccl_world_comm(w, r), x.in[r] = trand(HIR_F32, 2, sz);
  t0 = hir__now_ms();
  CHECK(hir_spmd(2, graph_moved_rank, &x) != HIR_OK);
  CHECK(hir__now_ms() - t0 < 20000);
  CHECK(x.status[0] == HIR_ERR_INVALID && strstr(x.error[0], "moved (or changed its strides"));
  CHECK(x.status[1] == HIR_ERR_COMM || x.status[1] == HIR_ERR_TIMEOUT);
  for (r = 0; r < 2; r++) printf("  rank %d: %s: %.160s\n", r, hir_status_str(x.status[r]), x.error[r]);
  for (r = 0; r < 2; r++) tfree(&x.in[r]);
  hir_fusion_free(x.f);
  hir_nccl_world_free(w);
}

/* The backend's strided copy against the same copy on the host: windows
   into larger buffers (one 2-D copy per outer index), rows repeated from one
   (stride 0, no 2-D copy), and a 4-axis case. */
TEST(test_gpu_strided_copy, "gpu/strided_copy", TEST_GPU) {
  static const struct {
    int nd;
    int64_t sizes[4], dst_strides[4], src_strides[4];
  } cases[] = {
      {2, {4, 6}, {10, 1}, {6, 1}},
      {3, {3, 4, 6}, {48, 10, 1}, {24, 6, 1}},
      {2, {5, 7}, {7, 1}, {0, 1}},
      {4, {2, 3, 4, 5}, {150, 40, 6, 1}, {60, 20, 5, 1}},
  };
  hir_backend *be = hir_backend_cuda_create(0);
  int k;
  CHECK(be != NULL);
  for (k = 0; be && k < (int)(sizeof cases / sizeof cases[0]); k++) {
    hir_tensor src, dst;
    int64_t n = 1, span_src = 1, span_dst = 1, idx[4] = {0}, i;
    float *hs, *hd, *want;
    int d;
    memset(&src, 0, sizeof src);
    src.dtype = dst.dtype = HIR_F32;
    src.ndims = cases[k].nd;
    for (d = 0; d < cases[k].nd; d++) {
      src.sizes[d] = cases[k].sizes[d];
      src.strides[d] = cases[k].src_strides[d];
      n *= src.sizes[d];
      span_src += (src.sizes[d] - 1) * src.strides[d];
    }
    dst = src;
    for (d = 0; d < cases[k].nd; d++) {
      dst.strides[d] = cases[k].dst_strides[d];
      span_dst += (dst.sizes[d] - 1) * dst.strides[d];
    }
    hs = (float *)malloc((size_t)span_src * 4);
    hd = (float *)malloc((size_t)span_dst * 4);
    want = (float *)malloc((size_t)span_dst * 4);
    for (i = 0; i < span_src; i++) hs[i] = (float)(i * 7 % 13) - 6.5f;
    for (i = 0; i < span_dst; i++) want[i] = -1000.0f - (float)i; /* poison: untouched gaps must stay */
    for (i = 0; i < n; i++) { /* the copy on the host */
      int64_t os = 0, od = 0;
      for (d = 0; d < cases[k].nd; d++) os += idx[d] * src.strides[d], od += idx[d] * dst.strides[d];
      want[od] = hs[os];
      for (d = cases[k].nd - 1; d >= 0 && ++idx[d] == src.sizes[d]; d--) idx[d] = 0;
    }
    CHECK(be->alloc(be, (size_t)span_src * 4, &src.data) == HIR_OK && be->alloc(be, (size_t)span_dst * 4, &dst.data) == HIR_OK);
    for (i = 0; i < span_dst; i++) hd[i] = -1000.0f - (float)i;
    CHECK(be->upload(be, src.data, hs, (size_t)span_src * 4) == HIR_OK);
    CHECK(be->upload(be, dst.data, hd, (size_t)span_dst * 4) == HIR_OK);
    CHECK(be->copy(be, NULL, &dst, &src) == HIR_OK);
    CHECK(be->stream_synchronize(be, NULL) == HIR_OK);
    CHECK(be->download(be, hd, dst.data, (size_t)span_dst * 4) == HIR_OK);
    for (i = 0; i < span_dst; i++)
      if (hd[i] != want[i]) {
        fprintf(stderr, "  strided copy case %d: element %lld is %g, want %g\n", k, (long long)i, hd[i], want[i]);
        hir_test_failures++;
        break;
      }
    be->release(be, src.data);
    be->release(be, dst.data);
    free(hs);
    free(hd);
    free(want);
  }
  hir_backend_free(be);
}

/* Sums of nothing and matmuls with K = 0 (plain and fp8) write zeros into
   their output and nothing between its rows or batches (a chunk's output, a
   caller's padded tensor: others' bytes): on an output [2, 3, 4] (the sum's
   [2, 1, 4]) with strides 40, 6, 1, the gaps keep their poison. The CPU
   backend, then the CUDA one. */
TEST(test_gpu_empty_contraction, "gpu/empty_contraction", TEST_GPU) {
  int k, op;
  for (k = 0; k < 2; k++) {
    hir_backend *be = k ? hir_backend_cuda_create(0) : hir_backend_cpu_create();
    CHECK(be != NULL);
    for (op = 0; be && op < 3; op++) {
      static const float one = 1;
      hir_tensor a, x, c, scale;
      float host[80];
      int64_t i;
      void *buf = NULL, *s1 = NULL;
      memset(&a, 0, sizeof a);
      a.dtype = op == 2 ? HIR_F8E4M3 : HIR_F32, a.ndims = 3;
      a.sizes[0] = 2, a.sizes[1] = op == 1 ? 0 : 3, a.sizes[2] = op == 1 ? 4 : 0;
      a.strides[0] = a.strides[1] = a.strides[2] = 1;
      x = a, c = a, scale = a;
      x.sizes[1] = 0, x.sizes[2] = 4;
      c.dtype = HIR_F32, c.sizes[1] = op == 1 ? 1 : 3, c.sizes[2] = 4, c.strides[0] = 40, c.strides[1] = 6;
      scale.dtype = HIR_F32, scale.sizes[1] = c.sizes[1], scale.sizes[2] = 4; /* one value for every element */
      scale.strides[0] = scale.strides[1] = scale.strides[2] = 0;
      for (i = 0; i < 80; i++) host[i] = -1000.0f - (float)i;
      CHECK(be->alloc(be, sizeof host, &buf) == HIR_OK && be->upload(be, buf, host, sizeof host) == HIR_OK);
      CHECK(be->alloc(be, sizeof one, &s1) == HIR_OK && be->upload(be, s1, &one, sizeof one) == HIR_OK);
      a.data = x.data = c.data = buf, scale.data = s1; /* a and x hold nothing */
      CHECK((op == 0 ? be->matmul(be, NULL, &c, &a, &x) : op == 1 ? be->sum(be, NULL, &c, &a)
                                                                  : be->matmul_scaled(be, NULL, &c, &a, &x, &scale, &scale)) == HIR_OK);
      CHECK(be->stream_synchronize(be, NULL) == HIR_OK && be->download(be, host, buf, sizeof host) == HIR_OK);
      for (i = 0; i < 80; i++) {
        int in_c = i / 40 < 2 && i % 40 < 6 * c.sizes[1] && i % 40 % 6 < 4;
        if (host[i] != (in_c ? 0.0f : -1000.0f - (float)i)) {
          fprintf(stderr, "  %s backend, %s: element %lld is %g\n", be->name, op == 0 ? "matmul" : op == 1 ? "sum" : "fp8 matmul",
                  (long long)i, host[i]);
          hir_test_failures++;
          break;
        }
      }
      be->release(be, buf);
      be->release(be, s1);
    }
    hir_backend_free(be);
  }
}

/* The timeline on two GPUs: the pipelined AG+GEMM runs twice while
   recording; the GPU spans (timing events) must lie on the stream tracks in
   order, start no earlier than the host issued them, and the matmuls must
   take GPU time (their host spans only issue them). */
typedef struct span_row { char name[64], cat[16]; int pid, tid; double ts, dur; } span_row;
typedef struct gpu_timeline_ctx { timeline_ctx x; hir_tensor ha[2], hb; } gpu_timeline_ctx;

static hir_status gpu_timeline_rank(int rank, void *user) { /* a backend made on the thread that uses it */
  gpu_timeline_ctx *g = (gpu_timeline_ctx *)user;
  if (!(g->x.backend[rank] = hir_backend_cuda_create(rank))) return HIR_ERR_BACKEND;
  g->x.a[rank] = to_backend(g->x.backend[rank], &g->ha[rank]);
  g->x.b[rank] = to_backend(g->x.backend[rank], &g->hb);
  if (!g->x.a[rank].data || !g->x.b[rank].data) return HIR_ERR_BACKEND;
  return timeline_rank(rank, &g->x);
}

TEST(test_gpu_timeline, "gpu/timeline", TEST_GPU) {
  static const int m2[2] = {0, 1};
  enum { ROWS = 4096 };
  int64_t sa[3] = {1, 1024, 4096}, sb[2] = {4096, 2048};
  static span_row rows[ROWS];
  hir_nccl_world *w = NULL;
  static gpu_timeline_ctx g;
  timeline_ctx *x = &g.x;
  seed sd;
  FILE *fp;
  char line[512];
  int n = 0, r, i, k, ngpu = 0, gpu_matmuls = 0, ordered = 1, after_issue = 1, worked = 0, quick_issue = 0;
  cudaGetDeviceCount(&ngpu);
  if (ngpu < 2) {
    printf("  (skipped: one GPU)\n");
    return;
  }
  fp = tmpfile();
  memset(&g, 0, sizeof g);
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 2, m2);
  x->f = sd.f;
  CHECK(hir_nccl_world_create(2, &w) == HIR_OK);
  g.hb = trand(HIR_F32, 2, sb);
  for (r = 0; r < 2; r++) {
    g.ha[r] = trand(HIR_F32, 3, sa);
    x->comm[r] = w ? hir_nccl_world_comm(w, r) : NULL;
  }
  CHECK(fp && w && hir_spmd(2, gpu_timeline_rank, &g) == HIR_OK);
  CHECK(fp && hir_timeline_write(x->ev, 2, fp) == HIR_OK);
  if (fp) rewind(fp);
  while (fp && n < ROWS && fgets(line, sizeof line, fp))
    if (sscanf(line, "{\"name\": \"%63[^\"]\", \"cat\": \"%15[^\"]\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %lf, \"dur\": %lf}",
               rows[n].name, rows[n].cat, &rows[n].pid, &rows[n].tid, &rows[n].ts, &rows[n].dur) == 6)
      n++;
  for (i = 0; i < n; i++) {
    int seen = 0, j = -1;
    if (strcmp(rows[i].cat, "gpu")) continue;
    for (k = i - 1; k >= 0; k--) /* the span before it on its track */
      if (!strcmp(rows[k].cat, "gpu") && rows[k].pid == rows[i].pid && rows[k].tid == rows[i].tid) break;
    if (k >= 0 && rows[i].ts < rows[k].ts + rows[k].dur - 1.0) ordered = 0;
    for (k = 0; k < i; k++) /* the how-many-th of its name on its rank: the same-numbered host span issued it */
      seen += !strcmp(rows[k].cat, "gpu") && rows[k].pid == rows[i].pid && !strcmp(rows[k].name, rows[i].name);
    for (k = 0; k < n && seen >= 0; k++)
      if (!strcmp(rows[k].cat, "host_ir") && rows[k].pid == rows[i].pid && !strcmp(rows[k].name, rows[i].name) && !seen--) j = k;
    if (j < 0 || rows[i].ts < rows[j].ts - 20.0) after_issue = 0;
    if (!strncmp(rows[i].name, "MatmulOp", 8)) {
      gpu_matmuls++;
      worked += rows[i].dur > 50.0;
      quick_issue += j >= 0 && rows[j].dur < rows[i].dur / 4; /* not the first run's: it sets up cuBLAS */
    }
  }
  if (!(gpu_matmuls == 2 * 2 * 2 && worked == gpu_matmuls && quick_issue > 0 && ordered && after_issue))
    printf("  %d rows, %d GPU matmul spans (want 8), %d over 50 us, %d issued in a quarter of their GPU time; "
           "in order on each stream: %d; none before the host issued it: %d\n",
           n, gpu_matmuls, worked, quick_issue, ordered, after_issue);
  CHECK(n > 0 && n < ROWS);
  CHECK(gpu_matmuls == 2 * 2 * 2 && worked == gpu_matmuls && quick_issue > 0); /* ranks x runs x chunks */
  CHECK(ordered && after_issue);
  for (r = 0; r < 2; r++) {
    hir_evaluator_free(x->ev[r]);
    hir_program_free(x->p[r]);
    if (x->backend[r]) backend_free(x->backend[r], &g.ha[r], &x->a[r]), backend_free(x->backend[r], &g.hb, &x->b[r]);
    hir_backend_free(x->backend[r]);
    tfree(&g.ha[r]);
  }
  tfree(&g.hb);
  if (fp) fclose(fp);
  hir_nccl_world_free(w);
  hir_fusion_free(sd.f);
}

/* ---- platforms ---- */
/* Whether hostir_nccl should put the data path on blocking twins: its
   default, unless HOSTIR_NCCL_BLOCKING=0, NCCL_COMM_SPLIT_SHARE_RESOURCES=0
   (a twin could not be ended) or the communicator is borrowed. */
static int data_path_blocking(int borrowed) {
  const char *v = getenv("HOSTIR_NCCL_BLOCKING"), *share = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  return !borrowed && !(v && !strcmp(v, "0")) && !(share && strcmp(share, "1"));
}

static hir_nccl_world *gpu_worlds[MAXR + 1];
static int gpu_copy_engine; /* send/recv on the copy engines */
static void *gpu_world_create(int n) {
  if (!gpu_worlds[n] && hir_nccl_world_create(n, &gpu_worlds[n]) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(gpu_worlds[n]));
    hir_nccl_world_free(gpu_worlds[n]);
    gpu_worlds[n] = NULL;
  }
  hir_nccl_world_set_copy_engine(gpu_worlds[n], gpu_copy_engine);
  return gpu_worlds[n];
}

/* Every stream-lowered program again (P2P allgather, GEMM + P2P
   reduce-scatter, both schedules, bounded buffers), their sends and receives
   on the copy engines. */
TEST(test_gpu_copy_engine, "gpu/copy_engine_p2p", TEST_GPU_THREADS) {
  hir_nccl_world *w;
  int r;
  gpu_copy_engine = 1;
  test_stream_numbers();
  gpu_copy_engine = 0;
  if (platform->max_world < 2 || !(w = (hir_nccl_world *)gpu_world_create(2))) return;
  for (r = 0; r < 2; r++) CHECK(hir_nccl_world_comm(w, r)->p2p_copy_engine == 0); /* each rank says what it does */
  for (r = 0; r < 2; r++) CHECK(hir_nccl_comm_blocking(hir_nccl_world_comm(w, r)) == data_path_blocking(0));
  hir_nccl_world_set_copy_engine(w, 1);
  for (r = 0; r < 2; r++) CHECK(hir_nccl_world_comm(w, r)->p2p_copy_engine == 1);
  hir_nccl_world_set_copy_engine(w, 0);
}
/* One rank rejects its input (a wrong K) 200 ms after the others started
   waiting for it in their exchanges: they return HIR_ERR_COMM within a
   second naming it and why (robust/failing_rank's case, on NCCL). Its
   world is aborted: the threads get a world of their own. With disagree,
   that rank's M differs instead (a shape it cannot find wrong alone): every
   rank refuses the run with the same message (robust/ranks_disagree's
   case, on NCCL), and the next run, its shape mended, succeeds. */
typedef struct gpu_failing {
  hir_fusion *f;
  hir_comm *comm[MAXR];
  int gpu[MAXR], wrong, disagree; /* the rank with a wrong K, or M */
  hir_tensor in[MAXR][2];         /* made before the ranks start (trand is not thread-safe) */
  hir_tensor mended;              /* the wrong rank's input 0 in the second run */
  hir_status status[MAXR], second[MAXR];
  char error[MAXR][512];
  double ms[MAXR];
} gpu_failing;

static void gpu_failing_begin(gpu_failing *x, int n, int wrong, int disagree) {
  seed s;
  int64_t sa[3] = {1, 2, 4};
  int r;
  memset(x, 0, sizeof *x);
  seed_ag_matmul_p2p(&s, hir_fusion_create(), n, iota_mesh); /* P2P exchanges, then matmuls */
  x->f = s.f;
  x->wrong = wrong;
  x->disagree = disagree;
  for (r = 0; r < n; r++) {
    int64_t m3[3] = {1, 3, 4}, sb[2] = {r == wrong && !disagree ? 3 : 4, 5};
    x->in[r][0] = trand(HIR_F32, 3, r == wrong && disagree ? m3 : sa);
    x->in[r][1] = trand(HIR_F32, 2, sb);
  }
  x->mended = trand(HIR_F32, 3, sa);
}

static hir_status gpu_failing_rank(int rank, void *user) {
  gpu_failing *x = (gpu_failing *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor d[2], out[1];
  double t0;
  int i;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = x->comm[rank];
  ed.backend = hir_backend_cuda_create(x->gpu[rank]);
  for (i = 0; i < 2; i++) d[i] = to_backend(ed.backend, &x->in[rank][i]);
  if (rank == x->wrong) hir_nccl__sleep_ms(200); /* the others are already waiting in their first exchange */
  t0 = hir__now_ms();
  if ((x->status[rank] = hir_lower(x->f, &ld, &p)) == HIR_OK && (x->status[rank] = hir_evaluator_create(p, &ed, &ev)) == HIR_OK &&
      (x->status[rank] = hir_run(ev, d, 2, out, 1)) == HIR_OK)
    x->status[rank] = hir_evaluator_sync(ev);
  x->ms[rank] = hir__now_ms() - t0;
  snprintf(x->error[rank], sizeof x->error[rank], "%s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  x->second[rank] = HIR_ERR_INVALID;
  if (x->disagree && x->status[rank] == HIR_ERR_SHAPE) {
    if (rank == x->wrong) backend_free(ed.backend, &x->in[rank][0], &d[0]), d[0] = to_backend(ed.backend, &x->mended);
    if ((x->second[rank] = hir_run(ev, d, 2, out, 1)) == HIR_OK) x->second[rank] = hir_evaluator_sync(ev);
    if (x->second[rank] != HIR_OK) printf("  rank %d's second run: %.300s\n", rank, hir_evaluator_error(ev));
    if (rank == x->wrong) backend_free(ed.backend, &x->mended, &d[0]), d[0] = x->in[rank][0];
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  for (i = 0; i < 2; i++) backend_free(ed.backend, &x->in[rank][i], &d[i]);
  hir_backend_free(ed.backend);
  return x->status[rank];
}

/* Checks ranks [from, to) of a finished run and frees what the run used. */
static int gpu_failing_end(gpu_failing *x, int n, int from, int to) {
  char rank_failed[32];
  int r, ok = 1;
  snprintf(rank_failed, sizeof rank_failed, "rank %d failed: hir_run:", x->wrong);
  for (r = from; r < to; r++) {
    int good = x->disagree ? x->status[r] == HIR_ERR_SHAPE && x->ms[r] < 1000 && x->second[r] == HIR_OK &&
                                 strstr(x->error[r], "hir_run: the ranks passed different shapes for input 0 (T0): [1, 2, 4] on "
                                                     "device") && strcmp(x->error[r], x->error[from]) == 0
             : r == x->wrong ? x->status[r] == HIR_ERR_SHAPE && strstr(x->error[r], "the contracted sizes differ")
                             : x->status[r] == HIR_ERR_COMM && x->ms[r] < 1000 && strstr(x->error[r], rank_failed) &&
                                   strstr(x->error[r], "the contracted sizes differ");
    printf("  rank %d: %s after %.0f ms: %.300s\n", r, hir_status_str(x->status[r]), x->ms[r], x->error[r]);
    ok &= good;
  }
  for (r = 0; r < n; r++) tfree(&x->in[r][0]), tfree(&x->in[r][1]);
  tfree(&x->mended);
  hir_fusion_free(x->f);
  return ok;
}

TEST(test_gpu_failing_rank, "gpu/failing_rank", TEST_GPU_THREADS) {
  static gpu_failing x;
  hir_nccl_world *w = NULL;
  int n = platform->max_world < 4 ? platform->max_world : 4, r;
  if (n < 2) return;
  if (hir_nccl_world_create(n, &w) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(w));
    hir_test_failures++;
    hir_nccl_world_free(w);
    return;
  }
  gpu_failing_begin(&x, n, n - 1, 1); /* the world stays whole */
  for (r = 0; r < n; r++) x.comm[r] = hir_nccl_world_comm(w, r), x.gpu[r] = r;
  CHECK(hir_spmd(n, gpu_failing_rank, &x) == HIR_ERR_SHAPE);
  CHECK(gpu_failing_end(&x, n, 0, n));
  gpu_failing_begin(&x, n, n - 1, 0);
  for (r = 0; r < n; r++) x.comm[r] = hir_nccl_world_comm(w, r), x.gpu[r] = r;
  CHECK(hir_spmd(n, gpu_failing_rank, &x) == HIR_ERR_SHAPE); /* the cause */
  CHECK(gpu_failing_end(&x, n, 0, n));
  hir_nccl_world_free(w);
}

static void gpu_world_keep(void *w) { (void)w; } /* NCCL worlds are kept for the whole run */
static hir_comm *gpu_comm(void *w, int rank) { return hir_nccl_world_comm((hir_nccl_world *)w, rank); }
static hir_backend *gpu_backend(int rank) { return hir_backend_cuda_create(rank); }

static hir_comm *mp_comm;
static hir_nccl_env mp_env;
static void *mp_world(int n) {
  (void)n;
  return mp_comm;
}
static hir_comm *mp_comm_of(void *w, int rank) {
  (void)rank;
  return (hir_comm *)w;
}
static hir_backend *mp_backend(int rank) {
  (void)rank;
  return hir_backend_cuda_create(mp_env.gpu);
}
static hir_status mp_run(int n, hir_status (*fn)(int rank, void *user), void *user) {
  (void)n;
  return fn(mp_env.rank, user);
}

/* ---- hostir's kernel collectives (nccl_kernels) ----
   Every collective on its kernels, each dtype, counts from 1 element to past
   a call's slot (several calls), odd counts and buffers one element off
   their alignment, against a plain reference: each rank's input is a hash
   of (rank, element), so each rank computes every rank's, sums them in
   float in rank order (as the kernels do) and rounds once: the kernels'
   results must match it bit for bit, on every rank; NCCL's, run on the same
   inputs, within the dtype's rounding. */
static uint16_t kc_bits(hir_dtype dt, float v) { return dt == HIR_F16 ? hir_float_to_half(v) : hir_float_to_bf16(v); }
static float kc_value(hir_dtype dt, int rank, size_t i, unsigned salt) { /* random in [-1, 1), exact in dt */
  uint64_t h = ((uint64_t)rank * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ull) ^ ((uint64_t)salt << 40);
  float v;
  h ^= h >> 31, h *= 0x94d049bb133111ebull, h ^= h >> 29;
  v = (float)(h >> 40) / (float)(1ull << 24) * 2 - 1;
  return dt == HIR_F32 ? v : dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(v)) : hir_bf16_to_float(hir_float_to_bf16(v));
}
static void kc_store(hir_dtype dt, void *buf, size_t i, float v) {
  if (dt == HIR_F32) ((float *)buf)[i] = v;
  else ((uint16_t *)buf)[i] = kc_bits(dt, v);
}
static float kc_load(hir_dtype dt, const void *buf, size_t i) {
  return dt == HIR_F32 ? ((const float *)buf)[i] : dt == HIR_F16 ? hir_half_to_float(((const uint16_t *)buf)[i])
                                                                 : hir_bf16_to_float(((const uint16_t *)buf)[i]);
}

typedef struct kc_case {
  void *w;
  int n;
  int graph_replays;               /* > 0: one graph of the collectives, replayed this many times, inputs renewed */
  int bad[MAXR], checked[MAXR];
  char msg[MAXR][600];
} kc_case;

enum { KC_AR, KC_RS, KC_AG };

/* One collective on device buffers: `kind` of `count` (AR: elements; RS:
   elements a rank gets; AG: bytes a rank gives) on path p, its buffers one
   element (AG: byte) off their alignment where `off`. */
typedef struct kc_op {
  int kind, off, ctas;             /* ctas: hir_nccl_comm_set_path's, 0: as measured */
  hir_dtype dt;
  size_t count, es, nin, nout;
  hir_nccl_path p;
  unsigned char *hin, *hout, *din, *dout;
} kc_op;

static int kc_op_make(kc_op *o, int kind, hir_dtype dt, size_t count, hir_nccl_path p, int off, int n) {
  memset(o, 0, sizeof *o);
  o->kind = kind, o->dt = dt, o->count = count, o->p = p, o->off = off;
  o->es = kind == KC_AG ? 1 : hir_dtype_size(dt);
  o->nin = kind == KC_RS ? count * (size_t)n : count;
  o->nout = kind == KC_AG ? count * (size_t)n : count;
  return (o->hin = (unsigned char *)malloc(o->nin * o->es + 16)) && (o->hout = (unsigned char *)malloc(o->nout * o->es + 16)) &&
         cudaMalloc((void **)&o->din, o->nin * o->es + 16) == cudaSuccess && cudaMalloc((void **)&o->dout, o->nout * o->es + 16) == cudaSuccess;
}
static void kc_op_free(kc_op *o) {
  free(o->hin);
  free(o->hout);
  if (o->din) cudaFree(o->din);
  if (o->dout) cudaFree(o->dout);
}
/* This rank's input for `salt`, and its output poisoned (NaN, 0xff bytes). */
static void kc_op_fill(kc_op *o, int rank, unsigned salt) {
  size_t i;
  for (i = 0; i < o->nin; i++)
    if (o->kind == KC_AG) o->hin[i] = (unsigned char)(kc_value(HIR_F32, rank, i, salt) * 127 + 128);
    else kc_store(o->dt, o->hin, i, kc_value(o->dt, rank, i, salt));
  cudaMemcpy(o->din + o->off * o->es, o->hin, o->nin * o->es, cudaMemcpyHostToDevice);
  cudaMemset(o->dout, 0xff, o->nout * o->es + 16);
  cudaDeviceSynchronize(); /* both ran on the legacy stream, which a nonblocking stream's collective does not wait for */
}
static hir_status kc_op_call(kc_op *o, hir_comm *c, void *team, cudaStream_t s) {
  hir_status st = hir_nccl_comm_set_path(c, o->p, o->ctas);
  unsigned char *in = o->din + o->off * o->es, *out = o->dout + o->off * o->es;
  if (st != HIR_OK) return st;
  return o->kind == KC_AR   ? c->allreduce(c, team, in, out, o->count, o->dt, s)
         : o->kind == KC_RS ? c->reduce_scatter(c, team, in, out, o->count, o->dt, s)
                            : c->allgather(c, team, in, out, o->count, s);
}
/* Whether the output is the reference's for `salt` (where `exact`, bit for
   bit), nothing written around it; else k->msg says where not. */
static int kc_op_check(kc_op *o, kc_case *k, int rank, unsigned salt, int exact) {
  static const char *const kinds[3] = {"all-reduce", "reduce-scatter", "all-gather"};
  size_t es = o->es, i;
  int ok = 1, q;
  cudaMemcpy(o->hout, o->dout, o->nout * es + 16, cudaMemcpyDeviceToHost);
  for (i = 0; i < o->off * es; i++) ok &= o->hout[i] == 0xff;
  for (i = (o->off + o->nout) * es; i < o->nout * es + 16; i++) ok &= o->hout[i] == 0xff;
  for (i = 0; i < o->nout && ok; i++) {
    double want, got;
    if (o->kind == KC_AG) {
      want = (unsigned char)(kc_value(HIR_F32, (int)(i / o->count), i % o->count, salt) * 127 + 128);
      got = o->hout[o->off + i];
    } else {
      float sum = 0.f;
      size_t at = o->kind == KC_RS ? (size_t)rank * o->count + i : i;
      for (q = 0; q < k->n; q++) sum += kc_value(o->dt, q, at, salt); /* float, rank order: the kernels' sum */
      want = o->dt == HIR_F32 ? sum : o->dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(sum)) : hir_bf16_to_float(hir_float_to_bf16(sum));
      got = kc_load(o->dt, o->hout + o->off * es, i);
    }
    ok = exact ? got == want : fabs(got - want) <= (o->dt == HIR_F32 ? 1e-5 : 2e-2) * k->n;
    if (!ok)
      snprintf(k->msg[rank], sizeof k->msg[rank], "%s %s of %zu (path %d, %d CTAs, %s): element %zu is %g, the reference %g",
               kinds[o->kind], hir_dtype_name(o->dt), o->count, (int)o->p, o->ctas, o->off ? "off alignment" : "aligned", i, got, want);
  }
  if (!ok && !k->msg[rank][0])
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s of %zu (path %d, off %d): a byte written outside its output", kinds[o->kind],
             o->count, (int)o->p, o->off);
  return ok;
}

static int kc_one(kc_case *k, int rank, hir_comm *c, void *team, cudaStream_t s, int kind, hir_dtype dt, size_t count,
                  hir_nccl_path p, int off, unsigned salt, int exact) {
  kc_op o;
  int ok = kc_op_make(&o, kind, dt, count, p, off, k->n);
  /* a forced kernel on 1 to all of HIR_NCCL__KC_CTAS CTAs, a different grid from call to call (the same on every rank) */
  o.ctas = p == HIR_NCCL_PATH_ONE_SHOT || p == HIR_NCCL_PATH_TWO_SHOT ? 1 + (int)(salt * 53u % HIR_NCCL__KC_CTAS) : 0;
  if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "out of memory");
  if (ok) {
    kc_op_fill(&o, rank, salt);
    if (kc_op_call(&o, c, team, s) != HIR_OK || cudaStreamSynchronize(s) != cudaSuccess || c->poll(c) != HIR_OK) {
      snprintf(k->msg[rank], sizeof k->msg[rank], "%s", c->error);
      ok = 0;
    }
  }
  ok = ok && kc_op_check(&o, k, rank, salt, exact);
  kc_op_free(&o);
  return ok;
}

/* Four collectives in one CUDA graph, replayed k->graph_replays times with
   no reset; every 100th replay on new inputs, checked. */
static int kc_graph(kc_case *k, int rank, hir_comm *c, void *team, cudaStream_t s) {
  kc_op o[4];
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  int i, r, ok = 1;
  ok &= kc_op_make(&o[0], KC_AR, HIR_BF16, 1000, HIR_NCCL_PATH_ONE_SHOT, 1, k->n);
  ok &= kc_op_make(&o[1], KC_AR, HIR_BF16, 65537, HIR_NCCL_PATH_TWO_SHOT, 0, k->n);
  ok &= kc_op_make(&o[2], KC_RS, HIR_F16, 4097, HIR_NCCL_PATH_TWO_SHOT, 1, k->n);
  ok &= kc_op_make(&o[3], KC_AG, HIR_F32, 1001, HIR_NCCL_PATH_TWO_SHOT, 0, k->n);
  o[1].ctas = HIR_NCCL__KC_CTAS, o[2].ctas = 3; /* caps: as measured, all (the grid its size asks), 3, as measured */
  if (ok) {
    hir_status st = HIR_OK;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (i = 0; i < 4 && st == HIR_OK; i++) st = kc_op_call(&o[i], c, team, s);
    ok = cudaStreamEndCapture(s, &g) == cudaSuccess && st == HIR_OK && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
    if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "capture: %s %s", c->error, cudaGetErrorString(cudaGetLastError()));
  }
  for (r = 0; ok && r < k->graph_replays; r++) {
    if (r % 100 == 0)
      for (i = 0; i < 4; i++) kc_op_fill(&o[i], rank, 7000u + (unsigned)r + (unsigned)i);
    ok = cudaGraphLaunch(exec, s) == cudaSuccess;
    if (r % 100 == 0 || r == k->graph_replays - 1) {
      ok = ok && cudaStreamSynchronize(s) == cudaSuccess && c->poll(c) == HIR_OK;
      for (i = 0; ok && i < 4; i++) ok = kc_op_check(&o[i], k, rank, 7000u + (unsigned)(r / 100 * 100) + (unsigned)i, 1);
      if (!ok && !k->msg[rank][0]) snprintf(k->msg[rank], sizeof k->msg[rank], "replay %d: %s", r, c->error);
      k->checked[rank] += ok;
    }
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  for (i = 0; i < 4; i++) kc_op_free(&o[i]);
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_AUTO, 0);
  return ok;
}

/* The choice of paths as the tuner saves it (collective_choice) and takes
   it back (set_collective_choice): the same text again, an all-NCCL choice
   that the paths then follow, refusals that change nothing, and the
   measured choice restored. Every rank the same steps, before any call. */
static int kc_choice(kc_case *k, int rank, hir_comm *c, void *team) {
  char text[1024], again[1024], nccl[1024], bad[1100], before[160];
  size_t n = c->collective_choice(c, text, sizeof text);
  int ok = n > 0 && n < sizeof text && !strncmp(text, "kc1 ", 4), r, z, at;
  const char *why = "the text";
  snprintf(before, sizeof before, "%s", c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16));
  for (r = 0, at = snprintf(nccl, sizeof nccl, "kc1 %d", k->n); r < 3; r++)
    for (z = 0, at += snprintf(nccl + at, sizeof nccl - (size_t)at, " | %s", r == 0 ? "ar" : r == 1 ? "rs" : "ag"); z < 11; z++)
      at += snprintf(nccl + at, sizeof nccl - (size_t)at, " nccl");
  if (ok && (why = "taken back", c->set_collective_choice(c, text) != HIR_OK || c->collective_choice(c, again, sizeof again) != n ||
             strcmp(text, again) || !strstr(hir_nccl_comm_describe(c), "as saved with the tuner's plans")))
    ok = 0;
  if (ok && (why = "all NCCL", c->set_collective_choice(c, nccl) != HIR_OK ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), "NCCL") ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLGATHER, 4096, HIR_F32), "NCCL")))
    ok = 0;
  snprintf(bad, sizeof bad, "kc1 %d%s", k->n + 1, strstr(nccl, " |"));
  if (ok && (why = "another world size", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "made for")))
    ok = 0;
  snprintf(bad, sizeof bad, "kc1 %d | ar k/32%s", k->n, strstr(nccl, " | ar nccl") + 10);
  if (ok && (why = "a kernel the row lacks", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "names no path")))
    ok = 0;
  snprintf(bad, sizeof bad, "%.*s", (int)(strstr(nccl, " | ag") - nccl), nccl);
  if (ok && (why = "a row missing", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "lacks its '| ag' row") ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), "NCCL")))
    ok = 0;
  if (ok && (why = "restored", c->set_collective_choice(c, text) != HIR_OK ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), before)))
    ok = 0;
  if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "collective choice (%s): '%.250s': %.250s", why, text, c->error);
  return ok;
}

static hir_status kc_rank(int rank, void *user) {
  kc_case *k = (kc_case *)user;
  hir_comm *c = platform->comm(k->w, rank);
  static const hir_dtype dts[3] = {HIR_F32, HIR_F16, HIR_BF16};
  size_t counts[8] = {1, 3, 8, 13, 1000, 4097, 65537, 0};
  int world[MAXR], i, d, z, p, off, device = platform->run == mp_run ? mp_env.gpu : rank;
  void *team;
  cudaStream_t s;
  unsigned salt = 1;
  cudaSetDevice(device);
  for (i = 0; i < k->n; i++) world[i] = i;
  if (c->team(c, world, k->n, &team) != HIR_OK || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s", c->error);
    k->bad[rank]++;
    return HIR_ERR_COMM;
  }
  if (k->graph_replays) {
    k->bad[rank] += !kc_graph(k, rank, c, team, s);
    goto out;
  }
  if (!kc_choice(k, rank, c, team)) {
    k->bad[rank]++;
    goto out;
  }
  for (d = 0; d < 3; d++) {
    counts[7] = ((size_t)32 << 20) / hir_dtype_size(dts[d]) + 1001; /* past a call's slot, one shot and two */
    for (z = 0; z < (d == 2 ? 8 : 7); z++)                          /* bf16 only there (the host's reference is slow) */
      for (off = 0; off < (z == 7 ? 1 : 2); off++) {
        for (p = HIR_NCCL_PATH_ONE_SHOT; p <= HIR_NCCL_PATH_TWO_SHOT; p++) {
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], (hir_nccl_path)p, off, salt++, 1);
          k->checked[rank]++;
        }
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_RS, dts[d], counts[z], HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_NCCL, off, salt++, 0);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_AUTO, off, salt++, 0);
        k->checked[rank] += 3;
        if (d == 0) {
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AG, dts[d], counts[z] * 3, HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1);
          k->checked[rank]++;
        }
        if (k->bad[rank]) goto out;
      }
  }
out:
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_AUTO, 0);
  cudaStreamDestroy(s);
  return k->bad[rank] ? HIR_ERR_COMM : HIR_OK;
}

static int kc_nccl_platform(void) { return !platform->graph && (platform->world_create == gpu_world_create || platform->run == mp_run); }

/* Each world size of threads (2 to the GPUs), or the launcher's processes. */
static void kc_worlds(int replays) {
  int n, r;
  if (!kc_nccl_platform()) return;
  for (n = platform->run == mp_run ? mp_env.size : 2; n <= (platform->run == mp_run ? mp_env.size : platform->max_world); n++) {
    kc_case k;
    hir_comm *c0;
    memset(&k, 0, sizeof k);
    k.n = n;
    k.graph_replays = replays;
    if (!(k.w = platform->world_create(n))) {
      CHECK(!"a world");
      return;
    }
    c0 = platform->comm(k.w, platform->run == mp_run ? mp_env.rank : 0);
    if (strstr(hir_nccl_comm_describe(c0), "on NCCL: ")) {
      printf("  (%d ranks: no kernel collectives: %s)\n", n, hir_nccl_comm_describe(c0));
      continue;
    }
    if (!replays) printf("  %d ranks: %s\n", n, strstr(hir_nccl_comm_describe(c0), "collectives by size"));
    CHECK(strstr(hir_nccl_comm_describe(c0), "collectives by size, as measured at creation: all-reduce: ") != NULL ||
          strstr(hir_nccl_comm_describe(c0), "collectives by size, as saved with the tuner's plans: all-reduce: ") != NULL);
    platform->run(n, kc_rank, &k);
    for (r = 0; r < n; r++) {
      if (platform->run == mp_run && r != mp_env.rank) continue;
      if (k.msg[r][0]) fprintf(stderr, "  %d ranks, rank %d: %s\n", n, r, k.msg[r]);
      CHECK(k.bad[r] == 0);
      CHECK(k.checked[r] >= (replays ? replays / 100 + 1 : 190));
    }
  }
}

TEST(test_gpu_kernel_collectives, "gpu/kernel_collectives", TEST_GPU_WORLDS) { kc_worlds(0); }
TEST(test_gpu_kernel_collectives_graph, "gpu/kernel_collectives_graph", TEST_GPU_WORLDS) { kc_worlds(1000); }

/* A peer that gives up while a kernel collective waits for it: rank 1
   aborts 300 ms in; rank 0's kernel quits (the host's stop word) and its
   poll names rank 1's failure within a second. A world of its own. */
typedef struct kc_dead { hir_nccl_world *w; hir_status status; double ms; int ended; char msg[512]; } kc_dead;
static hir_status kc_dead_rank(int rank, void *user) {
  kc_dead *x = (kc_dead *)user;
  hir_comm *c = hir_nccl_world_comm(x->w, rank);
  int world[2] = {0, 1};
  void *team, *buf;
  cudaStream_t s;
  double t0;
  cudaSetDevice(rank);
  if (c->team(c, world, 2, &team) != HIR_OK) return HIR_ERR_COMM;
  if (rank == 1) {
    struct timespec nap = {0, 300000000};
    nanosleep(&nap, NULL);
    snprintf(c->error, sizeof c->error, "rank 1 gives up (a test)");
    c->abort(c);
    return HIR_OK;
  }
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&buf, 4 << 20);
  cudaMemset(buf, 0, 4 << 20);
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_TWO_SHOT, 0);
  t0 = hir__now_ms();
  x->status = c->allreduce(c, team, buf, buf, 1 << 20, HIR_BF16, s);
  while (x->status == HIR_OK && cudaStreamQuery(s) == cudaErrorNotReady && hir__now_ms() - t0 < 5000) x->status = c->poll(c);
  x->ms = hir__now_ms() - t0;
  while (cudaStreamQuery(s) == cudaErrorNotReady && hir__now_ms() - t0 < 7000) {}
  x->ended = cudaStreamQuery(s) == cudaSuccess;
  snprintf(x->msg, sizeof x->msg, "%s", c->error);
  cudaFree(buf);
  cudaStreamDestroy(s);
  return HIR_OK;
}

TEST(test_gpu_kernel_collective_dead_peer, "gpu/kernel_collective_dead_peer", TEST_GPU_THREADS) {
  kc_dead x;
  if (platform->max_world < 2) return;
  memset(&x, 0, sizeof x);
  if (hir_nccl_world_create(2, &x.w) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(x.w));
    CHECK(!"a world of 2");
  } else if (strstr(hir_nccl_comm_describe(hir_nccl_world_comm(x.w, 0)), "on NCCL: ")) {
    printf("  (no kernel collectives: %s)\n", hir_nccl_comm_describe(hir_nccl_world_comm(x.w, 0)));
  } else {
    hir_spmd(2, kc_dead_rank, &x);
    if (x.status != HIR_ERR_COMM || !strstr(x.msg, "rank 1 gives up")) fprintf(stderr, "  rank 0: %s: %s\n", hir_status_str(x.status), x.msg);
    CHECK(x.status == HIR_ERR_COMM);
    CHECK(strstr(x.msg, "rank 1 gives up") != NULL);
    CHECK(x.ms < 1500);
    CHECK(x.ended); /* the kernel quit: its GPU is free */
  }
  hir_nccl_world_free(x.w);
}

/* A peer that never comes: rank 1 leaves at once (replay = 0), or after two
   runs as a CUDA graph on NCCL (eager, captured: replay = 1); rank 0's next
   allgather (a graph replay) must end in a timeout or a communication error
   within its deadline, not hang. replay = 2: no peer dies; both ranks run
   twice as a graph (an allgather) and call exit() with the evaluator,
   backend and communicator alive, as a user's process may: it must end
   with status 0, not crash in its teardown. replay = 3: both ranks run once
   (eager); rank 1 leaves a second later, while rank 0's second run waits
   for it on the GPU; rank 0 then passes a new shape, so that, behind that
   stuck work, it frees the old plan's buffers and the ranks meet: the run
   must end within its deadline all the same. */
static int dead_peer(int replay) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a);
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in, out;
  int64_t sz[2] = {1, 1 << 20};
  hir_status s;
  double t0, dt;
  int mesh[2] = {0, 1}, ok;
  hir_output(f, b);
  hir_set_mesh(a, 2, mesh);
  hir_set_mesh(b, 2, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = mp_env.rank;
  ed.comm = mp_comm;
  ed.backend = hir_backend_cuda_create(mp_env.gpu);
  ed.timeout_ms = 3000;
  ed.graph = replay == 1 || replay == 2;
  if (replay == 1 && hir_nccl_comm_set_copy_engine(mp_comm, 0) != HIR_OK) return 0;
  if (hir_lower(f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK) {
    printf("rank%d: setup failed: %s\n", mp_env.rank, ev ? hir_evaluator_error(ev) : hir_program_error(p));
    return 0;
  }
  in = tn(HIR_F32, 2, sz);
  memset(&out, 0, sizeof out);
  { hir_tensor d = to_backend(ed.backend, &in), small = d;
    int run;
    for (run = 0; replay && run < (replay == 3 ? 1 : 2); run++) /* eager, then captured and launched: both ranks */
      if (hir_run(ev, &d, 1, &out, 1) != HIR_OK || hir_evaluator_sync(ev) != HIR_OK) {
        printf("rank%d: run %d failed: %s\n", mp_env.rank, run, hir_evaluator_error(ev));
        return 0;
      }
    if (replay == 2) {
      printf("rank%d: ran twice as a graph, calling exit() with everything alive\n", mp_env.rank);
      fflush(stdout);
      exit(0);
    }
    if (replay && mp_env.rank == 1) {
      printf("rank1: ran %s, leaving\n", replay == 3 ? "once, and a second later" : "twice as a graph");
      fflush(stdout);
      if (replay == 3) hir_nccl__sleep_ms(1000);
      _exit(0);
    }
    if (replay == 3) {
      s = hir_run(ev, &d, 1, &out, 1); /* rank 1 never runs it: its allgather waits on the GPU */
      printf("rank0: the second run, which rank 1 skips: %s\n", hir_status_str(s));
      small.sizes[1] /= 2; /* a new shape: the ranks meet */
    } else if (replay) {
      hir_nccl__sleep_ms(300); /* rank 1 is gone */
    }
    t0 = hir__now_ms();
    s = hir_run(ev, &small, 1, &out, 1);
    if (s == HIR_OK) s = hir_evaluator_sync(ev);
    dt = hir__now_ms() - t0;
    ok = (s == HIR_ERR_TIMEOUT || s == HIR_ERR_COMM) && dt < 20000;
    printf("rank0: dead peer%s: %s after %.0f ms: %s\n",
           replay == 3 ? " behind a run it skipped" : replay ? " during a graph replay" : "", hir_status_str(s), dt,
           hir_evaluator_error(ev));
    fflush(stdout); /* said before the frees: cudaFree waits for the device */
    backend_free(ed.backend, &in, &d); }
  tfree(&in);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(f);
  return ok;
}

/* ---- the caller's NCCL: an id it handed out, a communicator it lends ----
   Rank 0 makes the id and leaves it in a file the others read, as a runtime
   would broadcast it (MPI_Bcast, torch.distributed). */
static int shared_id(const hir_nccl_env *env, ncclUniqueId *id) {
  char path[256], tmp[280];
  double deadline = hir__now_ms() + 60000;
  FILE *f;
  snprintf(path, sizeof path, "/tmp/hostir-test-id-%016llx", /* the job's own: its secret names it */
           (unsigned long long)hir_nccl__hash(env->secret, strlen(env->secret), (unsigned long long)env->size));
  if (env->rank == 0) {
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (ncclGetUniqueId(id) != ncclSuccess || !(f = fopen(tmp, "wb"))) return 0;
    fwrite(id, sizeof *id, 1, f);
    fclose(f);
    return rename(tmp, path) == 0;
  }
  while (hir__now_ms() < deadline) {
    if ((f = fopen(path, "rb"))) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 1;
    }
    hir_nccl__sleep_ms(20);
  }
  return 0;
}

/* A nonblocking communicator of the caller's own, for hir_nccl_comm_from_nccl. */
static ncclComm_t own_nccl(const hir_nccl_env *env, const ncclUniqueId *id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  ncclResult_t r, state = ncclInProgress;
  double deadline = hir__now_ms() + 60000;
  config.blocking = 0;
  cudaSetDevice(env->gpu);
  r = ncclCommInitRankConfig(&comm, env->size, *id, env->rank, &config);
  while ((r == ncclSuccess || r == ncclInProgress) && ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
         state == ncclInProgress && hir__now_ms() < deadline)
    hir_nccl__sleep_ms(1);
  return (r == ncclSuccess || r == ncclInProgress) && state == ncclSuccess ? comm : NULL;
}

/* The lent communicator still works after hostir is done with it: an
   allreduce of the ranks' numbers on it. */
static int lent_still_works(const hir_nccl_env *env, ncclComm_t comm) {
  float *x = NULL, got = 0;
  ncclResult_t r, state = ncclInProgress;
  double deadline = hir__now_ms() + 30000;
  float mine = (float)(env->rank + 1);
  if (cudaMalloc((void **)&x, sizeof *x) != cudaSuccess || cudaMemcpy(x, &mine, sizeof mine, cudaMemcpyHostToDevice) != cudaSuccess)
    return 0;
  r = ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, NULL);
  while (r == ncclInProgress && ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
         hir__now_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) got = -1;
  cudaFree(x);
  return got == (float)(env->size * (env->size + 1) / 2);
}

/* ---- ranks as threads on one GPU, their messages through host memory ----
   NCCL refuses two ranks on one GPU; the local world moves host memory.
   This joins them: a rank's communicator stages each message through the
   host (the data read after its stream's work, written back on its
   stream) and hands it to the local world. Slow, but every multi-rank
   program then runs on the CUDA backend on a one-GPU machine: its kernels,
   streams and events around the collectives, the staging of strided ones,
   the stream pipelines' sends and receives. */
#define STAGED_OPS 256
typedef struct staged_comm {
  hir_comm comm;                /* first: the evaluator's handle */
  hir_comm *local;              /* the local world's rank */
  int grouping, nops;
  struct { void *host, *dev, *stream; size_t bytes; } ops[STAGED_OPS];   /* a group's: receives have dev */
} staged_comm;

static int staged_fail(hir_comm *c, const char *what, cudaError_t e) {
  snprintf(c->error, sizeof c->error, "staged comm: rank %d: %s: %s", c->rank, what, cudaGetErrorString(e));
  return 0;
}

/* A host copy of `bytes` at dev once the stream's work is done (NULL for no data); 0 on failure. */
static int staged_in(hir_comm *c, const void *dev, size_t bytes, void *stream, void **host) {
  cudaError_t e;
  *host = NULL;
  if (!dev || !bytes) return 1;
  if (!(*host = malloc(bytes))) return staged_fail(c, "malloc", cudaErrorMemoryAllocation);
  if ((e = cudaMemcpyAsync(*host, dev, bytes, cudaMemcpyDefault, (cudaStream_t)stream)) != cudaSuccess ||
      (e = cudaStreamSynchronize((cudaStream_t)stream)) != cudaSuccess)
    return staged_fail(c, "reading a message", e);
  return 1;
}

/* Writes host back to dev on the stream (a pageable copy: host is free to go once it returns). */
static int staged_out(hir_comm *c, void *dev, const void *host, size_t bytes, void *stream) {
  cudaError_t e;
  if (!dev || !host || !bytes) return 1;
  if ((e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDefault, (cudaStream_t)stream)) != cudaSuccess)
    return staged_fail(c, "writing a message", e);
  return 1;
}

/* A collective's two halves around the local world's op on host memory:
   the send side staged in and room for the receive side (in, out: their
   bytes, 0 for none here); then the receive side staged out. */
static hir_status staged_begin(hir_comm *c, const void *send, size_t in, void *recv, size_t out, void *stream, void **hs,
                               void **hr) {
  hir_comm *l = ((staged_comm *)c)->local;
  l->what = c->what;
  l->error[0] = '\0'; /* set again only by the op */
  *hr = NULL;
  if (!staged_in(c, send, in, stream, hs)) return HIR_ERR_BACKEND;
  if (recv && out && !(*hr = calloc(1, out))) return staged_fail(c, "calloc", cudaErrorMemoryAllocation), HIR_ERR_BACKEND;
  return HIR_OK;
}
static hir_status staged_end(hir_comm *c, hir_status s, void *recv, size_t out, void *stream, void *hs, void *hr) {
  hir_comm *l = ((staged_comm *)c)->local;
  if (s != HIR_OK && l->error[0]) snprintf(c->error, sizeof c->error, "%s", l->error);
  else if (s == HIR_OK && !staged_out(c, recv, hr, out, stream)) s = HIR_ERR_BACKEND;
  free(hs);
  free(hr);
  return s;
}

static size_t staged_team_size(void *team) { return (size_t)((hir__lw_team *)team)->n; }

static hir_status staged_team(hir_comm *c, const int *devices, int n, void **team) {
  hir_comm *l = ((staged_comm *)c)->local;
  hir_status s = l->team(l, devices, n, team);
  if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", l->error);
  return s;
}
static hir_status staged_allgather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t out = bytes * staged_team_size(t);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->allgather(l, t, hs, hr, bytes, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_allreduce(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->allreduce(l, t, hs, hr, count, dt, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_reduce_scatter(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes * staged_team_size(t), r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->reduce_scatter(l, t, hs, hr, count, dt, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_reduce(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt), out = c->rank == root ? bytes : 0;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->reduce(l, t, hs, hr, count, dt, root, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_broadcast(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, c->rank == root ? bytes : 0, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->broadcast(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_gather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t chunks = staged_team_size(t) - (s ? 0 : 1), out = c->rank == root ? bytes * chunks : 0; /* a root without data: the others' */
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->gather(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_scatter(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, c->rank == root ? bytes * staged_team_size(t) : 0, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->scatter(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}

static hir_status staged_group_start(hir_comm *c) {
  staged_comm *sc = (staged_comm *)c;
  if (!sc->grouping++) sc->nops = 0;
  return sc->local->group_start(sc->local);
}

/* The group's messages move at its end; then its receives are written back
   and every staged copy freed. */
static hir_status staged_group_end(hir_comm *c) {
  staged_comm *sc = (staged_comm *)c;
  hir_status s = sc->local->group_end(sc->local);
  int i;
  if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", sc->local->error);
  if (sc->grouping > 0 && --sc->grouping) return s;
  for (i = 0; i < sc->nops; i++) {
    if (s == HIR_OK && sc->ops[i].dev && !staged_out(c, sc->ops[i].dev, sc->ops[i].host, sc->ops[i].bytes, sc->ops[i].stream))
      s = HIR_ERR_BACKEND;
    free(sc->ops[i].host);
  }
  sc->nops = 0;
  return s;
}

/* A send or receive: queued in a group (one of its own outside one). */
static hir_status staged_p2p(hir_comm *c, int is_send, void *buf, size_t bytes, int peer, void *stream) {
  staged_comm *sc = (staged_comm *)c;
  hir_status s, end;
  void *host = NULL;
  if ((s = staged_group_start(c)) != HIR_OK) return s;
  if (sc->nops == STAGED_OPS) {
    snprintf(c->error, sizeof c->error, "staged comm: more than %d sends and receives in a group", STAGED_OPS);
    s = HIR_ERR_UNSUPPORTED;
  } else if (is_send ? !staged_in(c, buf, bytes, stream, &host) : !(host = malloc(bytes ? bytes : 1))) {
    free(host);
    s = HIR_ERR_BACKEND;
  } else { /* freed at the group's end */
    sc->ops[sc->nops].host = host;
    sc->ops[sc->nops].dev = is_send ? NULL : buf;
    sc->ops[sc->nops].stream = stream;
    sc->ops[sc->nops++].bytes = bytes;
    sc->local->what = c->what;
    s = is_send ? sc->local->send(sc->local, host, bytes, peer, NULL) : sc->local->recv(sc->local, host, bytes, peer, NULL);
    if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", sc->local->error);
  }
  end = staged_group_end(c);
  return s != HIR_OK ? s : end;
}
static hir_status staged_send(hir_comm *c, const void *buf, size_t bytes, int peer, void *stream) {
  return staged_p2p(c, 1, (void *)buf, bytes, peer, stream);
}
static hir_status staged_recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  return staged_p2p(c, 0, buf, bytes, peer, stream);
}
static void staged_abort(hir_comm *c) {
  hir_comm *l = ((staged_comm *)c)->local;
  snprintf(l->error, sizeof l->error, "%s", c->error);
  l->abort(l);
}

static void staged_init(staged_comm *sc, hir_comm *local) {
  memset(sc, 0, sizeof *sc);
  sc->local = local;
  sc->comm.rank = local->rank;
  sc->comm.size = local->size;
  sc->comm.needs_device_memory = 1;
  sc->comm.what.tensor = -1;
  sc->comm.team = staged_team;
  sc->comm.allgather = staged_allgather;
  sc->comm.allreduce = staged_allreduce;
  sc->comm.reduce_scatter = staged_reduce_scatter;
  sc->comm.reduce = staged_reduce;
  sc->comm.broadcast = staged_broadcast;
  sc->comm.gather = staged_gather;
  sc->comm.scatter = staged_scatter;
  sc->comm.send = staged_send;
  sc->comm.recv = staged_recv;
  sc->comm.group_start = staged_group_start;
  sc->comm.group_end = staged_group_end;
  sc->comm.abort = staged_abort;
}

/* The platform: a world of n ranks, all on GPU 0. */
typedef struct staged_world {
  hir_local_world *local;
  staged_comm comms[MAXR];
} staged_world;

static void *staged_world_create(int n) {
  staged_world *sw = (staged_world *)calloc(1, sizeof *sw);
  int r;
  if (!sw || !(sw->local = hir_local_world_create(n))) {
    free(sw);
    return NULL;
  }
  hir_local_world_set_timeout(sw->local, 20000);
  for (r = 0; r < n; r++) staged_init(&sw->comms[r], hir_local_comm(sw->local, r));
  return sw;
}
static void staged_world_free(void *w) {
  if (w) hir_local_world_free(((staged_world *)w)->local);
  free(w);
}
static hir_comm *staged_world_comm(void *w, int rank) { return &((staged_world *)w)->comms[rank].comm; }
static hir_backend *staged_backend(int rank) {
  (void)rank;
  return hir_backend_cuda_create(0);
}
static test_platform staged_ranks = {"cuda, ranks as threads on GPU 0, messages staged through the host", 2, MAXR,
                                     staged_world_create, staged_world_free, staged_world_comm, staged_backend, hir_spmd, 0, 0};

/* diff_target's comm: the rank's staged communicator over the local world's rank. */
static hir_comm *staged_comm_of(diff_target *t, hir_comm *local, int rank) {
  staged_comm *sc = &((staged_comm *)t->ctx)[rank];
  staged_init(sc, local);
  return &sc->comm;
}

/* The differential check's programs of 2-4 ranks on the platform above: a
   CUDA backend a rank. HIR_DIFF_RANKS_PROGRAMS: how many seeds (4,000). */
TEST(test_diff_ranks_one_gpu, "diff/random_programs_ranks", TEST_GPU_WORLDS) {
  const char *n_env = getenv("HIR_DIFF_RANKS_PROGRAMS");
  static staged_comm comms[4];
  diff_target target;
  int r, made = 1;
  if (platform != &staged_ranks) return;
  memset(&target, 0, sizeof target);
  target.min_world = 2;
  target.max_world = 4;
  target.comm = staged_comm_of;
  target.ctx = comms;
  for (r = 0; r < 4; r++) made = made && (target.backends[r] = staged_backend(r)) != NULL;
  if (made) diff_seeds(&target, n_env ? atoi(n_env) : 4000, 0.15, " on the cuda backend, 2-4 ranks on GPU 0");
  CHECK(made);
  for (r = 0; r < 4; r++) hir_backend_free(target.backends[r]);
}

/* The same programs on NCCL worlds of threads, a GPU a rank (2 to 4 ranks,
   as many as there are GPUs; on one GPU its one-rank programs):
   hostir_nccl's collectives and its send/recv on NCCL, then on the copy
   engines; eager in the suite, captured where the filter names it on the
   graph platforms. A run refused on a world aborts it (its ranks tell each
   other): the next program gets a new one. HIR_DIFF_NCCL_PROGRAMS: how many
   seeds each way (1,500 / (ranks - 1): 4 H200 took 0.2 s a seed, and 1,500
   each way outlasted a 560 s call). */
static hir_nccl_world *diff_worlds[5];
static int diff_copy_engine;

static hir_comm *diff_nccl_comm(diff_target *t, hir_comm *local, int rank) {
  (void)t;
  cudaSetDevice(rank); /* the rank's thread on its backend's GPU */
  return hir_nccl_world_comm(diff_worlds[local->size], rank);
}

static void diff_nccl_world(diff_target *t, int n, int refused_run) {
  if (diff_worlds[n] && !refused_run) return;
  hir_nccl_world_free(diff_worlds[n]);
  diff_worlds[n] = NULL;
  if (hir_nccl_world_create(n, &diff_worlds[n]) != HIR_OK) {
    fprintf(stderr, "  diff: a world of %d ranks: %s\n", n, hir_nccl_world_error(diff_worlds[n]));
    hir_nccl_world_free(diff_worlds[n]);
    diff_worlds[n] = NULL;
    t->max_world = n - 1; /* its programs are not run */
    hir_test_failures++;
    return;
  }
  hir_nccl_world_set_copy_engine(diff_worlds[n], diff_copy_engine);
}

TEST(test_diff_nccl, "diff/random_programs_nccl", TEST_GPU_WORLDS) {
  const char *n_env = getenv("HIR_DIFF_NCCL_PROGRAMS");
  diff_target target;
  char where[96];
  int r, n;
  if (platform->world_create != gpu_world_create || gpu_copy_engine) return; /* NCCL, one process; both ways below */
  for (diff_copy_engine = 0; diff_copy_engine < 2; diff_copy_engine++) {
    memset(&target, 0, sizeof target);
    target.max_world = platform->max_world < 4 ? platform->max_world : 4;
    target.min_world = target.max_world > 1 ? 2 : 1;
    target.comm = diff_nccl_comm;
    target.after = diff_nccl_world;
    for (n = target.min_world; n <= target.max_world; n++) diff_nccl_world(&target, n, 1);
    for (r = 0; r < target.max_world; r++) CHECK((target.backends[r] = hir_backend_cuda_create(r)) != NULL);
    snprintf(where, sizeof where, " on NCCL, %d-%d ranks a GPU each, send/recv on %s", target.min_world, target.max_world,
             diff_copy_engine ? "the copy engines" : "NCCL");
    diff_seeds(&target, n_env ? atoi(n_env) : 1500 / (target.max_world > 1 ? target.max_world - 1 : 1), 0.1, where);
    for (r = 0; r < 4; r++) hir_backend_free(target.backends[r]);
    for (n = 1; n <= 4; n++) hir_nccl_world_free(diff_worlds[n]), diff_worlds[n] = NULL;
  }
  cudaSetDevice(0);
}

/* ---- two processes on one GPU, joined by nccl_peer alone ----
   NCCL refuses two ranks on one GPU, but CUDA IPC between two processes on
   one GPU works: this joins them through the copy engines' shared block
   only (no NCCL world), so that the process path - segment, exports,
   imports, signal pad, a peer process gone - runs on a one-GPU machine too.
   Only send/recv work on such a communicator; its allgather (hir_run's
   check that the ranks pass the same shapes) is made of them. */
static hir_status ce_pair_allgather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, void *stream) {
  int peer = 1 - c->rank;
  hir_status s, end;
  (void)team;
  if (cudaMemcpyAsync((char *)recv + bytes * (size_t)c->rank, send, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess)
    return HIR_ERR_BACKEND;
  if ((s = c->group_start(c)) != HIR_OK) return s;
  if ((s = c->send(c, send, bytes, peer, stream)) == HIR_OK) s = c->recv(c, (char *)recv + bytes * (size_t)peer, bytes, peer, stream);
  end = c->group_end(c);
  return s != HIR_OK ? s : end;
}

static hir_comm *ce_pair_comm(int rank, const char *name, char *err, size_t cap) {
  hir_nccl__rank *nc = (hir_nccl__rank *)malloc(sizeof *nc);
  size_t bytes = hir_nccl__ce_bytes(2);
  unsigned char *block = NULL;
  double deadline = hir_nccl__wall_ms() + 20000;
  if (!nc) return NULL;
  hir_nccl__init(nc, rank, 2, 0);
  nc->store.wake[0] = nc->store.wake[1] = -1;
  cudaSetDevice(0);
  if (rank == 0 && (block = hir_nccl__ce_segment(name, bytes, 1, err, cap))) {
    ((hir_nccl__ce_head *)block)->nlocal = 2;
    __atomic_store_n(&((hir_nccl__ce_head *)block)->magic, (int)HIR_NCCL__CE_MAGIC, __ATOMIC_RELEASE);
  }
  while (rank == 1 && !block && hir_nccl__wall_ms() < deadline) /* until rank 0 has made and sized it */
    if (!(block = hir_nccl__ce_segment(name, bytes, 0, err, cap))) hir_nccl__sleep_ms(10);
  while (block && __atomic_load_n(&((hir_nccl__ce_head *)block)->magic, __ATOMIC_ACQUIRE) != (int)HIR_NCCL__CE_MAGIC &&
         hir_nccl__wall_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (!block || !(nc->ce.local = (int *)malloc(2 * sizeof(int)))) {
    if (block) munmap(block, bytes);
    free(nc);
    return NULL;
  }
  nc->ce.local[0] = 0;
  nc->ce.local[1] = 1;
  if (!hir_nccl__ce_attach(&nc->ce, block, 1, 2, rank, err, cap) || hir_nccl__world_team(nc) != HIR_OK) {
    hir_nccl__release(nc);
    free(nc);
    return NULL;
  }
  while (rank == 0 && !__atomic_load_n(&hir_nccl__ce_head_of(&nc->ce)->pid[1], __ATOMIC_ACQUIRE) && hir_nccl__wall_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (rank == 0) unlink(name); /* both have it */
  nc->ce_on = nc->comm.p2p_copy_engine = 1;
  nc->comm.allgather = ce_pair_allgather;
  return &nc->comm;
}

/* Rank 0 gathers over the ring with rank 1, which, after one run together,
   posts its receive of the next and exits without sending: rank 0's stream waits for bytes that never come,
   and hir_evaluator_sync must end with the peer named, well within the
   timeout (the process is looked for every 100 ms), its GPU released.
   In graph mode (graph = 1) the ranks run three times together (eager,
   captured, replayed), then rank 1 exits and rank 0's replay waits on its
   graph words for a peer that is gone. */
static int ce_pair_dead_peer(int rank, int graph) {
  const int mesh[2] = {0, 1};
  const int64_t N = 1 << 16;
  seed sd;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in, din, out;
  hir_status s;
  double t0, dt;
  int ok, i;
  seed_allgather_p2p(&sd, hir_fusion_create(), 2, mesh);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ld.stream.schedule = HIR_P2P_RING;
  ed.comm = mp_comm;
  ed.backend = hir_backend_cuda_create(0);
  ed.timeout_ms = 10000;
  ed.graph = graph;
  { int64_t sz[2] = {1, N};
    in = trand(HIR_F32, 2, sz); }
  din = to_backend(ed.backend, &in);
  memset(&out, 0, sizeof out);
  ok = hir_lower(sd.f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK;
  for (i = 0; i < (graph ? 3 : 1); i++) /* runs together */
    ok = ok && hir_run(ev, &din, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK;
  if (graph && strstr(hir_program_plan(p), "graph: eager")) ok = 0, printf("rank%d: not captured: %s\n", rank, hir_program_plan(p));
  if (rank == 1 && graph) {
    printf("rank1: ran three times in graph mode, then left (%s)\n", ok ? "ok" : hir_evaluator_error(ev));
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  if (rank == 1) {
    void *buf = NULL;
    cudaMalloc(&buf, (size_t)N * 4);
    mp_comm->what.tensor = -1;
    ok = ok && mp_comm->group_start(mp_comm) == HIR_OK && mp_comm->recv(mp_comm, buf, (size_t)N * 4, 0, NULL) == HIR_OK &&
         mp_comm->group_end(mp_comm) == HIR_OK;
    hir_nccl__sleep_ms(300); /* rank 0's send has taken the post by now */
    printf("rank1: ran once, then posted a receive from rank 0 and left without sending (%s)\n", ok ? "ok" : mp_comm->error);
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  t0 = hir__now_ms();
  s = ok ? hir_run(ev, &din, 1, &out, 1) : HIR_ERR_INTERNAL;
  if (s == HIR_OK) s = hir_evaluator_sync(ev);
  dt = hir__now_ms() - t0;
  ok = ok && (s == HIR_ERR_COMM || s == HIR_ERR_TIMEOUT) && dt < 3000 && strstr(hir_evaluator_error(ev), "exited");
  printf("rank0: a peer gone during a copy-engine exchange%s: %s after %.0f ms: %s\n", graph ? " (a graph replay)" : "",
         hir_status_str(s), dt,
         ev ? hir_evaluator_error(ev) : hir_program_error(p));
  backend_free(ed.backend, &in, &din);
  tfree(&in);
  t0 = hir__now_ms();
  hir_evaluator_free(ev); /* its streams drain: the abort released their waits */
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(sd.f);
  hir_nccl_comm_free(mp_comm); /* its copy stream drains too, and the peer's mapping is closed */
  dt = hir__now_ms() - t0;
  printf("rank0: its evaluator and communicator freed in %.0f ms\n", dt);
  return ok && dt < 2000;
}

/* Rank 1 receives into a new allocation each round, the values checked
   each round. freed_first: it frees the last one before making the next
   (CUDA hands the same addresses out again): rank 0 must map each anew,
   not fail with "resource already mapped" on the freed one's mapping.
   Else it frees the last one after making the next (the addresses
   differ): rank 0 must close its mapping of each freed one, which would
   otherwise keep the memory from coming back (the exports of a tuning's
   candidates held their buffers on the GPU), and map only the live one. */
static int ce_pair_new_buffers(int rank, int freed_first) {
  enum { N = 1 << 18 };
  const int rounds = freed_first ? 4 : 6;
  const char *what = freed_first ? "remapped receives" : "freed receive buffers unmapped";
  float *host = (float *)malloc((size_t)N * 4);
  void *last = NULL;
  int round, i, k, mapped = 0, ok = host != NULL;
  hir_nccl__ce *ce = &hir_nccl__of(mp_comm)->ce;
  for (round = 0; round < rounds && ok; round++) {
    void *buf = NULL;
    for (i = 0; i < N; i++) host[i] = rank == 0 ? (float)(i % 977) + 1000.0f * (float)round : -1.0f;
    if (freed_first && last) cudaFree(last), last = NULL;
    ok = cudaMalloc(&buf, (size_t)N * 4) == cudaSuccess && cudaMemcpy(buf, host, (size_t)N * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    if (last) cudaFree(last);
    last = buf;
    ok = ok && mp_comm->group_start(mp_comm) == HIR_OK &&
         (rank == 0 ? mp_comm->send(mp_comm, buf, (size_t)N * 4, 1, NULL) : mp_comm->recv(mp_comm, buf, (size_t)N * 4, 0, NULL)) ==
             HIR_OK &&
         mp_comm->group_end(mp_comm) == HIR_OK;
    if (!ok) printf("rank%d: FAIL round %d of %s: %s\n", rank, round, what, mp_comm->error);
    ok = ok && cudaDeviceSynchronize() == cudaSuccess && cudaMemcpy(host, buf, (size_t)N * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (i = 0; rank == 1 && ok && i < N; i++)
      if (host[i] != (float)(i % 977) + 1000.0f * (float)round) {
        printf("rank1: FAIL round %d of %s: element %d is %g\n", round, what, i, host[i]);
        ok = 0;
      }
  }
  for (k = 0; !freed_first && rank == 0 && k < HIR_NCCL__CE_EXPORTS; k++)
    mapped += ce->imports[ce->local[1] * HIR_NCCL__CE_EXPORTS + k].base != NULL;
  if (!freed_first && rank == 0 && mapped != 1)
    printf("rank0: FAIL %d of rank 1's allocations mapped after %d rounds; only the live one should be\n", mapped, rounds), ok = 0;
  cudaFree(last);
  printf("rank%d: %s %s (%d rounds, a new allocation each)\n", rank, ok ? "ok  " : "FAIL", what, rounds);
  free(host);
  return ok;
}

static int ce_pair_child(int rank, const char *name, int dead, int *passed, int *failed) {
  static test_platform pair = {"cuda copy engines, 2 processes on GPU 0", 2, 2, mp_world, gpu_world_keep, mp_comm_of,
                               mp_backend, mp_run, 1, 0};
  static test_platform graphs = {"cuda copy engines, 2 processes on GPU 0, CUDA graphs", 2, 2, mp_world, gpu_world_keep,
                                 mp_comm_of, mp_backend, mp_run, 1, 1};
  static test_platform staged = {"cuda copy engines, 2 processes on GPU 0, CUDA graphs on staged arguments", 2, 2, mp_world,
                                 gpu_world_keep, mp_comm_of, mp_backend, mp_run, 1, 2};
  const test_platform *each[3] = {&pair, &graphs, &staged};
  int k;
  char err[256] = "", prefix[16];
  snprintf(prefix, sizeof prefix, "rank%d: ", rank);
  if (!(mp_comm = ce_pair_comm(rank, name, err, sizeof err))) {
    printf("%sjoining the pair: %s\n", prefix, err);
    return 0;
  }
  mp_env.rank = rank;
  mp_env.size = 2;
  mp_env.gpu = 0;
  if (dead) return ce_pair_dead_peer(rank, dead - 1);
  for (k = 0; k < 3; k++) { /* eager, then captured into CUDA graphs (graph words), at fixed and at new addresses */
    platform = each[k];
    hir_run_tests(TEST_GPU_WORLDS, "stream/numbers", prefix, 1, passed, failed);
    hir_run_tests(TEST_GPU_WORLDS, "mesh2d/p2p", prefix, 1, passed, failed); /* on the 1 x 2 and 2 x 1 meshes */
  }
  for (k = 1; k >= 0; k--) /* the same addresses again, then others */
    if (ce_pair_new_buffers(rank, k)) ++*passed;
    else ++*failed;
  hir_nccl_comm_free(mp_comm);
  return *failed == 0 && *passed > 0;
}

/* The parent starts the two ranks before CUDA is touched, waits for them
   (two minutes at most), and checks that the segment is gone. */
static int ce_pair(int dead) {
  char name[64];
  pid_t kid[2];
  int r, status, ok = 1;
  double deadline = hir__now_ms() + 120000;
  snprintf(name, sizeof name, "/dev/shm/hostir-test-%d", (int)getpid());
  fflush(stdout);
  for (r = 0; r < 2; r++)
    if ((kid[r] = fork()) == 0) {
      int passed = 0, failed = 0, good = ce_pair_child(r, name, dead, &passed, &failed);
      fflush(stdout);
      _exit(good ? 0 : 1);
    }
  for (r = 0; r < 2; r++) {
    while (waitpid(kid[r], &status, WNOHANG) == 0 && hir__now_ms() < deadline) hir_nccl__sleep_ms(10);
    if (hir__now_ms() >= deadline) {
      kill(kid[r], SIGKILL);
      waitpid(kid[r], &status, 0);
      printf("rank%d: still running after two minutes (killed)\n", r);
      ok = 0;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("rank%d: failed (status %d)\n", r, status);
      ok = 0;
    }
  }
  if (unlink(name) == 0) printf("FAIL the segment %s was left behind\n", name), ok = 0;
  return ok;
}

/* A test that makes no progress (ends no case, no step) for HOSTIR_TEST_HANG_S
   seconds (default 120) is a hang: every thread of the process prints its
   stack to stderr (resolve the
   "test-gpu(+0x...)" frames with addr2line -e build/test-gpu), then the
   process ends with status 3, so a stage's log names the test and where it
   waits instead of a silent timeout. */
static void hang_dump_thread(int sig) {
  void *frames[48];
  char head[64];
  int n = backtrace(frames, 48), len = snprintf(head, sizeof head, "-- thread %ld:\n", (long)syscall(SYS_gettid));
  (void)sig;
  if (write(2, head, (size_t)len) < 0) return;
  backtrace_symbols_fd(frames, n, 2);
}

static void *hang_watchdog(void *arg) {
  double limit_ms = *(double *)arg, since = hir__now_ms();
  int progress = -1;
  for (;;) {
    hir_nccl__sleep_ms(500);
    if (hir_test_serial + hir_test_steps + cases_run + cases_skipped != progress || !hir_test_running) {
      progress = hir_test_serial + hir_test_steps + cases_run + cases_skipped, since = hir__now_ms();
      continue;
    }
    if (hir__now_ms() - since > limit_ms) {
      DIR *tasks = opendir("/proc/self/task");
      struct dirent *e;
      fprintf(stderr, "HANG %s: still running after %.0f s; the stacks of this process's threads:\n", hir_test_running,
              limit_ms / 1000);
      signal(SIGUSR2, hang_dump_thread);
      while (tasks && (e = readdir(tasks))) {
        long tid = atol(e->d_name);
        if (tid > 0 && tid != (long)syscall(SYS_gettid)) syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR2), hir_nccl__sleep_ms(50);
      }
      if (tasks) closedir(tasks);
      printf("FAIL %s: hung\n", hir_test_running);
      fflush(stdout);
      _exit(3);
    }
  }
  return NULL;
}

static void hang_watchdog_start(void) {
  static double limit_ms;
  const char *v = getenv("HOSTIR_TEST_HANG_S");
  pthread_t t;
  limit_ms = 1000.0 * (v && atof(v) > 0 ? atof(v) : 120);
  if (pthread_create(&t, NULL, hang_watchdog, &limit_ms) == 0) pthread_detach(t);
}

int main(int argc, char **argv) {
  int ngpu = 0, passed = 0, failed = 0, i;
  int processes = argc > 1 && !strcmp(argv[1], "--processes");
  const char *filter = argc > (processes ? 2 : 1) && argv[processes ? 2 : 1][0] != '-' ? argv[processes ? 2 : 1]
                       : argc > 3 && processes ? argv[3] : NULL;
  char prefix[32] = "", err[256];
  const char *part = getenv("HOSTIR_TEST_PART");
  static test_platform gpu = {"cuda+nccl threads", 1, 1, gpu_world_create, gpu_world_keep, gpu_comm, gpu_backend, hir_spmd, 0, 0};
  static test_platform mp = {"cuda+nccl processes", 1, 1, mp_world, gpu_world_keep, mp_comm_of, mp_backend, mp_run, 0, 0};
  static test_platform graphs = {"cuda+nccl threads, CUDA graphs", 1, 1, gpu_world_create, gpu_world_keep, gpu_comm, gpu_backend,
                                 hir_spmd, 0, 1};
  static test_platform staged = {"cuda+nccl threads, CUDA graphs on staged arguments", 1, 1, gpu_world_create, gpu_world_keep,
                                 gpu_comm, gpu_backend, hir_spmd, 0, 2};
  setvbuf(stdout, NULL, _IOLBF, 0); /* a stage's log shows each test as it ends, also under a pipe */
  if (argc > 1 && !strcmp(argv[1], "--ce-pair")) { /* before CUDA is touched: the ranks are forked */
    int ok = ce_pair(argc > 2 && !strcmp(argv[2], "--dead-peer") ? 1 : argc > 2 && !strcmp(argv[2], "--dead-peer-replay") ? 2 : 0);
    printf("%d passed, %d failed\n", ok, !ok);
    return ok ? 0 : 1;
  }
  hang_watchdog_start();
  if (part) { /* "k/n": part k (1..n) of the one-process stage (tests/gpu/run.sh, TEST_GPU_PARTS) */
    if (sscanf(part, "%d/%d", &hir_test_part, &hir_test_parts) != 2 || hir_test_part < 1 || hir_test_part > hir_test_parts) {
      printf("test-gpu: HOSTIR_TEST_PART=%s is not k/n with 1 <= k <= n\n0 passed, 1 failed\n", part);
      return 1;
    }
    hir_test_part--;
  }
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    printf("test-gpu: no GPU visible\n0 passed, 1 failed\n");
    return 1;
  }
  if (!processes) {
    printf("test-gpu: %d GPUs, one process, a thread per GPU\n", ngpu);
    hir_run_tests(TEST_GPU, filter, "", 1, &passed, &failed);
    gpu.max_world = ngpu < MAXR ? ngpu : MAXR;
    platform = &gpu;
    hir_run_tests(TEST_GPU_WORLDS, filter, "", 1, &passed, &failed);
    graphs.max_world = gpu.max_world; /* the pipelines again as CUDA graphs: captured, replayed, inputs moved */
    platform = &graphs;
    printf("test-gpu: the same programs as CUDA graphs\n");
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "graph ", 1, &passed, &failed);
    gpu_copy_engine = 1; /* and with send/recv on the copy engines: captured receives on graph words */
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "graph ce ", 1, &passed, &failed);
    gpu_copy_engine = 0;
    if (!filter) hir_run_tests(TEST_GPU_WORLDS, "eval/", "graph ", 1, &passed, &failed);
    staged.max_world = gpu.max_world; /* graph mode 2: communicating pipelines too, at new addresses */
    platform = &staged;
    printf("test-gpu: the pipelines as CUDA graphs on staged arguments\n");
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "staged ", 1, &passed, &failed);
    platform = &staged_ranks; /* every world size on any machine: the CUDA backend's side of multi-rank cases */
    printf("test-gpu: %d-%d ranks as threads on GPU 0, their messages staged through host memory\n", staged_ranks.min_world,
           staged_ranks.max_world);
    hir_run_tests(TEST_GPU_WORLDS, filter, "ranks ", 1, &passed, &failed);
    platform = &gpu;
    hir_run_tests(TEST_GPU_THREADS, filter, "", 1, &passed, &failed);
    for (i = 0; i <= MAXR; i++) hir_nccl_world_free(gpu_worlds[i]);
  } else {
    if (hir_nccl_env_read(&mp_env, err, sizeof err) != HIR_OK) {
      printf("%s\n0 passed, 1 failed\n", err);
      return 1;
    }
    snprintf(prefix, sizeof prefix, "rank%d: ", mp_env.rank);
    int dead_exit = argc > 2 && !strcmp(argv[2], "--dead-peer-exit"), exit_live = argc > 2 && !strcmp(argv[2], "--exit-live");
    int dead = dead_exit || (argc > 2 && !strcmp(argv[2], "--dead-peer")), failing = argc > 2 && !strcmp(argv[2], "--failing-rank");
    int dead_replay = argc <= 2 ? 0 : !strcmp(argv[2], "--dead-peer-replay") ? 1 : !strcmp(argv[2], "--dead-peer-reshape") ? 3 : 0;
    int from_id = argc > 2 && !strcmp(argv[2], "--from-id"), lent = argc > 2 && !strcmp(argv[2], "--lent-nccl");
    const char *expect_ce = getenv("HOSTIR_TEST_COPY_ENGINE");
    ncclUniqueId id;
    ncclComm_t own = NULL;
    hir_status made;
    if ((from_id || lent) && !shared_id(&mp_env, &id)) {
      printf("%sno NCCL id from rank 0\n%s0 passed, 1 failed\n", prefix, prefix);
      return 1;
    }
    if (lent && !(own = own_nccl(&mp_env, &id))) {
      printf("%sthe caller's own NCCL communicator could not be made\n%s0 passed, 1 failed\n", prefix, prefix);
      return 1;
    }
    hir_test_running = "making the world (hir_nccl_comm_create)"; /* a hang here prints its stacks too */
    made = from_id ? hir_nccl_comm_create_from_id(mp_env.rank, mp_env.size, mp_env.local_rank, &id, 60000, &mp_comm)
         : lent    ? hir_nccl_comm_from_nccl(own, 60000, &mp_comm)
                   : hir_nccl_comm_create(&mp_env, dead || dead_replay ? 5000 : 60000, &mp_comm);
    if (made == HIR_OK && expect_ce && mp_comm->p2p_copy_engine != atoi(expect_ce)) {
      printf("%sFAIL the copy engines are %s, expected %s\n", prefix, mp_comm->p2p_copy_engine ? "on" : "off",
             atoi(expect_ce) ? "on" : "off");
      failed++;
    }
    if (made == HIR_OK && hir_nccl_comm_blocking(mp_comm) != data_path_blocking(lent)) {
      printf("%sFAIL the data path is on %s communicators, expected the other kind\n", prefix,
             hir_nccl_comm_blocking(mp_comm) ? "blocking" : "nonblocking");
      failed++;
    }
    if (made != HIR_OK) {
      printf("%s%s\n%s0 passed, 1 failed\n", prefix, mp_comm ? mp_comm->error : "no memory", prefix);
      hir_nccl_comm_free(mp_comm);
      return 1;
    }
    hir_test_running = NULL; /* the world is made; what runs next names itself */
    if (dead || dead_replay || exit_live) { /* rank 1 leaves; rank 0 must not hang (exit_live: both leave by exit()) */
      int ok;
      hir_test_running = argv[2], hir_test_serial++;
      ok = (mp_env.rank != 0 && !dead_replay && !exit_live) || dead_peer(exit_live ? 2 : dead_replay);
      printf("%s%d passed, %d failed\n", prefix, ok, !ok);
      fflush(stdout);
      if (mp_env.rank == 0 && dead_exit) exit(ok ? 0 : 1); /* as a user's process may, the aborted world alive */
      if (mp_env.rank == 0 || exit_live) _exit(ok ? 0 : 1); /* the aborted world is not torn down */
      _exit(0);
    }
    if (failing) { /* the last rank has a wrong M, then a wrong K; every rank returns within a second */
      static gpu_failing x;
      int ok, disagree;
      hir_test_running = argv[2], hir_test_serial++;
      for (ok = 1, disagree = 1; disagree >= 0; disagree--) {
        gpu_failing_begin(&x, mp_env.size, mp_env.size - 1, disagree);
        x.comm[mp_env.rank] = mp_comm;
        x.gpu[mp_env.rank] = mp_env.gpu;
        gpu_failing_rank(mp_env.rank, &x);
        ok &= gpu_failing_end(&x, mp_env.size, mp_env.rank, mp_env.rank + 1);
      }
      printf("%s%d passed, %d failed\n", prefix, ok, !ok);
      fflush(stdout);
      _exit(ok ? 0 : 1); /* the aborted world is not torn down */
    }
    mp.min_world = mp.max_world = mp_env.size;
    platform = &mp;
    if (mp_env.rank == 0)
      printf("test-gpu: %d processes, one GPU each, %s; send/recv on %s\n", mp_env.size,
             from_id ? "from the caller's NCCL id" : lent ? "on the caller's NCCL communicator" : "hostir's bootstrap",
             mp_comm->p2p_copy_engine ? "the copy engines" : "NCCL");
    hir_run_tests(TEST_GPU_WORLDS, filter, prefix, 1, &passed, &failed);
    if (!lent && !from_id) { /* as CUDA graphs: send/recv on the copy engines (graph words), then on NCCL's */
      int nccl;
      mp.graph = 1;
      for (nccl = !mp_comm->p2p_copy_engine; nccl < 2; nccl++) {
        snprintf(prefix, sizeof prefix, "rank%d graph%s: ", mp_env.rank, nccl ? "" : " ce");
        if (!nccl || hir_nccl_comm_set_copy_engine(mp_comm, 0) == HIR_OK)
          hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", prefix, 1, &passed, &failed);
      }
      mp.graph = 0;
    }
    hir_nccl_comm_free(mp_comm);
    if (lent) {
      int ok = lent_still_works(&mp_env, own);
      printf("%s%s the lent communicator still works after hir_nccl_comm_free\n", prefix, ok ? "ok  " : "FAIL");
      ok ? passed++ : failed++;
      ncclCommDestroy(own);
    }
  }
  if (hir_tests_lost) printf("%sFAIL %d tests were not registered (tests/test.h)\n", prefix, hir_tests_lost), failed++;
  printf("%s%d passed, %d failed\n", prefix, passed, failed);
  return failed ? 1 : 0;
}
