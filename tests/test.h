/* A minimal test harness: CHECK records a failure and goes on; the runner in
   main.c prints one line per test and "N passed, N failed" last. */
#ifndef HIR_TEST_H
#define HIR_TEST_H
#include <stdio.h>
#include <string.h>

extern int hir_test_failures; /* failures of the running test */

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      hir_test_failures++;                                                       \
    }                                                                            \
  } while (0)

#define CHECK_STR(got, want)                                                           \
  do {                                                                                 \
    const char *g_ = (got), *w_ = (want);                                              \
    if (strcmp(g_, w_) != 0) {                                                         \
      fprintf(stderr, "  %s:%d: got  \"%s\"\n  %*s want \"%s\"\n", __FILE__, __LINE__, g_, \
              (int)strlen(__FILE__) + 6, "", w_);                                      \
      hir_test_failures++;                                                             \
    }                                                                                  \
  } while (0)

#ifndef HIR_TEST_DIR
#define HIR_TEST_DIR "tests"
#endif

typedef struct hir_test { const char *name; void (*fn)(void); } hir_test;

#endif
