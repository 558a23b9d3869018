/* Lowering: sharding propagation, decomposition, segmentation, the
   communications table (goldens reviewed against docs/DESIGN.md section 3), the
   passes alone, the verifier, HOSTIR_DUMP and concurrent lowering. */
#include <pthread.h>
#include <unistd.h> /* close */
#include "seeds.h"
#include "test.h"

static const int m8[8] = {0, 1, 2, 3, 4, 5, 6, 7};


/* AG+GEMM without streams: the matmul on a sharded A is decomposed into
   T3 = set(T0) (an Allgather) and a local matmul; T3 is released after. */
TEST(test_lower_allgather_matmul, "lower/allgather_matmul", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 2), *c = hir_matmul(f, a, b);
  char before[4096], after[4096];
  hir_output(f, c);
  hir_set_mesh(a, 8, m8);
  hir_set_mesh(b, 8, m8);
  hir_set_mesh(c, 8, m8);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_fusion_snprint(f, before, sizeof before);
  CHECK_LOWER_GOLDEN(f, 3, "lower_allgather_matmul");
  hir_fusion_snprint(f, after, sizeof after);
  CHECK_STR(after, before); /* the fusion is only read */
  hir_fusion_free(f);
}

/* Row-parallel matmul: local partial products, then an Allreduce; the
   partial buffer is released after the Wait, not before. */
TEST(test_lower_matmul_allreduce, "lower/matmul_allreduce", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  int axis = 0;
  hir_tv *a = hir_input(f, HIR_F32, 3), *b = hir_input(f, HIR_F32, 3), *c = hir_matmul(f, a, b);
  hir_tv *d = hir_sum(f, c, 1, &axis);
  hir_output(f, d);
  hir_set_mesh(a, 8, m8); /* c and d inherit the mesh; c inherits DIDx */
  hir_set_mesh(b, 8, m8);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_parallelize(b, 0, HIR_DIDX);
  CHECK_LOWER_GOLDEN(f, 3, "lower_matmul_allreduce");
  hir_fusion_free(f);
}


TEST(test_lower_cross_mesh, "lower/cross_mesh", TEST_CPU) {
  hir_fusion *f = cross_mesh_fusion();
  CHECK_LOWER_GOLDEN(f, 1, "lower_cross_mesh_d1"); /* a sender: every Gather, its SendRecv, the Reduce */
  CHECK_LOWER_GOLDEN(f, 5, "lower_cross_mesh_d5"); /* a receiver of everything */
  CHECK_LOWER_GOLDEN(f, 2, "lower_cross_mesh_d2"); /* a sender and the Broadcast root */
  hir_fusion_free(f);
}


TEST(test_lower_scatter_reduce_scatter, "lower/scatter_reduce_scatter", TEST_CPU) {
  hir_fusion *f = scatter_rs_fusion();
  CHECK_LOWER_GOLDEN(f, 7, "lower_scatter_rs_d7");
  CHECK_LOWER_GOLDEN(f, 0, "lower_empty_d0");
  hir_fusion_free(f);
}

/* bcast, bcast, add, bcast: the predicate decides how many HostUnits. */
static int merge_never(const hir_group *a, const hir_group *b, void *user) {
  (void)a; (void)b;
  ++*(int *)user;
  return 0;
}
static int merge_always(const hir_group *a, const hir_group *b, void *user) {
  (void)a; (void)b; (void)user;
  return 1;
}

static int count_kind(const hir_program *p, hir_expr_kind kind) {
  int i, n = 0;
  for (i = 0; i < hir_program_ntop(p); i++) n += hir_expr_kind_of(hir_program_top(p, i)) == kind;
  return n;
}

TEST(test_lower_merge_predicate, "lower/merge_predicate", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  int f1[3] = {1, 0, 0}, f2[4] = {1, 0, 0, 0};
  hir_tv *a = hir_input(f, HIR_F32, 2);
  hir_tv *b = hir_broadcast(f, a, 3, f1), *c = hir_broadcast(f, b, 4, f2);
  int f3[5] = {1, 0, 0, 0, 0};
  hir_tv *d = hir_add(f, c, c), *e = hir_broadcast(f, d, 5, f3);
  hir_lower_desc desc;
  hir_program *p;
  hir_segmentation *s;
  int calls = 0;
  hir_output(f, e);
  memset(&desc, 0, sizeof desc);
  CHECK(hir_lower(f, &desc, &p) == HIR_OK);
  CHECK(count_kind(p, HIR_EXPR_POST_ON_STREAM) == 2 && count_kind(p, HIR_EXPR_BINARY) == 1);
  hir_program_free(p);
  desc.should_merge = merge_never;
  desc.merge_user = &calls;
  CHECK(hir_lower(f, &desc, &p) == HIR_OK);
  CHECK(count_kind(p, HIR_EXPR_POST_ON_STREAM) == 3 && count_kind(p, HIR_EXPR_BINARY) == 1);
  CHECK(calls == 3);
  hir_program_free(p);
  desc.should_merge = merge_always;
  CHECK(hir_lower(f, &desc, &p) == HIR_OK);
  CHECK(count_kind(p, HIR_EXPR_POST_ON_STREAM) == 1 && hir_program_ntop(p) == 1);
  hir_program_free(p);
  /* the segmentation alone, inspected */
  desc.should_merge = NULL;
  CHECK(hir_segment(f, &desc, &s) == HIR_OK);
  CHECK(hir_segmentation_ngroups(s) == 3);
  CHECK(hir_group_nexprs(hir_segmentation_group(s, 0)) == 2);
  CHECK(!hir_group_is_standalone(hir_segmentation_group(s, 0)));
  CHECK(hir_group_is_standalone(hir_segmentation_group(s, 1)));
  CHECK_STR(hir_expr_kind_name(hir_group_expr(hir_segmentation_group(s, 1), 0)), "BinaryOp");
  CHECK(hir_merge_default(hir_segmentation_group(s, 0), hir_segmentation_group(s, 2), NULL) == 1);
  CHECK(hir_merge_default(hir_segmentation_group(s, 0), hir_segmentation_group(s, 1), NULL) == 0);
  hir_segmentation_free(s);
  hir_fusion_free(f);
}

/* Resharding exprs stand alone even when the predicate would merge them. */
TEST(test_lower_resharding_alone, "lower/resharding_alone", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  int flags[3] = {1, 0, 0};
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a), *c = hir_broadcast(f, b, 3, flags);
  hir_lower_desc desc;
  hir_segmentation *s;
  hir_output(f, c);
  hir_set_mesh(a, 8, m8);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_set_mesh(b, 8, m8); /* b unsharded: the set is an Allgather */
  memset(&desc, 0, sizeof desc);
  desc.should_merge = merge_always;
  CHECK(hir_segment(f, &desc, &s) == HIR_OK);
  CHECK(hir_segmentation_ngroups(s) == 2);
  CHECK(hir_expr_is_resharding(hir_group_expr(hir_segmentation_group(s, 0), 0)));
  CHECK(!hir_expr_is_resharding(hir_group_expr(hir_segmentation_group(s, 1), 0)));
  { /* its DOT export (tests/golden/segmentation_dot.txt; `dot -Tsvg` draws it) */
    char dot[4096];
    size_t n = hir_segmentation_snprint_dot(s, dot, sizeof dot);
    CHECK(n > 0 && n < sizeof dot && hir_segmentation_snprint_dot(s, NULL, 0) == n);
    check_golden(dot, "segmentation_dot", __FILE__, __LINE__);
    CHECK(hir_segmentation_print_dot(NULL, stderr) == HIR_ERR_INVALID);
  }
  hir_segmentation_free(s);
  CHECK(hir_expr_is_resharding(hir_tv_definition(b)));
  CHECK(!hir_expr_is_resharding(hir_tv_definition(c)));
  CHECK(!hir_expr_is_resharding(NULL));
  hir_fusion_free(f);
}

/* On a mesh of one device a DIDx axis splits nothing: a select that drops
   it moves no data, so it is not resharding and lowers to no communication
   (nvFuser's ReshardingSelectOpTest calls it resharding: its predicate reads
   the annotations; tests/nvfuser/COVERAGE.md says why hostir's reads the
   devices). On two devices the same select gathers. */
TEST(test_lower_one_device_select, "lower/one_device_select", TEST_CPU) {
  int D;
  for (D = 1; D <= 2; D++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_select(f, a, 0, 0);
    hir_lower_desc ld;
    hir_program *p = NULL;
    char text[8192];
    hir_output(f, b);
    hir_set_mesh(a, D, m8);
    hir_set_mesh(b, D, m8);
    hir_parallelize(a, 0, HIR_DIDX);
    CHECK(hir_expr_is_resharding(hir_tv_definition(b)) == (D > 1));
    memset(&ld, 0, sizeof ld);
    CHECK(hir_lower(f, &ld, &p) == HIR_OK);
    hir_program_snprint(p, text, sizeof text);
    if ((strstr(text, "Communication") != NULL) != (D > 1)) fprintf(stderr, "  %d devices:\n%s\n", D, text);
    CHECK((strstr(text, "Communication") != NULL) == (D > 1));
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* nvFuser's ReshardingTest.ReshardingSqueeze: in [N, 1] with its axes merged
   and the merge DIDx (which shards N: the other factor is 1), squeezed into
   an unsharded [N]. Here N is DIDx and the squeeze a select of the size-1
   axis: resharding (an Allgather), and not where the output keeps N sharded. */
TEST(test_lower_squeeze_sharded, "lower/squeeze_sharded", TEST_CPU) {
  int keep;
  for (keep = 0; keep < 2; keep++) {
    hir_fusion *f = hir_fusion_create();
    int64_t sizes[2] = {4, 1};
    hir_tv *a = hir_input_sized(f, HIR_F32, 2, sizes), *b = hir_select(f, a, 1, 0);
    hir_output(f, b);
    hir_set_mesh(a, 2, m8);
    hir_set_mesh(b, 2, m8);
    hir_split(a, 0, 2, 1);
    hir_parallelize(a, 0, HIR_DIDX);
    if (keep) hir_parallelize(b, 0, HIR_DIDX); /* the split reached b too */
    CHECK(hir_fusion_error(f)[0] == 0);
    CHECK(hir_expr_is_resharding(hir_tv_definition(b)) == !keep);
    hir_fusion_free(f);
  }
}

/* hir_merge: nvFuser's HirLowerStreamTest.Merge and
   MultiDeviceExecutorLowerStreamTest.Merge (a Stream axis on a merge,
   refused) and ReshardingTest.ReshardingSqueeze as it writes it (a merge
   with a size-1 axis, DIDx on the merge: the DIDx goes to the other axis,
   and the squeeze is a resharding); the loop axes after a merge number one
   less, a merge reads and runs as before, and the merges refused. */
TEST(test_lower_merge, "lower/merge", TEST_CPU) {
  int64_t one[2] = {8, 1}, sz[3] = {2, 3, 4}, i;
  hir_fusion *f = hir_fusion_create();
  hir_tv *in = hir_input(f, HIR_F32, 2), *out = hir_set(f, in);
  char text[64];
  hir_output(f, out);
  CHECK(hir_merge(out, 0) == HIR_OK && hir_tv_ndims(out) == 1);
  hir_val_snprint(hir_tv_extent(out, 0), text, sizeof text);
  CHECK(strstr(text, "*") != NULL);
  CHECK(hir_parallelize(out, 0, HIR_STREAM) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "hir_parallelize: T1 axis 0 is a merge of axes (hir_merge), which no parallel type takes"));
  hir_fusion_free(f);
  f = hir_fusion_create(); /* ReshardingSqueeze: [n, 1] merged, DIDx on it, then the squeeze */
  in = hir_input_sized(f, HIR_F32, 2, one), out = hir_select(f, in, 1, 0);
  hir_output(f, out);
  hir_set_mesh(in, 2, m8), hir_set_mesh(out, 2, m8);
  CHECK(hir_merge(in, 0) == HIR_OK && hir_parallelize(in, 0, HIR_DIDX) == HIR_OK);
  CHECK(hir_tv_ptype(in, 0) == HIR_DIDX && hir_fusion_error(f)[0] == 0); /* the DIDx went to the n axis, the merge's first */
  CHECK(hir_expr_is_resharding(hir_tv_definition(out)));
  hir_fusion_free(f);
  f = hir_fusion_create(); /* a merge of the first two of three axes: the third is axis 1 now, and runs */
  in = hir_input(f, HIR_F32, 3), out = hir_relu(f, in);
  hir_output(f, out);
  CHECK(hir_merge(out, 0) == HIR_OK && hir_tv_ndims(out) == 2 && hir_parallelize(out, 1, HIR_STREAM) == HIR_OK);
  CHECK(hir_split(out, 0, 2, 1) == HIR_ERR_UNSUPPORTED && strstr(hir_fusion_error(f), "is a merge of axes (hir_merge); split one"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  in = hir_input(f, HIR_F32, 3), out = hir_relu(f, in);
  hir_output(f, out);
  CHECK(hir_merge(out, 1) == HIR_OK && hir_parallelize(out, 1, HIR_STREAM) == HIR_ERR_UNSUPPORTED);
  hir_fusion_free(f);
  f = hir_fusion_create();
  in = hir_input(f, HIR_F32, 3), out = hir_relu(f, in);
  hir_output(f, out);
  CHECK(hir_merge(out, 0) == HIR_OK && hir_parallelize(out, 1, HIR_STREAM) == HIR_OK);
  {
    spmd_case c;
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, 1, f, 1, 1);
    c.in[0] = trand(HIR_F32, 3, sz);
    c.out[0] = tcopy(&c.in[0]);
    for (i = 0; i < 24; i++) tset(&c.out[0], i, fmax(0, tget(&c.out[0], i)));
    RUN_CASE(&c, "a merge, then a Stream axis after it");
  }
  hir_fusion_free(f);
  f = hir_fusion_create();
  in = hir_input(f, HIR_F32, 2), out = hir_relu(f, in);
  hir_output(f, out);
  CHECK(hir_merge(out, 1) == HIR_ERR_INVALID && strstr(hir_fusion_error(f), "the last loop axis has no next one"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  in = hir_input(f, HIR_F32, 2), out = hir_relu(f, in);
  hir_output(f, out);
  CHECK(hir_parallelize(out, 0, HIR_STREAM) == HIR_OK && hir_merge(out, 0) == HIR_ERR_UNSUPPORTED &&
        strstr(hir_fusion_error(f), "an axis already parallelized takes no merge"));
  hir_fusion_free(f);
}

TEST(test_lower_errors, "lower/errors", TEST_CPU) {
  hir_fusion *f;
  hir_tv *a, *b, *c;
  int axis = 1, zero = 0, one_two[2] = {1, 2};
  hir_program *p;
  hir_lower_desc d;
  /* a Scatter with no sender among the receivers */
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  b = hir_set(f, a);
  hir_output(f, b);
  hir_set_mesh(a, 1, &zero);
  hir_set_mesh(b, 2, one_two);
  hir_parallelize(b, 0, HIR_DIDX);
  CHECK_LOWER_ERROR(f, 1, HIR_ERR_UNSUPPORTED, "a Scatter needs a sender inside the receivers' mesh");
  hir_fusion_free(f);
  /* a fusion with an error, no outputs, DIDx without a mesh, a bad device */
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  c = hir_input(f, HIR_F16, 2);
  hir_add(f, a, c);
  CHECK_LOWER_ERROR(f, 0, HIR_ERR_INVALID, "the fusion has an error: hir_add: mixed dtypes");
  hir_fusion_free(f);
  f = hir_fusion_create();
  hir_set(f, hir_input(f, HIR_F32, 2));
  CHECK_LOWER_ERROR(f, 0, HIR_ERR_INVALID, "the fusion has no outputs");
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_sum(f, a, 1, &axis));
  hir_parallelize(a, 0, HIR_DIDX);
  CHECK_LOWER_ERROR(f, 0, HIR_ERR_INVALID, "T0 has a DIDx axis but no device mesh");
  CHECK_LOWER_ERROR(f, -2, HIR_ERR_INVALID, "my_device -2 is negative");
  memset(&d, 0, sizeof d);
  CHECK(hir_lower(NULL, &d, &p) == HIR_ERR_INVALID);
  CHECK(strstr(hir_program_error(p), "the fusion is NULL") != NULL);
  hir_program_free(p);
  CHECK(hir_lower(f, &d, NULL) == HIR_ERR_INVALID);
  hir_fusion_free(f);
}

/* The passes alone on a hand-built program, then the verifier. */
TEST(test_lower_passes_alone, "lower/passes_alone", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a), *c = hir_add(f, b, b);
  char buf[4096];
  hir_output(f, c);
  hir_set_mesh(a, 4, m8);
  hir_set_mesh(b, 4, m8);
  hir_set_mesh(c, 4, m8);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_scope_append(hir_program_body(p), hir_tv_definition(b));
  hir_scope_append(hir_program_body(p), hir_tv_definition(c));
  CHECK(hir_program_verify(p) == HIR_OK);
  CHECK(hir_pass_convert_communications(p) == HIR_OK);
  CHECK(hir_pass_insert_deallocations(p) == HIR_OK);
  CHECK(hir_pass_insert_deallocations(p) == HIR_OK); /* idempotent */
  CHECK(hir_program_verify(p) == HIR_OK);
  hir_program_snprint(p, buf, sizeof buf);
  CHECK_STR(buf,
            "\n%HostIrContainer { (T0_g_float[ideviceIdx.x0{i0}, iS1{i2}] (DeviceMesh{0 1 2 3})) -> "
            "(T2_g_float[iS4{i0}, iS5{i2}] (DeviceMesh{0 1 2 3})) :\n"
            "  T1_g_float[iS2{i0}, iS3{i2}] (DeviceMesh{0 1 2 3}) = ALLOCATE(buffer=T1_g_float[iS2{i0}, iS3{i2}] "
            "(DeviceMesh{0 1 2 3}), mem_type=global, size=( i0 * i2 ), zero_init=false, resets_to_zero=false)\n"
            "  Communication 3 (type=Allgather, team=(0 1 2 3), input=T0_g_float[ideviceIdx.x0{i0}, iS1{i2}] "
            "(DeviceMesh{0 1 2 3}), output=T1_g_float[iS2{i0}, iS3{i2}] (DeviceMesh{0 1 2 3}), backend=NCCL)\n"
            "  Wait Communication 3\n"
            "  T2_g_float[iS4{i0}, iS5{i2}] (DeviceMesh{0 1 2 3})\n"
            "     = T1_g_float[iS2{i0}, iS3{i2}] (DeviceMesh{0 1 2 3})\n"
            "     + T1_g_float[iS2{i0}, iS3{i2}] (DeviceMesh{0 1 2 3});\n"
            "  Deallocate {\n"
            "    T1_g_float[iS2{i0}, iS3{i2}] (DeviceMesh{0 1 2 3})\n"
            "  }\n"
            "} // %HostIrContainer\n\n");
  hir_program_free(p);
}

/* Malformed programs the verifier rejects, each with its reason. */
static void expect_verify_error(hir_program *p, const char *needle, int line) {
  if (hir_program_verify(p) != HIR_ERR_INVALID || !strstr(hir_program_error(p), needle)) {
    fprintf(stderr, "  test_lower.c:%d: verify said \"%s\"; wanted \"%s\"\n", line, hir_program_error(p), needle);
    hir_test_failures++;
  }
  hir_program_free(p);
}

TEST(test_verifier, "lower/verifier", TEST_CPU) {
  hir_program *p;
  hir_fusion *f;
  hir_tv *a, *b;
  hir_expr *comm, *loop;
  int team[2] = {0, 1};
#define VERIFY_SETUP()                 \
  p = hir_program_create();            \
  f = hir_program_fusion(p);           \
  a = hir_input(f, HIR_F32, 2);        \
  b = hir_set(f, a);                   \
  hir_output(f, b)
  VERIFY_SETUP();
  comm = hir_host_communication(p, HIR_COLL_ALLGATHER, 2, team, 0, a, b);
  hir_scope_append(hir_program_body(p), hir_host_wait(p, comm));
  hir_scope_append(hir_program_body(p), comm);
  expect_verify_error(p, "waits on Communication 1, which does not come before it: a Wait follows its communication in one "
                         "pass of the program", __LINE__);
  VERIFY_SETUP();
  {
    hir_tv *t = hir_set(f, a), *u = hir_set(f, t);
    hir_scope_append(hir_program_body(p), hir_tv_definition(t));
    hir_scope_append(hir_program_body(p), hir_host_deallocate(p, t));
    hir_scope_append(hir_program_body(p), hir_tv_definition(u));
    expect_verify_error(p, "reads T2 after its Deallocate", __LINE__);
  }
  VERIFY_SETUP();
  hir_scope_append(hir_program_body(p), hir_tv_definition(hir_set(f, hir_set(f, a))));
  expect_verify_error(p, "LoadStoreOp 2 reads T2 before anything defines or allocates it", __LINE__);
  VERIFY_SETUP();
  loop = hir_host_for_loop(p, b, 0);
  hir_scope_append(hir_expr_body(loop), hir_host_for_loop(p, b, 0));
  hir_scope_append(hir_program_body(p), loop);
  expect_verify_error(p, "over StreamIdx is nested in another", __LINE__);
  VERIFY_SETUP();
  hir_scope_append(hir_program_body(p), hir_host_start_coalescing(p));
  hir_scope_append(hir_program_body(p), hir_host_p2p(p, HIR_P2P_SEND, a, hir_val_const(f, 1)));
  expect_verify_error(p, "StartCoalescing without EndCoalescing", __LINE__);
  VERIFY_SETUP();
  hir_scope_append(hir_program_body(p), hir_host_start_coalescing(p));
  hir_scope_append(hir_program_body(p), hir_tv_definition(b));
  expect_verify_error(p, "stands between StartCoalescing and EndCoalescing", __LINE__);
  VERIFY_SETUP();
  hir_scope_append(hir_program_body(p), hir_host_deallocate(p, a));
  expect_verify_error(p, "releases T0, a program input", __LINE__);
  VERIFY_SETUP(); /* operands against the op table: only a hostir bug makes these, so reach into the expr */
  hir_scope_append(hir_program_body(p), hir_tv_definition(b));
  hir_tv_definition(b)->nin = 2;
  expect_verify_error(p, "LoadStoreOp 0 has 2 inputs and 1 outputs; a LoadStoreOp has 1 and 1", __LINE__);
  VERIFY_SETUP();
  hir_scope_append(hir_program_body(p), hir_tv_definition(b));
  hir_tv_definition(b)->in[0] = NULL;
  expect_verify_error(p, "LoadStoreOp 0 lacks its input 0", __LINE__);
  VERIFY_SETUP(); /* a collective whose tensors' dtypes went apart after it was built */
  comm = hir_host_communication(p, HIR_COLL_ALLGATHER, 2, team, 0, a, b);
  hir_scope_append(hir_program_body(p), comm);
  ((hir_tv *)hir_expr_output(comm, 0))->dtype = HIR_F64;
  expect_verify_error(p, "Communication 1 reads T0 (float) into T1 (double); its operands must share one dtype", __LINE__);
  VERIFY_SETUP(); /* a host matmul whose output lacks an axis */
  {
    hir_tv *m = hir_input(f, HIR_F32, 2), *o = hir_input(f, HIR_F32, 1);
    hir_scope_append(hir_program_body(p), hir_host_matmul(p, o, a, m));
    expect_verify_error(p, "MatmulOp 1: T0 x T2 (2 and 2 axes) makes 2 axes, but T3 has 1", __LINE__);
  }
  VERIFY_SETUP(); /* a host binary op of mixed ranks */
  {
    hir_tv *v1 = hir_input(f, HIR_F32, 1);
    hir_scope_append(hir_program_body(p), hir_host_binary(p, HIR_BINARY_ADD, b, a, v1));
    expect_verify_error(p, "BinaryOp 1: T0, T2 and T1 have 2, 1 and 2 axes", __LINE__);
  }
#undef VERIFY_SETUP
}

/* HOSTIR_DUMP=host_ir,passes with HOSTIR_DUMP_FILE. */
TEST(test_lower_dump, "lower/dump", TEST_CPU) {
  hir_fusion *f = cross_mesh_fusion();
  char path[] = "/tmp/hostir_dump_XXXXXX";
  char *text, *got;
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  setenv("HOSTIR_DUMP", "host_ir,passes", 1);
  setenv("HOSTIR_DUMP_FILE", path, 1);
  text = lower_text(f, NULL, 5);
  unsetenv("HOSTIR_DUMP");
  unsetenv("HOSTIR_DUMP_FILE");
  got = read_file(path);
  CHECK(got != NULL);
  if (got) {
    const char *last = strstr(got, "=== HOSTIR_DUMP host_ir (device 5) ===");
    CHECK(strstr(got, "=== HOSTIR_DUMP segmentation (device 5) ===") != NULL);
    CHECK(strstr(got, "=== HOSTIR_DUMP convert_communications (device 5) ===") != NULL);
    CHECK(strstr(got, "=== HOSTIR_DUMP insert_deallocations (device 5) ===") != NULL);
    CHECK(last != NULL && strcmp(last + strlen("=== HOSTIR_DUMP host_ir (device 5) ==="), text) == 0);
  }
  free(got);
  free(text);
  remove(path);
  { /* a file that cannot be written fails the lowering, by name: a missing directory, a link, a directory */
    static const char *const bad[][2] = {{"/nonexistent-hostir-dir/dump.txt", "No such file"},
                                         {"/tmp", "Is a directory"}, {NULL, "symbolic link"}};
    char link_path[64], target[64];
    hir_lower_desc desc;
    hir_program *p = NULL;
    int i;
    snprintf(link_path, sizeof link_path, "%s.link", path);
    snprintf(target, sizeof target, "%s.target", path); /* never to be written */
    CHECK(symlink(target, link_path) == 0);
    memset(&desc, 0, sizeof desc);
    desc.my_device = 5;
    setenv("HOSTIR_DUMP", "host_ir", 1);
    for (i = 0; i < 3; i++) {
      setenv("HOSTIR_DUMP_FILE", bad[i][0] ? bad[i][0] : link_path, 1);
      if (!(hir_lower(f, &desc, &p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "HOSTIR_DUMP_FILE") &&
            strstr(hir_program_error(p), bad[i][1]))) {
        fprintf(stderr, "  %s: %s\n", bad[i][1], hir_program_error(p));
        hir_test_failures++;
      }
      hir_program_free(p);
      p = NULL;
    }
    unsetenv("HOSTIR_DUMP");
    unsetenv("HOSTIR_DUMP_FILE");
    CHECK(access(target, F_OK) != 0);
    remove(link_path);
  }
  hir_fusion_free(f);
}

/* One fusion lowered for 8 devices from 8 threads at once gives the same
   programs as one after the other. */
typedef struct lower_job {
  const hir_fusion *f;
  int device;
  char *text;
} lower_job;

static void *lower_thread(void *arg) {
  lower_job *j = (lower_job *)arg;
  int k;
  for (k = 0; k < 20; k++) {
    free(j->text);
    j->text = lower_text(j->f, NULL, j->device);
  }
  return NULL;
}

TEST(test_lower_concurrent, "lower/concurrent", TEST_CPU) {
  hir_fusion *f = cross_mesh_fusion();
  pthread_t th[8];
  lower_job jobs[8];
  int i;
  for (i = 0; i < 8; i++) {
    jobs[i].f = f;
    jobs[i].device = i;
    jobs[i].text = NULL;
    CHECK(pthread_create(&th[i], NULL, lower_thread, &jobs[i]) == 0);
  }
  for (i = 0; i < 8; i++) pthread_join(th[i], NULL);
  for (i = 0; i < 8; i++) {
    char *serial = lower_text(f, NULL, i);
    CHECK(jobs[i].text && strcmp(jobs[i].text, serial) == 0);
    CHECK(strncmp(serial, "error", 5) != 0);
    free(serial);
    free(jobs[i].text);
  }
  hir_fusion_free(f);
}
