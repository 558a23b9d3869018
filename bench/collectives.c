/* All-reduce, reduce-scatter and all-gather through hostir_nccl's
   communicator on every visible GPU: NCCL's kernels, hostir's one-shot and
   two-shot all-reduce (reduce-scatter and all-gather: its kernel), and the
   automatic choice, bf16 sums, from 8 KB to 256 MB (the all-reduce's buffer,
   the reduce-scatter's input, the all-gather's output). Microseconds per
   call, eager (20 calls between two CUDA events) and in a CUDA graph of 20
   calls, the slowest rank's, median of 20, beside the physical floor: the
   bytes each rank receives (all-reduce 2(D-1)/D x S, the others (D-1)/D x S)
   over the peer bandwidth measured in the same run (256 MiB to the next
   rank while receiving from the previous, copy engines). With --torch FILE
   (bench/torch_collectives.py's, run just before) PyTorch's symmetric-memory
   one-shot and two-shot join the table, and "auto/best" is the automatic
   choice over the fastest of NCCL and those. Every row's result is checked
   against NCCL's (err: the largest difference over the largest value).

     build/bench-collectives [--sizes 8K,1M,...] [--ctas N] [--only ar|rs|ag] [--torch FILE] [--beside BYTES] [--rms H]
     torchrun --nproc-per-node 2 --no-python build/bench-collectives --processes ...

   --beside BYTES measures, instead of the tables, how much a cuBLAS GEMM
   (bf16, 8192 x 8192 x 8192) slows while all-reduces of BYTES run beside
   it on another stream, back to back from the GEMM's start, on hostir's
   kernel (--ctas N of them) and on NCCL; and how much the all-reduces slow.

   --rms H measures, instead, a decode step's all-reduce followed by a
   residual add and an RMSNorm (bf16 rows of H, 1 to 1024 tokens): NCCL's
   all-reduce then the CUDA backend's add and rms_norm, hostir's kernel
   all-reduce (the measured choice) then the same two, and the three in one
   call (hir_comm.allreduce_rms_norm), beside the floor (the all-reduce's
   bytes received over the peer bandwidth); err: the fused call's h and out
   against the kernel-then-ops result.

   One process with a thread per GPU, or (--processes) one process per GPU
   under torchrun, mpirun or srun. */
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#include "bench.h"
#include <cublas_v2.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifndef HOSTIR_CUDA
int main(void) {
  printf("bench-collectives: needs the CUDA build (CUDA and NCCL found by the Makefile)\n");
  return 0;
}
#else
enum { MAXR = 8, CALLS = 20, ITERS = 20, MAXSIZES = 32, NPATHS = 4, MAXTORCH = 1024 };
enum { AR, RS, AG, NKINDS };
static const char *const kind_names[NKINDS] = {"all-reduce", "reduce-scatter", "all-gather"};
static const char *const kind_keys[NKINDS] = {"ar", "rs", "ag"};
static const hir_nccl_path paths[NPATHS] = {HIR_NCCL_PATH_NCCL, HIR_NCCL_PATH_ONE_SHOT, HIR_NCCL_PATH_TWO_SHOT, HIR_NCCL_PATH_AUTO};

typedef struct torch_row { int kind, graph; size_t bytes; char who[32]; double us; } torch_row;

typedef struct bench {
  int D, procs, me, ctas, only;
  size_t beside;                     /* --beside: the all-reduce's bytes */
  int rms_hidden;                    /* --rms: the rows' elements */
  double rms_us[8][3][2], rms_err[8]; /* by token count, form (NCCL apart, kernel apart, fused), eager/graph; NaN: declined */
  double beside_ms[2][4];            /* by path (kernel, NCCL): GEMM alone, GEMM beside, a call alone, a call beside (us) */
  size_t sizes[MAXSIZES];
  int nsizes;
  hir_nccl_world *world;
  hir_comm *pcomm;
  pthread_barrier_t meet;
  double shared[MAXR * ITERS];       /* threads: what each rank shares */
  double err[MAXR];
  char msg[MAXR][520];
  double peer_gbs;
  torch_row torch[MAXTORCH];
  int ntorch;
  double us[NKINDS][MAXSIZES][NPATHS][2], errs[NKINDS][MAXSIZES][NPATHS];
} bench;

static bench B;

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  return (size_t)(v * (*end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1));
}

/* bf16 of a float, rounded to nearest even. */
static unsigned short bf16_of(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float float_of_bf16(unsigned short h) {
  unsigned u = (unsigned)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Every rank's `mine` (doubles) into all, rank order: threads share memory, processes go through the communicator. */
static hir_status share(hir_comm *c, void *team, cudaStream_t s, const double *mine, double *all, int n) {
  double *dev;
  if (!B.procs) {
    memcpy(B.shared + (size_t)c->rank * n, mine, (size_t)n * sizeof *mine);
    pthread_barrier_wait(&B.meet);
    memcpy(all, B.shared, (size_t)n * B.D * sizeof *all);
    pthread_barrier_wait(&B.meet);
    return HIR_OK;
  }
  if (cudaMalloc((void **)&dev, (size_t)n * sizeof *dev * (B.D + 1)) != cudaSuccess) return HIR_ERR_NOMEM;
  cudaMemcpyAsync(dev + (size_t)n * B.D, mine, (size_t)n * sizeof *mine, cudaMemcpyHostToDevice, s);
  hir_status st = c->allgather(c, team, dev + (size_t)n * B.D, dev, (size_t)n * sizeof *dev, s);
  if (st == HIR_OK && cudaStreamSynchronize(s) == cudaSuccess) cudaMemcpy(all, dev, (size_t)n * sizeof *dev * B.D, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  return st;
}

static hir_status call(hir_comm *c, void *team, int kind, const void *in, void *out, size_t bytes, cudaStream_t s) {
  size_t count = bytes / 2;
  if (kind == AR) return c->allreduce(c, team, in, out, count, HIR_BF16, s);
  if (kind == RS) return c->reduce_scatter(c, team, in, out, count / (size_t)B.D, HIR_BF16, s);
  return c->allgather(c, team, in, out, bytes / (size_t)B.D, s);
}

/* One call of what a row times, on stream s. */
typedef struct row_call {
  hir_status (*run)(const struct row_call *r, cudaStream_t s);
  hir_comm *c;
  void *team;
  int kind;                          /* a collective's (call), or the --rms form */
  const void *in;
  void *out;
  size_t bytes;
  hir_backend *b;                    /* --rms: the add's and the norm's */
  hir_tensor t[5];                   /* --rms: the partial sums, residual, weight, h, out */
} row_call;
static hir_status call_row(const row_call *r, cudaStream_t s) { return call(r->c, r->team, r->kind, r->in, r->out, r->bytes, s); }

/* Per-call microseconds of CALLS calls of r, ITERS times: eager, or one graph of CALLS calls. */
static hir_status time_calls(const row_call *r, int graph, cudaStream_t s, double *times) {
  hir_comm *c = r->c;
  cudaEvent_t e0, e1;
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  hir_status st = HIR_OK;
  int i, k;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (i = 0; i < 3 && st == HIR_OK; i++) st = r->run(r, s);
  if (st == HIR_OK && graph) {
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (k = 0; k < CALLS && st == HIR_OK; k++) st = r->run(r, s);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || st != HIR_OK || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
      if (st == HIR_OK) snprintf(c->error, sizeof c->error, "capture failed: %s", cudaGetErrorString(cudaGetLastError()));
      st = st == HIR_OK ? HIR_ERR_BACKEND : st;
    } else {
      cudaGraphLaunch(exec, s);
    }
  }
  if (cudaStreamSynchronize(s) != cudaSuccess && st == HIR_OK) st = HIR_ERR_BACKEND;
  for (i = 0; i < ITERS && st == HIR_OK; i++) {
    float ms = 0;
    cudaEventRecord(e0, s);
    if (graph) cudaGraphLaunch(exec, s);
    else
      for (k = 0; k < CALLS && st == HIR_OK; k++) st = r->run(r, s);
    cudaEventRecord(e1, s);
    if (cudaStreamSynchronize(s) != cudaSuccess && st == HIR_OK) st = HIR_ERR_BACKEND;
    cudaEventElapsedTime(&ms, e0, e1);
    times[i] = ms * 1e3 / CALLS;
  }
  if (st == HIR_OK) st = c->poll(c);
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return st;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over iterations of the slowest rank. */
static double slowest(const double *all) {
  double worst[ITERS];
  int i, r;
  for (i = 0; i < ITERS; i++)
    for (worst[i] = 0, r = 0; r < B.D; r++) worst[i] = all[r * ITERS + i] > worst[i] ? all[r * ITERS + i] : worst[i];
  return median(worst, ITERS);
}

/* --beside: a GEMM of GEMM_DIM^3 on one stream, BESIDE_CALLS all-reduces of
   B.beside bytes on another from its start (enough to outlast it); each
   timed alone and together, the slowest rank's median of BESIDE_ITERS. */
enum { GEMM_DIM = 8192, BESIDE_CALLS = 64, BESIDE_ITERS = 7 };
static hir_status beside_rank(hir_comm *c, void *team, cudaStream_t s, int rank, void *in, void *out) {
  static const hir_nccl_path beside_paths[2] = {HIR_NCCL_PATH_AUTO, HIR_NCCL_PATH_NCCL};
  size_t dim = GEMM_DIM, count = B.beside / 2 / (size_t)B.D * (size_t)B.D;
  void *a = NULL, *b = NULL, *d = NULL;
  cublasHandle_t blas = NULL;
  cudaStream_t gs;
  cudaEvent_t e[4];
  float one = 1, zero = 0;
  double t[4][BESIDE_ITERS], all[MAXR * ITERS];
  hir_status st = HIR_OK;
  int p, i, k, form;
  if (cudaMalloc(&a, dim * dim * 2) != cudaSuccess || cudaMalloc(&b, dim * dim * 2) != cudaSuccess ||
      cudaMalloc(&d, dim * dim * 2) != cudaSuccess || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
      cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(B.msg[rank], sizeof B.msg[rank], "--beside: out of memory or no cuBLAS");
    return HIR_ERR_NOMEM;
  }
  cudaMemset(a, 0x3c, dim * dim * 2); /* bf16 0x3c3c, about 0.0115: finite sums */
  cudaMemset(b, 0x3c, dim * dim * 2);
  cudaDeviceSynchronize(); /* the legacy stream's, which the nonblocking streams below do not wait for */
  cublasSetStream(blas, gs);
  for (i = 0; i < 4; i++) cudaEventCreate(&e[i]);
  for (p = 0; p < 2 && st == HIR_OK; p++) {
    if ((st = hir_nccl_comm_set_path(c, beside_paths[p], B.ctas)) != HIR_OK) break;
    for (i = 0; i < BESIDE_ITERS + 1 && st == HIR_OK; i++) /* the first: warm-up */
      for (form = 0; form < 3 && st == HIR_OK; form++) { /* GEMM alone, calls alone, together */
        float ms = 0;
        cudaEventRecord(e[0], gs);
        cudaStreamWaitEvent(s, e[0], 0);
        if (form != 1 && cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)dim, (int)dim, (int)dim, &one, a, CUDA_R_16BF, (int)dim, b,
                                      CUDA_R_16BF, (int)dim, &zero, d, CUDA_R_16BF, (int)dim, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
          snprintf(c->error, sizeof c->error, "--beside: cublasGemmEx failed");
          st = HIR_ERR_BACKEND;
        }
        cudaEventRecord(e[1], gs);
        cudaEventRecord(e[2], s);
        for (k = 0; form != 0 && k < BESIDE_CALLS && st == HIR_OK; k++) st = c->allreduce(c, team, in, out, count, HIR_BF16, s);
        cudaEventRecord(e[3], s);
        if (cudaStreamSynchronize(gs) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) st = st ? st : HIR_ERR_BACKEND;
        if (st == HIR_OK) st = c->poll(c);
        if (i == 0) continue;
        if (form != 1) cudaEventElapsedTime(&ms, e[0], e[1]), t[form == 0 ? 0 : 1][i - 1] = ms;
        if (form != 0) cudaEventElapsedTime(&ms, e[2], e[3]), t[form == 1 ? 2 : 3][i - 1] = ms * 1e3 / BESIDE_CALLS;
      }
    hir_nccl_comm_set_path(c, HIR_NCCL_PATH_NCCL, 0);
    for (k = 0; k < 4 && st == HIR_OK; k++) {
      double mine[ITERS] = {0};
      memcpy(mine, t[k], sizeof t[k]);
      if ((st = share(c, team, s, mine, all, ITERS)) == HIR_OK && rank == 0) {
        double worst[BESIDE_ITERS];
        int r;
        for (i = 0; i < BESIDE_ITERS; i++)
          for (worst[i] = 0, r = 0; r < B.D; r++) worst[i] = all[r * ITERS + i] > worst[i] ? all[r * ITERS + i] : worst[i];
        B.beside_ms[p][k] = median(worst, BESIDE_ITERS);
      }
    }
  }
  if (st != HIR_OK && !B.msg[rank][0]) snprintf(B.msg[rank], sizeof B.msg[rank], "%s", c->error);
  for (i = 0; i < 4; i++) cudaEventDestroy(e[i]);
  cublasDestroy(blas);
  cudaStreamDestroy(gs);
  cudaFree(a), cudaFree(b), cudaFree(d);
  return st;
}

/* --rms: form 0 NCCL's all-reduce, then the CUDA backend's add and
   rms_norm; 1 the kernel's all-reduce (the measured choice), then the
   same; 2 the three in one call (HIR_ERR_UNSUPPORTED where it declines). */
enum { RMS_TOKENS = 5, RMS_FORMS = 3 };
static const int rms_tokens[RMS_TOKENS] = {1, 16, 64, 256, 1024};
static hir_status rms_run(const row_call *r, cudaStream_t s) {
  hir_comm *c = r->c;
  size_t rows = (size_t)r->t[3].sizes[0], cols = (size_t)r->t[3].sizes[1];
  hir_status st;
  if (r->kind == 2)
    return c->allreduce_rms_norm(c, r->team, r->t[0].data, r->t[1].data, r->t[2].data, r->t[3].data, r->t[4].data, rows, cols, HIR_BF16,
                                 1e-6, s);
  if ((st = c->allreduce(c, r->team, r->t[0].data, r->t[3].data, rows * cols, HIR_BF16, s)) != HIR_OK) return st;
  if ((st = r->b->binary(r->b, s, HIR_BINARY_ADD, &r->t[3], &r->t[3], &r->t[1])) != HIR_OK ||
      (st = r->b->rms_norm(r->b, s, &r->t[4], &r->t[3], &r->t[2], 1, 1e-6)) != HIR_OK)
    snprintf(c->error, sizeof c->error, "%s", r->b->error);
  return st;
}

static hir_status rms_rank(hir_comm *c, void *team, cudaStream_t s, int rank, int device) {
  size_t H = (size_t)B.rms_hidden, most = (size_t)rms_tokens[RMS_TOKENS - 1] * H, k;
  unsigned short *host = (unsigned short *)malloc(most * 2 * 2);
  void *buf[7] = {0};
  double all[MAXR * ITERS], mine[ITERS];
  hir_status st = HIR_OK;
  row_call r;
  int i, z, form, g;
  unsigned seed;
  memset(&r, 0, sizeof r);
  r.run = rms_run, r.c = c, r.team = team;
  if (!host || !(r.b = hir_backend_cuda_create(device))) {
    snprintf(B.msg[rank], sizeof B.msg[rank], "--rms: out of memory, or no CUDA backend");
    return HIR_ERR_NOMEM;
  }
  for (i = 0; i < 7; i++)
    if (cudaMalloc(&buf[i], i == 2 ? H * 2 : most * 2) != cudaSuccess) {
      snprintf(B.msg[rank], sizeof B.msg[rank], "--rms: out of device memory");
      return HIR_ERR_NOMEM;
    }
  for (i = 0; i < 3; i++) { /* the partial sums (this rank's), the residual and the weight (every rank's the same): [-1, 1) */
    for (k = 0, seed = i == 0 ? 99u + (unsigned)c->rank : 7u + (unsigned)i; k < (i == 2 ? H : most); k++) {
      seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
      host[k] = bf16_of((float)(seed >> 8) / (1 << 24) * 2 - 1);
    }
    cudaMemcpy(buf[i], host, (i == 2 ? H : most) * 2, cudaMemcpyHostToDevice);
  }
  cudaDeviceSynchronize();
  for (z = 0; z < RMS_TOKENS && st == HIR_OK; z++) {
    size_t M = (size_t)rms_tokens[z];
    for (i = 0; i < 5; i++) {
      memset(&r.t[i], 0, sizeof r.t[i]);
      r.t[i].data = buf[i], r.t[i].dtype = HIR_BF16, r.t[i].ndims = i == 2 ? 1 : 2;
      r.t[i].sizes[0] = i == 2 ? (int64_t)H : (int64_t)M, r.t[i].sizes[1] = (int64_t)H;
      hir__contiguous_strides(&r.t[i]);
    }
    for (form = 0; form < RMS_FORMS && st == HIR_OK; form++) {
      r.kind = form;
      if ((st = hir_nccl_comm_set_path(c, form == 0 ? HIR_NCCL_PATH_NCCL : HIR_NCCL_PATH_AUTO, B.ctas)) == HIR_ERR_UNSUPPORTED) {
        st = HIR_OK; /* no kernels here: NCCL's row only */
        for (g = 0; g < 2 && rank == 0; g++) B.rms_us[z][form][g] = NAN;
        continue;
      }
      cudaMemsetAsync(buf[3], 0xff, M * H * 2, s), cudaMemsetAsync(buf[4], 0xff, M * H * 2, s); /* NaN where nothing is written */
      if (st == HIR_OK && (st = rms_run(&r, s)) == HIR_ERR_UNSUPPORTED) {
        st = HIR_OK;
        for (g = 0; g < 2 && rank == 0; g++) B.rms_us[z][form][g] = NAN;
        continue;
      }
      if (st == HIR_OK && (cudaStreamSynchronize(s) != cudaSuccess || (st = c->poll(c)) != HIR_OK)) st = st ? st : HIR_ERR_BACKEND;
      if (st == HIR_OK && form == 1) /* the kernel then the ops: the reference */
        cudaMemcpy(buf[5], buf[3], M * H * 2, cudaMemcpyDeviceToDevice), cudaMemcpy(buf[6], buf[4], M * H * 2, cudaMemcpyDeviceToDevice);
      if (st == HIR_OK && form == 2) { /* the largest difference from it, over its largest value */
        double top = 0, diff = 0;
        for (i = 0; i < 2; i++) {
          cudaMemcpy(host, buf[3 + i], M * H * 2, cudaMemcpyDeviceToHost);
          cudaMemcpy(host + most, buf[5 + i], M * H * 2, cudaMemcpyDeviceToHost);
          for (k = 0; k < M * H; k++) {
            double a = float_of_bf16(host[k]), b = float_of_bf16(host[most + k]);
            top = fabs(b) > top ? fabs(b) : top;
            diff = !(fabs(a - b) <= diff) ? fabs(a - b) : diff;
          }
        }
        B.err[rank] = top > 0 ? diff / top : diff;
      }
      for (g = 0; g < 2 && st == HIR_OK; g++) {
        if ((st = time_calls(&r, g, s, mine)) != HIR_OK) break;
        hir_nccl_comm_set_path(c, HIR_NCCL_PATH_NCCL, 0);
        if ((st = share(c, team, s, mine, all, ITERS)) == HIR_OK && rank == 0) B.rms_us[z][form][g] = slowest(all);
        hir_nccl_comm_set_path(c, form == 0 ? HIR_NCCL_PATH_NCCL : HIR_NCCL_PATH_AUTO, B.ctas);
      }
    }
    hir_nccl_comm_set_path(c, HIR_NCCL_PATH_NCCL, 0);
    if (st == HIR_OK && (st = share(c, team, s, &B.err[rank], all, 1)) == HIR_OK && rank == 0)
      for (B.rms_err[z] = 0, i = 0; i < B.D; i++) B.rms_err[z] = all[i] > B.rms_err[z] || all[i] != all[i] ? all[i] : B.rms_err[z];
  }
  if (st != HIR_OK && !B.msg[rank][0]) snprintf(B.msg[rank], sizeof B.msg[rank], "%s", c->error);
  for (i = 0; i < 7; i++) cudaFree(buf[i]);
  hir_backend_free(r.b);
  free(host);
  return st;
}

static hir_status rank_main(int rank, void *user) {
  hir_comm *c = B.procs ? B.pcomm : hir_nccl_world_comm(B.world, rank);
  int world[MAXR], i, z, p, g, kind, device = B.procs ? -1 : rank;
  unsigned seed;
  size_t most = 0, k;
  unsigned short *host;
  void *team, *in, *out, *ref;
  cudaStream_t s;
  hir_status st;
  double all[MAXR * ITERS], mine[ITERS];
  (void)user;
  if (device < 0) cudaGetDevice(&device);
  cudaSetDevice(device);
  for (i = 0; i < B.D; i++) world[i] = i;
  for (z = 0; z < B.nsizes; z++) most = B.sizes[z] > most ? B.sizes[z] : most;
  most = B.beside > most ? B.beside : most;
  if ((st = c->team(c, world, B.D, &team)) != HIR_OK) return st;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess || cudaMalloc(&in, most) != cudaSuccess ||
      cudaMalloc(&out, most) != cudaSuccess || cudaMalloc(&ref, most) != cudaSuccess || !(host = malloc(2 * most))) {
    snprintf(B.msg[rank], sizeof B.msg[rank], "out of memory for %zu bytes", most);
    return HIR_ERR_NOMEM;
  }
  for (k = 0, seed = 1234u + (unsigned)c->rank; k < most / 2; k++) { /* xorshift: uniform in [-1, 1) */
    seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
    host[k] = bf16_of((float)(seed >> 8) / (1 << 24) * 2 - 1);
  }
  cudaMemcpy(in, host, most, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize(); /* a pageable copy returns once staged; stream s does not wait for it */
  { /* the peer bandwidth: 256 MiB to the next rank while receiving from the previous, copy engines */
    size_t bytes = (size_t)256 << 20;
    void *a, *b;
    cudaEvent_t e0, e1;
    float ms;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
      for (i = 0; i < 5; i++) {
        cudaEventRecord(e0, s);
        c->group_start(c);
        c->send(c, a, bytes, (c->rank + 1) % B.D, s);
        c->recv(c, b, bytes, (c->rank + B.D - 1) % B.D, s);
        if ((st = c->group_end(c)) != HIR_OK) return st;
        cudaEventRecord(e1, s);
        cudaStreamSynchronize(s);
        cudaEventElapsedTime(&ms, e0, e1);
        mine[i] = ms;
      }
      cudaFree(a);
      cudaFree(b);
      if (rank == 0) B.peer_gbs = bytes / (median(mine, 5) * 1e-3) * 1e-9;
    }
  }
  if (B.beside && (st = beside_rank(c, team, s, rank, in, out)) != HIR_OK) return st;
  if (B.rms_hidden && (st = rms_rank(c, team, s, rank, device)) != HIR_OK) return st;
  for (kind = 0; kind < NKINDS && !B.beside && !B.rms_hidden; kind++) {
    if (B.only >= 0 && kind != B.only) continue;
    for (z = 0; z < B.nsizes; z++) {
      size_t bytes = B.sizes[z] / (2 * (size_t)B.D) * 2 * (size_t)B.D; /* whole bf16 elements a rank */
      size_t out_bytes = kind == RS ? bytes / (size_t)B.D : bytes;
      for (p = 0; p < NPATHS; p++) {
        if (kind != AR && p == 1) continue; /* one kernel each: the two-shot column */
        if ((st = hir_nccl_comm_set_path(c, paths[p], B.ctas)) == HIR_ERR_UNSUPPORTED) { /* no kernels here: NCCL's rows only */
          if (rank == 0) B.us[kind][z][p][0] = B.us[kind][z][p][1] = NAN;
          continue;
        }
        if (st != HIR_OK) {
          snprintf(B.msg[rank], sizeof B.msg[rank], "%s", c->error);
          return st;
        }
        cudaMemsetAsync(out, 0xff, out_bytes, s); /* NaN where nothing is written */
        if ((st = call(c, team, kind, in, out, bytes, s)) != HIR_OK || cudaStreamSynchronize(s) != cudaSuccess ||
            (st = c->poll(c)) != HIR_OK) {
          snprintf(B.msg[rank], sizeof B.msg[rank], "%s", c->error);
          return st ? st : HIR_ERR_BACKEND;
        }
        if (p == 0) {
          cudaMemcpyAsync(ref, out, out_bytes, cudaMemcpyDeviceToDevice, s);
          cudaStreamSynchronize(s);
          B.err[rank] = 0;
        } else { /* the largest difference from NCCL's result over its largest value */
          unsigned short *o = host, *r = host + most / 2;
          double top = 0, diff = 0;
          cudaMemcpy(o, out, out_bytes, cudaMemcpyDeviceToHost);
          cudaMemcpy(r, ref, out_bytes, cudaMemcpyDeviceToHost);
          for (k = 0; k < out_bytes / 2; k++) {
            double a = float_of_bf16(o[k]), b = float_of_bf16(r[k]);
            top = fabs(b) > top ? fabs(b) : top;
            diff = !(fabs(a - b) <= diff) ? fabs(a - b) : diff;
          }
          B.err[rank] = top > 0 ? diff / top : diff;
        }
        for (g = 0; g < 2; g++) {
          row_call r;
          memset(&r, 0, sizeof r);
          r.run = call_row, r.c = c, r.team = team, r.kind = kind, r.in = in, r.out = out, r.bytes = bytes;
          if ((st = time_calls(&r, g, s, mine)) != HIR_OK) {
            snprintf(B.msg[rank], sizeof B.msg[rank], "%s", c->error);
            return st;
          }
          hir_nccl_comm_set_path(c, HIR_NCCL_PATH_NCCL, 0);
          if ((st = share(c, team, s, mine, all, ITERS)) != HIR_OK) return st;
          if (rank == 0) B.us[kind][z][p][g] = slowest(all);
          hir_nccl_comm_set_path(c, paths[p], B.ctas);
        }
        hir_nccl_comm_set_path(c, HIR_NCCL_PATH_NCCL, 0);
        if ((st = share(c, team, s, &B.err[rank], all, 1)) != HIR_OK) return st;
        if (rank == 0) {
          double e = 0;
          fprintf(stderr, "bench-collectives: %s %zu bytes, path %d done\n", kind_names[kind], bytes, (int)paths[p]);
          for (i = 0; i < B.D; i++) e = all[i] > e || all[i] != all[i] ? all[i] : e;
          B.errs[kind][z][p] = e;
        }
      }
    }
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(ref);
  free(host);
  cudaStreamDestroy(s);
  return HIR_OK;
}

static double torch_us(int kind, size_t bytes, int graph, const char *who) {
  int i;
  for (i = 0; i < B.ntorch; i++)
    if (B.torch[i].kind == kind && B.torch[i].graph == graph && B.torch[i].bytes == bytes && !strcmp(B.torch[i].who, who))
      return B.torch[i].us;
  return 0;
}

static void size_text(size_t b, char *buf, size_t cap) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, cap, "%zu MB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) snprintf(buf, cap, "%zu KB", b >> 10);
  else snprintf(buf, cap, "%zu B", b);
}

static void print_tables(void) {
  int kind, z, g, p;
  for (kind = 0; kind < NKINDS; kind++) {
    if (B.only >= 0 && kind != B.only) continue;
    for (g = 1; g >= 0; g--) {
      printf("%s, bf16, %d ranks (%s), %s, us a call (slowest rank, median of %d)%s\n", kind_names[kind], B.D,
             B.procs ? "a process per GPU" : "threads of one process", g ? "CUDA graphs of 20 calls" : "eager, 20 calls",
             ITERS, B.ntorch ? "; torch: symmetric memory, no multicast" : "");
      printf("%8s %9s %9s %9s %9s %9s", "bytes", "NCCL", kind == AR ? "one-shot" : "", kind == AR ? "two-shot" : "kernel", "auto", "floor");
      if (B.ntorch) printf(" %10s %10s %10s", kind == AR ? "torch 1sh" : "torch symm", kind == AR ? "torch 2sh" : "", "torch NCCL");
      printf(" %9s %10s %8s\n", "auto/best", "auto/floor", "err");
      for (z = 0; z < B.nsizes; z++) {
        size_t bytes = B.sizes[z] / (2 * (size_t)B.D) * 2 * (size_t)B.D;
        double recv = kind == AR ? 2.0 * (B.D - 1) / B.D * bytes : (double)(B.D - 1) / B.D * bytes;
        double floor_us = B.peer_gbs > 0 ? recv / (B.peer_gbs * 1e3) : 0, best = B.us[kind][z][0][g], e = 0;
        double t1 = kind == AR ? torch_us(kind, bytes, g, "symm_one-shot") : torch_us(kind, bytes, g, "symm");
        double t2 = kind == AR ? torch_us(kind, bytes, g, "symm_two-shot") : 0, tn = torch_us(kind, bytes, g, "nccl");
        char sz[32];
        size_text(bytes, sz, sizeof sz);
        if (t1 > 0 && t1 < best) best = t1;
        if (t2 > 0 && t2 < best) best = t2;
        for (p = 1; p < NPATHS; p++) e = B.errs[kind][z][p] > e ? B.errs[kind][z][p] : e;
        printf("%8s %9.1f", sz, B.us[kind][z][0][g]);
        if (kind == AR) printf(" %9.1f", B.us[kind][z][1][g]);
        else printf(" %9s", "");
        printf(" %9.1f %9.1f %9.1f", B.us[kind][z][2][g], B.us[kind][z][3][g], floor_us);
        if (B.ntorch) {
          if (t1 > 0) printf(" %10.1f", t1);
          else printf(" %10s", "-");
          if (t2 > 0) printf(" %10.1f", t2);
          else printf(" %10s", "");
          if (tn > 0) printf(" %10.1f", tn);
          else printf(" %10s", "-");
        }
        printf(" %9.2f %10.2f %8.1e\n", B.us[kind][z][3][g] / best, floor_us > 0 ? B.us[kind][z][3][g] / floor_us : 0, e);
      }
      printf("\n");
    }
  }
}

static void print_beside(void) {
  static const char *const names[2] = {"hostir's kernel", "NCCL"};
  char sz[32];
  int p;
  size_text(B.beside, sz, sizeof sz);
  printf("a GEMM (bf16, %d^3, cuBLAS) beside %d all-reduces of %s, %d ranks (%s), slowest rank, median of %d\n", GEMM_DIM,
         BESIDE_CALLS, sz, B.D, B.procs ? "a process per GPU" : "threads of one process", BESIDE_ITERS);
  printf("%-16s %11s %12s %7s %15s %16s %7s\n", "all-reduce on", "GEMM ms", "GEMM beside", "ratio", "all-reduce us", "all-reduce beside",
         "ratio");
  for (p = 0; p < 2; p++)
    printf("%-16s %11.3f %12.3f %7.2f %15.1f %16.1f %7.2f\n", names[p], B.beside_ms[p][0], B.beside_ms[p][1],
           B.beside_ms[p][1] / B.beside_ms[p][0], B.beside_ms[p][2], B.beside_ms[p][3], B.beside_ms[p][3] / B.beside_ms[p][2]);
  if (B.ctas) printf("(the kernel on at most %d CTAs; ", B.ctas);
  else printf("(the kernel on the CTAs measured at creation; ");
  printf("the all-reduces' calls, back to back, begin with the GEMM and outlast it)\n");
}

static void print_rms(void) {
  int z, g, f;
  for (g = 1; g >= 0; g--) {
    printf("all-reduce, residual add and rms_norm, bf16 rows of %d, %d ranks (%s), %s, us a call (slowest rank, median of %d)\n",
           B.rms_hidden, B.D, B.procs ? "a process per GPU" : "threads of one process", g ? "CUDA graphs of 20 calls" : "eager, 20 calls",
           ITERS);
    printf("%7s %8s %11s %11s %9s %9s %12s %11s %8s\n", "tokens", "bytes", "NCCL, ops", "kernel, ops", "fused", "floor", "fused/apart",
           "fused/floor", "err");
    for (z = 0; z < RMS_TOKENS; z++) {
      size_t bytes = (size_t)rms_tokens[z] * (size_t)B.rms_hidden * 2;
      double floor_us = B.peer_gbs > 0 ? 2.0 * (B.D - 1) / B.D * (double)bytes / (B.peer_gbs * 1e3) : 0, apart = 0;
      char sz[32];
      size_text(bytes, sz, sizeof sz);
      printf("%7d %8s", rms_tokens[z], sz);
      for (f = 0; f < RMS_FORMS; f++) {
        double us = B.rms_us[z][f][g];
        if (us == us) printf(" %*.1f", f == 2 ? 9 : 11, us);
        else printf(" %*s", f == 2 ? 9 : 11, "-");
        if (f < 2 && us == us && (apart == 0 || us < apart)) apart = us;
      }
      printf(" %9.1f", floor_us);
      if (B.rms_us[z][2][g] == B.rms_us[z][2][g] && apart > 0)
        printf(" %12.2f %11.2f %8.1e\n", B.rms_us[z][2][g] / apart, floor_us > 0 ? B.rms_us[z][2][g] / floor_us : 0, B.rms_err[z]);
      else printf(" %12s %11s %8s\n", "-", "-", "-");
    }
    printf("\n");
  }
  printf("(apart: the faster of the two rows before it; the floor: the all-reduce's 2(D-1)/D of the bytes received over the peer "
         "bandwidth)\n");
}

static void read_torch(const char *path) {
  FILE *f = fopen(path, "r");
  char kind[8], mode[8], who[32];
  unsigned long long bytes;
  double us;
  if (!f) {
    fprintf(stderr, "bench-collectives: cannot read %s; the torch columns are left out\n", path);
    return;
  }
  while (B.ntorch < MAXTORCH && fscanf(f, "%7s %llu %7s %31s %lf", kind, &bytes, mode, who, &us) == 5) {
    torch_row *t = &B.torch[B.ntorch++];
    t->kind = !strcmp(kind, "ar") ? AR : !strcmp(kind, "rs") ? RS : AG;
    t->graph = !strcmp(mode, "graph");
    t->bytes = (size_t)bytes;
    snprintf(t->who, sizeof t->who, "%s", who);
    t->us = us;
  }
  fclose(f);
}

int main(int argc, char **argv) {
  const char *sizes = "8K,32K,128K,512K,1M,2M,4M,8M,16M,64M,256M", *torch = NULL;
  hir_status st;
  int i;
  B.only = -1;
  setvbuf(stdout, NULL, _IOLBF, 0); /* each line out as it is made */
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--processes")) B.procs = 1;
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
    else if (!strcmp(argv[i], "--ctas") && i + 1 < argc) B.ctas = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--torch") && i + 1 < argc) torch = argv[++i];
    else if (!strcmp(argv[i], "--beside") && i + 1 < argc) B.beside = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "--rms") && i + 1 < argc && atoi(argv[i + 1]) > 0) B.rms_hidden = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
      for (B.only = 0; B.only < NKINDS && strcmp(kind_keys[B.only], argv[i + 1]); B.only++) {}
      if (B.only == NKINDS) B.only = -2;
      i++;
    } else B.only = -2;
    if (B.only == -2) {
      fprintf(stderr, "usage: %s [--processes] [--sizes 8K,1M,...] [--ctas N] [--only ar|rs|ag] [--torch FILE] [--beside BYTES] [--rms H]\n",
              argv[0]);
      return 2;
    }
  }
  {
    char *copy = strdup(sizes), *tok, *save = NULL;
    for (tok = strtok_r(copy, ",", &save); tok && B.nsizes < MAXSIZES; tok = strtok_r(NULL, ",", &save)) B.sizes[B.nsizes++] = parse_size(tok);
    free(copy);
  }
  if (torch) read_torch(torch);
  if (B.procs) {
    hir_nccl_env env;
    char err[512];
    if (hir_nccl_env_read(&env, err, sizeof err) != HIR_OK || env.size < 2 || env.size > MAXR) {
      fprintf(stderr, "bench-collectives: %s\n", env.size < 2 ? "--processes needs 2 to 8 ranks (torchrun, mpirun, srun)" : err);
      return 2;
    }
    if (hir_nccl_comm_create(&env, 60000, &B.pcomm) != HIR_OK) {
      fprintf(stderr, "bench-collectives: rank %d: %s\n", env.rank, B.pcomm ? B.pcomm->error : "out of memory");
      return 1;
    }
    B.D = env.size;
    B.me = env.rank;
    if (B.me == 0) printf("%s\n", hir_nccl_comm_describe(B.pcomm));
    if (B.me != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    st = rank_main(B.me, NULL);
  } else {
    if (cudaGetDeviceCount(&B.D) != cudaSuccess || B.D < 2) {
      printf("bench-collectives: %d GPU(s) visible, 2 needed\n", B.D);
      return 0;
    }
    B.D = B.D > MAXR ? MAXR : B.D;
    if (hir_nccl_world_create(B.D, &B.world) != HIR_OK) {
      fprintf(stderr, "bench-collectives: %s\n", hir_nccl_world_error(B.world));
      return 1;
    }
    hir_nccl_world_set_copy_engine(B.world, 1);
    printf("%s\n", hir_nccl_comm_describe(hir_nccl_world_comm(B.world, 0)));
    pthread_barrier_init(&B.meet, NULL, (unsigned)B.D);
    st = hir_spmd(B.D, rank_main, NULL);
  }
  if (st != HIR_OK) {
    for (i = 0; i < MAXR && !B.msg[i][0]; i++) {}
    fprintf(stderr, "bench-collectives: %s: %s\n", hir_status_str(st), i < MAXR ? B.msg[i] : "");
    return 1;
  }
  printf("peer bandwidth: %.0f GB/s (256 MiB to the next rank while receiving from the previous, copy engines)\n\n", B.peer_gbs);
  if (B.beside) print_beside();
  else if (B.rms_hidden) print_rms();
  else print_tables();
  if (B.procs) hir_nccl_comm_free(B.pcomm);
  else hir_nccl_world_free(B.world);
  return 0;
}
#endif
