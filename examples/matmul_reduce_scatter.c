/* GEMM + reduce-scatter (the row-parallel half of a tensor-parallel MLP):
   device r holds the columns r of A [M, K] and the rows r of B [K, N]; its
   partial product A_r B_r is [M, N], and C = sum_r A_r B_r is scattered by
   rows, device j ending with C's rows j. The partial products for each
   destination are computed chunk by chunk on streams while the previous
   chunk travels (a P2P reduce-scatter on a ring). On the GPUs when the build
   found CUDA and two or more are visible, else on 4 in-process CPU ranks.
   C is checked against a plain reference. */
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#else
#include "../hostir.h"
#endif
#include <math.h>
#include <stdlib.h>

enum { MAXD = 4, M = 64, K = 48, N = 32 };

typedef struct job {
  int D, gpus;
  hir_fusion *f;
  hir_local_world *world;
#ifdef HOSTIR_CUDA
  hir_nccl_world *nccl;
#endif
  float a[MAXD][M * K / 2], b[K * N], c_ref[M * N]; /* a[r]: A's columns r, [M, K/D] */
  double max_err[MAXD];
  char error[MAXD][600];
} job;

static hir_status to_backend(hir_backend *be, float *host, size_t bytes, void **data) {
  hir_status s;
  *data = host;
  if (!be || be->host_memory) return HIR_OK;
  if ((s = be->alloc(be, bytes, data)) != HIR_OK) return s;
  return be->upload(be, *data, host, bytes);
}

static hir_status run_rank(int rank, void *user) {
  job *j = (job *)user;
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2] = {{0}, {0}}, out[1] = {{0}};
  hir_backend *be = NULL;
  int D = j->D, kd = K / j->D, i;
  float c[M / 2 * N];
  hir_status s;
  ld.my_device = rank;
  ld.stream.schedule = HIR_SCHEDULE_RING;
  if ((s = hir_lower(j->f, &ld, &p)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "lowering: %s", hir_program_error(p));
    hir_program_free(p);
    return s;
  }
#ifdef HOSTIR_CUDA
  if (j->gpus) {
    be = hir_backend_cuda_create(rank);
    ed.comm = hir_nccl_world_comm(j->nccl, rank);
  }
#endif
  if (!j->gpus) ed.comm = hir_local_comm(j->world, rank);
  ed.backend = be;
  if ((s = hir_evaluator_create(p, &ed, &ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "evaluator: %s", hir_evaluator_error(ev));
    goto done;
  }
  in[0].dtype = in[1].dtype = HIR_F32; /* A_r as [1, D, M/D, K/D]: its rows in D blocks, one per destination */
  in[0].ndims = 4;
  in[0].sizes[0] = 1, in[0].sizes[1] = D, in[0].sizes[2] = M / D, in[0].sizes[3] = kd;
  in[1].ndims = 3; /* B_r as [1, K/D, N] */
  in[1].sizes[0] = 1, in[1].sizes[1] = kd, in[1].sizes[2] = N;
  if ((s = to_backend(be, j->a[rank], sizeof(float) * M * kd, &in[0].data)) != HIR_OK ||
      (s = to_backend(be, j->b + rank * kd * N, sizeof(float) * kd * N, &in[1].data)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "inputs: %s", be ? be->error : "");
    goto done;
  }
  if ((s = hir_run(ev, in, 2, out, 1)) != HIR_OK || (s = hir_evaluator_sync(ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "run: %s", hir_evaluator_error(ev));
    goto done;
  }
  if (be && !be->host_memory) /* C's rows `rank`: [M/D, N] */
    be->download(be, c, out[0].data, sizeof(float) * (M / D) * N);
  else
    memcpy(c, out[0].data, sizeof(float) * (M / D) * N);
  for (i = 0; i < M / D * N; i++) {
    double e = fabs((double)c[i] - j->c_ref[rank * (M / D) * N + i]);
    if (!(e <= j->max_err[rank])) j->max_err[rank] = e;
  }
done:
  if (be && !be->host_memory)
    for (i = 0; i < 2; i++)
      if (in[i].data) be->release(be, in[i].data);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  return s;
}

int main(void) {
  static job j;
  static float a[M * K];
  int mesh[MAXD] = {0, 1, 2, 3}, flags[4] = {0, 1, 0, 0}, axis0 = 0, i, r, k, failed = 0;
  unsigned seed = 11;
  hir_tv *ta, *tb, *tbb, *tp, *tc;
  hir_status s;

  j.D = MAXD;
#ifdef HOSTIR_CUDA
  {
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu >= 2) {
      j.D = ngpu >= 4 ? 4 : 2;
      if (hir_nccl_world_create(j.D, &j.nccl) == HIR_OK) {
        j.gpus = 1;
      } else {
        fprintf(stderr, "NCCL: %s; running on the CPU\n", hir_nccl_world_error(j.nccl));
        hir_nccl_world_free(j.nccl);
        j.nccl = NULL;
        j.D = MAXD;
      }
    }
  }
#endif

  /* A [DIDx(D), D, M/D, K/D] x broadcast(B [DIDx(D), K/D, N]) summed over
     the DIDx axis; the product's axis 1 (the destination) on Stream, the
     sum's axis 1 on DIDx: a reduce-scatter, P2P. */
  j.f = hir_fusion_create();
  ta = hir_input(j.f, HIR_F32, 4);
  tb = hir_input(j.f, HIR_F32, 3);
  tbb = hir_broadcast(j.f, tb, 4, flags);
  tp = hir_matmul(j.f, ta, tbb);
  tc = hir_sum(j.f, tp, 1, &axis0);
  hir_output(j.f, tc);
  hir_set_mesh(ta, j.D, mesh);
  hir_set_mesh(tb, j.D, mesh);
  hir_set_mesh(tc, j.D, mesh);
  hir_parallelize(ta, 0, HIR_DIDX);
  hir_parallelize(tb, 0, HIR_DIDX);
  hir_parallelize(tp, 1, HIR_STREAM);
  hir_parallelize(tc, 1, HIR_DIDX);
  if (hir_fusion_error(j.f)[0]) {
    fprintf(stderr, "fusion: %s\n", hir_fusion_error(j.f));
    return 1;
  }

  for (i = 0; i < M * K; i++) a[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < K * N; i++) j.b[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (r = 0; r < j.D; r++) /* A's columns r, contiguous */
    for (i = 0; i < M; i++) memcpy(j.a[r] + i * (K / j.D), a + i * K + r * (K / j.D), sizeof(float) * (K / j.D));
  for (i = 0; i < M; i++)
    for (k = 0; k < N; k++) {
      double acc = 0;
      for (r = 0; r < K; r++) acc += (double)a[i * K + r] * j.b[r * N + k];
      j.c_ref[i * N + k] = (float)acc;
    }

  if (!j.gpus) j.world = hir_local_world_create(j.D);
  s = hir_spmd(j.D, run_rank, &j);
  for (r = 0; r < j.D; r++)
    if (j.error[r][0]) fprintf(stderr, "device %d: %s\n", r, j.error[r]);
  if (s == HIR_OK) {
    printf("GEMM + reduce-scatter on %d %s: device j holds C's rows j;\n", j.D,
           j.gpus ? "GPUs (CUDA backend, NCCL)" : "in-process CPU ranks");
    for (r = 0; r < j.D; r++) {
      printf("  device %d: max |C - reference| = %.2e\n", r, j.max_err[r]);
      failed |= !(j.max_err[r] < 1e-4);
    }
  }
  hir_local_world_free(j.world);
#ifdef HOSTIR_CUDA
  hir_nccl_world_free(j.nccl);
#endif
  hir_fusion_free(j.f);
  return s == HIR_OK && !failed ? 0 : 1;
}
