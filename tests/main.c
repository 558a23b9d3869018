/* The test runner: one translation unit holding the implementation and every
   test file. Prints one line per test; the last line is "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp */
#define HOSTIR_IMPLEMENTATION
#include "dlpack_abi.h" /* before hostir.h: the DLPack functions */
#include "../hostir.h"
#include "test.h"
#include <math.h>
#include <unistd.h>

int hir_test_failures;

#include "test_build.c"
#include "test_print.c"
#include "test_lower.c"
#include "test_eval.c"
#include "test_stream.c"
#include "test_dlpack.c"

static const hir_test all_tests[] = {BUILD_TESTS PRINT_TESTS LOWER_TESTS EVAL_TESTS STREAM_TESTS DLPACK_TESTS};

int main(int argc, char **argv) {
  int i, passed = 0, failed = 0, n = (int)(sizeof all_tests / sizeof all_tests[0]);
  for (i = 0; i < n; i++) {
    if (argc > 1 && !strstr(all_tests[i].name, argv[1])) continue;
    hir_test_failures = 0;
    all_tests[i].fn();
    printf("%s %s\n", hir_test_failures ? "FAIL" : "ok  ", all_tests[i].name);
    fflush(stdout);
    if (hir_test_failures) failed++; else passed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
