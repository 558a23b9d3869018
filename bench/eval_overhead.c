/* The evaluator's own cost per executed host IR node: a loop of 10,000
   iterations over 1-element chunks (CPU backend), each iteration switching
   streams, taking two views, copying and synchronizing (6 nodes). The
   baseline makes the same 10,000 backend copies directly; the difference is
   the evaluator's overhead. Target: under 1 us per node. Medians. */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include "bench.h"

int main(void) {
  enum { N = 10000, RUNS = 21, NODES_PER_ITER = 6 };
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *in = hir_input(f, HIR_F32, 2), *out = hir_set(f, in);
  hir_val *i = hir_val_named(f, HIR_NAMED_STREAM_IDX);
  hir_stream *caller = hir_stream_new(p);
  hir_stream *pool = hir_stream_indexed(p, hir_val_binary(f, HIR_SCALAR_MOD, i, hir_val_named(f, HIR_NAMED_NUM_STREAMS)));
  hir_expr *loop, *src, *dst;
  hir_evaluator *ev;
  hir_backend *b;
  hir_tensor tin, tout, v_in, v_out;
  static float xs[N], ys[N];
  double t_eval[RUNS], t_direct[RUNS], nodes;
  int r, k;
  hir_output(f, out);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, out));
  hir_scope_append(hir_program_body(p), hir_host_get_current_stream(p, caller));
  loop = hir_host_for_loop(p, out, 0);
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, pool));
  hir_scope_append(hir_expr_body(loop), src = hir_host_alias_select(p, in, 0, i));
  hir_scope_append(hir_expr_body(loop), dst = hir_host_alias_select(p, out, 0, i));
  hir_scope_append(hir_expr_body(loop), hir_host_set(p, hir_expr_output(dst, 0), hir_expr_output(src, 0)));
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, caller));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(p, pool));
  hir_scope_append(hir_program_body(p), loop);
  if (hir_evaluator_create(p, NULL, &ev) != HIR_OK) {
    fprintf(stderr, "bench/eval_overhead: %s\n", hir_evaluator_error(ev));
    return 1;
  }
  b = hir_evaluator_backend(ev);
  for (k = 0; k < N; k++) xs[k] = (float)k;
  memset(&tin, 0, sizeof tin);
  tin.data = xs;
  tin.dtype = HIR_F32;
  tin.ndims = 2;
  tin.sizes[0] = N;
  tin.sizes[1] = 1;
  tout = tin;
  tout.data = ys;
  v_in = tin;
  v_in.ndims = 1;
  v_in.sizes[0] = 1;
  v_in.strides[0] = 1;
  v_out = v_in;
  for (r = 0; r < RUNS; r++) {
    double t0 = 1e3 * now_ms();
    if (hir_run(ev, &tin, 1, &tout, 1) != HIR_OK) {
      fprintf(stderr, "bench/eval_overhead: %s\n", hir_evaluator_error(ev));
      return 1;
    }
    t_eval[r] = 1e3 * now_ms() - t0;
    t0 = 1e3 * now_ms();
    for (k = 0; k < N; k++) { /* the same copies, straight to the backend */
      v_in.data = xs + k;
      v_out.data = ys + k;
      b->copy(b, NULL, &v_out, &v_in);
    }
    t_direct[r] = 1e3 * now_ms() - t0;
  }
  for (k = 0; k < N; k++)
    if (ys[k] != (float)k) {
      fprintf(stderr, "bench/eval_overhead: wrong result at %d\n", k);
      return 1;
    }
  qsort(t_eval, RUNS, sizeof t_eval[0], cmp_double);
  qsort(t_direct, RUNS, sizeof t_direct[0], cmp_double);
  nodes = 2.0 + (double)N * (1 + NODES_PER_ITER); /* the loop counts once per iteration too */
  printf("evaluator overhead: %d iterations of %d nodes on 1-element tensors, CPU backend, medians of %d\n\n", N,
         NODES_PER_ITER, RUNS);
  printf("| executed nodes | hir_run us | direct backend calls us | run/direct | us per node | overhead us per node | target us | overhead/target |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  printf("| %.0f | %.0f | %.0f | %.2f | %.3f | %.3f | 1.0 | %.2f |\n", nodes, t_eval[RUNS / 2], t_direct[RUNS / 2],
         t_eval[RUNS / 2] / t_direct[RUNS / 2], t_eval[RUNS / 2] / nodes, (t_eval[RUNS / 2] - t_direct[RUNS / 2]) / nodes,
         (t_eval[RUNS / 2] - t_direct[RUNS / 2]) / nodes);
  hir_evaluator_free(ev);
  hir_program_free(p);
  return 0;
}
