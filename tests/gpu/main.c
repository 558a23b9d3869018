/* make test-gpu: the CUDA backend against the CPU backend op by op, then the
   seed programs and every collective through NCCL on the visible GPUs: one
   process with a thread per GPU, or (with --processes, under torchrun,
   mpirun or srun) one process per GPU. The cases are the CPU suite's, on
   another platform. The last line is "N passed, N failed". */
#define _GNU_SOURCE /* syscall, tgkill: the hang watchdog */
#ifndef HOSTIR_CUDA
#define HOSTIR_CUDA
#endif
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../../hostir_nccl.h"
#include "../test.h"
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_build.c"
#include "../test_print.c"
#include "../test_lower.c"
#include "../test_eval.c"
#include "../test_stream.c"
#include "../test_tune.c"
#include "../test_ops.c"
#include "../test_attention.c"
#include "../test_moe.c"
#include "../test_reshard.c"
#include "../test_split.c"
#include "../test_fp8.c"
#include "../test_mesh2d.c"
#include "../test_diff.c"

#include "backend.c"
#include "platforms.c"
#include "kernel_collectives.c"
#include "callers_nccl.c"
#include "staged_ranks.c"
#include "ce_pair.c"

/* A test that makes no progress (ends no case, no step) for HOSTIR_TEST_HANG_S
   seconds (default 120) is a hang: every thread of the process prints its
   stack to stderr (resolve the
   "test-gpu(+0x...)" frames with addr2line -e build/test-gpu), then the
   process ends with status 3, so a stage's log names the test and where it
   waits instead of a silent timeout. */
static void hang_dump_thread(int sig) {
  void *frames[48];
  char head[64];
  int n = backtrace(frames, 48), len = snprintf(head, sizeof head, "-- thread %ld:\n", (long)syscall(SYS_gettid));
  (void)sig;
  if (write(2, head, (size_t)len) < 0) return;
  backtrace_symbols_fd(frames, n, 2);
}

static void *hang_watchdog(void *arg) {
  double limit_ms = *(double *)arg, since = hir__now_ms();
  int progress = -1;
  for (;;) {
    hir_nccl__sleep_ms(500);
    if (hir_test_serial + hir_test_steps + cases_run + cases_skipped != progress || !hir_test_running) {
      progress = hir_test_serial + hir_test_steps + cases_run + cases_skipped, since = hir__now_ms();
      continue;
    }
    if (hir__now_ms() - since > limit_ms) {
      DIR *tasks = opendir("/proc/self/task");
      struct dirent *e;
      fprintf(stderr, "HANG %s: still running after %.0f s; the stacks of this process's threads:\n", hir_test_running,
              limit_ms / 1000);
      signal(SIGUSR2, hang_dump_thread);
      while (tasks && (e = readdir(tasks))) {
        long tid = atol(e->d_name);
        if (tid > 0 && tid != (long)syscall(SYS_gettid)) syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR2), hir_nccl__sleep_ms(50);
      }
      if (tasks) closedir(tasks);
      printf("FAIL %s: hung\n", hir_test_running);
      fflush(stdout);
      _exit(3);
    }
  }
  return NULL;
}

static void hang_watchdog_start(void) {
  static double limit_ms;
  const char *v = getenv("HOSTIR_TEST_HANG_S");
  pthread_t t;
  limit_ms = 1000.0 * (v && atof(v) > 0 ? atof(v) : 120);
  if (pthread_create(&t, NULL, hang_watchdog, &limit_ms) == 0) pthread_detach(t);
}

int main(int argc, char **argv) {
  int ngpu = 0, passed = 0, failed = 0, i;
  int processes = argc > 1 && !strcmp(argv[1], "--processes");
  const char *filter = argc > (processes ? 2 : 1) && argv[processes ? 2 : 1][0] != '-' ? argv[processes ? 2 : 1]
                       : argc > 3 && processes ? argv[3] : NULL;
  char prefix[32] = "", err[256];
  const char *part = getenv("HOSTIR_TEST_PART");
  static test_platform gpu = {"cuda+nccl threads", 1, 1, gpu_world_create, gpu_world_keep, gpu_comm, gpu_backend, hir_spmd, 0, 0};
  static test_platform mp = {"cuda+nccl processes", 1, 1, mp_world, gpu_world_keep, mp_comm_of, mp_backend, mp_run, 0, 0};
  static test_platform graphs = {"cuda+nccl threads, CUDA graphs", 1, 1, gpu_world_create, gpu_world_keep, gpu_comm, gpu_backend,
                                 hir_spmd, 0, 1};
  static test_platform staged = {"cuda+nccl threads, CUDA graphs on staged arguments", 1, 1, gpu_world_create, gpu_world_keep,
                                 gpu_comm, gpu_backend, hir_spmd, 0, 2};
  setvbuf(stdout, NULL, _IOLBF, 0); /* a stage's log shows each test as it ends, also under a pipe */
  if (argc > 1 && !strcmp(argv[1], "--ce-pair")) { /* before CUDA is touched: the ranks are forked */
    int ok = ce_pair(argc > 2 && !strcmp(argv[2], "--dead-peer") ? 1 : argc > 2 && !strcmp(argv[2], "--dead-peer-replay") ? 2 : 0);
    printf("%d passed, %d failed\n", ok, !ok);
    return ok ? 0 : 1;
  }
  hang_watchdog_start();
  if (part) { /* "k/n": part k (1..n) of the one-process stage (tests/gpu/run.sh, TEST_GPU_PARTS) */
    if (sscanf(part, "%d/%d", &hir_test_part, &hir_test_parts) != 2 || hir_test_part < 1 || hir_test_part > hir_test_parts) {
      printf("test-gpu: HOSTIR_TEST_PART=%s is not k/n with 1 <= k <= n\n0 passed, 1 failed\n", part);
      return 1;
    }
    hir_test_part--;
  }
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    printf("test-gpu: no GPU visible\n0 passed, 1 failed\n");
    return 1;
  }
  if (!processes) {
    printf("test-gpu: %d GPUs, one process, a thread per GPU\n", ngpu);
    hir_run_tests(TEST_GPU, filter, "", 1, &passed, &failed);
    gpu.max_world = ngpu < MAXR ? ngpu : MAXR;
    platform = &gpu;
    hir_run_tests(TEST_GPU_WORLDS, filter, "", 1, &passed, &failed);
    graphs.max_world = gpu.max_world; /* the pipelines again as CUDA graphs: captured, replayed, inputs moved */
    platform = &graphs;
    printf("test-gpu: the same programs as CUDA graphs\n");
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "graph ", 1, &passed, &failed);
    gpu_copy_engine = 1; /* and with send/recv on the copy engines: captured receives on graph words */
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "graph ce ", 1, &passed, &failed);
    gpu_copy_engine = 0;
    if (!filter) hir_run_tests(TEST_GPU_WORLDS, "eval/", "graph ", 1, &passed, &failed);
    staged.max_world = gpu.max_world; /* graph mode 2: communicating pipelines too, at new addresses */
    platform = &staged;
    printf("test-gpu: the pipelines as CUDA graphs on staged arguments\n");
    hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", "staged ", 1, &passed, &failed);
    platform = &staged_ranks; /* every world size on any machine: the CUDA backend's side of multi-rank cases */
    printf("test-gpu: %d-%d ranks as threads on GPU 0, their messages staged through host memory\n", staged_ranks.min_world,
           staged_ranks.max_world);
    hir_run_tests(TEST_GPU_WORLDS, filter, "ranks ", 1, &passed, &failed);
    platform = &gpu;
    hir_run_tests(TEST_GPU_THREADS, filter, "", 1, &passed, &failed);
    for (i = 0; i <= MAXR; i++) hir_nccl_world_free(gpu_worlds[i]);
  } else {
    if (hir_nccl_env_read(&mp_env, err, sizeof err) != HIR_OK) {
      printf("%s\n0 passed, 1 failed\n", err);
      return 1;
    }
    snprintf(prefix, sizeof prefix, "rank%d: ", mp_env.rank);
    int dead_exit = argc > 2 && !strcmp(argv[2], "--dead-peer-exit"), exit_live = argc > 2 && !strcmp(argv[2], "--exit-live");
    int dead = dead_exit || (argc > 2 && !strcmp(argv[2], "--dead-peer")), failing = argc > 2 && !strcmp(argv[2], "--failing-rank");
    int dead_replay = argc <= 2 ? 0 : !strcmp(argv[2], "--dead-peer-replay") ? 1 : !strcmp(argv[2], "--dead-peer-reshape") ? 3 : 0;
    int from_id = argc > 2 && !strcmp(argv[2], "--from-id"), lent = argc > 2 && !strcmp(argv[2], "--lent-nccl");
    const char *expect_ce = getenv("HOSTIR_TEST_COPY_ENGINE");
    ncclUniqueId id;
    ncclComm_t own = NULL;
    hir_status made;
    if ((from_id || lent) && !shared_id(&mp_env, &id)) {
      printf("%sno NCCL id from rank 0\n%s0 passed, 1 failed\n", prefix, prefix);
      return 1;
    }
    if (lent && !(own = own_nccl(&mp_env, &id))) {
      printf("%sthe caller's own NCCL communicator could not be made\n%s0 passed, 1 failed\n", prefix, prefix);
      return 1;
    }
    hir_test_running = "making the world (hir_nccl_comm_create)"; /* a hang here prints its stacks too */
    made = from_id ? hir_nccl_comm_create_from_id(mp_env.rank, mp_env.size, mp_env.local_rank, &id, 60000, &mp_comm)
         : lent    ? hir_nccl_comm_from_nccl(own, 60000, &mp_comm)
                   : hir_nccl_comm_create(&mp_env, dead || dead_replay ? 5000 : 60000, &mp_comm);
    if (made == HIR_OK && expect_ce && mp_comm->p2p_copy_engine != atoi(expect_ce)) {
      printf("%sFAIL the copy engines are %s, expected %s\n", prefix, mp_comm->p2p_copy_engine ? "on" : "off",
             atoi(expect_ce) ? "on" : "off");
      failed++;
    }
    if (made == HIR_OK && hir_nccl_comm_blocking(mp_comm) != data_path_blocking(lent)) {
      printf("%sFAIL the data path is on %s communicators, expected the other kind\n", prefix,
             hir_nccl_comm_blocking(mp_comm) ? "blocking" : "nonblocking");
      failed++;
    }
    if (made != HIR_OK) {
      printf("%s%s\n%s0 passed, 1 failed\n", prefix, mp_comm ? mp_comm->error : "no memory", prefix);
      hir_nccl_comm_free(mp_comm);
      return 1;
    }
    hir_test_running = NULL; /* the world is made; what runs next names itself */
    if (dead || dead_replay || exit_live) { /* rank 1 leaves; rank 0 must not hang (exit_live: both leave by exit()) */
      int ok;
      hir_test_running = argv[2], hir_test_serial++;
      ok = (mp_env.rank != 0 && !dead_replay && !exit_live) || dead_peer(exit_live ? 2 : dead_replay);
      printf("%s%d passed, %d failed\n", prefix, ok, !ok);
      fflush(stdout);
      if (mp_env.rank == 0 && dead_exit) exit(ok ? 0 : 1); /* as a user's process may, the aborted world alive */
      if (mp_env.rank == 0 || exit_live) _exit(ok ? 0 : 1); /* the aborted world is not torn down */
      _exit(0);
    }
    if (failing) { /* the last rank has a wrong M, then a wrong K; every rank returns within a second */
      static gpu_failing x;
      int ok, disagree;
      hir_test_running = argv[2], hir_test_serial++;
      for (ok = 1, disagree = 1; disagree >= 0; disagree--) {
        gpu_failing_begin(&x, mp_env.size, mp_env.size - 1, disagree);
        x.comm[mp_env.rank] = mp_comm;
        x.gpu[mp_env.rank] = mp_env.gpu;
        gpu_failing_rank(mp_env.rank, &x);
        ok &= gpu_failing_end(&x, mp_env.size, mp_env.rank, mp_env.rank + 1);
      }
      printf("%s%d passed, %d failed\n", prefix, ok, !ok);
      fflush(stdout);
      _exit(ok ? 0 : 1); /* the aborted world is not torn down */
    }
    mp.min_world = mp.max_world = mp_env.size;
    platform = &mp;
    if (mp_env.rank == 0)
      printf("test-gpu: %d processes, one GPU each, %s; send/recv on %s\n", mp_env.size,
             from_id ? "from the caller's NCCL id" : lent ? "on the caller's NCCL communicator" : "hostir's bootstrap",
             mp_comm->p2p_copy_engine ? "the copy engines" : "NCCL");
    hir_run_tests(TEST_GPU_WORLDS, filter, prefix, 1, &passed, &failed);
    if (!lent && !from_id) { /* as CUDA graphs: send/recv on the copy engines (graph words), then on NCCL's */
      int nccl;
      mp.graph = 1;
      for (nccl = !mp_comm->p2p_copy_engine; nccl < 2; nccl++) {
        snprintf(prefix, sizeof prefix, "rank%d graph%s: ", mp_env.rank, nccl ? "" : " ce");
        if (!nccl || hir_nccl_comm_set_copy_engine(mp_comm, 0) == HIR_OK)
          hir_run_tests(TEST_GPU_WORLDS, filter ? filter : "stream/numbers", prefix, 1, &passed, &failed);
      }
      mp.graph = 0;
    }
    hir_nccl_comm_free(mp_comm);
    if (lent) {
      int ok = lent_still_works(&mp_env, own);
      printf("%s%s the lent communicator still works after hir_nccl_comm_free\n", prefix, ok ? "ok  " : "FAIL");
      ok ? passed++ : failed++;
      ncclCommDestroy(own);
    }
  }
  if (hir_tests_lost) printf("%sFAIL %d tests were not registered (tests/test.h)\n", prefix, hir_tests_lost), failed++;
  printf("%s%d passed, %d failed\n", prefix, passed, failed);
  return failed ? 1 : 0;
}
