/* The single-GPU cost of the multidevice ops on the CUDA backend: the elementwise
   kernels (NVRTC), a transpose, layer_norm as its primitives, linear with
   cuBLASLt's bias epilogue, and the fp8 scaled linear. Per op: the median
   time of hir_run + hir_evaluator_sync, its ratio to the floor (the bytes it
   must move at the device-to-device copy bandwidth measured in the same run;
   for linear, the same GEMM without its bias; for the fp8 linear, the bf16
   GEMM it replaces, so below 1 is its gain), and, given PyTorch's times of
   the same ops (bench/torch_ops.py, same shapes; torch._scaled_mm for fp8),
   the ratio to PyTorch.

     python3 bench/torch_ops.py > build/torch_ops.txt
     build/bench-ops [--iters 20] [--torch build/torch_ops.txt]

   Without CUDA it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include "bench.h"
#include <stdio.h>
#include <string.h>

#ifndef HOSTIR_CUDA
int main(void) {
  (void)now_ms;
  (void)cmp_double;
  printf("bench-ops: built without CUDA (the ops' GPU costs need a GPU); nothing to measure\n");
  return 0;
}
#else
enum { OP_ADD, OP_ADD_ROW, OP_RELU, OP_MUL_F16, OP_CAST, OP_TRANSPOSE, OP_LAYER_NORM, OP_LINEAR, OP_LINEAR_GELU, OP_SCALED, OP_SCALED_ROWS,
       OP_MATMUL, OP_COUNT }; /* MATMUL: the linears' floor */
static const char *const op_names[OP_COUNT] = {"add bf16 [64M]", "add bf16 [8192, 8192] + [8192] (broadcast)", "relu bf16 [64M]",
                                               "mul f16 [64M]", "cast f32->bf16 [64M]",
                                               "transpose bf16 [8192, 8192]", "layer_norm bf16 [16384, 4096]",
                                               "linear+bias bf16 8192x4096x4096", "gelu_tanh(linear+bias) bf16 8192x4096x4096",
                                               "scaled_linear e4m3 -> bf16 8192x4096x4096, per-tensor scales",
                                               "scaled_linear e4m3 -> bf16 8192x4096x4096, per-row scales", "linear without bias"};
static const char *const op_keys[OP_COUNT] = {"add", "add_row", "relu", "mul_f16", "cast", "transpose", "layer_norm", "linear",
                                              "linear_gelu", "scaled", "scaled_rows", "matmul"};

/* The op's fusion, its inputs' shapes and dtypes, and the bytes it must move. */
static hir_fusion *build(int op, int *nin, hir_tensor *in, double *bytes) {
  hir_fusion *f = hir_fusion_create();
  int64_t n = (int64_t)1 << 26;
  int perm[2] = {1, 0};
  hir_tv *a, *b, *c, *d;
  memset(in, 0, 4 * sizeof *in);
  *nin = 1;
  in[0].ndims = 1, in[0].sizes[0] = n, in[0].dtype = HIR_BF16;
  switch (op) {
  case OP_ADD:
  case OP_MUL_F16:
    in[0].dtype = in[1].dtype = op == OP_ADD ? HIR_BF16 : HIR_F16;
    in[1].ndims = 1, in[1].sizes[0] = n;
    a = hir_input(f, in[0].dtype, 1), b = hir_input(f, in[0].dtype, 1);
    hir_output(f, op == OP_ADD ? hir_add(f, a, b) : hir_mul(f, a, b));
    *nin = 2, *bytes = 3.0 * 2 * (double)n;
    break;
  case OP_ADD_ROW: { /* a row broadcast: the element kernel's strided path */
    int row[2] = {1, 0};
    in[0].ndims = 2, in[0].sizes[0] = in[0].sizes[1] = 8192;
    in[1].ndims = 1, in[1].sizes[0] = 8192, in[1].dtype = HIR_BF16;
    a = hir_input(f, HIR_BF16, 2), b = hir_input(f, HIR_BF16, 1);
    hir_output(f, hir_add(f, a, hir_broadcast(f, b, 2, row)));
    *nin = 2, *bytes = 2.0 * 2 * 8192.0 * 8192.0;
    break;
  }
  case OP_RELU:
    hir_output(f, hir_relu(f, hir_input(f, HIR_BF16, 1)));
    *bytes = 2.0 * 2 * (double)n;
    break;
  case OP_CAST:
    in[0].dtype = HIR_F32;
    hir_output(f, hir_cast(f, hir_input(f, HIR_F32, 1), HIR_BF16));
    *bytes = 6.0 * (double)n;
    break;
  case OP_TRANSPOSE:
    in[0].ndims = 2, in[0].sizes[0] = in[0].sizes[1] = 8192;
    hir_output(f, hir_permute(f, hir_input(f, HIR_BF16, 2), perm));
    *bytes = 2.0 * 2 * 8192.0 * 8192.0;
    break;
  case OP_LAYER_NORM:
    in[0].ndims = 2, in[0].sizes[0] = 16384, in[0].sizes[1] = 4096;
    in[1].ndims = 1, in[1].sizes[0] = 4096, in[1].dtype = HIR_BF16;
    in[2] = in[1];
    a = hir_input(f, HIR_BF16, 2), b = hir_input(f, HIR_BF16, 1), c = hir_input(f, HIR_BF16, 1);
    hir_output(f, hir_layer_norm(f, a, 1, b, c, 1e-5));
    *nin = 3, *bytes = 2.0 * 2 * 16384.0 * 4096.0;
    break;
  case OP_SCALED:
  case OP_SCALED_ROWS:
    in[0].ndims = 2, in[0].sizes[0] = 8192, in[0].sizes[1] = 4096, in[0].dtype = HIR_F8E4M3;
    in[1].ndims = 2, in[1].sizes[0] = 4096, in[1].sizes[1] = 4096, in[1].dtype = HIR_F8E4M3;
    in[2].ndims = in[3].ndims = 1, in[2].dtype = in[3].dtype = HIR_F32;
    in[2].sizes[0] = op == OP_SCALED ? 1 : 8192, in[3].sizes[0] = op == OP_SCALED ? 1 : 4096;
    a = hir_input(f, HIR_F8E4M3, 2), b = hir_input(f, HIR_F8E4M3, 2);
    c = op == OP_SCALED ? hir_input_sized(f, HIR_F32, 1, in[2].sizes) : hir_input(f, HIR_F32, 1);
    d = op == OP_SCALED ? hir_input_sized(f, HIR_F32, 1, in[3].sizes) : hir_input(f, HIR_F32, 1);
    hir_output(f, hir_scaled_linear(f, a, b, c, d, HIR_BF16));
    *nin = 4, *bytes = 0;
    break;
  default: /* linear (with bias; then gelu_tanh) or the matmul alone */
    in[0].ndims = 2, in[0].sizes[0] = 8192, in[0].sizes[1] = 4096;
    in[1].ndims = 2, in[1].sizes[0] = 4096, in[1].sizes[1] = 4096, in[1].dtype = HIR_BF16;
    in[2].ndims = 1, in[2].sizes[0] = 4096, in[2].dtype = HIR_BF16;
    a = hir_input(f, HIR_BF16, 2), b = hir_input(f, HIR_BF16, 2);
    c = op != OP_MATMUL ? hir_input(f, HIR_BF16, 1) : NULL;
    hir_output(f, op == OP_LINEAR_GELU ? hir_unary(f, HIR_UNARY_GELU_TANH, hir_linear(f, a, b, c)) : hir_linear(f, a, b, c));
    *nin = op != OP_MATMUL ? 3 : 2, *bytes = 0;
    break;
  }
  return f;
}

/* Median ms of `iters` runs (after 3 warmups) of op on backend b. */
static double time_op(hir_backend *b, int op, int iters, double *bytes, char *err, size_t cap) {
  hir_tensor in[4], out[1];
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  double ms[64], t = -1;
  int nin, i, k;
  hir_fusion *f = build(op, &nin, in, bytes);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ed.backend = b;
  for (i = 0; i < nin; i++) { /* random values, uploaded once */
    size_t n = 1, es = hir_dtype_size(in[i].dtype), j;
    unsigned seed = 7u + (unsigned)i;
    char *host;
    for (k = 0; k < in[i].ndims; k++) n *= (size_t)in[i].sizes[k];
    host = (char *)malloc(n * es);
    for (j = 0; host && j < n; j++) {
      float v = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 32768.0f - 0.5f;
      if (in[i].dtype == HIR_F32) ((float *)host)[j] = v + 1; /* positive: scales too */
      else if (in[i].dtype == HIR_F8E4M3) ((uint8_t *)host)[j] = hir_float_to_e4m3(v * 64);
      else ((uint16_t *)host)[j] = in[i].dtype == HIR_F16 ? hir_float_to_half(v) : hir_float_to_bf16(v);
    }
    if (!host || b->alloc(b, n * es, &in[i].data) != HIR_OK || b->upload(b, in[i].data, host, n * es) != HIR_OK)
      snprintf(err, cap, "input %d: %s", i, b->error);
    free(host);
  }
  memset(out, 0, sizeof out);
  if (!err[0] && (hir_lower(f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK))
    snprintf(err, cap, "%s", p && hir_program_error(p)[0] ? hir_program_error(p) : hir_evaluator_error(ev));
  for (k = 0; !err[0] && k < iters + 3; k++) {
    double t0 = now_ms();
    if (hir_run(ev, in, nin, out, 1) != HIR_OK || hir_evaluator_sync(ev) != HIR_OK) {
      snprintf(err, cap, "%s", hir_evaluator_error(ev));
      break;
    }
    if (k >= 3) ms[k - 3] = now_ms() - t0;
  }
  if (!err[0]) {
    qsort(ms, (size_t)iters, sizeof ms[0], cmp_double);
    t = ms[iters / 2];
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
  for (i = 0; i < nin; i++)
    if (in[i].data) b->release(b, in[i].data);
  return t;
}

/* Device-to-device copy bandwidth (bytes read + written per second), 1 GiB. */
static double copy_bandwidth(void) {
  void *x = NULL, *y = NULL;
  size_t n = (size_t)1 << 30;
  double ms[10], t0;
  int k;
  if (cudaMalloc(&x, n) != cudaSuccess || cudaMalloc(&y, n) != cudaSuccess) return 0;
  for (k = 0; k < 13; k++) {
    t0 = now_ms();
    cudaMemcpy(y, x, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    if (k >= 3) ms[k - 3] = now_ms() - t0;
  }
  cudaFree(x);
  cudaFree(y);
  qsort(ms, 10, sizeof ms[0], cmp_double);
  return 2.0 * (double)n / (ms[5] * 1e-3);
}

int main(int argc, char **argv) {
  const char *torch_file = NULL;
  double torch_ms[OP_COUNT], bw, times[OP_COUNT], bytes;
  int iters = 20, op, i;
  hir_backend *b;
  char name[64];
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--torch") && i + 1 < argc) torch_file = argv[++i];
  }
  if (iters < 1 || iters > 64) iters = 20;
  for (op = 0; op < OP_COUNT; op++) torch_ms[op] = -1;
  if (torch_file) { /* lines "key ms" */
    FILE *fp = fopen(torch_file, "r");
    double v;
    while (fp && fscanf(fp, "%63s %lf", name, &v) == 2)
      for (op = 0; op < OP_COUNT; op++)
        if (!strcmp(name, op_keys[op])) torch_ms[op] = v;
    if (fp) fclose(fp);
  }
  if (!(b = hir_backend_cuda_create(0))) {
    printf("bench-ops: no usable GPU; nothing to measure\n");
    return 0;
  }
  bw = copy_bandwidth();
  printf("device %s; copy bandwidth %.0f GB/s (read + written); medians of %d runs, hir_run + sync, ms\n\n", b->device, bw * 1e-9,
         iters);
  printf("| op | hostir | floor | hostir / floor | PyTorch | hostir / PyTorch |\n|---|---|---|---|---|---|\n");
  for (op = 0; op < OP_MATMUL; op++) {
    char err[512] = "";
    double floor_ms;
    times[op] = time_op(b, op, iters, &bytes, err, sizeof err);
    floor_ms = op >= OP_LINEAR ? time_op(b, OP_MATMUL, iters, &bytes, err, sizeof err) : bytes / bw * 1e3; /* linear's: the bf16 GEMM */
    if (err[0]) {
      printf("| %s | failed: %s | | | | |\n", op_names[op], err);
      continue;
    }
    printf("| %s | %.3f | %s%.3f | %.2f | ", op_names[op], times[op], op >= OP_SCALED ? "bf16 GEMM " : op >= OP_LINEAR ? "GEMM " : "", floor_ms,
           floor_ms > 0 ? times[op] / floor_ms : 0);
    if (torch_ms[op] > 0) printf("%.3f | %.2f |\n", torch_ms[op], times[op] / torch_ms[op]);
    else printf("- | - |\n");
  }
  hir_backend_free(b);
  return 0;
}
#endif
