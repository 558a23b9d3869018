/* The main example (`make run`): the fusion of an allgather + matmul, sharded
   over 4 devices and pipelined over streams, and the host program that
   overlaps the two, built by hand with hostir's host-IR builder and printed. */
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"

int main(void) {
  enum { D = 4 };
  const int mesh[D] = {0, 1, 2, 3};
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_scope *top = hir_program_body(p);
  hir_tv *a, *b, *c, *gathered, *a0, *g_i, *c_i;
  hir_val *i, *zero;
  hir_stream *caller, *pool;
  hir_expr *sync, *loop, *ite, *end, *in_slice, *buf_slice, *out_slice;
  int t;

  /* The fusion: A [DIDx(D), M/D, K] x B [K, N] -> C [Stream(D), M/D, N]. */
  a = hir_input(f, HIR_BF16, 3);
  b = hir_input(f, HIR_BF16, 2);
  c = hir_matmul(f, a, b);
  hir_output(f, c);
  gathered = hir_set(f, a); /* the gathered A, one slice per stream step */
  hir_tv *all[4] = {a, b, c, gathered};
  for (t = 0; t < 4; t++) hir_set_mesh(all[t], D, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_parallelize(c, 0, HIR_STREAM);
  hir_parallelize(gathered, 0, HIR_STREAM);
  if (hir_fusion_error(f)[0]) {
    fprintf(stderr, "fusion: %s\n", hir_fusion_error(f));
    return 1;
  }

  /* The host program: step i receives A's shard from device i while the
     matmul of step i-1 runs on another stream. */
  i = hir_val_named(f, HIR_NAMED_STREAM_IDX);
  zero = hir_val_const(f, 0);
  caller = hir_stream_new(p);
  pool = hir_stream_indexed(p, hir_val_binary(f, HIR_SCALAR_MOD, i, hir_val_named(f, HIR_NAMED_NUM_STREAMS)));
  hir_scope_append(top, hir_host_allocate(p, gathered));
  hir_scope_append(top, hir_host_allocate(p, c));
  hir_scope_append(top, hir_host_get_current_stream(p, caller));
  sync = hir_host_for_loop(p, gathered, 0);
  hir_scope_append(hir_expr_body(sync), hir_host_set_current_stream(p, pool));
  hir_scope_append(hir_expr_body(sync), hir_host_synchronize(p, caller));
  hir_scope_append(top, sync);

  loop = hir_host_for_loop(p, gathered, 0);
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, pool));
  in_slice = hir_host_alias_select(p, a, 0, zero);
  buf_slice = hir_host_alias_select(p, gathered, 0, i);
  a0 = hir_expr_output(in_slice, 0);
  g_i = hir_expr_output(buf_slice, 0);
  hir_scope_append(hir_expr_body(loop), buf_slice);
  ite = hir_host_if(p, hir_val_binary(f, HIR_SCALAR_EQ, i, hir_val_named(f, HIR_NAMED_RANK)));
  hir_scope_append(hir_expr_body(ite), in_slice);
  hir_scope_append(hir_expr_body(ite), hir_host_set(p, g_i, a0));
  hir_scope_append(hir_expr_else(ite), hir_host_start_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_RECV, g_i, i));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_SEND, a, i));
  hir_scope_append(hir_expr_else(ite), end = hir_host_end_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_wait(p, end));
  hir_scope_append(hir_expr_body(loop), ite);
  out_slice = hir_host_alias_select(p, c, 0, i);
  c_i = hir_expr_output(out_slice, 0);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), hir_host_matmul(p, c_i, g_i, b));
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(p, caller));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(p, pool));
  hir_scope_append(top, loop);
  hir_scope_append(top, hir_host_deallocate(p, gathered));
  if (hir_program_error(p)[0]) {
    fprintf(stderr, "program: %s\n", hir_program_error(p));
    return 1;
  }

  printf("The fusion:\n\n");
  hir_fusion_print(f, stdout);
  printf("\nIts host program (a P2P allgather overlapped with the matmul):\n");
  hir_program_print(p, stdout);
  hir_program_free(p);
  return 0;
}
