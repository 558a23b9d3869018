/* Right numbers or a clear refusal on edge inputs:
   batched matmuls stream-lowered along every axis, the automatic choice on
   empty tensors, scalar expressions that would trap, sizes that overflow,
   HOSTIR_DUMP values, an Allreduce of nothing, memory a backend cannot reach. Numbers against references
   computed here on random data, outputs poisoned first (the harness). */
#include "seeds.h"
#include "test.h"
#include <stdint.h>

/* out[b..., m, n] = sum_k a[.., m, k] x[.., k, n] for a [Ba, M, K], x [Bx, K, N]
   with Ba or Bx 1 (broadcast) or the same. */
static hir_tensor ref_batched(const hir_tensor *a, const hir_tensor *x) {
  int64_t Ba = a->sizes[0], Bx = x->sizes[0], B = Ba > Bx ? Ba : Bx, M = a->sizes[1], K = a->sizes[2], N = x->sizes[2];
  int64_t sz[3], i, m, n, k;
  hir_tensor o;
  sz[0] = B, sz[1] = M, sz[2] = N;
  o = tn(a->dtype, 3, sz);
  for (i = 0; i < B; i++)
    for (m = 0; m < M; m++)
      for (n = 0; n < N; n++) {
        double s = 0;
        for (k = 0; k < K; k++) s += tget(a, ((Ba > 1 ? i : 0) * M + m) * K + k) * tget(x, ((Bx > 1 ? i : 0) * K + k) * N + n);
        tset(&o, (i * M + m) * N + n, s);
      }
  return o;
}

/* A batched matmul, and one whose A is broadcast over the batch, with the
   output's Stream axis on the batch, M and N in turn: each chunk is a view
   without that axis, and must stay the same matrix product (the M and N
   chunks once read their views as other matrices). On one rank, and on 3
   with every tensor replicated. */
TEST(test_robust_batched_matmul_streams, "robust/batched_matmul_streams", TEST_CPU) {
  int64_t sa[3] = {3, 4, 5}, sb[3] = {3, 5, 6};
  int kind, axis, dt, world, bflags[3] = {1, 0, 0};
  for (kind = 0; kind < 2; kind++)
    for (axis = 0; axis < 3; axis++)
      for (dt = 0; dt < 2; dt++)
        for (world = 1; world <= 3; world += 2) {
          hir_dtype d = dt ? HIR_F64 : HIR_F32;
          hir_fusion *f = hir_fusion_create();
          hir_tv *a0 = hir_input(f, d, 3 - kind), *b = hir_input(f, d, 3);
          hir_tv *a = kind ? hir_broadcast(f, a0, 3, bflags) : a0, *c = hir_matmul(f, a, b);
          hir_tensor a3;
          char what[96];
          spmd_case sc;
          hir_output(f, c);
          if (world > 1) { /* every tensor on the world, replicated */
            hir_set_mesh(a0, world, iota_mesh);
            hir_set_mesh(b, world, iota_mesh);
            hir_set_mesh(c, world, iota_mesh);
          }
          hir_parallelize(c, axis, HIR_STREAM);
          case_init(&sc, world);
          sc.build = build_lowered;
          sc.user = f;
          sc.nin = 2;
          sc.nout = 1;
          sc.prealloc = axis & 1;
          sc.tol = dt ? 1e-12 : 1e-5;
          sc.in[0] = trand(d, 3 - kind, sa + kind);
          sc.in[1] = trand(d, 3, sb);
          a3 = sc.in[0]; /* the reference sees A as [1, M, K] when it is broadcast */
          if (kind) a3.ndims = 3, a3.sizes[0] = 1, a3.sizes[1] = sa[1], a3.sizes[2] = sa[2];
          sc.out[0] = ref_batched(&a3, &sc.in[1]);
          snprintf(what, sizeof what, "%s matmul, Stream on output axis %d, %s", kind ? "broadcast-batch" : "batched", axis,
                   hir_dtype_name(d));
          RUN_CASE(&sc, what);
          hir_fusion_free(f);
        }
}

/* A batch of size 1 that the fusion does not declare a broadcast axis, read
   chunk by chunk along a Stream batch axis of 3: refused by name (the
   hazard: only the first batch returned). */
TEST(test_robust_stream_extent_mismatch, "robust/stream_extent_mismatch", TEST_CPU) {
  int64_t sa[3] = {1, 4, 5}, sb[3] = {3, 5, 6};
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 3), *c = hir_matmul(f, a, b);
  hir_lower_desc ld;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in[2], out[1];
  memset(&ld, 0, sizeof ld);
  hir_output(f, c);
  hir_parallelize(c, 0, HIR_STREAM);
  hir_parallelize(b, 0, HIR_SERIAL);
  in[0] = trand(HIR_F32, 3, sa);
  in[1] = trand(HIR_F32, 3, sb);
  memset(out, 0, sizeof out);
  CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, NULL, &ev) == HIR_OK);
  CHECK(hir_run(ev, in, 2, out, 1) == HIR_ERR_SHAPE);
  CHECK(strstr(hir_evaluator_error(ev), "T1 axis 0 has size 3, but the Stream axis it is read along has 1 chunks") != NULL);
  hir_evaluator_free(ev);
  hir_program_free(p);
  tfree(&in[0]);
  tfree(&in[1]);
  hir_fusion_free(f);
}

/* The automatic choice on tensors of zero rows: it chooses (serial) and the
   program runs, on 4 ranks, to empty outputs; it never lowers to nothing. */
TEST(test_robust_automatic_zero_size, "robust/automatic_zero_size", TEST_CPU) {
  static const int m4[4] = {0, 1, 2, 3};
  int64_t sa[3] = {1, 0, 6}, sb[2] = {6, 5}, ga[3] = {4, 0, 6}, go[3] = {4, 0, 5};
  hir_tensor shapes[2];
  hir_comm copy_engines;
  lowered_case lc;
  spmd_case c;
  hir_program *p;
  seed sd;
  seed_ag_matmul_p2p(&sd, hir_fusion_create(), 4, m4);
  memset(&lc, 0, sizeof lc);
  memset(shapes, 0, sizeof shapes);
  memset(&copy_engines, 0, sizeof copy_engines);
  copy_engines.p2p_copy_engine = 1;
  shapes[0].dtype = shapes[1].dtype = HIR_F32;
  shapes[0].ndims = 3;
  shapes[1].ndims = 2;
  memcpy(shapes[0].sizes, sa, sizeof sa);
  memcpy(shapes[1].sizes, sb, sizeof sb);
  lc.f = sd.f;
  lc.d.comm = &copy_engines;
  lc.d.stream.automatic = 1;
  lc.d.stream.input_shapes = shapes;
  lc.d.stream.ninput_shapes = 2;
  CHECK(hir_lower(sd.f, &lc.d, &p) == HIR_OK);
  CHECK(!strncmp(hir_program_plan(p), "serial: ", 8));
  CHECK(hir_program_ntop(p) > 0);
  hir_program_free(p);
  case_init(&c, 4);
  c.build = build_lowered_with;
  c.user = &lc;
  c.nin = 2;
  c.nout = 1;
  c.prealloc = 1;
  c.in[0] = trand(HIR_F32, 3, ga);
  c.in[1] = trand(HIR_F32, 2, sb);
  c.out[0] = tn(HIR_F32, 3, go);
  RUN_CASE(&c, "AG_matmul_P2p, automatic, zero rows");
  hir_fusion_free(sd.f);
}

/* Predicates whose arithmetic would trap in C (INT64_MIN / -1, % -1) or
   overflow: every scalar operation is defined, the program runs. Here the
   quotient wraps to INT64_MIN, so the then-branch copies in to out. */
TEST(test_robust_scalars, "robust/scalars", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *in = hir_input(f, HIR_F32, 1), *out = hir_set(f, in);
  hir_val *lo = hir_val_const(f, INT64_MIN), *m1 = hir_val_const(f, -1);
  hir_val *q = hir_val_binary(f, HIR_SCALAR_DIV, lo, m1), *r = hir_val_binary(f, HIR_SCALAR_MOD, lo, m1);
  hir_val *big = hir_val_binary(f, HIR_SCALAR_MUL, lo, lo);               /* overflows: wraps to 0 */
  hir_val *pred = hir_val_binary(f, HIR_SCALAR_AND, hir_val_binary(f, HIR_SCALAR_EQ, q, lo),
                                 hir_val_binary(f, HIR_SCALAR_EQ, hir_val_binary(f, HIR_SCALAR_ADD, r, big), hir_val_const(f, 0)));
  hir_expr *ite = hir_host_if(p, pred);
  hir_evaluator *ev = NULL;
  float x[3] = {1.5f, -2.5f, 3.25f}, y[3] = {-9, -9, -9};
  hir_tensor tin = {x, HIR_F32, 1, {3}, {0}}, tout = {y, HIR_F32, 1, {3}, {0}};
  hir_output(f, out);
  hir_scope_append(hir_expr_body(ite), hir_tv_definition(out));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, out));
  hir_scope_append(hir_program_body(p), ite);
  CHECK(hir_program_verify(p) == HIR_OK);
  CHECK(hir_evaluator_create(p, NULL, &ev) == HIR_OK && hir_run(ev, &tin, 1, &tout, 1) == HIR_OK);
  CHECK(y[0] == x[0] && y[1] == x[1] && y[2] == x[2]);
  hir_evaluator_free(ev);
  hir_program_free(p);
}

/* Sizes whose product overflows: refused by name before anything is
   allocated or written (the output keeps its poison). */
TEST(test_robust_huge_sizes, "robust/huge_sizes", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  hir_lower_desc ld;
  hir_program *p;
  hir_evaluator *ev = NULL;
  float dummy = 7;
  hir_tensor in[2] = {{&dummy, HIR_F32, 2, {((int64_t)1 << 60) + 1, 0}, {0}}, {&dummy, HIR_F32, 2, {0, ((int64_t)1 << 60) + 1}, {0}}};
  hir_tensor huge = {&dummy, HIR_F32, 2, {(int64_t)1 << 62, 8}, {0}}, out[1];
  memset(&ld, 0, sizeof ld);
  memset(out, 0, sizeof out);
  hir_output(f, c);
  CHECK(hir_lower(f, &ld, &p) == HIR_OK);
  CHECK(hir_evaluator_create(p, NULL, &ev) == HIR_OK);
  CHECK(hir_run(ev, in, 2, out, 1) == HIR_ERR_SHAPE); /* K = 0: C would be (2^60 + 1)^2 elements */
  CHECK(strstr(hir_evaluator_error(ev), "T2 would be [1152921504606846977, 1152921504606846977] float elements") != NULL);
  in[0] = huge;
  CHECK(hir_run(ev, in, 2, out, 1) == HIR_ERR_SHAPE); /* an input itself too large */
  CHECK(strstr(hir_evaluator_error(ev), "input 0 (T0) has more bytes than this machine addresses") != NULL);
  CHECK(dummy == 7);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
}

/* HOSTIR_DUMP takes host_ir, passes and all, comma-separated; anything else
   fails hir_lower with the valid values (no silent substring matches). */
TEST(test_robust_dump_values, "robust/dump_values", TEST_CPU) {
  static const char *const bad[] = {"small", "HOST_IR", "hostir", "1", "host_ir,bogus"};
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 1);
  hir_lower_desc ld;
  hir_program *p;
  int k;
  memset(&ld, 0, sizeof ld);
  hir_output(f, hir_set(f, a));
  for (k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
    setenv("HOSTIR_DUMP", bad[k], 1);
    CHECK(hir_lower(f, &ld, &p) == HIR_ERR_INVALID);
    CHECK(strstr(hir_program_error(p), "HOSTIR_DUMP has the unknown value") && strstr(hir_program_error(p), "give host_ir, passes or all"));
    hir_program_free(p);
  }
  setenv("HOSTIR_DUMP", "", 1); /* empty: nothing to dump */
  CHECK(hir_lower(f, &ld, &p) == HIR_OK);
  hir_program_free(p);
  unsetenv("HOSTIR_DUMP");
  hir_fusion_free(f);
}

/* An Allreduce and a ReduceScatter of nothing (zero rows) on 2 ranks. */
TEST(test_robust_empty_collectives, "robust/empty_collectives", TEST_CPU) {
  int64_t sz[3] = {2, 0, 3}, osz[2] = {0, 3};
  int axis = 0;
  spmd_case c;
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_sum(f, a, 1, &axis);
  hir_output(f, b);
  hir_set_mesh(a, 2, iota_mesh);
  hir_set_mesh(b, 2, iota_mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  case_init(&c, 2);
  c.build = build_lowered;
  c.user = f;
  c.nin = c.nout = 1;
  c.in[0] = trand(HIR_F32, 3, sz);
  c.out[0] = tn(HIR_F32, 2, osz);
  RUN_CASE(&c, "an Allreduce of zero elements");
  hir_fusion_free(f);
}

/* An intermediate computed on one mesh and moved to another, for each
   communication it makes (nvFuser's pipeline tests: Bcast, Gather, Scatter,
   Bcast_sharded, Reduce between two stages): every rank of 4 runs its
   program, against the plain reference. Devices outside a stage's mesh once
   got an internal error (the move read a tensor nothing there defines). */
typedef struct two_stage {
  const char *name;
  int n_in, mesh_in[2], in_sharded;  /* stage 1: b = a + a on mesh_in */
  int n_out, mesh_out[2], out_sharded, out_sum; /* stage 2: c = set(b) (or sum over axis 0) on mesh_out */
} two_stage;

TEST(test_robust_cross_mesh_intermediates, "robust/cross_mesh_intermediates", TEST_CPU | TEST_GPU_WORLDS) {
  static const two_stage cases[] = {
      {"Bcast", 1, {0}, 0, 2, {1, 2}, 0, 0},           {"Gather", 2, {0, 1}, 1, 1, {2}, 0, 0},
      {"Scatter", 1, {0}, 0, 2, {0, 3}, 1, 0},         {"Bcast_sharded", 2, {0, 1}, 1, 2, {2, 3}, 1, 0},
      {"Reduce", 2, {0, 1}, 1, 1, {3}, 0, 1},          {"Allgather elsewhere", 2, {2, 0}, 1, 2, {1, 3}, 0, 0}};
  int k;
  for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
    const two_stage *t = &cases[k];
    int D = t->in_sharded ? t->n_in : t->n_out, axis0 = 0, i;
    int64_t sz[3] = {D, 3, 4}, osz[3] = {D, 3, 4};
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_add(f, a, a), *c = t->out_sum ? hir_sum(f, b, 1, &axis0) : hir_set(f, b);
    spmd_case sc;
    hir_output(f, c);
    hir_set_mesh(a, t->n_in, t->mesh_in);
    hir_set_mesh(b, t->n_in, t->mesh_in);
    hir_set_mesh(c, t->n_out, t->mesh_out);
    if (t->in_sharded) hir_parallelize(a, 0, HIR_DIDX), hir_parallelize(b, 0, HIR_DIDX);
    if (t->out_sharded) hir_parallelize(c, 0, HIR_DIDX);
    case_init(&sc, 4);
    sc.build = build_lowered;
    sc.user = f;
    sc.nin = sc.nout = 1;
    sc.prealloc = k & 1;
    sc.in[0] = trand(HIR_F32, 3, sz);
    if (t->out_sum) { /* c [3, 4] = sum over the D slices of 2a */
      sc.out[0] = tn(HIR_F32, 2, osz + 1);
      for (i = 0; i < 12; i++) {
        double s = 0;
        int d;
        for (d = 0; d < D; d++) s += 2 * tget(&sc.in[0], d * 12 + i);
        tset(&sc.out[0], i, s);
      }
    } else {
      sc.out[0] = tn(HIR_F32, 3, osz);
      for (i = 0; i < D * 12; i++) tset(&sc.out[0], i, 2 * tget(&sc.in[0], i));
    }
    RUN_CASE(&sc, t->name);
    hir_fusion_free(f);
  }
}

/* A broadcast on one device, then an add of it with itself on two: device
   1 once got an internal error; the moved tensor is now moved once. */
TEST(test_robust_broadcast_then_add, "robust/broadcast_then_add", TEST_CPU | TEST_GPU_WORLDS) {
  int d0 = 0, m01[2] = {0, 1}, flags[3] = {1, 0, 0}, i;
  int64_t sz[2] = {3, 4}, osz[3] = {1, 3, 4};
  hir_fusion *f = hir_fusion_create();
  hir_tv *t0 = hir_input(f, HIR_F32, 2), *t1 = hir_broadcast(f, t0, 3, flags), *t2 = hir_add(f, t1, t1);
  hir_lower_desc ld;
  hir_program *p;
  char text[8192];
  spmd_case sc;
  hir_output(f, t2);
  hir_set_mesh(t0, 1, &d0);
  hir_set_mesh(t1, 1, &d0);
  hir_set_mesh(t2, 2, m01);
  memset(&ld, 0, sizeof ld);
  ld.my_device = 1;
  CHECK(hir_lower(f, &ld, &p) == HIR_OK);
  hir_program_snprint(p, text, sizeof text);
  CHECK(strstr(text, "type=Broadcast") && !strstr(strstr(text, "type=Broadcast") + 1, "type=Broadcast")); /* once */
  hir_program_free(p);
  case_init(&sc, 2);
  sc.build = build_lowered;
  sc.user = f;
  sc.nin = sc.nout = 1;
  sc.in[0] = trand(HIR_F32, 2, sz);
  sc.out[0] = tn(HIR_F32, 3, osz);
  for (i = 0; i < 12; i++) tset(&sc.out[0], i, 2 * tget(&sc.in[0], i));
  RUN_CASE(&sc, "broadcast on {0}, then T1 + T1 on {0 1}");
  hir_fusion_free(f);
}

/* One input broadcast onto two meshes, {0 1} and its own {2 1}: the two
   broadcasts share a unit, so device 2 holds a unit that reads the tensor
   moved to {0 1}, which lives elsewhere (the fuzzer's find: an internal
   error at lowering). */
TEST(test_robust_unit_across_meshes, "robust/unit_across_meshes", TEST_CPU | TEST_GPU_WORLDS) {
  int m21[2] = {2, 1}, m01[2] = {0, 1}, flags[3] = {1, 0, 0}, i;
  int64_t sz[2] = {3, 4}, osz[3] = {1, 3, 4};
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *moved = hir_broadcast(f, a, 3, flags), *kept = hir_broadcast(f, a, 3, flags);
  spmd_case sc;
  hir_output(f, moved);
  hir_output(f, kept);
  hir_set_mesh(a, 2, m21);
  hir_set_mesh(moved, 2, m01);
  hir_set_mesh(kept, 2, m21);
  case_init(&sc, 3);
  sc.build = build_lowered;
  sc.user = f;
  sc.nin = 1;
  sc.nout = 2;
  sc.in[0] = trand(HIR_F32, 2, sz);
  sc.out[0] = tn(HIR_F32, 3, osz);
  sc.out[1] = tn(HIR_F32, 3, osz);
  for (i = 0; i < 12; i++) tset(&sc.out[0], i, tget(&sc.in[0], i)), tset(&sc.out[1], i, tget(&sc.in[0], i));
  RUN_CASE(&sc, "a on {2 1}, broadcast onto {0 1} and onto {2 1}");
  hir_fusion_free(f);
}

/* A hand-built SendRecv whose team lists the receiver first (nvFuser's
   order: team {0, 1}, root 1) sends to the receiver, not to itself. */
static hir_program *sendrecv_program(void *user, int rank) {
  static const int teams[2][2] = {{0, 1}, {1, 0}};
  const int *team = teams[*(int *)user];
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a);
  int one = 1, zero = 0;
  (void)rank;
  hir_output(f, b);
  hir_set_mesh(a, 1, &one); /* the sender, device 1, to device 0 */
  hir_set_mesh(b, 1, &zero);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, b));
  hir_scope_append(hir_program_body(p), hir_host_communication(p, HIR_COLL_SENDRECV, 2, team, 1, a, b));
  return p;
}

TEST(test_robust_sendrecv_team_order, "robust/sendrecv_team_order", TEST_CPU | TEST_GPU_WORLDS) {
  int order;
  int64_t sz[2] = {2, 5};
  for (order = 0; order < 2; order++) {
    spmd_case sc;
    case_init(&sc, 2);
    sc.build = sendrecv_program;
    sc.user = &order;
    sc.nin = sc.nout = 1;
    sc.prealloc = order;
    sc.in[0] = trand(HIR_F32, 2, sz);
    sc.out[0] = tn(HIR_F32, 2, sz);
    memcpy(sc.out[0].data, sc.in[0].data, 10 * sizeof(float));
    RUN_CASE(&sc, order ? "SendRecv, team {1 0}" : "SendRecv, team {0 1} (receiver first)");
  }
}

/* A P2P allgather whose output's mesh holds the same devices in another
   order ({3 2 1 0} against {0 1 2 3}; the hazard: a failure at run time
   selecting a DIDx axis); and a Stream axis that would read a DIDx axis chunk by
   chunk, refused when lowering. */
TEST(test_robust_permuted_mesh, "robust/permuted_mesh", TEST_CPU | TEST_GPU_WORLDS) {
  static const int fwd[4] = {0, 1, 2, 3}, rev[4] = {3, 2, 1, 0};
  int64_t sz[2] = {4, 6};
  int ring;
  for (ring = 0; ring < 2; ring++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a);
    lowered_case lc;
    spmd_case sc;
    hir_output(f, b);
    hir_set_mesh(a, 4, fwd);
    hir_set_mesh(b, 4, rev);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(b, 0, HIR_STREAM);
    memset(&lc, 0, sizeof lc);
    lc.f = f;
    lc.d.stream.schedule = ring ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
    case_init(&sc, 4);
    sc.build = build_lowered_with;
    sc.user = &lc;
    sc.nin = sc.nout = 1;
    sc.in[0] = trand(HIR_F32, 2, sz);
    sc.out[0] = tn(HIR_F32, 2, sz);
    memcpy(sc.out[0].data, sc.in[0].data, 24 * sizeof(float));
    RUN_CASE(&sc, ring ? "P2P allgather onto {3 2 1 0}, ring" : "P2P allgather onto {3 2 1 0}, linear");
    hir_fusion_free(f);
  }
  { /* a gather onto other devices with a Stream axis on the DIDx axis: no device has chunks of it to read */
    static const int lo[2] = {0, 1}, hi[2] = {2, 3};
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 2), *c = hir_set(f, a);
    hir_lower_desc ld;
    hir_program *p;
    hir_output(f, c);
    hir_set_mesh(a, 2, lo);
    hir_set_mesh(c, 2, hi);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(c, 0, HIR_STREAM);
    memset(&ld, 0, sizeof ld);
    CHECK(hir_lower(f, &ld, &p) == HIR_ERR_UNSUPPORTED);
    CHECK(strstr(hir_program_error(p), "reads T0 chunk by chunk along its DIDx axis") != NULL);
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* One rank rejects its input (a wrong K): the other ranks, waiting for it in
   their exchanges, return within a second (the world's timeout is a minute)
   with HIR_ERR_COMM naming it and why; hir_spmd returns the cause. */
typedef struct failing_ctx {
  hir_local_world *w;
  hir_fusion *f;
  hir_tensor in[4][2];     /* made before the ranks start (trand is not thread-safe) */
  hir_status status[4];
  char error[4][512];
  double ms[4];
} failing_ctx;

static hir_status failing_rank(int rank, void *user) {
  failing_ctx *x = (failing_ctx *)user;
  hir_tensor *in = x->in[rank], out[1];
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  double t0;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  if (rank == 2) { /* the others are already waiting in their first collective, or to compare shapes */
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
  }
  t0 = hir__now_ms();
  if (hir_lower(x->f, &ld, &p) == HIR_OK && (x->status[rank] = hir_evaluator_create(p, &ed, &ev)) == HIR_OK)
    x->status[rank] = hir_run(ev, in, 2, out, 1);
  x->ms[rank] = hir__now_ms() - t0;
  snprintf(x->error[rank], sizeof x->error[rank], "%s", hir_evaluator_error(ev));
  hir_evaluator_free(ev);
  hir_program_free(p);
  return x->status[rank];
}

TEST(test_robust_failing_rank, "robust/failing_rank", TEST_CPU) {
  static const int m4[4] = {0, 1, 2, 3};
  failing_ctx x;
  seed s;
  int r, local;
  for (local = 0; local < 2; local++) { /* then programs that do not communicate: the others wait to compare shapes */
    memset(&x, 0, sizeof x);
    if (!local) {
      seed_ag_matmul_p2p(&s, hir_fusion_create(), 4, m4); /* P2P exchanges, then matmuls */
    } else { /* A [DIDx, M, K] x B [K, N] -> C [DIDx, M, N]: each rank its own rows */
      hir_tv *a, *b, *c;
      s.f = hir_fusion_create();
      a = hir_input(s.f, HIR_F32, 3), b = hir_input(s.f, HIR_F32, 2), c = hir_matmul(s.f, a, b);
      hir_output(s.f, c);
      hir_set_mesh(a, 4, m4), hir_set_mesh(b, 4, m4), hir_set_mesh(c, 4, m4);
      hir_parallelize(a, 0, HIR_DIDX), hir_parallelize(c, 0, HIR_DIDX);
    }
    x.f = s.f;
    x.w = hir_local_world_create(4); /* the default timeout: a minute */
    for (r = 0; r < 4; r++) {
      int64_t sa[3] = {1, 2, 4}, sb[2] = {r == 2 ? 3 : 4, 5};
      x.in[r][0] = trand(HIR_F32, 3, sa);
      x.in[r][1] = trand(HIR_F32, 2, sb);
    }
    CHECK(hir_spmd(4, failing_rank, &x) == HIR_ERR_SHAPE);
    CHECK(x.status[2] == HIR_ERR_SHAPE && strstr(x.error[2], "the contracted sizes differ (4 (input 0, T0, axis 2) vs 3 (input 1, T1, axis 0))"));
    for (r = 0; r < 4; r++) {
      if (r == 2) continue;
      if (!(x.status[r] == HIR_ERR_COMM && x.ms[r] < 1000 && strstr(x.error[r], "the world was aborted: rank 2 failed: hir_run:") &&
            strstr(x.error[r], "the contracted sizes differ (4 (input 0, T0, axis 2) vs 3 (input 1, T1, axis 0))"))) {
        fprintf(stderr, "  rank %d: %s after %.0f ms: %s\n", r, hir_status_str(x.status[r]), x.ms[r], x.error[r]);
        hir_test_failures++;
      }
    }
    for (r = 0; r < 4; r++) tfree(&x.in[r][0]), tfree(&x.in[r][1]);
    hir_local_world_free(x.w);
    hir_fusion_free(s.f);
  }
}

/* Ranks that pass different shapes (rank 2's M is 3, the others' 2): the
   ranks compare the shapes they plan for before anything moves, and every
   rank refuses the run with one message naming the input, its shapes and
   the devices that passed each (NCCL would hang or read past a buffer).
   The world stays usable: the next run, with rank 2's shape mended, is
   compared again and runs. */
typedef struct disagree_ctx {
  hir_local_world *w;
  hir_fusion *f;
  int nin;
  int alone;                        /* the first run agrees; rank 2 alone passes new shapes in the second */
  int check;                        /* hir_eval_desc.check_shapes: compared on every run */
  hir_tensor in[4][2], mended[2];   /* rank 2's inputs for the second run */
  hir_status status[4], second[4];
  char error[4][512];
  hir_tensor out[4];
} disagree_ctx;

/* Rank `rank`'s program of f and its evaluator on the local world (check:
   hir_eval_desc.check_shapes), then a first run into the evaluator's
   buffer; the status, and the message into error. */
static hir_status world_rank_run(const hir_fusion *f, hir_local_world *w, int rank, int check, const hir_tensor *in, int nin,
                                 hir_tensor *out, hir_program **p, hir_evaluator **ev, char *error, size_t cap) {
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_status s;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.comm = hir_local_comm(w, rank);
  ed.check_shapes = check;
  memset(out, 0, sizeof *out); /* the evaluator's buffer: a rank with a new shape would find the caller's wrong itself */
  *ev = NULL;
  if ((s = hir_lower(f, &ld, p)) == HIR_OK && (s = hir_evaluator_create(*p, &ed, ev)) == HIR_OK) s = hir_run(*ev, in, nin, out, 1);
  snprintf(error, cap, "%s", *ev ? hir_evaluator_error(*ev) : hir_program_error(*p));
  return s;
}

static hir_status disagree_rank(int rank, void *user) {
  disagree_ctx *x = (disagree_ctx *)user;
  hir_tensor out[1];
  hir_program *p;
  hir_evaluator *ev;
  x->second[rank] = HIR_ERR_INVALID;
  x->status[rank] = world_rank_run(x->f, x->w, rank, x->check, x->in[rank], x->nin, out, &p, &ev, x->error[rank],
                                   sizeof x->error[rank]);
  if (ev && x->status[rank] == (x->alone ? HIR_OK : HIR_ERR_SHAPE)) {
    out[0] = x->alone ? out[0] : x->out[rank];
    x->second[rank] = hir_run(ev, rank == 2 ? x->mended : x->in[rank], x->nin, out, 1);
    if (x->alone) snprintf(x->error[rank], sizeof x->error[rank], "%s", hir_evaluator_error(ev));
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  return x->status[rank] != HIR_OK ? x->status[rank] : x->second[rank];
}

/* Runs x on 4 ranks: every rank fails with the same message, holding
   `want`; then every rank's second run (rank 2's shape mended) succeeds. */
static void disagree_run(disagree_ctx *x, const char *want) {
  int r;
  x->w = hir_local_world_create(4);
  CHECK(hir_spmd(4, disagree_rank, x) == HIR_ERR_SHAPE);
  for (r = 0; r < 4; r++) {
    if (x->status[r] != HIR_ERR_SHAPE || !strstr(x->error[r], want) || strcmp(x->error[r], x->error[0]) != 0) {
      fprintf(stderr, "  rank %d: %s: %s\n  wanted: %s\n", r, hir_status_str(x->status[r]), x->error[r], want);
      hir_test_failures++;
    }
    if (x->second[r] != HIR_OK) fprintf(stderr, "  rank %d's second run: %s\n", r, hir_status_str(x->second[r])), hir_test_failures++;
  }
  hir_local_world_free(x->w);
}

static void disagree_free(disagree_ctx *x) {
  int r, i;
  for (r = 0; r < 4; r++) {
    for (i = 0; i < x->nin; i++) tfree(&x->in[r][i]);
    tfree(&x->out[r]);
  }
  for (i = 0; i < x->nin; i++) tfree(&x->mended[i]);
  hir_fusion_free(x->f);
}

/* A mesh of 17 devices (more than 8 a tensor): device 16's different shape
   is named like any other's. */
typedef struct wide_ctx {
  hir_local_world *w;
  hir_fusion *f;
  hir_tensor in[17];
  hir_status status[17];
  char error[17][512];
} wide_ctx;

static hir_status wide_rank(int rank, void *user) {
  wide_ctx *x = (wide_ctx *)user;
  hir_tensor out[1];
  hir_program *p;
  hir_evaluator *ev;
  x->status[rank] = world_rank_run(x->f, x->w, rank, 0, &x->in[rank], 1, out, &p, &ev, x->error[rank], sizeof x->error[rank]);
  hir_evaluator_free(ev);
  hir_program_free(p);
  return x->status[rank];
}

TEST(test_robust_wide_mesh_disagree, "robust/wide_mesh_disagree", TEST_CPU) {
  static wide_ctx x;
  int mesh[17], r;
  hir_tv *a, *b;
  memset(&x, 0, sizeof x);
  for (r = 0; r < 17; r++) mesh[r] = r;
  x.f = hir_fusion_create();
  a = hir_input(x.f, HIR_F32, 2), b = hir_set(x.f, a);
  hir_output(x.f, b);
  hir_set_mesh(a, 17, mesh), hir_set_mesh(b, 17, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  for (r = 0; r < 17; r++) {
    int64_t sa[2] = {1, r == 16 ? 3 : 2};
    x.in[r] = trand(HIR_F32, 2, sa);
  }
  x.w = hir_local_world_create(17);
  CHECK(hir_spmd(17, wide_rank, &x) == HIR_ERR_SHAPE);
  for (r = 0; r < 17; r++)
    if (x.status[r] != HIR_ERR_SHAPE || strcmp(x.error[r], x.error[0]) ||
        !strstr(x.error[r], "different shapes for input 0 (T0): [1, 2] on devices 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
                            "15; [1, 3] on device 16")) {
      fprintf(stderr, "  rank %d: %s: %s\n", r, hir_status_str(x.status[r]), x.error[r]);
      hir_test_failures++;
    }
  for (r = 0; r < 17; r++) tfree(&x.in[r]);
  hir_local_world_free(x.w);
  hir_fusion_free(x.f);
}

TEST(test_robust_ranks_disagree, "robust/ranks_disagree", TEST_CPU) {
  static const int m4[4] = {0, 1, 2, 3};
  disagree_ctx x;
  int r, axis = 1, alone;
  for (alone = 0; alone < 3; alone++) { /* Allgather: A [DIDx, M] -> unsharded; 2: alone, compared on every run */
    hir_tv *a, *b;
    int64_t so[2] = {4, 2}, sa[2] = {1, 2}, bad[2] = {1, 3}, i;
    memset(&x, 0, sizeof x);
    x.f = hir_fusion_create();
    a = hir_input(x.f, HIR_F32, 2), b = hir_set(x.f, a);
    hir_output(x.f, b);
    hir_set_mesh(a, 4, m4), hir_set_mesh(b, 4, m4);
    hir_parallelize(a, 0, HIR_DIDX);
    x.nin = 1;
    x.alone = alone > 0;
    x.check = alone == 2;
    for (r = 0; r < 4; r++) {
      x.in[r][0] = trand(HIR_F32, 2, r == 2 && !alone ? bad : sa);
      x.out[r] = tn(HIR_F32, 2, so);
      for (i = 0; i < 8; i++) tset(&x.out[r], i, 1e9); /* poison */
    }
    x.mended[0] = trand(HIR_F32, 2, alone ? bad : sa);
    if (!alone) { /* the second run's output holds every rank's shard */
      disagree_run(&x, "hir_run: the ranks passed different shapes for input 0 (T0): [1, 2] on devices 0, 1, 3; [1, 3] on "
                       "device 2; every rank passes the same shape");
      for (r = 0; r < 4; r++)
        for (i = 0; i < 8; i++) {
          const hir_tensor *shard = i / 2 == 2 ? &x.mended[0] : &x.in[i / 2][0];
          if (tget(&x.out[r], i) != tget(shard, i % 2)) {
            fprintf(stderr, "  rank %d: element %d of the gathered output is %g, not %g\n", r, (int)i, tget(&x.out[r], i),
                    tget(shard, i % 2));
            hir_test_failures++;
            break;
          }
        }
    } else { /* the first run agrees; in the second rank 2 alone passes a new M while the others gather: no second run
                returns HIR_OK, each fails naming a disagreement (with check_shapes, one refusal on every rank) */
      x.w = hir_local_world_create(4);
      hir_local_world_set_timeout(x.w, 5000);
      CHECK(hir_spmd(4, disagree_rank, &x) != HIR_OK);
      for (r = 0; r < 4; r++)
        if (x.status[r] != HIR_OK || x.second[r] == HIR_OK ||
            !(x.check ? x.second[r] == HIR_ERR_SHAPE && !strcmp(x.error[r], x.error[0]) &&
                            strstr(x.error[r], "different shapes for input 0 (T0): [1, 2] on devices 0, 1, 3; [1, 3] on device 2")
                      : strstr(x.error[r], "disagree") != NULL)) {
          fprintf(stderr, "  rank %d: first run %s, second %s: %s\n", r, hir_status_str(x.status[r]),
                  hir_status_str(x.second[r]), x.error[r]);
          hir_test_failures++;
        }
      hir_local_world_free(x.w);
    }
    disagree_free(&x);
  }
  { /* Allreduce: sum(A [M, DIDx], {1}) */
    hir_tv *a, *b;
    int64_t sa[2] = {2, 1}, bad[2] = {3, 1};
    memset(&x, 0, sizeof x);
    x.f = hir_fusion_create();
    a = hir_input(x.f, HIR_F64, 2), b = hir_sum(x.f, a, 1, &axis);
    hir_output(x.f, b);
    hir_set_mesh(a, 4, m4), hir_set_mesh(b, 4, m4);
    hir_parallelize(a, 1, HIR_DIDX);
    x.nin = 1;
    for (r = 0; r < 4; r++) x.in[r][0] = trand(HIR_F64, 2, r == 2 ? bad : sa);
    x.mended[0] = trand(HIR_F64, 2, sa);
    disagree_run(&x, "different shapes for input 0 (T0): [2, 1] on devices 0, 1, 3; [3, 1] on device 2");
    disagree_free(&x);
  }
  { /* send/recv of a P2P pipeline */
    seed s;
    int64_t sa[3] = {1, 2, 4}, bad[3] = {1, 3, 4}, sb[2] = {4, 5};
    memset(&x, 0, sizeof x);
    seed_ag_matmul_p2p(&s, hir_fusion_create(), 4, m4);
    x.f = s.f;
    x.nin = 2;
    for (r = 0; r < 4; r++) {
      x.in[r][0] = trand(HIR_F32, 3, r == 2 ? bad : sa);
      x.in[r][1] = trand(HIR_F32, 2, sb);
    }
    x.mended[0] = trand(HIR_F32, 3, sa);
    x.mended[1] = trand(HIR_F32, 2, sb);
    disagree_run(&x, "different shapes for input 0 (T0): [1, 2, 4] on devices 0, 1, 3; [1, 3, 4] on device 2");
    disagree_free(&x);
  }
  { /* a scalar input: A [DIDx, M] * s, gathered */
    hir_tv *a, *b;
    int64_t sa[2] = {1, 3};
    memset(&x, 0, sizeof x);
    x.f = hir_fusion_create();
    a = hir_input(x.f, HIR_F32, 2);
    b = hir_set(x.f, hir_binary_val(x.f, HIR_BINARY_MUL, a, hir_input_scalar(x.f)));
    hir_output(x.f, b);
    hir_set_mesh(a, 4, m4), hir_set_mesh(b, 4, m4);
    hir_parallelize(a, 0, HIR_DIDX);
    x.nin = 2;
    for (r = 0; r < 4; r++) {
      x.in[r][0] = trand(HIR_F32, 2, sa);
      x.in[r][1].sizes[0] = r == 2 ? 4 : 3; /* by value: ndims 0, data NULL */
    }
    x.mended[0] = trand(HIR_F32, 2, sa);
    x.mended[1].sizes[0] = 3;
    disagree_run(&x, "hir_run: the ranks passed different values for scalar input 1: 3 on devices 0, 1, 3; 4 on device 2; "
                     "every rank passes the same value");
    disagree_free(&x);
  }
}

/* A backend that cannot reach some memory (hir_backend.reachable; the CUDA
   backend's says so of host memory from malloc and of another GPU's): a
   tensor there is refused by name, input or output, and the evaluator runs
   the next call on memory it reaches. The backend is asked once per
   address of each argument. Here a CPU backend calls one buffer
   unreachable. */
static const void *unreachable_ptr;
static int reachable_calls;
static int fake_reachable(hir_backend *b, const void *ptr, char *why, size_t cap) {
  (void)b;
  reachable_calls++;
  if (ptr != unreachable_ptr) return 1;
  snprintf(why, cap, "memory this backend cannot read; copy it first");
  return 0;
}

/* A stream that never finishes beside a communicator that sees nothing
   wrong (a dead peer it has not noticed): hir_evaluator_sync, hir_run with
   new shapes (whose old buffers that work may use) and a GPU timeline's
   start must end in HIR_ERR_TIMEOUT at the deadline, never HIR_OK with the
   work unfinished; once the stream is free, the new shapes run and compute. */
static hir_status busy_stream(hir_backend *b, void *stream) { return (void)b, (void)stream, HIR_ERR_TIMEOUT; }
static int quiet_polls;
static hir_status quiet_poll(hir_comm *c) { return (void)c, quiet_polls++, HIR_OK; }
static hir_status no_timer(hir_backend *b, void **event) { return (void)b, *event = NULL, HIR_ERR_UNSUPPORTED; }
static hir_status no_elapsed(hir_backend *b, void *from, void *to, double *ms) {
  return (void)b, (void)from, (void)to, *ms = 0, HIR_ERR_UNSUPPORTED;
}

TEST(test_robust_busy_stream_times_out, "robust/busy_stream_times_out", TEST_CPU) {
  int64_t n = 19, m = 23, i;
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 1);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_lower_desc ld;
  hir_local_world *w = hir_local_world_create(1);
  hir_tensor in = trand(HIR_F32, 1, &n), in2 = trand(HIR_F32, 1, &m), out = tn(HIR_F32, 1, &n), out2 = tn(HIR_F32, 1, &m);
  hir_status (*query)(hir_backend *, void *);
  int k;
  hir_output(f, hir_scalar_binary(f, HIR_BINARY_ADD, 2.5, x));
  memset(&ed, 0, sizeof ed);
  memset(&ld, 0, sizeof ld);
  ed.backend = hir_backend_cpu_create();
  query = ed.backend->stream_query;
  ed.comm = hir_local_comm(w, 0);
  ed.comm->poll = quiet_poll;
  ed.timeout_ms = 60;
  CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  CHECK(ev && hir_run(ev, &in, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
  for (k = 0; ev && k < 2; k++) { /* the sync, then a run with new shapes */
    const char *want = k == 0 ? "hir_evaluator_sync: the streams were still busy after 60 ms"
                              : "hir_run: waiting for the last run's work before planning new shapes: the streams were "
                                "still busy after 60 ms";
    double t0 = hir__now_ms(), ms;
    hir_status s;
    quiet_polls = 0;
    ed.backend->stream_query = busy_stream;
    s = k == 0 ? hir_evaluator_sync(ev) : hir_run(ev, &in2, 1, &out2, 1);
    ms = hir__now_ms() - t0;
    ed.backend->stream_query = query;
    if (!(s == HIR_ERR_TIMEOUT && strstr(hir_evaluator_error(ev), want) && ms >= 55 && ms < 5000 && quiet_polls > 0))
      fprintf(stderr, "  %s: %s after %.0f ms, %d polls: %s\n", k == 0 ? "sync" : "new shapes", hir_status_str(s), ms,
              quiet_polls, hir_evaluator_error(ev)), hir_test_failures++;
  }
  if (ev) { /* a timeline's start waits for the streams too (timers the CPU lacks, never reached) */
    hir_status s;
    quiet_polls = 0;
    ed.backend->timer_create = no_timer;
    ed.backend->timer_elapsed = no_elapsed;
    ed.backend->stream_query = busy_stream;
    s = hir_evaluator_record_timeline(ev, 1);
    ed.backend->stream_query = query;
    ed.backend->timer_create = NULL;
    ed.backend->timer_elapsed = NULL;
    if (!(s == HIR_ERR_TIMEOUT && strstr(hir_evaluator_error(ev), "hir_evaluator_record_timeline: waiting for the streams: the "
                                         "streams were still busy after 60 ms") && quiet_polls > 0))
      fprintf(stderr, "  timeline: %s: %s\n", hir_status_str(s), hir_evaluator_error(ev)), hir_test_failures++;
  }
  for (i = 0; i < m; i++) tset(&out2, i, 1e30);
  CHECK(ev && hir_run(ev, &in2, 1, &out2, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK); /* the new shapes, planned now */
  for (i = 0; i < m; i++)
    if (tget(&out2, i) != (double)(float)(tget(&in2, i) + 2.5)) {
      fprintf(stderr, "  element %d of the new shape: %g\n", (int)i, tget(&out2, i));
      CHECK(0);
      break;
    }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_local_world_free(w);
  hir_fusion_free(f);
  tfree(&in), tfree(&in2), tfree(&out), tfree(&out2);
}

/* An outgrown buffer is not released in the run that outgrows it: work
   issued before may still use it, and a release can wait for the whole
   device (cudaFree) without a deadline. An allgather pipeline on 2 ranks
   whose chunks are staged through contiguous buffers (HIR_SCHEDULE_COLLECTIVE),
   run on rows of 4, then of 16: rank 0's staging buffers of the first run
   (its allocations other than the output's block) are released by the sync
   after the second run, each once, not in it; both runs compute. */
enum { OUTGROWN_WATCH = 8 };
static void *outgrown_made[OUTGROWN_WATCH];
static int outgrown_nmade, outgrown_watching, outgrown_released[OUTGROWN_WATCH];
static hir_status (*outgrown_cpu_alloc)(hir_backend *, size_t, void **);
static void (*outgrown_cpu_release)(hir_backend *, void *);
static hir_local_world *outgrown_world;
static hir_status outgrown_alloc(hir_backend *b, size_t bytes, void **ptr) {
  hir_status s = outgrown_cpu_alloc(b, bytes, ptr);
  if (s == HIR_OK && !outgrown_watching && outgrown_nmade < OUTGROWN_WATCH) outgrown_made[outgrown_nmade++] = *ptr;
  return s;
}
static void outgrown_release(hir_backend *b, void *ptr) {
  int i;
  for (i = 0; i < outgrown_nmade; i++) outgrown_released[i] += ptr == outgrown_made[i];
  outgrown_cpu_release(b, ptr);
}

static hir_status outgrown_rank(int rank, void *user) {
  static const int mesh[2] = {0, 1};
  seed s;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_lower_desc ld;
  hir_eval_desc ed;
  int k, i, staged = 0, *failures = (int *)user;
  void *first_out = NULL;
  seed_allgather_p2p(&s, hir_fusion_create(), 2, mesh);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ld.stream.schedule = HIR_SCHEDULE_COLLECTIVE;
  ld.stream.parts = 2;
  ed.comm = hir_local_comm(outgrown_world, rank);
  ed.backend = hir_backend_cpu_create();
  if (rank == 0) {
    outgrown_cpu_alloc = ed.backend->alloc, outgrown_cpu_release = ed.backend->release;
    ed.backend->alloc = outgrown_alloc, ed.backend->release = outgrown_release;
  }
  if (hir_lower(s.f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK) failures[rank]++;
  for (k = 0; ev && k < 2; k++) {
    int64_t sz[2] = {1, k ? 16 : 4};
    hir_tensor in = tn(HIR_F32, 2, sz), out;
    memset(&out, 0, sizeof out);
    for (i = 0; i < sz[1]; i++) ((float *)in.data)[i] = (float)(1000 * rank + 100 * k + i); /* each rank's row known to all */
    if (rank == 0) memset(outgrown_released, 0, sizeof outgrown_released);
    if (hir_run(ev, &in, 1, &out, 1) != HIR_OK || !out.data || out.sizes[0] != 2 || out.sizes[1] != sz[1]) failures[rank]++;
    if (rank == 0 && k == 1)
      for (i = 0; i < outgrown_nmade; i++)
        if (outgrown_made[i] != first_out && outgrown_released[i]) failures[rank]++, fprintf(stderr, "  released in the run\n");
    if (hir_evaluator_sync(ev) != HIR_OK) failures[rank]++;
    for (i = 0; rank == 0 && k == 1 && i < outgrown_nmade; i++)
      if (outgrown_made[i] != first_out && (staged++, outgrown_released[i] != 1))
        failures[rank]++, fprintf(stderr, "  released %d times by the sync; once expected\n", outgrown_released[i]);
    if (k == 0) first_out = out.data; /* the first run's buffers: its output's block, then staging */
    if (k == 0 && rank == 0) outgrown_watching = 1;
    for (i = 0; out.data && i < 2 * (int)sz[1]; i++) /* row r is rank r's */
      if (((float *)out.data)[i] != (float)(1000 * (i / sz[1]) + 100 * k + i % sz[1])) failures[rank]++;
    tfree(&in);
  }
  if (rank == 0 && staged < 2) failures[rank]++, fprintf(stderr, "  %d staging buffers seen; 2 expected\n", staged);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(s.f);
  return HIR_OK;
}

TEST(test_robust_outgrown_buffer_waits, "robust/outgrown_buffer_waits", TEST_CPU) {
  int failures[2] = {0, 0};
  outgrown_nmade = outgrown_watching = 0;
  outgrown_world = hir_local_world_create(2);
  CHECK(hir_spmd(2, outgrown_rank, failures) == HIR_OK);
  CHECK(failures[0] == 0 && failures[1] == 0);
  hir_local_world_free(outgrown_world);
}


TEST(test_robust_unreachable_memory, "robust/unreachable_memory", TEST_CPU) {
  int64_t n = 37, i, k;
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 1);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_lower_desc ld;
  hir_tensor good = trand(HIR_F32, 1, &n), bad = trand(HIR_F32, 1, &n), out = tn(HIR_F32, 1, &n), got;
  hir_output(f, hir_scalar_binary(f, HIR_BINARY_ADD, 1.5, x));
  memset(&ed, 0, sizeof ed);
  memset(&ld, 0, sizeof ld);
  ed.backend = hir_backend_cpu_create();
  ed.backend->reachable = fake_reachable;
  unreachable_ptr = bad.data;
  reachable_calls = 0;
  CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  for (k = 0; ev && k < 6; k++) { /* good, good again, bad input, good, bad output, good */
    hir_tensor in = k == 2 ? bad : good, dst = out;
    hir_status s;
    int refused = k == 2 || k == 4;
    if (k == 4) dst.data = bad.data;
    for (i = 0; i < n; i++) tset(&out, i, 1e30);
    memset(&got, 0, sizeof got);
    s = hir_run(ev, &in, 1, k >= 4 ? &dst : &got, 1);
    if (s == HIR_OK) s = hir_evaluator_sync(ev);
    if (refused) {
      const char *want = k == 2 ? "input 0 (T0) at " : "output 0 (T1) at ";
      if (!(s == HIR_ERR_INVALID && strstr(hir_evaluator_error(ev), want) &&
            strstr(hir_evaluator_error(ev), "is memory this backend cannot read; copy it first (the cpu backend)")))
        fprintf(stderr, "  call %d: %s: %s\n", (int)k, hir_status_str(s), hir_evaluator_error(ev)), hir_test_failures++;
      continue;
    }
    CHECK(s == HIR_OK);
    for (i = 0; s == HIR_OK && i < n; i++)
      if (tget(k >= 4 ? &out : &got, i) != (double)(float)(tget(&good, i) + 1.5)) {
        fprintf(stderr, "  call %d, element %d: %g\n", (int)k, (int)i, tget(k >= 4 ? &out : &got, i));
        CHECK(0);
        break;
      }
  }
  /* asked of: good (the input's, kept from then on), bad (input), bad (output), out (output): what was refused is not kept */
  if (reachable_calls != 4) fprintf(stderr, "  the backend was asked %d times; 4 expected\n", reachable_calls), hir_test_failures++;
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(f);
  tfree(&good), tfree(&bad), tfree(&out);
}
