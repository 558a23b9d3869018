/* A host program built by hand (no lowering): out = in, chunk by chunk, each
   chunk's copy on one of numberOfStreams streams, the caller's stream
   waiting for them all at the end. Printed, checked by the verifier, then
   run on the CPU backend and compared with its input. */
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include <stdlib.h>

enum { ROWS = 8, COLS = 5 };

int main(void) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *in = hir_input(f, HIR_F32, 2), *out = hir_set(f, in);
  hir_val *i = hir_val_named(f, HIR_NAMED_STREAM_IDX);
  hir_stream *caller = hir_stream_new(p);
  hir_stream *pool = hir_stream_indexed(p, hir_val_binary(f, HIR_SCALAR_MOD, i, hir_val_named(f, HIR_NAMED_NUM_STREAMS)));
  hir_expr *loop, *src, *dst;
  hir_evaluator *ev;
  hir_tensor tin = {0}, tout = {0};
  float x[ROWS * COLS];
  int k, wrong = 0;

  hir_output(f, out);
  hir_parallelize(out, 0, HIR_STREAM);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, out));
  hir_scope_append(hir_program_body(p), hir_host_get_current_stream(p, caller));
  loop = hir_host_for_loop(p, out, 0); /* FOR StreamIdx in the rows of out */
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, pool));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(p, caller)); /* after what the caller did before */
  hir_scope_append(hir_expr_body(loop), src = hir_host_alias_select(p, in, 0, i));  /* views, never copies */
  hir_scope_append(hir_expr_body(loop), dst = hir_host_alias_select(p, out, 0, i));
  hir_scope_append(hir_expr_body(loop), hir_host_set(p, hir_expr_output(dst, 0), hir_expr_output(src, 0)));
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, caller));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(p, pool)); /* the caller waits for the chunk */
  hir_scope_append(hir_program_body(p), loop);
  hir_program_print(p, stdout);
  if (hir_program_verify(p) != HIR_OK) {
    fprintf(stderr, "verifier: %s\n", hir_program_error(p));
    return 1;
  }

  if (hir_evaluator_create(p, NULL, &ev) != HIR_OK) { /* NULL: the CPU backend, 4 streams */
    fprintf(stderr, "evaluator: %s\n", hir_evaluator_error(ev));
    return 1;
  }
  for (k = 0; k < ROWS * COLS; k++) x[k] = (float)rand() / (float)RAND_MAX - 0.5f;
  tin.data = x;
  tin.dtype = HIR_F32;
  tin.ndims = 2;
  tin.sizes[0] = ROWS;
  tin.sizes[1] = COLS;
  if (hir_run(ev, &tin, 1, &tout, 1) != HIR_OK || hir_evaluator_sync(ev) != HIR_OK) {
    fprintf(stderr, "run: %s\n", hir_evaluator_error(ev));
    return 1;
  }
  for (k = 0; k < ROWS * COLS; k++) wrong += ((float *)tout.data)[k] != x[k];
  printf("\nRan on the CPU backend: out %s in (%d of %d elements differ)\n", wrong ? "differs from" : "equals", wrong,
         ROWS * COLS);
  hir_evaluator_free(ev);
  hir_program_free(p);
  return wrong != 0;
}
