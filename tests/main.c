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

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  hir_run_tests(TEST_CPU, argc > 1 ? argv[1] : NULL, "", 0, &passed, &failed);
  if (hir_tests_lost) printf("FAIL %d tests were not registered: raise the size of hir_tests in tests/test.h\n", hir_tests_lost), failed++;
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
