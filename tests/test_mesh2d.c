/* 2-D meshes (hir_set_mesh_2d): DIDx along a row, DIDy down a column, for
   tensor x data parallel. Each case runs on the local world on every mesh
   shape of up to 8 devices (1 x 1 to 4 x 2, device ids in mesh order and
   reversed) against references computed here from the whole tensors; the
   nvFuser test each mirrors is named. */
#include "test.h"

static const int mesh_shapes[8][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 2}, {2, 3}, {4, 2}, {2, 4}};

/* Shape s's devices: in mesh order, or (odd s) reversed, so that a team's
   order is the mesh's, not the ranks'. */
static const int *mesh2d_devices(int s, int *devs) {
  int i, n = mesh_shapes[s][0] * mesh_shapes[s][1];
  for (i = 0; i < n; i++) devs[i] = s & 1 ? n - 1 - i : i;
  return devs;
}

/* x [R, C, K] split DIDy on R and DIDx on C, gathered along the rows (mode
   0: each device gets its row's [1, C, K]), down the columns (1: [R, 1,
   K]), both by two sets (2) or by one (3: lowered as two collectives, one a
   mesh axis); on square meshes, the splits swapped (4: R split DIDx, C
   DIDy, by two or three collectives). ShardingTest.MultiDimDeviceMesh's
   slices, as allgathers per team. */
TEST(test_mesh2d_allgather, "mesh2d/allgather", TEST_CPU | TEST_GPU_WORLDS) {
  static const char *const names[5] = {"mesh2d_allgather_rows", "mesh2d_allgather_columns", "mesh2d_allgather_both_two_sets",
                                       "mesh2d_allgather_both_one_set", "mesh2d_swap_didx_didy"};
  int s, mode, devs[MAXR];
  for (s = 0; s < 8; s++)
    for (mode = 0; mode < 5; mode++) {
      int R = mesh_shapes[s][0], C = mesh_shapes[s][1];
      int64_t sz[3] = {R, C, 5};
      hir_fusion *f;
      hir_tv *x, *y, *z;
      hir_tensor in;
      if (mode == 4 && R != C) continue;
      f = hir_fusion_create();
      x = hir_input(f, HIR_F32, 3);
      y = hir_set(f, x);
      z = mode == 2 ? hir_set(f, y) : y;
      hir_output(f, z);
      mesh2d_devices(s, devs);
      hir_set_mesh_2d(x, R, C, devs);
      hir_set_mesh_2d(y, R, C, devs);
      hir_set_mesh_2d(z, R, C, devs);
      hir_parallelize(x, 0, HIR_DIDY);
      hir_parallelize(x, 1, HIR_DIDX);
      if (mode == 0) hir_parallelize(y, 0, HIR_DIDY);
      if (mode == 1 || mode == 2) hir_parallelize(y, 1, HIR_DIDX); /* mode 2: down the columns first, then along the rows */
      if (mode == 4) {
        hir_parallelize(y, 0, HIR_DIDX);
        hir_parallelize(y, 1, HIR_DIDY);
      }
      in = trand(HIR_F32, 3, sz);
      RUN_ONE(f, R * C, in, tcopy(&in), s & 1, names[mode]);
    }
}

/* hir_rand on a 2-D mesh: x [R, C, 6] with DIDy on R and DIDx on C (device
   ids in mesh order and reversed), plus its numbers, Stream-parallel on the
   last axis: every device adds its elements of the whole tensor's numbers. */
TEST(test_mesh2d_random, "mesh2d/random", TEST_CPU | TEST_GPU_WORLDS) {
  int s, devs[MAXR];
  for (s = 0; s < 8; s++) {
    int R = mesh_shapes[s][0], C = mesh_shapes[s][1];
    int64_t sz[3] = {R, C, 6}, i;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 3), *z = hir_add(f, x, hir_rand(f, x, HIR_F32, hir_val_const(f, 99)));
    hir_tensor in = trand(HIR_F32, 3, sz), want = tn(HIR_F32, 3, sz);
    hir_output(f, z);
    mesh2d_devices(s, devs);
    hir_set_mesh_2d(x, R, C, devs);
    hir_parallelize(x, 0, HIR_DIDY);
    hir_parallelize(x, 1, HIR_DIDX);
    hir_parallelize(z, 2, HIR_STREAM);
    for (i = 0; i < R * C * 6; i++) tset(&want, i, tget(&in, i) + hir_rand_value(99, (uint64_t)i, 24));
    RUN_ONE(f, R * C, in, want, s & 1, "mesh2d_random");
  }
}

/* Row-parallel linear under data parallelism, as nvFuser's MulSum tests
   write it: a [R, C, G, M, K] (DP on R, DIDy; TP on C, DIDx) times b [C, K,
   N] (TP on C, the same on every row), both broadcast to [R, C, G, M, K, N],
   summed over C and K: K locally, then C across each row, into d [R, G, M,
   N]. Mode 0: d whole on the row (G = 1; an allreduce); 1: d's G split by
   DIDx (G = C; a reduce-scatter); 2: d's G stream-parallel (G = 2; each
   chunk's products, then its allreduce: per-chunk collectives in each
   team). Each row sums its own R slice. */
static void mesh2d_mulsum(int s, int mode, const char *name, int line) {
  static const int bcast_a[6] = {0, 0, 0, 0, 0, 1}, bcast_b[6] = {1, 0, 1, 1, 0, 0}, sum_axes[2] = {1, 4};
  int R = mesh_shapes[s][0], C = mesh_shapes[s][1], devs[MAXR];
  int64_t G = mode == 0 ? 1 : mode == 1 ? C : 2, M = 3, K = 4, N = 5, sa[5] = {R, C, G, M, K}, sb[3] = {C, K, N}, so[4] = {R, G, M, N};
  int64_t r, c, g, m, n, k;
  spmd_case sc;
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F64, 5), *b = hir_input(f, HIR_F64, 3);
  hir_tv *p = hir_mul(f, hir_broadcast(f, a, 6, bcast_a), hir_broadcast(f, b, 6, bcast_b)), *d = hir_sum(f, p, 2, sum_axes);
  hir_output(f, d);
  mesh2d_devices(s, devs);
  hir_set_mesh_2d(a, R, C, devs);
  hir_set_mesh_2d(b, R, C, devs);
  hir_set_mesh_2d(d, R, C, devs);
  hir_parallelize(a, 0, HIR_DIDY);
  hir_parallelize(a, 1, HIR_DIDX);
  hir_parallelize(b, 0, HIR_DIDX);
  hir_parallelize(d, 0, HIR_DIDY);
  if (mode == 1) hir_parallelize(d, 2, HIR_DIDX); /* d [R, rC, G, M, rK, N] */
  if (mode == 2) {
    hir_parallelize(d, 2, HIR_STREAM);
    hir_parallelize(p, 2, HIR_STREAM);
  }
  CHECK(hir_fusion_error(f)[0] == 0);
  case_lowered(&sc, R * C, f, 2, 1);
  sc.in[0] = trand(HIR_F64, 5, sa);
  sc.in[1] = trand(HIR_F64, 3, sb);
  sc.out[0] = tn(HIR_F64, 4, so);
  for (r = 0; r < R; r++)
    for (g = 0; g < G; g++)
      for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
          double t = 0;
          for (c = 0; c < C; c++)
            for (k = 0; k < K; k++)
              t += tget(&sc.in[0], (((r * C + c) * G + g) * M + m) * K + k) * tget(&sc.in[1], (c * K + k) * N + n);
          tset(&sc.out[0], ((r * G + g) * M + m) * N + n, t);
        }
  sc.tol = 1e-12;
  sc.prealloc = s & 1;
  sc.nstreams = 1 + (s & 1);
  run_case(&sc, name, __FILE__, line);
  hir_fusion_free(f);
}

/* DistributedMatmulTest's MulSum_LayoutNT_AllReduce and _ReduceScatter,
   with a DIDy batch axis. */
TEST(test_mesh2d_matmul_sum, "mesh2d/mulsum_allreduce_reduce_scatter", TEST_CPU | TEST_GPU_WORLDS) {
  int s;
  for (s = 0; s < 8; s++) {
    mesh2d_mulsum(s, 0, "mesh2d_mulsum_allreduce_rows", __LINE__);
    mesh2d_mulsum(s, 1, "mesh2d_mulsum_reduce_scatter_rows", __LINE__);
  }
}

/* Moves along one mesh axis while the other stays split: x [R, C, C2, K]
   split DIDy on R, DIDx on C, exchanged onto C2 along each row (mode 0: an
   all-to-all per row); x [R, C, K] whole along the rows scattered onto C
   (1: a scatter per row); x [R, C, K] split DIDx on C, summed over R split
   DIDy (2: an allreduce per column, the gradient sum of data parallelism),
   or over R and C (3: along the rows, then down the columns); x [C, R, K]
   split DIDy on R, summed over R into [C, K] split DIDx on C (4: down the
   columns, then each device keeps its column's slice).
   LowerCollectiveTest's AllToAll and Scatter per team; the DP allreduce of
   nvFuser's DistributedTransformerTest. */
TEST(test_mesh2d_moves, "mesh2d/alltoall_scatter_allreduce", TEST_CPU | TEST_GPU_WORLDS) {
  int s, mode, devs[MAXR], zero = 0, one = 1, both[2] = {0, 1};
  for (s = 0; s < 8; s++)
    for (mode = 0; mode < 5; mode++) {
      int R = mesh_shapes[s][0], C = mesh_shapes[s][1];
      int64_t s4[4] = {R, C, C, 3}, s3[3] = {R, C, 3};
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, mode ? 3 : 4);
      hir_tv *y = mode == 4 ? hir_sum(f, x, 1, &one) : mode == 3 ? hir_sum(f, x, 2, both) : mode == 2 ? hir_sum(f, x, 1, &zero) : hir_set(f, x);
      hir_tensor in, want;
      hir_output(f, y);
      mesh2d_devices(s, devs);
      hir_set_mesh_2d(x, R, C, devs);
      hir_set_mesh_2d(y, R, C, devs);
      if (mode < 2) hir_parallelize(x, 0, HIR_DIDY);
      if (mode < 2) hir_parallelize(y, 0, HIR_DIDY);
      if (mode == 4) {
        int64_t sx[3] = {C, R, 3}, so[2] = {C, 3}, c, r, k;
        hir_parallelize(x, 1, HIR_DIDY);
        hir_parallelize(y, 0, HIR_DIDX); /* y [C, rR, 3] */
        in = trand(HIR_F32, 3, sx);
        want = tn(HIR_F32, 2, so);
        for (c = 0; c < C; c++)
          for (k = 0; k < 3; k++) {
            double t = 0;
            for (r = 0; r < R; r++) t += tget(&in, (c * R + r) * 3 + k);
            tset(&want, c * 3 + k, t);
          }
        RUN_ONE(f, R * C, in, want, s & 1, "mesh2d_allreduce_columns_then_split_rows");
        continue;
      }
      if (mode == 0) {
        hir_parallelize(x, 1, HIR_DIDX);
        hir_parallelize(y, 2, HIR_DIDX);
      } else if (mode == 1) {
        hir_parallelize(y, 1, HIR_DIDX);
      } else {
        int64_t so[2] = {mode == 3 ? 1 : C, 3}, r, i;
        hir_parallelize(x, 0, HIR_DIDY);
        hir_parallelize(x, 1, HIR_DIDX);
        if (mode == 2) hir_parallelize(y, 1, HIR_DIDX); /* y [rR, C, 3]; mode 3: [rR, rC, 3] */
        in = trand(HIR_F32, 3, s3);
        want = tn(HIR_F32, mode == 3 ? 1 : 2, mode == 3 ? so + 1 : so);
        for (i = 0; i < C * 3; i++) {
          double t = 0;
          for (r = 0; r < R; r++) t += tget(&in, r * C * 3 + i);
          tset(&want, mode == 3 ? i % 3 : i, t + (mode == 3 ? tget(&want, i % 3) : 0));
        }
        RUN_ONE(f, R * C, in, want, s & 1, mode == 3 ? "mesh2d_allreduce_rows_then_columns" : "mesh2d_allreduce_columns");
        continue;
      }
      in = trand(HIR_F32, mode ? 3 : 4, mode ? s3 : s4);
      RUN_ONE(f, R * C, in, tcopy(&in), s & 1, mode ? "mesh2d_scatter_rows" : "mesh2d_alltoall_rows");
    }
}

/* StreamTest's collective pipelines on a 2-D mesh. */
TEST(test_mesh2d_stream, "mesh2d/stream", TEST_CPU | TEST_GPU_WORLDS) {
  int s;
  for (s = 0; s < 8; s++) mesh2d_mulsum(s, 2, "mesh2d_mulsum_stream_allreduce_rows", __LINE__);
}

/* x [C, 3, 5, R, 7, 9] split DIDx on C and DIDy on R, reshaped to [15C,
   63R]: the split axes are gathered first (a reshape reads whole axes),
   along the rows and down the columns. The numbers of
   ShardingTest.ShardedReshapeWithIndependentSplit (nvFuser keeps the
   sharding through the reshape instead; hostir's splits stop at one). */
TEST(test_mesh2d_reshape, "mesh2d/reshape", TEST_CPU | TEST_GPU_WORLDS) {
  int s, devs[MAXR];
  for (s = 0; s < 8; s++) {
    int R = mesh_shapes[s][0], C = mesh_shapes[s][1];
    int64_t sz[6] = {C, 3, 5, R, 7, 9}, to[2] = {15 * C, 63 * R};
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 6), *y = hir_reshape(f, x, 2, to);
    hir_tensor in, want;
    hir_output(f, y);
    mesh2d_devices(s, devs);
    hir_set_mesh_2d(x, R, C, devs);
    hir_set_mesh_2d(y, R, C, devs);
    hir_parallelize(x, 0, HIR_DIDX);
    hir_parallelize(x, 3, HIR_DIDY);
    in = trand(HIR_F32, 6, sz);
    want = tcopy(&in);
    want.ndims = 2, want.sizes[0] = to[0], want.sizes[1] = to[1];
    RUN_ONE(f, R * C, in, want, s & 1, "mesh2d_reshape");
  }
}

/* The AG+GEMM on mesh shape s: a [R, C, m, K] split DIDy on R and DIDx on
   C, times b [K, N], into o [R, C, m, N] whose C (mode 0: gathered along the
   rows) or R (mode 1: down the columns, C kept split) is stream-parallel.
   tv: a, b, o; in: random a and b; *want: the whole product. */
static hir_fusion *mesh2d_ag_gemm(int s, int mode, hir_tv **tv, hir_tensor *in, hir_tensor *want) {
  int R = mesh_shapes[s][0], C = mesh_shapes[s][1], devs[MAXR];
  int64_t m = 2, K = 3, N = 4, sa[4] = {R, C, m, K}, sb[2] = {K, N}, so[4] = {R, C, m, N}, i, n, k;
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = tv[0] = hir_input(f, HIR_F64, 4), *b = tv[1] = hir_input(f, HIR_F64, 2), *o = tv[2] = hir_matmul(f, a, b);
  hir_output(f, o);
  mesh2d_devices(s, devs);
  hir_set_mesh_2d(a, R, C, devs);
  hir_set_mesh_2d(b, R, C, devs);
  hir_set_mesh_2d(o, R, C, devs);
  hir_parallelize(a, 0, HIR_DIDY);
  hir_parallelize(a, 1, HIR_DIDX);
  hir_parallelize(o, 0, mode ? HIR_STREAM : HIR_DIDY);
  hir_parallelize(o, 1, mode ? HIR_DIDX : HIR_STREAM);
  in[0] = trand(HIR_F64, 4, sa);
  in[1] = trand(HIR_F64, 2, sb);
  *want = tn(HIR_F64, 4, so);
  for (i = 0; i < R * C * m; i++)
    for (n = 0; n < N; n++) {
      double t = 0;
      for (k = 0; k < K; k++) t += tget(&in[0], i * K + k) * tget(&in[1], k * N + n);
      tset(want, i * N + n, t);
    }
  return f;
}

/* The P2P pipelines within each row or column: AG+GEMM (mode 0: a [R, C,
   m, K] split DIDy on R and DIDx on C, C gathered along the row chunk by
   chunk into out = a @ b [R, C, m, N]; mode 1: R gathered down the column,
   C kept split), and the GEMM+RS mirror as a sum (mode 2: x = -a [R, C, G,
   m] computed chunk by chunk along G, summed over C along the row into [R,
   G, m], G = C split DIDx, each chunk's partial sent to its owner). Ring
   and linear schedules, 1 and 2 parts a peer, and as collective pipelines
   per team (HIR_SCHEDULE_COLLECTIVE, 2 parts); the AG+GEMMs of four mesh
   shapes with stream.experimental.column_parts = 2. AllgatherOverlapTest and
   ReduceScatterOverlapTest per team. */
TEST(test_mesh2d_p2p, "mesh2d/p2p_pipelines", TEST_CPU | TEST_GPU_WORLDS) {
  int s, mode, coll, devs[MAXR], one = 1;
  for (s = 0; s < 8; s++)
    for (mode = 0; mode < 3; mode++)
      for (coll = 0; coll < 2; coll++) {
      int R = mesh_shapes[s][0], C = mesh_shapes[s][1];
      int64_t m = 2, sx[4] = {R, C, C, m}, sr[3] = {R, C, m}, r, c, g;
      lowered_case lc;
      spmd_case sc;
      hir_fusion *f;
      hir_tv *tv[3];
      if (coll && (s == 4 || s == 5 || s == 7 || (platform->p2p_only && mode == 2) || (mode == 1 && C == 1)))
        continue; /* no RS on a P2P-only world; down a column of a one-column mesh the cut axis is C, of size 1 */
      case_init(&sc, R * C);
      if (mode < 2) {
        f = mesh2d_ag_gemm(s, mode, tv, sc.in, &sc.out[0]);
        sc.nin = 2;
      } else {
        hir_tv *a, *x, *o;
        f = hir_fusion_create();
        a = hir_input(f, HIR_F64, 4), x = hir_neg(f, a), o = hir_sum(f, x, 1, &one);
        hir_output(f, o);
        mesh2d_devices(s, devs);
        hir_set_mesh_2d(a, R, C, devs);
        hir_set_mesh_2d(o, R, C, devs);
        hir_parallelize(a, 0, HIR_DIDY);
        hir_parallelize(a, 1, HIR_DIDX);
        hir_parallelize(x, 2, HIR_STREAM); /* each chunk of -a, then its partial sums sent along the row */
        hir_parallelize(o, 0, HIR_DIDY);
        hir_parallelize(o, 2, HIR_DIDX); /* o [R, rC, G, m] */
        sc.nin = 1;
        sc.in[0] = trand(HIR_F64, 4, sx);
        sc.out[0] = tn(HIR_F64, 3, sr);
        for (r = 0; r < R; r++)
          for (g = 0; g < C * m; g++) {
            double t = 0;
            for (c = 0; c < C; c++) t -= tget(&sc.in[0], (r * C + c) * C * m + g);
            tset(&sc.out[0], r * C * m + g, t);
          }
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      memset(&lc, 0, sizeof lc);
      lc.f = f;
      lc.d.stream.schedule = s & 1 ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
      lc.d.stream.parts = 1 + (s / 2) % 2;
      if (coll) lc.d.stream.schedule = HIR_SCHEDULE_COLLECTIVE, lc.d.stream.parts = 2;
      lc.d.stream.experimental.column_parts = mode < 2 && s >= 4 ? 2 : 0; /* AG: the GEMM's second half of N after the team's loop */
      sc.build = build_lowered_with;
      sc.user = &lc;
      sc.nout = 1;
      sc.tol = 1e-12;
      sc.prealloc = s & 1;
      sc.nstreams = 1 + s % 3;
      RUN_CASE(&sc, mode == 0 ? (coll ? "mesh2d_collective_allgather_rows" : "mesh2d_p2p_allgather_rows")
                    : mode == 1 ? (coll ? "mesh2d_collective_allgather_columns" : "mesh2d_p2p_allgather_columns")
                                : (coll ? "mesh2d_collective_reduce_scatter_rows" : "mesh2d_p2p_reduce_scatter_rows"));
      { /* every rank's program: P2P on a mesh of 4, in the device's own team; the schedules match across ranks */
        hir_program *progs[MAXR] = {NULL};
        char buf[16384], msg[512];
        int r;
        for (r = 0; r < R * C; r++) {
          hir_lower_desc d = lc.d;
          d.my_device = r;
          CHECK(hir_lower(f, &d, &progs[r]) == HIR_OK);
        }
        hir_program_snprint(progs[3 % (R * C)], buf, sizeof buf);
        if (coll) /* collectives in the loop, each over the device's own team (a row or a column of 2), no send/recv */
          CHECK(R * C != 4 || (strstr(buf, "P2PCommunication") == NULL && strstr(buf, "team=(") != NULL && strstr(buf, "FOR StreamIdx in iStreamIdx")));
        else
          CHECK(R * C != 4 || (strstr(buf, "P2PCommunication") != NULL && strstr(buf, "team=(") == NULL)); /* no collective */
        CHECK(hir_verify_schedule(progs, R * C, 1 + s % 3, msg, sizeof msg) == HIR_OK);
        for (r = 0; r < R * C; r++) hir_program_free(progs[r]);
      }
      hir_fusion_free(f);
    }
}

typedef struct mesh2d_tune_ctx {
  hir_local_world *w;
  const hir_fusion *f;
  const hir_tv *tv[3]; /* the inputs, the output */
  hir_tensor in[2], want;
  char err[MAXR][600], plan[MAXR][600];
} mesh2d_tune_ctx;

/* Each rank tunes the fusion on its shards, then checks its output (poisoned first). */
static hir_status mesh2d_tune_rank(int rank, void *user) {
  mesh2d_tune_ctx *x = (mesh2d_tune_ctx *)user;
  hir_tune_desc d;
  hir_tuner *t = NULL;
  hir_tensor in[2], out[1], want;
  int i;
  memset(&d, 0, sizeof d);
  d.lower.my_device = rank;
  d.lower.comm = d.eval.comm = hir_local_comm(x->w, rank);
  d.iters = 2;
  if (hir_tuner_create(x->f, &d, &t) != HIR_OK) {
    snprintf(x->err[rank], sizeof x->err[rank], "create: %.500s", hir_tuner_error(t));
    hir_tuner_free(t);
    return HIR_OK;
  }
  for (i = 0; i < 2; i++) in[i] = shard(&x->in[i], x->tv[i], rank);
  want = shard(&x->want, x->tv[2], rank);
  out[0] = tn(HIR_F64, want.ndims, want.sizes);
  for (i = 0; i < tnumel(&out[0]); i++) tset(&out[0], i, 1e30);
  if (hir_tuner_run(t, in, 2, out, 1) != HIR_OK || hir_tuner_sync(t) != HIR_OK)
    snprintf(x->err[rank], sizeof x->err[rank], "run: %.500s", hir_tuner_error(t));
  else
    compare(&out[0], &want, 1e-12, x->err[rank], sizeof x->err[rank], "the output");
  snprintf(x->plan[rank], sizeof x->plan[rank], "%.500s", hir_program_plan(hir_tuner_program(t)));
  for (i = 0; i < 2; i++) tfree(&in[i]);
  tfree(&want);
  tfree(&out[0]);
  hir_tuner_free(t);
  return HIR_OK;
}

/* Two ranks' plans name one choice: "tuned on N ranks in T ms: <choice> (the slowest ...". */
static int mesh2d_same_choice(const char *a, const char *b) {
  const char *pa = strstr(a, " ms: "), *pb = strstr(b, " ms: "), *ea = pa ? strstr(pa, " (the slowest") : NULL;
  const char *eb = pb ? strstr(pb, " (the slowest") : NULL;
  return ea && eb && ea - pa == eb - pb && !strncmp(pa, pb, (size_t)(ea - pa));
}

/* hir_tuner on a 2-D mesh: the AG+GEMM of mesh2d/p2p_pipelines (mode 0)
   timed as serial and as P2P pipelines along each row, one choice agreed
   by every rank, the output right on each. */
TEST(test_mesh2d_tuned, "mesh2d/tuned", TEST_CPU) {
  int s;
  for (s = 3; s < 6; s++) {
    int R = mesh_shapes[s][0], C = mesh_shapes[s][1], r;
    mesh2d_tune_ctx x;
    hir_tv *tv[3];
    hir_fusion *f;
    memset(&x, 0, sizeof x);
    x.f = f = mesh2d_ag_gemm(s, 0, tv, x.in, &x.want);
    x.tv[0] = tv[0], x.tv[1] = tv[1], x.tv[2] = tv[2];
    x.w = hir_local_world_create(R * C);
    CHECK(hir_spmd(R * C, mesh2d_tune_rank, &x) == HIR_OK);
    for (r = 0; r < R * C; r++)
      if (x.err[r][0] || strncmp(x.plan[r], "tuned on", 8) || !strstr(x.plan[r], "ring") || !mesh2d_same_choice(x.plan[r], x.plan[0])) {
        fprintf(stderr, "  %d x %d mesh, rank %d: %s\n    plan: %s\n", R, C, r, x.err[r], x.plan[r]);
        hir_test_failures++;
      }
    tfree(&x.in[0]);
    tfree(&x.in[1]);
    tfree(&x.want);
    hir_local_world_free(x.w);
    hir_fusion_free(f);
  }
}

/* Printed as nvFuser prints a 2-D mesh and a DIDy axis; each device's
   program holds its own row's team. */
TEST(test_mesh2d_print, "mesh2d/print", TEST_CPU) {
  static const int devs[4] = {0, 1, 2, 3};
  int dev;
  for (dev = 0; dev < 4; dev++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 3), *y = hir_set(f, x);
    hir_lower_desc d;
    hir_program *p = NULL;
    char buf[8192], team[32];
    hir_output(f, y);
    hir_set_mesh_2d(x, 2, 2, devs);
    hir_set_mesh_2d(y, 2, 2, devs);
    hir_parallelize(x, 0, HIR_DIDY);
    hir_parallelize(x, 1, HIR_DIDX);
    hir_parallelize(y, 0, HIR_DIDY);
    memset(&d, 0, sizeof d);
    d.my_device = dev;
    CHECK(hir_lower(f, &d, &p) == HIR_OK);
    hir_program_snprint(p, buf, sizeof buf);
    snprintf(team, sizeof team, "team=(%d %d)", dev / 2 * 2, dev / 2 * 2 + 1);
    CHECK(strstr(buf, "DeviceMesh{{0 1}{2 3}}") != NULL);
    CHECK(strstr(buf, "ideviceIdx.y") != NULL && strstr(buf, "ideviceIdx.x") != NULL);
    CHECK(strstr(buf, team) != NULL);
    CHECK(hir_tv_mesh_cols(x) == 2);
    if (hir_test_failures) fprintf(stderr, "%s\n", buf);
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* Lowers f for device 0 and checks the refusal names `want`. */
static void mesh2d_refused(hir_fusion *f, const char *want, int line) {
  hir_lower_desc d;
  hir_program *p = NULL;
  memset(&d, 0, sizeof d);
  if (hir_lower(f, &d, &p) == HIR_OK || !strstr(hir_program_error(p), want)) {
    fprintf(stderr, "  %s:%d: want a refusal naming \"%s\", got: %s\n", __FILE__, line, want, p ? hir_program_error(p) : "(none)");
    hir_test_failures++;
  }
  hir_program_free(p);
  hir_fusion_free(f);
}

typedef struct mesh2d_bad_run {
  hir_local_world *w;
  const hir_fusion *f;
  char err[4][600];
} mesh2d_bad_run;

/* Each rank runs f once well ([1, 2, 3]), then with the DIDy axis whole. */
static hir_status mesh2d_bad_rank(int rank, void *user) {
  mesh2d_bad_run *x = (mesh2d_bad_run *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[1], out[1];
  float data[12] = {0};
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  ed.timeout_ms = 10000;
  if (hir_lower(x->f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK) {
    in[0].data = data, in[0].dtype = HIR_F32, in[0].ndims = 3, in[0].sizes[0] = 1, in[0].sizes[1] = 2, in[0].sizes[2] = 3;
    if (hir_run(ev, in, 1, out, 1) != HIR_OK || out[0].sizes[0] != 1) snprintf(x->err[rank], sizeof x->err[rank], "good run: %.500s", hir_evaluator_error(ev));
    in[0].sizes[0] = 2;
    memset(out, 0, sizeof out);
    if (!x->err[rank][0] && hir_run(ev, in, 1, out, 1) == HIR_ERR_SHAPE) snprintf(x->err[rank], sizeof x->err[rank], "%.500s", hir_evaluator_error(ev));
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  return HIR_OK;
}

/* What 2-D meshes cannot do is refused by name, at build, lowering or run. */
TEST(test_mesh2d_errors, "mesh2d/errors", TEST_CPU) {
  static const int devs[4] = {0, 1, 2, 3};
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 3), *y;
  CHECK(hir_set_mesh_2d(x, 0, 2, devs) == HIR_ERR_INVALID && strstr(hir_fusion_error(f), "0 x 2 mesh"));
  hir_fusion_free(f);

  f = hir_fusion_create(); /* DIDy needs a 2-D mesh */
  x = hir_input(f, HIR_F32, 3);
  hir_output(f, hir_relu(f, x));
  hir_set_mesh(x, 4, devs);
  hir_parallelize(x, 0, HIR_DIDY);
  mesh2d_refused(f, "hir_set_mesh_2d", __LINE__);

  f = hir_fusion_create(); /* both mesh axes gathered in one set, chunk by chunk: not one P2P pipeline */
  x = hir_input(f, HIR_F32, 3);
  y = hir_set(f, x);
  hir_output(f, y);
  hir_set_mesh_2d(x, 2, 2, devs);
  hir_set_mesh_2d(y, 2, 2, devs);
  hir_parallelize(x, 0, HIR_DIDY);
  hir_parallelize(x, 1, HIR_DIDX);
  hir_parallelize(y, 0, HIR_STREAM);
  mesh2d_refused(f, "chunk by chunk along its DIDy axis", __LINE__);

  f = hir_fusion_create(); /* from a 2-D mesh onto a 1-D one of the same devices */
  x = hir_input(f, HIR_F32, 3);
  y = hir_set(f, x);
  hir_output(f, y);
  hir_set_mesh_2d(x, 2, 2, devs);
  hir_set_mesh(y, 4, devs);
  hir_parallelize(x, 1, HIR_DIDX);
  mesh2d_refused(f, "same mesh", __LINE__);

  { /* a run given a DIDy input that is not this device's slice: refused on every rank */
    mesh2d_bad_run x;
    int r;
    memset(&x, 0, sizeof x);
    x.w = hir_local_world_create(4);
    x.f = f = hir_fusion_create();
    y = hir_input(f, HIR_F32, 3);
    hir_output(f, hir_relu(f, y));
    hir_set_mesh_2d(y, 2, 2, devs);
    hir_parallelize(y, 0, HIR_DIDY);
    CHECK(hir_spmd(4, mesh2d_bad_rank, &x) == HIR_OK);
    for (r = 0; r < 4; r++)
      if (!strstr(x.err[r], "input 0 (T0) axis 0 is split across 2 devices (DIDy): this rank's shard has size 1")) {
        fprintf(stderr, "  rank %d: %s\n", r, x.err[r]);
        hir_test_failures++;
      }
    hir_fusion_free(f);
    hir_local_world_free(x.w);
  }
}
