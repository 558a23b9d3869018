/* GEMM + all-reduce at decode shapes on 2 GPUs, with the all-reduce fed
   chunk by chunk as the GEMM makes its output: the yardstick for a
   collective that consumes a producer's chunks as they finish. No hostir
   program: cuBLAS calls and one kernel of this file, per GPU one CUDA graph
   of `reps` calls, the GPUs meeting only through flags in each other's
   memory (as hostir's kernel collectives do).

     build/bench-fed [M K N]         K: a GPU's share of the inner axis (default 256 4096 4096)
     build/bench-fed [--parts 2,4] [--ctas 8,16,32] [--reps 20] [--iters 30] [--one-gpu] [--rs]
                    [--gemm-only]
                    [--signal kernel|memop]

   Each GPU holds A [M, K] and W [K, N] (bf16, random, its own) and needs
   C = A0 W0 + A1 W1, summed in rank order (both GPUs get the same bits);
   --rs: GPU r needs only rows [r M/2, (r+1) M/2) of it (GEMM + reduce-scatter,
   the "fed" variant by columns only; the kernel pushes the peer's rows).
   The all-reduce is one shot: every CTA pushes its part of the GPU's C
   into the peer's slot with plain stores, and sums what lands there (bf16's
   negative zero as the "not landed yet" sentinel, put back by the reader).
     GEMM                    cuBLAS, the whole [M, N]: the floor
     GEMM in S column parts  S calls, each N/S columns of W and C (ld = N)
     GEMM in S row parts     S calls, each M/S rows of A and C
     the collective alone    the kernel on C alone
     serial                  GEMM, then the collective
     per column part         GEMM of part s, then on a second stream the
                             collective of part s (S launches)
     fed, S parts            one collective launch beside the GEMMs: part s's
                             GEMM is followed by a flag (a kernel of one
                             thread; --signal memop: cuStreamWriteValue32),
                             the kernel waits for each flag and reduces that
                             part while the next part's GEMM runs; the parts
                             N/S columns, or M/S rows; or launched once the
                             first part's GEMM is done
   Times: us a call (a graph's time over its calls, the slower GPU), median of
   `iters` launches. Every variant's C is checked on both GPUs against the
   sum of the two GPUs' GEMM outputs (bitwise: the same float sums in the
   same order).
   --gemm-only times the GEMM rows alone on GPU 0 (one GPU suffices).
   Without 2 GPUs (or with --gemm-only, 1) it says so and exits 0. Every wait is bounded (1 s). */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include "bench.h"
#include <stdio.h>
#include <string.h>

#ifndef HOSTIR_CUDA
int main(void) {
  (void)now_ms;
  (void)cmp_double;
  printf("bench-fed: built without CUDA; nothing to measure\n");
  return 0;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

static const char *const fed_source[] = { /* pieces under C's 4095-character limit */
    "typedef unsigned long long u64;\n"
    "enum { THREADS = 512, UNROLL = 4, MAXCTAS = 128, DATA_AT = 65536 };\n"
    "enum : unsigned { SENTINEL = 0x80008000u };\n"
    "struct fed_args {\n"
    "  unsigned char *ws[2];  /* each GPU's workspace: flags, seen counts, call counters, then two halves of slots */\n"
    "  unsigned char *c;      /* [M, N] bf16, row-major: this GPU's GEMM output, summed in place */\n"
    "  u64 M, N, half;        /* half: bytes of a half (2 slots of M x N) */\n"
    "  int parts, first, last, wait_flags, by_rows, scatter, me;\n"
    "  u64 timeout_ns;\n"
    "  unsigned *error;       /* this GPU's: 1 a wait passed its deadline */\n"
    "};\n"
    "__device__ __forceinline__ u64 now_ns(void) { u64 t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); return t; }\n"
    "__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {\n"
    "  unsigned v; asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" : \"=r\"(v) : \"l\"(p) : \"memory\"); return v;\n"
    "}\n"
    "__device__ __forceinline__ uint4 ld_volatile(const unsigned char *p) {\n"
    "  uint4 v;\n"
    "  asm volatile(\"ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];\" : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p) : \"memory\");\n"
    "  return v;\n"
    "}\n"
    "__device__ __forceinline__ unsigned unneg(unsigned w) {\n"
    "  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;\n"
    "  if ((w >> 16) == 0x8000u) w &= 0xffffu;\n"
    "  return w;\n"
    "}\n"
    "__device__ __forceinline__ bool landed(const uint4 &v) {\n"
    "  return unneg(v.x) == v.x && unneg(v.y) == v.y && unneg(v.z) == v.z && unneg(v.w) == v.w;\n"
    "}\n"
    "__device__ __forceinline__ void add8(float *acc, const uint4 &v) {\n"
    "  unsigned w[4] = {v.x, v.y, v.z, v.w};\n"
    "  for (int j = 0; j < 4; j++) { acc[2 * j] += __uint_as_float(w[j] << 16); acc[2 * j + 1] += __uint_as_float(w[j] & 0xffff0000u); }\n"
    "}\n"
    "__device__ __forceinline__ unsigned pack2(float lo, float hi) {\n"
    "  unsigned w; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(w) : \"f\"(hi), \"f\"(lo)); return w;\n"
    "}\n"
    ,
    "/* --signal kernel: part s's flag raised by a kernel of one thread after its GEMM. */\n"
    "extern \"C\" __global__ void fed_signal(unsigned *flag) {\n"
    "  __threadfence();\n"
    "  asm volatile(\"st.release.gpu.global.u32 [%0], %1;\" ::\"l\"(flag), \"r\"(1u) : \"memory\");\n"
    "}\n"
    "extern \"C\" __global__ void fed_fill(unsigned char *p, u64 vectors) {\n"
    "  for (u64 v = blockIdx.x * (u64)blockDim.x + threadIdx.x; v < vectors; v += (u64)gridDim.x * blockDim.x)\n"
    "    *(uint4 *)(p + v * 16) = make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL);\n"
    "}\n"
    "/* Parts [first, last) of C (part s: columns [s N/parts, (s+1) N/parts), or\n"
    "   by_rows its rows [s M/parts, (s+1) M/parts)), each\n"
    "   once its flag is up where wait_flags; the last CTA to see a flag lowers it.\n"
    "   scatter: a reduce-scatter, GPU r keeping rows [r M/2, (r+1) M/2) of the sum. */\n"
    "extern \"C\" __global__ void __launch_bounds__(THREADS) fed_allreduce(fed_args a) {\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ int failed;\n"
    "  unsigned *mine = (unsigned *)a.ws[a.me], *flags = mine, *seen = mine + 64, *counter = mine + 128;\n"
    "  int peer = 1 - a.me;\n"
    "  u64 start = now_ns();\n"
    "  if (threadIdx.x == 0) seq_s = counter[blockIdx.x] + 1, failed = 0;\n"
    "  __syncthreads();\n"
    "  unsigned seq = seq_s;\n"
    "  u64 rows = (a.by_rows ? a.M / a.parts : a.M) / (a.scatter ? 2 : 1), cols = a.by_rows ? a.N : a.N / a.parts;\n"
    "  u64 per_row = cols / 8, vectors = rows * per_row, slot = a.M * a.N * 2;\n"
    "  u64 per = (vectors + gridDim.x - 1) / gridDim.x, v0 = per * blockIdx.x, v1 = v0 + per < vectors ? v0 + per : vectors;\n"
    "  unsigned char *to = a.ws[peer] + DATA_AT + (seq & 1) * a.half + a.me * slot;\n"
    "  unsigned char *from = a.ws[a.me] + DATA_AT + (seq & 1) * a.half + peer * slot;\n"
    "  for (int s = a.first; s < a.last; s++) {\n"
    "    if (a.wait_flags && threadIdx.x == 0) {\n"
    "      unsigned spins = 0;\n"
    "      while (!ld_acquire(&flags[s]))\n"
    "        if ((++spins & 63) == 0 && now_ns() - start > a.timeout_ns) { failed = 1; *(volatile unsigned *)a.error = 1; break; }\n"
    "      if (atomicAdd(&seen[s], 1u) == gridDim.x - 1) seen[s] = 0, flags[s] = 0;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (failed) return;\n"
    "    u64 chunk = s * vectors * 16, row0 = a.by_rows ? s * rows : 0, col0 = a.by_rows ? 0 : s * cols;\n"
    "    u64 push_row0 = row0 + (a.scatter ? peer * rows : 0), own_row0 = row0 + (a.scatter ? a.me * rows : 0);\n"
    "    for (u64 v = v0 + threadIdx.x; v < v1; v += THREADS * UNROLL) {\n"
    "      uint4 x[UNROLL];\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < UNROLL; k++) {\n"
    "        u64 u = v + k * THREADS;\n"
    "        if (u < v1) {\n"
    "          x[k] = __ldcg((const uint4 *)(a.c + ((push_row0 + u / per_row) * a.N + col0 + (u % per_row) * 8) * 2));\n"
    "          x[k] = make_uint4(unneg(x[k].x), unneg(x[k].y), unneg(x[k].z), unneg(x[k].w));\n"
    "        }\n"
    "      }\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < UNROLL; k++)\n"
    "        if (v + k * THREADS < v1) *(uint4 *)(to + chunk + (v + k * THREADS) * 16) = x[k];\n"
    "    }\n"
    "    __syncthreads(); /* every push has read its part of C before any sum is written over it */\n"
    "    for (u64 v = v0 + threadIdx.x; v < v1; v += THREADS) {\n"
    "      unsigned char *own = a.c + ((own_row0 + v / per_row) * a.N + col0 + (v % per_row) * 8) * 2, *p = from + chunk + v * 16;\n"
    "      uint4 mine_v = __ldcg((const uint4 *)own), x = ld_volatile(p);\n"
    "      unsigned spins = 0;\n"
    "      while (!landed(x)) {\n"
    "        if ((++spins & 63) == 0 && now_ns() - start > a.timeout_ns) { *(volatile unsigned *)a.error = 1; return; }\n"
    "        x = ld_volatile(p);\n"
    "      }\n"
    "      *(uint4 *)p = make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL);\n"
    "      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};\n"
    "      if (a.me == 0) add8(acc, mine_v), add8(acc, x); else add8(acc, x), add8(acc, mine_v);\n"
    "      *(uint4 *)own = make_uint4(pack2(acc[0], acc[1]), pack2(acc[2], acc[3]), pack2(acc[4], acc[5]), pack2(acc[6], acc[7]));\n"
    "    }\n"
    "  }\n"
    "  if (threadIdx.x == 0) counter[blockIdx.x] = seq;\n"
    "}\n"};

enum { MAXPARTS = 8, MAXLIST = 8, EVENTS = 64 };
typedef int (*write_value_fn)(cudaStream_t, unsigned long long, unsigned, unsigned); /* cuStreamWriteValue32 */

typedef struct fed_args {
  unsigned char *ws[2];
  unsigned char *c;
  unsigned long long M, N, half;
  int parts, first, last, wait_flags, by_rows, scatter, me;
  unsigned long long timeout_ns;
  unsigned *error;
} fed_args;

typedef struct gpu {
  cudaStream_t s0, s1;
  cudaEvent_t ev[EVENTS], t0, t1;
  int nev;
  cublasHandle_t blas;
  void *blas_ws, *library;
  cudaKernel_t fed, fill, signal;
  unsigned char *a, *w, *c, *ws;
  unsigned *error;
} gpu;

static int64_t M = 256, K = 8192, N = 4096;
static gpu gpus[2];
static int device_of[2] = {0, 1}; /* --one-gpu: both ranks on GPU 0 (a check of the numbers; its times mean nothing) */
static int ranks = 2;             /* --gemm-only: 1, the GEMM rows on GPU 0 alone (what parts cost cuBLAS) */
static write_value_fn write_value;
static int scatter;              /* --rs: a reduce-scatter (GPU r keeps rows [r M/2, (r+1) M/2)), not an all-reduce */
static int signal_by_kernel = 1; /* --signal memop: flags raised by cuStreamWriteValue32 (about 5 us each in a graph) */
static size_t half_bytes;

/* Part `part` of `parts` of C = A x W on GPU d's stream: its columns (W's
   and C's, ld = N), or by_rows its rows (A's and C's). Row-major: cuBLAS
   computes C^T = W^T A^T. */
static int gemm(int d, cudaStream_t s, int part, int parts, int by_rows) {
  gpu *g = &gpus[d];
  float one = 1, zero = 0;
  int64_t rows = by_rows ? M / parts : M, cols = by_rows ? N : N / parts;
  int64_t row0 = by_rows ? part * rows : 0, col0 = by_rows ? 0 : part * cols;
  cublasSetStream(g->blas, s);
  if (cublasGemmEx(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)cols, (int)rows, (int)K, &one, g->w + col0 * 2, CUDA_R_16BF, (int)N,
                   g->a + row0 * K * 2, CUDA_R_16BF, (int)K, &zero, g->c + (row0 * N + col0) * 2, CUDA_R_16BF, (int)N,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS)
    return 1;
  snprintf(failure, sizeof failure, "cublasGemmEx");
  return 0;
}

static int allreduce(int d, cudaStream_t s, int parts, int first, int last, int wait_flags, int by_rows, int ctas) {
  gpu *g = &gpus[d];
  fed_args a;
  void *argv[1] = {&a};
  dim3 grid = {(unsigned)ctas, 1, 1}, block = {512, 1, 1};
  memset(&a, 0, sizeof a);
  a.ws[0] = gpus[0].ws, a.ws[1] = gpus[1].ws;
  a.c = g->c, a.M = (unsigned long long)M, a.N = (unsigned long long)N, a.half = half_bytes;
  a.parts = parts, a.first = first, a.last = last, a.wait_flags = wait_flags, a.by_rows = by_rows, a.scatter = scatter, a.me = d;
  a.timeout_ns = 1000000000ull, a.error = g->error;
  return cuda_ok(cudaLaunchKernel((const void *)g->fed, grid, block, argv, 0, s), "launching the all-reduce");
}

static cudaEvent_t mark(int d, cudaStream_t s) {
  gpu *g = &gpus[d];
  cudaEvent_t e = g->ev[g->nev++ % EVENTS];
  cudaEventRecord(e, s);
  return e;
}

enum { V_GEMM, V_GEMM_PARTS, V_GEMM_ROWS, V_AR, V_SERIAL, V_PER_PART, V_FED, V_FED_LATE, V_FED_ROWS, NVARIANTS };
static const char *const names[NVARIANTS] = {"GEMM",
                                             "GEMM in column parts",
                                             "GEMM in row parts",
                                             "the collective alone",
                                             "serial: GEMM, collective",
                                             "per column part: GEMM || coll.",
                                             "fed, column parts",
                                             "fed, launched after part 0",
                                             "fed, row parts"};
static int in_parts(int v) { return v >= V_PER_PART || v == V_GEMM_PARTS || v == V_GEMM_ROWS; }

/* Part s's flag, after what GPU d's s0 has done so far. */
static int raise_flag(int d, int s) {
  gpu *g = &gpus[d];
  unsigned *flag = (unsigned *)(g->ws + 4 * s);
  void *argv[1] = {&flag};
  dim3 one = {1, 1, 1};
  if (signal_by_kernel) return cuda_ok(cudaLaunchKernel((const void *)g->signal, one, one, argv, 0, g->s0), "the signal kernel");
  if (write_value(g->s0, (unsigned long long)(uintptr_t)flag, 1, 0) == 0) return 1;
  snprintf(failure, sizeof failure, "cuStreamWriteValue32");
  return 0;
}

/* One call of variant v on GPU d, from s0 back to s0. */
static int record(int d, int v, int parts, int ctas) {
  gpu *g = &gpus[d];
  int s, ok = 1, rows = v == V_GEMM_ROWS || v == V_FED_ROWS;
  switch (v) {
  case V_GEMM: return gemm(d, g->s0, 0, 1, 0);
  case V_GEMM_PARTS:
  case V_GEMM_ROWS:
    for (s = 0; s < parts && ok; s++) ok = gemm(d, g->s0, s, parts, rows);
    return ok;
  case V_AR: return allreduce(d, g->s0, 1, 0, 1, 0, 0, ctas);
  case V_SERIAL: return gemm(d, g->s0, 0, 1, 0) && allreduce(d, g->s0, 1, 0, 1, 0, 0, ctas);
  case V_PER_PART:
    for (s = 0; s < parts && ok; s++) {
      ok = gemm(d, g->s0, s, parts, 0);
      cudaStreamWaitEvent(g->s1, mark(d, g->s0), 0);
      ok = ok && allreduce(d, g->s1, parts, s, s + 1, 0, 0, ctas);
    }
    cudaStreamWaitEvent(g->s0, mark(d, g->s1), 0);
    return ok;
  case V_FED:
  case V_FED_LATE:
  case V_FED_ROWS:
    if (v != V_FED_LATE) cudaStreamWaitEvent(g->s1, mark(d, g->s0), 0);
    ok = v == V_FED_LATE || allreduce(d, g->s1, parts, 0, parts, 1, rows, ctas);
    for (s = 0; s < parts && ok; s++) {
      ok = gemm(d, g->s0, s, parts, rows);
      ok = ok && raise_flag(d, s);
      if (ok && v == V_FED_LATE && s == 0) /* the kernel's CTAs take no SMs from the first part's GEMM */
        cudaStreamWaitEvent(g->s1, mark(d, g->s0), 0), ok = allreduce(d, g->s1, parts, 0, parts, 1, rows, ctas);
    }
    cudaStreamWaitEvent(g->s0, mark(d, g->s1), 0);
    return ok;
  }
  return 0;
}

static int capture(int d, int v, int parts, int ctas, int reps, cudaGraphExec_t *exec) {
  cudaGraph_t graph = NULL;
  int i, ok = 1;
  cudaSetDevice(device_of[d]);
  if (!cuda_ok(cudaStreamBeginCapture(gpus[d].s0, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture")) return 0;
  for (i = 0; i < reps && ok; i++) ok = record(d, v, parts, ctas);
  if (!cuda_ok(cudaStreamEndCapture(gpus[d].s0, &graph), "cudaStreamEndCapture") || !ok) return 0;
  ok = cuda_ok(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return ok;
}

static int setup(void) {
  size_t bytes[3] = {(size_t)(M * K * 2), (size_t)(K * N * 2), (size_t)(M * N * 2)};
  uint64_t state = 0x9e3779b97f4a7c15ull;
  int d, i;
  half_bytes = 2 * bytes[2];
  for (d = 0; d < 2; d++) {
    gpu *g = &gpus[d];
    unsigned char **buf[3] = {&g->a, &g->w, &g->c};
    void *argv[2];
    unsigned char *halves;
    unsigned long long vectors = 2 * (unsigned long long)half_bytes / 16;
    dim3 grid = {256, 1, 1}, block = {256, 1, 1};
    char err[1024], text[8192] = "";
    for (i = 0; i < (int)(sizeof fed_source / sizeof fed_source[0]); i++) strcat(text, fed_source[i]);
    cudaSetDevice(device_of[d]);
    if (device_of[0] != device_of[1] && cudaDeviceEnablePeerAccess(device_of[1 - d], 0) != cudaSuccess) cudaGetLastError();
    for (i = 0; i < 3; i++) {
      uint16_t *host = (uint16_t *)malloc(bytes[i]);
      size_t j;
      if (!host) return snprintf(failure, sizeof failure, "out of memory"), 0;
      for (j = 0; j < bytes[i] / 2; j++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[j] = hir_float_to_bf16(((float)(state >> 40) / 16777216.0f - 0.5f) * (i == 0 ? 1.0f : 0.05f));
      }
      if (!cuda_ok(cudaMalloc((void **)buf[i], bytes[i]), "cudaMalloc") ||
          !cuda_ok(cudaMemcpy(*buf[i], host, bytes[i], cudaMemcpyHostToDevice), "cudaMemcpy"))
        return free(host), 0;
      free(host);
    }
    if (!cuda_ok(cudaMalloc((void **)&g->ws, 65536 + 2 * half_bytes), "cudaMalloc") ||
        !cuda_ok(cudaMemset(g->ws, 0, 65536), "cudaMemset") || !cuda_ok(cudaMallocManaged((void **)&g->error, 4, cudaMemAttachGlobal), "cudaMallocManaged") ||
        !cuda_ok(cudaStreamCreateWithFlags(&g->s0, cudaStreamNonBlocking), "cudaStreamCreate") ||
        !cuda_ok(cudaStreamCreateWithFlags(&g->s1, cudaStreamNonBlocking), "cudaStreamCreate") ||
        !cuda_ok(cudaEventCreate(&g->t0), "cudaEventCreate") || !cuda_ok(cudaEventCreate(&g->t1), "cudaEventCreate"))
      return 0;
    *g->error = 0;
    for (i = 0; i < EVENTS; i++)
      if (!cuda_ok(cudaEventCreateWithFlags(&g->ev[i], cudaEventDisableTiming), "cudaEventCreate")) return 0;
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) return snprintf(failure, sizeof failure, "cublasCreate"), 0;
    if (!cuda_ok(cudaMalloc(&g->blas_ws, 32u << 20), "cudaMalloc")) return 0;
    cublasSetWorkspace(g->blas, g->blas_ws, 32u << 20);
    if (hir_cuda_library_load(device_of[d], text, "bench-fed's all-reduce", &g->library, err, sizeof err) != HIR_OK)
      return snprintf(failure, sizeof failure, "%s", err), 0;
    if (!cuda_ok(cudaLibraryGetKernel(&g->fed, (cudaLibrary_t)g->library, "fed_allreduce"), "the kernel") ||
        !cuda_ok(cudaLibraryGetKernel(&g->fill, (cudaLibrary_t)g->library, "fed_fill"), "the kernel") ||
        !cuda_ok(cudaLibraryGetKernel(&g->signal, (cudaLibrary_t)g->library, "fed_signal"), "the kernel"))
      return 0;
    halves = g->ws + 65536;
    argv[0] = &halves, argv[1] = &vectors;
    if (!cuda_ok(cudaLaunchKernel((const void *)g->fill, grid, block, argv, 0, g->s0), "the fill") ||
        !cuda_ok(cudaStreamSynchronize(g->s0), "the fill"))
      return 0;
  }
  {
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return snprintf(failure, sizeof failure, "no cuStreamWriteValue32"), 0;
    memcpy(&write_value, &fn, sizeof fn);
  }
  return 1;
}

/* Launches both GPUs' graphs `iters` times (after 3 warm-ups): the slower GPU's time a call, median, in us. */
static int time_graphs(cudaGraphExec_t exec[2], int reps, int iters, double *median) {
  double *t = (double *)malloc((size_t)iters * sizeof *t);
  int i, d;
  if (!t) return snprintf(failure, sizeof failure, "out of memory"), 0;
  for (i = -3; i < iters; i++) {
    double worst = 0;
    for (d = 0; d < ranks; d++) {
      cudaSetDevice(device_of[d]);
      cudaEventRecord(gpus[d].t0, gpus[d].s0);
      cudaGraphLaunch(exec[d], gpus[d].s0);
      cudaEventRecord(gpus[d].t1, gpus[d].s0);
    }
    for (d = 0; d < ranks; d++) {
      float ms = 0;
      cudaSetDevice(device_of[d]);
      if (!cuda_ok(cudaEventSynchronize(gpus[d].t1), "a graph's run")) return free(t), 0;
      if (*gpus[d].error) return free(t), snprintf(failure, sizeof failure, "GPU %d: a wait passed its deadline", d), 0;
      cudaEventElapsedTime(&ms, gpus[d].t0, gpus[d].t1);
      if (ms > worst) worst = ms;
    }
    if (i >= 0) t[i] = worst * 1e3 / reps;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp_double);
  *median = t[iters / 2];
  free(t);
  return 1;
}

/* Both GPUs' C after variant v against the sum of their GEMMs' outputs,
   bitwise: the GEMMs run again, eagerly, in the variant's parts (cuBLAS may
   round a part's columns otherwise than the whole's). Leaves C as the GEMMs
   wrote it. */
static int check(int v, int parts, uint16_t *got[2], uint16_t *want) {
  size_t n = (size_t)(M * N), j;
  int d, s, by_rows = v == V_FED_ROWS, cut = v >= V_PER_PART;
  for (d = 0; d < 2; d++) {
    cudaSetDevice(device_of[d]);
    if (!cuda_ok(cudaMemcpy(got[d], gpus[d].c, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 0;
    for (s = 0; s < (cut ? parts : 1); s++)
      if (!gemm(d, gpus[d].s0, s, cut ? parts : 1, by_rows)) return 0;
    if (!cuda_ok(cudaStreamSynchronize(gpus[d].s0), "the reference GEMMs")) return 0;
    /* the partial sums: GPU 0's after GPU 1's result (got[1] has room for both), GPU 1's in want */
    if (!cuda_ok(cudaMemcpy(d == 0 ? got[1] + n : want, gpus[d].c, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 0;
  }
  for (j = 0; j < n; j++) want[j] = hir_float_to_bf16(0.0f + hir_bf16_to_float(got[1][n + j]) + hir_bf16_to_float(want[j])); /* from +0, as the kernel's sums */
  for (d = 0; d < 2; d++)
    for (j = scatter ? (size_t)d * n / 2 : 0; j < (scatter ? (size_t)(d + 1) * n / 2 : n); j++)
      if (got[d][j] != want[j]) {
        snprintf(failure, sizeof failure, "%s, %d parts: GPU %d element %zu is %g, the sum is %g", names[v], parts, d, j,
                 (double)hir_bf16_to_float(got[d][j]), (double)hir_bf16_to_float(want[j]));
        return 0;
      }
  return 1;
}

static int parse_list(const char *s, int *out) {
  int n = 0;
  while (*s && n < MAXLIST) {
    out[n++] = atoi(s);
    while (*s && *s != ',') s++;
    if (*s == ',') s++;
  }
  return n;
}

int main(int argc, char **argv) {
  int i, v, p, c, d, ngpu = 0, reps = 20, iters = 30, nparts, nctas, nsize = 0;
  int parts_list[MAXLIST] = {2, 4}, ctas_list[MAXLIST] = {8, 16, 32};
  int64_t size[3] = {256, 4096, 4096};
  uint16_t *want, *got[2];
  double gemm_us = 0;
  nparts = 2, nctas = 3;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--parts") && i + 1 < argc) nparts = parse_list(argv[++i], parts_list);
    else if (!strcmp(argv[i], "--ctas") && i + 1 < argc) nctas = parse_list(argv[++i], ctas_list);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--one-gpu")) device_of[1] = 0;
    else if (!strcmp(argv[i], "--gemm-only")) device_of[1] = 0, ranks = 1;
    else if (!strcmp(argv[i], "--rs")) scatter = 1;
    else if (!strcmp(argv[i], "--signal") && i + 1 < argc) signal_by_kernel = strcmp(argv[++i], "memop") != 0;
    else if (nsize < 3) size[nsize++] = atoll(argv[i]);
  }
  M = size[0], K = size[1], N = size[2];
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1 + device_of[1]) {
    printf("bench-fed: needs 2 GPUs (%d visible); nothing to measure\n", ngpu);
    return 0;
  }
  for (p = 0; p < nparts; p++)
    if (parts_list[p] < 1 || parts_list[p] > MAXPARTS || N % (8 * parts_list[p])) {
      fprintf(stderr, "bench-fed: N must be a multiple of 8 x each part count (1-%d)\n", MAXPARTS);
      return 2;
    }
  for (c = 0; c < nctas; c++)
    if (ctas_list[c] < 1 || ctas_list[c] > 128) return fprintf(stderr, "bench-fed: --ctas from 1 to 128\n"), 2;
  if (M < 1 || K < 1 || reps < 1 || iters < 1 || (scatter && M % 2))
    return fprintf(stderr, "bench-fed: M, K, --reps, --iters positive (M even with --rs)\n"), 2;
  if (!setup() || !(want = (uint16_t *)malloc((size_t)(M * N) * 2)) || !(got[0] = (uint16_t *)malloc((size_t)(M * N) * 2)) ||
      !(got[1] = (uint16_t *)malloc((size_t)(M * N) * 4))) {
    fprintf(stderr, "bench-fed: %s\n", failure[0] ? failure : "out of memory");
    return 1;
  }
  printf("GEMM + %s, M=%lld K=%lld N=%lld bf16, %s, a CUDA graph of %d calls a GPU;"
         " us a call, the slower GPU, median of %d\n",
         scatter ? "reduce-scatter" : "all-reduce", (long long)M, (long long)K, (long long)N,
         ranks == 1 ? "the GEMMs alone on GPU 0" : device_of[1] ? "2 GPUs (one process)" : "both ranks on GPU 0", reps, iters);
  printf("  %-32s %5s %5s %9s %8s\n", "variant", "parts", "CTAs", "us", "x GEMM");
  for (v = 0; v < (ranks == 1 ? V_AR : NVARIANTS); v++)
    for (p = 0; p < (in_parts(v) ? nparts : 1); p++)
      for (c = 0; c < (v >= V_AR ? nctas : 1); c++) {
        cudaGraphExec_t exec[2] = {NULL, NULL};
        int parts = in_parts(v) ? parts_list[p] : 1, ctas = v >= V_AR ? ctas_list[c] : 0;
        double us;
        if ((v == V_GEMM_ROWS || v == V_FED_ROWS) && (M % parts || (scatter && v == V_FED_ROWS))) continue;
        for (d = 0; d < ranks; d++)
          if (!capture(d, v, parts, ctas, reps, &exec[d])) {
            fprintf(stderr, "bench-fed: %s: %s\n", names[v], failure);
            return 1;
          }
        if (!time_graphs(exec, reps, iters, &us)) {
          fprintf(stderr, "bench-fed: %s: %s\n", names[v], failure);
          return 1;
        }
        if (v == V_GEMM) gemm_us = us;
        if (v >= V_SERIAL && !check(v, parts, got, want)) {
          fprintf(stderr, "bench-fed: WRONG: %s\n", failure);
          return 1;
        }
        printf("  %-32s %5d %5d %9.1f %8.2f\n", names[v], parts, ctas, us, us / gemm_us);
        for (d = 0; d < ranks; d++) {
          cudaSetDevice(device_of[d]);
          cudaMemset(gpus[d].c, 0xff, (size_t)(M * N) * 2); /* poison (bf16 NaN) before the next variant */
          cudaGraphExecDestroy(exec[d]);
        }
        fflush(stdout);
      }
  (void)now_ms;
  return 0;
}
#endif
