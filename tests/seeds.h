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

#endif
