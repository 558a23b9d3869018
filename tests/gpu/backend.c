/* make test-gpu, the CUDA backend against the CPU backend, one GPU: every op, graphs, timelines,
   memory the GPU cannot reach. Included by tests/gpu/main.c after the files before it. */
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
   longer than a block's pass, weight and bias of other dtypes or none; then
   hir_rms_norm alike (hir_backend.rms_norm, no bias). */
TEST(test_gpu_layer_norm, "gpu/layer_norm", TEST_GPU) {
  static const struct ln_case { hir_dtype x, w, b; int nd, naxes; int64_t sizes[3]; } cases[] = {
      {HIR_BF16, HIR_BF16, HIR_BF16, 2, 1, {333, 4096}},
      {HIR_F32, HIR_DTYPE_COUNT, HIR_DTYPE_COUNT, 2, 1, {7, 1000}},
      {HIR_F16, HIR_F32, HIR_F32, 2, 1, {64, 96}},
      {HIR_F64, HIR_F64, HIR_F64, 3, 2, {5, 3, 40}},
      {HIR_BF16, HIR_F32, HIR_DTYPE_COUNT, 2, 1, {3, 100003}},
  };
  int k, ncases = (int)(sizeof cases / sizeof cases[0]);
  hir_backend *be = hir_backend_cuda_create(0);
  CHECK(be != NULL);
  if (!be) return;
  count_layer_norm(be);
  for (k = 0; k < 2 * ncases; k++) {
    hir_fusion *f = hir_fusion_create();
    const struct ln_case *c = &cases[k % ncases];
    int nd = c->nd, nw = c->naxes, n = 1, i, rms = k >= ncases;
    hir_tv *x = hir_input(f, c->x, nd), *w = NULL, *b = NULL;
    hir_tensor in[3];
    char what[96];
    in[0] = trand(c->x, nd, c->sizes);
    if (c->w != HIR_DTYPE_COUNT) w = hir_input(f, c->w, nw), in[n++] = trand(c->w, nw, c->sizes + nd - nw);
    if (c->b != HIR_DTYPE_COUNT && !rms) b = hir_input(f, c->b, nw), in[n++] = trand(c->b, nw, c->sizes + nd - nw);
    hir_output(f, rms ? hir_rms_norm(f, x, nw, w, 1e-5) : hir_layer_norm(f, x, nw, w, b, 1e-5));
    snprintf(what, sizeof what, "%s %s, case %d", hir_dtype_name(c->x), rms ? "rms_norm" : "layer_norm", k % ncases);
    layer_norm_calls = rms_norm_calls = 0;
    gpu_against_cpu(f, be, n, in, dtype_tol(c->x), what);
    CHECK((rms ? rms_norm_calls : layer_norm_calls) == 1); /* one kernel, not the primitives */
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
        lc.d.stream.schedule = ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
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
  ed.graph = HIR_GRAPH_BY_ADDRESS;
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
  ed.graph = HIR_GRAPH_BY_ADDRESS;
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
