/* The fusions of the seed documents (nvFuser's tests), built with hostir.
   Each builds into `f` (a fusion, or a program's IR) and fills s->t[] with
   its tensors in creation order; `mesh` is the device mesh of the
   multi-device ones. Later tests lower and run the same fusions. */
#ifndef HIR_TEST_SEEDS_H
#define HIR_TEST_SEEDS_H
#include "../hostir.h"

typedef struct seed {
  hir_fusion *f;
  hir_tv *t[8];
  int nt;
} seed;

static void seed_begin(seed *s, hir_fusion *f) {
  memset(s, 0, sizeof *s);
  s->f = f;
}

static hir_tv *seed_tv(seed *s, hir_tv *tv) { return s->t[s->nt++] = tv; }

static void seed_mesh_all(seed *s, int nmesh, const int *mesh) {
  int i;
  for (i = 0; i < s->nt; i++) hir_set_mesh(s->t[i], nmesh, mesh);
}

/* 001: SingleSetOp: T1 = set(T0), T1 stream-parallel on axis 0. */
static void seed_single_set_op(seed *s, hir_fusion *f) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_set(s->f, s->t[0]));
  hir_output(s->f, s->t[1]);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
}

/* 001: TwoSetOps: T1 = set(T0), T2 = set(T1), both stream-parallel. */
static void seed_two_set_ops(seed *s, hir_fusion *f) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_set(s->f, s->t[0]));
  seed_tv(s, hir_set(s->f, s->t[1]));
  hir_output(s->f, s->t[2]);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
  hir_parallelize(s->t[2], 0, HIR_STREAM);
}

/* 001: ThreeSetOpsWithDisjointsForLoops: T2 is not stream-parallel. */
static void seed_three_set_ops(seed *s, hir_fusion *f) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_set(s->f, s->t[0]));
  seed_tv(s, hir_set(s->f, s->t[1]));
  seed_tv(s, hir_set(s->f, s->t[2]));
  hir_output(s->f, s->t[3]);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
  hir_parallelize(s->t[3], 0, HIR_STREAM);
}

/* 004: Allgather per chunk: T0 [S, DIDx], T1 = set(T0) [Stream, D]. */
static void seed_allgather(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_set(s->f, s->t[0]));
  hir_output(s->f, s->t[1]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
}

/* 004: Allreduce per chunk: T1 = sum(T0 [S, DIDx, N], {1}). */
static void seed_allreduce(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  int axis = 1;
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 3));
  seed_tv(s, hir_sum(s->f, s->t[0], 1, &axis));
  hir_output(s->f, s->t[1]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
}

/* 004: ReduceScatter per chunk: T1 = sum(T0 [S, DIDx, M, N], {1}), T1's M on DIDx. */
static void seed_reduce_scatter(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  int axis = 1;
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 4));
  seed_tv(s, hir_sum(s->f, s->t[0], 1, &axis));
  hir_output(s->f, s->t[1]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
  hir_parallelize(s->t[1], 2, HIR_DIDX);
}

/* 004: AG_matmul: T2 = matmul(T0 [S, DIDx, M, K], T1 [K, N]) stream-parallel on S. */
static void seed_ag_matmul(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 4));
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_matmul(s->f, s->t[0], s->t[1]));
  hir_output(s->f, s->t[2]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[2], 0, HIR_STREAM);
}

/* 004: matmul_AR: T2 = matmul(T0 [S, DIDx, M, K/D], T1 [DIDx, K/D, N]), T3 = sum(T2, {1}). */
static void seed_matmul_ar(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  int axis = 1;
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 4));
  seed_tv(s, hir_input(s->f, HIR_F32, 3));
  seed_tv(s, hir_matmul(s->f, s->t[0], s->t[1]));
  seed_tv(s, hir_sum(s->f, s->t[2], 1, &axis));
  hir_output(s->f, s->t[3]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_DIDX);
  hir_parallelize(s->t[2], 0, HIR_STREAM);
  hir_parallelize(s->t[2], 1, HIR_DIDX);
  hir_parallelize(s->t[3], 0, HIR_STREAM);
}

/* 004: matmul_RS_through_bcast: T2 = broadcast(T1 [DIDx, K/D, N]),
   T3 = matmul(T0 [S, DIDx, M/D.., M, K/D], T2), T4 = sum(T3, {1}) scattered on M/D. */
static void seed_matmul_rs_through_bcast(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  int axis = 1, flags[5] = {1, 0, 1, 0, 0};
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 5));
  seed_tv(s, hir_input(s->f, HIR_F32, 3));
  seed_tv(s, hir_broadcast(s->f, s->t[1], 5, flags));
  seed_tv(s, hir_matmul(s->f, s->t[0], s->t[2]));
  seed_tv(s, hir_sum(s->f, s->t[3], 1, &axis));
  hir_output(s->f, s->t[4]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 1, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_DIDX);
  hir_parallelize(s->t[2], 1, HIR_DIDX);
  hir_parallelize(s->t[3], 0, HIR_STREAM);
  hir_parallelize(s->t[3], 1, HIR_DIDX);
  hir_parallelize(s->t[4], 0, HIR_STREAM);
  hir_parallelize(s->t[4], 2, HIR_DIDX);
}

/* 003: AllgatherP2p: T0 [DIDx, N], T1 = set(T0) [Stream, N]. */
static void seed_allgather_p2p(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_set(s->f, s->t[0]));
  hir_output(s->f, s->t[1]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 0, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_STREAM);
}

/* 003: AG_matmul_P2p: T2 = matmul(T0 [DIDx, M/D, K], T1 [K, N]) [Stream, M/D, N, rK]. */
static void seed_ag_matmul_p2p(seed *s, hir_fusion *f, int nmesh, const int *mesh) {
  seed_begin(s, f);
  seed_tv(s, hir_input(s->f, HIR_F32, 3));
  seed_tv(s, hir_input(s->f, HIR_F32, 2));
  seed_tv(s, hir_matmul(s->f, s->t[0], s->t[1]));
  hir_output(s->f, s->t[2]);
  seed_mesh_all(s, nmesh, mesh);
  hir_parallelize(s->t[0], 0, HIR_DIDX);
  hir_parallelize(s->t[2], 0, HIR_STREAM);
}

/* ---- fusions across meshes, shared by the lowering and evaluator tests ---- */
/* Gather, SendRecv, Broadcast and Reduce between meshes {0..3}, {4..7}, {2}, {5}. */
static hir_fusion *cross_mesh_fusion(void) {
  hir_fusion *f = hir_fusion_create();
  int A[4] = {0, 1, 2, 3}, B[4] = {4, 5, 6, 7}, two = 2, five = 5, axis = 0;
  hir_tv *a = hir_input(f, HIR_F32, 2);
  hir_tv *gathered = hir_set(f, a), *moved = hir_set(f, a);
  hir_tv *u = hir_input(f, HIR_F32, 2), *bcast = hir_set(f, u), *reduced = hir_sum(f, a, 1, &axis);
  hir_output(f, gathered);
  hir_output(f, moved);
  hir_output(f, bcast);
  hir_output(f, reduced);
  hir_set_mesh(a, 4, A);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_set_mesh(gathered, 4, B);
  hir_set_mesh(moved, 4, B);
  hir_parallelize(moved, 0, HIR_DIDX);
  hir_set_mesh(u, 1, &two);
  hir_set_mesh(bcast, 4, B);
  hir_set_mesh(reduced, 1, &five);
  return f;
}

/* On mesh {3 1 7 5}: a Scatter, a broadcast HostUnit, a matmul and a
   ReduceScatter; device 0 is in no mesh and gets an empty program. */
static hir_fusion *scatter_rs_fusion(void) {
  hir_fusion *f = hir_fusion_create();
  int mesh[4] = {3, 1, 7, 5}, flags[4] = {0, 1, 0, 0}, axis = 0;
  hir_tv *x = hir_input(f, HIR_F32, 4);  /* [D, D2, M, K/D], replicated */
  hir_tv *a = hir_set(f, x);             /* scattered on D */
  hir_tv *b = hir_input(f, HIR_F32, 3);  /* [DIDx(D), K/D, N] */
  hir_tv *bb = hir_broadcast(f, b, 4, flags);
  hir_tv *c = hir_matmul(f, a, bb);      /* [DIDx(D), D2, M, N, rK] */
  hir_tv *d = hir_sum(f, c, 1, &axis);   /* [rD, DIDx(D2), M, N] */
  hir_output(f, d);
  hir_set_mesh(x, 4, mesh);
  hir_set_mesh(a, 4, mesh);
  hir_set_mesh(b, 4, mesh);
  hir_set_mesh(d, 4, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_parallelize(b, 0, HIR_DIDX);
  hir_parallelize(d, 1, HIR_DIDX);
  return f;
}

/* ---- the seeds' host programs, built by hand as nvFuser lowers them ---- */
/* The stream scaffolding of docs/DESIGN.md section 3, step 4, built by hand. */
typedef struct streams {
  hir_program *p;
  hir_stream *caller, *pool;
  hir_val *idx;
} streams;

static streams stream_prologue(hir_program *p, hir_tv *loop_tv) {
  hir_fusion *f = hir_program_fusion(p);
  hir_scope *top = hir_program_body(p);
  hir_expr *sync;
  streams s;
  s.p = p;
  s.caller = hir_stream_new(p);
  s.idx = hir_val_named(f, HIR_NAMED_STREAM_IDX);
  s.pool = hir_stream_indexed(p, hir_val_binary(f, HIR_SCALAR_MOD, s.idx, hir_val_named(f, HIR_NAMED_NUM_STREAMS)));
  hir_scope_append(top, hir_host_get_current_stream(p, s.caller));
  sync = hir_host_for_loop(p, loop_tv, 0);
  hir_scope_append(hir_expr_body(sync), hir_host_set_current_stream(p, s.pool));
  hir_scope_append(hir_expr_body(sync), hir_host_synchronize(p, s.caller));
  hir_scope_append(top, sync);
  return s;
}

static hir_expr *loop_begin(streams *s, hir_tv *loop_tv) {
  hir_expr *loop = hir_host_for_loop(s->p, loop_tv, 0);
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(s->p, s->pool));
  return loop;
}

static void loop_end(streams *s, hir_expr *loop) {
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(s->p, s->caller));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(s->p, s->pool));
  hir_scope_append(hir_program_body(s->p), loop);
}

static hir_tv *view(hir_expr *select) { return hir_expr_output(select, 0); }

/* IF (i == rank) copy my shard ELSE coalesced recv from / send to peer i. */
static hir_expr *p2p_exchange(streams *s, hir_tv *in, hir_tv *out_slice, hir_expr *in_slice) {
  hir_program *p = s->p;
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *ite = hir_host_if(p, hir_val_binary(f, HIR_SCALAR_EQ, s->idx, hir_val_named(f, HIR_NAMED_RANK)));
  hir_expr *end;
  hir_scope_append(hir_expr_body(ite), in_slice);
  hir_scope_append(hir_expr_body(ite), hir_host_set(p, out_slice, view(in_slice)));
  hir_scope_append(hir_expr_else(ite), hir_host_start_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_RECV, out_slice, s->idx));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_SEND, in, s->idx));
  hir_scope_append(hir_expr_else(ite), end = hir_host_end_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_wait(p, end));
  return ite;
}

static const int mesh8p[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* Seed 003, AllgatherP2p, as lowered by nvFuser. */
static hir_program *prog_allgather_p2p(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *out_slice;
  streams s;
  seed sd;
  seed_allgather_p2p(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[1]));
  s = stream_prologue(p, sd.t[1]);
  loop = loop_begin(&s, sd.t[1]);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, hir_val_const(f, 0));
  out_slice = hir_host_alias_select(p, sd.t[1], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), p2p_exchange(&s, sd.t[0], view(out_slice), in_slice));
  loop_end(&s, loop);
  return p;
}

/* Seed 003, AG_matmul_P2p: the gathered T3 feeds a matmul per chunk. */
static hir_program *prog_ag_matmul_p2p(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *buf_slice, *out_slice;
  hir_tv *gathered;
  streams s;
  seed sd;
  seed_ag_matmul_p2p(&sd, f, D, mesh);
  gathered = hir_set(f, sd.t[0]);
  hir_set_mesh(gathered, D, mesh);
  hir_parallelize(gathered, 0, HIR_STREAM);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, gathered));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[2]));
  s = stream_prologue(p, gathered);
  loop = loop_begin(&s, gathered);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, hir_val_const(f, 0));
  buf_slice = hir_host_alias_select(p, gathered, 0, s.idx);
  hir_scope_append(hir_expr_body(loop), buf_slice);
  hir_scope_append(hir_expr_body(loop), p2p_exchange(&s, sd.t[0], view(buf_slice), in_slice));
  out_slice = hir_host_alias_select(p, sd.t[2], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), hir_host_matmul(p, view(out_slice), view(buf_slice), sd.t[1]));
  loop_end(&s, loop);
  return p;
}

/* Seed 004, Allgather: a collective per chunk. */
static hir_program *prog_allgather_collective(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *out_slice, *comm;
  streams s;
  seed sd;
  seed_allgather(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[1]));
  s = stream_prologue(p, sd.t[1]);
  loop = loop_begin(&s, sd.t[1]);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, s.idx);
  out_slice = hir_host_alias_select(p, sd.t[1], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), in_slice);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), hir_host_allocate(p, view(out_slice)));
  comm = hir_host_communication(p, HIR_COLL_ALLGATHER, D, mesh, 0, view(in_slice), view(out_slice));
  hir_scope_append(hir_expr_body(loop), comm);
  hir_scope_append(hir_expr_body(loop), hir_host_wait(p, comm));
  loop_end(&s, loop);
  (void)f;
  return p;
}

/* Seed 004, matmul_RS_through_bcast: a PostOnStream of a broadcast HostUnit,
   a matmul and a ReduceScatter per chunk, then Deallocates. */
static hir_program *prog_post_on_stream(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *a, *b, *mm, *rs_out, *comm;
  streams s;
  seed sd;
  seed_matmul_rs_through_bcast(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_post_on_stream(p, 1, &sd.t[1], 1, &sd.t[2]));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[3]));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[4]));
  s = stream_prologue(p, sd.t[3]);
  loop = loop_begin(&s, sd.t[3]);
  hir_scope_append(hir_expr_body(loop), a = hir_host_alias_select(p, sd.t[0], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), b = hir_host_alias_select(p, sd.t[2], 0, hir_val_const(f, 0)));
  hir_scope_append(hir_expr_body(loop), mm = hir_host_alias_select(p, sd.t[3], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), hir_host_matmul(p, view(mm), view(a), view(b)));
  hir_scope_append(hir_expr_body(loop), rs_out = hir_host_alias_select(p, sd.t[4], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), hir_host_allocate(p, view(rs_out)));
  comm = hir_host_communication(p, HIR_COLL_REDUCESCATTER, D, mesh, 0, view(mm), view(rs_out));
  hir_scope_append(hir_expr_body(loop), comm);
  hir_scope_append(hir_expr_body(loop), hir_host_wait(p, comm));
  loop_end(&s, loop);
  hir_scope_append(hir_program_body(p), hir_host_deallocate(p, sd.t[2]));
  hir_scope_append(hir_program_body(p), hir_host_deallocate(p, sd.t[3]));
  return p;
}

#endif
