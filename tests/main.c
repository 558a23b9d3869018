/* The test runner: one translation unit holding the implementation and every
   test file; each test registers itself (TEST in test.h). Prints one line per
   test; the last line is "N passed, N failed". An argument runs only the
   tests whose name holds it. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp */
#include <pthread.h>
/* Thread creation a test can make fail (hir_spmd/rank_cannot_start): after
   test_threads_left more threads, pthread_create's EAGAIN. */
static int test_threads_left = -1;
static int test_thread_create(pthread_t *thread, void *(*fn)(void *), void *arg) {
  if (test_threads_left == 0) return 11;
  if (test_threads_left > 0) test_threads_left--;
  return pthread_create(thread, NULL, fn, arg);
}
#define HIR_THREAD_CREATE test_thread_create
#define HOSTIR_IMPLEMENTATION
#include "dlpack_abi.h" /* before hostir.h: the DLPack functions */
#include "../hostir.h"
#include "test.h"

#include "test_build.c"
#include "test_print.c"
#include "test_lower.c"
#include "test_eval.c"
#include "test_stream.c"
#include "test_dlpack.c"
#include "test_robust.c"
#include "test_diff.c"
#include "test_tune.c"
#include "test_files.c"
#include "test_ops.c"
#include "test_attention.c"
#include "test_moe.c"
#include "test_reshard.c"
#include "test_split.c"
#include "test_fp8.c"
#include "test_mesh2d.c"
#include "test_protocol.c"

#include <unistd.h>

/* A script of python/tests run against the library `make test` builds for
   it (build/hostir_native.so), by $HOSTIR_PYTHON (default python3): said
   and skipped where that library, the Python or a module it needs is
   missing. Its last line is "N passed, N failed". */
static void python_suite(const char *script, const char *module) {
  char line[1024], last[1024] = "", cmd[1400], cwd[900];
  const char *py = getenv("HOSTIR_PYTHON") ? getenv("HOSTIR_PYTHON") : "python3";
  FILE *p;
  int status;
  if (access("build/hostir_native.so", R_OK) != 0 || !getcwd(cwd, sizeof cwd)) {
    printf("  skipped: build/hostir_native.so is not built (make test builds it)\n");
    hir_test_skipped = 1;
    return;
  }
  snprintf(cmd, sizeof cmd, "%s -c 'import %s' >/dev/null 2>&1", py, module);
  if (system(cmd) != 0) {
    printf("  skipped: %s has no %s (pip install %s, or name another Python in HOSTIR_PYTHON)\n", py, module, module);
    hir_test_skipped = 1;
    return;
  }
  snprintf(cmd, sizeof cmd, "HOSTIR_NATIVE='%s/build/hostir_native.so' %s python/tests/%s 2>&1", cwd, py, script);
  if (!(p = popen(cmd, "r"))) {
    CHECK(p != NULL);
    return;
  }
  while (fgets(line, sizeof line, p)) {
    if (strstr(line, "FAIL") || strstr(line, "Error") || strstr(line, "Traceback")) fprintf(stderr, "  %s", line);
    snprintf(last, sizeof last, "%s", line);
  }
  status = pclose(p);
  if (status != 0 || !strstr(last, " passed, 0 failed")) fprintf(stderr, "  python: %s", last);
  CHECK(status == 0 && strstr(last, " passed, 0 failed") && strncmp(last, "0 passed", 8) != 0);
}

/* The package on numpy: fusions built, lowered, printed, run over ranks. */
TEST(test_python_package, "python/package", TEST_CPU) { python_suite("test_cpu.py", "numpy"); }

/* hostir.torch's ops on CPU tensors, 3 ranks as threads of torch's threaded
   process group: forward and backward against torch's whole-problem result. */
TEST(test_python_torch, "python/torch", TEST_CPU) { python_suite("test_torch.py --threads 3", "torch"); }

/* A rank whose thread cannot start: hir_spmd says so at once and runs no
   rank (the others would wait out the world's timeout for it). */
static hir_status count_rank(int rank, void *user) {
  (void)rank;
  __atomic_add_fetch((int *)user, 1, __ATOMIC_RELAXED);
  return HIR_OK;
}

TEST(test_spmd_rank_cannot_start, "spmd/rank_cannot_start", TEST_CPU) {
  int ran = 0;
  double t0 = hir__now_ms();
  test_threads_left = 2; /* ranks 0 and 1 start, rank 2 cannot */
  CHECK(hir_spmd(4, count_rank, &ran) == HIR_ERR_BACKEND);
  test_threads_left = -1;
  CHECK(ran == 0 && hir__now_ms() - t0 < 1000);
  CHECK(hir_spmd(4, count_rank, &ran) == HIR_OK && ran == 4);
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  hir_run_tests(TEST_CPU, argc > 1 ? argv[1] : NULL, "", 0, &passed, &failed);
  if (hir_tests_lost) printf("FAIL %d tests were not registered: raise the size of hir_tests in tests/test.h\n", hir_tests_lost), failed++;
  if (hir_tests_skipped) printf("%d skipped (their tools are missing here; each says which)\n", hir_tests_skipped);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
