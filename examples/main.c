/* The main example (`make run`): an allgather + matmul sharded over 4
   devices. Each device holds a block of rows of A and all of B; C = A x B is
   computed chunk by chunk on streams. hostir lowers the fusion to each
   device's host program and runs the 4 programs on 4 in-process ranks (CPU
   backend, local world), then checks C against a plain reference. */
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include <math.h>
#include <stdlib.h>

enum { D = 4, M = 64, K = 48, N = 32 }; /* A [M, K] split in D blocks of M/D rows */

typedef struct job {
  hir_fusion *f;
  hir_local_world *world;
  float a[M * K], b[K * N], c_ref[M * N];
  double max_err[D];
  char error[D][600];
} job;

static hir_status run_rank(int rank, void *user) {
  job *j = (job *)user;
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2] = {{0}}, out[1] = {{0}};
  hir_status s;
  int i;
  ld.my_device = rank;
  if ((s = hir_lower(j->f, &ld, &p)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "lowering: %s", hir_program_error(p));
    hir_program_free(p);
    return s;
  }
  if (rank == 0) {
    printf("The host program of device 0:\n");
    hir_program_print(p, stdout);
  }
  ed.comm = hir_local_comm(j->world, rank);
  if ((s = hir_evaluator_create(p, &ed, &ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "evaluator: %s", hir_evaluator_error(ev));
    goto done;
  }
  /* this device's shard of A: [1, M/D, K]; B whole: [K, N] */
  in[0].data = j->a + rank * (M / D) * K;
  in[0].dtype = HIR_F32;
  in[0].ndims = 3;
  in[0].sizes[0] = 1;
  in[0].sizes[1] = M / D;
  in[0].sizes[2] = K;
  in[1].data = j->b;
  in[1].dtype = HIR_F32;
  in[1].ndims = 2;
  in[1].sizes[0] = K;
  in[1].sizes[1] = N;
  if ((s = hir_run(ev, in, 2, out, 1)) != HIR_OK || (s = hir_evaluator_sync(ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "run: %s", hir_evaluator_error(ev));
    goto done;
  }
  for (i = 0; i < M * N; i++) { /* every device ends with all of C: [D, M/D, N] */
    double e = fabs((double)((float *)out[0].data)[i] - j->c_ref[i]);
    if (e > j->max_err[rank]) j->max_err[rank] = e;
  }
done:
  hir_evaluator_free(ev);
  hir_program_free(p);
  return s;
}

int main(void) {
  static job j;
  int mesh[D] = {0, 1, 2, 3}, i, r, k;
  unsigned seed = 7;
  hir_tv *a, *b, *c;
  hir_status s;

  /* The fusion: A [DIDx(D), M/D, K] x B [K, N] -> C [Stream(D), M/D, N]. */
  j.f = hir_fusion_create();
  a = hir_input(j.f, HIR_F32, 3);
  b = hir_input(j.f, HIR_F32, 2);
  c = hir_matmul(j.f, a, b);
  hir_output(j.f, c);
  hir_set_mesh(a, D, mesh);
  hir_set_mesh(b, D, mesh);
  hir_set_mesh(c, D, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_parallelize(c, 0, HIR_STREAM);
  if (hir_fusion_error(j.f)[0]) {
    fprintf(stderr, "fusion: %s\n", hir_fusion_error(j.f));
    return 1;
  }
  printf("The fusion:\n\n");
  hir_fusion_print(j.f, stdout);
  printf("\n");

  for (i = 0; i < M * K; i++) j.a[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < K * N; i++) j.b[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8 & 0xffff) / 32768.0f - 1.0f;
  for (i = 0; i < M; i++)
    for (k = 0; k < N; k++) {
      double acc = 0;
      for (r = 0; r < K; r++) acc += (double)j.a[i * K + r] * j.b[r * N + k];
      j.c_ref[i * N + k] = (float)acc;
    }

  j.world = hir_local_world_create(D);
  s = hir_spmd(D, run_rank, &j);
  for (r = 0; r < D; r++)
    if (j.error[r][0]) fprintf(stderr, "device %d: %s\n", r, j.error[r]);
  if (s == HIR_OK) {
    printf("\nRan on %d in-process ranks (CPU backend, local world). C = A x B on every device;\n", D);
    for (r = 0; r < D; r++) printf("  device %d: max |C - reference| = %.2e\n", r, j.max_err[r]);
  }
  hir_local_world_free(j.world);
  hir_fusion_free(j.f);
  return s == HIR_OK ? 0 : 1;
}
