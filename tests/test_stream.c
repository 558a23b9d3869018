/* Stream lowering: the seeds' programs (goldens; tests/seed_compare.py checks
   them against nvFuser's dumps), the numbers of every stream-lowered program
   for each schedule, bounded buffers and stream count on worlds of 1, 2, 3,
   4 and 8, the memory bounded buffers save, and the schedule verifier. */
#include "seeds.h"
#include "test.h"

typedef void (*seed_fn)(seed *s, hir_fusion *f, int nmesh, const int *mesh);
static void seed1(seed *s, hir_fusion *f, int n, const int *m) { (void)n; (void)m; seed_single_set_op(s, f); }
static void seed2(seed *s, hir_fusion *f, int n, const int *m) { (void)n; (void)m; seed_two_set_ops(s, f); }
static void seed3(seed *s, hir_fusion *f, int n, const int *m) { (void)n; (void)m; seed_three_set_ops(s, f); }

/* GEMM + P2P reduce-scatter: A [DIDx(D), D2, M, K/D] x B [DIDx(D), 1, K/D, N],
   the partial products stream-parallel over D2 and reduce-scattered on it. */
static void seed_matmul_rs_p2p(seed *s, hir_fusion *f, int n, const int *mesh) {
  int flags[4] = {0, 1, 0, 0}, axis = 0;
  seed_begin(s, f);
  seed_tv(s, hir_input(f, HIR_F32, 4));
  seed_tv(s, hir_input(f, HIR_F32, 3));
  seed_tv(s, hir_broadcast(f, s->t[1], 4, flags));
  seed_tv(s, hir_matmul(f, s->t[0], s->t[2]));
  seed_tv(s, hir_sum(f, s->t[3], 1, &axis));
  hir_output(f, s->t[4]);
  hir_set_mesh(s->t[0], n, mesh);
  hir_set_mesh(s->t[1], n, mesh);
  hir_set_mesh(s->t[4], n, mesh);
  hir_parallelize(s->t[0], 0, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_DIDX);
  hir_parallelize(s->t[3], 1, HIR_STREAM);
  hir_parallelize(s->t[4], 1, HIR_DIDX);
}
/* The same with the partial products an output too: the ring copies the own
   chunk into the partials (its producer cannot write there). */
static void seed_matmul_rs_p2p_partials_out(seed *s, hir_fusion *f, int n, const int *mesh) {
  seed_matmul_rs_p2p(s, f, n, mesh);
  hir_output(f, s->t[3]);
}

/* AG+GEMM with the weight in two column parts, written out (the program
   stream.experimental.column_parts makes of one weight): G = set(A [DIDx(D), M, K]) on
   Stream, G x W0 on Stream (the P2P allgather's loop), G x W1 once, whole,
   after it. */
static void seed_ag_split_weight(seed *s, hir_fusion *f, int n, const int *mesh) {
  seed_begin(s, f);
  seed_tv(s, hir_input(f, HIR_F32, 3));
  seed_tv(s, hir_input(f, HIR_F32, 2));
  seed_tv(s, hir_input(f, HIR_F32, 2));
  seed_tv(s, hir_set(f, s->t[0]));
  seed_tv(s, hir_matmul(f, s->t[3], s->t[1]));
  seed_tv(s, hir_matmul(f, s->t[3], s->t[2]));
  hir_output(f, s->t[4]);
  hir_output(f, s->t[5]);
  seed_mesh_all(s, n, mesh);
  hir_parallelize(s->t[0], 0, HIR_DIDX);
  hir_parallelize(s->t[3], 0, HIR_STREAM);
  hir_parallelize(s->t[4], 0, HIR_STREAM);
}

/* GEMM + reduce-scatter by column chunks (bench-overlap's "collective on
   N"): A [DIDx(D), D2, M, K] x B [DIDx(D), S, K, N], both broadcast to
   [D, S, D2, .., ..], summed over D, scattered on D2; S on Stream: a GEMM
   and a ReduceScatter per chunk of the weight's columns. */
static void seed_matmul_rs_columns(seed *s, hir_fusion *f, int n, const int *mesh) {
  int flags_a[5] = {0, 1, 0, 0, 0}, flags_b[5] = {0, 0, 1, 0, 0}, axis = 0;
  seed_begin(s, f);
  seed_tv(s, hir_input(f, HIR_F32, 4));
  seed_tv(s, hir_input(f, HIR_F32, 4));
  seed_tv(s, hir_matmul(f, hir_broadcast(f, s->t[0], 5, flags_a), hir_broadcast(f, s->t[1], 5, flags_b)));
  seed_tv(s, hir_sum(f, s->t[2], 1, &axis));
  hir_output(f, s->t[3]);
  hir_set_mesh(s->t[0], n, mesh);
  hir_set_mesh(s->t[1], n, mesh);
  hir_set_mesh(s->t[3], n, mesh);
  hir_parallelize(s->t[0], 0, HIR_DIDX);
  hir_parallelize(s->t[1], 0, HIR_DIDX);
  hir_parallelize(s->t[2], 1, HIR_STREAM);
  hir_parallelize(s->t[3], 1, HIR_STREAM);
  hir_parallelize(s->t[3], 2, HIR_DIDX);
}

static const struct {
  const char *name;
  seed_fn fn;
} seed_table[] = {
    {"SingleSetOp", seed1},        {"TwoSetOps", seed2},         {"ThreeSetOps", seed3},
    {"Allgather", seed_allgather}, {"Allreduce", seed_allreduce}, {"ReduceScatter", seed_reduce_scatter},
    {"AG_matmul", seed_ag_matmul}, {"AllgatherP2p", seed_allgather_p2p}, {"AG_matmul_P2p", seed_ag_matmul_p2p},
    {"matmul_AR", seed_matmul_ar}, {"matmul_RS_through_bcast", seed_matmul_rs_through_bcast},
};

/* Each seed lowered for device 0 of 8 prints as its golden. */
TEST(test_stream_seed_goldens, "stream/seed_goldens", TEST_CPU) {
  static const int m8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  size_t i;
  for (i = 0; i < sizeof seed_table / sizeof seed_table[0]; i++) {
    char name[64];
    seed s;
    seed_table[i].fn(&s, hir_fusion_create(), 8, m8);
    snprintf(name, sizeof name, "seed_%s", seed_table[i].name);
    check_lower_golden(s.f, 0, name, __FILE__, __LINE__);
    hir_fusion_free(s.f);
  }
}

/* matmul_AR and matmul_RS_through_bcast: the loops of docs/DESIGN.md section 3, step 4. */
TEST(test_stream_structure, "stream/structure", TEST_CPU) {
  static const int m8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  static const hir_expr_kind ar[] = {HIR_EXPR_ALLOCATE, HIR_EXPR_ALLOCATE, HIR_EXPR_GET_CURRENT_STREAM, HIR_EXPR_FOR_LOOP,
                                     HIR_EXPR_FOR_LOOP, HIR_EXPR_DEALLOCATE};
  static const hir_expr_kind rs[] = {HIR_EXPR_POST_ON_STREAM, HIR_EXPR_ALLOCATE, HIR_EXPR_ALLOCATE, HIR_EXPR_GET_CURRENT_STREAM,
                                     HIR_EXPR_FOR_LOOP, HIR_EXPR_FOR_LOOP, HIR_EXPR_DEALLOCATE, HIR_EXPR_DEALLOCATE};
  hir_lower_desc d;
  hir_program *p;
  seed s;
  int i;
  memset(&d, 0, sizeof d);
  seed_matmul_ar(&s, hir_fusion_create(), 8, m8);
  CHECK(hir_lower(s.f, &d, &p) == HIR_OK);
  CHECK(hir_program_ntop(p) == 6);
  for (i = 0; i < hir_program_ntop(p) && i < 6; i++) CHECK(hir_expr_kind_of(hir_program_top(p, i)) == ar[i]);
  { /* the loop body ends with the Allreduce, its Wait, and the stream switch back */
    hir_scope *body = hir_expr_body(hir_program_top(p, 4));
    int n = hir_scope_size(body);
    CHECK(hir_expr_kind_of(hir_scope_at(body, n - 4)) == HIR_EXPR_COMMUNICATION);
    CHECK(hir_expr_kind_of(hir_scope_at(body, n - 3)) == HIR_EXPR_WAIT);
    CHECK(hir_expr_kind_of(hir_scope_at(body, n - 2)) == HIR_EXPR_SET_CURRENT_STREAM);
    CHECK(hir_expr_kind_of(hir_scope_at(body, n - 1)) == HIR_EXPR_SYNCHRONIZE);
  }
  hir_program_free(p);
  hir_fusion_free(s.f);
  seed_matmul_rs_through_bcast(&s, hir_fusion_create(), 8, m8);
  CHECK(hir_lower(s.f, &d, &p) == HIR_OK);
  CHECK(hir_program_ntop(p) == 8);
  for (i = 0; i < hir_program_ntop(p) && i < 8; i++) CHECK(hir_expr_kind_of(hir_program_top(p, i)) == rs[i]);
  hir_program_free(p);
  hir_fusion_free(s.f);
}

/* The ring, bounded-buffer and cut programs on the mesh {3 1 7 5}, as device 7. */
TEST(test_stream_schedule_goldens, "stream/schedule_goldens", TEST_CPU) {
  static const int mesh[4] = {3, 1, 7, 5};
  hir_lower_desc d;
  seed s;
  char *text;
  memset(&d, 0, sizeof d);
  d.stream.schedule = HIR_SCHEDULE_RING;
  d.stream.bounded_buffers = 1;
  seed_ag_matmul_p2p(&s, hir_fusion_create(), 4, mesh);
  text = lower_text(s.f, &d, 7);
  check_golden(text, "stream_ag_matmul_ring_bounded_d7", __FILE__, __LINE__);
  free(text);
  hir_fusion_free(s.f);
  d.stream.bounded_buffers = 0;
  seed_matmul_rs_p2p(&s, hir_fusion_create(), 4, mesh);
  text = lower_text(s.f, &d, 7);
  check_golden(text, "stream_matmul_rs_ring_d7", __FILE__, __LINE__);
  free(text);
  d.stream.schedule = HIR_SCHEDULE_LINEAR;
  text = lower_text(s.f, &d, 7);
  check_golden(text, "stream_matmul_rs_linear_d7", __FILE__, __LINE__);
  free(text);
  d.stream.schedule = HIR_SCHEDULE_RING; /* each peer's chunk in 2 parts */
  d.stream.parts = 2;
  text = lower_text(s.f, &d, 7);
  check_golden(text, "stream_matmul_rs_ring_2parts_d7", __FILE__, __LINE__);
  free(text);
  hir_fusion_free(s.f);
  seed_ag_matmul_p2p(&s, hir_fusion_create(), 4, mesh);
  text = lower_text(s.f, &d, 7);
  check_golden(text, "stream_ag_matmul_ring_2parts_d7", __FILE__, __LINE__);
  free(text);
  hir_fusion_free(s.f);
}

/* ---- the numbers ---- */
/* y[rows, n] = x[rows, k] w[k, n] */
static void gemm_ref(const hir_tensor *x, int64_t xo, const hir_tensor *w, int64_t wo, double *y, int64_t rows, int64_t k,
                     int64_t n) {
  int64_t i, j, q;
  for (i = 0; i < rows; i++)
    for (j = 0; j < n; j++) {
      double s = 0;
      for (q = 0; q < k; q++) s += tget(x, xo + i * k + q) * tget(w, wo + q * n + j);
      y[i * n + j] += s;
    }
}

/* Fills c with random inputs for seed `which` on D devices and computes the
   expected outputs from them. */
static void seed_data(spmd_case *c, const char *which, int D) {
  int64_t S = 3, M = 3, K = 4, N = 5, s, d, j, i;
  double *y;
  if (!strcmp(which, "SingleSetOp") || !strcmp(which, "TwoSetOps") || !strcmp(which, "ThreeSetOps")) {
    int64_t sz[2] = {5, 3};
    c->in[0] = trand(HIR_F32, 2, sz);
    c->out[0] = tn(HIR_F32, 2, sz);
    memcpy(c->out[0].data, c->in[0].data, 15 * 4);
    c->nin = c->nout = 1;
  } else if (!strcmp(which, "Allgather")) {
    int64_t sz[2] = {S, D};
    c->in[0] = trand(HIR_F32, 2, sz);
    c->out[0] = tn(HIR_F32, 2, sz);
    memcpy(c->out[0].data, c->in[0].data, (size_t)(S * D) * 4);
    c->nin = c->nout = 1;
  } else if (!strcmp(which, "Allreduce")) {
    int64_t sz[3] = {S, D, N}, so[2] = {S, N};
    c->in[0] = trand(HIR_F32, 3, sz);
    c->out[0] = tn(HIR_F32, 2, so);
    for (s = 0; s < S; s++)
      for (j = 0; j < N; j++) {
        double t = 0;
        for (d = 0; d < D; d++) t += tget(&c->in[0], (s * D + d) * N + j);
        tset(&c->out[0], s * N + j, t);
      }
    c->nin = c->nout = 1;
  } else if (!strcmp(which, "ReduceScatter")) {
    int64_t sz[4] = {S, D, D, N}, so[3] = {S, D, N};
    c->in[0] = trand(HIR_F32, 4, sz);
    c->out[0] = tn(HIR_F32, 3, so);
    for (s = 0; s < S; s++)
      for (i = 0; i < D * N; i++) {
        double t = 0;
        for (d = 0; d < D; d++) t += tget(&c->in[0], (s * D + d) * D * N + i);
        tset(&c->out[0], s * D * N + i, t);
      }
    c->nin = c->nout = 1;
  } else if (!strcmp(which, "AG_matmul") || !strcmp(which, "AllgatherP2p") || !strcmp(which, "AG_matmul_P2p")) {
    int p2p = strcmp(which, "AG_matmul") != 0, mm = strcmp(which, "AllgatherP2p") != 0;
    int64_t sa[4] = {S, D, M, K}, sp[3] = {D, M, K}, sb[2] = {K, N}, rows = (p2p ? 1 : S) * D * M;
    c->in[0] = p2p ? trand(HIR_F32, 3, sp) : trand(HIR_F32, 4, sa);
    if (!mm) { /* AllgatherP2p: [D, N] */
      int64_t s2[2] = {D, N};
      tfree(&c->in[0]);
      c->in[0] = trand(HIR_F32, 2, s2);
      c->out[0] = tn(HIR_F32, 2, s2);
      memcpy(c->out[0].data, c->in[0].data, (size_t)tnumel(&c->in[0]) * 4);
      c->nin = c->nout = 1;
      return;
    }
    c->in[1] = trand(HIR_F32, 2, sb);
    y = (double *)calloc((size_t)(rows * N), sizeof(double));
    gemm_ref(&c->in[0], 0, &c->in[1], 0, y, rows, K, N);
    if (p2p) {
      int64_t so[3] = {D, M, N};
      c->out[0] = tn(HIR_F32, 3, so);
    } else {
      int64_t so[4] = {S, D, M, N};
      c->out[0] = tn(HIR_F32, 4, so);
    }
    for (i = 0; i < rows * N; i++) tset(&c->out[0], i, y[i]);
    free(y);
    c->nin = 2;
    c->nout = 1;
  } else if (!strcmp(which, "AG_split_weight")) { /* [D, M, K] x [K, 2] and x [K, 3] */
    int64_t sa[3] = {D, M, K}, sw[2][2] = {{K, 2}, {K, 3}}, q;
    c->in[0] = trand(HIR_F32, 3, sa);
    for (q = 0; q < 2; q++) {
      int64_t so[3] = {D, M, sw[q][1]};
      c->in[1 + q] = trand(HIR_F32, 2, sw[q]);
      c->out[q] = tn(HIR_F32, 3, so);
      y = (double *)calloc((size_t)(D * M * sw[q][1]), sizeof(double));
      gemm_ref(&c->in[0], 0, &c->in[1 + q], 0, y, D * M, K, sw[q][1]);
      for (i = 0; i < D * M * sw[q][1]; i++) tset(&c->out[q], i, y[i]);
      free(y);
    }
    c->nin = 3;
    c->nout = 2;
  } else if (!strcmp(which, "matmul_RS_columns")) { /* out[s, j] = sum_d A[d, j] B[d, s] */
    int64_t sa[4] = {D, D, M, K}, sb[4] = {D, S, K, N}, so[4] = {S, D, M, N};
    c->in[0] = trand(HIR_F32, 4, sa);
    c->in[1] = trand(HIR_F32, 4, sb);
    c->out[0] = tn(HIR_F32, 4, so);
    y = (double *)calloc((size_t)(S * D * M * N), sizeof(double));
    for (s = 0; s < S; s++)
      for (j = 0; j < D; j++)
        for (d = 0; d < D; d++)
          gemm_ref(&c->in[0], (d * D + j) * M * K, &c->in[1], (d * S + s) * K * N, y + (s * D + j) * M * N, M, K, N);
    for (i = 0; i < S * D * M * N; i++) tset(&c->out[0], i, y[i]);
    free(y);
    c->nin = 2;
    c->nout = 1;
  } else if (!strcmp(which, "matmul_AR")) {
    int64_t sa[4] = {S, D, M, K}, sb[3] = {D, K, N}, so[3] = {S, M, N};
    c->in[0] = trand(HIR_F32, 4, sa);
    c->in[1] = trand(HIR_F32, 3, sb);
    c->out[0] = tn(HIR_F32, 3, so);
    y = (double *)calloc((size_t)(S * M * N), sizeof(double));
    for (s = 0; s < S; s++)
      for (d = 0; d < D; d++) gemm_ref(&c->in[0], (s * D + d) * M * K, &c->in[1], d * K * N, y + s * M * N, M, K, N);
    for (i = 0; i < S * M * N; i++) tset(&c->out[0], i, y[i]);
    free(y);
    c->nin = 2;
    c->nout = 1;
  } else { /* matmul_RS_through_bcast [S, D, D, M, K] and the P2P RS [D, D, M, K]: out[s, j] = sum_d A[s, d, j] B[d] */
    int bcast = !strcmp(which, "matmul_RS_through_bcast");
    int64_t s0 = bcast ? S : 1, sa[5] = {S, D, D, M, K}, sb[3] = {D, K, N}, so[4] = {S, D, M, N};
    c->in[0] = bcast ? trand(HIR_F32, 5, sa) : trand(HIR_F32, 4, sa + 1);
    c->in[1] = trand(HIR_F32, 3, sb);
    c->out[0] = bcast ? tn(HIR_F32, 4, so) : tn(HIR_F32, 3, so + 1);
    y = (double *)calloc((size_t)(s0 * D * M * N), sizeof(double));
    for (s = 0; s < s0; s++)
      for (j = 0; j < D; j++)
        for (d = 0; d < D; d++)
          gemm_ref(&c->in[0], ((s * D + d) * D + j) * M * K, &c->in[1], d * K * N, y + (s * D + j) * M * N, M, K, N);
    for (i = 0; i < s0 * D * M * N; i++) tset(&c->out[0], i, y[i]);
    free(y);
    c->nin = 2;
    c->nout = 1;
    if (!strcmp(which, "matmul_RS_p2p_partials_out")) { /* partials[d, j] = A[d, j] B[d] */
      int64_t sp[4] = {D, D, M, N};
      c->out[1] = tn(HIR_F32, 4, sp);
      y = (double *)calloc((size_t)(D * D * M * N), sizeof(double));
      for (d = 0; d < D; d++)
        for (j = 0; j < D; j++) gemm_ref(&c->in[0], (d * D + j) * M * K, &c->in[1], d * K * N, y + (d * D + j) * M * N, M, K, N);
      for (i = 0; i < D * D * M * N; i++) tset(&c->out[1], i, y[i]);
      free(y);
      c->nout = 2;
    }
  }
}

/* A case on `world` ranks lowered by lc, on ns streams, its outputs
   preallocated on every other (ns, ring). */
static void lowered_case_init(spmd_case *c, lowered_case *lc, int world, int ns, int ring) {
  case_init(c, world);
  c->nstreams = ns;
  c->tol = 1e-4;
  c->prealloc = (ns + ring) & 1;
  c->build = build_lowered_with;
  c->user = lc;
}

/* Every stream-lowered seed, plus the GEMM + P2P reduce-scatter, gives the
   right numbers for both schedules, with and without bounded buffers, with
   1..4 streams, on worlds of 1, 2, 3, 4 and 8 (and a mesh {3 1 7 5}); the
   P2P GEMMs also with each peer's 3 rows cut into 3 parts, and the P2P
   seeds as collective pipelines (HIR_SCHEDULE_COLLECTIVE: an allgather
   or reduce-scatter of one row of every peer's chunk an iteration, staged
   through a contiguous buffer) and with the gather first (stream.gather_first:
   the allgather's loop, then one GEMM), the ring's own chunk read in place
   or, with an even number of streams, copied (stream.experimental.copy_own_chunk); and
   bench-overlap's decode programs
   with the weight cut by columns (an AG whose gathered tensor is read on
   Stream and whole, a reduce-scatter a column chunk). */
TEST(test_stream_numbers, "stream/numbers", TEST_CPU | TEST_GPU_WORLDS) {
  static const char *names[] = {"SingleSetOp", "TwoSetOps", "ThreeSetOps", "Allgather", "Allreduce", "ReduceScatter",
                                "AG_matmul", "AllgatherP2p", "AG_matmul_P2p", "matmul_AR", "matmul_RS_through_bcast", "matmul_RS_p2p",
                                "matmul_RS_p2p_partials_out", "AG_split_weight", "matmul_RS_columns"};
  static const seed_fn fns[] = {seed1, seed2, seed3, seed_allgather, seed_allreduce, seed_reduce_scatter, seed_ag_matmul,
                                seed_allgather_p2p, seed_ag_matmul_p2p, seed_matmul_ar, seed_matmul_rs_through_bcast,
                                seed_matmul_rs_p2p, seed_matmul_rs_p2p_partials_out, seed_ag_split_weight,
                                seed_matmul_rs_columns};
  static const int odd[4] = {3, 1, 7, 5};
  int k, wi, ring, bounded, ns, cut, runs = 0;
  for (k = 0; k < 15; k++)
    for (wi = 0; wi < 6; wi++)
      for (ring = 0; ring < 2; ring++)
        for (bounded = 0; bounded < 2; bounded++)
          for (ns = 1; ns <= 4; ns++)
            for (cut = 1; cut <= 7; cut += 2) {
            int D = wi < 5 ? worlds[wi] : 4, world = wi < 5 ? D : 8, collective = cut == 5, gather = cut == 7;
            const int *mesh = wi < 5 ? iota_mesh : odd;
            char what[160];
            lowered_case lc;
            spmd_case c;
            seed s;
            if (wi == 5 && k < 3) continue; /* single-device seeds: no mesh */
            if (platform->p2p_only && ((k != 7 && k != 8 && k < 11) || k == 14)) continue;
            if (k == 14 && (ring || bounded || cut > 1)) continue; /* columns: no P2P, one schedule */
            if (ns > 2 && (wi == 1 || wi == 3)) continue; /* keep the matrix small: 3-4 streams on 1, 3, 8 and the odd mesh */
            if (cut == 3 && k != 8 && k < 11) continue;      /* cut: the P2P GEMMs */
            if (collective && ((platform->p2p_only && k != 7 && k != 8) || (k != 7 && k != 8 && k < 11) || ring || bounded))
              continue; /* a P2P-only world still has the allgather its shape check uses */
            if (gather && k != 7 && k != 8 && k != 13) continue; /* gather first: the P2P allgathers */
            fns[k](&s, hir_fusion_create(), D, mesh);
            memset(&lc, 0, sizeof lc);
            lc.f = s.f;
            lc.d.stream.schedule = collective ? HIR_SCHEDULE_COLLECTIVE : ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
            lc.d.stream.bounded_buffers = bounded;
            lc.d.stream.parts = collective ? (k == 7 ? 5 : 3) : gather ? 1 : cut; /* collective: what the cut axis divides into */
            lc.d.stream.gather_first = gather;
            lc.d.stream.experimental.copy_own_chunk = ns % 2 == 0;
            lowered_case_init(&c, &lc, world, ns, ring);
            seed_data(&c, names[k], D);
            snprintf(what, sizeof what, "%s (%s%s%s%s, mesh %s)", names[k], collective ? "collectives" : ring ? "ring" : "linear",
                     bounded ? ", bounded" : "", cut == 3 ? ", 3 parts per peer" : collective ? ", a row a part" : gather ? ", gather first" : "",
                     ring && ns % 2 == 0 ? ", own chunk copied" : "", wi < 5 ? "0..D-1" : "{3 1 7 5}");
            RUN_CASE(&c, what);
            hir_fusion_free(s.f);
            runs++;
            if (hir_test_failures) return;
          }
  CHECK(runs > (platform->p2p_only ? 100 : 500) && (platform != &cpu_platform || cases_skipped == 0));
}

/* The ring allgather's own chunk: AG_matmul_P2p's GEMM reads it straight
   from the input (no Set) unless stream.experimental.copy_own_chunk asks a copy, or
   hir_lower_desc.comm's send/recv are NCCL kernels; AllgatherP2p's gathered
   tensor is the program's output, so the own chunk is copied there; the
   linear schedule copies, as nvFuser's programs do. */
TEST(test_stream_own_chunk_in_place, "stream/own_chunk_in_place", TEST_CPU) {
  hir_comm comm;
  hir_lower_desc d;
  seed s, g;
  int k;
  seed_ag_matmul_p2p(&s, hir_fusion_create(), 3, iota_mesh);
  seed_allgather_p2p(&g, hir_fusion_create(), 3, iota_mesh);
  memset(&comm, 0, sizeof comm);
  for (k = 0; k < 6; k++) { /* none, copy asked, NCCL kernels, copy engines, the gathered output, linear */
    char *text;
    int copies = k == 1 || k == 2 || k == 4 || k == 5;
    memset(&d, 0, sizeof d);
    d.stream.schedule = k == 5 ? HIR_SCHEDULE_LINEAR : HIR_SCHEDULE_RING;
    d.stream.experimental.copy_own_chunk = k == 1;
    comm.p2p_copy_engine = k == 3;
    d.comm = k == 2 || k == 3 ? &comm : NULL;
    text = lower_text(k == 4 ? g.f : s.f, &d, 1);
    CHECK(strstr(text, "FOR StreamIdx") && strstr(text, "type=recv"));
    if ((strstr(text, "= Set(") != NULL) != copies) fprintf(stderr, "  case %d: the own chunk %scopied\n", k, copies ? "not " : "");
    CHECK((strstr(text, "= Set(") != NULL) == copies);
    CHECK((strstr(text, "IF Manual ( StreamIdx != 0 ):") != NULL) == !copies); /* the exchange on the others' steps */
    free(text);
  }
  hir_fusion_free(s.f);
  hir_fusion_free(g.f);
}

/* stream.gather_first: AG_matmul_P2p's exchange is a loop of its own
   (send/recv, a chunk a step) and its GEMM runs once, after it, at the top
   level of the program; without it, a GEMM a chunk inside the loop. */
TEST(test_stream_gather_first_program, "stream/gather_first_program", TEST_CPU) {
  hir_lower_desc d;
  seed s;
  int gather;
  seed_ag_matmul_p2p(&s, hir_fusion_create(), 3, iota_mesh);
  memset(&d, 0, sizeof d);
  d.stream.schedule = HIR_SCHEDULE_RING;
  for (gather = 0; gather < 2; gather++) {
    char *text;
    d.stream.gather_first = gather;
    text = lower_text(s.f, &d, 1);
    CHECK(strstr(text, "FOR StreamIdx") && strstr(text, "P2PCommunication") && strstr(text, "type=recv"));
    CHECK((strstr(text, "\n     = matmul(") != NULL) == gather);  /* at the top level */
    CHECK((strstr(text, "       = matmul(") != NULL) == !gather); /* inside the loop (or an IF in it) */
    free(text);
  }
  hir_fusion_free(s.f);
}

/* Whether AG_matmul_P2p on 2 ranks, lowered with d, refuses rank 0's run
   of A [1, 3, 4] x B [4, sb[1]] with `needle` in its message before it
   writes anything (the check comes before any transfer). */
static int ag_run_refused(const hir_fusion *f, const hir_lower_desc *d, const int64_t *sb, const char *needle) {
  int64_t sa[3] = {1, 3, 4}, so[3] = {2, 3, sb[1]}, k;
  hir_local_world *w = hir_local_world_create(2);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_tensor in[2], out;
  int ok;
  memset(&ed, 0, sizeof ed);
  ed.comm = hir_local_comm(w, 0);
  in[0] = trand(HIR_F32, 3, sa);
  in[1] = trand(HIR_F32, 2, sb);
  out = tn(HIR_F32, 3, so);
  for (k = 0; k < tnumel(&out); k++) tset(&out, k, 7.0); /* poison */
  ok = hir_lower(f, d, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK && hir_run(ev, in, 2, &out, 1) == HIR_ERR_SHAPE &&
       strstr(hir_evaluator_error(ev), needle) != NULL;
  for (k = 0; k < tnumel(&out); k++) ok &= tget(&out, k) == 7.0; /* nothing written */
  hir_evaluator_free(ev);
  hir_program_free(p);
  tfree(&in[0]);
  tfree(&in[1]);
  tfree(&out);
  hir_local_world_free(w);
  return ok;
}

/* stream.experimental.column_parts = S: AG_matmul_P2p's GEMM computes, in the
   exchange's loop, only the first N/S columns (HirAliasSlice views of the
   weight and the output chunk), and the other parts after it, one GEMM a
   part of every row. Numbers on worlds of 1-8 and the odd mesh, both
   schedules, 1-3 streams, S = 2 and 3 of N = 6, and with bounded buffers
   (where it stays off: the gathered tensor is not whole after the loop),
   and with W sharded on N (off too: N is not the device's to cut); the
   program; N = 5 cut in 2 refused by the run before it writes anything,
   naming the option; S = -1 refused by lowering. */
TEST(test_stream_column_parts, "stream/column_parts", TEST_CPU | TEST_GPU_WORLDS) {
  static const int odd[4] = {3, 1, 7, 5};
  int wi, ring, bounded, ns, parts, runs = 0;
  for (wi = 0; wi < 6; wi++)
    for (ring = 0; ring < 2; ring++)
      for (bounded = 0; bounded < 2; bounded++)
        for (ns = 1; ns <= 3; ns++)
          for (parts = 2; parts <= 3; parts++) {
            int D = wi < 5 ? worlds[wi] : 4, world = wi < 5 ? D : 8;
            int64_t M = 3, K = 4, N = 6, sa[3] = {D, M, K}, sb[2] = {K, N}, so[3] = {D, M, N}, i;
            double *y = (double *)calloc((size_t)(D * M * N), sizeof(double));
            char what[128];
            lowered_case lc;
            spmd_case c;
            seed sd;
            seed_ag_matmul_p2p(&sd, hir_fusion_create(), D, wi < 5 ? iota_mesh : odd);
            memset(&lc, 0, sizeof lc);
            lc.f = sd.f;
            lc.d.stream.schedule = ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
            lc.d.stream.bounded_buffers = bounded;
            lc.d.stream.experimental.column_parts = parts;
            lowered_case_init(&c, &lc, world, ns, ring);
            c.in[0] = trand(HIR_F32, 3, sa);
            c.in[1] = trand(HIR_F32, 2, sb);
            c.out[0] = tn(HIR_F32, 3, so);
            gemm_ref(&c.in[0], 0, &c.in[1], 0, y, D * M, K, N);
            for (i = 0; i < D * M * N; i++) tset(&c.out[0], i, y[i]);
            free(y);
            c.nin = 2;
            c.nout = 1;
            snprintf(what, sizeof what, "AG_matmul_P2p, %d column parts (%s%s, mesh %s)", parts, ring ? "ring" : "linear",
                     bounded ? ", bounded" : "", wi < 5 ? "0..D-1" : "{3 1 7 5}");
            RUN_CASE(&c, what);
            hir_fusion_free(sd.f);
            runs++;
            if (hir_test_failures) return;
          }
  CHECK(runs == 144);
  for (wi = 1; wi < 3; wi++) { /* W sharded on N (a column-parallel weight): its N is not this device's to cut; left alone */
    int D = worlds[wi];
    int64_t M = 3, K = 4, n = 2, sa[3] = {D, M, K}, sb[2] = {K, D * n}, so[3] = {D, M, D * n}, i;
    double *y = (double *)calloc((size_t)(D * M * D * n), sizeof(double));
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *w = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, w);
    lowered_case lc;
    spmd_case c;
    char *text;
    hir_output(f, o);
    hir_set_mesh(a, D, iota_mesh), hir_set_mesh(w, D, iota_mesh), hir_set_mesh(o, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(w, 1, HIR_DIDX);
    hir_parallelize(o, 0, HIR_STREAM);
    hir_parallelize(o, 2, HIR_DIDX);
    memset(&lc, 0, sizeof lc);
    lc.f = f;
    lc.d.stream.schedule = HIR_SCHEDULE_RING;
    lc.d.stream.experimental.column_parts = 2;
    text = lower_text(f, &lc.d, 0);
    CHECK(strstr(text, "P2PCommunication") && !strstr(text, "parts = 2"));
    free(text);
    lowered_case_init(&c, &lc, D, 2, 1);
    c.in[0] = trand(HIR_F32, 3, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = tn(HIR_F32, 3, so);
    gemm_ref(&c.in[0], 0, &c.in[1], 0, y, D * M, K, D * n);
    for (i = 0; i < D * M * D * n; i++) tset(&c.out[0], i, y[i]);
    free(y);
    c.nin = 2;
    c.nout = 1;
    RUN_CASE(&c, "AG_matmul_P2p, W sharded on N, column parts asked");
    hir_fusion_free(f);
  }
  if (platform != &cpu_platform) return;
  { /* the program: part 0 in the loop, part 1 after it; bounded buffers leave it alone */
    static const int m2[2] = {0, 1};
    int64_t sb[2] = {4, 5};
    hir_lower_desc d;
    hir_program *p;
    seed sd;
    int b;
    seed_ag_matmul_p2p(&sd, hir_fusion_create(), 3, iota_mesh);
    memset(&d, 0, sizeof d);
    d.stream.schedule = HIR_SCHEDULE_RING;
    d.stream.experimental.column_parts = 2;
    for (b = 0; b < 2; b++) {
      char *text;
      d.stream.bounded_buffers = b;
      text = lower_text(sd.f, &d, 1);
      CHECK((strstr(text, "\n     = matmul(") != NULL) == !b); /* the other part, at the top level */
      CHECK(strstr(text, "\n       = matmul(") != NULL);        /* part 0 (or all, bounded), inside the loop */
      CHECK((strstr(text, "index = 1, parts = 2 )") != NULL) == !b);
      free(text);
    }
    d.stream.experimental.column_parts = -1;
    CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "column_parts is -1; give 2 to 1024"));
    hir_program_free(p);
    hir_fusion_free(sd.f);
    seed_ag_matmul_p2p(&sd, hir_fusion_create(), 2, m2); /* N = 5 does not cut in 2: refused before anything is written */
    d.stream.experimental.column_parts = 2;
    d.stream.bounded_buffers = 0;
    CHECK(ag_run_refused(sd.f, &d, sb, "which does not cut into 2 equal parts") &&
          ag_run_refused(sd.f, &d, sb, "column_parts"));
    hir_fusion_free(sd.f);
  }
}

/* Bounded buffers keep numberOfStreams slices of the gathered A instead of
   D: each rank holds exactly (D - numberOfStreams) chunks less. */
typedef struct mem_ctx {
  hir_local_world *w;
  const hir_fusion *f;
  int bounded, D, ns;
  hir_tensor a, b;
  size_t bytes[8];
  hir_status status[8];
} mem_ctx;

static hir_status mem_rank(int rank, void *user) {
  mem_ctx *m = (mem_ctx *)user;
  hir_lower_desc d;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2], out;
  memset(&d, 0, sizeof d);
  memset(&ed, 0, sizeof ed);
  d.my_device = rank;
  d.stream.bounded_buffers = m->bounded;
  ed.comm = hir_local_comm(m->w, rank);
  ed.number_of_streams = m->ns;
  m->status[rank] = hir_lower(m->f, &d, &p);
  if (m->status[rank] == HIR_OK) m->status[rank] = hir_evaluator_create(p, &ed, &ev);
  if (m->status[rank] == HIR_OK) {
    in[0] = shard(&m->a, hir_program_input(p, 0), rank);
    in[1] = m->b;
    memset(&out, 0, sizeof out);
    m->status[rank] = hir_run(ev, in, 2, &out, 1);
    m->bytes[rank] = hir_evaluator_memory(ev);
    tfree(&in[0]);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  return m->status[rank];
}

TEST(test_stream_bounded_memory, "stream/bounded_memory", TEST_CPU) {
  int64_t D = 8, M = 16, K = 32, N = 8, sa[3] = {8, 16, 32}, sb[2] = {32, 8};
  size_t held[2];
  mem_ctx m;
  seed s;
  int bounded, r;
  memset(&m, 0, sizeof m);
  seed_ag_matmul_p2p(&s, hir_fusion_create(), (int)D, iota_mesh);
  m.f = s.f;
  m.D = (int)D;
  m.ns = 2;
  m.a = trand(HIR_F32, 3, sa);
  m.b = trand(HIR_F32, 2, sb);
  for (bounded = 0; bounded < 2; bounded++) {
    m.bounded = bounded;
    m.w = hir_local_world_create((int)D);
    CHECK(hir_spmd((int)D, mem_rank, &m) == HIR_OK);
    for (r = 1; r < D; r++) CHECK(m.bytes[r] == m.bytes[0]);
    held[bounded] = m.bytes[0];
    hir_local_world_free(m.w);
  }
  /* the gathered A: [D, M/D rows, K] against [numberOfStreams, M/D, K] */
  CHECK(held[0] - held[1] == (size_t)((D - m.ns) * M * K * 4));
  CHECK(held[1] > (size_t)(D * M * N * 4)); /* it still holds the output [D, M, N] */
  if (held[0] - held[1] != (size_t)((D - m.ns) * M * K * 4))
    fprintf(stderr, "  bounded buffers: %zu bytes held vs %zu\n", held[1], held[0]);
  tfree(&m.a);
  tfree(&m.b);
  hir_fusion_free(s.f);
}

/* Receives a graph posts at its replay's start (hir_comm.recv_at_start):
   under a capture the evaluator marks a receive whose buffer nothing in the
   run touched before it, and only then. Each rank's local communicator
   counts its receives' marks and hands over one handle for a capture's
   marked ones; a backend that "captures" (runs the work as it comes,
   launches nothing) counts its launches. AG_matmul_P2p's ring on 4 ranks:
   unbounded, every receive lands in a slice of its own (all 3 marked);
   bounded to 2 slices, the receives of steps 1 and 2 find slices 1 and 0
   fresh (the own step 0 reads its input in place, writing no slice), the
   one of step 3 slice 1, which step 1's receive and GEMM touched (2
   marked). Eager runs mark none. */
typedef struct start_ctx {
  hir_local_world *w;
  const hir_fusion *f;
  int bounded;
  hir_tensor a, b;
  hir_status (*recv)(hir_comm *, void *, size_t, int, void *);
  hir_backend *be[4];
  int capturing[4], marked[4], unmarked[4], marked_eager[4], kept[4], taken[4], raised[4], released[4], launches[4];
} start_ctx;
static start_ctx *start_x;

static hir_status start_recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  int r = c->rank;
  if (!start_x->capturing[r]) start_x->marked_eager[r] += c->recv_at_start;
  else if (c->recv_at_start) start_x->marked[r]++, start_x->kept[r]++;
  else start_x->unmarked[r]++;
  return start_x->recv(c, buf, bytes, peer, stream);
}
static void *start_take(hir_comm *c) {
  int r = c->rank;
  start_x->taken[r]++;
  if (!start_x->kept[r]) return NULL;
  start_x->kept[r] = 0;
  return &start_x->marked[r]; /* a handle that says whose */
}
static hir_status start_raise(hir_comm *c, void *signals, void *stream) {
  (void)stream;
  if (signals == &start_x->marked[c->rank]) start_x->raised[c->rank]++;
  return HIR_OK;
}
static void start_release(hir_comm *c, void *signals) {
  if (signals == &start_x->marked[c->rank]) start_x->released[c->rank]++;
}
static int start_rank_of(hir_backend *b) {
  int r = 0;
  while (r < 3 && start_x->be[r] != b) r++;
  return r;
}
static hir_status start_graph_begin(hir_backend *b) {
  start_x->capturing[start_rank_of(b)] = 1;
  return HIR_OK;
}
static hir_status start_graph_end(hir_backend *b, void **graph) {
  start_x->capturing[start_rank_of(b)] = 0;
  *graph = b;
  return HIR_OK;
}
static hir_status start_graph_launch(hir_backend *b, void *graph) {
  (void)graph;
  start_x->launches[start_rank_of(b)]++;
  return HIR_OK;
}
static void start_graph_destroy(hir_backend *b, void *graph) { (void)b, (void)graph; }

static hir_status start_rank(int rank, void *user) {
  start_ctx *x = (start_ctx *)user;
  hir_lower_desc d;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_backend *be = hir_backend_cpu_create();
  hir_comm *c = hir_local_comm(x->w, rank);
  hir_tensor in[2], out;
  int64_t so[3] = {4, 2, 3};
  hir_status s;
  int run;
  memset(&d, 0, sizeof d);
  memset(&ed, 0, sizeof ed);
  x->be[rank] = be;
  d.my_device = rank;
  d.stream.schedule = HIR_SCHEDULE_RING;
  d.stream.bounded_buffers = x->bounded;
  c->recv = start_recv;
  c->capturable = 1; /* its calls run as they come: this backend's "capture" runs the work too */
  c->start_signals_take = start_take;
  c->start_signals_raise = start_raise;
  c->start_signals_release = start_release;
  be->graph_begin = start_graph_begin;
  be->graph_end = start_graph_end;
  be->graph_launch = start_graph_launch;
  be->graph_destroy = start_graph_destroy;
  ed.backend = be;
  ed.comm = c;
  ed.number_of_streams = 2;
  ed.graph = HIR_GRAPH_BY_ADDRESS;
  s = hir_lower(x->f, &d, &p);
  if (s == HIR_OK) s = hir_evaluator_create(p, &ed, &ev);
  in[0] = shard(&x->a, hir_program_input(p, 0), rank);
  in[1] = x->b;
  out = tn(HIR_F32, 3, so);
  for (run = 0; run < 3 && s == HIR_OK; run++) s = hir_run(ev, in, 2, &out, 1); /* eager, captured and launched, launched */
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  tfree(&in[0]);
  tfree(&out);
  return s;
}

TEST(test_stream_recv_at_start, "stream/recv_at_start", TEST_CPU) {
  int64_t sa[3] = {4, 2, 5}, sb[2] = {5, 3};
  start_ctx x;
  seed s;
  int r;
  seed_ag_matmul_p2p(&s, hir_fusion_create(), 4, iota_mesh);
  for (x.bounded = 0; x.bounded < 2; x.bounded++) {
    hir_local_world *w = hir_local_world_create(4);
    memset(x.be, 0, sizeof x - offsetof(start_ctx, be));
    x.w = w;
    x.f = s.f;
    x.a = trand(HIR_F32, 3, sa);
    x.b = trand(HIR_F32, 2, sb);
    x.recv = hir_local_comm(w, 0)->recv;
    start_x = &x;
    CHECK(hir_spmd(4, start_rank, &x) == HIR_OK);
    for (r = 0; r < 4; r++) {
      CHECK(x.marked[r] == (x.bounded ? 2 : 3) && x.unmarked[r] == (x.bounded ? 1 : 0) && x.marked_eager[r] == 0);
      CHECK(x.taken[r] == 1 && x.launches[r] == 2 && x.raised[r] == 2 && x.released[r] == 1);
    }
    if (x.marked[0] != (x.bounded ? 2 : 3))
      fprintf(stderr, "  bounded %d: rank 0 marked %d receives, %d not\n", x.bounded, x.marked[0], x.unmarked[0]);
    tfree(&x.a);
    tfree(&x.b);
    hir_local_world_free(w);
  }
  hir_fusion_free(s.f);
}

/* The same marks checked by what memory holds, on every P2P pipeline of
   stream/numbers' seeds (worlds of 2-4, both schedules, bounded, 1-3
   streams, 3 parts a peer, the gather first). A backend whose captures fail
   on purpose makes the capture run, where the marks are made, the last
   graph run: the later runs are eager at the same addresses. Before each of
   them the marked receives' bytes (those in the evaluator's buffers) are
   filled with NaN, as a peer's copy may land there any time after a
   replay's start; the wrapped recv finds them untouched when it comes, or
   an earlier op wrote them. An earlier op that read them would read NaN: the
   outputs are compared with the reference as in stream/numbers. (The
   capture run works twice here, once "captured" and once after the failed
   capture, so matmul_RS_p2p_partials_out, whose partial products are an
   output summed in place while the local world still holds the first
   pass's sends, is left out.) */
enum { UNTOUCHED_MAX = 64 };
typedef struct untouched_mark {
  unsigned char *data;
  size_t bytes;
  int poisoned; /* filled before this run, not yet received into */
} untouched_mark;
static untouched_mark untouched_marks[MAXR][UNTOUCHED_MAX];
static int untouched_n[MAXR], untouched_checked[MAXR]; /* by rank: each rank's thread its own */
static hir_status (*untouched_local_recv)(hir_comm *, void *, size_t, int, void *);

static hir_status untouched_recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  untouched_mark *m = untouched_marks[c->rank];
  int i, n = untouched_n[c->rank];
  size_t k;
  if (c->recv_at_start && n < UNTOUCHED_MAX) {
    m[n].data = (unsigned char *)buf, m[n].bytes = bytes, m[n].poisoned = 0;
    untouched_n[c->rank]++;
  }
  for (i = 0; i < n; i++) {
    if (m[i].data != buf || m[i].bytes != bytes || !m[i].poisoned) continue;
    m[i].poisoned = 0;
    for (k = 0; k < bytes && m[i].data[k] == 0xff; k++) {}
    if (k < bytes) {
      snprintf(c->error, sizeof c->error, "a receive posted at the replay's start found byte %zu of its buffer written "
               "earlier in the run", k);
      return HIR_ERR_INTERNAL;
    }
    untouched_checked[c->rank]++;
  }
  return untouched_local_recv(c, buf, bytes, peer, stream);
}
static void *untouched_take(hir_comm *c) { return (void)c, NULL; }
static hir_status untouched_raise(hir_comm *c, void *signals, void *stream) { return (void)c, (void)signals, (void)stream, HIR_OK; }
static void untouched_release(hir_comm *c, void *signals) { (void)c, (void)signals; }

static void untouched_before_run(hir_evaluator *ev, int rank, int run) {
  int i, k;
  if (run < 2) return; /* eager, then the capture that marks */
  for (i = 0; i < untouched_n[rank]; i++) {
    untouched_mark *m = &untouched_marks[rank][i];
    for (k = 0; k < ev->nblocks; k++) { /* the evaluator's buffers only: a caller's output moves between runs here */
      unsigned char *at = (unsigned char *)ev->blocks[k].ptr;
      if (m->data >= at && m->data + m->bytes <= at + ev->blocks[k].bytes) {
        memset(m->data, 0xff, m->bytes);
        m->poisoned = 1;
      }
    }
  }
}

static void *untouched_world(int n) {
  hir_local_world *w = (hir_local_world *)cpu_world_create(n);
  int r;
  for (r = 0; r < n; r++) {
    hir_comm *c = hir_local_comm(w, r);
    untouched_local_recv = c->recv;
    c->recv = untouched_recv;
    c->capturable = 1;
    c->start_signals_take = untouched_take;
    c->start_signals_raise = untouched_raise;
    c->start_signals_release = untouched_release;
  }
  memset(untouched_n, 0, sizeof untouched_n);
  return w;
}
static hir_status untouched_graph_begin(hir_backend *b) { return (void)b, HIR_OK; }
static hir_status untouched_graph_end(hir_backend *b, void **graph) {
  *graph = NULL;
  snprintf(b->error, sizeof b->error, "this test's backend captures nothing");
  return HIR_ERR_UNSUPPORTED;
}
static hir_status untouched_graph_launch(hir_backend *b, void *graph) { return (void)b, (void)graph, HIR_ERR_INTERNAL; }
static void untouched_graph_destroy(hir_backend *b, void *graph) { (void)b, (void)graph; }
static hir_backend *untouched_backend(int rank) {
  hir_backend *b = hir_backend_cpu_create();
  (void)rank;
  b->graph_begin = untouched_graph_begin;
  b->graph_end = untouched_graph_end;
  b->graph_launch = untouched_graph_launch;
  b->graph_destroy = untouched_graph_destroy;
  return b;
}

TEST(test_stream_recv_at_start_untouched, "stream/recv_at_start_untouched", TEST_CPU) {
  static const char *names[] = {"AllgatherP2p", "AG_matmul_P2p", "matmul_RS_p2p", "AG_split_weight"};
  static const seed_fn fns[] = {seed_allgather_p2p, seed_ag_matmul_p2p, seed_matmul_rs_p2p, seed_ag_split_weight};
  static const test_platform marking = {"cpu, receives posted at a replay's start", 1, 1 << 20, untouched_world,
                                        cpu_world_free, cpu_comm, untouched_backend, hir_spmd, 0, 1};
  const test_platform *was = platform;
  int k, D, ring, bounded, ns, variant, runs = 0, checked = 0;
  memset(untouched_checked, 0, sizeof untouched_checked);
  platform = &marking;
  spmd_before_run = untouched_before_run;
  spmd_graph_may_fall_back = 1;
  for (k = 0; k < 4 && !hir_test_failures; k++)
    for (D = 2; D <= 4; D++)
      for (ring = 0; ring < 2; ring++)
        for (bounded = 0; bounded < 2; bounded++)
          for (ns = 1; ns <= 3; ns++)
            for (variant = 0; variant < 3; variant++) { /* whole chunks, 3 parts a peer, the gather first */
              char what[160];
              lowered_case lc;
              spmd_case c;
              seed s;
              if ((variant == 1 && k == 0) || (variant == 2 && k == 2)) continue; /* no parts in the allgather, no gather in RS */
              fns[k](&s, hir_fusion_create(), D, iota_mesh);
              memset(&lc, 0, sizeof lc);
              lc.f = s.f;
              lc.d.stream.schedule = ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
              lc.d.stream.bounded_buffers = bounded;
              lc.d.stream.parts = variant == 1 ? 3 : 1;
              lc.d.stream.gather_first = variant == 2;
              lowered_case_init(&c, &lc, D, ns, ring);
              seed_data(&c, names[k], D);
              snprintf(what, sizeof what, "%s (%s%s%s)", names[k], ring ? "ring" : "linear", bounded ? ", bounded" : "",
                       variant == 1 ? ", 3 parts per peer" : variant == 2 ? ", gather first" : "");
              RUN_CASE(&c, what);
              hir_fusion_free(s.f);
              runs++;
            }
  platform = was;
  spmd_before_run = NULL;
  spmd_graph_may_fall_back = 0;
  for (k = 0; k < MAXR; k++) checked += untouched_checked[k];
  CHECK(runs > 300 && checked > 1000);
  if (checked <= 1000) fprintf(stderr, "  %d cases, %d marked receives checked\n", runs, checked);
}

/* ---- the schedule verifier ---- */
static void lower_all(const hir_fusion *f, const hir_lower_desc *d0, int n, hir_program **ps) {
  int r;
  for (r = 0; r < n; r++) {
    hir_lower_desc d = *d0;
    d.my_device = r;
    hir_lower(f, &d, &ps[r]);
  }
}

TEST(test_schedule_verifier_accepts, "stream/verifier_accepts", TEST_CPU) {
  static const int m8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  size_t i;
  int wi, ring, k, ok = 0;
  for (i = 0; i < sizeof seed_table / sizeof seed_table[0]; i++)
    for (wi = 0; wi < 5; wi++)
      for (ring = 0; ring < 2; ring++) {
        int D = worlds[wi];
        hir_program *ps[8];
        hir_lower_desc d;
        char msg[512];
        seed s;
        seed_table[i].fn(&s, hir_fusion_create(), D, m8);
        memset(&d, 0, sizeof d);
        d.stream.schedule = ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
        lower_all(s.f, &d, D, ps);
        if (hir_verify_schedule(ps, D, 3, msg, sizeof msg) != HIR_OK) {
          fprintf(stderr, "  test_stream.c: %s on %d ranks (%s): %s\n", seed_table[i].name, D, ring ? "ring" : "linear", msg);
          hir_test_failures++;
        } else {
          ok++;
        }
        for (k = 0; k < D; k++) hir_program_free(ps[k]);
        hir_fusion_free(s.f);
      }
  { /* the cross-mesh programs of the lowering tests */
    hir_fusion *f = cross_mesh_fusion();
    hir_program *ps[8];
    hir_lower_desc d;
    char msg[512];
    memset(&d, 0, sizeof d);
    lower_all(f, &d, 8, ps);
    CHECK(hir_verify_schedule(ps, 8, 4, msg, sizeof msg) == HIR_OK);
    for (k = 0; k < 8; k++) hir_program_free(ps[k]);
    hir_fusion_free(f);
  }
  CHECK(ok == (int)(sizeof seed_table / sizeof seed_table[0]) * 10);
}

/* Hand-made schedules the verifier must reject. */
static hir_program *two_rank_program(int kind, int rank) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 1), *b = hir_set(f, a);
  int team[2] = {0, 1}, other[2] = {1, 0};
  hir_scope *top = hir_program_body(p);
  hir_output(f, b);
  if (kind == 0) { /* rank 0 allgathers while rank 1 allreduces on the same team */
    hir_scope_append(top, hir_host_communication(p, rank == 0 ? HIR_COLL_ALLGATHER : HIR_COLL_ALLREDUCE, 2, team, 0, a, b));
  } else if (kind == 1) { /* both receive first, outside a group: each waits for the other */
    hir_val *peer = hir_val_const(f, 1 - rank);
    hir_scope_append(top, hir_host_p2p(p, HIR_P2P_RECV, b, peer));
    hir_scope_append(top, hir_host_p2p(p, HIR_P2P_SEND, a, peer));
  } else if (kind == 2) { /* two teams entered in opposite orders */
    hir_expr *x = hir_host_communication(p, HIR_COLL_ALLREDUCE, 2, team, 0, a, b);
    hir_expr *y = hir_host_communication(p, HIR_COLL_ALLREDUCE, 2, other, 0, a, b);
    hir_scope_append(top, rank == 0 ? x : y);
    hir_scope_append(top, rank == 0 ? y : x);
  } else { /* the same exchange, coalesced: fine */
    hir_val *peer = hir_val_const(f, 1 - rank);
    hir_expr *end;
    hir_scope_append(top, hir_host_start_coalescing(p));
    hir_scope_append(top, hir_host_p2p(p, HIR_P2P_RECV, b, peer));
    hir_scope_append(top, hir_host_p2p(p, HIR_P2P_SEND, a, peer));
    hir_scope_append(top, end = hir_host_end_coalescing(p));
    hir_scope_append(top, hir_host_wait(p, end));
  }
  return p;
}

TEST(test_schedule_verifier_rejects, "stream/verifier_rejects", TEST_CPU) {
  static const char *want[] = {"schedule mismatch on team of Communication 1: rank 0 runs Allgather (root -1), rank 1 runs Allreduce",
                               "schedule deadlock: no rank can go on: rank 0 at a send/recv group (recv from 1); rank 1 at a send/recv group (recv from 0);",
                               "schedule deadlock: no rank can go on: rank 0 at Communication 1 (Allreduce, team (0 1)); rank 1 at Communication 2 (Allreduce, team (1 0));",
                               ""};
  int kind;
  for (kind = 0; kind < 4; kind++) {
    hir_program *ps[2];
    char msg[512];
    hir_status s;
    ps[0] = two_rank_program(kind, 0);
    ps[1] = two_rank_program(kind, 1);
    s = hir_verify_schedule(ps, 2, 2, msg, sizeof msg);
    if ((s == HIR_OK) != (kind == 3) || strstr(msg, want[kind]) == NULL) {
      fprintf(stderr, "  test_stream.c: schedule %d: %s \"%s\"; wanted \"%s\"\n", kind, hir_status_str(s), msg, want[kind]);
      hir_test_failures++;
    }
    hir_program_free(ps[0]);
    hir_program_free(ps[1]);
  }
}

/* Chunks per peer that cannot be: out of range, nothing to cut, and (at
   run time, before anything is written) a size the parts do not divide. */
static void test_stream_cut_errors(void) {
  static const int m2[2] = {0, 1};
  int64_t sb[2] = {4, 5};
  hir_lower_desc d;
  hir_program *p;
  seed sd;
  memset(&d, 0, sizeof d);
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 2, m2);
  d.stream.parts = -1;
  CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "parts is -1; give 1 to 1024"));
  hir_program_free(p);
  d.stream.schedule = HIR_SCHEDULE_COLLECTIVE, d.stream.parts = 1; /* a collective pipeline of one part is none */
  CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "parts is 1; give 2 to 1024 for a collective"));
  hir_program_free(p);
  d.stream.schedule = HIR_SCHEDULE_SERIAL, d.stream.parts = 2;
  CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "the serial program has no parts"));
  hir_program_free(p);
  d.stream.schedule = HIR_SCHEDULE_COUNT, d.stream.parts = 0;
  CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "schedule is 4; give HIR_SCHEDULE_LINEAR"));
  hir_program_free(p);
  d.stream.schedule = HIR_SCHEDULE_LINEAR;
  d.stream.parts = 2; /* the 3 rows of a peer's chunk do not cut in 2 */
  CHECK(ag_run_refused(sd.f, &d, sb, "has size 3, the size of input 0 (T0) axis 1, which does not cut into 2 equal parts"));
  hir_fusion_free(sd.f);
  seed_allgather_p2p(&sd, hir_fusion_create(), 2, m2); /* [D, N] gathered into [Stream D, N]: N is cut */
  d.stream.parts = 5;
  CHECK(hir_lower(sd.f, &d, &p) == HIR_OK);
  hir_program_free(p);
  hir_fusion_free(sd.f);
  sd.f = hir_fusion_create(); /* [D] gathered: nothing after the Stream axis */
  sd.t[0] = hir_input(sd.f, HIR_F32, 1);
  sd.t[1] = hir_set(sd.f, sd.t[0]);
  hir_output(sd.f, sd.t[1]);
  hir_set_mesh(sd.t[0], 2, m2);
  hir_set_mesh(sd.t[1], 2, m2);
  hir_parallelize(sd.t[0], 0, HIR_DIDX);
  hir_parallelize(sd.t[1], 0, HIR_STREAM);
  CHECK(hir_lower(sd.f, &d, &p) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_program_error(p), "parts = 5 cuts the first axis after the Stream axis, and T1 has none"));
  hir_program_free(p);
  hir_fusion_free(sd.f);
}

TEST(test_stream_errors, "stream/errors", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a, *b;
  int axis = 1, flags[3] = {1, 0, 0};
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  b = hir_sum(f, a, 1, &axis);
  hir_output(f, b);
  hir_parallelize(b, 1, HIR_STREAM);
  CHECK_LOWER_ERROR(f, 0, HIR_ERR_UNSUPPORTED, "the Stream axis is a reduction axis");
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  b = hir_broadcast(f, a, 3, flags);
  hir_output(f, b);
  hir_parallelize(b, 1, HIR_STREAM);
  CHECK_LOWER_ERROR(f, 0, HIR_ERR_UNSUPPORTED, "a PostOnStream (HostUnit) cannot be stream-lowered");
  hir_fusion_free(f);
  test_stream_cut_errors();
}

/* hir_desc_defaults: each zero that stands for a value holds it, a zero that
   is a choice stays, given fields pass through, and a desc lowers to the same
   program as its filled copy under every schedule. */
TEST(test_stream_desc_defaults, "stream/desc_defaults", TEST_CPU) {
  static const int m2[2] = {0, 1};
  static char zero_text[16384], filled_text[16384];
  hir_tune_desc d, f;
  hir_schedule sched;
  seed sd;
  f = hir_desc_defaults(NULL);
  CHECK(f.eval.number_of_streams == 4 && f.eval.timeout_ms == 600000 && f.lower.should_merge == hir_merge_default);
  CHECK(f.lower.stream.parts == 1 && f.warmup == 0 && f.iters == 0 && f.memory_limit == 0 && !f.machine && !f.eval.backend);
  memset(&d, 0, sizeof d);
  d.lower.stream.schedule = HIR_SCHEDULE_COLLECTIVE;
  d.lower.my_device = 1, d.eval.number_of_streams = 3, d.eval.timeout_ms = 5, d.eval.graph = HIR_GRAPH_STAGED, d.iters = 7;
  f = hir_desc_defaults(&d);
  CHECK(f.lower.stream.parts == 2 && f.lower.my_device == 1 && f.eval.number_of_streams == 3 && f.eval.timeout_ms == 5);
  CHECK(f.eval.graph == HIR_GRAPH_STAGED && f.iters == 7);
  d.lower.stream.schedule = HIR_SCHEDULE_RING, d.lower.stream.automatic = 1; /* the model picks the parts */
  CHECK(hir_desc_defaults(&d).lower.stream.parts == 0);
  d.lower.stream.parts = -1, d.eval.number_of_streams = -2; /* wrong values stay, for the entry points to refuse */
  f = hir_desc_defaults(&d);
  CHECK(f.lower.stream.parts == -1 && f.eval.number_of_streams == -2);
  seed_matmul_rs_p2p(&sd, hir_fusion_create(), 2, m2);
  for (sched = HIR_SCHEDULE_LINEAR; sched < HIR_SCHEDULE_COUNT; sched++) {
    hir_program *p0 = NULL, *p1 = NULL;
    memset(&d, 0, sizeof d);
    d.lower.stream.schedule = sched;
    f = hir_desc_defaults(&d);
    CHECK(hir_lower(sd.f, &d.lower, &p0) == HIR_OK && hir_lower(sd.f, &f.lower, &p1) == HIR_OK);
    hir_program_snprint(p0, zero_text, sizeof zero_text);
    hir_program_snprint(p1, filled_text, sizeof filled_text);
    if (strcmp(zero_text, filled_text) != 0 || !strstr(zero_text, "FOR") != (sched == HIR_SCHEDULE_SERIAL)) {
      fprintf(stderr, "  test_stream.c: schedule %d: the zero desc's program and the filled one's differ (or the loop is wrong):\n%s\n%s\n",
              (int)sched, zero_text, filled_text);
      hir_test_failures++;
    }
    hir_program_free(p0);
    hir_program_free(p1);
  }
  hir_fusion_free(sd.f);
}

/* The automatic choice: a small AG+GEMM (P2P) lowers serial and still gives
   the right numbers; a large one keeps its pipeline of D chunks, cut into
   parts where communication is much the longer side (and then again the
   right numbers); a GEMM + P2P reduce-scatter alike, uncut when little
   communication is left to hide; shapes missing or miscounted are errors. */
TEST(test_stream_automatic, "stream/automatic", TEST_CPU) {
  static const int m4[4] = {0, 1, 2, 3};
  int64_t small_a[3] = {1, 3, 4}, small_b[2] = {4, 5}, big_a[3] = {1, 4096, 8192}, big_b[2] = {8192, 512};
  int64_t rs_a[4] = {1, 4, 4096, 1024}, rs_b[3] = {1, 1024, 8192}, ag_a[4] = {4, 1, 1024, 8192};
  hir_tensor shapes[2];
  hir_program *p;
  char text[16384];
  hir_comm copy_engines; /* what a communicator with copy-engine send/recv says of itself */
  lowered_case lc;
  spmd_case c;
  seed sd;
  int k;
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 4, m4);
  memset(&lc, 0, sizeof lc);
  memset(shapes, 0, sizeof shapes);
  lc.f = sd.f;
  memset(&copy_engines, 0, sizeof copy_engines);
  lc.d.stream.automatic = 1;
  lc.d.comm = &copy_engines;
  lc.d.stream.input_shapes = shapes;
  lc.d.stream.ninput_shapes = 2;
  for (k = 0; k < 3; k++) { /* small, large, large with send/recv as NCCL kernels */
    shapes[0].dtype = shapes[1].dtype = HIR_F32;
    shapes[0].ndims = 3;
    shapes[1].ndims = 2;
    memcpy(shapes[0].sizes, k ? big_a : small_a, sizeof small_a);
    memcpy(shapes[1].sizes, k ? big_b : small_b, sizeof small_b);
    copy_engines.p2p_copy_engine = k < 2;
    CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK);
    hir_program_snprint(p, text, sizeof text);
    if (k != 1) CHECK(!strncmp(hir_program_plan(p), "serial: ", 8) && !strstr(text, "FOR ") && strstr(text, "Allgather"));
    else CHECK(!strncmp(hir_program_plan(p), "pipelined: 4 chunks", 19) && strstr(text, "FOR StreamIdx"));
    if (k == 1) { /* links 10x slower: the exposed GEMM at the end is worth cutting */
      hir_program_free(p);
      lc.d.stream.experimental.link_bytes_per_s = 30e9;
      CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && !strncmp(hir_program_plan(p), "pipelined: 4 chunks x 2 parts", 29));
      hir_program_snprint(p, text, sizeof text);
      CHECK(strstr(text, "parts = 2 )") != NULL);
      lc.d.stream.experimental.link_bytes_per_s = 0;
    }
    if (k == 2)
      CHECK(strstr(hir_program_plan(p), "no overlap: the communicator's send/recv do not run beside the GEMMs (its "
                                        "p2p_copy_engine is 0); times from H200's constants)") != NULL);
    hir_program_free(p);
  }
  copy_engines.p2p_copy_engine = 1;
  memcpy(shapes[0].sizes, small_a, sizeof small_a); /* the serial program's numbers */
  memcpy(shapes[1].sizes, small_b, sizeof small_b);
  case_init(&c, 4);
  c.build = build_lowered_with;
  c.user = &lc;
  seed_data(&c, "AG_matmul_P2p", 4);
  RUN_CASE(&c, "AG_matmul_P2p, automatic (serial)");
  lc.d.stream.experimental.gemm_flops_per_s = lc.d.stream.experimental.link_bytes_per_s = 1e3; /* slow GEMMs and links, free chunks: cut all 3 rows */
  lc.d.stream.experimental.chunk_overhead_s = 1e-9;
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && strstr(hir_program_plan(p), "pipelined: 4 chunks x 3 parts") != NULL &&
        !strstr(hir_program_plan(p), "H200")); /* the caller's constants */
  hir_program_snprint(p, text, sizeof text);
  CHECK(strstr(text, "FOR StreamIdx in iStreamIdx") && strstr(text, "* 3 )}") && strstr(text, "parts = 3 )"));
  hir_program_free(p);
  case_init(&c, 4);
  c.build = build_lowered_with;
  c.user = &lc;
  seed_data(&c, "AG_matmul_P2p", 4);
  RUN_CASE(&c, "AG_matmul_P2p, automatic (4 chunks x 3 parts)");
  lc.d.stream.parts = 1; /* the caller's count stands */
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && !strncmp(hir_program_plan(p), "pipelined: 4 chunks, ", 21));
  hir_program_free(p);
  lc.d.stream.parts = 0;
  lc.d.stream.experimental.gemm_flops_per_s = lc.d.stream.experimental.link_bytes_per_s = lc.d.stream.experimental.chunk_overhead_s = 0;
  shapes[1].ndims = 3; /* one axis too many */
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_ERR_SHAPE && strstr(hir_program_error(p), "input_shapes[1] has 3 axes; T1 has 2"));
  hir_program_free(p);
  shapes[1].ndims = 2;
  lc.d.stream.ninput_shapes = 1;
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "1 input_shapes given for a fusion of 2"));
  hir_program_free(p);
  lc.d.stream.input_shapes = NULL;
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "needs stream.input_shapes"));
  hir_program_free(p);
  hir_fusion_free(sd.f);

  seed_matmul_rs_p2p(&sd, hir_fusion_create(), 4, m4); /* f32: 5.5 ms of GEMM, 1.3 of communication */
  lc.f = sd.f;
  lc.d.stream.input_shapes = shapes;
  lc.d.stream.ninput_shapes = 2;
  shapes[0].ndims = 4;
  shapes[1].ndims = 3;
  memcpy(shapes[0].sizes, rs_a, sizeof rs_a);
  memcpy(shapes[1].sizes, rs_b, sizeof rs_b);
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && !strncmp(hir_program_plan(p), "pipelined: 4 chunks", 19));
  hir_program_free(p);
  memcpy(shapes[0].sizes, rs_a, sizeof rs_a); /* a quarter of the rows: too little communication left to hide to pay for parts */
  shapes[0].sizes[2] /= 4;
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && !strncmp(hir_program_plan(p), "pipelined: 4 chunks, predicted", 30));
  hir_program_free(p);
  hir_fusion_free(sd.f);

  /* collectives per chunk do not overlap: this layout gathers an inner axis,
     which the serial form does around permutes (it used to lower only as
     the pipeline) */
  seed_ag_matmul(&sd, hir_fusion_create(), 4, m4);
  lc.f = sd.f;
  shapes[0].ndims = 4;
  shapes[1].ndims = 2;
  memcpy(shapes[0].sizes, ag_a, sizeof ag_a);
  memcpy(shapes[1].sizes, big_b, sizeof big_b);
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK && !strncmp(hir_program_plan(p), "serial: predicted", 17));
  hir_program_snprint(p, text, sizeof text);
  CHECK(strstr(text, "FOR StreamIdx") == NULL && strstr(text, "Set.Permute") != NULL && strstr(text, "type=Allgather") != NULL);
  hir_program_free(p);
  hir_fusion_free(sd.f);
}

/* The timeline: each rank's evaluator records the nodes it runs, runs add
   up, the JSON has a process per rank and a track per stream; clearing and
   bad arguments. */
typedef struct timeline_ctx {
  hir_local_world *w;
  hir_comm *comm[2];       /* NULL: the local world's */
  const hir_fusion *f;
  hir_tensor a[2], b[2];
  hir_program *p[2];
  hir_evaluator *ev[2];
  hir_backend *backend[2]; /* NULL: the CPU's */
  int after_one[2];
} timeline_ctx;

static hir_status timeline_rank(int rank, void *user) {
  timeline_ctx *x = (timeline_ctx *)user;
  hir_lower_desc d;
  hir_eval_desc ed;
  hir_tensor in[2], out = {0};
  hir_status s;
  memset(&d, 0, sizeof d);
  memset(&ed, 0, sizeof ed);
  d.my_device = rank;
  ed.comm = x->comm[rank] ? x->comm[rank] : hir_local_comm(x->w, rank);
  ed.number_of_streams = 2;
  ed.backend = x->backend[rank];
  if ((s = hir_lower(x->f, &d, &x->p[rank])) != HIR_OK || (s = hir_evaluator_create(x->p[rank], &ed, &x->ev[rank])) != HIR_OK)
    return s;
  if ((s = hir_evaluator_record_timeline(x->ev[rank], 1)) != HIR_OK) return s;
  in[0] = x->a[rank];
  in[1] = x->b[rank];
  if ((s = hir_run(x->ev[rank], in, 2, &out, 1)) != HIR_OK || (s = hir_evaluator_sync(x->ev[rank])) != HIR_OK) return s;
  x->after_one[rank] = hir_evaluator_timeline_size(x->ev[rank]);
  if ((s = hir_run(x->ev[rank], in, 2, &out, 1)) != HIR_OK) return s;
  return hir_evaluator_sync(x->ev[rank]);
}

TEST(test_stream_timeline, "stream/timeline", TEST_CPU) {
  static const int m2[2] = {0, 1};
  int64_t sa[3] = {1, 3, 4}, sb[2] = {4, 5};
  timeline_ctx x;
  seed sd;
  FILE *fp = tmpfile();
  char *text = NULL;
  long n = 0;
  int r, spans = 0, xs = 0;
  const char *c;
  memset(&x, 0, sizeof x);
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 2, m2);
  x.f = sd.f;
  x.w = hir_local_world_create(2);
  x.a[0] = trand(HIR_F32, 3, sa);
  x.a[1] = trand(HIR_F32, 3, sa);
  x.b[0] = x.b[1] = trand(HIR_F32, 2, sb);
  CHECK(fp != NULL && hir_spmd(2, timeline_rank, &x) == HIR_OK);
  for (r = 0; r < 2; r++) {
    CHECK(x.after_one[r] > 10 && hir_evaluator_timeline_size(x.ev[r]) == 2 * x.after_one[r]); /* runs add up */
    spans += hir_evaluator_timeline_size(x.ev[r]);
  }
  CHECK(fp && hir_timeline_write(x.ev, 2, fp) == HIR_OK);
  if (fp && (n = ftell(fp)) > 0 && (text = (char *)malloc((size_t)n + 1)) != NULL) {
    rewind(fp);
    n = (long)fread(text, 1, (size_t)n, fp);
    text[n] = 0;
    for (c = text; (c = strstr(c, "\"ph\": \"X\"")) != NULL; c++) xs++;
    CHECK(xs == spans);
    CHECK(!strncmp(text, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", 42) && strstr(text, "\n]}\n") == text + n - 4);
    CHECK(strstr(text, "\"name\": \"rank 1 (cpu)\"") && strstr(text, "\"pid\": 1, \"tid\": 2, ") && strstr(text, "MatmulOp"));
  }
  CHECK(hir_timeline_write(NULL, 2, stderr) == HIR_ERR_INVALID && hir_timeline_write(x.ev, 0, stderr) == HIR_ERR_INVALID);
  CHECK(hir_evaluator_record_timeline(x.ev[0], 0) == HIR_OK); /* stopping clears */
  CHECK(hir_evaluator_record_timeline(NULL, 1) == HIR_ERR_INVALID);
  CHECK(hir_evaluator_timeline_size(x.ev[0]) == 0);
  free(text);
  if (fp) fclose(fp);
  for (r = 0; r < 2; r++) {
    hir_evaluator_free(x.ev[r]);
    hir_program_free(x.p[r]);
    tfree(&x.a[r]);
  }
  tfree(&x.b[0]);
  hir_local_world_free(x.w);
  hir_fusion_free(sd.f);
}

/* GPU spans, on the CPU: a backend that keeps time the way a GPU's events do
   (an event notes the clock when recorded; elapsed is refused until both
   events have passed) lets the timeline's GPU half run here. Checked: spans
   exist per stream, lie inside the run, never inside a coalescing group
   (EndCoalescing times the group), and a pending event fails the write
   before anything is written. */
typedef struct tick { double t; int passed; } tick;
typedef struct clocked {
  hir_backend b; /* the CPU backend's table with timing added; first, so self casts back */
  hir_backend *cpu;
  tick *ticks;
  int nticks, cap, pending;
} clocked;

static double wall_us(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}
static int is_tick(clocked *c, void *e) { return (tick *)e >= c->ticks && (tick *)e < c->ticks + c->cap; }
static hir_status clocked_timer(hir_backend *b, void **e) {
  clocked *c = (clocked *)b;
  if (c->nticks == c->cap) return HIR_ERR_NOMEM;
  c->ticks[c->nticks].passed = 0;
  *e = &c->ticks[c->nticks++];
  return HIR_OK;
}
static hir_status clocked_elapsed(hir_backend *b, void *from, void *to, double *ms) {
  clocked *c = (clocked *)b;
  if (c->pending || !((tick *)from)->passed || !((tick *)to)->passed) return HIR_ERR_TIMEOUT;
  *ms = (((tick *)to)->t - ((tick *)from)->t) * 1e-3;
  return HIR_OK;
}
static hir_status clocked_record(hir_backend *b, void *e, void *stream) {
  clocked *c = (clocked *)b;
  if (!is_tick(c, e)) return c->cpu->event_record(c->cpu, e, stream);
  ((tick *)e)->t = wall_us(); /* the CPU's work is done when it is issued */
  ((tick *)e)->passed = 1;
  return HIR_OK;
}
static void clocked_destroy_event(hir_backend *b, void *e) {
  clocked *c = (clocked *)b;
  if (!is_tick(c, e)) c->cpu->event_destroy(c->cpu, e);
}

TEST(test_stream_timeline_gpu_spans, "stream/timeline_gpu_spans", TEST_CPU) {
  static const int m2[2] = {0, 1};
  int64_t sa[3] = {1, 3, 4}, sb[2] = {4, 5};
  clocked c[2];
  timeline_ctx x;
  seed sd;
  FILE *fp = tmpfile();
  char line[512];
  int r, k, gpu = 0, host = 0, matmuls = 0, ends = 0, names = 0;
  double start = wall_us(), stop;
  memset(&x, 0, sizeof x);
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 2, m2);
  x.f = sd.f;
  x.w = hir_local_world_create(2);
  for (r = 0; r < 2; r++) {
    memset(&c[r], 0, sizeof c[r]);
    c[r].cpu = hir_backend_cpu_create();
    c[r].cap = 1 << 15;
    c[r].ticks = (tick *)malloc((size_t)c[r].cap * sizeof(tick));
    if (c[r].cpu) c[r].b = *c[r].cpu;
    c[r].b.timer_create = clocked_timer;
    c[r].b.timer_elapsed = clocked_elapsed;
    c[r].b.event_record = clocked_record;
    c[r].b.event_destroy = clocked_destroy_event;
    x.backend[r] = &c[r].b;
    x.a[r] = trand(HIR_F32, 3, sa);
  }
  x.b[0] = x.b[1] = trand(HIR_F32, 2, sb);
  CHECK(fp && c[0].cpu && c[1].cpu && c[0].ticks && c[1].ticks && hir_spmd(2, timeline_rank, &x) == HIR_OK);
  stop = wall_us();
  c[0].pending = 1; /* an event not yet passed: nothing is written */
  CHECK(fp && hir_timeline_write(x.ev, 2, fp) == HIR_ERR_TIMEOUT && ftell(fp) == 0);
  c[0].pending = 0;
  CHECK(fp && hir_timeline_write(x.ev, 2, fp) == HIR_OK);
  if (fp) rewind(fp);
  while (fp && fgets(line, sizeof line, fp)) { /* one event per line */
    double ts, dur;
    const char *t = strstr(line, "\"ts\": ");
    names += strstr(line, "\"tid\": 5, \"args\": {\"name\": \"stream 1 (GPU)\"}") != NULL;
    names += strstr(line, "\"tid\": 0, \"args\": {\"name\": \"the caller's stream (host)\"}") != NULL;
    if (!strstr(line, "\"ph\": \"X\"")) continue;
    if (!strstr(line, "\"cat\": \"gpu\"")) {
      host++;
      continue;
    }
    gpu++;
    matmuls += strstr(line, "MatmulOp") != NULL;
    ends += strstr(line, "EndCoalescing") != NULL;
    CHECK(!strstr(line, "P2PCommunication") && !strstr(line, "StartCoalescing") && !strstr(line, "HirAliasSelect") &&
          !strstr(line, "SetCurrentStream"));
    CHECK(t && sscanf(t, "\"ts\": %lf, \"dur\": %lf", &ts, &dur) == 2 && ts >= 0 && dur >= 0 && ts + dur <= stop - start);
    CHECK(strstr(line, "\"tid\": 3,") || strstr(line, "\"tid\": 4,") || strstr(line, "\"tid\": 5,")); /* GPU tracks */
  }
  CHECK(gpu > 0 && gpu < host && names == 2 * 2);
  CHECK(matmuls == 2 * 2 * 2 && ends == 2 * 2 * 1); /* ranks x runs x chunks; one group per peer */
  for (k = 0; k < 2; k++) CHECK(hir_evaluator_record_timeline(x.ev[k], 0) == HIR_OK);
  for (r = 0; r < 2; r++) {
    hir_evaluator_free(x.ev[r]);
    hir_program_free(x.p[r]);
    tfree(&x.a[r]);
    hir_backend_free(c[r].cpu);
    free(c[r].ticks);
  }
  if (fp) fclose(fp);
  tfree(&x.b[0]);
  hir_local_world_free(x.w);
  hir_fusion_free(sd.f);
}
