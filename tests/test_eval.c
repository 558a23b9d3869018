/* The evaluator on the CPU backend and the local world: every collective
   type and the seed programs on worlds of 1, 2, 3, 4 and 8 ranks and on meshes
   that are not 0..D-1, checked against references computed here from the
   unsharded random inputs; bad inputs; buffer reuse; a dead peer. */
#include "seeds.h"
#include "test.h"

/* ---- collectives through lowering ---- */
static hir_fusion *fusion_allgather(int n, const int *mesh, int64_t rows, int64_t cols) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_set(f, a);
  hir_output(f, b);
  hir_set_mesh(a, n, mesh);
  hir_set_mesh(b, n, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  (void)rows; (void)cols;
  return f;
}

TEST(test_eval_allgather_scatter, "eval/allgather_scatter", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sz[3] = {D, 3, 5};
    spmd_case c;
    hir_fusion *f = fusion_allgather(D, iota_mesh, 3, 5);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sz);
    c.out[0] = tn(HIR_F32, 3, sz);
    memcpy(c.out[0].data, c.in[0].data, (size_t)tnumel(&c.in[0]) * 4);
    c.prealloc = wi & 1;
    RUN_CASE(&c, "allgather");
    hir_fusion_free(f);
    { /* scatter: the replicated tensor split on axis 0 */
      hir_tv *a, *b;
      f = hir_fusion_create();
      a = hir_input(f, HIR_F64, 3);
      b = hir_set(f, a);
      hir_output(f, b);
      hir_set_mesh(a, D, iota_mesh);
      hir_set_mesh(b, D, iota_mesh);
      hir_parallelize(b, 0, HIR_DIDX);
      case_init(&c, D);
      c.build = build_lowered;
      c.user = f;
      c.nin = c.nout = 1;
      c.in[0] = trand(HIR_F64, 3, sz);
      c.out[0] = tn(HIR_F64, 3, sz);
      memcpy(c.out[0].data, c.in[0].data, (size_t)tnumel(&c.in[0]) * 8);
      RUN_CASE(&c, "scatter");
      hir_fusion_free(f);
    }
  }
}

TEST(test_eval_allreduce_reduce_scatter, "eval/allreduce_reduce_scatter", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], axis = 0;
    int64_t sz[3] = {D, 4, 6}, rs[3] = {D, D, 7}, i, j, k;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_sum(f, a, 1, &axis);
    hir_output(f, b);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sz);
    c.out[0] = tn(HIR_F32, 2, sz + 1);
    for (j = 0; j < 24; j++) {
      double s = 0;
      for (i = 0; i < D; i++) s += tget(&c.in[0], i * 24 + j);
      tset(&c.out[0], j, s);
    }
    c.prealloc = wi & 1;
    RUN_CASE(&c, "allreduce");
    hir_fusion_free(f);
    /* reduce-scatter: sum over the DIDx axis, the result split on the next */
    f = hir_fusion_create();
    a = hir_input(f, HIR_BF16, 3);
    b = hir_sum(f, a, 1, &axis);
    hir_output(f, b);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(b, 1, HIR_DIDX);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = c.nout = 1;
    c.tol = 1e-2; /* bf16 */
    c.in[0] = trand(HIR_BF16, 3, rs);
    c.out[0] = tn(HIR_BF16, 2, rs + 1);
    for (j = 0; j < D; j++)
      for (k = 0; k < 7; k++) {
        double s = 0;
        for (i = 0; i < D; i++) s += tget(&c.in[0], (i * D + j) * 7 + k);
        tset(&c.out[0], j * 7 + k, s);
      }
    RUN_CASE(&c, "reduce_scatter");
    hir_fusion_free(f);
  }
}

/* AG+GEMM (decomposed into an Allgather and a local matmul) and the row-parallel
   GEMM+Allreduce, through lowering. */
TEST(test_eval_matmul_patterns, "eval/matmul_patterns", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], axis = 0;
    int64_t sa[3] = {D, 4, 8}, sb[2] = {8, 5}, ra[3] = {D, 3, 4}, rb[3] = {D, 4, 5}, so2[2] = {3, 5}, j;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, b), *s;
    hir_tensor full;
    hir_output(f, o);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_set_mesh(o, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = ref_bmm(&c.in[0], &c.in[1], 1);
    RUN_CASE(&c, "allgather_matmul");
    hir_fusion_free(f);

    f = hir_fusion_create();
    a = hir_input(f, HIR_F64, 3);
    b = hir_input(f, HIR_F64, 3);
    o = hir_matmul(f, a, b);
    s = hir_sum(f, o, 1, &axis);
    hir_output(f, s);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(b, 0, HIR_DIDX);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F64, 3, ra);
    c.in[1] = trand(HIR_F64, 3, rb);
    full = ref_bmm(&c.in[0], &c.in[1], 0);
    c.out[0] = tn(HIR_F64, 2, so2);
    for (j = 0; j < 15; j++) {
      double t = 0;
      int64_t d;
      for (d = 0; d < D; d++) t += tget(&full, d * 15 + j);
      tset(&c.out[0], j, t);
    }
    tfree(&full);
    c.prealloc = 1;
    RUN_CASE(&c, "matmul_allreduce");
    hir_fusion_free(f);
  }
}

/* Gather, SendRecv, Broadcast and Reduce between meshes {0..3}, {4..7}, {2},
   {5} in a world of 8 (the fusion of the lowering tests). */
TEST(test_eval_cross_mesh, "eval/cross_mesh", TEST_CPU) {
  int64_t sa[2] = {4, 6}, su[2] = {3, 2}, j, i;
  spmd_case c;
  hir_fusion *f = cross_mesh_fusion();
  case_init(&c, 8);
  c.build = build_lowered;
  c.user = f;
  c.nin = 2;
  c.nout = 4;
  c.in[0] = trand(HIR_F32, 2, sa);
  c.in[1] = trand(HIR_F32, 2, su);
  c.out[0] = trand(HIR_F32, 2, sa); /* gathered: a itself */
  memcpy(c.out[0].data, c.in[0].data, 24 * 4);
  c.out[1] = trand(HIR_F32, 2, sa); /* moved: a, sharded the same way elsewhere */
  memcpy(c.out[1].data, c.in[0].data, 24 * 4);
  c.out[2] = trand(HIR_F32, 2, su); /* broadcast */
  memcpy(c.out[2].data, c.in[1].data, 6 * 4);
  c.out[3] = tn(HIR_F32, 1, sa + 1); /* reduced over the 4 shards */
  for (j = 0; j < 6; j++) {
    double s = 0;
    for (i = 0; i < 4; i++) s += tget(&c.in[0], i * 6 + j);
    tset(&c.out[3], j, s);
  }
  RUN_CASE(&c, "cross_mesh");
  hir_fusion_free(f);
}

/* Scatter, a broadcast HostUnit, a matmul and a ReduceScatter on the mesh
   {3 1 7 5} of a world of 8; ranks 0, 2, 4, 6 hold nothing. */
TEST(test_eval_scatter_unit_reduce_scatter, "eval/scatter_unit_reduce_scatter", TEST_CPU) {
  int64_t sx[4] = {4, 4, 3, 5}, sb[3] = {4, 5, 2}, so[3] = {4, 3, 2}, i, j, m, n, k;
  spmd_case c;
  hir_fusion *f = scatter_rs_fusion();
  case_init(&c, 8);
  c.build = build_lowered;
  c.user = f;
  c.nin = 2;
  c.nout = 1;
  c.in[0] = trand(HIR_F32, 4, sx);
  c.in[1] = trand(HIR_F32, 3, sb);
  c.out[0] = tn(HIR_F32, 3, so);
  for (j = 0; j < 4; j++)
    for (m = 0; m < 3; m++)
      for (n = 0; n < 2; n++) {
        double s = 0;
        for (i = 0; i < 4; i++)
          for (k = 0; k < 5; k++) s += tget(&c.in[0], ((i * 4 + j) * 3 + m) * 5 + k) * tget(&c.in[1], (i * 5 + k) * 2 + n);
        tset(&c.out[0], (j * 3 + m) * 2 + n, s);
      }
  c.tol = 1e-4;
  RUN_CASE(&c, "scatter_unit_reduce_scatter");
  hir_fusion_free(f);
}

/* Meshes that are not 0..D-1: {2 1} in a world of 3; rank 0 holds nothing. */
TEST(test_eval_odd_mesh, "eval/odd_mesh", TEST_CPU | TEST_GPU_WORLDS) {
  int mesh[2] = {2, 1}, axis = 0;
  int64_t sz[3] = {2, 3, 4}, j;
  spmd_case c;
  hir_fusion *f = fusion_allgather(2, mesh, 3, 4);
  case_init(&c, 3);
  c.build = build_lowered;
  c.user = f;
  c.nin = c.nout = 1;
  c.in[0] = trand(HIR_F32, 3, sz);
  c.out[0] = tn(HIR_F32, 3, sz);
  memcpy(c.out[0].data, c.in[0].data, 24 * 4);
  RUN_CASE(&c, "allgather on {2 1}");
  hir_fusion_free(f);
  {
    hir_tv *a, *b;
    f = hir_fusion_create();
    a = hir_input(f, HIR_F16, 3);
    b = hir_sum(f, a, 1, &axis);
    hir_output(f, b);
    hir_set_mesh(a, 2, mesh);
    hir_set_mesh(b, 2, mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    case_init(&c, 3);
    c.build = build_lowered;
    c.user = f;
    c.nin = c.nout = 1;
    c.tol = 2e-3; /* f16 */
    c.in[0] = trand(HIR_F16, 3, sz);
    c.out[0] = tn(HIR_F16, 2, sz + 1);
    for (j = 0; j < 12; j++) tset(&c.out[0], j, tget(&c.in[0], j) + tget(&c.in[0], 12 + j));
    c.prealloc = 1;
    RUN_CASE(&c, "allreduce on {2 1}");
    hir_fusion_free(f);
  }
}

/* ---- the seeds' programs ---- */
typedef hir_program *(*prog_fn)(int D, const int *mesh);
typedef struct prog_case {
  prog_fn fn;
  int D;
} prog_case;
static hir_program *build_hand(void *user, int rank) {
  prog_case *pc = (prog_case *)user;
  (void)rank;
  return pc->fn(pc->D, iota_mesh);
}

/* Seed 003's AllgatherP2p and seed 004's per-chunk Allgather, built by hand
   exactly as printed in the golden tests, on every world and stream count. */
TEST(test_eval_seed_allgather_programs, "eval/seed_allgather_programs", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, ns;
  for (wi = 0; wi < 5; wi++)
    for (ns = 1; ns <= 4; ns++) {
      int D = worlds[wi];
      int64_t sp[2] = {D, 6}, sc[2] = {5, D};
      prog_case pc;
      spmd_case c;
      pc.D = D;
      pc.fn = prog_allgather_p2p;
      case_init(&c, D);
      c.nstreams = ns;
      c.build = build_hand;
      c.user = &pc;
      c.nin = c.nout = 1;
      c.in[0] = trand(HIR_F32, 2, sp);
      c.out[0] = tn(HIR_F32, 2, sp);
      memcpy(c.out[0].data, c.in[0].data, (size_t)D * 6 * 4);
      c.prealloc = ns & 1;
      RUN_CASE(&c, "seed AllgatherP2p");
      pc.fn = prog_allgather_collective;
      case_init(&c, D);
      c.nstreams = ns;
      c.build = build_hand;
      c.user = &pc;
      c.nin = c.nout = 1;
      c.in[0] = trand(HIR_F32, 2, sc);
      c.out[0] = tn(HIR_F32, 2, sc);
      memcpy(c.out[0].data, c.in[0].data, (size_t)D * 5 * 4);
      RUN_CASE(&c, "seed Allgather (per chunk)");
    }
}

/* Seed 003's AG_matmul_P2p and seed 004's matmul_RS_through_bcast by hand. */
TEST(test_eval_seed_matmul_programs, "eval/seed_matmul_programs", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sa[3] = {D, 3, 4}, sb[2] = {4, 5}, s0[5] = {2, D, D, 3, 4}, s1[3] = {D, 4, 5}, so[4] = {2, D, 3, 5};
    int64_t s, j, m, n, d, k;
    prog_case pc;
    spmd_case c;
    pc.D = D;
    pc.fn = prog_ag_matmul_p2p;
    case_init(&c, D);
    c.nstreams = 1 + wi % 4;
    c.build = build_hand;
    c.user = &pc;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = ref_bmm(&c.in[0], &c.in[1], 1);
    RUN_CASE(&c, "seed AG_matmul_P2p");
    pc.fn = prog_post_on_stream;
    case_init(&c, D);
    c.nstreams = 1 + (wi + 2) % 4;
    c.build = build_hand;
    c.user = &pc;
    c.nin = 2;
    c.nout = 1;
    c.tol = 1e-4;
    c.in[0] = trand(HIR_F32, 5, s0);
    c.in[1] = trand(HIR_F32, 3, s1);
    c.out[0] = tn(HIR_F32, 4, so);
    for (s = 0; s < 2; s++)
      for (j = 0; j < D; j++)
        for (m = 0; m < 3; m++)
          for (n = 0; n < 5; n++) {
            double t = 0;
            for (d = 0; d < D; d++)
              for (k = 0; k < 4; k++)
                t += tget(&c.in[0], (((s * D + d) * D + j) * 3 + m) * 4 + k) * tget(&c.in[1], (d * 4 + k) * 5 + n);
            tset(&c.out[0], ((s * D + j) * 3 + m) * 5 + n, t);
          }
    c.prealloc = 1;
    RUN_CASE(&c, "seed matmul_RS_through_bcast");
  }
}

/* The seed fusions that lower without stream lowering, through hir_lower. */
TEST(test_eval_seed_fusions_lowered, "eval/seed_fusions_lowered", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t s2[2] = {5, 3}, sg[2] = {D, 6}, sa[3] = {D, 3, 4}, sb[2] = {4, 5};
    int64_t m0[4] = {2, D, 3, 4}, m1[3] = {D, 4, 5}, mo[3] = {2, 3, 5}, r0[3] = {3, D, 4}, ro[2] = {3, 4}, s, m, n, d, k;
    spmd_case c;
    seed sd;
    /* single device, each rank alone */
    seed_three_set_ops(&sd, hir_fusion_create());
    case_init(&c, D);
    c.build = build_lowered;
    c.user = sd.f;
    c.nin = c.nout = 1;
    c.in[0] = trand(HIR_F32, 2, s2);
    c.out[0] = tn(HIR_F32, 2, s2);
    memcpy(c.out[0].data, c.in[0].data, 15 * 4);
    RUN_CASE(&c, "seed ThreeSetOpsWithDisjointsForLoops");
    hir_fusion_free(sd.f);
    seed_allgather_p2p(&sd, hir_fusion_create(), D, iota_mesh);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = sd.f;
    c.nin = c.nout = 1;
    c.in[0] = trand(HIR_F32, 2, sg);
    c.out[0] = tn(HIR_F32, 2, sg);
    memcpy(c.out[0].data, c.in[0].data, (size_t)D * 6 * 4);
    RUN_CASE(&c, "seed AllgatherP2p lowered");
    hir_fusion_free(sd.f);
    seed_ag_matmul_p2p(&sd, hir_fusion_create(), D, iota_mesh);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = sd.f;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = ref_bmm(&c.in[0], &c.in[1], 1);
    RUN_CASE(&c, "seed AG_matmul_P2p lowered");
    hir_fusion_free(sd.f);
    seed_matmul_ar(&sd, hir_fusion_create(), D, iota_mesh);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = sd.f;
    c.nin = 2;
    c.nout = 1;
    c.tol = 1e-4;
    c.in[0] = trand(HIR_F32, 4, m0);
    c.in[1] = trand(HIR_F32, 3, m1);
    c.out[0] = tn(HIR_F32, 3, mo);
    for (s = 0; s < 2; s++)
      for (m = 0; m < 3; m++)
        for (n = 0; n < 5; n++) {
          double t = 0;
          for (d = 0; d < D; d++)
            for (k = 0; k < 4; k++) t += tget(&c.in[0], ((s * D + d) * 3 + m) * 4 + k) * tget(&c.in[1], (d * 4 + k) * 5 + n);
          tset(&c.out[0], (s * 3 + m) * 5 + n, t);
        }
    RUN_CASE(&c, "seed matmul_AR lowered");
    hir_fusion_free(sd.f);
    seed_allreduce(&sd, hir_fusion_create(), D, iota_mesh);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = sd.f;
    c.nin = c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, r0);
    c.out[0] = tn(HIR_F32, 2, ro);
    for (s = 0; s < 3; s++)
      for (k = 0; k < 4; k++) {
        double t = 0;
        for (d = 0; d < D; d++) t += tget(&c.in[0], (s * D + d) * 4 + k);
        tset(&c.out[0], s * 4 + k, t);
      }
    RUN_CASE(&c, "seed Allreduce lowered");
    hir_fusion_free(sd.f);
  }
}

/* ---- one rank: bad inputs, then a good run ---- */
TEST(test_eval_bad_inputs, "eval/bad_inputs", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  hir_program *p;
  hir_evaluator *ev;
  hir_lower_desc d;
  int64_t sa[2] = {3, 4}, sb[2] = {4, 2}, sk[2] = {5, 2}, so[2] = {3, 2}, sd3[3] = {3, 4, 1};
  hir_tensor in[2], out[1], good_a = trand(HIR_F32, 2, sa), good_b = trand(HIR_F32, 2, sb), bad;
  hir_output(f, c);
  memset(&d, 0, sizeof d);
  CHECK(hir_lower(f, &d, &p) == HIR_OK);
  CHECK(hir_evaluator_create(p, NULL, &ev) == HIR_OK);
#define RUN_EXPECT(want, needle)                                                                            \
  do {                                                                                                      \
    hir_status s_ = hir_run(ev, in, 2, out, 1);                                                             \
    if (s_ != (want) || !strstr(hir_evaluator_error(ev), needle)) {                                         \
      fprintf(stderr, "  test_eval.c:%d: %s \"%s\"; wanted %s with \"%s\"\n", __LINE__, hir_status_str(s_), \
              hir_evaluator_error(ev), hir_status_str(want), needle);                                       \
      hir_test_failures++;                                                                                  \
    }                                                                                                       \
  } while (0)
  in[0] = good_a;
  in[1] = good_b;
  memset(out, 0, sizeof out);
  CHECK(hir_run(ev, in, 1, out, 1) == HIR_ERR_INVALID);
  CHECK(strstr(hir_evaluator_error(ev), "got 1 inputs and 1 outputs; the program takes 2 and 1") != NULL);
  bad = tn(HIR_F64, 2, sb);
  in[1] = bad;
  RUN_EXPECT(HIR_ERR_INVALID, "input 1 (T1) is double; the program expects float");
  tfree(&bad);
  bad = tn(HIR_F32, 3, sd3);
  in[1] = bad;
  RUN_EXPECT(HIR_ERR_SHAPE, "input 1 (T1) has 3 axes; the program expects 2");
  tfree(&bad);
  bad = tn(HIR_F32, 2, sk);
  in[1] = bad;
  RUN_EXPECT(HIR_ERR_SHAPE, "the contracted sizes differ (4 (input 0, T0, axis 1) vs 5 (input 1, T1, axis 0)); give them one size");
  tfree(&bad);
  in[1] = good_b;
  in[1].data = NULL;
  RUN_EXPECT(HIR_ERR_INVALID, "input 1 (T1) has NULL data");
  in[1] = good_b;
  in[1].strides[0] = -2;
  in[1].strides[1] = 1;
  RUN_EXPECT(HIR_ERR_UNSUPPORTED, "input 1 (T1) axis 0 has stride -2; strides are >= 0");
  in[1] = good_b;
  out[0] = tn(HIR_F32, 2, so);
  out[0].strides[0] = 0; /* every row in one place */
  out[0].strides[1] = 1;
  RUN_EXPECT(HIR_ERR_INVALID, "output 0 (T2): its strides make elements share memory");
  tfree(&out[0]);
  in[1] = good_b;
  out[0] = tn(HIR_F32, 2, sb);
  RUN_EXPECT(HIR_ERR_SHAPE, "output 0 (T2) is [4, 2]; the program writes [3, 2] here");
  tfree(&out[0]);
  { /* and a good run still works, into a poisoned preallocated output */
    int64_t i, k, j;
    out[0] = tn(HIR_F32, 2, so);
    for (i = 0; i < 6; i++) tset(&out[0], i, 1e30);
    CHECK(hir_run(ev, in, 2, out, 1) == HIR_OK);
    CHECK_STR(hir_evaluator_error(ev), "");
    for (i = 0; i < 3; i++)
      for (j = 0; j < 2; j++) {
        double s = 0;
        for (k = 0; k < 4; k++) s += tget(&good_a, i * 4 + k) * tget(&good_b, k * 2 + j);
        CHECK(fabs(tget(&out[0], i * 2 + j) - s) < 1e-5);
      }
    tfree(&out[0]);
  }
#undef RUN_EXPECT
  hir_evaluator_free(ev);
  hir_program_free(p);
  tfree(&good_a);
  tfree(&good_b);
  hir_fusion_free(f);
  /* a sharded input's DIDx axis has local size 1 */
  {
    hir_local_world *w = hir_local_world_create(1);
    int64_t s3[3] = {2, 3, 4};
    hir_eval_desc ed;
    f = fusion_allgather(2, iota_mesh, 3, 4);
    d.my_device = 0;
    CHECK(hir_lower(f, &d, &p) == HIR_OK);
    memset(&ed, 0, sizeof ed);
    ed.comm = hir_local_comm(w, 0);
    CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_ERR_INVALID); /* mesh {0 1}, a world of 1 */
    CHECK(strstr(hir_evaluator_error(ev), "T0 lives on device 1, outside the world of 1 ranks; give meshes of devices 0 to 0") != NULL);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
    f = fusion_allgather(1, iota_mesh, 3, 4);
    CHECK(hir_lower(f, &d, &p) == HIR_OK);
    CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    in[0] = tn(HIR_F32, 3, s3);
    memset(out, 0, sizeof out);
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_OK); /* a mesh of one device holds the whole tensor */
    tfree(&in[0]);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
    hir_local_world_free(w);
  }
}

TEST(test_eval_create_errors, "eval/create_errors", TEST_CPU) {
  hir_evaluator *ev;
  hir_program *p = hir_program_create();
  hir_eval_desc d;
  memset(&d, 0, sizeof d);
  CHECK(hir_evaluator_create(NULL, NULL, &ev) == HIR_ERR_INVALID);
  CHECK(strstr(hir_evaluator_error(ev), "the program is NULL") != NULL);
  CHECK(hir_run(ev, NULL, 0, NULL, 0) == HIR_ERR_INVALID);
  hir_evaluator_free(ev);
  d.number_of_streams = -1;
  CHECK(hir_evaluator_create(p, &d, &ev) == HIR_ERR_INVALID);
  CHECK(strstr(hir_evaluator_error(ev), "number_of_streams is -1") != NULL);
  hir_evaluator_free(ev);
  { /* communicating without a communicator */
    hir_fusion *f = hir_program_fusion(p);
    hir_tv *a = hir_input(f, HIR_F32, 1), *b = hir_set(f, a);
    int team[2] = {0, 1};
    hir_output(f, b);
    hir_scope_append(hir_program_body(p), hir_host_communication(p, HIR_COLL_ALLGATHER, 2, team, 0, a, b));
    d.number_of_streams = 0;
    CHECK(hir_evaluator_create(p, &d, &ev) == HIR_ERR_INVALID);
    CHECK(strstr(hir_evaluator_error(ev), "give a communicator") != NULL);
    hir_evaluator_free(ev);
  }
  { /* a communicator of device memory (NCCL's) with the CPU backend */
    hir_local_world *w = hir_local_world_create(2);
    hir_comm nccl_like = *hir_local_comm(w, 0);
    nccl_like.needs_device_memory = 1;
    d.comm = &nccl_like;
    CHECK(hir_evaluator_create(p, &d, &ev) == HIR_ERR_INVALID);
    CHECK(strstr(hir_evaluator_error(ev), "moves device memory but the cpu backend holds host memory") != NULL);
    hir_evaluator_free(ev);
    d.comm = hir_local_comm(w, 0);
    CHECK(hir_evaluator_create(p, &d, &ev) == HIR_OK);
    hir_evaluator_free(ev);
    hir_local_world_free(w);
  }
  hir_program_free(p);
  CHECK(hir_evaluator_create(NULL, NULL, NULL) == HIR_ERR_INVALID);
  hir_evaluator_free(NULL);
}

/* ---- buffers are allocated on the first run only ---- */
static int alloc_calls;
static hir_status (*cpu_alloc)(hir_backend *, size_t, void **);
static hir_status counting_alloc(hir_backend *b, size_t bytes, void **ptr) {
  alloc_calls++;
  return cpu_alloc(b, bytes, ptr);
}

/* A broadcast that only inserts a size-1 axis into an input is a view: no
   copy, no buffer; when it is also a program output it is written out. */
TEST(test_eval_broadcast_view, "eval/broadcast_view", TEST_CPU) {
  int also_output;
  for (also_output = 0; also_output < 2; also_output++) {
    hir_fusion *f = hir_fusion_create();
    int flags[3] = {1, 0, 0};
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_input(f, HIR_F32, 3), *bx = hir_broadcast(f, x, 3, flags);
    hir_tv *z = hir_add(f, bx, y);
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_lower_desc d;
    int64_t sx[2] = {5, 7}, sy[3] = {2, 5, 7}, i;
    hir_tensor in[2], out[2];
    memset(&d, 0, sizeof d);
    memset(out, 0, sizeof out);
    hir_output(f, z);
    if (also_output) hir_output(f, bx);
    in[0] = trand(HIR_F32, 2, sx);
    in[1] = trand(HIR_F32, 3, sy);
    CHECK(hir_lower(f, &d, &p) == HIR_OK && hir_evaluator_create(p, NULL, &ev) == HIR_OK);
    CHECK(hir_run(ev, in, 2, out, 1 + also_output) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
    for (i = 0; out[0].data && i < 70; i++) CHECK(fabs(tget(&out[0], i) - tget(&in[0], i % 35) - tget(&in[1], i)) < 1e-6);
    if (also_output) {
      CHECK(out[1].data && out[1].data != in[0].data && out[1].ndims == 3 && out[1].sizes[0] == 1);
      for (i = 0; out[1].data && i < 35; i++) CHECK(tget(&out[1], i) == tget(&in[0], i));
    }
    CHECK(hir_evaluator_memory(ev) == (size_t)(70 + 35 * also_output) * sizeof(float));
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
    tfree(&in[0]);
    tfree(&in[1]);
  }
}

TEST(test_eval_buffer_reuse, "eval/buffer_reuse", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  int axis = 0;
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_add(f, a, a), *c = hir_mul(f, b, a), *s = hir_sum(f, c, 1, &axis);
  hir_program *p;
  hir_evaluator *ev;
  hir_lower_desc d;
  hir_eval_desc ed;
  hir_backend *be = hir_backend_cpu_create();
  int64_t sz[2] = {16, 8}, sz2[2] = {4, 3}, j, i;
  hir_tensor in = trand(HIR_F32, 2, sz), out;
  void *addr;
  hir_output(f, s);
  memset(&d, 0, sizeof d);
  memset(&ed, 0, sizeof ed);
  cpu_alloc = be->alloc;
  be->alloc = counting_alloc;
  ed.backend = be;
  CHECK(hir_lower(f, &d, &p) == HIR_OK);
  CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  alloc_calls = 0;
  memset(&out, 0, sizeof out);
  CHECK(hir_run(ev, &in, 1, &out, 1) == HIR_OK);
  CHECK(alloc_calls > 0);
  addr = out.data;
  for (j = 0; j < 8; j++) {
    double want = 0;
    for (i = 0; i < 16; i++) want += 2 * tget(&in, i * 8 + j) * tget(&in, i * 8 + j);
    CHECK(fabs(tget(&out, j) - want) < 1e-4);
  }
  alloc_calls = 0;
  CHECK(hir_run(ev, &in, 1, &out, 1) == HIR_OK);
  CHECK(alloc_calls == 0); /* same shapes: same buffers */
  CHECK(out.data == addr);
  tfree(&in);
  in = trand(HIR_F32, 2, sz2);
  CHECK(hir_run(ev, &in, 1, &out, 1) == HIR_OK); /* new shapes: a new plan */
  CHECK(out.ndims == 1 && out.sizes[0] == 3);
  {
    double want = 0;
    for (i = 0; i < 4; i++) want += 2 * tget(&in, i * 3 + 1) * tget(&in, i * 3 + 1);
    CHECK(fabs(tget(&out, 1) - want) < 1e-5);
  }
  tfree(&in);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
  hir_fusion_free(f);
}

/* ---- a dead peer: a timeout, not a hang ---- */
typedef struct dead_ctx {
  hir_local_world *w;
  hir_program *p;
  hir_status first, second;
  char msg[600];
} dead_ctx;

static hir_status dead_rank(int rank, void *user) {
  dead_ctx *c = (dead_ctx *)user;
  hir_evaluator *ev;
  hir_eval_desc d;
  int64_t sz[3] = {1, 3, 4};
  hir_tensor in, out;
  if (rank != 0) return HIR_OK; /* rank 1 never shows up */
  memset(&d, 0, sizeof d);
  d.comm = hir_local_comm(c->w, 0);
  if (hir_evaluator_create(c->p, &d, &ev) != HIR_OK) {
    snprintf(c->msg, sizeof c->msg, "%s", hir_evaluator_error(ev));
    hir_evaluator_free(ev);
    return HIR_OK;
  }
  in = trand(HIR_F32, 3, sz);
  memset(&out, 0, sizeof out);
  c->first = hir_run(ev, &in, 1, &out, 1);
  snprintf(c->msg, sizeof c->msg, "%s", hir_evaluator_error(ev));
  c->second = hir_run(ev, &in, 1, &out, 1);
  tfree(&in);
  hir_evaluator_free(ev);
  return HIR_OK;
}

TEST(test_eval_dead_peer, "eval/dead_peer", TEST_CPU) {
  dead_ctx c;
  {
    hir_fusion *f = fusion_allgather(2, iota_mesh, 3, 4);
    hir_lower_desc d;
    memset(&c, 0, sizeof c);
    memset(&d, 0, sizeof d);
    CHECK(hir_lower(f, &d, &c.p) == HIR_OK);
    c.w = hir_local_world_create(2);
    hir_local_world_set_timeout(c.w, 150);
    CHECK(hir_spmd(2, dead_rank, &c) == HIR_OK);
    CHECK(c.first == HIR_ERR_TIMEOUT);
    CHECK(strstr(c.msg, "rank 0 waited 150 ms in Allgather") != NULL);
    CHECK(c.second == HIR_ERR_COMM);
    hir_local_world_free(c.w);
    hir_program_free(c.p);
    hir_fusion_free(f);
  }
}

/* ---- the local world's collectives directly: NCCL's semantics ---- */
typedef struct lw_ctx {
  hir_local_world *w;
  int n;
  char err[MAXR][400];
} lw_ctx;

static hir_status lw_rank(int rank, void *user) {
  lw_ctx *x = (lw_ctx *)user;
  hir_comm *c = hir_local_comm(x->w, rank);
  int n = x->n, i, team[MAXR], rev[MAXR];
  void *t, *tr;
  float buf[64], send[8], expect;
  uint16_t h[8];
  char *err = x->err[rank];
  for (i = 0; i < n; i++) {
    team[i] = i;
    rev[i] = n - 1 - i;
  }
  if (c->team(c, team, n, &t) != HIR_OK || c->team(c, rev, n, &tr) != HIR_OK) {
    snprintf(err, 400, "team: %.380s", c->error);
    return HIR_ERR_COMM;
  }
  /* in-place allgather, in team order: the reversed team reverses the order */
  for (i = 0; i < 2; i++) buf[(n - 1 - rank) * 2 + i] = (float)(rank * 10 + i);
  if (c->allgather(c, tr, buf + (n - 1 - rank) * 2, buf, 8, NULL) != HIR_OK) snprintf(err, 400, "allgather: %.380s", c->error);
  for (i = 0; i < n && !err[0]; i++)
    if (buf[2 * i] != (float)((n - 1 - i) * 10) || buf[2 * i + 1] != (float)((n - 1 - i) * 10 + 1))
      snprintf(err, 400, "allgather: chunk %d is %g", i, buf[2 * i]);
  /* in-place allreduce in f16: sums rounded once */
  for (i = 0; i < 8; i++) h[i] = hir_float_to_half(0.25f * (float)(rank + 1) + (float)i);
  if (!err[0] && c->allreduce(c, t, h, h, 8, HIR_F16, NULL) != HIR_OK) snprintf(err, 400, "allreduce: %.380s", c->error);
  for (i = 0; i < 8 && !err[0]; i++) {
    float want = 0;
    int r;
    for (r = 0; r < n; r++) want += hir_half_to_float(hir_float_to_half(0.25f * (float)(r + 1) + (float)i));
    if (h[i] != hir_float_to_half(want)) snprintf(err, 400, "allreduce f16: element %d is %g, want %g", i, hir_half_to_float(h[i]), want);
  }
  /* in-place reduce-scatter: member r receives the sum of chunk r */
  for (i = 0; i < n * 2; i++) buf[i] = (float)(rank + i);
  if (!err[0] && c->reduce_scatter(c, t, buf, buf + rank * 2, 2, HIR_F32, NULL) != HIR_OK) snprintf(err, 400, "rs: %.380s", c->error);
  expect = 0;
  for (i = 0; i < n; i++) expect += (float)(i + rank * 2 + 1);
  if (!err[0] && buf[rank * 2 + 1] != expect) snprintf(err, 400, "reduce_scatter: %g, want %g", buf[rank * 2 + 1], expect);
  /* reduce and gather where the root holds no data */
  send[0] = (float)(rank + 1);
  if (!err[0] && c->reduce(c, t, rank == n - 1 ? NULL : send, buf, 1, HIR_F32, n - 1, NULL) != HIR_OK)
    snprintf(err, 400, "reduce: %.380s", c->error);
  if (!err[0] && rank == n - 1 && buf[0] != (float)((n - 1) * n / 2)) snprintf(err, 400, "reduce: %g", buf[0]);
  if (!err[0] && c->gather(c, t, rank == n - 1 ? NULL : send, buf, 4, n - 1, NULL) != HIR_OK) snprintf(err, 400, "gather: %.380s", c->error);
  for (i = 0; !err[0] && rank == n - 1 && i < n - 1; i++)
    if (buf[i] != (float)(i + 1)) snprintf(err, 400, "gather: chunk %d is %g", i, buf[i]);
  /* scatter and broadcast from root 0 */
  for (i = 0; i < n; i++) buf[i] = (float)(100 + i);
  if (!err[0] && c->scatter(c, t, rank == 0 ? buf : NULL, send, 4, 0, NULL) != HIR_OK) snprintf(err, 400, "scatter: %.380s", c->error);
  if (!err[0] && send[0] != (float)(100 + rank)) snprintf(err, 400, "scatter: got %g", send[0]);
  send[1] = rank == 0 ? 7.5f : 0.0f;
  if (!err[0] && c->broadcast(c, t, rank == 0 ? send + 1 : NULL, send + 2, 4, 0, NULL) != HIR_OK) snprintf(err, 400, "bcast: %.380s", c->error);
  if (!err[0] && send[2] != 7.5f) snprintf(err, 400, "broadcast: got %g", send[2]);
  /* a ring exchange in one group: send right, receive from the left */
  send[3] = (float)rank;
  if (!err[0]) {
    c->group_start(c);
    c->recv(c, send + 4, 4, (rank + n - 1) % n, NULL);
    c->send(c, send + 3, 4, (rank + 1) % n, NULL);
    if (c->group_end(c) != HIR_OK) snprintf(err, 400, "ring: %.380s", c->error);
    else if (send[4] != (float)((rank + n - 1) % n)) snprintf(err, 400, "ring: got %g", send[4]);
  }
  /* plain send/recv pairs: evens send to the next odd rank */
  if (!err[0] && n > 1 && !(rank == n - 1 && rank % 2 == 0)) {
    hir_status s = rank % 2 == 0 ? c->send(c, send + 3, 4, rank + 1, NULL) : c->recv(c, send + 5, 4, rank - 1, NULL);
    if (s != HIR_OK) snprintf(err, 400, "p2p: %.380s", c->error);
    else if (rank % 2 && send[5] != (float)(rank - 1)) snprintf(err, 400, "p2p: got %g", send[5]);
  }
  if (!err[0] && c->send(c, send, 4, rank, NULL) != HIR_ERR_INVALID) snprintf(err, 400, "a send to self outside a group must fail");
  if (!err[0] && c->send(c, send, 4, n + 3, NULL) != HIR_ERR_INVALID) snprintf(err, 400, "a send outside the world must fail");
  return err[0] ? HIR_ERR_COMM : HIR_OK;
}

TEST(test_local_world_collectives, "eval/local_world_collectives", TEST_CPU) {
  int wi, r;
  for (wi = 0; wi < 5; wi++) {
    lw_ctx x;
    memset(&x, 0, sizeof x);
    x.n = worlds[wi];
    x.w = hir_local_world_create(x.n);
    hir_local_world_set_timeout(x.w, 10000);
    hir_spmd(x.n, lw_rank, &x);
    for (r = 0; r < x.n; r++)
      if (x.err[r][0]) {
        fprintf(stderr, "  test_eval.c: local world of %d: rank %d: %s\n", x.n, r, x.err[r]);
        hir_test_failures++;
        break;
      }
    hir_local_world_free(x.w);
  }
  CHECK(hir_local_world_create(0) == NULL);
  CHECK(hir_local_comm(NULL, 0) == NULL);
  CHECK(hir_spmd(0, NULL, NULL) == HIR_ERR_INVALID);
}

/* ---- half precision ---- */
TEST(test_half_conversions, "eval/half_conversions", TEST_CPU) {
  uint32_t i;
  CHECK(hir_float_to_half(1.0f) == 0x3c00);
  CHECK(hir_float_to_half(-2.0f) == 0xc000);
  CHECK(hir_float_to_half(65504.0f) == 0x7bff);
  CHECK(hir_float_to_half(65519.0f) == 0x7bff);
  CHECK(hir_float_to_half(65520.0f) == 0x7c00);         /* the tie rounds to even: infinity */
  CHECK(hir_float_to_half(1.0f + 1.0f / 2048) == 0x3c00);   /* tie: to even */
  CHECK(hir_float_to_half(1.0f + 3.0f / 2048) == 0x3c02);   /* tie: to even, up */
  CHECK(hir_float_to_half(5.9604644775390625e-08f) == 0x0001); /* 2^-24, the smallest subnormal */
  CHECK(hir_float_to_half(2.98023223876953125e-08f) == 0x0000); /* 2^-25: tie to even zero */
  CHECK(hir_float_to_half(8.94069671630859375e-08f) == 0x0002); /* 1.5 * 2^-24: tie to even two */
  CHECK(hir_float_to_half(6.097555160522461e-05f) == 0x03ff);   /* the largest subnormal */
  CHECK(hir_float_to_half(-0.0f) == 0x8000);
  CHECK(hir_half_to_float(0x0001) == 5.9604644775390625e-08f);
  CHECK(hir_half_to_float(0x7c00) > 1e30f);
  {
    float nan = hir_half_to_float(0x7e00);
    CHECK(nan != nan);
    CHECK((hir_float_to_half(nan) & 0x7c00) == 0x7c00 && (hir_float_to_half(nan) & 0x3ff));
  }
  for (i = 0; i < 65536; i++) { /* every half survives a round trip */
    uint16_t h = (uint16_t)i;
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
    if (hir_float_to_half(hir_half_to_float(h)) != h) {
      fprintf(stderr, "  half 0x%04x does not round-trip\n", h);
      hir_test_failures++;
      break;
    }
  }
  CHECK(hir_float_to_bf16(1.0f) == 0x3f80);
  CHECK(hir_float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);   /* tie: to even */
  CHECK(hir_float_to_bf16(1.0f + 3.0f / 256) == 0x3f82);   /* tie: to even, up */
  CHECK(hir_float_to_bf16(1.0f + 1.5f / 256) == 0x3f81);   /* above the tie: up */
  CHECK(hir_bf16_to_float(0x4049) == 3.140625f);
  {
    float nan = hir_bf16_to_float(hir_float_to_bf16(hir_half_to_float(0x7e00)));
    CHECK(nan != nan);
  }
}

/* Runs a [M, K] x [K, N] program `runs` times (outputs the evaluator's),
   each against the product computed here. */
static int graph_runs_right(hir_evaluator *ev, hir_tensor in[2], int64_t M, int64_t K, int64_t N, int runs) {
  hir_tensor out;
  int64_t i, j, k;
  int ok = ev != NULL, run;
  for (run = 0; run < runs && ok; run++) {
    memset(&out, 0, sizeof out);
    ok = hir_run(ev, in, 2, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK && out.data;
    for (i = 0; ok && i < M; i++)
      for (j = 0; j < N; j++) {
        double want = 0;
        for (k = 0; k < K; k++) want += tget(&in[0], i * K + k) * tget(&in[1], k * N + j);
        ok &= fabs(tget(&out, i * N + j) - want) < 1e-5;
      }
  }
  return ok;
}

/* Graph mode on the CPU backend: accepted, nothing to capture, said in the
   plan; the runs stay eager and right. */
TEST(test_eval_graph_on_cpu, "eval/graph_option_on_cpu", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  int64_t sa[2] = {5, 7}, sb[2] = {7, 3};
  hir_tensor in[2];
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  hir_output(f, c);
  memset(&ed, 0, sizeof ed);
  ed.graph = HIR_GRAPH_BY_ADDRESS;
  in[0] = trand(HIR_F32, 2, sa);
  in[1] = trand(HIR_F32, 2, sb);
  CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  CHECK(graph_runs_right(ev, in, 5, 7, 3, 3));
  CHECK(strstr(hir_program_plan(p), "graph: eager, because the backend has nothing to capture") != NULL);
  hir_evaluator_free(ev);
  ev = NULL;
  ed.graph = (hir_graph_mode)3; /* no such mode: refused by name */
  CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_ERR_INVALID);
  CHECK(strstr(hir_evaluator_error(ev), "graph is 3; give HIR_GRAPH_OFF") != NULL);
  hir_evaluator_free(ev);
  hir_program_free(p);
  tfree(&in[0]);
  tfree(&in[1]);
  hir_fusion_free(f);
}

/* A backend that says it captures but cannot: its graph_end refuses, or a
   GEMM fails while capturing. Graph mode runs eagerly from then on, says
   why in the plan, and the numbers stay right. */
static int fake_capturing, fake_gemm_refuses;
static hir_status (*fake_cpu_matmul)(hir_backend *, void *, const hir_tensor *, const hir_tensor *, const hir_tensor *);
static hir_status fake_graph_begin(hir_backend *b) {
  (void)b;
  fake_capturing = 1;
  return HIR_OK;
}
static hir_status fake_graph_end(hir_backend *b, void **graph) {
  *graph = NULL;
  fake_capturing = 0;
  snprintf(b->error, sizeof b->error, "fake: nothing can be captured here");
  return HIR_ERR_UNSUPPORTED;
}
static hir_status fake_graph_launch(hir_backend *b, void *graph) {
  (void)graph;
  snprintf(b->error, sizeof b->error, "fake: no graph to launch");
  return HIR_ERR_INTERNAL;
}
static void fake_graph_destroy(hir_backend *b, void *graph) { (void)b, (void)graph; }
static hir_status fake_matmul(hir_backend *b, void *s, const hir_tensor *d, const hir_tensor *x, const hir_tensor *y) {
  if (fake_capturing && fake_gemm_refuses) {
    snprintf(b->error, sizeof b->error, "fake: a GEMM cannot be captured");
    return HIR_ERR_UNSUPPORTED;
  }
  return fake_cpu_matmul(b, s, d, x, y);
}

TEST(test_eval_graph_fallback, "eval/graph_capture_fails", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  int64_t sa[2] = {4, 6}, sb[2] = {6, 5};
  hir_tensor in[2];
  int variant;
  hir_output(f, c);
  in[0] = trand(HIR_F32, 2, sa);
  in[1] = trand(HIR_F32, 2, sb);
  for (variant = 0; variant < 2; variant++) {
    hir_backend *be = hir_backend_cpu_create();
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_eval_desc ed;
    fake_cpu_matmul = be->matmul;
    be->matmul = fake_matmul;
    be->graph_begin = fake_graph_begin;
    be->graph_end = fake_graph_end;
    be->graph_launch = fake_graph_launch;
    be->graph_destroy = fake_graph_destroy;
    fake_gemm_refuses = variant;
    memset(&ed, 0, sizeof ed);
    ed.backend = be;
    ed.graph = HIR_GRAPH_BY_ADDRESS;
    CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    CHECK(graph_runs_right(ev, in, 4, 6, 5, 3));
    CHECK(strstr(hir_program_plan(p), variant ? "graph: eager, because the capture failed: hir_run: MatmulOp"
                                              : "graph: eager, because the capture failed: fake: nothing can be captured") != NULL);
    if (variant) CHECK(strstr(hir_program_plan(p), "fake: a GEMM cannot be captured") != NULL);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_backend_free(be);
  }
  tfree(&in[0]);
  tfree(&in[1]);
  hir_fusion_free(f);
}

/* A backend that captures for real, on the CPU: its graph records the
   GEMMs launched while capturing (tensors by address, nothing run), and
   launching it runs them again at those addresses - as a CUDA graph does. */
typedef struct rec_gemm {
  hir_tensor d, x, y;
} rec_gemm;
static rec_gemm rec_gemms[4];
static int rec_capturing, rec_ngemms, rec_launches;
static hir_status rec_graph_begin(hir_backend *b) {
  (void)b;
  rec_capturing = 1, rec_ngemms = 0;
  return HIR_OK;
}
static hir_status rec_graph_end(hir_backend *b, void **graph) {
  (void)b;
  rec_capturing = 0;
  *graph = rec_gemms;
  return HIR_OK;
}
static hir_status rec_graph_launch(hir_backend *b, void *graph) {
  int i;
  hir_status s = HIR_OK;
  (void)graph;
  rec_launches++;
  for (i = 0; i < rec_ngemms && s == HIR_OK; i++) s = fake_cpu_matmul(b, NULL, &rec_gemms[i].d, &rec_gemms[i].x, &rec_gemms[i].y);
  return s;
}
static hir_status rec_matmul(hir_backend *b, void *s, const hir_tensor *d, const hir_tensor *x, const hir_tensor *y) {
  if (!rec_capturing) return fake_cpu_matmul(b, s, d, x, y);
  if (rec_ngemms == 4) return HIR_ERR_UNSUPPORTED;
  rec_gemms[rec_ngemms].d = *d, rec_gemms[rec_ngemms].x = *x, rec_gemms[rec_ngemms].y = *y;
  rec_ngemms++;
  return HIR_OK;
}

/* Arguments at new addresses every run (a decode loop's new outputs): graph
   mode 1 captures a graph for each (a program that communicates would be
   refused instead, gpu/graph_moved_refused); mode 2 copies them in and out
   of its own, one graph launched each time. The numbers right every run
   (new random inputs: a graph reading stale copies would be caught). */
TEST(test_eval_graph_staged, "eval/graph_staged_arguments", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  int64_t sa[2] = {4, 6}, sb[2] = {6, 5}, so[2] = {4, 5}, i, j, k;
  int mode, run;
  hir_tensor args[4][3];
  hir_output(f, c);
  for (mode = 1; mode <= 2; mode++) {
    hir_backend *be = hir_backend_cpu_create();
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_eval_desc ed;
    fake_cpu_matmul = be->matmul;
    be->matmul = rec_matmul;
    be->graph_begin = rec_graph_begin;
    be->graph_end = rec_graph_end;
    be->graph_launch = rec_graph_launch;
    be->graph_destroy = fake_graph_destroy;
    rec_launches = 0;
    memset(&ed, 0, sizeof ed);
    ed.backend = be;
    ed.graph = mode;
    CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    for (run = 0; run < 4; run++) { /* eager, then captured or launched: each run's arguments new (kept till the end) */
      hir_tensor *in = args[run], *out = &args[run][2];
      hir_status s;
      in[0] = trand(HIR_F32, 2, sa), in[1] = trand(HIR_F32, 2, sb), *out = tn(HIR_F32, 2, so);
      for (i = 0; i < 20; i++) tset(out, i, 1e30);
      s = hir_run(ev, in, 2, out, 1);
      CHECK(s == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
      for (i = 0; i < 4; i++)
        for (j = 0; j < 5; j++) {
          double want = 0;
          for (k = 0; k < 6; k++) want += tget(&in[0], i * 6 + k) * tget(&in[1], k * 5 + j);
          CHECK(fabs(tget(out, i * 5 + j) - want) < 1e-5);
        }
    }
    CHECK(ev->ngraphs == (mode == 1 ? 3 : 1) && rec_launches == 3 && !strstr(hir_program_plan(p), "graph: eager"));
    for (run = 0; run < 4; run++) tfree(&args[run][0]), tfree(&args[run][1]), tfree(&args[run][2]);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_backend_free(be);
  }
  hir_fusion_free(f);
}

/* Graph mode 1 on a communicator whose captured receives write into the
   peers' allocations (hir_comm.allocation_of, as between processes on copy
   engines): the same output address in a new allocation is a move, refused
   on every rank; the same allocation replays. A local world of 2 with a
   backend whose graphs launch nothing (only the refusal is checked). */
static unsigned long long alloc_id[2];
static unsigned long long fake_allocation_of(hir_comm *c, const void *ptr) { return ptr ? alloc_id[c->rank] : 0; }
static hir_status noop_graph_begin(hir_backend *b) { return (void)b, HIR_OK; }
static hir_status noop_graph_end(hir_backend *b, void **graph) {
  (void)b;
  *graph = alloc_id;
  return HIR_OK;
}
static hir_status noop_graph_launch(hir_backend *b, void *graph) { return (void)b, (void)graph, HIR_OK; }

/* A rank of a local world in graph mode `graph` on a CPU backend whose
   graphs launch nothing (its communicator capturable): f lowered for the
   rank, its evaluator made; 0 when either fails (*p or *ev says why). */
static int noop_graph_rank(hir_local_world *w, const hir_fusion *f, int rank, int graph, hir_backend **be, hir_program **p,
                           hir_evaluator **ev) {
  hir_lower_desc ld;
  hir_eval_desc ed;
  *be = hir_backend_cpu_create();
  (*be)->graph_begin = noop_graph_begin;
  (*be)->graph_end = noop_graph_end;
  (*be)->graph_launch = noop_graph_launch;
  (*be)->graph_destroy = fake_graph_destroy;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.backend = *be;
  ed.comm = hir_local_comm(w, rank);
  ed.comm->capturable = 1;
  ed.graph = graph;
  ed.timeout_ms = 20000;
  *p = NULL;
  *ev = NULL;
  return hir_lower(f, &ld, p) == HIR_OK && hir_evaluator_create(*p, &ed, ev) == HIR_OK;
}

/* The rank's last message, and everything it made freed. */
static void noop_graph_rank_end(hir_evaluator *ev, hir_program *p, hir_backend *be, char *err, size_t cap) {
  snprintf(err, cap, "%.399s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(be);
}
typedef struct alloc_case {
  hir_local_world *w;
  hir_fusion *f;
  pthread_barrier_t between;      /* the graphs launch nothing: the ranks keep in step by this instead */
  hir_tensor in[2], out[2];       /* made before the ranks' threads start */
  hir_status st[2][4];
  char err[2][400];
} alloc_case;
static hir_status alloc_rank(int rank, void *user) {
  alloc_case *x = (alloc_case *)user;
  hir_backend *be;
  hir_program *p;
  hir_evaluator *ev;
  int run, made;
  hir_local_comm(x->w, rank)->allocation_of = fake_allocation_of;
  made = noop_graph_rank(x->w, x->f, rank, 1, &be, &p, &ev);
  for (run = 0; run < 4; run++) { /* eager, captured, replayed, then the output "reallocated" at its address */
    alloc_id[rank] = run < 3 ? 7 : 8;
    pthread_barrier_wait(&x->between);
    x->st[rank][run] = made ? hir_run(ev, &x->in[rank], 1, &x->out[rank], 1) : HIR_ERR_INVALID;
    if (x->st[rank][run] == HIR_OK) x->st[rank][run] = hir_evaluator_sync(ev);
  }
  noop_graph_rank_end(ev, p, be, x->err[rank], sizeof x->err[rank]);
  return HIR_OK;
}
TEST(test_eval_graph_allocation, "eval/graph_new_allocation_refused", TEST_CPU) {
  alloc_case x;
  int mesh[2] = {0, 1}, r;
  int64_t si[2] = {1, 8}, so[2] = {2, 8};
  seed sd;
  memset(&x, 0, sizeof x);
  for (r = 0; r < 2; r++) x.in[r] = trand(HIR_F32, 2, si), x.out[r] = tn(HIR_F32, 2, so);
  seed_allgather_p2p(&sd, hir_fusion_create(), 2, mesh);
  x.f = sd.f;
  x.w = hir_local_world_create(2);
  hir_local_world_set_timeout(x.w, 20000);
  pthread_barrier_init(&x.between, NULL, 2);
  CHECK(hir_spmd(2, alloc_rank, &x) == HIR_OK);
  pthread_barrier_destroy(&x.between);
  for (r = 0; r < 2; r++) {
    CHECK(x.st[r][0] == HIR_OK && x.st[r][1] == HIR_OK && x.st[r][2] == HIR_OK);
    if (x.st[r][2] != HIR_OK || x.st[r][3] != HIR_ERR_INVALID)
      fprintf(stderr, "  rank %d: %d %d %d %d: %s\n", r, x.st[r][0], x.st[r][1], x.st[r][2], x.st[r][3], x.err[r]);
    CHECK(x.st[r][3] == HIR_ERR_INVALID && strstr(x.err[r], "new allocation at its old address"));
  }
  for (r = 0; r < 2; r++) tfree(&x.in[r]), tfree(&x.out[r]);
  hir_local_world_free(x.w);
  hir_fusion_free(x.f);
}

/* What a rank of a two-rank graph case reports: each run's status, its
   evaluator's graphs, wrong numbers seen, its last message. */
typedef struct graph_pair {
  hir_local_world *w;
  hir_fusion *f;
  hir_status st[2][5];
  int ngraphs[2], wrong;
  char err[2][400];
} graph_pair;

/* Every one of nruns runs succeeded on both ranks (else each failure said),
   the numbers were right, and each rank holds the graphs it should. */
static void check_graph_pair(const graph_pair *g, int nruns, int ngraphs0, int ngraphs1) {
  int r, k;
  for (r = 0; r < 2; r++)
    for (k = 0; k < nruns; k++) {
      if (g->st[r][k] != HIR_OK) fprintf(stderr, "  rank %d run %d: %s: %s\n", r, k, hir_status_str(g->st[r][k]), g->err[r]);
      CHECK(g->st[r][k] == HIR_OK);
    }
  CHECK(g->wrong == 0 && g->ngraphs[0] == ngraphs0 && g->ngraphs[1] == ngraphs1);
}

/* A program whose one communication has a one-member team talks to no
   peer: T1 on devices 0 and 1 sliced onto device 0 is a Broadcast from 0
   to 0 (seed 86 of the differential check, on 2 GPUs). In graph mode 1,
   rank 0's input and output moving is captured anew there; it was refused
   on rank 0 alone while rank 1 returned success. The graphs launch
   nothing, so the numbers are checked on the runs that compute: eager,
   the capture, the recapture. */
typedef struct lone_case {
  graph_pair g;
  hir_tensor in[2][2], out[2]; /* rank r's input; rank 0's outputs, before and after the move */
} lone_case;
static hir_status lone_rank(int rank, void *user) {
  lone_case *x = (lone_case *)user;
  hir_backend *be;
  hir_program *p;
  hir_evaluator *ev;
  int run, made;
  made = noop_graph_rank(x->g.w, x->g.f, rank, 1, &be, &p, &ev);
  for (run = 0; run < 4; run++) { /* eager, captured, replayed, then rank 0's arguments moved */
    int moved = run == 3 && rank == 0;
    const hir_tensor *in = &x->in[rank][moved];
    hir_tensor none, *out = rank == 0 ? &x->out[moved] : &none;
    memset(&none, 0, sizeof none);
    if (rank == 0) tset(out, 0, 1e30);
    x->g.st[rank][run] = made ? hir_run(ev, in, 1, out, 1) : HIR_ERR_INVALID;
    if (x->g.st[rank][run] == HIR_OK) x->g.st[rank][run] = hir_evaluator_sync(ev);
    if (rank == 0 && run != 2 && x->g.st[rank][run] == HIR_OK)
      x->g.wrong += fabs(tget(out, 0) - (tget(in, 1) + tget(in, 3) + tget(in, 5))) > 1e-5;
  }
  x->g.ngraphs[rank] = ev ? ev->ngraphs : -1;
  noop_graph_rank_end(ev, p, be, x->g.err[rank], sizeof x->g.err[rank]);
  return HIR_OK;
}
TEST(test_eval_graph_lone_team, "eval/graph_one_member_team", TEST_CPU) {
  lone_case x;
  int both[2] = {0, 1}, first = 0, axis = 0, r;
  int64_t si[2] = {3, 2}, so[1] = {1};
  hir_tv *t0, *t1, *t2;
  memset(&x, 0, sizeof x);
  x.g.f = hir_fusion_create();
  t0 = hir_input(x.g.f, HIR_F32, 2);
  hir_set_mesh(t0, 2, both);
  t1 = hir_sum(x.g.f, t0, 1, &axis);
  hir_set_mesh(t1, 2, both);
  t2 = hir_slice_step(x.g.f, t1, 0, -1, HIR_END, 1);
  hir_set_mesh(t2, 1, &first);
  hir_output(x.g.f, t2);
  for (r = 0; r < 2; r++) x.in[r][0] = trand(HIR_F32, 2, si), x.in[r][1] = trand(HIR_F32, 2, si), x.out[r] = tn(HIR_F32, 1, so);
  x.g.w = hir_local_world_create(2);
  hir_local_world_set_timeout(x.g.w, 20000);
  CHECK(hir_spmd(2, lone_rank, &x) == HIR_OK);
  check_graph_pair(&x.g, 4, 2, 1);
  for (r = 0; r < 2; r++) tfree(&x.in[r][0]), tfree(&x.in[r][1]), tfree(&x.out[r]);
  hir_local_world_free(x.g.w);
  hir_fusion_free(x.g.f);
}

/* Graph mode 2 on a world of 2 where only rank 1 has an output: T1 =
   relu(T0), T0 on device 0, T1 on device 1. Rank 1 leaves the output to the
   evaluator, then passes one of its own, then leaves it again. Passing it
   captured anew on rank 1 alone while rank 0 replayed: on the copy engines
   rank 1's eager receive then waited for a post rank 0's graph never makes
   (seed 63 of diff/random_programs_nccl, graph mode 2, 2 H200). Every run
   now replays the one graph on both ranks; the graphs launch nothing here,
   so the outputs of the replays hold the capture's numbers, which are
   checked, inputs unchanged. */
typedef struct pass_case {
  graph_pair g;
  hir_tensor in, out; /* rank 0's input; rank 1's own output */
} pass_case;
static hir_status pass_rank(int rank, void *user) {
  pass_case *x = (pass_case *)user;
  hir_backend *be;
  hir_program *p;
  hir_evaluator *ev;
  int run, made, e;
  made = noop_graph_rank(x->g.w, x->g.f, rank, 2, &be, &p, &ev);
  for (run = 0; run < 5; run++) { /* eager, captured, replayed, replayed into rank 1's buffer, replayed into ours */
    hir_tensor none, shape = x->in, out; /* rank 1 passes the input shape-only */
    memset(&none, 0, sizeof none);
    shape.data = NULL;
    out = rank == 1 && run == 3 ? x->out : none;
    for (e = 0; out.data && e < 6; e++) tset(&out, e, 1e30);
    x->g.st[rank][run] = made ? hir_run(ev, rank == 0 ? &x->in : &shape, 1, &out, 1) : HIR_ERR_INVALID;
    if (x->g.st[rank][run] == HIR_OK) x->g.st[rank][run] = hir_evaluator_sync(ev);
    for (e = 0; rank == 1 && x->g.st[rank][run] == HIR_OK && e < 6; e++)
      x->g.wrong += !out.data || tget(&out, e) != (tget(&x->in, e) > 0 ? tget(&x->in, e) : 0);
  }
  x->g.ngraphs[rank] = ev ? ev->ngraphs : -1;
  noop_graph_rank_end(ev, p, be, x->g.err[rank], sizeof x->g.err[rank]);
  return HIR_OK;
}
TEST(test_eval_graph_staged_output_passed, "eval/graph_staged_output_passed", TEST_CPU) {
  pass_case x;
  int first = 0, second = 1;
  int64_t sizes[2] = {2, 3};
  hir_tv *t0, *t1;
  memset(&x, 0, sizeof x);
  x.g.f = hir_fusion_create();
  t0 = hir_input(x.g.f, HIR_F32, 2);
  hir_set_mesh(t0, 1, &first);
  t1 = hir_relu(x.g.f, t0);
  hir_set_mesh(t1, 1, &second);
  hir_output(x.g.f, t1);
  x.in = trand(HIR_F32, 2, sizes), x.out = tn(HIR_F32, 2, sizes);
  x.g.w = hir_local_world_create(2);
  hir_local_world_set_timeout(x.g.w, 3000);
  CHECK(hir_spmd(2, pass_rank, &x) == HIR_OK);
  check_graph_pair(&x.g, 5, 1, 1);
  tfree(&x.in), tfree(&x.out);
  hir_local_world_free(x.g.w);
  hir_fusion_free(x.g.f);
}

/* Host loops of their own index, nested: a ring allgather by hand, the
   outer loop over steps j, the inner over parts k of the shard; at step j
   each rank sends part k to rank + j and receives it from rank - j (nvFuser's
   host IR tests with nested ForLoops, as its ring-overlap tests build): as a
   coalesced send/recv pair, or as one CollectivePermute (nvFuser's, of its
   ring-based column-parallel linear, test_overlap.py).
   out [D, P, 4] must be the whole input; hir_verify_schedule accepts it. */
typedef struct ring_case { int D, P, permute; } ring_case;

static hir_program *prog_nested_ring(void *user, int rank) {
  ring_case *rc = (ring_case *)user;
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 3), *z = hir_input(f, HIR_F32, 3), *o = hir_set(f, z);
  hir_val *D = hir_val_const(f, rc->D), *me = hir_val_named(f, HIR_NAMED_RANK), *j, *k, *src, *dst;
  hir_expr *steps = hir_host_for_range(p, D), *parts = hir_host_for_range(p, hir_val_const(f, rc->P)), *ite, *sel, *row, *cell, *mine, *part, *end;
  (void)rank;
  hir_output(f, o);
  hir_set_mesh(a, rc->D, iota_mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  j = hir_host_loop_index(steps);
  k = hir_host_loop_index(parts);
  src = hir_val_binary(f, HIR_SCALAR_MOD, hir_val_binary(f, HIR_SCALAR_SUB, hir_val_binary(f, HIR_SCALAR_ADD, me, D), j), D);
  dst = hir_val_binary(f, HIR_SCALAR_MOD, hir_val_binary(f, HIR_SCALAR_ADD, me, j), D);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
  hir_scope_append(hir_program_body(p), sel = hir_host_alias_select(p, a, 0, hir_val_const(f, 0))); /* my shard [P, 4] */
  hir_scope_append(hir_program_body(p), steps);
  hir_scope_append(hir_expr_body(steps), parts);
  row = hir_host_alias_select(p, o, 0, src);
  cell = hir_host_alias_select(p, hir_expr_output(row, 0), 0, k);
  part = hir_host_alias_select(p, hir_expr_output(sel, 0), 0, k);
  hir_scope_append(hir_expr_body(parts), row);
  hir_scope_append(hir_expr_body(parts), cell);
  hir_scope_append(hir_expr_body(parts), part);
  ite = hir_host_if(p, hir_val_binary(f, HIR_SCALAR_EQ, j, hir_val_const(f, 0)));
  hir_scope_append(hir_expr_body(ite), mine = hir_host_set(p, hir_expr_output(cell, 0), hir_expr_output(part, 0)));
  if (rc->permute) {
    end = hir_host_collective_permute(p, rc->D, iota_mesh, dst, src, hir_expr_output(part, 0), hir_expr_output(cell, 0));
    hir_scope_append(hir_expr_else(ite), end);
  } else {
    hir_scope_append(hir_expr_else(ite), hir_host_start_coalescing(p));
    hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_RECV, hir_expr_output(cell, 0), src));
    hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_SEND, hir_expr_output(part, 0), dst));
    hir_scope_append(hir_expr_else(ite), end = hir_host_end_coalescing(p));
  }
  hir_scope_append(hir_expr_else(ite), hir_host_wait(p, end));
  hir_scope_append(hir_expr_body(parts), ite);
  (void)mine;
  return p;
}

TEST(test_eval_nested_loops, "eval/nested_host_loops", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, permute;
  for (wi = 0; wi < 5; wi++)
    for (permute = 0; permute < 2; permute++) {
    ring_case rc;
    spmd_case c;
    hir_program *progs[MAXR];
    char msg[512] = "";
    int r, D = worlds[wi];
    int64_t sz[3] = {D, 3, 4};
    rc.D = D;
    rc.P = 3;
    rc.permute = permute;
    for (r = 0; r < D; r++) progs[r] = prog_nested_ring(&rc, r);
    CHECK(hir_program_verify(progs[0]) == HIR_OK);
    CHECK(hir_verify_schedule(progs, D, 2, msg, sizeof msg) == HIR_OK);
    if (msg[0]) fprintf(stderr, "  %s\n", msg);
    for (r = 0; r < D; r++) hir_program_free(progs[r]);
    case_init(&c, D);
    c.build = prog_nested_ring;
    c.user = &rc;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sz);
    c.in[1] = tn(HIR_F32, 3, sz); /* a shape for the output; its data unused */
    c.out[0] = tn(HIR_F32, 3, sz);
    memcpy(c.out[0].data, c.in[0].data, (size_t)tnumel(&c.out[0]) * 4);
    c.prealloc = wi & 1;
    RUN_CASE(&c, permute ? "nested ring allgather, CollectivePermute" : "nested ring allgather");
  }
  { /* the print, and a StreamIdx loop inside a loop of its own index is fine */
    hir_program *p = prog_nested_ring(&(ring_case){2, 3, 0}, 0);
    char text[8192];
    hir_program_snprint(p, text, sizeof text);
    CHECK(strstr(text, "FOR i") != NULL && strstr(text, "  FOR i") != NULL);
    hir_program_free(p);
    p = prog_nested_ring(&(ring_case){2, 3, 1}, 0);
    hir_program_snprint(p, text, sizeof text);
    CHECK(strstr(text, "CollectivePermute 10 (team=(0 1), send_peer=( ( rank + i8 ) % 2 ), "
                       "recv_peer=( ( ( rank + 2 ) - i8 ) % 2 ), input=T6_g_float[iS16{i3}] (DeviceMesh{0 1}), "
                       "output=T5_g_float[iS15{i6}], backend=NCCL)\n"
                       "        Wait Communication 10\n") != NULL);
    hir_program_free(p);
  }
}

/* nvFuser's MultiDeviceTest.SwizzleWithParallelType: a host loop of D - 1
   steps in which rank r copies chunk (r + i) % D of its shard (a swizzled
   Stream axis: each rank starts at its own chunk) into the output, which
   starts as zeros (nvFuser's zero-initialized Allocate; here a copy of a zero
   input): every chunk but (r + D - 1) % D is copied. in [D * 3, DIDx D, 5]. */
static hir_program *prog_swizzled_chunks(void *user, int rank) {
  int D = *(const int *)user;
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 3), *z = hir_input(f, HIR_F32, 3), *o = hir_set(f, z);
  hir_expr *loop = hir_host_for_range(p, hir_val_const(f, D - 1)), *src, *dst;
  hir_val *chunk = hir_val_binary(f, HIR_SCALAR_MOD, hir_val_binary(f, HIR_SCALAR_ADD, hir_val_named(f, HIR_NAMED_RANK),
                                                                     hir_host_loop_index(loop)), hir_val_const(f, D));
  (void)rank;
  hir_output(f, o);
  hir_set_mesh(a, D, iota_mesh), hir_set_mesh(z, D, iota_mesh), hir_set_mesh(o, D, iota_mesh);
  hir_parallelize(a, 1, HIR_DIDX), hir_parallelize(z, 1, HIR_DIDX), hir_parallelize(o, 1, HIR_DIDX);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
  hir_scope_append(hir_program_body(p), hir_host_set(p, o, z));
  hir_scope_append(hir_program_body(p), loop);
  hir_scope_append(hir_expr_body(loop), src = hir_host_alias_slice(p, a, 0, chunk, D));
  hir_scope_append(hir_expr_body(loop), dst = hir_host_alias_slice(p, o, 0, chunk, D));
  hir_scope_append(hir_expr_body(loop), hir_host_set(p, hir_expr_output(dst, 0), hir_expr_output(src, 0)));
  return p;
}

TEST(test_eval_swizzled_chunks, "eval/swizzled_chunks", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sz[3] = {D * 3, D, 5}, row, r, k;
    spmd_case c;
    hir_program *p = prog_swizzled_chunks(&D, 0);
    CHECK(hir_program_verify(p) == HIR_OK);
    hir_program_free(p);
    case_init(&c, D);
    c.build = prog_swizzled_chunks;
    c.user = &D;
    c.nin = 2;
    c.nout = 1;
    c.in[0] = trand(HIR_F32, 3, sz);
    c.in[1] = tn(HIR_F32, 3, sz);
    memset(c.in[1].data, 0, (size_t)tnumel(&c.in[1]) * 4);
    c.out[0] = tcopy(&c.in[0]);
    for (r = 0; r < D; r++) /* rank r's column: chunk (r + D - 1) % D stays zero */
      for (row = (r + D - 1) % D * 3; row < ((r + D - 1) % D + 1) * 3; row++)
        for (k = 0; k < 5; k++) tset(&c.out[0], (row * D + r) * 5 + k, 0);
    c.prealloc = wi & 1;
    RUN_CASE(&c, "swizzled chunks");
  }
}

/* What a CollectivePermute refuses: a team or dtypes that cannot be, when
   built; a peer outside its team, when run (on the rank that computes it). */
TEST(test_eval_permute_errors, "eval/collective_permute_errors", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 1), *b = hir_input(f, HIR_F64, 1), *o = hir_set(f, a);
  int twice[2] = {0, 0}, team[2] = {0, 1};
  hir_val *zero = hir_val_const(f, 0), *far = hir_val_const(f, 5);
  hir_output(f, o);
  CHECK(hir_host_collective_permute(p, 2, twice, zero, zero, a, o) == NULL && strstr(hir_program_error(p), "appears twice"));
  hir_program_free(p);
  p = hir_program_create();
  f = hir_program_fusion(p);
  a = hir_input(f, HIR_F32, 1), b = hir_input(f, HIR_F64, 1), o = hir_set(f, a);
  zero = hir_val_const(f, 0);
  hir_output(f, o);
  CHECK(hir_host_collective_permute(p, 2, team, zero, zero, a, b) == NULL && strstr(hir_program_error(p), "keeps the dtype"));
  hir_program_free(p);
  { /* sends to device 5 of a team of 2: refused by the run */
    hir_local_world *w = hir_local_world_create(1);
    hir_eval_desc ed;
    hir_evaluator *ev = NULL;
    hir_tensor in[1], out[1];
    int64_t sz[1] = {4};
    int one[1] = {0};
    p = hir_program_create();
    f = hir_program_fusion(p);
    a = hir_input(f, HIR_F32, 1), o = hir_set(f, a);
    far = hir_val_const(f, 5), zero = hir_val_const(f, 0);
    hir_output(f, o);
    hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
    hir_scope_append(hir_program_body(p), hir_host_collective_permute(p, 1, one, far, zero, a, o));
    memset(&ed, 0, sizeof ed);
    ed.comm = hir_local_comm(w, 0);
    in[0] = trand(HIR_F32, 1, sz);
    memset(out, 0, sizeof out);
    CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_ERR_INVALID &&
          strstr(hir_evaluator_error(ev), "on device 0 sends to 5 and receives from 0; both peers must be in its team"));
    hir_evaluator_free(ev);
    hir_program_free(p);
    p = hir_program_create(); /* to itself: a copy */
    f = hir_program_fusion(p);
    a = hir_input(f, HIR_F32, 1), o = hir_set(f, a);
    zero = hir_val_const(f, 0);
    hir_output(f, o);
    hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
    hir_scope_append(hir_program_body(p), hir_host_collective_permute(p, 1, one, zero, zero, a, o));
    CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_OK && hir_run(ev, in, 1, out, 1) == HIR_OK);
    CHECK(hir_evaluator_sync(ev) == HIR_OK);
    CHECK(out[0].data && memcmp(out[0].data, in[0].data, 16) == 0);
    hir_evaluator_free(ev);
    hir_program_free(p);
    tfree(&in[0]);
    hir_local_world_free(w);
  }
  { /* a ring whose devices all receive from the one they send to deadlocks on 3: the schedule check says so */
    hir_program *ring[3];
    int r, three[3] = {0, 1, 2};
    char msg[512] = "";
    for (r = 0; r < 3; r++) {
      hir_val *next;
      ring[r] = p = hir_program_create();
      f = hir_program_fusion(p);
      a = hir_input(f, HIR_F32, 1), o = hir_set(f, a);
      hir_output(f, o);
      next = hir_val_binary(f, HIR_SCALAR_MOD, hir_val_binary(f, HIR_SCALAR_ADD, hir_val_named(f, HIR_NAMED_RANK),
                                                               hir_val_const(f, 1)), hir_val_const(f, 3));
      hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
      hir_scope_append(hir_program_body(p), hir_host_collective_permute(p, 3, three, next, next, a, o));
    }
    CHECK(hir_verify_schedule(ring, 3, 1, msg, sizeof msg) != HIR_OK &&
          strstr(msg, "deadlock: no rank can go on: rank 0 at a send/recv group (send to 1, recv from 1)") != NULL);
    for (r = 0; r < 3; r++) hir_program_free(ring[r]);
  }
}

/* Scalar and Bool program inputs (nvFuser's scalar inputs): a fusion scaled
   by an integer input on every world, and a hand-built program whose loop
   runs n times and whose IF reads a Bool; new values replan. */
static hir_program *prog_scalar_loop(void) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *x = hir_input(f, HIR_F32, 1), *o;
  hir_val *n = hir_input_scalar(f), *flag = hir_input_scalar(f);
  hir_expr *loop = hir_host_for_range(p, n), *ite = hir_host_if(p, hir_val_binary(f, HIR_SCALAR_NE, flag, hir_val_const(f, 0)));
  hir_output(f, o = hir_set(f, x));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, o));
  hir_scope_append(hir_program_body(p), hir_host_set(p, o, x));
  hir_scope_append(hir_program_body(p), loop);
  hir_scope_append(hir_expr_body(loop), hir_host_binary(p, HIR_BINARY_ADD, o, o, x)); /* in place */
  hir_scope_append(hir_program_body(p), ite);
  hir_scope_append(hir_expr_body(ite), hir_host_binary(p, HIR_BINARY_ADD, o, o, x));
  return p;
}

/* The plan names each collective with the bytes it moves on this rank, and
   the path where the communicator says (here a stand-in that names one),
   replaced when new shapes are planned: x [DIDx 2, M, 4] f32 summed over its
   DIDx axis into every rank (an Allreduce of M x 4 x 4 bytes). */
typedef struct plan_case { hir_local_world *w; hir_fusion *f; char plan[2][2][600]; } plan_case; /* [rank][run] */
static const char *plan_path(hir_comm *c, void *team, hir_collective type, size_t bytes, hir_dtype dtype) {
  (void)c, (void)team;
  return type == HIR_COLL_ALLREDUCE && dtype == HIR_F32 && bytes < 4096 ? "a small path" : "a large path";
}
static hir_status plan_rank(int rank, void *user) {
  plan_case *x = (plan_case *)user;
  hir_comm *c = hir_local_comm(x->w, rank);
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_status s;
  int k;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.comm = c;
  c->collective_path = plan_path;
  if ((s = hir_lower(x->f, &ld, &p)) != HIR_OK || (s = hir_evaluator_create(p, &ed, &ev)) != HIR_OK) goto done;
  for (k = 0; k < 2 && s == HIR_OK; k++) {
    int64_t sz[3] = {1, k ? 512 : 8, 4};
    hir_tensor in = tn(HIR_F32, 3, sz), out;
    int64_t i;
    for (i = 0; i < tnumel(&in); i++) tset(&in, i, (double)(rank + 1));
    memset(&out, 0, sizeof out);
    if ((s = hir_run(ev, &in, 1, &out, 1)) == HIR_OK && (s = hir_evaluator_sync(ev)) == HIR_OK)
      snprintf(x->plan[rank][k], sizeof x->plan[rank][k], "%.590s", hir_program_plan(p));
    tfree(&in);
  }
done:
  c->collective_path = NULL;
  hir_evaluator_free(ev);
  hir_program_free(p);
  return s;
}

TEST(test_eval_plan_collectives, "eval/plan_collectives", TEST_CPU) {
  static const int mesh[2] = {0, 1};
  plan_case x;
  int axis = 0;
  hir_tv *in, *sum;
  memset(&x, 0, sizeof x);
  x.f = hir_fusion_create();
  in = hir_input(x.f, HIR_F32, 3);
  sum = hir_sum(x.f, in, 1, &axis);
  hir_output(x.f, sum);
  hir_set_mesh(in, 2, mesh);
  hir_set_mesh(sum, 2, mesh);
  hir_parallelize(in, 0, HIR_DIDX);
  x.w = hir_local_world_create(2);
  CHECK(hir_spmd(2, plan_rank, &x) == HIR_OK);
  CHECK(!strcmp(x.plan[0][0], x.plan[1][0]) && !strcmp(x.plan[0][1], x.plan[1][1])); /* every rank's alike */
  CHECK(strstr(x.plan[0][0], "collectives: Allreduce") != NULL && strstr(x.plan[0][0], "(T") != NULL);
  CHECK(strstr(x.plan[0][0], "0.1 KiB on a small path") != NULL);   /* 8 x 4 floats */
  CHECK(strstr(x.plan[0][1], "8.0 KiB on a large path") != NULL);   /* 512 x 4 floats, the new plan's */
  CHECK(strstr(x.plan[0][1], "small path") == NULL);                /* the last plan's part gone */
  CHECK(strstr(x.plan[0][1], "collectives: ") && !strstr(strstr(x.plan[0][1], "collectives: ") + 1, "collectives: ")); /* once */
  hir_local_world_free(x.w);
  hir_fusion_free(x.f);
}

/* A weight gathered whole on every rank is named in the plan. A [M = 2, K =
   2] and W [K = 2, N = 3], each with DIDx on axis 0 (a rank holds one row of
   each), out = A W on the mesh with no DIDx axis: both inputs are gathered,
   and only W, the matmul's weight, is a replicated weight (A, its
   activation, is not). The product, into a poisoned output, is the plain
   one on both ranks. */
typedef struct weight_case { hir_local_world *w; hir_fusion *f; char plan[2][600]; int wrong[2]; } weight_case;
static double weight_case_a(int row, int k) { return 0.37 * row - 0.61 * k + 0.25; }
static double weight_case_w(int k, int n) { return 0.43 * k * k - 0.29 * n + 0.11; }
static hir_status weight_rank(int rank, void *user) {
  weight_case *x = (weight_case *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  int64_t asz[2] = {1, 2}, wsz[2] = {1, 3}, osz[2] = {2, 3};
  hir_tensor in[2], out = tn(HIR_F32, 2, osz);
  hir_status s;
  int i, j, k;
  in[0] = tn(HIR_F32, 2, asz), in[1] = tn(HIR_F32, 2, wsz);
  for (k = 0; k < 2; k++) tset(&in[0], k, weight_case_a(rank, k));
  for (j = 0; j < 3; j++) tset(&in[1], j, weight_case_w(rank, j));
  for (i = 0; i < 6; i++) tset(&out, i, 1e30);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  if ((s = hir_lower(x->f, &ld, &p)) == HIR_OK && (s = hir_evaluator_create(p, &ed, &ev)) == HIR_OK &&
      (s = hir_run(ev, in, 2, &out, 1)) == HIR_OK && (s = hir_evaluator_sync(ev)) == HIR_OK) {
    snprintf(x->plan[rank], sizeof x->plan[rank], "%.590s", hir_program_plan(p));
    for (i = 0; i < 2; i++)
      for (j = 0; j < 3; j++) {
        double want = 0;
        for (k = 0; k < 2; k++) want += weight_case_a(i, k) * weight_case_w(k, j);
        x->wrong[rank] += fabs(tget(&out, i * 3 + j) - want) > 1e-5;
      }
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  tfree(&in[0]), tfree(&in[1]), tfree(&out);
  return s;
}

TEST(test_eval_plan_replicated_weight, "eval/plan_replicated_weight", TEST_CPU) {
  static const int mesh[2] = {0, 1};
  weight_case x;
  hir_tv *a, *w, *out;
  char named[96];
  const char *at;
  int flagged = 0;
  memset(&x, 0, sizeof x);
  x.f = hir_fusion_create();
  a = hir_input(x.f, HIR_F32, 2);
  w = hir_input(x.f, HIR_F32, 2);
  out = hir_matmul(x.f, a, w);
  hir_output(x.f, out);
  hir_set_mesh(a, 2, mesh), hir_set_mesh(w, 2, mesh), hir_set_mesh(out, 2, mesh);
  hir_parallelize(a, 0, HIR_DIDX), hir_parallelize(w, 0, HIR_DIDX);
  x.w = hir_local_world_create(2);
  CHECK(hir_spmd(2, weight_rank, &x) == HIR_OK);
  CHECK(x.wrong[0] == 0 && x.wrong[1] == 0);
  CHECK(!strcmp(x.plan[0], x.plan[1]));
  snprintf(named, sizeof named, "a replicated weight (input T%d whole on every rank for MatmulOp", hir_tv_name(w));
  for (at = x.plan[0]; (at = strstr(at, "a replicated weight")) != NULL; at++) flagged++;
  CHECK(strstr(x.plan[0], "Allgather") && strstr(strstr(x.plan[0], "Allgather") + 1, "Allgather")); /* both gathered */
  CHECK(strstr(x.plan[0], named) != NULL && flagged == 1); /* W named; A, the activation, not */
  if (flagged != 1) fprintf(stderr, "  the plan: %s\n", x.plan[0]);
  hir_local_world_free(x.w);
  hir_fusion_free(x.f);
}

/* A loop's own index as an op's scalar (nvFuser's HostIrTest.ForLoops): y =
   x * i inside FOR i in [0, 4) leaves x * 3; the plan knows the index is the
   loop's, though no value is bound before the run. */
TEST(test_eval_loop_index_scalar, "eval/loop_index_scalar", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *x = hir_input(f, HIR_F32, 1), *y;
  hir_expr *loop = hir_host_for_range(p, hir_val_const(f, 4));
  hir_evaluator *ev = NULL;
  hir_eval_desc ed;
  float xs[5] = {1.5f, -2, 0.25f, 3, 7};
  hir_tensor in[1], out[1];
  int j;
  y = hir_binary_val(f, HIR_BINARY_MUL, x, hir_host_loop_index(loop));
  hir_output(f, y);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, y));
  hir_scope_append(hir_program_body(p), loop);
  hir_scope_append(hir_expr_body(loop), hir_tv_definition(y));
  memset(&ed, 0, sizeof ed);
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  in[0].data = xs, in[0].dtype = HIR_F32, in[0].ndims = 1, in[0].sizes[0] = 5;
  CHECK(hir_program_verify(p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  CHECK(ev && hir_run(ev, in, 1, out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
  if (ev && hir_evaluator_error(ev)[0]) fprintf(stderr, "  %s\n", hir_evaluator_error(ev));
  for (j = 0; out[0].data && j < 5; j++) CHECK(((float *)out[0].data)[j] == xs[j] * 3);
  CHECK(out[0].data != NULL);
  hir_evaluator_free(ev);
  hir_program_free(p);
}

TEST(test_eval_scalar_inputs, "eval/scalar_inputs", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sz[3] = {D, 3, 4}, i;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 3);
    hir_val *s = hir_input_scalar(f);
    hir_tv *y = hir_binary_val(f, HIR_BINARY_MUL, x, s);
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_parallelize(x, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F32, 3, sz);
    memset(&c.in[1], 0, sizeof c.in[1]); /* by value: ndims 0, no data */
    c.in[1].sizes[0] = 3 + wi;
    c.out[0] = tn(HIR_F32, 3, sz);
    for (i = 0; i < tnumel(&c.in[0]); i++) tset(&c.out[0], i, tget(&c.in[0], i) * (3 + wi));
    RUN_CASE(&c, "scaled by a scalar input");
    hir_fusion_free(f);
  }
  { /* a loop of n and a Bool, on one rank; the values change between runs */
    static const double cases[3][2] = {{2, 1}, {0, 0}, {5, 0}};
    hir_program *p = prog_scalar_loop();
    hir_evaluator *ev = NULL;
    hir_eval_desc ed;
    float xs[4] = {1.5f, -2, 0.25f, 3};
    int64_t n, flag;
    int k, j;
    memset(&ed, 0, sizeof ed);
    CHECK(hir_program_verify(p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    for (k = 0; ev && k < 3; k++) {
      hir_tensor in[3], out[1];
      memset(in, 0, sizeof in);
      memset(out, 0, sizeof out);
      n = (int64_t)cases[k][0], flag = (int64_t)cases[k][1];
      in[0].data = xs, in[0].dtype = HIR_F32, in[0].ndims = 1, in[0].sizes[0] = 4;
      in[1].sizes[0] = n;
      in[2].sizes[0] = flag;
      CHECK(hir_run(ev, in, 3, out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
      for (j = 0; out[0].data && j < 4; j++) CHECK(((float *)out[0].data)[j] == xs[j] * (float)(1 + n + flag));
    }
    if (ev) { /* a scalar passed as a tensor is named */
      hir_tensor in[3], out[1];
      memset(in, 0, sizeof in);
      memset(out, 0, sizeof out);
      in[0].data = xs, in[0].dtype = HIR_F32, in[0].ndims = 1, in[0].sizes[0] = 4;
      in[1].data = xs, in[1].ndims = 1, in[1].sizes[0] = 4;
      CHECK(hir_run(ev, in, 3, out, 1) == HIR_ERR_INVALID && strstr(hir_evaluator_error(ev), "input 1 is a scalar: pass it by value"));
    }
    hir_evaluator_free(ev);
    hir_program_free(p);
  }
}
