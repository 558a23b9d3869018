/* AG+GEMM and GEMM+RS on 2 GPUs by hand, no hostir: the yardstick for
   bench-overlap's rows (what whole cuBLAS calls and peer copies can do on
   AG+GEMM 4096, 4096, 1024 and on the decode shapes). One process drives both
   GPUs, and each variant is one CUDA graph over both, its cross-GPU waits the
   graph's own edges: no flags, no host in the way. So a variant's time is
   what whole cuBLAS calls and peer copies can do at best; hostir's rows add
   its signals (bench/NOTES.md sections 41, 46, 48, 49). bf16 with fp32
   accumulation (cublasGemmEx), data a fixed bf16 pattern (the times do not
   depend on it).

     build/bench-hand [ag|rs] [M K N] [--iters 300]

   ag (the shapes of bench-overlap's ag): per GPU A, its M/2 rows of [M, K];
   B [K, N]; G, the gathered [M, K] (rank r's rows at r * M/2); C [M, N].
     GEMM of all M rows        from G, no copy: the GEMM's floor
     GEMM of M/2 rows, M/4     one GEMM of each size alone
     push                      each GPU copies its A into the other's G
     serial                    push, then the GEMM of all rows
     push || own half          push beside the own half's GEMM (from A), then
                               the peer half's (from G) once the push landed
     the same, 2 pushes        the push in 2 parts on 2 streams, each part's
                               quarter GEMM after it on its stream
   rs (bench-overlap's rs): per GPU A [M, K/2], B [K/2, N], the partial sums
   C = A x B [M, N], R [M/2, N] for the peer's half of its rows; rank r keeps
   rows r * M/2 of the sum, added into its C (cublasAxpyEx).
     GEMM of all M rows        the GEMM's floor
     GEMM of M/2 rows, M/4     one GEMM of each size alone
     push                      each GPU copies the peer's rows of C into its R
     serial                    GEMM of all rows, push, then the add
     peer half, push || own    the peer's rows' GEMM, then their push beside
                               the own rows' GEMM, then the add
     the same, 2 pushes        the peer's rows as 2 quarter GEMMs on 2
                               streams, each pushed after it
   and for both:
     nothing                   the lanes forked from GPU 0 and joined back:
                               what every variant pays around its work
   Each: the median and the 10th percentile of `iters` launches (each timed
   by events on GPU 0 around one launch, the GPUs idle before it), and the
   ratio to the GEMM of all rows. Without 2 GPUs it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include <stdio.h>
#include <string.h>

#ifndef HOSTIR_CUDA
int main(void) {
  (void)now_ms;
  (void)cmp_double;
  printf("bench-hand: built without CUDA; nothing to measure\n");
  return 0;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

enum { LANES = 4, EVENTS = 16, VARIANTS = 8 };

typedef struct gpu {
  cudaStream_t lane[LANES]; /* lane 0: where the graph starts and ends */
  cudaEvent_t ev[EVENTS];
  int nev;
  cublasHandle_t blas;
  void *workspace;
  char *a, *b, *g, *c, *r;
} gpu;

static int rs;              /* 0: AG+GEMM, 1: GEMM+RS */
static int64_t M, K, N, KL; /* KL: the GEMM's inner size, K (ag) or K/2 (rs) */
static gpu gpus[2];

static int blas_ok(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return 1;
  snprintf(failure, sizeof failure, "%s: cuBLAS status %d", what, (int)s);
  return 0;
}

/* An event of GPU d recorded on its lane now (for another lane to wait on). */
static cudaEvent_t mark(int d, int lane) {
  gpu *x = &gpus[d];
  cudaEvent_t e = x->ev[x->nev++ % EVENTS];
  cudaSetDevice(d);
  cudaEventRecord(e, x->lane[lane]);
  return e;
}

static void wait_for(int d, int lane, cudaEvent_t e) {
  cudaSetDevice(d);
  cudaStreamWaitEvent(gpus[d].lane[lane], e, 0);
}

/* C rows [row, row + rows) = X [rows, KL] x B on GPU d's lane (row-major: cuBLAS computes C^T = B^T X^T). */
static int gemm(int d, int lane, const char *x, int64_t row, int64_t rows) {
  gpu *g = &gpus[d];
  float one = 1, zero = 0;
  cudaSetDevice(d);
  cublasSetStream(g->blas, g->lane[lane]);
  return blas_ok(cublasGemmEx(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)rows, (int)KL, &one, g->b, CUDA_R_16BF,
                              (int)N, x, CUDA_R_16BF, (int)KL, &zero, g->c + row * N * 2, CUDA_R_16BF, (int)N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
}

/* The rows of X from `row` on: ag's own rows are A's, the peer's G's; rs's all A's. */
static const char *rows_of(int d, int64_t row, int own) {
  return rs ? gpus[d].a + row * KL * 2 : own ? gpus[d].a + (row - d * (M / 2)) * K * 2 : gpus[d].g + row * K * 2;
}

/* Rows [from, from + rows) of what GPU d sends, into the other GPU on d's
   lane: ag, its A into the other's G; rs, its C rows of the other's half
   into the other's R. */
static int push(int d, int lane, int64_t from, int64_t rows) {
  int64_t h = M / 2, row_bytes = (rs ? N : K) * 2;
  char *to = rs ? gpus[1 - d].r + from * row_bytes : gpus[1 - d].g + (d * h + from) * row_bytes;
  const char *src = rs ? gpus[d].c + ((1 - d) * h + from) * row_bytes : gpus[d].a + from * row_bytes;
  cudaSetDevice(d);
  return cuda_ok(cudaMemcpyAsync(to, src, (size_t)(rows * row_bytes), cudaMemcpyDefault, gpus[d].lane[lane]),
                 "cudaMemcpyAsync between the GPUs");
}

/* rs: GPU d's own rows of C += R, the peer's partial sums of them. */
static int add(int d, int lane) {
  gpu *g = &gpus[d];
  float one = 1;
  cudaSetDevice(d);
  cublasSetStream(g->blas, g->lane[lane]);
  return blas_ok(cublasAxpyEx(g->blas, (int)(M / 2 * N), &one, CUDA_R_32F, g->r, CUDA_R_16BF, 1,
                              g->c + d * (M / 2) * N * 2, CUDA_R_16BF, 1, CUDA_R_32F),
                 "cublasAxpyEx");
}

static const char *names[2][VARIANTS] = {
    {"GEMM of all M rows", "GEMM of M/2 rows", "GEMM of M/4 rows", "push", "serial: push, then GEMM",
     "push || own half, then peer half", "the same, 2 pushes", "nothing: the fork and join alone"},
    {"GEMM of all M rows", "GEMM of M/2 rows", "GEMM of M/4 rows", "push", "serial: GEMM, push, add",
     "peer half, push || own half, add", "the same, 2 pushes", "nothing: the fork and join alone"}};

/* Variant v's work on both GPUs, every lane forked from GPU 0's lane 0 and joined back. */
static int record(int v) {
  int64_t h = M / 2, q = M / 4;
  cudaEvent_t start = mark(0, 0), pushed[2][2] = {{NULL, NULL}, {NULL, NULL}};
  int d, l, ok = 1;
  for (d = 0; d < 2; d++)
    for (l = d == 0; l < LANES; l++) wait_for(d, l, start);
  for (d = 0; d < 2 && ok; d++) {
    int64_t own = d * h, peer = (1 - d) * h;
    switch (v) {
    case 0: ok = gemm(d, 1, rs ? gpus[d].a : gpus[d].g, 0, M); break;
    case 1: ok = gemm(d, 1, rows_of(d, own, 1), own, h); break;
    case 2: ok = gemm(d, 1, rows_of(d, own, 1), own, q); break;
    case 3: ok = push(d, 1, 0, h); break;
    case 4:
      ok = (!rs || gemm(d, 1, gpus[d].a, 0, M)) && push(d, 1, 0, h);
      pushed[d][0] = mark(d, 1);
      break;
    case 5:
      ok = (!rs || gemm(d, 1, rows_of(d, peer, 0), peer, h)) && push(d, 1, 0, h);
      pushed[d][0] = mark(d, 1);
      ok = ok && gemm(d, 2, rows_of(d, own, 1), own, h);
      break;
    case 6:
      for (l = 0; l < 2 && ok; l++) {
        ok = (!rs || gemm(d, 1 + l, rows_of(d, peer + l * q, 0), peer + l * q, q)) && push(d, 1 + l, l * q, q);
        pushed[d][l] = mark(d, 1 + l);
      }
      ok = ok && gemm(d, 3, rows_of(d, own, 1), own, h);
      break;
    }
  }
  for (d = 0; d < 2 && ok; d++) { /* what follows the other GPU's push into this one */
    int64_t peer = (1 - d) * h;
    if (v == 4) wait_for(d, 1, pushed[1 - d][0]), ok = rs ? add(d, 1) : gemm(d, 1, gpus[d].g, 0, M);
    if (v == 5) wait_for(d, 2, pushed[1 - d][0]), ok = rs ? add(d, 2) : gemm(d, 2, rows_of(d, peer, 0), peer, h);
    if (v == 6 && rs) wait_for(d, 3, pushed[1 - d][0]), wait_for(d, 3, pushed[1 - d][1]), ok = add(d, 3);
    if (v == 6 && !rs)
      for (l = 0; l < 2 && ok; l++)
        wait_for(d, 1 + l, pushed[1 - d][l]), ok = gemm(d, 1 + l, rows_of(d, peer + l * q, 0), peer + l * q, q);
  }
  for (d = 0; d < 2; d++)
    for (l = d == 0; l < LANES; l++) wait_for(0, 0, mark(d, l));
  cudaSetDevice(0);
  return ok;
}

static int capture(int v, cudaGraphExec_t *exec) {
  cudaGraph_t graph = NULL;
  int ok;
  cudaSetDevice(0);
  if (!cuda_ok(cudaStreamBeginCapture(gpus[0].lane[0], cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"))
    return 0;
  ok = record(v);
  if (!cuda_ok(cudaStreamEndCapture(gpus[0].lane[0], &graph), "cudaStreamEndCapture") || !ok) return 0;
  ok = cuda_ok(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return ok;
}

static int setup(void) {
  int d, i;
  size_t bytes[5] = {(size_t)((rs ? M : M / 2) * KL * 2), (size_t)(KL * N * 2), (size_t)(rs ? 2 : M * K * 2),
                     (size_t)(M * N * 2), (size_t)(M / 2 * N * 2)};
  for (d = 0; d < 2; d++) {
    gpu *g = &gpus[d];
    char **buf[5] = {&g->a, &g->b, &g->g, &g->c, &g->r};
    int can = 0;
    cudaSetDevice(d);
    cudaDeviceCanAccessPeer(&can, d, 1 - d);
    if (can && cudaDeviceEnablePeerAccess(1 - d, 0) != cudaSuccess) cudaGetLastError(); /* enabled already */
    for (i = 0; i < 5; i++) {
      if (!cuda_ok(cudaMalloc((void **)buf[i], bytes[i]), "cudaMalloc")) return 0;
      if (!cuda_ok(cudaMemset(*buf[i], 0x3c, bytes[i]), "cudaMemset")) return 0; /* bf16 0x3c3c, about 0.0115 */
    }
    for (i = 0; i < LANES; i++)
      if (!cuda_ok(cudaStreamCreateWithFlags(&g->lane[i], cudaStreamNonBlocking), "cudaStreamCreate")) return 0;
    for (i = 0; i < EVENTS; i++)
      if (!cuda_ok(cudaEventCreateWithFlags(&g->ev[i], cudaEventDisableTiming), "cudaEventCreate")) return 0;
    if (!blas_ok(cublasCreate(&g->blas), "cublasCreate")) return 0;
    if (!cuda_ok(cudaMalloc(&g->workspace, 32u << 20), "cudaMalloc")) return 0;
    cublasSetWorkspace(g->blas, g->workspace, 32u << 20); /* none allocated while capturing */
  }
  return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

int main(int argc, char **argv) {
  int i, v, iters = 300, ngpu = 0, nsize = 0;
  int64_t size[3] = {4096, 4096, 1024};
  double floor_ms = 0, *t;
  cudaEvent_t t0, t1;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "ag") || !strcmp(argv[i], "rs")) rs = argv[i][0] == 'r';
    else if (nsize < 3) size[nsize++] = atoll(argv[i]);
  }
  M = size[0], K = size[1], N = size[2], KL = rs ? K / 2 : K;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
    printf("bench-hand: needs 2 GPUs (%d visible); nothing to measure\n", ngpu);
    return 0;
  }
  if (M % 4 || M < 4 || K < 2 || K % 2 || N < 1 || iters < 1) {
    fprintf(stderr, "bench-hand: M must be a positive multiple of 4, K a positive even number, N and --iters positive\n");
    return 2;
  }
  if (!setup() || !(t = (double *)malloc((size_t)iters * sizeof *t))) {
    fprintf(stderr, "bench-hand: %s\n", failure[0] ? failure : "out of memory");
    return 1;
  }
  cudaSetDevice(0);
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  printf("%s by hand M=%lld K=%lld N=%lld bf16, 2 GPUs, one process, each variant one CUDA graph over both;"
         " median of %d launches (ms)\n", rs ? "GEMM+ReduceScatter" : "AllGather+GEMM", (long long)M, (long long)K,
         (long long)N, iters);
  printf("  %-36s %8s %8s %8s\n", "variant", "median", "p10", "x GEMM");
  for (v = 0; v < VARIANTS; v++) {
    cudaGraphExec_t exec = NULL;
    float ms;
    if (!capture(v, &exec)) {
      fprintf(stderr, "bench-hand: %s: %s\n", names[rs][v], failure);
      return 1;
    }
    for (i = -20; i < iters; i++) {
      cudaEventRecord(t0, gpus[0].lane[0]);
      cudaGraphLaunch(exec, gpus[0].lane[0]);
      cudaEventRecord(t1, gpus[0].lane[0]);
      if (!cuda_ok(cudaEventSynchronize(t1), names[rs][v])) {
        fprintf(stderr, "bench-hand: %s\n", failure);
        return 1;
      }
      cudaEventElapsedTime(&ms, t0, t1);
      if (i >= 0) t[i] = ms;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    if (v == 0) floor_ms = t[iters / 2];
    printf("  %-36s %8.4f %8.4f %8.2f", names[rs][v], t[iters / 2], t[iters / 10], t[iters / 2] / floor_ms);
    if (v == 3) printf("   (%.0f GB/s a GPU)", (double)(M / 2 * (rs ? N : K) * 2) / (t[iters / 2] * 1e6));
    printf("\n");
    cudaGraphExecDestroy(exec);
  }
  (void)now_ms;
  free(t);
  return 0;
}
#endif
