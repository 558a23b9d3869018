/* What every benchmark needs: a monotonic clock and a sort order for medians;
   with CUDA, the failure message and a CUDA call's status into it. */
#ifndef HIR_BENCH_H
#define HIR_BENCH_H
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#ifdef HOSTIR_CUDA
#include <cuda_runtime.h>
#include <stdio.h>
static char failure[1200]; /* what went wrong, for the bench's last line */
static inline int cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  snprintf(failure, sizeof failure, "%s: %s", what, cudaGetErrorString(e));
  cudaGetLastError();
  return 0;
}
#endif
#endif
