/* One process per GPU, started by a launcher:
       torchrun --nproc-per-node 4 --no-python build/launch_processes
       mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 build/launch_processes
       srun -n 4 build/launch_processes            (MASTER_ADDR set to the first node)
   Each process reads its rank from the launcher's environment, joins the
   NCCL world (rank 0 hands out the id over MASTER_ADDR:MASTER_PORT), lowers
   the AG+GEMM of examples/main.c for its own device and runs it. */
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#else
#include "../hostir.h"
#endif
#include <math.h>
#include <stdlib.h>

enum { M = 64, K = 48, N = 32, MAXD = 16 };

#ifndef HOSTIR_CUDA
int main(void) {
  fprintf(stderr, "launch_processes: build with CUDA (make finds it through CUDA_HOME or nvcc on PATH)\n");
  return 2;
}
#else
static float a[M * K], b[K * N], c[M * N];

int main(void) {
  hir_nccl_env env;
  hir_comm *comm = NULL;
  hir_backend *be = NULL;
  hir_fusion *f = hir_fusion_create();
  hir_tv *ta = hir_input(f, HIR_F32, 3), *tb = hir_input(f, HIR_F32, 2), *tc = hir_matmul(f, ta, tb);
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[2] = {{0}, {0}}, out[1] = {{0}};
  int mesh[MAXD], i, r, k, ok = 0;
  double worst = 0;
  char err[512];
  unsigned seed = 7;
  if (hir_nccl_env_read(&env, err, sizeof err) != HIR_OK) {
    fprintf(stderr, "launch_processes: %s\n", err);
    return 2;
  }
  if (env.size > MAXD || M % env.size) {
    fprintf(stderr, "launch_processes: %d processes; use a divisor of %d up to %d\n", env.size, M, MAXD);
    return 2;
  }
  if (hir_nccl_comm_create(&env, 60000, &comm) != HIR_OK) {
    fprintf(stderr, "rank %d: %s\n", env.rank, comm ? comm->error : "out of memory");
    hir_nccl_comm_free(comm);
    return 1;
  }
  for (i = 0; i < env.size; i++) mesh[i] = i;
  hir_output(f, tc); /* A [DIDx, M/D, K] x B [K, N] -> C [Stream, M/D, N] */
  hir_set_mesh(ta, env.size, mesh);
  hir_set_mesh(tb, env.size, mesh);
  hir_set_mesh(tc, env.size, mesh);
  hir_parallelize(ta, 0, HIR_DIDX);
  hir_parallelize(tc, 0, HIR_STREAM);
  ld.my_device = env.rank;
  be = hir_backend_cuda_create(env.gpu);
  ed.backend = be;
  ed.comm = comm;
  for (i = 0; i < M * K; i++) a[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < K * N; i++) b[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  in[0].dtype = in[1].dtype = HIR_F32;
  in[0].ndims = 3, in[0].sizes[0] = 1, in[0].sizes[1] = M / env.size, in[0].sizes[2] = K; /* this rank's rows */
  in[1].ndims = 2, in[1].sizes[0] = K, in[1].sizes[1] = N;
  if (!be || hir_lower(f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK ||
      be->alloc(be, sizeof(float) * (M / env.size) * K, &in[0].data) != HIR_OK ||
      be->alloc(be, sizeof b, &in[1].data) != HIR_OK ||
      be->upload(be, in[0].data, a + env.rank * (M / env.size) * K, sizeof(float) * (M / env.size) * K) != HIR_OK ||
      be->upload(be, in[1].data, b, sizeof b) != HIR_OK || hir_run(ev, in, 2, out, 1) != HIR_OK ||
      hir_evaluator_sync(ev) != HIR_OK || be->download(be, c, out[0].data, sizeof c) != HIR_OK) {
    const char *why = !be ? "no GPU"
                      : ev && hir_evaluator_error(ev)[0] ? hir_evaluator_error(ev)
                      : p && hir_program_error(p)[0] ? hir_program_error(p) : be->error;
    fprintf(stderr, "rank %d: %s\n", env.rank, why);
  } else {
    for (i = 0; i < M; i++) /* every rank ends with all of C */
      for (k = 0; k < N; k++) {
        double acc = 0;
        for (r = 0; r < K; r++) acc += (double)a[i * K + r] * b[r * N + k];
        if (!(fabs(acc - c[i * N + k]) <= worst)) worst = fabs(acc - c[i * N + k]);
      }
    ok = worst < 1e-4;
    printf("rank %d of %d (GPU %d): max |C - reference| = %.2e\n", env.rank, env.size, env.gpu, worst);
  }
  if (be) {
    if (in[0].data) be->release(be, in[0].data);
    if (in[1].data) be->release(be, in[1].data);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  hir_nccl_comm_free(comm);
  hir_fusion_free(f);
  return ok ? 0 : 1;
}
#endif
