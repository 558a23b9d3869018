/* The test runner: one translation unit holding the implementation and every
   test file; each test registers itself (TEST in test.h). Prints one line per
   test; the last line is "N passed, N failed". An argument runs only the
   tests whose name holds it. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp */
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
#include "test_ops.c"
#include "test_reshard.c"
#include "test_split.c"

#include <unistd.h>

/* The Python package's CPU tests (python/tests/test_cpu.py) against the
   library `make test` builds for them (build/hostir_native.so): said and
   skipped where that library, python3 or numpy is missing. */
TEST(test_python_package, "python/package", TEST_CPU) {
  char line[1024], last[1024] = "", cmd[1200], cwd[900];
  FILE *p;
  int status;
  if (access("build/hostir_native.so", R_OK) != 0 || !getcwd(cwd, sizeof cwd)) {
    printf("  skipped: build/hostir_native.so is not built (make test builds it)\n");
    return;
  }
  if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    printf("  skipped: no python3 with numpy (pip install numpy)\n");
    return;
  }
  snprintf(cmd, sizeof cmd, "HOSTIR_NATIVE='%s/build/hostir_native.so' python3 python/tests/test_cpu.py 2>&1", cwd);
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

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  hir_run_tests(TEST_CPU, argc > 1 ? argv[1] : NULL, "", 0, &passed, &failed);
  if (hir_tests_lost) printf("FAIL %d tests were not registered: raise the size of hir_tests in tests/test.h\n", hir_tests_lost), failed++;
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
