/* Overlap of communication and GEMM: AllGather+GEMM, GEMM+ReduceScatter and
   GEMM+AllReduce (the row-parallel linear without sequence parallelism: the
   collective pipeline, serial and the tuner only), each built as a hostir
   fusion and run through every applicable pipeline on every visible GPU (one
   thread per GPU, NCCL), or on the CPU backend and the local world when
   there is no GPU:

     serial        the collective, then one GEMM (no Stream axis)
     collective    the A rows split into `chunks` Stream chunks, one
                   collective and one GEMM per chunk (nvFuser's AG_matmul and
                   matmul_RS_through_bcast)
     collective on N  GEMM+RS: the weight's columns cut into S Stream
                   chunks instead (--column-parts S; B laid out [S, K/D, N/S],
                   the output [S, M/D, N/S]), a GEMM and a reduce-scatter per
                   chunk: each GEMM reads its part of the weight only, where
                   chunks of rows each read all of it
     p2p as collectives  the p2p fusion lowered as the collective pipeline
                   (HIR_SCHEDULE_COLLECTIVE): the same chunks, the p2p
                   fusion's layout, strided parts staged
     p2p linear    a chunk per peer, send/recv instead of collectives,
                   each chunk cut into `parts` (stream.parts)
     p2p ring      the same, each rank starting with its ring neighbour
                   (on GPUs both p2p again with send/recv on the copy
                   engines: hir_nccl_world_set_copy_engine)
     bounded       the p2p ring with bounded buffers (numberOfStreams slices
                   of the gathered tensor instead of D)
     p2p, one GEMM the exchange as send/recv (AllgatherP2p), then one GEMM of
                   every row (AG: the p2p fusion with stream.gather_first),
                   or one GEMM, then the exchange (RS: a Stream axis on a
                   set): where each chunk's GEMM would read the whole weight
                   again (decode-size M), nothing split
     p2p ring, split weight  AG+GEMM: the p2p ring whose GEMM computes the
                   first N/S columns (--column-parts S; stream.experimental.column_parts:
                   the local rows' part while the exchange runs), then the
                   other parts after it, one GEMM each of every row
     ..., logical  serial, the p2p ring (AG, RS) and the collective pipeline
                   (AR) again, the fusion written on logical shapes as a
                   user of tensor parallelism writes it: C = A [M, K] x
                   B [K, N], sharded by hir_split (build_logical); the same
                   bytes on each rank as the explicit forms
     automatic     the p2p fusion through hir_tuner: serial, the p2p
                   schedules and the p2p fusion as collectives measured on
                   every rank, the fastest agreed
                   (--memory-limit MiB caps a candidate's buffers); the
                   tuning's own time is printed beside it

   beside the collective alone and the GEMM alone (their max is the floor),
   all in one run. Per pipeline: the median time, its ratio to the floor, the
   overlap efficiency E = (serial - T) / min(comm, GEMM), the buffers the
   evaluator holds (peak), and the largest difference from the serial result
   relative to its largest value. Times are wall clock on the host: ranks
   meet and start together (see barrier), run, and hir_evaluator_sync; an
   iteration takes its slowest rank, and the table says how far apart the
   ranks began. bf16 inputs from a fixed-seed generator.

     build/bench-overlap [--iters 10] [--warmup 3] [--streams 2,4] [--chunks 4,8]
                         [--parts 1,2,4] [--column-parts 2] [--trace DIR] [--memory-limit MiB] [--pause MS] [--rematch 3] [--serve CHOICE]
                         [--graph [2]] [--hang-s 180]
                         [--decode] [--ranks N]
                         [ag M K N] [rs M K N] [ar M K N] ...
     torchrun --nproc-per-node 2 --no-python build/bench-overlap --processes ...

   --hang-s S (default 180 on GPUs, 0: never): a row that has run S seconds
   ends the run with exit status 3, naming the row (a hang inside CUDA's
   driver is past hostir's deadlines, bench/NOTES.md section 43).
   --pause MS: every row's runs start after MS idle (the automatic row's
   after its tuning too): whether a GPU's clocks after sustained load
   decide a row (bench/RESULTS.md).
   --rematch N (default 3; 0: none): after the table, the best row and the
   automatic row run again in turns, N rounds, each round a fresh row (the
   automatic one tuned anew), and their medians are compared. The best of
   many rows measured once is partly the luckiest; the rematch times both
   alike, and prints each round's times and what its tuning chose. A third
   run each round is the automatic row as a server runs it: a fresh tuner
   loads the plan that round's tuning saved (hir_tuner_load) and runs with no
   tuning before it (a tuning's load slows the GEMM-bound runs right after it
   for a second or two: bench/NOTES.md sections 38-39).
   --serve CHOICE: that run's plan names CHOICE (a saved plan's choice, e.g.
   "linear parts 1 streams 2 bounded 0 nccl 0 eager 0") instead of what the
   tuning chose: the serving path against the table's row of one schedule.
   --graph: the GEMM alone and every pipeline also as a CUDA graph
   (hir_eval_desc.graph), rows marked [graph] (the floors take the GEMM's
   faster mode), and the tuner in graph mode (its candidates also
   timed with send/recv on NCCL, captured); --graph 2: graph mode 2 (the
   arguments copied in and out of the evaluator's own, rows marked [graph
   2]: what the copies cost). --decode: the decode-size shapes, M = 256, 1024,
   4096 tokens, K = 8192, N = 4096, AG+GEMM, GEMM+RS and GEMM+AR.
   --processes: one process per GPU (torchrun, mpirun, srun) instead of a
   thread per GPU; the same table, rank 0 prints it. --ranks N: a thread for
   each of the first N GPUs (default: every visible one, at most 8), or N
   in-process CPU ranks where fewer than 2 GPUs are visible (default 4).
   Under each "alone" row, on GPUs: the same collective called on the
   communicator directly (no program, no evaluator). The physical floor is
   max(GEMM alone, the bytes each rank receives / the peer-copy bandwidth),
   the bandwidth measured first in the same run: every rank sends 256 MiB
   to the next through the communicator's copy engines.
   Default shapes: three AG+GEMM and three GEMM+RS on GPUs (docs/PERFORMANCE.md),
   small ones on the CPU. --trace: after its timed runs, each pipeline runs
   once more recording a timeline, written
   to DIR/<ag|rs>_M_K_N_<pipeline>.json (tools/timeline_svg.py draws them). */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#ifdef HOSTIR_CUDA
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../hostir_nccl.h"
#include <cuda_runtime.h>
#else
#include "../hostir.h"
#endif
#include "bench.h"
#include <math.h>
#include <pthread.h>

enum { MAXR = 8, MAXIT = 100, MAXCFG = 128, MAXREMATCH = 9 };

typedef enum { AG, RS, AR } pattern;
static const char *const pattern_names[] = {"AllGather+GEMM", "GEMM+ReduceScatter", "GEMM+AllReduce"};
static const char *const pattern_keys[] = {"ag", "rs", "ar"};
typedef enum {
  COMM_ALONE, GEMM_ALONE, SERIAL, COLLECTIVE, COLLECTIVE_N, P2P_AS_COLLECTIVES, P2P_LINEAR, P2P_RING, P2P_ONE_GEMM,
  P2P_SPLIT_WEIGHT, AUTO
} pipeline;
static const char *pipeline_names[] = {"comm alone", "GEMM alone", "serial", "collective", "collective on N",
                                       "p2p as collectives", "p2p linear", "p2p ring", "p2p, one GEMM",
                                       "p2p ring, split weight", "automatic (tuned"};

typedef struct config {
  pipeline pipe;
  int chunks, streams, copy_engine; /* copy_engine: p2p sends and receives as peer copies (GPUs) */
  int parts;                        /* p2p: each peer's chunk cut into this many */
  int bounded;                      /* p2p: bounded buffers (numberOfStreams slices of the gathered tensor) */
  int graph;                        /* hir_eval_desc.graph: runs captured into a CUDA graph and replayed */
  int logical;                      /* the fusion written on logical shapes, sharded by hir_split (build_logical) */
} config;

typedef struct shape {
  pattern pat;
  int64_t M, K, N;
} shape;

typedef struct result {
  double ms, err;
  double skew_us;               /* the median over iterations of the spread of the ranks' starts after the barrier */
  size_t mem;
  int ok;
  char msg[512];
} result;

typedef struct bench {
  int D, gpu, iters, warmup;
  int procs, me, device;        /* --processes: this process runs rank `me` only, on GPU `device` */
  hir_comm *pcomm;              /* its communicator */
  void *pteam, *pstream, *pbuf; /* the world team, a stream and device memory for the ranks' meetings */
  double peer_gbs;              /* peer-copy bandwidth, GB/s (0: not measured) */
  shape sh;
  config cfg;
  hir_fusion *f;
  /* host data of each rank: A in the serial/p2p layout, B, the serial output */
  uint16_t *a[MAXR], *b[MAXR], *ref[MAXR];
  int64_t ref_numel;
  char plan[4096];              /* rank 0's tuned choice (hir_program_plan) */
  double tune_ms[MAXR];         /* how long each rank's tuning took */
  size_t memory_limit;          /* --memory-limit: the tuner's cap on a candidate's buffers */
  int pause_ms;                 /* --pause: idle before each row's runs (and after tuning), every row from a rested GPU */
  int rematch;                  /* --rematch: rounds of the best row and the automatic one in turns, after the table */
  FILE *plan_file[MAXR];        /* the rematch: each rank's plan, saved by the automatic row's tuning */
  int from_plan;                /* the rematch's third run: the automatic row from that plan, no tuning (as a server) */
  const char *serve;            /* --serve: the choice that plan names instead of the tuning's */
  int graphs;                   /* --graph: every pipeline also as a CUDA graph (in this mode of hir_eval_desc.graph) */
  const char *trace_dir;        /* --trace */
  int hang_s;                   /* --hang-s: a row running longer ends the run, named (0: never) */
  unsigned long rows_begun;     /* the watch's view of progress (mu) */
  char row[160];                /* the row running now (mu) */
  hir_evaluator *trace_ev[MAXR];
  double ms[MAXR][MAXIT];
  double start[MAXR][MAXIT];    /* when each rank's timed run began (CLOCK_MONOTONIC, one clock for the host's processes) */
  size_t mem[MAXR];
  double err[MAXR];
  char msg[MAXR][512];
  hir_local_world *local;
#ifdef HOSTIR_CUDA
  hir_nccl_world *nccl;
#endif
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived, generation;
} bench;

typedef struct rank_record { /* what a rank reports after a pipeline, gathered to every rank (processes) */
  double ms[MAXIT], start[MAXIT], err, tune_ms;
  size_t mem;
  char msg[512];
} rank_record;

#ifdef HOSTIR_CUDA
/* Processes: the ranks meet through the communicator itself (an allgather
   of `bytes` from each into `all`, on device memory). */
static int meet(bench *B, const void *mine, void *all, size_t bytes) {
  char *dev = (char *)B->pbuf;
  if (cudaMemcpy(dev, mine, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      B->pcomm->allgather(B->pcomm, B->pteam, dev, dev + bytes, bytes, B->pstream) != HIR_OK ||
      cudaStreamSynchronize((cudaStream_t)B->pstream) != cudaSuccess ||
      cudaMemcpy(all, dev + bytes, bytes * (size_t)B->D, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "bench-overlap: rank %d: the ranks could not meet: %s\n", B->me, B->pcomm->error);
    fflush(stdout);
    fflush(stderr);
    _exit(1); /* at once: after exit(1) here the process segfaulted in its teardown (bench/NOTES.md section 40) */
  }
  return 1;
}
#endif

/* The ranks meet before each timed run, and start together: a rank that
   starts early waits for the last inside the exchange, and its time carries
   the difference (the table prints how far apart the ranks began).
   Processes meet through the communicator and then wait for one moment,
   0.3 ms after the last arrival on the host's monotonic clock (at most 2
   ms: another host's clock is not ours). Threads on GPUs spin a while
   before sleeping, as one woken from a condition variable starts later
   than the last to arrive; CPU ranks sleep at once, as they compute on the
   cores a spin would take. */
static void barrier(bench *B) {
  int gen;
  double until;
#ifdef HOSTIR_CUDA
  if (B->procs) {
    double mine = now_ms(), all[MAXR], start = mine, cap;
    int i;
    meet(B, &mine, all, sizeof mine);
    for (i = 0; i < B->D; i++) start = all[i] > start ? all[i] : start;
    for (start += 0.3, cap = now_ms() + 2; now_ms() < start && now_ms() < cap;) {
    }
    return;
  }
#endif
  pthread_mutex_lock(&B->mu);
  gen = B->generation;
  if (++B->arrived == B->D) {
    B->arrived = 0;
    __atomic_store_n(&B->generation, gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&B->cv);
    pthread_mutex_unlock(&B->mu);
    return;
  }
  pthread_mutex_unlock(&B->mu);
  for (until = now_ms() + (B->gpu ? 20 : 0); __atomic_load_n(&B->generation, __ATOMIC_ACQUIRE) == gen && now_ms() < until;) {
  }
  pthread_mutex_lock(&B->mu);
  while (__atomic_load_n(&B->generation, __ATOMIC_ACQUIRE) == gen) pthread_cond_wait(&B->cv, &B->mu);
  pthread_mutex_unlock(&B->mu);
}

/* Every rank of this process: all of them as threads, or the one of a process. */
static hir_status run_ranks(bench *B, hir_status (*fn)(int rank, void *user)) {
  return B->procs ? fn(B->me, B) : hir_spmd(B->D, fn, B);
}

/* ---- the fusions ---- */

static const int mesh_iota[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};
static void mesh_all(hir_tv **t, int n, int D) {
  int i;
  for (i = 0; i < n; i++) hir_set_mesh(t[i], D, mesh_iota);
}

/* One device's GEMM: [rows, k] x [k, N]. */
static hir_fusion *build_gemm(void) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_BF16, 2), *b = hir_input(f, HIR_BF16, 2);
  hir_output(f, hir_matmul(f, a, b));
  return f;
}

/* AG+GEMM. m = M/D rows per rank. comm alone: A [DIDx D, m, K] gathered.
   serial: matmul(A [DIDx D, m, K], B [K, N]) replicated. collective: A
   [Stream S, DIDx D, m/S, K] (nvFuser's AG_matmul). p2p: A [DIDx D, m, K],
   the output's D axis on Stream (AG_matmul_P2p; "p2p, one GEMM" lowers it
   with stream.gather_first). */
static hir_fusion *build_ag(pipeline pipe, int D) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *t[3];
  if (pipe == COMM_ALONE) {
    t[0] = hir_input(f, HIR_BF16, 3);
    t[1] = hir_set(f, t[0]);
    hir_output(f, t[1]);
    mesh_all(t, 2, D);
    hir_parallelize(t[0], 0, HIR_DIDX);
    return f;
  }
  t[0] = hir_input(f, HIR_BF16, pipe == COLLECTIVE ? 4 : 3);
  t[1] = hir_input(f, HIR_BF16, 2);
  t[2] = hir_matmul(f, t[0], t[1]);
  hir_output(f, t[2]);
  mesh_all(t, 3, D);
  hir_parallelize(t[0], pipe == COLLECTIVE ? 1 : 0, HIR_DIDX);
  if (pipe != SERIAL) hir_parallelize(t[2], 0, HIR_STREAM);
  return f;
}

/* GEMM+RS. A rank holds A [M, K/D] and B [K/D, N]; the output rows are
   scattered, m = M/D to a rank. comm alone: sum(P [DIDx D, D, m, N], {0})
   scattered on axis 1. serial and p2p: A [DIDx D, D, m, K/D] x B [DIDx D,
   K/D, N] broadcast on axis 1, summed over axis 0, scattered on axis 1; p2p
   puts the product's axis 1 on Stream. collective: A [Stream S, DIDx D, D,
   m/S, K/D] (nvFuser's matmul_RS_through_bcast). */
static hir_fusion *build_rs(pipeline pipe, int D) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *t[5];
  int axis0 = 0, axis1 = 1;
  if (pipe == COMM_ALONE) {
    t[0] = hir_input(f, HIR_BF16, 4);
    t[1] = hir_sum(f, t[0], 1, &axis0);
    hir_output(f, t[1]);
    mesh_all(t, 2, D);
    hir_parallelize(t[0], 0, HIR_DIDX);
    hir_parallelize(t[1], 1, HIR_DIDX);
    return f;
  }
  if (pipe == COLLECTIVE_N) { /* A [DIDx D, D, m, K/D] x B [DIDx D, S, K/D, N/S], both broadcast to 5 axes */
    int flags_a[5] = {0, 1, 0, 0, 0}, flags_b[5] = {0, 0, 1, 0, 0};
    t[0] = hir_input(f, HIR_BF16, 4);
    t[1] = hir_input(f, HIR_BF16, 4);
    t[2] = hir_matmul(f, hir_broadcast(f, t[0], 5, flags_a), hir_broadcast(f, t[1], 5, flags_b)); /* [D, S, D, m, N/S] */
    t[3] = hir_sum(f, t[2], 1, &axis0);
    hir_output(f, t[3]);
    hir_set_mesh(t[0], D, mesh_iota), hir_set_mesh(t[1], D, mesh_iota), hir_set_mesh(t[3], D, mesh_iota);
    hir_parallelize(t[0], 0, HIR_DIDX);
    hir_parallelize(t[1], 0, HIR_DIDX);
    hir_parallelize(t[2], 1, HIR_STREAM);
    hir_parallelize(t[3], 1, HIR_STREAM);
    hir_parallelize(t[3], 2, HIR_DIDX);
    return f;
  }
  if (pipe == COLLECTIVE) {
    int flags[5] = {1, 0, 1, 0, 0};
    t[0] = hir_input(f, HIR_BF16, 5);
    t[1] = hir_input(f, HIR_BF16, 3);
    t[2] = hir_broadcast(f, t[1], 5, flags);
    t[3] = hir_matmul(f, t[0], t[2]);
    t[4] = hir_sum(f, t[3], 1, &axis1);
    hir_output(f, t[4]);
    mesh_all(t, 5, D);
    hir_parallelize(t[0], 1, HIR_DIDX);
    hir_parallelize(t[1], 0, HIR_DIDX);
    hir_parallelize(t[2], 1, HIR_DIDX);
    hir_parallelize(t[3], 0, HIR_STREAM);
    hir_parallelize(t[3], 1, HIR_DIDX);
    hir_parallelize(t[4], 0, HIR_STREAM);
    hir_parallelize(t[4], 2, HIR_DIDX);
  } else {
    int flags[4] = {0, 1, 0, 0};
    t[0] = hir_input(f, HIR_BF16, 4);
    t[1] = hir_input(f, HIR_BF16, 3);
    t[2] = hir_broadcast(f, t[1], 4, flags);
    t[3] = hir_matmul(f, t[0], t[2]);
    if (pipe == P2P_ONE_GEMM) { /* one GEMM, then its partials sent by send/recv (a Stream axis on a set) */
      t[3] = hir_set(f, t[3]);
      mesh_all(&t[3], 1, D);
      hir_parallelize(t[3], 0, HIR_DIDX);
    }
    t[4] = hir_sum(f, t[3], 1, &axis0);
    hir_output(f, t[4]);
    hir_tv *meshed[3];
    meshed[0] = t[0], meshed[1] = t[1], meshed[2] = t[4];
    mesh_all(meshed, 3, D); /* the product takes its sharding from them */
    hir_parallelize(t[0], 0, HIR_DIDX);
    hir_parallelize(t[1], 0, HIR_DIDX);
    if (pipe != SERIAL) hir_parallelize(t[3], 1, HIR_STREAM);
    hir_parallelize(t[4], 1, HIR_DIDX);
  }
  return f;
}

/* GEMM+AR, the row-parallel linear without sequence parallelism: a rank
   holds A [M, K/D] and B [K/D, N], every rank gets the summed [M, N]. comm
   alone: sum(P [DIDx D, M, N], {0}) replicated (an all-reduce). serial:
   A [DIDx D, M, K/D] x B [DIDx D, K/D, N] summed over axis 0. collective
   (and the tuner's fusion): A [Stream S, DIDx D, M/S, K/D], the all-reduce
   of chunk s beside the GEMM of chunk s + 1. */
static hir_fusion *build_ar(pipeline pipe, int D) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *t[5];
  int axis0 = 0, axis1 = 1;
  if (pipe == COMM_ALONE) {
    t[0] = hir_input(f, HIR_BF16, 3);
    t[1] = hir_sum(f, t[0], 1, &axis0);
    hir_output(f, t[1]);
    mesh_all(t, 2, D);
    hir_parallelize(t[0], 0, HIR_DIDX);
    return f;
  }
  if (pipe == SERIAL) {
    t[0] = hir_input(f, HIR_BF16, 3);
    t[1] = hir_input(f, HIR_BF16, 3);
    t[2] = hir_matmul(f, t[0], t[1]); /* [D, M, N] */
    t[3] = hir_sum(f, t[2], 1, &axis0);
    hir_output(f, t[3]);
    mesh_all(t, 4, D);
    hir_parallelize(t[0], 0, HIR_DIDX);
    hir_parallelize(t[1], 0, HIR_DIDX);
    hir_parallelize(t[2], 0, HIR_DIDX);
    return f;
  }
  {
    int flags[4] = {1, 0, 0, 0};
    t[0] = hir_input(f, HIR_BF16, 4);
    t[1] = hir_input(f, HIR_BF16, 3);
    t[2] = hir_broadcast(f, t[1], 4, flags);
    t[3] = hir_matmul(f, t[0], t[2]); /* [S, D, M/S, N] */
    t[4] = hir_sum(f, t[3], 1, &axis1);
    hir_output(f, t[4]);
    mesh_all(t, 5, D);
    hir_parallelize(t[0], 1, HIR_DIDX);
    hir_parallelize(t[1], 0, HIR_DIDX);
    hir_parallelize(t[2], 1, HIR_DIDX);
    hir_parallelize(t[3], 0, HIR_STREAM);
    hir_parallelize(t[3], 1, HIR_DIDX);
    hir_parallelize(t[4], 0, HIR_STREAM);
  }
  return f;
}

/* The three patterns on logical shapes, as a user writes tensor
   parallelism: C = A [M, K] x B [K, N], one split per axis. AG: A's M split
   by D and sharded, B whole, C whole (p2p: C's M parts on Stream). RS: K
   split by D and sharded on A and B, C's M split by D and sharded (p2p: A's
   M parts on Stream, the reduce-scatter pipeline). AR: K split and sharded,
   C whole (collective: C's M split into `chunks` parts on Stream, an
   all-reduce per chunk). Each rank's tensors hold the same bytes as the
   explicit forms' (host_inputs). */
static hir_fusion *build_logical(pattern pat, pipeline pipe, int D, int chunks) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *t[3];
  t[0] = hir_input(f, HIR_BF16, 2);
  t[1] = hir_input(f, HIR_BF16, 2);
  t[2] = hir_matmul(f, t[0], t[1]);
  hir_output(f, t[2]);
  mesh_all(t, 3, D);
  if (pat == AG) {
    hir_split(t[0], 0, D, 1);
    hir_parallelize(t[0], 0, HIR_DIDX);
    if (pipe != SERIAL) hir_parallelize(t[2], 0, HIR_STREAM);
    return f;
  }
  hir_split(t[0], 1, D, 1);
  hir_parallelize(t[0], 1, HIR_DIDX);
  hir_parallelize(t[1], 0, HIR_DIDX);
  if (pat == RS) {
    hir_split(t[2], 0, D, 1);
    hir_parallelize(t[2], 0, HIR_DIDX);
    if (pipe != SERIAL) hir_parallelize(t[0], 0, HIR_STREAM);
  } else if (pipe != SERIAL) {
    hir_split(t[2], 0, chunks, 1);
    hir_parallelize(t[2], 0, HIR_STREAM);
  }
  return f;
}

/* The tuner's choice in its plan ("tuned on N ranks in T ms: CHOICE (the
   slowest rank's ...)"), or the plan's start where it reads otherwise. */
static void plan_choice(const char *plan, char *out, size_t cap) {
  const char *from = strstr(plan, " ms: "), *saved = strstr(plan, "from a saved plan: "), *to;
  from = from ? from + 5 : saved ? saved + 19 : plan;
  to = strstr(from, saved ? " (not measured" : " (the slowest");
  snprintf(out, cap, "%.*s", (int)(to ? to - from : (ptrdiff_t)strlen(from)), from);
}

/* ---- data ---- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint16_t *random_bf16(int64_t n, uint64_t seed) {
  uint16_t *x = (uint16_t *)malloc((size_t)n * 2);
  int64_t i;
  if (!x) return NULL;
  for (i = 0; i < n; i++) x[i] = hir_float_to_bf16((float)((double)(rng_next(&seed) >> 11) * 0x1.0p-52 - 1.0));
  return x;
}

static int64_t a_numel(const shape *s, int D) { return s->pat == AG ? s->M / D * s->K : s->M * (s->K / D); }
static int64_t b_numel(const shape *s, int D) { return s->pat == AG ? s->K * s->N : s->K / D * s->N; }

static hir_status gen_rank(int rank, void *user) {
  bench *B = (bench *)user;
  B->a[rank] = random_bf16(a_numel(&B->sh, B->D), 1000 + (uint64_t)rank);
  B->b[rank] = random_bf16(b_numel(&B->sh, B->D), B->sh.pat == AG ? 7 : 2000 + (uint64_t)rank); /* AG: B replicated */
  return B->a[rank] && B->b[rank] ? HIR_OK : HIR_ERR_NOMEM;
}

static hir_tensor tensor(void *data, int ndims, const int64_t *sizes) {
  hir_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = HIR_BF16;
  t.ndims = ndims;
  memcpy(t.sizes, sizes, (size_t)ndims * sizeof *sizes);
  return t;
}

static int64_t numel(const hir_tensor *t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->ndims; i++) n *= t->sizes[i];
  return n;
}

/* The inputs of `rank` for the current pipeline, in host memory (*owned is
   what to free). A's rows, or B's columns, are permuted where the pipeline
   splits them. */
static int host_inputs(bench *B, int rank, hir_tensor in[2], void **owned) {
  const shape *s = &B->sh;
  int64_t D = B->D, m = s->M / D, S = B->cfg.chunks, M = s->M, K = s->K, N = s->N, kd = K / D;
  *owned = NULL;
  if (B->cfg.logical) { /* this rank's parts in the logical axes: the explicit forms' bytes */
    in[0] = tensor(B->a[rank], 2, s->pat == AG ? (int64_t[]){m, K} : (int64_t[]){M, kd});
    in[1] = tensor(B->b[rank], 2, s->pat == AG ? (int64_t[]){K, N} : (int64_t[]){kd, N});
    return 2;
  }
  if (s->pat == AG) {
    switch (B->cfg.pipe) {
    case COMM_ALONE: in[0] = tensor(B->a[rank], 3, (int64_t[]){1, m, K}); return 1;
    case GEMM_ALONE: /* every rank's rows: this rank's D times (the time does not depend on the values) */
      in[0] = tensor(NULL, 2, (int64_t[]){M, K});
      in[1] = tensor(B->b[rank], 2, (int64_t[]){K, N});
      return 2;
    case COLLECTIVE: in[0] = tensor(B->a[rank], 4, (int64_t[]){S, 1, m / S, K}); break;
    default: in[0] = tensor(B->a[rank], 3, (int64_t[]){1, m, K}); break;
    }
    in[1] = tensor(B->b[rank], 2, (int64_t[]){K, N});
    return 2;
  }
  if (s->pat == AR) {
    switch (B->cfg.pipe) {
    case COMM_ALONE: in[0] = tensor(NULL, 3, (int64_t[]){1, M, N}); return 1; /* the partial product: any values */
    case GEMM_ALONE: in[0] = tensor(B->a[rank], 2, (int64_t[]){M, kd}); break;
    case SERIAL: in[0] = tensor(B->a[rank], 3, (int64_t[]){1, M, kd}); break;
    default: in[0] = tensor(B->a[rank], 4, (int64_t[]){S, 1, M / S, kd}); break; /* rows in order: chunk s is rows s M/S on */
    }
    in[1] = B->cfg.pipe == GEMM_ALONE ? tensor(B->b[rank], 2, (int64_t[]){kd, N}) : tensor(B->b[rank], 3, (int64_t[]){1, kd, N});
    return 2;
  }
  switch (B->cfg.pipe) {
  case COMM_ALONE: /* the serial GEMM's output: any values */
    in[0] = tensor(NULL, 4, (int64_t[]){1, D, m, N});
    return 1;
  case GEMM_ALONE:
    in[0] = tensor(B->a[rank], 2, (int64_t[]){M, kd});
    in[1] = tensor(B->b[rank], 2, (int64_t[]){kd, N});
    return 2;
  case COLLECTIVE: { /* rows (j, s, i) -> (s, j, i): chunk s of every destination j together */
    uint16_t *p = (uint16_t *)malloc((size_t)(M * kd) * 2);
    int64_t j, c, rows = m / S;
    if (!p) return -1;
    for (c = 0; c < S; c++)
      for (j = 0; j < D; j++)
        memcpy(p + (c * D + j) * rows * kd, B->a[rank] + (j * m + c * rows) * kd, (size_t)(rows * kd) * 2);
    *owned = p;
    in[0] = tensor(p, 5, (int64_t[]){S, 1, D, rows, kd});
    break;
  }
  case COLLECTIVE_N: { /* B's columns (k, s, j) -> (s, k, j): chunk s of the columns whole */
    uint16_t *p = (uint16_t *)malloc((size_t)(kd * N) * 2);
    int64_t c, k, cols = N / S;
    if (!p) return -1;
    for (c = 0; c < S; c++)
      for (k = 0; k < kd; k++) memcpy(p + (c * kd + k) * cols, B->b[rank] + k * N + c * cols, (size_t)cols * 2);
    *owned = p;
    in[0] = tensor(B->a[rank], 4, (int64_t[]){1, D, m, kd});
    in[1] = tensor(p, 4, (int64_t[]){1, S, kd, cols});
    return 2;
  }
  default: in[0] = tensor(B->a[rank], 4, (int64_t[]){1, D, m, kd}); break;
  }
  in[1] = tensor(B->b[rank], 3, (int64_t[]){1, kd, N});
  return 2;
}

/* Index in the serial output of element i of this pipeline's output: the
   AG collective pipeline's rows come out (s, d, i) instead of (d, s, i);
   RS on N's columns (s, i, j) instead of (i, s, j). */
static int64_t serial_index(const bench *B, int64_t i) {
  int64_t D = B->D, N = B->sh.N, m = B->sh.M / D, S = B->cfg.chunks, rows = m / S, row, col, c, d, r;
  if (B->cfg.pipe == COLLECTIVE_N) return i / (N / S) % m * N + i / (m * (N / S)) * (N / S) + i % (N / S);
  if (B->sh.pat != AG || B->cfg.pipe != COLLECTIVE) return i;
  row = i / N;
  col = i % N;
  c = row / (D * rows);
  d = row / rows % D;
  r = row % rows;
  return (d * m + c * rows + r) * N + col;
}

/* ---- one pipeline on one rank ---- */

static hir_status fail(bench *B, int rank, hir_status s, const char *what, const char *detail) {
  snprintf(B->msg[rank], sizeof B->msg[rank], "rank %d: %s: %.440s", rank, what, detail);
  return s;
}

/* A backend copy of h; a host tensor without data only gets the memory. */
static hir_status upload(hir_backend *b, const hir_tensor *h, hir_tensor *d) {
  size_t bytes = (size_t)numel(h) * 2;
  hir_status s;
  *d = *h;
  d->data = NULL;
  if ((s = b->alloc(b, bytes, &d->data)) != HIR_OK) return s;
  if (h->data) return b->upload(b, d->data, h->data, bytes);
  return HIR_OK;
}

static void config_name(const config *c, char *buf, size_t cap);

static void write_trace(bench *B) {
  char name[64], path[512];
  FILE *f;
  int i, k = 0;
  for (i = 0; i < B->D; i++)
    if (!B->trace_ev[i]) return; /* a rank failed: it says why */
  config_name(&B->cfg, name, sizeof name);
  k = snprintf(path, sizeof path, "%s/%s_%lld_%lld_%lld_", B->trace_dir, pattern_keys[B->sh.pat], (long long)B->sh.M,
               (long long)B->sh.K, (long long)B->sh.N);
  for (i = 0; name[i] && k + 1 < (int)sizeof path; i++) { /* the pipeline's name, as a file name */
    char c = name[i] == ' ' || name[i] == ',' ? '_' : name[i];
    if (c != '(' && c != ')' && c != '.' && (c != '_' || path[k - 1] != '_')) path[k++] = c;
  }
  snprintf(path + k, sizeof path - (size_t)k, ".json");
  if (!(f = fopen(path, "w")) || hir_timeline_write(B->trace_ev, B->D, f) != HIR_OK)
    fprintf(stderr, "bench-overlap: cannot write the timeline %s\n", path);
  if (f) fclose(f);
}

/* --serve: a saved plan file with every plan's choice replaced (hir_tuner_save's lines "plan <shapes> | <choice> |
   <ms>"); the old file is closed, the new one returned (NULL: no temporary file). */
static FILE *plan_serving(FILE *saved, const char *choice) {
  FILE *out = tmpfile();
  char line[4096], *ms, *at;
  if (out && fseek(saved, 0, SEEK_SET) == 0) {
    while (fgets(line, sizeof line, saved)) {
      if (!strncmp(line, "plan ", 5) && (ms = strrchr(line, '|')) && (*ms = 0, at = strrchr(line, '|')))
        fprintf(out, "%.*s| %s |%s", (int)(at - line), line, choice, ms + 1);
      else fputs(line, out);
    }
  }
  fclose(saved);
  if (out && fflush(out)) fclose(out), out = NULL;
  return out;
}

static hir_status run_rank(int rank, void *user) {
  bench *B = (bench *)user;
  hir_backend *be;
  hir_comm *comm = NULL;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tuner *tuner = NULL;
  hir_tensor hin[2], din[2], out;
  void *owned = NULL;
  int nin, i, k;
  hir_status s = HIR_OK;
  memset(din, 0, sizeof din);
  B->msg[rank][0] = 0;
  B->err[rank] = 0;
#ifdef HOSTIR_CUDA
  be = B->gpu ? hir_backend_cuda_create(B->procs ? B->device : rank) : hir_backend_cpu_create();
  if (B->cfg.pipe != GEMM_ALONE)
    comm = B->procs ? B->pcomm : B->gpu ? hir_nccl_world_comm(B->nccl, rank) : hir_local_comm(B->local, rank);
#else
  be = hir_backend_cpu_create();
  if (B->cfg.pipe != GEMM_ALONE) comm = hir_local_comm(B->local, rank);
#endif
  if (!be) return fail(B, rank, HIR_ERR_BACKEND, "backend", "cannot be created");
  nin = host_inputs(B, rank, hin, &owned);
  if (nin < 0) {
    s = fail(B, rank, HIR_ERR_NOMEM, "inputs", "out of host memory");
    goto done;
  }
  memset(&ld, 0, sizeof ld);
  ld.my_device = rank;
  ld.stream.schedule = B->cfg.pipe == P2P_AS_COLLECTIVES                          ? HIR_SCHEDULE_COLLECTIVE
                       : B->cfg.pipe == P2P_RING || B->cfg.pipe == P2P_SPLIT_WEIGHT ? HIR_SCHEDULE_RING
                                                                                    : HIR_SCHEDULE_LINEAR;
  ld.comm = comm;
  ld.stream.parts = B->cfg.pipe == P2P_AS_COLLECTIVES ? B->cfg.chunks : B->cfg.parts;
  ld.stream.bounded_buffers = B->cfg.bounded;
  ld.stream.gather_first = B->cfg.pipe == P2P_ONE_GEMM; /* AG: the p2p fusion, its exchange first; RS: no allgather */
  ld.stream.experimental.column_parts = B->cfg.pipe == P2P_SPLIT_WEIGHT ? B->cfg.chunks : 0;
  memset(&ed, 0, sizeof ed);
  ed.backend = be;
  ed.comm = comm;
  ed.number_of_streams = B->cfg.streams;
  ed.graph = B->cfg.graph;
  for (i = 0; i < nin; i++)
    if ((s = upload(be, &hin[i], &din[i])) != HIR_OK) {
      fail(B, rank, s, "upload", be->error);
      goto done;
    }
  if (B->cfg.pipe == AUTO) { /* the tuner: every candidate measured on these shapes, the ranks agreeing */
    hir_tune_desc td;
    double t0;
    memset(&td, 0, sizeof td);
    td.lower = ld;
    td.eval = ed;
    td.memory_limit = B->memory_limit;
    if ((s = hir_tuner_create(B->f, &td, &tuner)) != HIR_OK) {
      fail(B, rank, s, "hir_tuner_create", hir_tuner_error(tuner));
      goto done;
    }
    if (B->from_plan && (!B->plan_file[rank] || fseek(B->plan_file[rank], 0, SEEK_SET) != 0 ||
                         (s = hir_tuner_load(tuner, B->plan_file[rank])) != HIR_OK)) {
      fail(B, rank, s ? s : HIR_ERR_INVALID, "hir_tuner_load", B->plan_file[rank] ? hir_tuner_error(tuner) : "no plan was saved");
      goto done;
    }
    barrier(B);
    t0 = now_ms();
    if ((s = hir_tuner_tune(tuner, din, nin)) != HIR_OK) { /* from a loaded plan: its evaluator only */
      fail(B, rank, s, "hir_tuner_tune", hir_tuner_error(tuner));
      goto done;
    }
    B->tune_ms[rank] = now_ms() - t0;
    if (!B->from_plan && B->rematch > 0) { /* for the rematch's run from a saved plan */
      if (B->plan_file[rank]) fclose(B->plan_file[rank]);
      if (!(B->plan_file[rank] = tmpfile()) || (s = hir_tuner_save(tuner, B->plan_file[rank])) != HIR_OK || fflush(B->plan_file[rank]) ||
          (B->serve && !(B->plan_file[rank] = plan_serving(B->plan_file[rank], B->serve)))) {
        fail(B, rank, s ? s : HIR_ERR_BACKEND, "hir_tuner_save", B->plan_file[rank] ? hir_tuner_error(tuner) : "no temporary file");
        goto done;
      }
    }
    if (rank == B->me) snprintf(B->plan, sizeof B->plan, "%s", hir_program_plan(hir_tuner_program(tuner)));
    ev = hir_tuner_evaluator(tuner); /* the tuner's: for the timeline and the memory, not freed here */
  } else {
    if ((s = hir_lower(B->f, &ld, &p)) != HIR_OK) {
      fail(B, rank, s, "hir_lower", p ? hir_program_error(p) : "out of memory");
      goto done;
    }
    if ((s = hir_evaluator_create(p, &ed, &ev)) != HIR_OK) {
      fail(B, rank, s, "hir_evaluator_create", ev ? hir_evaluator_error(ev) : "out of memory");
      goto done;
    }
  }
  if (B->cfg.pipe == GEMM_ALONE && B->sh.pat == AG) /* this rank's rows D times */
    for (k = 0; k < B->D && s == HIR_OK; k++)
      s = be->upload(be, (char *)din[0].data + (size_t)(k * a_numel(&B->sh, B->D)) * 2, B->a[rank],
                     (size_t)a_numel(&B->sh, B->D) * 2);
  if (s != HIR_OK) {
    fail(B, rank, s, "upload", be->error);
    goto done;
  }
  memset(&out, 0, sizeof out);
  if (B->pause_ms > 0) {
    struct timespec rest = {B->pause_ms / 1000, (long)(B->pause_ms % 1000) * 1000000L};
    barrier(B);
    nanosleep(&rest, NULL);
  }
  for (k = 0; k < B->warmup + B->iters; k++) {
    double t0;
    barrier(B);
    t0 = now_ms();
    s = tuner ? hir_tuner_run(tuner, din, nin, &out, 1) : hir_run(ev, din, nin, &out, 1);
    if (s == HIR_OK) s = tuner ? hir_tuner_sync(tuner) : hir_evaluator_sync(ev);
    if (k >= B->warmup) B->ms[rank][k - B->warmup] = now_ms() - t0, B->start[rank][k - B->warmup] = t0;
    if (s != HIR_OK) { /* the other ranks would wait at the barrier: this one still arrives */
      fail(B, rank, s, "hir_run", tuner ? hir_tuner_error(tuner) : hir_evaluator_error(ev));
      for (k++; k < B->warmup + B->iters; k++) barrier(B);
      goto done;
    }
  }
  B->mem[rank] = hir_evaluator_memory(ev);
  if (B->trace_dir && B->cfg.pipe >= SERIAL) { /* one more run, recorded; every rank meets every barrier */
    hir_status t = hir_evaluator_record_timeline(ev, 1);
    barrier(B);
    if (t == HIR_OK && (t = hir_run(ev, din, nin, &out, 1)) == HIR_OK) t = hir_evaluator_sync(ev);
    B->trace_ev[rank] = t == HIR_OK ? ev : NULL;
    if (t != HIR_OK) fail(B, rank, t, "the recorded run", hir_evaluator_error(ev));
    barrier(B);
    if (rank == 0) write_trace(B);
    barrier(B);
    hir_evaluator_record_timeline(ev, 0);
    if ((s = t) != HIR_OK) goto done;
  }
  if (B->cfg.pipe >= SERIAL) { /* the result, against the serial one */
    int64_t n = numel(&out);
    uint16_t *h = (uint16_t *)malloc((size_t)n * 2);
    if (!h || (s = be->download(be, h, out.data, (size_t)n * 2)) != HIR_OK) {
      free(h);
      s = fail(B, rank, h ? s : HIR_ERR_NOMEM, "download", h ? be->error : "out of host memory");
      goto done;
    }
    if (B->cfg.pipe == SERIAL && !B->cfg.logical) {
      free(B->ref[rank]);
      B->ref[rank] = h;
      B->ref_numel = n;
    } else if (n != B->ref_numel) {
      free(h);
      s = fail(B, rank, HIR_ERR_SHAPE, "output", "its size differs from the serial output's");
      goto done;
    } else {
      double worst = 0, scale = 0;
      int64_t j;
      for (j = 0; j < n; j++) {
        double r = hir_bf16_to_float(B->ref[rank][serial_index(B, j)]), d = fabs(hir_bf16_to_float(h[j]) - r);
        if (!(d <= worst)) worst = d; /* NaN counts as the worst */
        if (fabs(r) > scale) scale = fabs(r);
      }
      B->err[rank] = worst / (scale > 0 ? scale : 1);
      free(h);
    }
  }
done:
  for (i = 0; i < 2; i++)
    if (din[i].data) be->release(be, din[i].data);
  free(owned);
  if (tuner) hir_tuner_free(tuner); /* and the evaluator it chose */
  else hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  return s;
}

/* ---- the table ---- */

#ifdef HOSTIR_CUDA
/* Processes: every rank's times, memory, error and message, to every rank
   (threads wrote them into B directly). A rank's failure fails them all. */
static hir_status share_results(bench *B, hir_status s) {
  static rank_record mine, all[MAXR];
  int i;
  memcpy(mine.ms, B->ms[B->me], sizeof mine.ms);
  memcpy(mine.start, B->start[B->me], sizeof mine.start);
  mine.err = B->err[B->me];
  mine.tune_ms = B->tune_ms[B->me];
  mine.mem = B->mem[B->me];
  snprintf(mine.msg, sizeof mine.msg, "%s", s == HIR_OK ? "" : B->msg[B->me][0] ? B->msg[B->me] : hir_status_str(s));
  meet(B, &mine, all, sizeof mine);
  for (i = 0; i < B->D; i++) {
    memcpy(B->ms[i], all[i].ms, sizeof all[i].ms);
    memcpy(B->start[i], all[i].start, sizeof all[i].start);
    B->err[i] = all[i].err;
    B->tune_ms[i] = all[i].tune_ms;
    B->mem[i] = all[i].mem;
    snprintf(B->msg[i], sizeof B->msg[i], "%s", all[i].msg);
    if (all[i].msg[0]) s = HIR_ERR_COMM;
  }
  return s;
}
#endif

/* The median of n values (sorted in place). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over iterations of the slowest rank's time. */
static double median_of_slowest(bench *B) {
  double it[MAXIT];
  int i, k;
  for (k = 0; k < B->iters; k++) {
    it[k] = 0;
    for (i = 0; i < B->D; i++) it[k] = B->ms[i][k] > it[k] ? B->ms[i][k] : it[k];
  }
  return median(it, B->iters);
}

/* The median over iterations of how far apart the ranks began (us): a rank
   that leaves the barrier first waits inside the exchange for the last, so
   a communicating row's slowest-rank time carries this spread. */
static double median_skew_us(bench *B) {
  double it[MAXIT];
  int i, k;
  for (k = 0; k < B->iters; k++) {
    double lo = B->start[0][k], hi = lo;
    for (i = 1; i < B->D; i++) lo = B->start[i][k] < lo ? B->start[i][k] : lo, hi = B->start[i][k] > hi ? B->start[i][k] : hi;
    it[k] = (hi - lo) * 1e3;
  }
  return median(it, B->iters);
}

#ifdef HOSTIR_CUDA
enum { PEER_BYTES = 256 << 20 };

/* A communication of this rank's, timed like the rows (the ranks meet, it
   runs, its stream is synchronized): `op` from src (src_bytes) into dst
   (dst_bytes) on device memory of its own. */
typedef hir_status (*comm_op)(bench *B, hir_comm *c, int rank, void *src, void *dst, cudaStream_t st);

static hir_status time_comm(bench *B, int rank, size_t src_bytes, size_t dst_bytes, comm_op op, const char *what) {
  hir_comm *c = B->procs ? B->pcomm : hir_nccl_world_comm(B->nccl, rank);
  void *src = NULL, *dst = NULL;
  cudaStream_t st = NULL;
  hir_status s = HIR_OK;
  int k;
  cudaSetDevice(B->procs ? B->device : rank);
  if (cudaMalloc(&src, src_bytes) != cudaSuccess || cudaMalloc(&dst, dst_bytes) != cudaSuccess ||
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
    s = fail(B, rank, HIR_ERR_BACKEND, what, "out of device memory");
  c->what.tensor = -1;
  for (k = 0; k < B->warmup + B->iters; k++) { /* every rank meets every barrier, failed or not */
    double t0;
    barrier(B);
    t0 = now_ms();
    if (s == HIR_OK && (s = op(B, c, rank, src, dst, st)) != HIR_OK) fail(B, rank, s, what, c->error);
    if (s == HIR_OK && cudaStreamSynchronize(st) != cudaSuccess) s = fail(B, rank, HIR_ERR_BACKEND, what, "failed");
    if (k >= B->warmup) B->ms[rank][k - B->warmup] = now_ms() - t0;
  }
  cudaFree(src);
  cudaFree(dst);
  if (st) cudaStreamDestroy(st);
  return s;
}

/* The peer-copy bandwidth: every rank sends PEER_BYTES to the next and
   receives from the previous, through the communicator's copy engines. */
static hir_status peer_op(bench *B, hir_comm *c, int rank, void *src, void *dst, cudaStream_t st) {
  hir_status s, end;
  if ((s = c->group_start(c)) != HIR_OK) return s;
  if ((s = c->send(c, src, PEER_BYTES, (rank + 1) % B->D, st)) == HIR_OK) s = c->recv(c, dst, PEER_BYTES, (rank + B->D - 1) % B->D, st);
  end = c->group_end(c);
  return s != HIR_OK ? s : end;
}

static hir_status peer_rank(int rank, void *user) { return time_comm((bench *)user, rank, PEER_BYTES, PEER_BYTES, peer_op, "peer copy"); }

/* The shape's collective called on the communicator itself: no program and
   no evaluator, what hostir_nccl's call costs beside the "alone" row (which
   runs it through hir_run). AG: each rank's rows gathered; RS: the partial
   products summed and scattered; AR: summed whole. */
static size_t direct_chunk(const bench *B) { /* one rank's bytes (AR: all of them) */
  return (size_t)(B->sh.M / (B->sh.pat == AR ? 1 : B->D)) * (size_t)(B->sh.pat == AG ? B->sh.K : B->sh.N) * 2;
}

static hir_status direct_op(bench *B, hir_comm *c, int rank, void *src, void *dst, cudaStream_t st) {
  static const int world[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};
  size_t chunk = direct_chunk(B);
  void *team = NULL;
  hir_status s;
  (void)rank;
  if ((s = c->team(c, world, B->D, &team)) != HIR_OK) return s; /* the world's, made once */
  if (B->sh.pat == AR) return c->allreduce(c, team, src, dst, chunk / 2, HIR_BF16, st);
  return B->sh.pat == AG ? c->allgather(c, team, src, dst, chunk, st) : c->reduce_scatter(c, team, src, dst, chunk / 2, HIR_BF16, st);
}

static hir_status direct_rank(int rank, void *user) {
  bench *B = (bench *)user;
  size_t chunk = direct_chunk(B), all = chunk * (size_t)B->D;
  if (B->sh.pat == AR) return time_comm(B, rank, chunk, chunk, direct_op, "direct collective");
  return time_comm(B, rank, B->sh.pat == AG ? chunk : all, B->sh.pat == AG ? all : chunk, direct_op, "direct collective");
}

static void measure_direct(bench *B, const char *cname) {
  hir_status s = run_ranks(B, direct_rank);
  if (B->procs) s = share_results(B, s);
  if (s == HIR_OK) printf("  %-44s %9.3f   (no program: the communicator's own call, %s)\n", "", median_of_slowest(B),
                          hir_nccl_comm_blocking(B->procs ? B->pcomm : hir_nccl_world_comm(B->nccl, 0))
                              ? "blocking twins, watched" : "nonblocking NCCL communicators, polled");
  else printf("  %s called directly: FAILED (%s)\n", cname, B->msg[0][0] ? B->msg[0] : hir_status_str(s));
}

static void measure_peer_copy(bench *B) {
  hir_status s;
  if (B->procs ? hir_nccl_comm_set_copy_engine(B->pcomm, 1) != HIR_OK : (hir_nccl_world_set_copy_engine(B->nccl, 1), 0)) {
    printf("peer-copy bandwidth: not measured (%s)\n\n", B->pcomm->error);
    return;
  }
  s = run_ranks(B, peer_rank);
  if (B->procs) s = share_results(B, s);
  if (s == HIR_OK) B->peer_gbs = PEER_BYTES / median_of_slowest(B) * 1e-6;
  if (s == HIR_OK) printf("peer-copy bandwidth: %.0f GB/s a rank (256 MiB to the next rank while receiving from the previous, "
                          "copy engines, median of %d)\n\n", B->peer_gbs, B->iters);
  else printf("peer-copy bandwidth: not measured (%s)\n\n", B->msg[0][0] ? B->msg[0] : hir_status_str(s));
}
#endif

static int run_config(bench *B, config cfg, result *r) {
  int i;
  hir_status s;
  char name[64];
  config_name(&cfg, name, sizeof name);
  pthread_mutex_lock(&B->mu);
  B->rows_begun++;
  snprintf(B->row, sizeof B->row, "\"%s\" of %s M=%lld K=%lld N=%lld", name, pattern_names[B->sh.pat],
           (long long)B->sh.M, (long long)B->sh.K, (long long)B->sh.N);
  pthread_mutex_unlock(&B->mu);
  B->cfg = cfg;
  B->f = cfg.pipe == GEMM_ALONE ? build_gemm()
         : cfg.logical ? build_logical(B->sh.pat, cfg.pipe, B->D, cfg.chunks)
         : B->sh.pat == AG ? build_ag(cfg.pipe, B->D)
         : B->sh.pat == RS ? build_rs(cfg.pipe, B->D)
                           : build_ar(cfg.pipe, B->D);
  memset(r, 0, sizeof *r);
#ifdef HOSTIR_CUDA
  if (B->procs && hir_nccl_comm_set_copy_engine(B->pcomm, cfg.copy_engine) != HIR_OK) {
    snprintf(r->msg, sizeof r->msg, "%s", B->pcomm->error);
    hir_fusion_free(B->f);
    return 0;
  }
  if (B->gpu && !B->procs) hir_nccl_world_set_copy_engine(B->nccl, cfg.copy_engine);
#endif
  s = run_ranks(B, run_rank);
  hir_fusion_free(B->f);
#ifdef HOSTIR_CUDA
  if (B->procs) s = share_results(B, s);
#endif
  if (s != HIR_OK) {
    for (i = 0; i < B->D && !B->msg[i][0]; i++) {}
    snprintf(r->msg, sizeof r->msg, "%s", i < B->D ? B->msg[i] : hir_status_str(s));
    return 0;
  }
  r->ms = median_of_slowest(B);
  r->skew_us = median_skew_us(B);
  for (i = 0; i < B->D; i++) {
    if (B->mem[i] > r->mem) r->mem = B->mem[i];
    if (!(B->err[i] <= r->err)) r->err = B->err[i];
  }
  r->ok = 1;
  return 1;
}

static void config_base_name(const config *c, char *buf, size_t cap);
static void config_name(const config *c, char *buf, size_t cap) {
  size_t n;
  config_base_name(c, buf, cap);
  n = strlen(buf);
  if (c->logical) snprintf(buf + n, cap - n, ", logical"), n = strlen(buf);
  if (c->graph) snprintf(buf + n, cap - n, c->graph == 2 ? " [graph 2]" : " [graph]");
}

static void config_base_name(const config *c, char *buf, size_t cap) {
  if (c->pipe == COLLECTIVE || c->pipe == COLLECTIVE_N || c->pipe == P2P_AS_COLLECTIVES)
    snprintf(buf, cap, "%s, %d chunks, %d streams", pipeline_names[c->pipe], c->chunks, c->streams);
  else if (c->pipe == AUTO)
    snprintf(buf, cap, "%s%s)", pipeline_names[c->pipe], c->copy_engine ? ", copy eng." : "");
  else if (c->pipe == P2P_SPLIT_WEIGHT)
    snprintf(buf, cap, "%s 1/%d%s, %d streams", pipeline_names[c->pipe], c->chunks, c->copy_engine ? " (copy eng.)" : "",
             c->streams);
  else if (c->pipe >= P2P_LINEAR && c->parts > 1)
    snprintf(buf, cap, "%s%s, %d parts, %d streams%s", pipeline_names[c->pipe], c->copy_engine ? " (copy eng.)" : "", c->parts,
             c->streams, c->bounded ? ", bounded" : "");
  else if (c->pipe >= P2P_LINEAR)
    snprintf(buf, cap, "%s%s, %d streams%s", pipeline_names[c->pipe], c->copy_engine ? " (copy eng.)" : "", c->streams,
             c->bounded ? ", bounded" : "");
  else
    snprintf(buf, cap, "%s", c->pipe == COMM_ALONE ? (pipeline_names[0]) : pipeline_names[c->pipe]);
}

/* Every pipeline for one shape; returns the number that failed. */
static int bench_shape(bench *B, const int *streams, int nstreams, const int *chunks, int nchunks, const int *parts,
                       int nparts, const int *column_parts, int ncolumn_parts) {
  config cfgs[MAXCFG];
  result res[MAXCFG];
  int n = 0, i, j, failed = 0, best = -1;
  double comm, gemm, floor_ms, serial, received, copy_ms, phys;
  const char *cname = B->sh.pat == AG ? "AG" : B->sh.pat == RS ? "RS" : "AR";
  int64_t m = B->sh.M / B->D;
  int ce, auto_at, k, gemm_ok;
  double began = now_ms();
  cfgs[n++] = (config){COMM_ALONE, 1, 1, 0, 1, 0, 0, 0};
  cfgs[n++] = (config){GEMM_ALONE, 1, 1, 0, 1, 0, 0, 0};
  cfgs[n++] = (config){SERIAL, 1, 1, 0, 1, 0, 0, 0}; /* first of the checked ones: their reference */
  for (i = 0; i < nchunks; i++)
    for (j = 0; j < nstreams && n < MAXCFG - 1; j++)
      if (m % chunks[i] == 0) {
        cfgs[n++] = (config){COLLECTIVE, chunks[i], streams[j], 0, 1, 0, 0, 0};
        if (B->sh.pat != AR) cfgs[n++] = (config){P2P_AS_COLLECTIVES, chunks[i], streams[j], 0, 1, 0, 0, 0}; /* the p2p fusion's layout */
      }
  for (i = 0; i < ncolumn_parts && B->sh.pat == RS; i++)
    for (j = 0; j < nstreams && n < MAXCFG - 1; j++)
      if (B->sh.N % column_parts[i] == 0) cfgs[n++] = (config){COLLECTIVE_N, column_parts[i], streams[j], 0, 1, 0, 0, 0};
  for (ce = 0; ce <= B->gpu && B->sh.pat != AR; ce++) /* an all-reduce has no P2P form */
    for (i = P2P_LINEAR; i <= P2P_RING; i++)
      for (k = 0; k < nparts; k++)
        for (j = 0; j < nstreams && n < MAXCFG - 1; j++)
          if (m % parts[k] == 0) cfgs[n++] = (config){(pipeline)i, B->D, streams[j], ce, parts[k], 0, 0, 0};
  for (j = 0; j < nstreams && n < MAXCFG - 1 && B->sh.pat != AR; j++) /* bounded buffers: the memory they save, the time they cost */
    cfgs[n++] = (config){P2P_RING, B->D, streams[j], B->gpu, 1, 1, 0, 0};
  for (ce = 0; ce <= B->gpu && n < MAXCFG - 1 && B->sh.pat != AR; ce++)
    cfgs[n++] = (config){P2P_ONE_GEMM, B->D, streams[0], ce, 1, 0, 0, 0};
  for (i = 0; i < ncolumn_parts && B->sh.pat == AG; i++)
    for (ce = 0; ce <= B->gpu && n < MAXCFG - 1; ce++)
      if (column_parts[i] > 1 && B->sh.N % column_parts[i] == 0)
        cfgs[n++] = (config){P2P_SPLIT_WEIGHT, column_parts[i], streams[0], ce, 1, 0, 0, 0};
  cfgs[n++] = (config){SERIAL, 1, 1, 0, 1, 0, 0, 1}; /* the same pipelines written on logical shapes */
  for (i = 0; i < nchunks && B->sh.pat == AR; i++)
    for (j = 0; j < nstreams && n < MAXCFG - 1; j++)
      if (m % chunks[i] == 0) cfgs[n++] = (config){COLLECTIVE, chunks[i], streams[j], 0, 1, 0, 0, 1};
  for (ce = 0; ce <= B->gpu && B->sh.pat != AR && n < MAXCFG - 1; ce++)
    cfgs[n++] = (config){P2P_RING, B->D, streams[0], ce, 1, 0, 0, 1};
  auto_at = n;
  /* the plan it prints is its own; AR: the tuner on the collective fusion of the first chunk count (serial among its
     candidates) */
  cfgs[n++] = (config){AUTO, B->sh.pat == AR ? chunks[0] : B->D, 4, B->gpu, 0, 0, B->graphs, 0};
  for (i = 1, k = n; B->graphs && i < k && n < MAXCFG; i++) /* --graph: the GEMM and each pipeline again as a CUDA graph */
    if (cfgs[i].pipe != AUTO) cfgs[n] = cfgs[i], cfgs[n++].graph = B->graphs;
  for (B->generation = B->arrived = 0, i = 0; i < B->D; i++) B->a[i] = B->b[i] = B->ref[i] = NULL;
  if (run_ranks(B, gen_rank) != HIR_OK) {
    printf("%s+GEMM: out of host memory for the inputs\n", cname);
    return 1;
  }
  for (i = 0; i < n; i++) run_config(B, cfgs[i], &res[i]);
  comm = res[0].ms;
  for (gemm = res[1].ms, gemm_ok = res[1].ok, i = 2; i < n; i++) /* the floor's GEMM: its faster mode, eager or graph */
    if (cfgs[i].pipe == GEMM_ALONE && res[i].ok && (!gemm_ok || res[i].ms < gemm)) gemm = res[i].ms, gemm_ok = 1;
  floor_ms = comm > gemm ? comm : gemm;
  serial = res[2].ms;
  received = (double)(B->D - 1) * (double)m * (double)(B->sh.pat == AG ? B->sh.K : B->sh.N) * 2 * (B->sh.pat == AR ? 2 : 1);
  copy_ms = B->peer_gbs > 0 ? received / (B->peer_gbs * 1e6) : 0;
  phys = copy_ms <= 0 ? 0 : gemm > copy_ms ? gemm : copy_ms;
  printf("%s M=%lld K=%lld N=%lld bf16, %d %s, median of %d after %d warm-up (ms)\n",
         pattern_names[B->sh.pat], (long long)B->sh.M, (long long)B->sh.K,
         (long long)B->sh.N, B->D,
         !B->gpu ? "CPU ranks (local world)" : B->procs ? "GPUs (CUDA, NCCL, a process each)" : "GPUs (CUDA, NCCL, a thread each)",
         B->iters, B->warmup);
  printf("  %-44s %9s %8s %7s %7s %10s %9s\n", "pipeline", "ms", "x floor", "x phys", "E", "peak MiB", "max err");
  for (i = 0; i < n; i++) {
    char name[64];
    config_name(&cfgs[i], name, sizeof name);
    if (cfgs[i].pipe == COMM_ALONE) snprintf(name, sizeof name, "%s alone", cname);
    if (!res[i].ok) {
      printf("  %-44s FAILED: %s\n", name, res[i].msg);
      failed++;
      continue;
    }
    printf("  %-44s %9.3f %8.2f", name, res[i].ms, res[i].ms / floor_ms);
    if (phys > 0) printf(" %7.2f", res[i].ms / phys);
    else printf(" %7s", "-");
    if (cfgs[i].pipe >= SERIAL && res[2].ok)
      printf(" %7.2f", (serial - res[i].ms) / (comm < gemm ? comm : gemm));
    else
      printf(" %7s", "-");
    printf(" %10.1f", (double)res[i].mem / (1 << 20));
    if (cfgs[i].pipe > SERIAL || cfgs[i].logical) {
      printf(" %9.1e%s", res[i].err, res[i].err < 3e-2 ? "" : "  WRONG");
      if (!(res[i].err < 3e-2)) failed++;
    }
    printf("\n");
#ifdef HOSTIR_CUDA
    if (cfgs[i].pipe == COMM_ALONE && B->gpu) measure_direct(B, name); /* what of that row is the call itself */
#endif
    if (cfgs[i].pipe >= SERIAL && (best < 0 || res[i].ms < res[best].ms)) best = i;
  }
  if (res[0].ok && gemm_ok) printf("  %-44s %9.3f %8.2f\n", "floor = max(comm, GEMM)", floor_ms, 1.0);
  if (gemm_ok && copy_ms > 0)
    printf("  %-44s %9.3f %8.2f %7.2f   (%.0f MiB received at %.0f GB/s: %.3f ms)\n", "physical floor = max(GEMM, copies)", phys,
           phys / floor_ms, 1.0, received / (1 << 20), B->peer_gbs, copy_ms);
  { /* how far apart the ranks began, which every communicating row's time carries */
    double skew[MAXCFG], widest = 0;
    int nskew = 0;
    for (i = 0; i < n; i++)
      if (res[i].ok) skew[nskew++] = res[i].skew_us, widest = res[i].skew_us > widest ? res[i].skew_us : widest;
    if (nskew && B->D > 1)
      printf("  the ranks began %.1f us apart after the barrier (median of the rows' medians; the widest row's %.1f us)\n",
             median(skew, nskew), widest);
  }
  if (best >= 0) {
    char name[64];
    config_name(&cfgs[best], name, sizeof name);
    printf("  best: %s, %.3f ms = %.2fx floor, %.2fx serial", name, res[best].ms, res[best].ms / floor_ms, res[best].ms / serial);
    if (phys > 0) printf(", %.2fx physical floor", res[best].ms / phys);
    printf("\n");
  }
  if (res[auto_at].ok) {
    double tuned = 0;
    for (i = 0; i < B->D; i++) tuned = B->tune_ms[i] > tuned ? B->tune_ms[i] : tuned;
    printf("  automatic: %.3f ms = %.3fx serial, %.3fx the best measured here; tuning took %.0f ms (the slowest rank)\n"
           "    %s\n", res[auto_at].ms, res[auto_at].ms / serial, best >= 0 ? res[auto_at].ms / res[best].ms : 0, tuned, B->plan);
  }
  if (B->rematch > 0 && best >= 0 && best != auto_at && res[auto_at].ok) {
    double rounds[3][MAXREMATCH];
    result again;
    int got = 0, ok;
    char name[64], chosen[MAXREMATCH][64], served[MAXREMATCH][64];
    while (got < B->rematch && run_config(B, cfgs[best], &again)) {
      rounds[0][got] = again.ms;
      if (!run_config(B, cfgs[auto_at], &again)) break;
      plan_choice(B->plan, chosen[got], sizeof chosen[got]);
      rounds[1][got] = again.ms;
      B->from_plan = 1;
      ok = run_config(B, cfgs[auto_at], &again);
      B->from_plan = 0;
      if (!ok) break;
      plan_choice(B->plan, served[got], sizeof served[got]);
      rounds[2][got++] = again.ms;
    }
    config_name(&cfgs[best], name, sizeof name);
    if (got) {
      double b = median(rounds[0], got), a = median(rounds[1], got), t = median(rounds[2], got);
      printf("  rematch, in turns (%d rounds, medians): %s %.3f ms; automatic, tuned in its row %.3f ms = %.3fx; automatic "
             "from the plan it saved (no tuning, as a server starts%s%s) %.3f ms = %.3fx\n", got, name, b, a, a / b,
             B->serve ? "; the plan's choice replaced by " : "", B->serve ? B->serve : "", t, t / b);
      for (i = 0; i < got; i++) /* a round's automatic row tunes anew: what it chose, and how it ran */
        printf("    round %d: %s %.3f ms; automatic %.3f ms, tuned to %s; from its plan %.3f ms (%s)\n", i + 1, name,
               rounds[0][i], rounds[1][i], chosen[i], rounds[2][i], served[i]);
    } else {
      printf("  rematch: FAILED: %s\n", again.msg);
      failed++;
    }
  }
  printf("  this table took %.1f s (%d rows)\n\n", (now_ms() - began) / 1e3, n);
  fflush(stdout);
  for (i = 0; i < B->D; i++) {
    free(B->a[i]);
    free(B->b[i]);
    free(B->ref[i]);
  }
  return failed;
}

static int parse_list(const char *s, int *out, int cap) {
  int n = 0;
  while (*s && n < cap) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1) return 0;
    out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
  }
  return n;
}

/* A row that has run --hang-s seconds ends the run, named: a hang inside
   CUDA's driver is past every deadline of hostir's (bench/NOTES.md section
   43), and a script's next stage should still run. */
static void *hang_watch(void *user) {
  bench *B = (bench *)user;
  unsigned long seen = 0;
  struct timespec second = {1, 0};
  int still = 0;
  for (;;) {
    nanosleep(&second, NULL);
    pthread_mutex_lock(&B->mu);
    if (B->rows_begun != seen) seen = B->rows_begun, still = 0;
    else if (seen && ++still >= B->hang_s) {
      char who[32] = "";
      if (B->procs) snprintf(who, sizeof who, "rank %d: ", B->me);
      fprintf(stderr, "bench-overlap: %s%s has run %d s, a hang: the run ends here (bench/NOTES.md section 43)\n", who, B->row,
              B->hang_s);
      fflush(stdout);
      fflush(stderr);
      _Exit(3);
    }
    pthread_mutex_unlock(&B->mu);
  }
  return NULL;
}

int main(int argc, char **argv) {
  static bench B;
  static const shape gpu_shapes[] = {{AG, 32768, 32768, 1024}, {AG, 16384, 8192, 7168}, {AG, 4096, 4096, 1024},
                                     {RS, 32768, 32768, 1024}, {RS, 16384, 28672, 8192}, {RS, 4096, 4096, 1024},
                                     {AR, 16384, 28672, 8192}, {AR, 4096, 4096, 1024}};
  static const shape cpu_shapes[] = {{AG, 256, 128, 64}, {RS, 256, 128, 64}, {AR, 256, 128, 64}};
  static const shape decode_shapes[] = {{AG, 256, 8192, 4096}, {AG, 1024, 8192, 4096}, {AG, 4096, 8192, 4096},
                                        {RS, 256, 8192, 4096}, {RS, 1024, 8192, 4096}, {RS, 4096, 8192, 4096},
                                        {AR, 256, 8192, 4096}, {AR, 1024, 8192, 4096}, {AR, 4096, 8192, 4096}};
  int decode = 0, ranks = 0;
  shape shapes[32];
  int nshapes = 0, streams[4] = {2, 4}, nstreams = 2, chunks[4] = {4, 8}, nchunks = 2, parts[4] = {1, 2, 4}, nparts = 3;
  int column_parts[4] = {2}, ncolumn_parts = 1, i, failed = 0;
  B.iters = 10;
  B.warmup = 3;
  B.hang_s = -1;
  B.rematch = 3;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) B.iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) B.warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--streams") && i + 1 < argc) nstreams = parse_list(argv[++i], streams, 4);
    else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) nchunks = parse_list(argv[++i], chunks, 4);
    else if (!strcmp(argv[i], "--parts") && i + 1 < argc) nparts = parse_list(argv[++i], parts, 4);
    else if (!strcmp(argv[i], "--column-parts") && i + 1 < argc) ncolumn_parts = parse_list(argv[++i], column_parts, 4);
    else if (!strcmp(argv[i], "--trace") && i + 1 < argc) B.trace_dir = argv[++i];
    else if (!strcmp(argv[i], "--hang-s") && i + 1 < argc) B.hang_s = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--processes")) B.procs = 1;
    else if (!strcmp(argv[i], "--graph")) B.graphs = i + 1 < argc && !strcmp(argv[i + 1], "2") ? (i++, 2) : 1;
    else if (!strcmp(argv[i], "--decode")) decode = 1;
    else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--memory-limit") && i + 1 < argc) B.memory_limit = (size_t)(atof(argv[++i]) * (1 << 20));
    else if (!strcmp(argv[i], "--pause") && i + 1 < argc) B.pause_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rematch") && i + 1 < argc) B.rematch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--serve") && i + 1 < argc) B.serve = argv[++i];
    else if ((!strcmp(argv[i], "ag") || !strcmp(argv[i], "rs") || !strcmp(argv[i], "ar")) && i + 3 < argc && nshapes < 32) {
      shapes[nshapes].pat = !strcmp(argv[i], "ag") ? AG : !strcmp(argv[i], "rs") ? RS : AR;
      shapes[nshapes].M = atoll(argv[i + 1]);
      shapes[nshapes].K = atoll(argv[i + 2]);
      shapes[nshapes++].N = atoll(argv[i + 3]);
      i += 3;
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--warmup N] [--streams 2,4] [--chunks 4,8] [--parts 1,2,4] [--column-parts 2] [--trace DIR] [--hang-s S] "
                      "[--processes] [--memory-limit MiB] [--pause MS] [--rematch N] [--serve CHOICE] [--graph] [--decode] [--ranks N] [ag|rs|ar M K N]...\n",
              argv[0]);
      return 2;
    }
  }
  if (B.iters < 1 || B.iters > MAXIT || B.warmup < 0 || B.rematch < 0 || B.rematch > MAXREMATCH || !nstreams || !nchunks ||
      !nparts || !ncolumn_parts || (ranks && (ranks < 2 || ranks > MAXR))) {
    fprintf(stderr, "%s: --iters takes 1..%d, --warmup 0 or more, --rematch 0..%d, --ranks 2..%d, --streams, --chunks, "
                    "--parts and --column-parts positive lists\n", argv[0], MAXIT, MAXREMATCH, MAXR);
    return 2;
  }
#ifdef HOSTIR_CUDA
  if (B.procs) { /* one rank here; the launcher says which */
    hir_nccl_env env;
    char err[512];
    if (hir_nccl_env_read(&env, err, sizeof err) != HIR_OK) {
      fprintf(stderr, "%s: %s\n", argv[0], err);
      return 1;
    }
    if (env.size < 2 || env.size > MAXR) {
      fprintf(stderr, "%s: --processes needs 2 to %d ranks (launch with torchrun, mpirun or srun)\n", argv[0], MAXR);
      return 2;
    }
    if (hir_nccl_comm_create(&env, 60000, &B.pcomm) != HIR_OK) {
      fprintf(stderr, "%s: rank %d: %s\n", argv[0], env.rank, B.pcomm ? B.pcomm->error : "out of memory");
      return 1;
    }
    if (ranks && ranks != env.size) {
      fprintf(stderr, "%s: --ranks %d, but the launcher started %d processes\n", argv[0], ranks, env.size);
      return 2;
    }
    B.D = env.size;
    B.me = env.rank;
    B.device = env.gpu;
    {
      int world[MAXR];
      for (i = 0; i < B.D; i++) world[i] = i;
      if (B.pcomm->team(B.pcomm, world, B.D, &B.pteam) != HIR_OK || cudaStreamCreate((cudaStream_t *)&B.pstream) != cudaSuccess ||
          cudaMalloc(&B.pbuf, sizeof(rank_record) * (MAXR + 1)) != cudaSuccess) {
        fprintf(stderr, "%s: rank %d: %s\n", argv[0], B.me, B.pcomm->error);
        return 1;
      }
    }
    if (B.me != 0 && !freopen("/dev/null", "w", stdout)) return 1; /* rank 0 prints the table */
  } else {
    if (cudaGetDeviceCount(&B.D) != cudaSuccess) B.D = 0;
    B.D = B.D > MAXR ? MAXR : B.D;
    if (ranks && B.D >= 2 && ranks > B.D) {
      fprintf(stderr, "%s: --ranks %d, but %d GPUs are visible\n", argv[0], ranks, B.D);
      return 2;
    }
    if (ranks && B.D >= 2) B.D = ranks;
  }
  B.gpu = B.D >= 2;
#else
  if (B.procs) {
    fprintf(stderr, "%s: --processes needs the CUDA build\n", argv[0]);
    return 2;
  }
#endif
  if (!B.gpu) { /* said first: the CPU runs GPU-sized shapes for minutes */
    printf("bench-overlap: %d GPU(s) visible, 2 needed; the CPU backend and %d in-process ranks run it instead\n\n", B.D,
           ranks ? ranks : 4);
    fflush(stdout);
    B.D = ranks ? ranks : 4;
  }
  if (!nshapes) {
    const shape *d = decode ? decode_shapes : B.gpu ? gpu_shapes : cpu_shapes;
    nshapes = decode ? 9 : B.gpu ? 8 : 3;
    memcpy(shapes, d, (size_t)nshapes * sizeof *d);
  }
  for (i = 0; i < nshapes; i++)
    if (shapes[i].M % B.D || shapes[i].K % B.D || shapes[i].M < B.D || shapes[i].N < 1) {
      fprintf(stderr, "%s: M and K must be positive multiples of the world size %d\n", argv[0], B.D);
      return 2;
    }
  pthread_mutex_init(&B.mu, NULL);
  pthread_cond_init(&B.cv, NULL);
#ifdef HOSTIR_CUDA
  if (B.gpu && !B.procs && hir_nccl_world_create(B.D, &B.nccl) != HIR_OK) {
    fprintf(stderr, "%s: NCCL: %s\n", argv[0], hir_nccl_world_error(B.nccl));
    return 1;
  }
  if (B.gpu) measure_peer_copy(&B);
#endif
  if (!B.gpu && !(B.local = hir_local_world_create(B.D))) return 1;
  if (B.hang_s < 0) B.hang_s = B.gpu ? 180 : 0; /* the CPU's rows take minutes */
  if (B.hang_s > 0) {
    pthread_t watch;
    if (pthread_create(&watch, NULL, hang_watch, &B) == 0) pthread_detach(watch);
  }
  for (i = 0; i < nshapes; i++) {
    B.sh = shapes[i];
    failed += bench_shape(&B, streams, nstreams, chunks, nchunks, parts, nparts, column_parts, ncolumn_parts);
  }
#ifdef HOSTIR_CUDA
  hir_nccl_world_free(B.nccl);
  if (B.pbuf) cudaFree(B.pbuf);
  if (B.pstream) cudaStreamDestroy((cudaStream_t)B.pstream);
  hir_nccl_comm_free(B.pcomm);
#endif
  hir_local_world_free(B.local);
  for (i = 0; i < MAXR; i++)
    if (B.plan_file[i]) fclose(B.plan_file[i]);
  printf("%s\n", failed ? "some pipelines FAILED or were WRONG" : "every pipeline ran and matched serial");
  return failed != 0;
}
