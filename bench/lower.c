/* How long hir_lower takes on a large fusion: a chain of 10,000 exprs, adds
   with a resharding set (an Allgather or a Scatter) every 50th, over 8
   devices. Target: under 100 ms. Prints medians of 11 runs. */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include "bench.h"

int main(int argc, char **argv) {
  enum { RUNS = 11 };
  const int mesh[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int nexprs = argc > 1 ? atoi(argv[1]) : 10000, i, sharded = 1, top = 0, comms = 0;
  double t[RUNS], t_build;
  hir_fusion *f = hir_fusion_create();
  hir_tv *x;
  hir_lower_desc desc;
  double t0 = now_ms();
  x = hir_input(f, HIR_F32, 3);
  hir_set_mesh(x, 8, mesh);
  hir_parallelize(x, 0, HIR_DIDX);
  for (i = 1; i < nexprs; i++) {
    if (i % 50 == 0) { /* toggle the sharding: Allgather, then Scatter */
      x = hir_set(f, x);
      hir_set_mesh(x, 8, mesh);
      sharded = !sharded;
      if (sharded) hir_parallelize(x, 0, HIR_DIDX);
    } else {
      x = hir_add(f, x, x);
    }
  }
  hir_output(f, hir_set(f, x));
  t_build = now_ms() - t0;
  if (hir_fusion_error(f)[0]) {
    fprintf(stderr, "bench/lower: %s\n", hir_fusion_error(f));
    return 1;
  }
  memset(&desc, 0, sizeof desc);
  desc.my_device = 3;
  for (i = 0; i < RUNS; i++) {
    hir_program *p;
    double s = now_ms();
    hir_status st = hir_lower(f, &desc, &p);
    t[i] = now_ms() - s;
    if (st != HIR_OK) {
      fprintf(stderr, "bench/lower: %s\n", hir_program_error(p));
      return 1;
    }
    top = hir_program_ntop(p);
    comms = 0;
    for (int k = 0; k < top; k++) comms += hir_expr_kind_of(hir_program_top(p, k)) == HIR_EXPR_COMMUNICATION;
    hir_program_free(p);
  }
  qsort(t, RUNS, sizeof t[0], cmp_double);
  printf("hir_lower on a chain of %d exprs (8 devices, lowered for device 3; medians of %d)\n\n", nexprs, RUNS);
  printf("| exprs | top-level exprs | communications | build fusion ms | hir_lower ms | per expr us | target ms | lower/target |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  printf("| %d | %d | %d | %.2f | %.2f | %.2f | 100 | %.2f |\n", nexprs, top, comms, t_build, t[RUNS / 2],
         t[RUNS / 2] * 1e3 / nexprs, t[RUNS / 2] / 100.0);
  hir_fusion_free(f);
  return 0;
}
