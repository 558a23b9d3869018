/* Tensor x data parallel on a 2 x 2 mesh (hir_set_mesh_2d): the rows are
   data-parallel replicas, the columns tensor-parallel shards. Replica r
   holds its batch X_r [B, K]; device (r, c) its columns c of it and rows c
   of the weight W [K, N] (the same on both rows). Y_r = X_r W is summed
   from the partial products along each row (an allreduce per row: the
   row-parallel linear), then S = Y_0 + Y_1 down the columns (an allreduce
   per column: data parallelism's gradient sum). On 4 GPUs when the build
   found CUDA and four are visible, else on 4 in-process CPU ranks. Both
   outputs are checked against a plain reference on every device. */
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#else
#include "../hostir.h"
#endif
#include <math.h>
#include <stdlib.h>

enum { R = 2, C = 2, B = 8, K = 16, N = 12, KC = K / C };

typedef struct job {
  int gpus;
  hir_fusion *f;
  hir_local_world *world;
#ifdef HOSTIR_CUDA
  hir_nccl_world *nccl;
#endif
  float x[R][B * K], w[K * N], y_ref[R][B * N], s_ref[B * N];
  double max_err[R * C];
  char error[R * C][600];
} job;

static hir_status to_backend(hir_backend *be, const float *host, size_t bytes, void **data) {
  hir_status s;
  *data = (void *)host;
  if (!be || be->host_memory) return HIR_OK;
  if ((s = be->alloc(be, bytes, data)) != HIR_OK) return s;
  return be->upload(be, *data, host, bytes);
}

static double max_diff(hir_backend *be, const hir_tensor *t, const float *want, int n) {
  float got[B * N];
  double e = 0;
  int i;
  if (be && !be->host_memory) be->download(be, got, t->data, sizeof(float) * (size_t)n);
  else memcpy(got, t->data, sizeof(float) * (size_t)n);
  for (i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= e)) e = fabs((double)got[i] - want[i]); /* NaN counts */
  return e;
}

static hir_status run_rank(int rank, void *user) {
  job *j = (job *)user;
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2] = {{0}, {0}}, out[2] = {{0}, {0}};
  hir_backend *be = NULL;
  int r = rank / C, c = rank % C, i;
  float x[B * KC];
  hir_status s;
  ld.my_device = rank;
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
  for (i = 0; i < B; i++) memcpy(x + i * KC, j->x[r] + i * K + c * KC, sizeof(float) * KC); /* X_r's columns c */
  in[0].dtype = in[1].dtype = HIR_F32;
  in[0].ndims = 4; /* [1 (DIDy), 1 (DIDx), B, K/C] */
  in[0].sizes[0] = 1, in[0].sizes[1] = 1, in[0].sizes[2] = B, in[0].sizes[3] = KC;
  in[1].ndims = 3; /* W's rows c: [1 (DIDx), K/C, N] */
  in[1].sizes[0] = 1, in[1].sizes[1] = KC, in[1].sizes[2] = N;
  if ((s = to_backend(be, x, sizeof x, &in[0].data)) != HIR_OK ||
      (s = to_backend(be, j->w + c * KC * N, sizeof(float) * KC * N, &in[1].data)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "inputs: %s", be ? be->error : "");
    goto done;
  }
  if ((s = hir_run(ev, in, 2, out, 2)) != HIR_OK || (s = hir_evaluator_sync(ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "run: %s", hir_evaluator_error(ev));
    goto done;
  }
  j->max_err[rank] = fmax(max_diff(be, &out[0], j->y_ref[r], B * N), max_diff(be, &out[1], j->s_ref, B * N));
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
  int mesh[R * C] = {0, 1, 2, 3}, columns = 1, replicas = 0, i, k, n, r, failed = 0;
  unsigned seed = 7;
  hir_tv *tx, *tw, *tp, *ty, *ts;
  hir_status s;

#ifdef HOSTIR_CUDA
  {
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu >= R * C) {
      if (hir_nccl_world_create(R * C, &j.nccl) == HIR_OK) {
        j.gpus = 1;
      } else {
        fprintf(stderr, "NCCL: %s; running on the CPU\n", hir_nccl_world_error(j.nccl));
        hir_nccl_world_free(j.nccl);
        j.nccl = NULL;
      }
    }
  }
#endif

  /* X [R (DIDy), C (DIDx), B, K/C] @ W [C (DIDx), K/C, N] (batch axes
     right-aligned: W is the same for both replicas) = P [R, C, B, N];
     Y = P summed over C, [R (DIDy), B, N]; S = Y summed over R, [B, N]. */
  j.f = hir_fusion_create();
  tx = hir_input(j.f, HIR_F32, 4);
  tw = hir_input(j.f, HIR_F32, 3);
  tp = hir_matmul(j.f, tx, tw);
  ty = hir_sum(j.f, tp, 1, &columns);
  ts = hir_sum(j.f, ty, 1, &replicas);
  hir_output(j.f, ty);
  hir_output(j.f, ts);
  hir_set_mesh_2d(tx, R, C, mesh);
  hir_set_mesh_2d(tw, R, C, mesh);
  hir_set_mesh_2d(ty, R, C, mesh);
  hir_set_mesh_2d(ts, R, C, mesh);
  hir_parallelize(tx, 0, HIR_DIDY);
  hir_parallelize(tx, 1, HIR_DIDX);
  hir_parallelize(tw, 0, HIR_DIDX);
  hir_parallelize(ty, 0, HIR_DIDY);
  if (hir_fusion_error(j.f)[0]) {
    fprintf(stderr, "fusion: %s\n", hir_fusion_error(j.f));
    return 1;
  }

  for (r = 0; r < R; r++)
    for (i = 0; i < B * K; i++) j.x[r][i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < K * N; i++) j.w[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (r = 0; r < R; r++)
    for (i = 0; i < B; i++)
      for (n = 0; n < N; n++) {
        double acc = 0;
        for (k = 0; k < K; k++) acc += (double)j.x[r][i * K + k] * j.w[k * N + n];
        j.y_ref[r][i * N + n] = (float)acc;
        j.s_ref[i * N + n] += (float)acc;
      }

  if (!j.gpus) j.world = hir_local_world_create(R * C);
  s = hir_spmd(R * C, run_rank, &j);
  for (r = 0; r < R * C; r++)
    if (j.error[r][0]) fprintf(stderr, "device %d: %s\n", r, j.error[r]);
  if (s == HIR_OK) {
    printf("tensor x data parallel on a %d x %d mesh of %s: Y = X W per replica, S = the replicas' sum;\n", R, C,
           j.gpus ? "GPUs (CUDA backend, NCCL)" : "in-process CPU ranks");
    for (r = 0; r < R * C; r++) {
      printf("  device %d (replica %d, shard %d): max |Y, S - reference| = %.2e\n", r, r / C, r % C, j.max_err[r]);
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
