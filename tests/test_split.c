/* hir_split: an axis split in two, sharded or stream-parallel, the split
   carried to every tensor it maps onto, the user's tensors kept in their
   logical axes (a DIDx-split axis holds this device's part). Each case runs
   on the local world (1, 2, 3, 4, 8 ranks) against a reference computed on
   the whole tensors; the nvFuser test each mirrors is named. */
#include "test.h"

/* x [M, K] split (outer) by D on M, DIDx: relu on each device's rows, then
   gathered (set onto the whole axis). MultiDeviceTest's sharding by split
   (tv->split(0, d); axis(0)->parallelize(DIDx)) and LowerCollectiveTest's
   Allgather with a split axis; on the CPU also with the arrays' axes laid out
   in reverse, MultiDeviceTest.LoopSplitWithReorder's transposed allocation
   (an allocation layout is the strides of the caller's arrays). */
TEST(test_split_sharded, "split/sharded", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, gather;
  for (wi = 0; wi < 5; wi++)
    for (gather = 0; gather < 2; gather++) {
      int D = worlds[wi];
      int64_t sz[2] = {3 * D, 5}, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_relu(f, x), *z = gather ? hir_set(f, y) : y;
      hir_output(f, z);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_set_mesh(z, D, iota_mesh);
      hir_split(x, 0, D, 1);
      hir_parallelize(x, 0, HIR_DIDX);
      hir_parallelize(y, 0, HIR_DIDX); /* z (gathered) keeps its parts serial */
      CHECK(hir_fusion_error(f)[0] == 0);
      CHECK(hir_tv_ndims(z) == 3 && hir_tv_logical_ndims(z) == 2);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(HIR_F32, 2, sz);
      c.out[0] = tn(HIR_F32, 2, sz);
      for (i = 0; i < 15 * D; i++) tset(&c.out[0], i, tget(&c.in[0], i) > 0 ? tget(&c.in[0], i) : 0);
      c.prealloc = wi & 1;
      RUN_CASE(&c, gather ? "split_sharded_gathered" : "split_sharded");
      hir_fusion_free(f);
    }
}

/* C = A [M, K] x B [K, N], C's M split by S and stream-parallel (the split
   reaches A's M); and the AG+GEMM of nvFuser's overlap tests: A's M split by
   D and sharded, C's split parts stream-parallel (a P2P allgather pipeline),
   the user passing A's rows and getting C whole. StreamTest's matmul with a
   split Stream axis; AllgatherOverlapTest. */
TEST(test_split_matmul, "split/matmul", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 2; mode++) {
      int D = worlds[wi], S = mode ? D : 2;
      int64_t sa[2] = {4 * S, 6}, sb[2] = {6, 5}, so[2] = {4 * S, 5}, m, n, k;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, b);
      hir_output(f, o);
      hir_set_mesh(a, D, iota_mesh);
      hir_set_mesh(b, D, iota_mesh);
      hir_set_mesh(o, D, iota_mesh);
      hir_split(o, 0, S, 1);
      if (mode) hir_parallelize(a, 0, HIR_DIDX);
      hir_parallelize(o, 0, HIR_STREAM);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 2, 1);
      c.in[0] = trand(HIR_F32, 2, sa);
      c.in[1] = trand(HIR_F32, 2, sb);
      c.out[0] = tn(HIR_F32, 2, so);
      for (m = 0; m < 4 * S; m++)
        for (n = 0; n < 5; n++) {
          double t = 0;
          for (k = 0; k < 6; k++) t += tget(&c.in[0], m * 6 + k) * tget(&c.in[1], k * 5 + n);
          tset(&c.out[0], m * 5 + n, t);
        }
      c.prealloc = wi & 1;
      RUN_CASE(&c, mode ? "split_ag_matmul_p2p" : "split_stream_matmul");
      hir_fusion_free(f);
    }
}

/* How many times s occurs in text. */
static int count_of(const char *text, const char *s) {
  int n = 0;
  while ((text = strstr(text, s)) != NULL) n++, text++;
  return n;
}

/* The type of the first collective a printed program posts ("Allgather",
   ...; a P2P send or receive is none), or NULL. */
static const char *collective_in(const char *text) {
  const char *at = text;
  while ((at = strstr(at, "Communication ")) != NULL) {
    const char *type = strstr(at, "(type=");
    if ((at - text < 3 || strncmp(at - 3, "P2P", 3)) && at[14] >= '0' && at[14] <= '9' && type && !memchr(at, '\n', (size_t)(type - at)))
      return type + 6;
    at++;
  }
  return NULL;
}

/* Whether hir_lower's automatic choice lowers f from the logical shapes of
   rank 0's parts of c's inputs (each rank's part of a split axis), as
   hir_run is given them; says why not. */
static int automatic_lowers(const hir_fusion *f, const spmd_case *c, int nin, const char *what) {
  hir_lower_desc ld;
  hir_program *p = NULL, *q = NULL;
  hir_tensor shapes[MAXT];
  int k, ok;
  memset(&ld, 0, sizeof ld);
  if (hir_lower(f, &ld, &p) != HIR_OK) return hir_program_free(p), 0;
  for (k = 0; k < nin; k++) shapes[k] = shard(&c->in[k], hir_program_input(p, k), 0);
  ld.stream.automatic = 1, ld.stream.input_shapes = shapes, ld.stream.ninput_shapes = nin;
  ok = hir_lower(f, &ld, &q) == HIR_OK;
  if (!ok) fprintf(stderr, "  %s, automatic: %s\n", what, hir_program_error(q));
  for (k = 0; k < nin; k++) tfree(&shapes[k]);
  hir_program_free(p);
  hir_program_free(q);
  return ok;
}

/* Tensor parallelism on logical shapes, as nvFuser writes it: a matmul's or
   linear's N split by D with DIDx on the outer part (column-parallel: local
   products, no communication where the output keeps the split, an
   Allgather where it is whole), or its K (row-parallel: local partial
   products summed by an Allreduce into a whole output, a ReduceScatter
   into one split on M: sequence parallelism), with a bias (added after the
   sum: DecomposeRowParallelLinearWithBias) and a batch axis; the split
   made on an operand or on the output (its N, or its reduction axis). */
TEST(test_split_through_matmul, "split/through_matmul", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 24; mode++) {
      int D = worlds[wi], linear = mode & 1, on_k = (mode >> 1) & 1, split_out = (mode >> 2) & 1, extra = mode >> 3;
      int has_bias = linear && extra >= 1, batch = extra == 2 || (!linear && extra == 1), nb = batch ? 1 : 0;
      int via_out = extra == 0 && (wi & 1);
      int64_t Bt = batch ? 2 : 1, M = 2 * D, K = 3 * D, N = 2 * D, sa[3], sw[2], sbias[1] = {N}, so[3], b, m, n, k;
      const char *want_comm = D == 1 ? NULL : !on_k ? (split_out ? NULL : "Allgather") : split_out ? "ReduceScatter" : "Allreduce";
      char name[64];
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, HIR_F32, 2 + nb), *w = hir_input(f, HIR_F32, 2), *bias = has_bias ? hir_input(f, HIR_F32, 1) : NULL;
      hir_tv *o = linear ? hir_linear(f, a, w, bias) : hir_matmul(f, a, w);
      hir_output(f, o);
      hir_set_mesh(a, D, iota_mesh);
      hir_set_mesh(w, D, iota_mesh);
      hir_set_mesh(o, D, iota_mesh);
      if (bias) hir_set_mesh(bias, D, iota_mesh);
      if (!on_k) { /* w's N: [N, K] axis 0 or [K, N] axis 1; it reaches o's N and the bias (or made on o's N) */
        CHECK((via_out ? hir_split(o, nb + 1, D, 1) : hir_split(w, linear ? 0 : 1, D, 1)) == HIR_OK);
        hir_parallelize(w, linear ? 0 : 1, HIR_DIDX);
        if (bias) hir_parallelize(bias, 0, HIR_DIDX);
        if (split_out) hir_parallelize(o, nb + 1, HIR_DIDX);
      } else { /* a's K: it reaches w's K and o's rK (or made on o's rK, as nvFuser's input-grad tests split it) */
        CHECK((via_out ? hir_split(o, nb + 2, D, 1) : hir_split(a, nb + 1, D, 1)) == HIR_OK);
        hir_parallelize(a, nb + 1, HIR_DIDX);
        hir_parallelize(w, linear ? 1 : 0, HIR_DIDX);
        if (split_out) CHECK(hir_split(o, nb, D, 1) == HIR_OK && hir_parallelize(o, nb, HIR_DIDX) == HIR_OK);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      if (hir_fusion_error(f)[0]) fprintf(stderr, "  %s\n", hir_fusion_error(f));
      { /* the collective nvFuser makes, and no other */
        hir_lower_desc ld;
        hir_program *p = NULL;
        char text[16384] = "";
        memset(&ld, 0, sizeof ld);
        CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_program_snprint(p, text, sizeof text) > 0);
        const char *first = collective_in(text), *second = first ? collective_in(first + 1) : NULL;
        if (want_comm ? !first || strncmp(first, want_comm, strlen(want_comm)) || second : first != NULL) {
          CHECK(!"the collective nvFuser makes");
          fprintf(stderr, "  D %d mode %d: want %s:\n%s\n", D, mode, want_comm ? want_comm : "none", text);
        }
        if (hir_program_error(p)[0]) fprintf(stderr, "  %s\n", hir_program_error(p));
        hir_program_free(p);
      }
      sa[0] = Bt, sa[nb] = M, sa[nb + 1] = K;
      sw[0] = linear ? N : K, sw[1] = linear ? K : N;
      so[0] = Bt, so[nb] = M, so[nb + 1] = N;
      case_lowered(&c, D, f, has_bias ? 3 : 2, 1);
      c.in[0] = trand(HIR_F32, 2 + nb, sa);
      c.in[1] = trand(HIR_F32, 2, sw);
      if (bias) c.in[2] = trand(HIR_F32, 1, sbias);
      c.out[0] = tn(HIR_F32, 2 + nb, so);
      for (b = 0; b < Bt; b++)
        for (m = 0; m < M; m++)
          for (n = 0; n < N; n++) {
            double t = bias ? tget(&c.in[2], n) : 0;
            for (k = 0; k < K; k++) t += tget(&c.in[0], (b * M + m) * K + k) * tget(&c.in[1], linear ? n * K + k : k * N + n);
            tset(&c.out[0], (b * M + m) * N + n, t);
          }
      snprintf(name, sizeof name, "%s_%s_split_%s%s%s", linear ? "linear" : "matmul", on_k ? "K" : "N",
               split_out ? "out_split" : "out_whole", has_bias ? "_bias" : "", batch ? "_batch" : "");
      if (D > 1) CHECK(automatic_lowers(f, &c, has_bias ? 3 : 2, name)); /* each rank's part of a split axis */
      c.prealloc = (wi + mode) & 1;
      RUN_CASE(&c, name);
      hir_fusion_free(f);
    }
}

/* The other ways a split meets a matmul: K split down a 2-D mesh's columns
   (DIDy) and N along its rows (DIDx) at once (2-D tensor parallelism: a
   sum per column, the output split on N); an inner split of K or N (the
   factor the inner part's extent) with DIDx on either part; N's outer part
   on streams (the weight's columns a chunk at a time). */
TEST(test_split_matmul_more, "split/matmul_more", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 7; mode++) {
      int D = worlds[wi], R = D % 2 == 0 && D > 2 ? 2 : 1, C = D / R, inner_on_outer = mode == 2 || mode == 4;
      int64_t M = 3, K = 4 * D, N = 2 * D, sa[2] = {M, K}, sw[2] = {K, N}, so[2] = {M, N}, m, n, k;
      spmd_case c;
      char name[64];
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, HIR_F32, 2), *w = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, w);
      hir_output(f, o);
      if (mode == 0 || mode == 1) { /* K by R (DIDy), N by C (DIDx); mode 1: the output whole on N too */
        int devs[8];
        for (k = 0; k < D; k++) devs[k] = (int)k;
        hir_set_mesh_2d(a, R, C, devs), hir_set_mesh_2d(w, R, C, devs), hir_set_mesh_2d(o, R, C, devs);
        CHECK(hir_split(a, 1, R, 1) == HIR_OK && hir_split(w, 2, C, 1) == HIR_OK); /* w: [Ko, Ki, N] -> [Ko, Ki, No, Ni] */
        hir_parallelize(a, 1, HIR_DIDY), hir_parallelize(w, 0, HIR_DIDY), hir_parallelize(w, 2, HIR_DIDX);
        if (mode == 0) hir_parallelize(o, 1, HIR_DIDX);
      } else if (mode <= 5) { /* inner splits of K (modes 2, 3) or N (4, 5), DIDx on the part of extent D: the outer one
                                  (the factor x / D, the rest D) or the inner one (the factor D) */
        hir_set_mesh(a, D, iota_mesh), hir_set_mesh(w, D, iota_mesh), hir_set_mesh(o, D, iota_mesh);
        if (mode <= 3) {
          CHECK(hir_split(a, 1, inner_on_outer ? K / D : D, 0) == HIR_OK);
          hir_parallelize(a, inner_on_outer ? 1 : 2, HIR_DIDX), hir_parallelize(w, inner_on_outer ? 0 : 1, HIR_DIDX);
        } else {
          CHECK(hir_split(w, 1, inner_on_outer ? N / D : D, 0) == HIR_OK);
          hir_parallelize(w, inner_on_outer ? 1 : 2, HIR_DIDX), hir_parallelize(o, inner_on_outer ? 1 : 2, HIR_DIDX);
        }
      } else { /* N's outer part on streams, no device split */
        hir_set_mesh(a, D, iota_mesh), hir_set_mesh(w, D, iota_mesh), hir_set_mesh(o, D, iota_mesh);
        CHECK(hir_split(o, 1, 2, 1) == HIR_OK && hir_parallelize(o, 1, HIR_STREAM) == HIR_OK);
      }
      if (hir_fusion_error(f)[0]) fprintf(stderr, "  mode %d: %s\n", mode, hir_fusion_error(f));
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 2, 1);
      c.in[0] = trand(HIR_F32, 2, sa);
      c.in[1] = trand(HIR_F32, 2, sw);
      c.out[0] = tn(HIR_F32, 2, so);
      for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
          double t = 0;
          for (k = 0; k < K; k++) t += tget(&c.in[0], m * K + k) * tget(&c.in[1], k * N + n);
          tset(&c.out[0], m * N + n, t);
        }
      c.prealloc = (wi + mode) & 1;
      snprintf(name, sizeof name, "matmul_more_mode_%d", mode);
      RUN_CASE(&c, name);
      hir_fusion_free(f);
    }
}

/* nvFuser's ColumnAndSequenceParallelLinear forward on logical shapes: x
   [S, K] sharded on S, the weight [N, K] on N, the output's S parts on
   streams: x gathered chunk by chunk (a P2P allgather pipeline), each
   chunk's product local, nothing else moved. And a batched B beside an A
   split on M (the split becomes a batch part, B a broadcast one). */
TEST(test_split_column_sequence, "split/column_sequence_parallel", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 2; mode++) {
      int D = worlds[wi];
      int64_t S = 2 * D, K = 3, N = 2 * D, Bt = 2, sx[3] = {S, K}, sw[3] = {N, K}, so[3] = {S, N}, b, m, n, k;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, 2), *w = hir_input(f, HIR_F32, mode ? 3 : 2), *o = mode ? hir_matmul(f, x, w) : hir_linear(f, x, w, NULL);
      hir_output(f, o);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(w, D, iota_mesh);
      hir_set_mesh(o, D, iota_mesh);
      if (!mode) {
        CHECK(hir_split(x, 0, D, 1) == HIR_OK && hir_split(w, 0, D, 1) == HIR_OK); /* o: [S / D.., D.., N] */
        hir_parallelize(x, 0, HIR_DIDX);
        hir_parallelize(w, 0, HIR_DIDX);
        hir_parallelize(o, 0, HIR_STREAM);
        hir_parallelize(o, 2, HIR_DIDX);
      } else { /* x [S, K] x w [Bt, K, N]: o [Bt, S, N] split on S, sharded */
        sw[0] = Bt, sw[1] = K, sw[2] = N / D, so[0] = Bt, so[1] = S, so[2] = N / D;
        CHECK(hir_split(o, 1, D, 1) == HIR_OK);
        hir_parallelize(x, 0, HIR_DIDX);
        hir_parallelize(o, 1, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      if (hir_fusion_error(f)[0]) fprintf(stderr, "  %s\n", hir_fusion_error(f));
      if (D > 1) { /* the collectives: none but the pipeline's sends and receives, or none at all */
        hir_lower_desc ld;
        hir_program *p = NULL;
        char text[32768] = "";
        memset(&ld, 0, sizeof ld);
        CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_program_snprint(p, text, sizeof text) > 0);
        CHECK(!collective_in(text) && (strstr(text, "P2PCommunication") != NULL) == !mode);
        hir_program_free(p);
      }
      case_lowered(&c, D, f, 2, 1);
      c.in[0] = trand(HIR_F32, 2, sx);
      c.in[1] = trand(HIR_F32, mode ? 3 : 2, sw);
      c.out[0] = tn(HIR_F32, mode ? 3 : 2, so);
      for (b = 0; b < (mode ? Bt : 1); b++)
        for (m = 0; m < S; m++)
          for (n = 0; n < so[mode ? 2 : 1]; n++) {
            double t = 0;
            for (k = 0; k < K; k++)
              t += tget(&c.in[0], m * K + k) * tget(&c.in[1], mode ? (b * K + k) * sw[2] + n : n * K + k);
            tset(&c.out[0], (b * S + m) * so[mode ? 2 : 1] + n, t);
          }
      c.prealloc = wi & 1;
      RUN_CASE(&c, mode ? "matmul_m_split_b_batched" : "column_sequence_parallel_linear");
      hir_fusion_free(f);
    }
}

/* nvFuser's overlap tests (test_overlap.cpp), forward, input-grad and
   weight-grad, written on logical shapes with one split per axis (hostir's
   split reaches every tensor the axis maps onto): t the sequence, H the
   hidden size, F = 4H; DIDx and Stream where nvFuser puts them. */
TEST(test_split_overlap_forms, "split/overlap_forms", TEST_CPU | TEST_GPU_WORLDS) {
  static const char *const names[7] = {"ColumnAndSequenceParallelLinear_InputGrad", "RowAndSequenceParallelLinear_Forward",
                                       "ColumnAndSequenceParallelLinear_WeightGrad", "RowAndSequenceParallelLinear_WeightGrad",
                                       "RowAndSequenceParallelLinear_InputGrad", "RowParallelLinear_Forward",
                                       "ColumnAndSequenceParallelLinear_Forward"};
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 7; form++) {
      int D = worlds[wi], perm[2] = {1, 0};
      int64_t t = 2 * D, H = 3, F = 2 * D, sx[2], sy[2], so[2], i, j, k, rows, cols, inner;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x, *y, *o;
      /* every form is o = X @ Y with X, Y the inputs or a transpose of the first: out[i][j] = sum_k X[i][k] Y[k][j] */
      int transposed = form == 2 || form == 3, linear = form == 1 || form == 5 || form == 6;
      x = hir_input(f, HIR_F32, 2);
      y = hir_input(f, HIR_F32, 2);
      o = linear ? hir_linear(f, x, y, NULL) : hir_matmul(f, transposed ? hir_permute(f, x, perm) : x, y);
      hir_output(f, o);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_set_mesh(o, D, iota_mesh);
      switch (form) {
      case 0: /* in [t, H] = out [t, F] x w [F, H]: F (K) sharded, in's t sharded (a reduce-scatter), out's t on streams */
      case 1: /* out [t, H] = linear(in [t, F], w [H, F]): the same with the weight [N, K] */
        sx[0] = t, sx[1] = F, sy[0] = form ? H : F, sy[1] = form ? F : H, so[0] = t, so[1] = H;
        CHECK(hir_split(x, 1, D, 1) == HIR_OK && hir_split(o, 0, D, 1) == HIR_OK);
        hir_parallelize(x, 2, HIR_DIDX);
        hir_parallelize(y, form ? 1 : 0, HIR_DIDX);
        hir_parallelize(o, 0, HIR_DIDX);
        hir_parallelize(x, 0, HIR_STREAM);
        break;
      case 2: /* w [F, H] = out [t, F]^T x in [t, H]: t (K) split, in's t sharded, out's F sharded, w's F sharded, t on streams */
      case 3: /* w [H, F] = out [t, H]^T x in [t, F]: the same, F the N axis */
        sx[0] = t, sx[1] = form == 2 ? F : H, sy[0] = t, sy[1] = form == 2 ? H : F, so[0] = sx[1], so[1] = sy[1];
        CHECK(hir_split(y, 0, D, 1) == HIR_OK && hir_split(form == 2 ? x : y, 2, D, 1) == HIR_OK); /* t, then F */
        hir_parallelize(form == 2 ? y : x, 0, HIR_DIDX);
        hir_parallelize(form == 2 ? x : y, 2, HIR_DIDX);
        hir_parallelize(o, form == 2 ? 0 : 1, HIR_DIDX);
        hir_parallelize(o, 3, HIR_STREAM); /* the reduction's outer part: a sum over chunks */
        break;
      case 4: /* in [t, F] = out [t, H] x w [H, F]: F (N) sharded, out's t sharded, in's t on streams (an all-gather) */
      case 6: /* out [t, F] = linear(in [t, H], w [F, H]) */
        sx[0] = t, sx[1] = H, sy[0] = form == 4 ? H : F, sy[1] = form == 4 ? F : H, so[0] = t, so[1] = F;
        CHECK(hir_split(y, form == 4 ? 1 : 0, D, 1) == HIR_OK && hir_split(x, 0, D, 1) == HIR_OK);
        hir_parallelize(y, form == 4 ? 1 : 0, HIR_DIDX);
        hir_parallelize(x, 0, HIR_DIDX);
        hir_parallelize(o, 2, HIR_DIDX);
        hir_parallelize(o, 0, HIR_STREAM);
        break;
      default: /* out [t, H] = linear(in [t, F], w [H, F]): F sharded, out whole (an allreduce), out's t on streams */
        sx[0] = t, sx[1] = F, sy[0] = H, sy[1] = F, so[0] = t, so[1] = H;
        CHECK(hir_split(x, 1, D, 1) == HIR_OK && hir_split(o, 0, D, 1) == HIR_OK);
        hir_parallelize(x, 2, HIR_DIDX);
        hir_parallelize(y, 1, HIR_DIDX);
        hir_parallelize(o, 0, HIR_STREAM);
        break;
      }
      if (hir_fusion_error(f)[0]) fprintf(stderr, "  %s: %s\n", names[form], hir_fusion_error(f));
      CHECK(hir_fusion_error(f)[0] == 0);
      if (D > 1) { /* a pipeline: the P2P sends and receives of a ring, or (the row-parallel forward) an Allreduce a chunk */
        hir_lower_desc ld;
        hir_program *p = NULL;
        static char text[65536];
        const char *coll;
        memset(&ld, 0, sizeof ld);
        CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_program_snprint(p, text, sizeof text) > 0);
        coll = collective_in(text);
        CHECK(strstr(text, "FOR StreamIdx") != NULL);
        if (form == 5) CHECK(coll && !strncmp(coll, "Allreduce", 9) && !collective_in(coll) && !strstr(text, "P2PCommunication"));
        else CHECK(!coll && strstr(text, "P2PCommunication") != NULL);
        hir_program_free(p);
      }
      case_lowered(&c, D, f, 2, 1);
      c.in[0] = trand(HIR_F32, 2, sx);
      c.in[1] = trand(HIR_F32, 2, sy);
      if (D > 1) CHECK(automatic_lowers(f, &c, 2, names[form]));
      c.out[0] = tn(HIR_F32, 2, so);
      rows = so[0], cols = so[1], inner = transposed ? sx[0] : sx[1];
      for (i = 0; i < rows; i++)
        for (j = 0; j < cols; j++) {
          double v = 0;
          for (k = 0; k < inner; k++)
            v += tget(&c.in[0], transposed ? k * sx[1] + i : i * sx[1] + k) * tget(&c.in[1], linear ? j * sy[1] + k : k * sy[1] + j);
          tset(&c.out[0], i * cols + j, v);
        }
      c.prealloc = wi & 1;
      RUN_CASE(&c, names[form]);
      hir_fusion_free(f);
    }
}

/* sum over a split sharded axis (its DIDx part and its local part): a local
   sum, then an Allreduce. MultiDeviceReductionTest with a split axis. */
TEST(test_split_sum, "split/sum", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], axis = 0;
    int64_t sz[2] = {2 * D, 7}, so[1] = {7}, i, j;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F64, 2), *y = hir_sum(f, x, 1, &axis);
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_split(x, 0, D, 1);
    hir_parallelize(x, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 1, 1);
    c.in[0] = trand(HIR_F64, 2, sz);
    c.out[0] = tn(HIR_F64, 1, so);
    for (j = 0; j < 7; j++) {
      double t = 0;
      for (i = 0; i < 2 * D; i++) t += tget(&c.in[0], i * 7 + j);
      tset(&c.out[0], j, t);
    }
    c.tol = 1e-12;
    RUN_CASE(&c, "split_sum_allreduce");
    hir_fusion_free(f);
  }
}

/* y = sum of x [K, M, N] (on device 0 alone) over K, y sharded over all
   devices: by a split of N (DIDx part), or on M with x's K split in two (a
   local sum, then a move). The output loses its reduction axis when lowered,
   and its split parts must keep their logical axes (they once did not: a
   wrong shape). MultiDeviceReductionTest's resharding sums with split axes. */
TEST(test_split_sum_resharded, "split/sum_resharded", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 2; mode++) {
      int D = worlds[wi], axis = 0, root = 0;
      int64_t K = 4, M = mode ? D : 3, N = mode ? 5 : 2 * D, sz[3] = {K, M, N}, so[2] = {M, N}, k, m, n;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F64, 3), *y = hir_sum(f, x, 1, &axis);
      hir_output(f, y);
      hir_set_mesh(x, 1, &root);
      hir_set_mesh(y, D, iota_mesh);
      if (mode) {
        hir_split(x, 0, 2, 1); /* y's K too: y is [r2, rK/2, M, N] */
        hir_parallelize(y, 2, HIR_DIDX);
      } else {
        hir_split(y, 2, D, 1);
        hir_parallelize(y, 2, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(HIR_F64, 3, sz);
      c.out[0] = tn(HIR_F64, 2, so);
      for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
          double t = 0;
          for (k = 0; k < K; k++) t += tget(&c.in[0], (k * M + m) * N + n);
          tset(&c.out[0], m * N + n, t);
        }
      c.tol = 1e-12;
      c.prealloc = wi & 1;
      RUN_CASE(&c, mode ? "split_sum_local_then_scatter" : "split_sum_scatter_split_axis");
      hir_fusion_free(f);
    }
}

/* y = x / sum(x, -1) of x [b, h, s, s] whose h is split by D and sharded,
   the split and the sharding carried to the sum, its broadcast and y (set
   on x alone), the DIDx part reordered to the front of every tensor.
   MultiDeviceTest.DivideBySum. */
TEST(test_split_divide_by_sum, "split/divide_by_sum", TEST_CPU | TEST_GPU_WORLDS) {
  static const int last[1] = {3}, bcast[4] = {0, 0, 0, 1}, did[1] = {1}, front[1] = {0};
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t b = 2, h = 3 * D, S = 5, sz[4] = {b, h, S, S}, i, j;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F64, 4), *sum = hir_sum(f, x, 1, last), *bc = hir_broadcast(f, sum, 4, bcast);
    hir_tv *y = hir_div(f, x, bc), *all[4];
    hir_tensor in, want;
    int k;
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_split(x, 1, D, 1); /* x [b, D, h / D, s, s] */
    hir_parallelize(x, 1, HIR_DIDX);
    all[0] = x, all[1] = sum, all[2] = bc, all[3] = y;
    for (k = 0; k < 4; k++) hir_reorder(all[k], 1, did, front); /* [D, b, h / D, s, s] */
    CHECK(hir_fusion_error(f)[0] == 0 && hir_tv_logical_ndims(y) == 4 && hir_tv_ptype(x, 0) == HIR_DIDX);
    { /* y is sharded as x: each device computes and returns its part */
      hir_program *p = NULL;
      hir_lower_desc d;
      memset(&d, 0, sizeof d);
      CHECK(hir_lower(f, &d, &p) == HIR_OK && hir_tv_ptype(hir_program_output(p, 0), 0) == HIR_DIDX);
      hir_program_free(p);
    }
    in = trand(HIR_F64, 4, sz);
    want = tn(HIR_F64, 4, sz);
    for (i = 0; i < b * h * S; i++) {
      double t = 0;
      for (j = 0; j < S; j++) t += tget(&in, i * S + j);
      for (j = 0; j < S; j++) tset(&want, i * S + j, tget(&in, i * S + j) / t);
    }
    RUN_ONE(f, D, in, want, wi & 1, "split_divide_by_sum");
  }
}

/* hir_reorder: the loop order nvFuser's schedules set. x [b, s, h] with h
   split by D, the DIDx part moved to the front of x and y = relu(x)
   (ShardingTest.ReorderParallelizedToFront, BiasAddRelu's reorder); and the other
   way round, z [a, c] reordered to [c, a] and then split at loop position 0,
   which is c: the split, the sharding and the printed loop domain follow the
   loop order, the numbers each device's part of relu(z). */
TEST(test_split_reorder, "split/reorder", TEST_CPU | TEST_GPU_WORLDS) {
  static const int inner[1] = {-2}, front[1] = {0}, second[1] = {1};
  int wi, which;
  for (wi = 0; wi < 5; wi++)
    for (which = 0; which < 2; which++) {
      int D = worlds[wi];
      int64_t sz3[3] = {2, 3, 4 * D}, sz2[2] = {3, 2 * D}, i, n = which ? 6 * D : 24 * D;
      char text[2048], want_x[160];
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, which ? 2 : 3), *y = hir_relu(f, x);
      hir_tensor in, want;
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      if (!which) { /* split, parallelize, reorder */
        hir_split(x, -1, D, 1);       /* x [b, s, D, h / D] */
        hir_parallelize(x, -2, HIR_DIDX);
        hir_parallelize(y, -2, HIR_DIDX);
        hir_reorder(x, 1, inner, front); /* x [D, b, s, h / D] */
        hir_reorder(y, 1, inner, front);
      } else { /* reorder, split, parallelize */
        hir_reorder(x, 1, second, front); /* x [c, a] */
        hir_split(x, 0, D, 1);             /* x [D, c / D, a]: c is split */
        hir_parallelize(x, 0, HIR_DIDX);
        hir_parallelize(y, 1, HIR_DIDX);   /* y [a, D, c / D]: not reordered */
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      CHECK(hir_tv_ptype(x, 0) == HIR_DIDX && hir_tv_logical_axis(x, 0) == (which ? 1 : 2));
      CHECK(hir_tv_ptype(y, which ? 1 : 0) == HIR_DIDX && hir_tv_logical_ndims(y) == (which ? 2 : 3));
      hir_fusion_snprint(f, text, sizeof text);
      if (!which)
        snprintf(want_x, sizeof want_x, "T0_g_float[ideviceIdx.x6{%d}, iS0{i0}, iS1{i2}, iS7{( i3 / %d )}]", D, D);
      else
        snprintf(want_x, sizeof want_x, "T0_g_float[ideviceIdx.x4{%d}, iS5{( i2 / %d )}, iS0{i0}]", D, D);
      if (!strstr(text, want_x)) printf("  want %s in\n%s\n", want_x, text);
      CHECK(strstr(text, want_x) != NULL);
      in = trand(HIR_F32, which ? 2 : 3, which ? sz2 : sz3);
      want = tn(HIR_F32, which ? 2 : 3, which ? sz2 : sz3);
      for (i = 0; i < n; i++) tset(&want, i, tget(&in, i) > 0 ? tget(&in, i) : 0);
      RUN_ONE(f, D, in, want, wi & 1, which ? "reorder_then_split" : "reorder_did_to_front");
    }
}

/* hir_set_allocation_loop: y = relu(x) of x [a, c], c split by D and
   sharded; y's loop order [D, c / D, a], its allocation that order, so the
   y the evaluator hands back is column-major ([a, c / D] with strides 1, a),
   a preallocated one is written in its own strides. MultiDeviceTest's
   Transpose and LoopSplitWithReorder set an allocation domain so. Then what
   it refuses: a split axis's parts apart, or the inner first. */
TEST(test_split_allocation, "split/allocation_loop", TEST_CPU | TEST_GPU_WORLDS) {
  static const int first[1] = {0}, last[1] = {2}, middle[1] = {1};
  int wi, k;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t a = 3, c = 2 * D, sz[2] = {a, c}, i;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_relu(f, x);
    hir_tensor in, want;
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_split(x, 1, D, 1); /* [a, D, c / D] */
    hir_parallelize(x, 1, HIR_DIDX);
    hir_parallelize(y, 1, HIR_DIDX);
    hir_reorder(y, 1, first, last); /* y [D, c / D, a] */
    CHECK(hir_set_allocation_loop(y) == HIR_OK && hir_fusion_error(f)[0] == 0);
    in = trand(HIR_F32, 2, sz);
    want = tn(HIR_F32, 2, sz);
    for (i = 0; i < a * c; i++) tset(&want, i, tget(&in, i) > 0 ? tget(&in, i) : 0);
    if (D == 2) { /* device 1's y, handed back: column-major, its columns c / D .. c */
      hir_local_world *w = hir_local_world_create(1);
      hir_fusion *g = hir_fusion_create();
      hir_tv *gx = hir_input(g, HIR_F32, 2), *gy = hir_relu(g, gx);
      hir_program *p = NULL;
      hir_evaluator *ev = NULL;
      hir_lower_desc ld;
      hir_eval_desc ed;
      hir_tensor out;
      int64_t one[2] = {a, 2};
      hir_tensor mine = tn(HIR_F32, 2, one);
      hir_output(g, gy);
      hir_reorder(gy, 1, first, middle); /* one device: y [c, a], laid out so */
      hir_set_allocation_loop(gy);
      for (i = 0; i < a * 2; i++) tset(&mine, i, tget(&in, (i / 2) * c + 2 + i % 2));
      memset(&ld, 0, sizeof ld);
      memset(&ed, 0, sizeof ed);
      memset(&out, 0, sizeof out);
      ed.comm = hir_local_comm(w, 0);
      CHECK(hir_lower(g, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
      for (k = 0; k < 2; k++) { /* the second run given the first's buffer back: the same layout */
        CHECK(hir_run(ev, &mine, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
        CHECK(out.ndims == 2 && out.sizes[0] == a && out.sizes[1] == 2 && out.strides[0] == 1 && out.strides[1] == a);
        for (i = 0; i < a * 2 && out.data; i++)
          CHECK(((float *)out.data)[(i / 2) + (i % 2) * a] == (float)(tget(&mine, i) > 0 ? tget(&mine, i) : 0));
      }
      hir_evaluator_free(ev);
      hir_program_free(p);
      hir_fusion_free(g);
      hir_local_world_free(w);
      tfree(&mine);
    }
    RUN_ONE(f, D, in, want, wi & 1, "allocation_loop");
  }
  for (k = 0; k < 2; k++) { /* refused: c's parts apart, or its inner part first */
    static const int two[1] = {2};
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2);
    hir_output(f, hir_neg(f, x));
    hir_split(x, 1, 4, 1); /* [a, 4, c / 4] */
    hir_reorder(x, 1, k ? two : first, k ? middle : last); /* [4, c / 4, a]: fine; [a, c / 4, 4] */
    if (!k) CHECK(hir_set_allocation_loop(x) == HIR_OK && x->nalloc == 2);
    hir_reorder(x, 1, k ? first : two, k ? last : middle); /* [4, a, c / 4]; [c / 4, 4, a] */
    CHECK(hir_set_allocation_loop(x) == HIR_ERR_UNSUPPORTED);
    CHECK(strstr(hir_fusion_error(f), k ? "puts the inner part first among logical axis 1's parts"
                                        : "puts another axis between logical axis 1's parts") != NULL);
    CHECK(strstr(hir_fusion_error(f), "no strides give that layout") != NULL);
    hir_fusion_free(f);
  }
}

/* Tensors laid out by hir_set_allocation_loop run in that layout.
   LowerCollectiveTest.Allgather_CompliantAllocation: x [5, 3D] and y =
   set(x) both laid out [3D, 5] (column-major), x's 3D split by D with DIDx
   on the outer part: the gathered axis is outermost in both layouts, so
   the program is the Allgather alone, nothing permuted before or after,
   and y comes back column-major in the program's own buffer. Then
   relu of a column-major x into a column-major y: the relu alone. Both
   against the reference, inputs passed in either layout (a layout other
   than the declared one is copied in), outputs handed back or preallocated
   row-major (written through a copy). And relu of a row-major x into a
   column-major y: the relu writes y's layout itself. */
TEST(test_split_allocation_compliant, "split/allocation_compliant", TEST_CPU | TEST_GPU_WORLDS) {
  static const int first[1] = {0}, second[1] = {1};
  int wi, relu;
  for (wi = 0; wi < 5; wi++)
    for (relu = 0; relu < 2; relu++) {
      int D = worlds[wi];
      int64_t sz[2] = {5, 3 * D}, i;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, 2), *y = relu ? hir_relu(f, x) : hir_set(f, x);
      hir_tensor in = trand(HIR_F32, 2, sz), want = tn(HIR_F32, 2, sz);
      char *text;
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_reorder(x, 1, second, first); /* x [3D, 5], laid out so */
      CHECK(hir_set_allocation_loop(x) == HIR_OK);
      hir_reorder(y, 1, second, first);
      CHECK(hir_set_allocation_loop(y) == HIR_OK);
      if (!relu) {
        hir_split(x, 0, D, 1); /* x [D, 3, 5] */
        hir_parallelize(x, 0, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      text = lower_text(f, NULL, 0);
      CHECK(strstr(text, "Permute") == NULL && count_of(text, relu ? "relu(" : D > 1 ? "type=Allgather" : "= Set(") == 1);
      CHECK(count_of(text, "(type=") + count_of(text, "= Set(") + count_of(text, "relu(") == 1); /* one op, one pass */
      free(text);
      for (i = 0; i < 5 * 3 * D; i++) tset(&want, i, relu && tget(&in, i) < 0 ? 0 : tget(&in, i));
      RUN_ONE(f, D, in, want, wi & 1, relu ? "allocation_compliant (relu)" : "allocation_compliant");
    }
  { /* relu of a row-major x into a column-major y: the relu writes y's layout, the permute after it copies nothing;
       the evaluator holds y alone when it hands y back, nothing when the caller passes y in its layout */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_relu(f, x);
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_lower_desc ld;
    hir_eval_desc ed;
    int64_t sz[2] = {3, 4}, i;
    hir_tensor in = trand(HIR_F32, 2, sz), out;
    float mine[12];
    int given;
    hir_output(f, y);
    hir_reorder(y, 1, second, first);
    CHECK(hir_set_allocation_loop(y) == HIR_OK);
    memset(&ld, 0, sizeof ld);
    memset(&ed, 0, sizeof ed);
    CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    for (given = 1; ev && given >= 0; given--) { /* given first: a block handed back stays the evaluator's */
      memset(&out, 0, sizeof out);
      if (given) {
        for (i = 0; i < 12; i++) mine[i] = NAN;
        out.data = mine, out.dtype = HIR_F32, out.ndims = 2, out.sizes[0] = 3, out.sizes[1] = 4, out.strides[0] = 1, out.strides[1] = 3;
      }
      CHECK(hir_run(ev, &in, 1, &out, 1) == HIR_OK && out.strides[0] == 1 && out.strides[1] == 3);
      for (i = 0; i < 12 && out.data; i++)
        CHECK(((float *)out.data)[i / 4 + (i % 4) * 3] == (float)(tget(&in, i) > 0 ? tget(&in, i) : 0));
      CHECK(hir_evaluator_memory(ev) == (given ? 0 : 12 * sizeof(float)));
      if (hir_evaluator_memory(ev) != (given ? 0 : 12 * sizeof(float)))
        fprintf(stderr, "  relu into a column-major y (%s): the evaluator holds %zu bytes\n", given ? "given" : "handed back",
                hir_evaluator_memory(ev));
    }
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
    tfree(&in);
  }
  { /* a refusal names the tensors the caller made: the lowering's copies of x (laid out, then resharded) by x's name */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_add(f, x, x);
    hir_program *p = NULL;
    hir_lower_desc ld;
    const char *error, *at;
    hir_output(f, y);
    hir_set_mesh(x, 3, iota_mesh);
    hir_set_mesh(y, 3, iota_mesh);
    hir_reorder(x, 1, second, first);
    hir_set_allocation_loop(x);
    hir_split(y, 0, 3, 1);
    hir_parallelize(y, 0, HIR_DIDX);
    hir_split(y, 2, 2, 1); /* chunks of an inner axis of the resharded x: refused */
    hir_parallelize(y, 2, HIR_STREAM);
    memset(&ld, 0, sizeof ld);
    CHECK(hir_lower(f, &ld, &p) == HIR_ERR_UNSUPPORTED);
    error = p ? hir_program_error(p) : "";
    CHECK(strstr(error, "would move chunks of T") != NULL && strstr(error, "[the lowering's, from T0]") != NULL);
    for (at = strchr(error, 'T'); at; at = strchr(at + 1, 'T')) /* T0, T1, or a tensor of the lowering's said so */
      if (at[1] >= '0' && at[1] <= '9' && atoi(at + 1) > 1) CHECK(strncmp(strchr(at, ' '), " [the lowering's, from T", 24) == 0);
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* A split through a permute: x [M, K] split by D on M and sharded, y =
   transpose(x) [K, M] (the split reaches y's M), y's M part sharded and
   reordered to the front, laid out in that order (MultiDeviceTest.Transpose:
   each device transposes its rows); or y left whole (gathered after the
   local transpose). Then with a third axis in the middle: x [M, B, K]
   permuted to [K, M, B], split by 2 on M (not sharded, two parts each). */
TEST(test_split_permute, "split/through_permute", TEST_CPU | TEST_GPU_WORLDS) {
  static const int did[1] = {1}, front[1] = {0}, perm3[3] = {2, 0, 1};
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 3; mode++) {
      int D = worlds[wi], three = mode == 2;
      int64_t M = 2 * D, B = 3, K = 5, sx[3] = {M, three ? B : K, K}, sy[3] = {K, M, B}, i, j, b;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, three ? 3 : 2), *y = three ? hir_permute(f, x, perm3) : hir_transpose(f, x, 0, 1);
      hir_tensor in, want;
      char text[2048];
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_split(x, 0, three ? 2 : D, 1); /* x [D, M / D, ...]; y [K, D, M / D, ...] */
      if (!three) hir_parallelize(x, 0, HIR_DIDX);
      if (mode == 0) {
        hir_parallelize(y, 1, HIR_DIDX);
        hir_reorder(y, 1, did, front);
        hir_set_allocation_loop(y);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      if (hir_fusion_error(f)[0]) printf("  %s\n", hir_fusion_error(f));
      hir_fusion_snprint(f, text, sizeof text);
      CHECK(strstr(text, "Set.Permute") != NULL);
      in = trand(HIR_F32, three ? 3 : 2, sx);
      want = tn(HIR_F32, three ? 3 : 2, sy);
      if (!three) {
        for (i = 0; i < M; i++)
          for (j = 0; j < K; j++) tset(&want, j * M + i, tget(&in, i * K + j));
      } else {
        for (i = 0; i < M; i++)
          for (b = 0; b < B; b++)
            for (j = 0; j < K; j++) tset(&want, (j * M + i) * B + b, tget(&in, (i * B + b) * K + j));
      }
      RUN_ONE(f, D, in, want, wi & 1, mode == 0 ? "transpose_sharded" : mode == 1 ? "transpose_gathered" : "permute_split_by_2");
    }
}

/* Splits through a reshape, where nvFuser keeps them: the split axis is
   the reshape's first changed axis and the split an outer one, so its
   parts are whole blocks on both sides. x [M, H * E] split by D on axis 1
   (DIDx) viewed as [M, H, E] (attention's heads: each device its H / D
   heads), and back: x [M, H, E] split on H, merged into [M, H * E]; the
   split given on the reshape's output instead (x then whole, each device
   taking its part). Then relu. Outputs' meshes given (DIDx on their split
   part) or left to propagation. ViewWithSplit, ViewWithMerge,
   LoopShardedSplitReshapeIds, LoopShardedMergeReshapeIds, ReshardingTest's
   SplitingView and MergingView; MultipleTransformReshape (a reshape that
   merges the split axis with two more and splits the last, on fixed
   sizes), its output sharded by propagation. */
TEST(test_split_reshape, "split/through_reshape", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 8; mode++) {
      int D = worlds[wi], merge = mode % 3 == 1, on_out = mode % 3 == 2, meshes = mode >= 3, stream = mode >= 6;
      int64_t M = 3, H = 24, E = 2, heads[3] = {0, 24, 2}, merged[2] = {0, -1}, sx[3] = {M, merge ? H : H * E, E},
              sy[3] = {M, merge ? H * E : H, E}, i;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, merge ? 3 : 2), *y = hir_reshape(f, x, merge ? 2 : 3, merge ? merged : heads),
             *z = hir_relu(f, y);
      hir_tensor in, want;
      hir_output(f, z);
      hir_set_mesh(x, D, iota_mesh);
      if (meshes) hir_set_mesh(y, D, iota_mesh), hir_set_mesh(z, D, iota_mesh);
      CHECK(hir_split(on_out ? y : x, 1, D, 1) == HIR_OK); /* y's or x's axis 1: [D, H / D] or [D, H * E / D] */
      if (stream) { /* the parts on streams instead: run, or refused alike on every rank, naming the reshape */
        hir_parallelize(y, 1, HIR_STREAM);
        in = trand(HIR_F32, merge ? 3 : 2, sx);
        want = tn(HIR_F32, merge ? 2 : 3, sy);
        for (i = 0; i < M * H * E; i++) tset(&want, i, tget(&in, i) > 0 ? tget(&in, i) : 0);
        run_or_refused(f, D, in, want, wi & 1, "reshape_split_on_streams", __FILE__, __LINE__); /* refused now: a view is
                                                                                                 not computed by chunks */
        continue;
      }
      if (!on_out) hir_parallelize(x, 1, HIR_DIDX);
      if (on_out || meshes) hir_parallelize(y, 1, HIR_DIDX);
      if (meshes) hir_parallelize(z, 1, HIR_DIDX);
      if (on_out && !meshes) hir_set_mesh(z, D, iota_mesh), hir_parallelize(z, 1, HIR_DIDX);
      CHECK(hir_tv_logical_ndims(z) == (merge ? 2 : 3) && hir_tv_ndims(z) == (merge ? 3 : 4));
      if (hir_fusion_error(f)[0]) fprintf(stderr, "  %s\n", hir_fusion_error(f));
      if (!on_out) { /* the reshape runs where the parts are: nothing moves */
        hir_lower_desc ld;
        hir_program *p = NULL;
        char text[4096] = "";
        memset(&ld, 0, sizeof ld);
        CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_program_snprint(p, text, sizeof text) > 0);
        CHECK(strstr(text, "view(") != NULL && strstr(text, "Communication") == NULL);
        hir_program_free(p);
      }
      in = trand(HIR_F32, merge ? 3 : 2, sx);
      want = tn(HIR_F32, merge ? 2 : 3, sy);
      for (i = 0; i < M * H * E; i++) tset(&want, i, tget(&in, i) > 0 ? tget(&in, i) : 0); /* row-major order */
      RUN_ONE(f, D, in, want, wi & 1, merge ? "reshape_merging_split_heads" : on_out ? "reshape_split_given_on_output"
                                                                             : "reshape_splitting_split_axis");
    }
  for (wi = 0; wi < 5; wi++) { /* MultipleTransformReshape: [D * b, s, h * e] -> [D * b * s * h, e], axis 0 split by D */
    int D = worlds[wi];
    int64_t b = 2, sq = 3, h = 8, e = 4, sx[3] = {D * b, sq, h * e}, ask[2] = {D * b * sq * h, e}, i;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input_sized(f, HIR_F32, 3, sx), *y = hir_reshape(f, x, 2, ask);
    hir_tensor in = trand(HIR_F32, 3, sx), want = tn(HIR_F32, 2, ask);
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    CHECK(hir_split(x, 0, D, 1) == HIR_OK && hir_parallelize(x, 0, HIR_DIDX) == HIR_OK);
    { /* y sharded on its axis 0 by propagation, nothing moved (nvFuser's check: its sharded logical axis is 0) */
      hir_lower_desc ld;
      hir_program *p = NULL;
      char text[2048] = "";
      memset(&ld, 0, sizeof ld);
      CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_program_snprint(p, text, sizeof text) > 0);
      CHECK(hir_tv_ndims(hir_program_output(p, 0)) == 3 && hir_tv_ptype(hir_program_output(p, 0), 0) == HIR_DIDX);
      CHECK(strstr(text, "Communication") == NULL);
      hir_program_free(p);
    }
    for (i = 0; i < tnumel(&in); i++) tset(&want, i, tget(&in, i));
    RUN_ONE(f, D, in, want, wi & 1, "reshape_multiple_transform");
  }
}

/* Where a split cannot pass a reshape, the refusal names why: an axis after
   a changed one, and an inner split of a reshaped axis. */
TEST(test_split_reshape_errors, "split/reshape_errors", TEST_CPU) {
  int64_t swap[2] = {3, 8}, heads[3] = {0, 3, 4};
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_reshape(f, x, 2, swap));
  CHECK(hir_split(x, 1, 2, 1) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "maps onto a reshape that changes an axis before it (a split passes a reshape's first changed "
                                    "axis, or an axis it keeps) (ViewOp 0)") != NULL);
  hir_fusion_free(f);
  f = hir_fusion_create();
  x = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_reshape(f, x, 3, heads));
  CHECK(hir_split(x, 1, 2, 0) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "a reshape of that axis, which only an outer split (outer = 1) passes") != NULL);
  CHECK(hir_tv_ndims(x) == 2); /* a refused split changes nothing */
  hir_fusion_free(f);
}

/* What hir_reorder refuses, by name. */
TEST(test_split_reorder_errors, "split/reorder_errors", TEST_CPU) {
  static const int twice[2] = {0, 0}, to[2] = {1, 0}, far[1] = {3}, zero[1] = {0};
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_neg(f, x));
  CHECK(hir_reorder(x, 2, twice, to) == HIR_ERR_INVALID && strstr(hir_fusion_error(f), "hir_reorder: T0: axis 0 is named twice"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  x = hir_input(f, HIR_F32, 2);
  CHECK(hir_reorder(x, 1, far, zero) == HIR_ERR_INVALID &&
        strstr(hir_fusion_error(f), "hir_reorder: axis 3 is out of range for T0, which has 2 axes"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  x = hir_input(f, HIR_F32, 2);
  CHECK(hir_reorder(x, 3, to, to) == HIR_ERR_INVALID && strstr(hir_fusion_error(f), "give 1 to hir_tv_ndims(tv) pairs"));
  hir_fusion_free(f);
  f = hir_fusion_create(); /* a reordered tensor's axis numbers in the messages are loop positions */
  x = hir_input(f, HIR_F32, 2);
  hir_parallelize(x, 0, HIR_DIDX);
  CHECK(hir_reorder(x, 1, zero, to) == HIR_OK && hir_tv_ptype(x, 1) == HIR_DIDX && hir_tv_ptype(x, 0) == HIR_SERIAL);
  CHECK(hir_parallelize(x, 0, HIR_DIDX) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "already has a DIDx axis (axis 1)"));
  hir_fusion_free(f);
  { /* not on a program's tensors */
    hir_program *p = NULL;
    f = hir_fusion_create();
    x = hir_input(f, HIR_F32, 2);
    hir_output(f, hir_neg(f, x));
    CHECK(hir_lower(f, NULL, &p) == HIR_OK);
    CHECK(hir_reorder(hir_program_input(p, 0), 1, zero, to) == HIR_ERR_INVALID &&
          strstr(hir_program_error(p), "reorder a fusion's tensors, not a program's"));
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* What a split cannot do names the op; a run given a wrong logical shape says so. */
TEST(test_split_errors, "split/errors", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 1), *b = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, b);
  int mesh[2] = {0, 1};
  hir_output(f, o);
  CHECK(hir_split(b, 0, 2, 1) == HIR_ERR_UNSUPPORTED);
  CHECK(strstr(hir_fusion_error(f), "hir_split: T1 axis 0 maps onto the K or N axis of a matmul with a 1-D operand (MatmulOp 0)"));
  hir_fusion_free(f);
  f = hir_fusion_create(); /* a matmul of a tensor split already: its axes would be read by position */
  a = hir_input(f, HIR_F32, 2), b = hir_input(f, HIR_F32, 2);
  CHECK(hir_split(b, 1, 2, 1) == HIR_OK && hir_matmul(f, a, b) == NULL &&
        strstr(hir_fusion_error(f), "hir_matmul: T1 has split axes (hir_split); build the ops first, then split"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  hir_parallelize(a, 0, HIR_DIDX);
  CHECK(hir_split(a, 0, 2, 1) == HIR_ERR_INVALID && strstr(hir_fusion_error(f), "split first, then parallelize the parts"));
  hir_fusion_free(f);
  { /* a logical size the split does not divide, and a wrong rank */
    hir_local_world *w = hir_local_world_create(1);
    hir_lower_desc ld;
    hir_eval_desc ed;
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_tensor in[1], out[1];
    float data[10] = {0};
    f = hir_fusion_create();
    a = hir_input(f, HIR_F32, 1);
    hir_output(f, o = hir_neg(f, a));
    hir_set_mesh(a, 1, mesh);
    hir_split(a, 0, 4, 1);
    memset(&ld, 0, sizeof ld);
    memset(&ed, 0, sizeof ed);
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    ed.comm = hir_local_comm(w, 0);
    CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    in[0].data = data, in[0].dtype = HIR_F32, in[0].ndims = 1, in[0].sizes[0] = 10;
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_ERR_SHAPE &&
          strstr(hir_evaluator_error(ev), "input 0 (T0) axis 0 has size 10, which its split parts (4) do not divide"));
    in[0].ndims = 2, in[0].sizes[0] = 2, in[0].sizes[1] = 4;
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_ERR_SHAPE && strstr(hir_evaluator_error(ev), "has 2 axes; the program expects 1"));
    in[0].ndims = 1, in[0].sizes[0] = 8;
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_OK && out[0].ndims == 1 && out[0].sizes[0] == 8);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
    hir_local_world_free(w);
  }
}

/* The permutes and broadcasts a split matmul is lowered with copy nothing
   where they move or add only axes of size 1: of the caller's inputs they
   are views, and a product read only by one is written into its output.
   A sequence-parallel MLP on one device (each DIDx part of size 1): y =
   relu(x W1^T) W2^T, the caller's output preallocated; the evaluator then
   holds three buffers, relu's input and output and the second product
   (summed into y), where copies would hold two more (a product before its
   permute, W2 broadcast). */
TEST(test_split_in_place, "split/views_in_place", TEST_CPU) {
  enum { T = 4, H = 3, F = 5 };
  hir_local_world *w = hir_local_world_create(1);
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[3], out[1];
  float x[T * H], w1[F * H], w2[H * F], y[T * H];
  int mesh[1] = {0}, i, k, n;
  hir_fusion *f = hir_fusion_create();
  hir_tv *tx = hir_input(f, HIR_F32, 2), *tw1 = hir_input(f, HIR_F32, 2), *tw2 = hir_input(f, HIR_F32, 2);
  hir_tv *ty = hir_linear(f, hir_relu(f, hir_linear(f, tx, tw1, NULL)), tw2, NULL);
  hir_output(f, ty);
  hir_set_mesh(tx, 1, mesh), hir_set_mesh(tw1, 1, mesh), hir_set_mesh(tw2, 1, mesh), hir_set_mesh(ty, 1, mesh);
  hir_split(tx, 0, 1, 1), hir_split(tw1, 0, 1, 1);
  hir_parallelize(tx, 0, HIR_DIDX), hir_parallelize(tw1, 0, HIR_DIDX), hir_parallelize(tw2, 1, HIR_DIDX);
  hir_parallelize(ty, 0, HIR_DIDX);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ed.comm = hir_local_comm(w, 0);
  CHECK(hir_fusion_error(f)[0] == 0 && hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  for (i = 0; i < T * H; i++) x[i] = (float)((i * 7) % 5) - 2.0f;
  for (i = 0; i < F * H; i++) w1[i] = (float)((i * 3) % 7) - 3.0f, w2[i] = (float)((i * 5) % 4) - 1.5f;
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  in[0].data = x, in[0].sizes[0] = T, in[0].sizes[1] = H;
  in[1].data = w1, in[1].sizes[0] = F, in[1].sizes[1] = H;
  in[2].data = w2, in[2].sizes[0] = H, in[2].sizes[1] = F;
  out[0].data = y, out[0].sizes[0] = T, out[0].sizes[1] = H;
  for (i = 0; i < 3; i++) in[i].dtype = HIR_F32, in[i].ndims = 2;
  out[0].dtype = HIR_F32, out[0].ndims = 2;
  for (i = 0; i < T * H; i++) y[i] = NAN;
  CHECK(hir_run(ev, in, 3, out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
  for (i = 0; i < T; i++)
    for (n = 0; n < H; n++) {
      double want = 0;
      for (k = 0; k < F; k++) {
        double h = 0;
        int j;
        for (j = 0; j < H; j++) h += (double)x[i * H + j] * w1[k * H + j];
        want += (h > 0 ? h : 0) * w2[n * F + k];
      }
      CHECK(fabs(y[i * H + n] - want) < 1e-3);
    }
  CHECK(hir_evaluator_memory(ev) == (size_t)(2 * T * F + T * H) * sizeof(float));
  if (hir_evaluator_memory(ev) != (size_t)(2 * T * F + T * H) * sizeof(float))
    fprintf(stderr, "  the evaluator holds %zu bytes\n", hir_evaluator_memory(ev));
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
  { /* the first linear alone, its output the caller's: the product, [F parts, T, F / parts], goes straight into it */
    hir_tensor o1[1];
    float h[T * F];
    int streams;
    for (streams = 0; streams < 2; streams++) { /* then with the output's T parts on streams (the sequence-parallel
                                                    pipeline): each chunk's product, [F parts, T chunk, F / parts],
                                                    goes straight into its chunk of the output */
      f = hir_fusion_create();
      tx = hir_input(f, HIR_F32, 2), tw1 = hir_input(f, HIR_F32, 2);
      hir_output(f, ty = hir_linear(f, tx, tw1, NULL));
      hir_set_mesh(tx, 1, mesh), hir_set_mesh(tw1, 1, mesh), hir_set_mesh(ty, 1, mesh);
      hir_split(tw1, 0, 1, 1);
      hir_parallelize(tw1, 0, HIR_DIDX);
      if (streams) {
        hir_split(tx, 0, 1, 1);
        hir_parallelize(tx, 0, HIR_DIDX), hir_parallelize(ty, 0, HIR_STREAM);
      }
      hir_parallelize(ty, streams ? 2 : 1, HIR_DIDX);
      CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
      memset(o1, 0, sizeof o1);
      o1[0].data = h, o1[0].dtype = HIR_F32, o1[0].ndims = 2, o1[0].sizes[0] = T, o1[0].sizes[1] = F;
      for (i = 0; i < T * F; i++) h[i] = NAN;
      CHECK(hir_run(ev, in, 2, o1, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
      for (i = 0; i < T; i++)
        for (k = 0; k < F; k++) {
          double want = 0;
          for (n = 0; n < H; n++) want += (double)x[i * H + n] * w1[k * H + n];
          CHECK(fabs(h[i * F + k] - want) < 1e-3);
        }
      CHECK(hir_evaluator_memory(ev) == 0);
      if (hir_evaluator_memory(ev)) fprintf(stderr, "  streams %d: the evaluator holds %zu bytes\n", streams, hir_evaluator_memory(ev));
      hir_evaluator_free(ev);
      hir_program_free(p);
      hir_fusion_free(f);
    }
  }
  hir_local_world_free(w);
}

/* A DIDx broadcast axis (each device holds its one element: whole, not
   split) added to a split tensor, on inputs of fixed sizes (nvFuser's
   concrete tensors; their sizes checked when run). ReshardingTest's DIDx
   on a broadcast axis; AllocationTest's concrete inputs. */
TEST(test_split_broadcast_didx, "split/broadcast_didx_fixed_sizes", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], flags[3] = {1, 0, 0};
    int64_t sx[2] = {4, 6}, sw[3] = {D, 4, 6}, i, j;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input_sized(f, HIR_F32, 2, sx), *w = hir_input_sized(f, HIR_F32, 3, sw), *y = hir_broadcast(f, x, 3, flags);
    hir_tv *z = hir_add(f, w, y);
    hir_output(f, z);
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(w, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_parallelize(y, 0, HIR_DIDX); /* a broadcast axis: y stays whole */
    hir_parallelize(w, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F32, 2, sx);
    c.in[1] = trand(HIR_F32, 3, sw);
    c.out[0] = tn(HIR_F32, 3, sw);
    for (i = 0; i < D; i++)
      for (j = 0; j < 24; j++) tset(&c.out[0], i * 24 + j, tget(&c.in[1], i * 24 + j) + tget(&c.in[0], j));
    RUN_CASE(&c, "broadcast_didx");
    hir_fusion_free(f);
  }
  { /* a fixed size that the tensor given does not have */
    hir_fusion *f = hir_fusion_create();
    int64_t sx[2] = {4, 6};
    hir_tv *x = hir_input_sized(f, HIR_F32, 2, sx);
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_lower_desc ld;
    hir_eval_desc ed;
    hir_tensor in[1], out[1];
    float data[20] = {0};
    hir_output(f, hir_neg(f, x));
    memset(&ld, 0, sizeof ld);
    memset(&ed, 0, sizeof ed);
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    in[0].data = data, in[0].dtype = HIR_F32, in[0].ndims = 2, in[0].sizes[0] = 4, in[0].sizes[1] = 5;
    CHECK(hir_run(ev, in, 1, out, 1) == HIR_ERR_SHAPE && strstr(hir_evaluator_error(ev), "axis 1 has size 5, but its extent is 6"));
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* Stream axes on program inputs (inputs arrive whole: the consumer's loop
   reads them chunk by chunk): relu of an input streamed on axis 0, and a
   matmul whose A is streamed on the outer part of its split M.
   StreamTest's stream-parallel inputs. */
TEST(test_split_stream_inputs, "split/stream_inputs", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sx[2] = {4, 6}, sa[2] = {6, 5}, sb[3] = {D, 5, 3}, so[3] = {D, 6, 3}, i, m, n, k;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_relu(f, x), *a, *b, *o;
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_parallelize(x, 0, HIR_STREAM);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 1, 1);
    c.in[0] = trand(HIR_F32, 2, sx);
    c.out[0] = tn(HIR_F32, 2, sx);
    for (i = 0; i < 24; i++) tset(&c.out[0], i, tget(&c.in[0], i) > 0 ? tget(&c.in[0], i) : 0);
    RUN_CASE(&c, "stream_input_relu");
    hir_fusion_free(f);

    f = hir_fusion_create(); /* A [M, K] streamed on M (split by 2; its parts on streams), B [K, n]: C [M, n] */
    a = hir_input(f, HIR_F32, 2);
    b = hir_input(f, HIR_F32, 2);
    o = hir_matmul(f, a, b);
    hir_output(f, o);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_split(a, 0, 2, 1);
    hir_parallelize(a, 0, HIR_STREAM);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F32, 2, sa);
    c.in[1] = trand(HIR_F32, 2, sb + 1);
    c.out[0] = tn(HIR_F32, 2, so + 1);
    for (m = 0; m < 6; m++)
      for (n = 0; n < 3; n++) {
        double t = 0;
        for (k = 0; k < 5; k++) t += tget(&c.in[0], m * 5 + k) * tget(&c.in[1], k * 3 + n);
        tset(&c.out[0], m * 3 + n, t);
      }
    c.prealloc = wi & 1;
    RUN_CASE(&c, "stream_input_matmul");
    hir_fusion_free(f);
  }
}

/* A Stream axis on a sum's reduced axis (RSMatmulTest's stream-parallel K):
   C = sum over S of A [S, M, k] x B [S, k, N], the partial products
   computed chunk by chunk on streams and summed after the loop. */
TEST(test_split_stream_reduced, "split/stream_on_reduced_axis", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], axis = 0;
    int64_t sa[3] = {3, 4, 5}, sb[3] = {3, 5, 2}, so[2] = {4, 2}, s, m, n, k;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F64, 3), *b = hir_input(f, HIR_F64, 3), *y = hir_sum(f, hir_matmul(f, a, b), 1, &axis);
    hir_output(f, y);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_parallelize(y, 0, HIR_STREAM); /* the reduced axis */
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F64, 3, sa);
    c.in[1] = trand(HIR_F64, 3, sb);
    c.out[0] = tn(HIR_F64, 2, so);
    for (m = 0; m < 4; m++)
      for (n = 0; n < 2; n++) {
        double t = 0;
        for (s = 0; s < 3; s++)
          for (k = 0; k < 5; k++) t += tget(&c.in[0], (s * 4 + m) * 5 + k) * tget(&c.in[1], (s * 5 + k) * 2 + n);
        tset(&c.out[0], m * 2 + n, t);
      }
    c.tol = 1e-12;
    RUN_CASE(&c, "stream_on_reduced_axis");
    hir_fusion_free(f);
  }
}

/* Two splits of one size on different axes, each part on Stream: y = relu(x)
   streamed by rows, z = 2y streamed by columns. Their loops must stay
   apart (z's column chunk reads every row of y): stream lowering chains
   ops whose Stream axes share one split's extent value, not any extent of
   the same size (a chain of these two once read rows not yet written). */
TEST(test_split_unrelated_streams, "split/unrelated_streams", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, k;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sx[2] = {4, 6}, i;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_relu(f, x), *z = hir_binary_scalar(f, HIR_BINARY_MUL, y, 2.0);
    hir_tv *all[3];
    all[0] = x, all[1] = y, all[2] = z;
    hir_output(f, z);
    hir_output(f, y);
    for (k = 0; k < 3; k++) hir_set_mesh(all[k], D, iota_mesh);
    hir_split(y, 0, 2, 1); /* rows: every tensor's axis 0 becomes [2, 2] */
    hir_split(z, 2, 2, 1); /* columns: [2, 2, 2, 3] */
    hir_parallelize(y, 0, HIR_STREAM);
    hir_parallelize(z, 2, HIR_STREAM);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 1, 2);
    c.in[0] = trand(HIR_F32, 2, sx);
    c.out[0] = tn(HIR_F32, 2, sx);
    c.out[1] = tn(HIR_F32, 2, sx);
    for (i = 0; i < 24; i++) {
      double r = tget(&c.in[0], i) > 0 ? tget(&c.in[0], i) : 0;
      tset(&c.out[0], i, 2 * r);
      tset(&c.out[1], i, r);
    }
    c.prealloc = wi & 1;
    RUN_CASE(&c, "unrelated_streams");
    hir_fusion_free(f);
  }
}

/* Whether a tensor is sharded, asked as nvFuser's ShardingTest asks its
   isSharded helper: through the axes' parallel types (hir_tv_ptype) after a
   split beside the DIDx axis (LogicalIsSharded), after a split whose outer
   part is DIDx and the allocation laid out as the loop (AllocationIsSharded),
   and two DIDx axes on one tensor, which nvFuser's helper throws on and
   hir_parallelize refuses (MultipleDIDx). */
static int tv_is_sharded(const hir_tv *tv) {
  int i, n = 0;
  for (i = 0; i < hir_tv_ndims(tv); i++) n += hir_tv_ptype(tv, i) == HIR_DIDX || hir_tv_ptype(tv, i) == HIR_DIDY;
  return n > 0;
}

TEST(test_split_is_sharded, "split/is_sharded", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 3);
  hir_output(f, hir_relu(f, x));
  CHECK(!tv_is_sharded(x));
  CHECK(hir_parallelize(x, 2, HIR_DIDX) == HIR_OK && hir_split(x, 0, 4, 0) == HIR_OK); /* LogicalIsSharded */
  CHECK(tv_is_sharded(x) && hir_tv_ndims(x) == 4 && hir_tv_ptype(x, 3) == HIR_DIDX);
  hir_fusion_free(f);
  f = hir_fusion_create(); /* AllocationIsSharded */
  x = hir_input(f, HIR_F32, 3);
  hir_output(f, hir_relu(f, x));
  CHECK(hir_split(x, 1, 4, 0) == HIR_OK && hir_parallelize(x, 1, HIR_DIDX) == HIR_OK && hir_set_allocation_loop(x) == HIR_OK);
  CHECK(tv_is_sharded(x) && hir_tv_ptype(x, 1) == HIR_DIDX && hir_fusion_error(f)[0] == 0);
  hir_fusion_free(f);
  f = hir_fusion_create(); /* MultipleDIDx */
  x = hir_input(f, HIR_F32, 1);
  hir_output(f, hir_relu(f, x));
  CHECK(hir_split(x, 0, 2, 0) == HIR_OK && hir_parallelize(x, 0, HIR_DIDX) == HIR_OK);
  CHECK(hir_parallelize(x, 1, HIR_DIDX) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "hir_parallelize: T0 already has a DIDx axis (axis 0); one DIDx axis per tensor"));
  hir_fusion_free(f);
}
