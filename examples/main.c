/* The main example (`make run`): an allgather + matmul sharded over D
   devices. Each device holds a block of rows of A and all of B; C = A x B is
   computed chunk by chunk on streams, chunk i's matmul overlapping the
   transfer of chunk i+1. hostir lowers the fusion to each device's host
   program and runs the D programs: on D GPUs through CUDA and NCCL when the
   build found CUDA and GPUs are visible, else on D in-process ranks (CPU
   backend, local world). C is checked against a plain reference.
   `main --trace run.json` also writes the run's timeline (chrome://tracing,
   ui.perfetto.dev): a process per device, a track per stream. */
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#else
#include "../hostir.h"
#endif
#include <math.h>
#include <stdlib.h>

enum { MAXD = 4, M = 64, K = 48, N = 32 }; /* A [M, K] split in D blocks of M/D rows */

typedef struct job {
  int D, gpus;
  hir_fusion *f;
  hir_local_world *world;
#ifdef HOSTIR_CUDA
  hir_nccl_world *nccl;
#endif
  float a[M * K], b[K * N], c_ref[M * N];
  double max_err[MAXD];
  char error[MAXD][600];
  const char *trace;                   /* where to write the timeline, or NULL */
  hir_program *programs[MAXD];         /* kept for the timeline */
  hir_evaluator *evaluators[MAXD];
  hir_backend *backends[MAXD];
} job;

/* A host array as the backend's tensor (a device copy on a GPU). */
static hir_tensor tensor(hir_backend *be, float *host, int ndims, const int64_t *sizes) {
  hir_tensor t = {0};
  size_t bytes = sizeof(float);
  int i;
  t.dtype = HIR_F32;
  t.ndims = ndims;
  for (i = 0; i < ndims; i++) bytes *= (size_t)(t.sizes[i] = sizes[i]);
  t.data = host;
  if (be && !be->host_memory && (be->alloc(be, bytes, &t.data) != HIR_OK || be->upload(be, t.data, host, bytes) != HIR_OK))
    t.data = NULL;
  return t;
}

static hir_status run_rank(int rank, void *user) {
  job *j = (job *)user;
  hir_lower_desc ld = {0};
  hir_eval_desc ed = {0};
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2], out[1] = {{0}};
  hir_status s;
  hir_backend *be = NULL;
  int64_t sa[3] = {1, M / j->D, K}, sb[2] = {K, N};
  static float c_host[MAXD][M * N];
  float *c;
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
#ifdef HOSTIR_CUDA
  if (j->gpus) {
    be = hir_backend_cuda_create(rank);
    ed.comm = hir_nccl_world_comm(j->nccl, rank);
  }
#endif
  if (!j->gpus) ed.comm = hir_local_comm(j->world, rank);
  ed.backend = be; /* NULL: the CPU */
  if ((s = hir_evaluator_create(p, &ed, &ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "evaluator: %s", hir_evaluator_error(ev));
    goto done;
  }
  if (j->trace && (s = hir_evaluator_record_timeline(ev, 1)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "timeline: out of memory");
    goto done;
  }
  in[0] = tensor(be, j->a + rank * (M / j->D) * K, 3, sa); /* this device's rows of A: [1, M/D, K] */
  in[1] = tensor(be, j->b, 2, sb);                         /* all of B: [K, N] */
  if ((s = hir_run(ev, in, 2, out, 1)) != HIR_OK || (s = hir_evaluator_sync(ev)) != HIR_OK) {
    snprintf(j->error[rank], sizeof j->error[rank], "run: %s", hir_evaluator_error(ev));
    goto done;
  }
  c = (float *)out[0].data;
  if (be && !be->host_memory) { /* every device ends with all of C: [D, M/D, N] */
    c = c_host[rank];
    be->download(be, c, out[0].data, sizeof c_host[rank]);
  }
  for (i = 0; i < M * N; i++) {
    double e = fabs((double)c[i] - j->c_ref[i]);
    if (e > j->max_err[rank]) j->max_err[rank] = e;
  }
  if (be && !be->host_memory) {
    be->release(be, in[0].data);
    be->release(be, in[1].data);
  }
done:
  if (s == HIR_OK && j->trace) { /* main writes the timeline, then frees them */
    j->evaluators[rank] = ev;
    j->programs[rank] = p;
    j->backends[rank] = be;
    return s;
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  return s;
}

int main(int argc, char **argv) {
  static job j;
  int mesh[MAXD] = {0, 1, 2, 3}, i, r, k;
  unsigned seed = 7;
  hir_tv *a, *b, *c;
  hir_status s;
  const char *why = "built without CUDA";

  j.D = MAXD;
  if (argc == 3 && !strcmp(argv[1], "--trace")) {
    j.trace = argv[2];
  } else if (argc != 1) {
    fprintf(stderr, "usage: %s [--trace timeline.json]\n", argv[0]);
    return 2;
  }
#ifdef HOSTIR_CUDA
  {
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
      why = "no two GPUs visible";
    } else {
      j.D = ngpu < MAXD ? ngpu : MAXD;
      if (hir_nccl_world_create(j.D, &j.nccl) == HIR_OK) {
        j.gpus = 1;
      } else {
        fprintf(stderr, "NCCL: %s; running on the CPU\n", hir_nccl_world_error(j.nccl));
        hir_nccl_world_free(j.nccl);
        j.nccl = NULL;
        j.D = MAXD;
        why = "NCCL could not start";
      }
    }
  }
#endif

  /* The fusion: A [DIDx(D), M/D, K] x B [K, N] -> C [Stream(D), M/D, N]. */
  j.f = hir_fusion_create();
  a = hir_input(j.f, HIR_F32, 3);
  b = hir_input(j.f, HIR_F32, 2);
  c = hir_matmul(j.f, a, b);
  hir_output(j.f, c);
  hir_set_mesh(a, j.D, mesh);
  hir_set_mesh(b, j.D, mesh);
  hir_set_mesh(c, j.D, mesh);
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

  if (!j.gpus) j.world = hir_local_world_create(j.D);
  s = hir_spmd(j.D, run_rank, &j);
  for (r = 0; r < j.D; r++)
    if (j.error[r][0]) fprintf(stderr, "device %d: %s\n", r, j.error[r]);
  if (s == HIR_OK) {
    if (j.gpus)
      printf("\nRan on %d GPUs (CUDA backend, NCCL, a thread per GPU). C = A x B on every device;\n", j.D);
    else
      printf("\nRan on %d in-process ranks (CPU backend, local world; %s). C = A x B on every device;\n", j.D, why);
    for (r = 0; r < j.D; r++) printf("  device %d: max |C - reference| = %.2e\n", r, j.max_err[r]);
  }
  if (s == HIR_OK && j.trace) {
    FILE *fp = fopen(j.trace, "w");
    if (!fp || hir_timeline_write(j.evaluators, j.D, fp) != HIR_OK) {
      fprintf(stderr, "cannot write the timeline to %s\n", j.trace);
      s = HIR_ERR_INVALID;
    } else {
      printf("The timeline: %s (open it in ui.perfetto.dev or chrome://tracing)\n", j.trace);
    }
    if (fp) fclose(fp);
  }
  for (r = 0; r < j.D; r++) { /* kept for the timeline */
    hir_evaluator_free(j.evaluators[r]);
    hir_program_free(j.programs[r]);
    hir_backend_free(j.backends[r]);
  }
  hir_local_world_free(j.world);
#ifdef HOSTIR_CUDA
  hir_nccl_world_free(j.nccl);
#endif
  hir_fusion_free(j.f);
  return s == HIR_OK ? 0 : 1;
}
