/* Permutes, resharding on inner axes (lowered around permutes, as nvFuser's
   ReorderShardedAxisPass does) and all-to-all: each on the local world (1, 2,
   3, 4, 8 ranks) against references computed here from the whole tensors. */
#include "test.h"

/* out[perm-ordered index] = in: the whole tensor permuted (torch.permute). */
static hir_tensor ref_permute(const hir_tensor *in, const int *perm) {
  int64_t sz[HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0}, src[HIR_MAX_DIMS];
  hir_tensor o;
  int i;
  for (i = 0; i < in->ndims; i++) sz[i] = in->sizes[perm[i]];
  o = tn(in->dtype, in->ndims, sz);
  if (tnumel(&o))
    do {
      for (i = 0; i < in->ndims; i++) src[perm[i]] = idx[i];
      tset(&o, toff(&o, idx), tget(in, toff(in, src)));
    } while (tnext(&o, idx));
  return o;
}

/* out = set(x): x split on in_axis over the world (-1: whole), out on
   out_mesh split on out_axis (-1: whole); the numbers must not change. */
static void set_case(int D, hir_dtype dt, int nd, const int64_t *sz, int in_axis, int nout_mesh, const int *out_mesh,
                     int out_axis, int prealloc, const char *name, int line) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, dt, nd), *y = hir_set(f, x);
  hir_tensor in = trand(dt, nd, sz);
  hir_output(f, y);
  hir_set_mesh(x, D, iota_mesh);
  hir_set_mesh(y, nout_mesh, out_mesh);
  if (in_axis >= 0) hir_parallelize(x, in_axis, HIR_DIDX);
  if (out_axis >= 0) hir_parallelize(y, out_axis, HIR_DIDX);
  run_one(f, D, in, tcopy(&in), prealloc, name, __FILE__, line);
}

/* permute and transpose, of a sharded tensor (the DIDx axis moves with its
   data, no communication) and of a whole one; nvFuser's permute tests. */
TEST(test_reshard_permute, "reshard/permute", TEST_CPU | TEST_GPU_WORLDS) {
  static const int perm[3] = {2, 0, 1};
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], t01[3] = {1, 0, 2};
    int64_t sz[3] = {D, 3, 5};
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 3), *y = hir_permute(f, x, perm);
    hir_tensor in;
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_parallelize(x, 0, HIR_DIDX);
    in = trand(HIR_F32, 3, sz);
    RUN_ONE(f, D, in, ref_permute(&in, perm), wi & 1, "permute_sharded");

    f = hir_fusion_create();
    x = hir_input(f, HIR_BF16, 3);
    y = hir_transpose(f, x, 0, 1);
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    in = trand(HIR_BF16, 3, sz);
    RUN_ONE(f, D, in, ref_permute(&in, t01), !(wi & 1), "transpose_whole");
  }
}

/* A whole tensor on the last device permuted onto every device, the output
   split on its first axis (DIDx, or whole) and maybe on streams along
   another: every order of three axes, the permute before the scatter (with
   a Stream axis, refused alike on every device where the chunks would be
   strided pieces; a chunk's collective once dropped the permute: wrong
   numbers, found by the differential check's seed 20720). */
TEST(test_reshard_permute_moved, "reshard/permute_moved", TEST_CPU | TEST_GPU_WORLDS) {
  static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  int wi, k, mode, ran = 0;
  for (wi = 1; wi < 4; wi++)
    for (k = 0; k < 6; k++)
      for (mode = 0; mode < 4; mode++) { /* 0, 1: split or whole; 2, 3: the same with Stream on axis 1 */
        int D = worlds[wi], last = D - 1, split = !(mode & 1);
        int64_t sz[3] = {D, 2, D}; /* the output's first axis has the mesh's size whatever the order */
        hir_fusion *f = hir_fusion_create();
        hir_tv *x = hir_input(f, HIR_F32, 3), *y = hir_permute(f, x, perms[k]);
        hir_tensor in;
        char name[64];
        sz[perms[k][0]] = D;
        sz[perms[k][1]] = 2 + (perms[k][1] != 1);
        hir_output(f, y);
        hir_set_mesh(x, 1, &last);
        hir_set_mesh(y, D, iota_mesh);
        if (split) hir_parallelize(y, 0, HIR_DIDX);
        if (mode >= 2) hir_parallelize(y, 1, HIR_STREAM);
        in = trand(HIR_F32, 3, sz);
        snprintf(name, sizeof name, "permute_moved {%d,%d,%d}%s%s", perms[k][0], perms[k][1], perms[k][2], split ? " split" : "",
                 mode >= 2 ? " streams" : "");
        ran += run_or_refused(f, D, in, ref_permute(&in, perms[k]), k & 1, name, __FILE__, __LINE__);
      }
  CHECK(ran >= 3 * 6 * 2); /* every order runs split and whole without streams; some with (the rest refused alike) */
}

/* Every collective on an inner axis: allgather, scatter, gather onto another
   mesh, reduce-scatter, and a matmul whose A is split on an inner axis.
   Mirrors LowerCollectiveTest's non-contiguous variants, InsertReshardingTest
   1/4/5 and MultiDeviceReductionTest. */
TEST(test_reshard_inner_axis, "reshard/inner_axis", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], zero = 0, axis = 0;
    int64_t sz[3] = {3, D, 4}, rs[4] = {D, 3, D, 4}, so[3] = {3, D, 4}, i, j;
    hir_fusion *f;
    hir_tv *x, *y;
    hir_tensor in, want;

    set_case(D, HIR_F32, 3, sz, 1, D, iota_mesh, -1, 0, "allgather_inner", __LINE__);
    set_case(D, HIR_F64, 3, sz, -1, D, iota_mesh, 1, 1, "scatter_inner", __LINE__);
    set_case(D, HIR_F32, 3, sz, 1, 1, &zero, -1, 0, "gather_inner", __LINE__); /* onto device 0 alone */

    f = hir_fusion_create(); /* reduce-scatter: the sum over DIDx axis 0, scattered on axis 2 (an inner one) */
    x = hir_input(f, HIR_F32, 4);
    hir_output(f, y = hir_sum(f, x, 1, &axis));
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_parallelize(x, 0, HIR_DIDX);
    hir_parallelize(y, 2, HIR_DIDX);
    in = trand(HIR_F32, 4, rs);
    want = tn(HIR_F32, 3, so);
    for (j = 0; j < 3 * D * 4; j++) {
      double t = 0;
      for (i = 0; i < D; i++) t += tget(&in, i * 3 * D * 4 + j);
      tset(&want, j, t);
    }
    RUN_ONE(f, D, in, want, 1, "reduce_scatter_inner");
  }
}

/* AG+GEMM with A [B, D, M, K] split on axis 1 (an inner axis once B > 1):
   the decomposed allgather moves it around permutes. */
TEST(test_reshard_inner_matmul, "reshard/inner_matmul", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sa[4] = {2, D, 3, 4}, sb[2] = {4, 5}, so[4] = {2, D, 3, 5}, b, r, m, n, k;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 4), *w = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, w);
    hir_output(f, o);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(w, D, iota_mesh);
    hir_set_mesh(o, D, iota_mesh);
    hir_parallelize(a, 1, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F32, 4, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = tn(HIR_F32, 4, so);
    for (b = 0; b < 2; b++)
      for (r = 0; r < D; r++)
        for (m = 0; m < 3; m++)
          for (n = 0; n < 5; n++) {
            double t = 0;
            for (k = 0; k < 4; k++) t += tget(&c.in[0], ((b * D + r) * 3 + m) * 4 + k) * tget(&c.in[1], k * 5 + n);
            tset(&c.out[0], ((b * D + r) * 3 + m) * 5 + n, t);
          }
    RUN_CASE(&c, "allgather_inner_matmul");
    hir_fusion_free(f);
  }
}

/* AllToAll: the DIDx axis moves to another axis on one mesh (outermost to
   outermost, inner to inner around permutes, and through a transpose that
   reshards), as nvFuser's AllToAll tests and expert/sequence parallelism do. */
TEST(test_reshard_alltoall, "reshard/alltoall", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], t01[3] = {1, 0, 2}, t12[4] = {0, 2, 1, 3};
    int64_t sz[3] = {D, D, 3}, sz4[4] = {2, D, D, 3};
    hir_fusion *f;
    hir_tv *x, *y;
    hir_tensor in;

    set_case(D, HIR_F32, 3, sz, 0, D, iota_mesh, 1, wi & 1, "alltoall", __LINE__);       /* [DIDx, D, 3] -> [D, DIDx, 3] */
    set_case(D, HIR_BF16, 4, sz4, 2, D, iota_mesh, 1, !(wi & 1), "alltoall_inner", __LINE__); /* both axes inner */

    f = hir_fusion_create(); /* transpose(x [DIDx, D, 3]) split on its axis 0: x's axis 1 */
    x = hir_input(f, HIR_F64, 3);
    hir_output(f, y = hir_transpose(f, x, 0, 1));
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_parallelize(x, 0, HIR_DIDX);
    hir_parallelize(y, 0, HIR_DIDX);
    in = trand(HIR_F64, 3, sz);
    RUN_ONE(f, D, in, ref_permute(&in, t01), 1, "transpose_resharding");

    f = hir_fusion_create(); /* transpose(x [2, DIDx, D, 3], 1, 2) split on its axis 1: an AllToAll of inner axes */
    x = hir_input(f, HIR_F32, 4);
    hir_output(f, y = hir_transpose(f, x, 1, 2));
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, iota_mesh);
    hir_parallelize(x, 1, HIR_DIDX);
    hir_parallelize(y, 1, HIR_DIDX);
    in = trand(HIR_F32, 4, sz4);
    RUN_ONE(f, D, in, ref_permute(&in, t12), 0, "transpose_resharding_inner");
  }
}

/* nvFuser's CollectivePermute: a split tensor moved onto the same devices
   in a shifted order (slice i from device i to device i + 1), lowered as
   one SendRecv per slice. */
TEST(test_reshard_collective_permute, "reshard/collective_permute", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, i;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], shifted[MAXR];
    int64_t sz[3] = {D, 3, 5};
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 3), *y = hir_set(f, x);
    hir_tensor in;
    for (i = 0; i < D; i++) shifted[i] = (i + 1) % D;
    hir_output(f, y);
    hir_set_mesh(x, D, iota_mesh);
    hir_set_mesh(y, D, shifted);
    hir_parallelize(x, 0, HIR_DIDX);
    hir_parallelize(y, 0, HIR_DIDX);
    in = trand(HIR_F32, 3, sz);
    RUN_ONE(f, D, in, tcopy(&in), wi & 1, "collective_permute");
  }
}

/* AG_after_Matmul: the matmul runs on each device's rows, and its output is
   gathered after it (the resharding comes after the op: an Allgather of
   its output). */
TEST(test_reshard_ag_after_matmul, "reshard/ag_after_matmul", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi];
    int64_t sa[3] = {D, 3, 4}, sb[2] = {4, 5};
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 2), *o = hir_matmul(f, a, b), *g = hir_set(f, o);
    hir_output(f, g);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_set_mesh(o, D, iota_mesh);
    hir_set_mesh(g, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(o, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 2, 1);
    c.in[0] = trand(HIR_F32, 3, sa);
    c.in[1] = trand(HIR_F32, 2, sb);
    c.out[0] = ref_bmm(&c.in[0], &c.in[1], 1);
    c.prealloc = wi & 1;
    RUN_CASE(&c, "ag_after_matmul");
    hir_fusion_free(f);
  }
}

/* hir_swizzle1d, as nvFuser's ReshardingTest.Swizzle1D_DIDToStream and
   .Swizzle1D_ConsistentSwizzle write it: in [D * 3, 5] split D outer, DIDx;
   out = set(in) split alike, swizzled by DIDx, its outer part a Stream axis:
   a resharding, lowered to a ring whose step i receives chunk place + i
   (then relu of it, chunk by chunk); both swizzled Stream axes and no DIDx:
   no communication, each device's loop starting at its own chunk. On
   worlds 1-8 against the input; the refusals. */
TEST(test_reshard_swizzle, "reshard/swizzle", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 2; form++) {
      int D = worlds[wi];
      int64_t sz[2] = {D * 3, 5}, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *in = hir_input(f, HIR_F32, 2), *out = hir_set(f, in), *y = hir_relu(f, out);
      char text[8192];
      hir_output(f, y);
      hir_set_mesh(in, D, iota_mesh), hir_set_mesh(out, D, iota_mesh), hir_set_mesh(y, D, iota_mesh);
      hir_split(in, 0, D, 1); /* reaches out and y */
      if (form == 0) hir_parallelize(in, 0, HIR_DIDX);
      else hir_swizzle1d(in, 0, HIR_DIDX), hir_parallelize(in, 0, HIR_STREAM);
      CHECK(hir_swizzle1d(out, 0, HIR_DIDX) == HIR_OK && hir_parallelize(out, 0, HIR_STREAM) == HIR_OK);
      hir_swizzle1d(y, 0, HIR_DIDX), hir_parallelize(y, 0, HIR_STREAM);
      CHECK(hir_fusion_error(f)[0] == 0);
      CHECK(hir_expr_is_resharding(hir_tv_definition(out)) == (form == 0 && D > 1)); /* DIDx differs; both streams alike */
      if (D == 3) { /* rank 1's program: step i takes chunk (1 + i) % 3 */
        hir_lower_desc d;
        hir_program *p = NULL;
        memset(&d, 0, sizeof d);
        d.my_device = 1;
        CHECK(hir_lower(f, &d, &p) == HIR_OK);
        hir_program_snprint(p, text, sizeof text);
        CHECK(strstr(text, form == 0 ? "index = ( ( rank + StreamIdx ) % 3 )" : "index = ( ( StreamIdx + 1 ) % 3 )"));
        CHECK(form || (strstr(text, "type=recv, buffer=T3_l_float[iS12{( i0 / 3 )}, iS13{i2}] (DeviceMesh{0 1 2}), peer=( ( rank + "
                               "StreamIdx ) % 3 )") && strstr(text, "peer=( ( ( rank + 3 ) - StreamIdx ) % 3 )")));
        CHECK((strstr(text, "P2PCommunication") != NULL) == (form == 0));
        hir_program_free(p);
      }
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(HIR_F32, 2, sz);
      c.out[0] = tcopy(&c.in[0]);
      for (i = 0; i < tnumel(&c.out[0]); i++) tset(&c.out[0], i, fmax(0, tget(&c.out[0], i)));
      c.prealloc = wi & 1;
      RUN_CASE(&c, form == 0 ? "Swizzle1D_DIDToStream: a ring from DIDx" : "Swizzle1D_ConsistentSwizzle: no communication");
      hir_fusion_free(f);
    }
  { /* refusals, by name */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2);
    int mesh2[4] = {0, 1, 2, 3};
    hir_parallelize(x, 0, HIR_STREAM);
    CHECK(hir_swizzle1d(x, 0, HIR_DIDX) == HIR_OK);
    hir_output(f, hir_relu(f, x));
    {
      hir_lower_desc d;
      hir_program *p = NULL;
      memset(&d, 0, sizeof d);
      CHECK(hir_lower(f, &d, &p) != HIR_OK && strstr(hir_program_error(p), "and its tensor has no 1-D mesh; give it one"));
      hir_program_free(p);
    }
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_F32, 2);
    hir_set_mesh(x, 4, mesh2);
    CHECK(hir_swizzle1d(x, 0, HIR_DIDY) == HIR_ERR_UNSUPPORTED && strstr(hir_fusion_error(f), "swizzle by HIR_DIDX"));
    hir_fusion_free(f);
    f = hir_fusion_create(); /* a P2P reduce-scatter's Stream axis (GEMM + reduce-scatter) swizzled */
    {
      int flags[4] = {0, 1, 0, 0}, axis = 0;
      hir_tv *a = hir_input(f, HIR_F32, 4), *b = hir_input(f, HIR_F32, 3), *mm, *s;
      hir_lower_desc d;
      hir_program *p = NULL;
      mm = hir_matmul(f, a, hir_broadcast(f, b, 4, flags));
      s = hir_sum(f, mm, 1, &axis);
      hir_output(f, s);
      hir_set_mesh(a, 2, mesh2), hir_set_mesh(b, 2, mesh2), hir_set_mesh(s, 2, mesh2);
      hir_parallelize(a, 0, HIR_DIDX), hir_parallelize(b, 0, HIR_DIDX), hir_parallelize(s, 1, HIR_DIDX);
      hir_swizzle1d(mm, 1, HIR_DIDX), hir_parallelize(mm, 1, HIR_STREAM);
      memset(&d, 0, sizeof d);
      CHECK(hir_fusion_error(f)[0] == 0 && hir_lower(f, &d, &p) != HIR_OK &&
            strstr(hir_program_error(p), "its Stream axis is swizzled (hir_swizzle1d), which only a P2P allgather's"));
      hir_program_free(p);
      hir_fusion_free(f);
    }
  }
}
