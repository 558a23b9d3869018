/* A tensor-parallel MLP on logical shapes, as Megatron-LM's sequence
   parallelism runs it: y = relu(x W1^T) W2^T with x [T, H], W1 [F, H],
   W2 [H, F] (nn.Linear's weights). Written once on whole tensors, then
   sharded by splits: x and y on T (each rank its T/D rows), W1 on F
   (column-parallel), W2 on F (row-parallel; the same split reaches it
   through the first linear and the relu). The lowering gathers x (an
   Allgather), runs both linears on local parts and sums the second into
   y's rows (a ReduceScatter). On 4 GPUs when the build found CUDA and
   four are visible, else on 4 in-process CPU ranks; every rank's y is
   checked against a plain reference. */
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#else
#include "../hostir.h"
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { D = 4, T = 16, H = 8, F = 32 };

typedef struct job {
  int gpus;
  hir_fusion *f;
  hir_local_world *world;
#ifdef HOSTIR_CUDA
  hir_nccl_world *nccl;
#endif
  float x[T * H], w1[F * H], w2[H * F], y_ref[T * H];
  double max_err[D];
  char error[D][600];
  char program[8192];
} job;

static hir_status to_backend(hir_backend *be, const float *host, size_t bytes, void **data) {
  hir_status s;
  *data = (void *)host;
  if (!be || be->host_memory) return HIR_OK;
  if ((s = be->alloc(be, bytes, data)) != HIR_OK) return s;
  return be->upload(be, *data, host, bytes);
}

static hir_tensor matrix(int rows, int cols, int64_t row_stride) {
  hir_tensor t = {0};
  t.dtype = HIR_F32;
  t.ndims = 2;
  t.sizes[0] = rows, t.sizes[1] = cols;
  t.strides[0] = row_stride, t.strides[1] = 1;
  return t;
}

static hir_status run_rank(int rank, void *user) {
  job *j = (job *)user;
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[3], out[1] = {{0}};
  hir_backend *be = NULL;
  float got[T / D * H];
  int i;
  hir_status s;
  ld.my_device = rank;
  if ((s = hir_lower(j->f, &ld, &p)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "lowering: %s", hir_program_error(p));
    hir_program_free(p);
    return s;
  }
  if (rank == 0) hir_program_snprint(p, j->program, sizeof j->program);
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
  /* this rank's parts, in the tensors' logical axes: x's and W1's rows, W2's columns (a strided view) */
  in[0] = matrix(T / D, H, H);
  in[1] = matrix(F / D, H, H);
  in[2] = matrix(H, F / D, F);
  if ((s = to_backend(be, j->x + rank * (T / D) * H, sizeof(float) * (T / D) * H, &in[0].data)) != HIR_OK ||
      (s = to_backend(be, j->w1 + rank * (F / D) * H, sizeof(float) * (F / D) * H, &in[1].data)) != HIR_OK ||
      (s = to_backend(be, j->w2, sizeof j->w2, &in[2].data)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "inputs: %s", be ? be->error : "");
    goto done;
  }
  if (be && !be->host_memory) in[2].data = (char *)in[2].data + sizeof(float) * rank * (F / D);
  else in[2].data = j->w2 + rank * (F / D);
  if ((s = hir_run(ev, in, 3, out, 1)) != HIR_OK || (s = hir_evaluator_sync(ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "run: %s", hir_evaluator_error(ev));
    goto done;
  }
  if (be && !be->host_memory) be->download(be, got, out[0].data, sizeof got);
  else memcpy(got, out[0].data, sizeof got);
  for (i = 0; i < T / D * H; i++) {
    double e = fabs((double)got[i] - j->y_ref[rank * (T / D) * H + i]);
    if (!(e <= j->max_err[rank])) j->max_err[rank] = e; /* NaN counts */
  }
done:
  if (be && !be->host_memory) {
    in[2].data = (char *)in[2].data - sizeof(float) * rank * (F / D);
    for (i = 0; i < 3; i++)
      if (in[i].data) be->release(be, in[i].data);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  return s;
}

int main(void) {
  static job j;
  int mesh[D] = {0, 1, 2, 3}, i, k, n, t, failed = 0;
  unsigned seed = 11;
  float h[F];
  hir_tv *x, *w1, *w2, *y;
  hir_status s;

#ifdef HOSTIR_CUDA
  {
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu >= D) {
      if (hir_nccl_world_create(D, &j.nccl) == HIR_OK) {
        j.gpus = 1;
      } else {
        fprintf(stderr, "NCCL: %s; running on the CPU\n", hir_nccl_world_error(j.nccl));
        hir_nccl_world_free(j.nccl);
        j.nccl = NULL;
      }
    }
  }
#endif

  /* the MLP on whole tensors */
  j.f = hir_fusion_create();
  x = hir_input(j.f, HIR_F32, 2);
  w1 = hir_input(j.f, HIR_F32, 2);
  w2 = hir_input(j.f, HIR_F32, 2);
  y = hir_linear(j.f, hir_relu(j.f, hir_linear(j.f, x, w1, NULL)), w2, NULL);
  hir_output(j.f, y);
  /* its sharding: meshes on what the caller holds, one split per axis, DIDx on the outer parts */
  hir_set_mesh(x, D, mesh);
  hir_set_mesh(w1, D, mesh);
  hir_set_mesh(w2, D, mesh);
  hir_set_mesh(y, D, mesh);
  hir_split(x, 0, D, 1);  /* T: reaches y */
  hir_split(w1, 0, D, 1); /* F: reaches the hidden activation and W2's axis 1 */
  hir_parallelize(x, 0, HIR_DIDX);
  hir_parallelize(w1, 0, HIR_DIDX);
  hir_parallelize(w2, 1, HIR_DIDX);
  hir_parallelize(y, 0, HIR_DIDX);
  if (hir_fusion_error(j.f)[0]) {
    fprintf(stderr, "fusion: %s\n", hir_fusion_error(j.f));
    return 1;
  }

  for (i = 0; i < T * H; i++) j.x[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < F * H; i++) j.w1[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < H * F; i++) j.w2[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (t = 0; t < T; t++) {
    for (n = 0; n < F; n++) {
      double acc = 0;
      for (k = 0; k < H; k++) acc += (double)j.x[t * H + k] * j.w1[n * H + k];
      h[n] = acc > 0 ? (float)acc : 0.0f;
    }
    for (n = 0; n < H; n++) {
      double acc = 0;
      for (k = 0; k < F; k++) acc += (double)h[k] * j.w2[n * F + k];
      j.y_ref[t * H + n] = (float)acc;
    }
  }

  if (!j.gpus) j.world = hir_local_world_create(D);
  s = hir_spmd(D, run_rank, &j);
  for (i = 0; i < D; i++)
    if (j.error[i][0]) fprintf(stderr, "device %d: %s\n", i, j.error[i]);
  if (s == HIR_OK) {
    const char *at = j.program;
    printf("a sequence-parallel MLP on %d %s: y = relu(x W1^T) W2^T, x and y split on T, W1 and W2 on F;\n", D,
           j.gpus ? "GPUs (CUDA backend, NCCL)" : "in-process CPU ranks");
    printf("  the collectives of device 0's program:");
    while ((at = strstr(at, "(type=")) != NULL) { /* "Communication 16 (type=Allgather, ..." */
      at += 6;
      printf(" %.*s", (int)strcspn(at, ","), at);
    }
    printf("\n");
    for (i = 0; i < D; i++) {
      printf("  device %d (rows %d-%d of y): max |y - reference| = %.2e\n", i, i * (T / D), (i + 1) * (T / D) - 1, j.max_err[i]);
      failed |= !(j.max_err[i] < 1e-4);
    }
  }
  hir_local_world_free(j.world);
#ifdef HOSTIR_CUDA
  hir_nccl_world_free(j.nccl);
#endif
  hir_fusion_free(j.f);
  return s == HIR_OK && !failed ? 0 : 1;
}
