/* The fusion builder: the seeds' fusions with their shapes, iter types and
   parallel types, and every misuse returning NULL or a status with a message. */
#include "seeds.h"
#include "test.h"

static const char *tvstr(const hir_tv *tv) {
  static char bufs[4][512];
  static int k;
  char *b = bufs[k++ & 3];
  hir_tv_snprint(tv, b, 512);
  return b;
}

#define M8 " (DeviceMesh{0 1 2 3 4 5 6 7})"
static const int mesh8[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* Expected strings are the seeds' dumps. Where nvFuser printed a reordered
   loop domain (matmul_AR, matmul_RS_through_bcast) we keep the logical order
   with the same names. */
TEST(test_seed_single_device, "build/seed_single_device", TEST_CPU) {
  seed s;
  seed_single_set_op(&s, hir_fusion_create());
  CHECK_STR(hir_fusion_error(s.f), "");
  CHECK_STR(tvstr(s.t[0]), "T0_g_float[iS0{i0}, iS1{i2}]");
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iStreamIdx2{i0}, iS3{i2}]");
  CHECK(hir_tv_extent(s.t[1], 0) == hir_tv_extent(s.t[0], 0)); /* one symbol, shared */
  CHECK(hir_expr_kind_of(hir_tv_definition(s.t[1])) == HIR_EXPR_LOAD_STORE);
  CHECK(hir_tv_definition(s.t[0]) == NULL);
  hir_fusion_free(s.f);

  seed_two_set_ops(&s, hir_fusion_create());
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[iStreamIdx4{i0}, iS5{i2}]");
  hir_fusion_free(s.f);

  seed_three_set_ops(&s, hir_fusion_create());
  CHECK_STR(hir_fusion_error(s.f), "");
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[iS4{i0}, iS5{i2}]");
  CHECK_STR(tvstr(s.t[3]), "T3_g_float[iStreamIdx6{i0}, iS7{i2}]");
  hir_fusion_free(s.f);
}

TEST(test_seed_collective_pipelines, "build/seed_collective_pipelines", TEST_CPU) {
  seed s;
  seed_allgather(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(hir_fusion_error(s.f), "");
  CHECK_STR(tvstr(s.t[0]), "T0_g_float[iS0{i0}, ideviceIdx.x1{i2}]" M8);
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iStreamIdx2{i0}, iS3{i2}]" M8);
  hir_fusion_free(s.f);

  seed_allreduce(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iStreamIdx3{i0}, rS4{i2}, iS5{i3}]" M8);
  CHECK(hir_tv_ndims(s.t[1]) == 3 && hir_tv_iter_type(s.t[1], 1) == HIR_REDUCTION);
  hir_fusion_free(s.f);

  seed_reduce_scatter(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(tvstr(s.t[0]), "T0_g_float[iS0{i0}, ideviceIdx.x1{i2}, iS2{i3}, iS3{i4}]" M8);
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iStreamIdx4{i0}, rS5{i2}, ideviceIdx.x6{i3}, iS7{i4}]" M8);
  hir_fusion_free(s.f);

  seed_ag_matmul(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iS4{i5}, iS5{i6}]" M8);
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[iStreamIdx6{i0}, iS7{i2}, iS8{i3}, iS9{i6}, rS10{i4}]" M8);
  hir_fusion_free(s.f);

  seed_matmul_ar(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(hir_fusion_error(s.f), "");
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[ideviceIdx.x4{i5}, iS5{i6}, iS6{i7}]" M8);
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[iStreamIdx7{i0}, ideviceIdx.x8{i2}, iS9{i3}, iS10{i7}, rS11{i4}]" M8);
  CHECK_STR(tvstr(s.t[3]), "T3_g_float[iStreamIdx12{i0}, rS13{i2}, iS14{i3}, iS15{i7}]" M8);
  hir_fusion_free(s.f);

  seed_matmul_rs_through_bcast(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(hir_fusion_error(s.f), "");
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[bS8{1}, ideviceIdx.x9{i6}, bS10{1}, iS11{i7}, iS12{i8}]" M8);
  CHECK_STR(tvstr(s.t[3]), "T3_g_float[iStreamIdx13{i0}, ideviceIdx.x14{i2}, iS15{i3}, iS16{i4}, iS17{i8}, rS18{i5}]" M8);
  CHECK_STR(tvstr(s.t[4]), "T4_g_float[iStreamIdx19{i0}, rS20{i2}, ideviceIdx.x21{i3}, iS22{i4}, iS23{i8}]" M8);
  CHECK(hir_tv_iter_type(s.t[2], 0) == HIR_BROADCAST && hir_tv_ptype(s.t[2], 1) == HIR_DIDX);
  hir_fusion_free(s.f);
}

TEST(test_seed_p2p, "build/seed_p2p", TEST_CPU) {
  seed s;
  int n;
  const int *m;
  seed_allgather_p2p(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(tvstr(s.t[0]), "T0_g_float[ideviceIdx.x0{i0}, iS1{i2}]" M8);
  CHECK_STR(tvstr(s.t[1]), "T1_g_float[iStreamIdx2{i0}, iS3{i2}]" M8);
  m = hir_tv_mesh(s.t[1], &n);
  CHECK(n == 8 && m && m[7] == 7);
  hir_fusion_free(s.f);

  seed_ag_matmul_p2p(&s, hir_fusion_create(), 8, mesh8);
  CHECK_STR(tvstr(s.t[0]), "T0_g_float[ideviceIdx.x0{i0}, iS1{i2}, iS2{i3}]" M8);
  CHECK_STR(tvstr(s.t[2]), "T2_g_float[iStreamIdx5{i0}, iS6{i2}, iS7{i5}, rS8{i3}]" M8);
  hir_fusion_free(s.f);
}

/* torch.matmul shape rules on 1-D, 2-D and batched operands. */
TEST(test_matmul_shapes, "build/matmul_shapes", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *v = hir_input(f, HIR_F64, 1);   /* [i0] */
  hir_tv *m = hir_input(f, HIR_F64, 2);   /* [i2, i3] */
  hir_tv *b3 = hir_input(f, HIR_F64, 3);  /* [i4, i5, i6] */
  int flags[4] = {1, 0, 0, 0};
  hir_tv *bb = hir_broadcast(f, b3, 4, flags); /* [b, i4, i5, i6] */
  hir_tv *b4 = hir_input(f, HIR_F64, 4);  /* [i8, i9, i10, i11] */
  /* extents: v i0, (zero i1), m i2 i3, b3 i4 i5 i6, (one i7), b4 i8..i11 */
  CHECK_STR(tvstr(hir_matmul(f, v, v)), "T5_g_double[rS14{i0}]");
  CHECK_STR(tvstr(hir_matmul(f, m, v)), "T6_g_double[iS15{i2}, rS16{i3}]");
  CHECK_STR(tvstr(hir_matmul(f, v, m)), "T7_g_double[iS17{i3}, rS18{i0}]");
  CHECK_STR(tvstr(hir_matmul(f, b3, m)), "T8_g_double[iS19{i4}, iS20{i5}, iS21{i3}, rS22{i6}]");
  CHECK_STR(tvstr(hir_matmul(f, m, b3)), "T9_g_double[iS23{i4}, iS24{i2}, iS25{i6}, rS26{i3}]");
  /* a broadcast batch axis takes the other operand's extent */
  CHECK_STR(tvstr(hir_matmul(f, bb, b4)), "T10_g_double[iS27{i8}, iS28{i4}, iS29{i5}, iS30{i11}, rS31{i6}]");
  CHECK_STR(hir_fusion_error(f), "");
  hir_fusion_free(f);
}

TEST(test_elementwise_sum_broadcast, "build/elementwise_sum_broadcast", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_BF16, 2); /* [i0, i2] */
  int axes[2] = {-1, 0}, flags[2] = {0, 1};
  hir_tv *s = hir_sum(f, a, 1, axes);    /* [i0, r i2] */
  hir_tv *bc = hir_broadcast(f, s, 2, flags); /* [i0, b] */
  hir_tv *x = hir_add(f, bc, a);         /* b + i -> i */
  hir_tv *y = hir_mul(f, a, bc);
  hir_tv *z = hir_sub(f, x, y);
  CHECK_STR(tvstr(s), "T1_g___bfloat[iS2{i0}, rS3{i2}]");
  CHECK_STR(tvstr(bc), "T2_g___bfloat[iS4{i0}, bS5{1}]");
  CHECK_STR(tvstr(x), "T3_g___bfloat[iS6{i0}, iS7{i2}]");
  CHECK(hir_tv_extent(x, 0) == hir_tv_extent(a, 0));
  CHECK_STR(tvstr(y), "T4_g___bfloat[iS8{i0}, iS9{i2}]");
  CHECK_STR(tvstr(z), "T5_g___bfloat[iS10{i0}, iS11{i2}]");
  CHECK_STR(tvstr(hir_sum(f, z, 2, axes)), "T6_g___bfloat[rS12{i0}, rS13{i2}]");
  CHECK_STR(tvstr(hir_set(f, s)), "T7_g___bfloat[iS14{i0}]"); /* reduction axes are gone */
  CHECK_STR(hir_fusion_error(f), "");
  CHECK(hir_output(f, z) == HIR_OK);
  hir_fusion_free(f);
}

/* Runs one misuse on a fresh fusion; checks NULL/status and the message. */
typedef hir_status (*misuse_fn)(hir_fusion *f);

static void expect_misuse(misuse_fn fn, hir_status want, const char *needle, int line) {
  hir_fusion *f = hir_fusion_create();
  hir_status got = fn(f);
  if (got != want || hir_fusion_status(f) != want || !strstr(hir_fusion_error(f), needle)) {
    fprintf(stderr, "  test_build.c:%d: status %s, fusion status %s, message \"%s\"; wanted %s with \"%s\"\n", line,
            hir_status_str(got), hir_status_str(hir_fusion_status(f)), hir_fusion_error(f), hir_status_str(want), needle);
    hir_test_failures++;
  }
  hir_fusion_free(f);
}
#define MISUSE(fn, want, needle) expect_misuse(fn, want, needle, __LINE__)

static hir_status st(hir_fusion *f, const void *p) { return p ? HIR_OK : hir_fusion_status(f); }

static hir_status m_null_set(hir_fusion *f) { return st(f, hir_set(f, NULL)); }
static hir_status m_null_add(hir_fusion *f) { return st(f, hir_add(f, hir_input(f, HIR_F32, 1), NULL)); }
static hir_status m_null_output(hir_fusion *f) { return hir_output(f, NULL); }
static hir_status m_too_many_dims(hir_fusion *f) { return st(f, hir_input(f, HIR_F32, HIR_MAX_DIMS + 1)); }
static hir_status m_zero_dims(hir_fusion *f) { return st(f, hir_input(f, HIR_F32, 0)); }
static hir_status m_bad_dtype(hir_fusion *f) { return st(f, hir_input(f, (hir_dtype)42, 2)); }
/* operands made in separate statements: C leaves argument order unspecified */
/* fixed sizes that differ: a size-1 axis is not a broadcast (nvFuser's makeConcreteTensor would make it one) */
static hir_status m_size_one_axis(hir_fusion *f) {
  int64_t one[2] = {1, 4}, three[2] = {3, 4};
  hir_tv *a = hir_input_sized(f, HIR_F32, 2, one), *b = hir_input_sized(f, HIR_F32, 2, three);
  return st(f, hir_add(f, a, b));
}
static hir_status m_fixed_sizes_differ(hir_fusion *f) {
  int64_t sa[2] = {2, 4}, sb[2] = {2, 5};
  hir_tv *a = hir_input_sized(f, HIR_F32, 2, sa), *b = hir_input_sized(f, HIR_F32, 2, sb);
  return st(f, hir_mul(f, a, b));
}
static hir_status m_mixed_dtypes(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F16, 2);
  return st(f, hir_add(f, a, b));
}
static hir_status m_mixed_matmul(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_BF16, 2);
  return st(f, hir_matmul(f, a, b));
}
static hir_status m_rank_mismatch(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 3);
  return st(f, hir_mul(f, a, b));
}
static hir_status m_matmul_rank(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 1);
  return st(f, hir_matmul(f, hir_matmul(f, a, a), a)); /* a 0-D (all reduced) operand */
}
static hir_status m_matmul_too_big(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 8), *b = hir_input(f, HIR_F32, 8);
  return st(f, hir_matmul(f, a, b));
}
static hir_status m_bad_axis(hir_fusion *f) { return hir_parallelize(hir_input(f, HIR_F32, 2), 2, HIR_DIDX); }
static hir_status m_bad_neg_axis(hir_fusion *f) { return hir_parallelize(hir_input(f, HIR_F32, 2), -3, HIR_DIDX); }
static hir_status m_bad_ptype(hir_fusion *f) { return hir_parallelize(hir_input(f, HIR_F32, 2), 0, (hir_ptype)7); }
static hir_status m_two_didx(hir_fusion *f) {
  hir_tv *a = hir_input(f, HIR_F32, 2);
  hir_parallelize(a, 0, HIR_DIDX);
  return hir_parallelize(a, 1, HIR_DIDX);
}
static hir_status m_sized_negative(hir_fusion *f) {
  int64_t sizes[2] = {3, -2};
  return hir_input_sized(f, HIR_F32, 2, sizes) ? HIR_OK : hir_fusion_status(f);
}
static hir_status m_repeated_device(hir_fusion *f) {
  int mesh[3] = {0, 2, 0};
  return hir_set_mesh(hir_input(f, HIR_F32, 2), 3, mesh);
}
static hir_status m_empty_mesh(hir_fusion *f) {
  int mesh[1] = {0};
  return hir_set_mesh(hir_input(f, HIR_F32, 2), 0, mesh);
}
static hir_status m_negative_device(hir_fusion *f) {
  int mesh[2] = {0, -1};
  return hir_set_mesh(hir_input(f, HIR_F32, 2), 2, mesh);
}
static hir_status m_sum_axis(hir_fusion *f) {
  int axes[1] = {3};
  return st(f, hir_sum(f, hir_input(f, HIR_F32, 2), 1, axes));
}
static hir_status m_sum_twice(hir_fusion *f) {
  int axes[2] = {1, -1};
  return st(f, hir_sum(f, hir_input(f, HIR_F32, 2), 2, axes));
}
static hir_status m_sum_no_axes(hir_fusion *f) { return st(f, hir_sum(f, hir_input(f, HIR_F32, 2), 0, NULL)); }
static hir_status m_broadcast_flags(hir_fusion *f) {
  int flags[3] = {1, 1, 0};
  return st(f, hir_broadcast(f, hir_input(f, HIR_F32, 2), 3, flags));
}
static hir_status m_other_fusion(hir_fusion *f) {
  hir_fusion *g = hir_fusion_create();
  hir_tv *a = hir_input(g, HIR_F32, 2);
  hir_status s = st(f, hir_set(f, a));
  hir_fusion_free(g);
  return s;
}
static hir_status m_output_twice(hir_fusion *f) {
  hir_tv *a = hir_set(f, hir_input(f, HIR_F32, 2));
  hir_output(f, a);
  return hir_output(f, a);
}
static hir_status m_output_input(hir_fusion *f) { return hir_output(f, hir_input(f, HIR_F32, 2)); }

TEST(test_builder_misuse, "build/misuse", TEST_CPU) {
  MISUSE(m_null_set, HIR_ERR_INVALID, "hir_set: argument 'in' is NULL");
  MISUSE(m_null_add, HIR_ERR_INVALID, "hir_add: argument 'b' is NULL");
  MISUSE(m_null_output, HIR_ERR_INVALID, "hir_output: argument 'tv' is NULL");
  MISUSE(m_too_many_dims, HIR_ERR_INVALID, "ndims 9 is out of range");
  MISUSE(m_zero_dims, HIR_ERR_INVALID, "ndims 0 is out of range");
  MISUSE(m_bad_dtype, HIR_ERR_INVALID, "unknown dtype 42");
  MISUSE(m_mixed_dtypes, HIR_ERR_INVALID, "hir_add: mixed dtypes: T0 is float, T1 is __half");
  MISUSE(m_size_one_axis, HIR_ERR_INVALID, "hir_add: axis 0 is 1 long in T0 and 3 in T1; a size-1 axis of hir_input_sized is "
                                           "an ordinary axis, not a broadcast as nvFuser's makeConcreteTensor makes it: give "
                                           "that input one axis fewer and add this one with hir_broadcast");
  MISUSE(m_fixed_sizes_differ, HIR_ERR_INVALID, "hir_mul: axis 1 is 4 long in T0 and 5 in T1; operands need equal sizes");
  MISUSE(m_mixed_matmul, HIR_ERR_INVALID, "hir_matmul: mixed dtypes");
  MISUSE(m_rank_mismatch, HIR_ERR_INVALID, "T0 has 2 axes and T1 has 3");
  MISUSE(m_matmul_rank, HIR_ERR_INVALID, "hir_matmul: incompatible ranks: T1 has 0 data axes");
  MISUSE(m_matmul_too_big, HIR_ERR_INVALID, "would have 9 axes");
  MISUSE(m_bad_axis, HIR_ERR_INVALID, "axis 2 is out of range for T0, which has 2 axes");
  MISUSE(m_bad_neg_axis, HIR_ERR_INVALID, "axis -3 is out of range");
  MISUSE(m_bad_ptype, HIR_ERR_INVALID, "unknown parallel type 7");
  MISUSE(m_two_didx, HIR_ERR_UNSUPPORTED, "T0 already has a DIDx axis (axis 0)");
  MISUSE(m_sized_negative, HIR_ERR_INVALID, "hir_input_sized: sizes[1] is -2; a fixed size is 0 or more");
  MISUSE(m_repeated_device, HIR_ERR_INVALID, "device 0 appears twice in the mesh");
  MISUSE(m_empty_mesh, HIR_ERR_INVALID, "empty mesh");
  MISUSE(m_negative_device, HIR_ERR_INVALID, "device id -1");
  MISUSE(m_sum_axis, HIR_ERR_INVALID, "hir_sum: axis 3 is out of range");
  MISUSE(m_sum_twice, HIR_ERR_INVALID, "axis 1 of T0 is listed twice");
  MISUSE(m_sum_no_axes, HIR_ERR_INVALID, "at least one axis");
  MISUSE(m_broadcast_flags, HIR_ERR_INVALID, "1 flags are false but T0 has 2 data axes");
  MISUSE(m_other_fusion, HIR_ERR_INVALID, "belongs to another fusion");
  MISUSE(m_output_twice, HIR_ERR_INVALID, "T1 is already an output");
  MISUSE(m_output_input, HIR_ERR_INVALID, "T0 is an input");
}

/* Sticky errors: after the first failure every builder returns NULL, accepts
   NULL, and the first message stays. */
TEST(test_sticky_errors, "build/sticky_errors", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2);
  hir_tv *d = hir_input(f, HIR_F64, 2);
  hir_tv *bad = hir_add(f, a, d);
  hir_tv *c = hir_matmul(f, bad, a);
  int axis = 0;
  CHECK(bad == NULL && c == NULL);
  CHECK(hir_sum(f, c, 1, &axis) == NULL);
  CHECK(hir_set(f, a) == NULL); /* valid arguments, but the fusion has failed */
  CHECK(hir_output(f, c) == HIR_ERR_INVALID);
  CHECK(hir_parallelize(a, 0, HIR_DIDX) == HIR_ERR_INVALID);
  CHECK(strstr(hir_fusion_error(f), "hir_add: mixed dtypes") != NULL);
  CHECK(hir_fusion_status(f) == HIR_ERR_INVALID);
  hir_fusion_free(f);
  /* NULL objects never crash */
  CHECK(hir_set(NULL, NULL) == NULL);
  CHECK(hir_set_mesh(NULL, 1, &axis) == HIR_ERR_INVALID);
  CHECK(hir_parallelize(NULL, 0, HIR_DIDX) == HIR_ERR_INVALID);
  CHECK(hir_tv_ndims(NULL) == 0);
  hir_fusion_free(NULL);
  CHECK(strcmp(hir_status_str(HIR_ERR_TIMEOUT), "timeout") == 0);
  CHECK(strcmp(hir_status_str((hir_status)99), "unknown status") == 0);
}
