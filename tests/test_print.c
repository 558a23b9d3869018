/* The printer: hand-built host programs print byte-for-byte as the seeds'
   dumps (golden texts in tests/golden/), and host-builder misuse. */
#include "seeds.h"
#include "test.h"

static void check_program_golden(const hir_program *p, const char *name, int line) {
  size_t n = hir_program_snprint(p, NULL, 0);
  char *buf = (char *)malloc(n + 1);
  CHECK(hir_program_snprint(p, buf, n + 1) == n);
  if (hir_program_error(p)[0]) {
    fprintf(stderr, "  test_print.c:%d: program error: %s\n", line, hir_program_error(p));
    hir_test_failures++;
  }
  check_golden(buf, name, __FILE__, line);
  free(buf);
}
#define CHECK_GOLDEN(p, name) check_program_golden(p, name, __LINE__)

TEST(test_print_allgather_p2p, "print/allgather_p2p", TEST_CPU) {
  hir_program *p = prog_allgather_p2p(8, mesh8p);
  CHECK_GOLDEN(p, "allgather_p2p");
  CHECK(hir_program_ntop(p) == 4);
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 0)), "Allocate");
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 3)), "ForLoop");
  CHECK_STR(hir_expr_kind_name(hir_scope_at(hir_expr_else(hir_scope_at(hir_expr_body(hir_program_top(p, 3)), 2)), 1)),
            "P2PCommunication");
  hir_program_free(p);
}

TEST(test_print_ag_matmul_p2p, "print/ag_matmul_p2p", TEST_CPU) {
  hir_program *p = prog_ag_matmul_p2p(8, mesh8p);
  CHECK_GOLDEN(p, "ag_matmul_p2p");
  hir_program_free(p);
}

TEST(test_print_allgather_collective, "print/allgather_collective", TEST_CPU) {
  hir_program *p = prog_allgather_collective(8, mesh8p);
  CHECK_GOLDEN(p, "allgather_collective");
  hir_program_free(p);
}

TEST(test_print_post_on_stream, "print/post_on_stream", TEST_CPU) {
  hir_program *p = prog_post_on_stream(8, mesh8p);
  CHECK_GOLDEN(p, "post_on_stream");
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 0)), "PostOnStream");
  hir_program_free(p);
}

/* Roots print for rooted collectives; a program prints to a FILE the same. */
TEST(test_print_rooted_and_file, "print/rooted_and_file", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  int team[3] = {2, 0, 5};
  hir_tv *a = hir_input(f, HIR_F16, 2), *b = hir_set(f, a);
  char buf[4096], small[8];
  size_t n;
  FILE *tmp = tmpfile();
  hir_output(f, b);
  hir_scope_append(hir_program_body(p), hir_host_communication(p, HIR_COLL_BROADCAST, 3, team, 5, a, b));
  hir_scope_append(hir_program_body(p), hir_host_communication(p, HIR_COLL_ALLREDUCE, 3, team, 5, a, b));
  n = hir_program_snprint(p, buf, sizeof buf);
  CHECK_STR(buf, "\n%HostIrContainer { (T0_g___half[iS0{i0}, iS1{i2}]) -> (T1_g___half[iS2{i0}, iS3{i2}]) :\n"
                 "  Communication 1 (type=Broadcast, team=(2 0 5), root=5, input=T0_g___half[iS0{i0}, iS1{i2}], "
                 "output=T1_g___half[iS2{i0}, iS3{i2}], backend=NCCL)\n"
                 "  Communication 2 (type=Allreduce, team=(2 0 5), input=T0_g___half[iS0{i0}, iS1{i2}], "
                 "output=T1_g___half[iS2{i0}, iS3{i2}], backend=NCCL)\n"
                 "} // %HostIrContainer\n\n");
  /* snprintf semantics: the full length, a truncated NUL-terminated copy */
  CHECK(hir_program_snprint(p, small, sizeof small) == n);
  CHECK(strlen(small) == sizeof small - 1 && memcmp(small, buf, sizeof small - 1) == 0);
  if (tmp) {
    char *back = (char *)calloc(n + 1, 1);
    CHECK(hir_program_print(p, tmp) == HIR_OK);
    rewind(tmp);
    CHECK(fread(back, 1, n + 1, tmp) == n);
    CHECK_STR(back, buf);
    free(back);
    fclose(tmp);
  }
  hir_program_free(p);
}

TEST(test_print_fusion, "print/fusion", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 2), *c = hir_add(f, a, b);
  int axis = 1;
  char buf[2048];
  hir_output(f, hir_sum(f, c, 1, &axis));
  hir_fusion_snprint(f, buf, sizeof buf);
  CHECK_STR(buf, "Inputs:\n"
                 "  T0_g_float[iS0{i0}, iS1{i2}]\n"
                 "  T1_g_float[iS2{i3}, iS3{i4}]\n"
                 "Outputs:\n"
                 "  T3_g_float[iS6{i0}, rS7{i2}]\n"
                 "\n%kernel {\n"
                 "T2_g_float[iS4{i0}, iS5{i2}]\n"
                 "   = T0_g_float[iS0{i0}, iS1{i2}]\n"
                 "   + T1_g_float[iS2{i3}, iS3{i4}];\n"
                 "T3_g_float[iS6{i0}, rS7{i2}]\n"
                 "   = reduction( T2_g_float[iS4{i0}, iS5{i2}], op = add, initial value = 0, allreduce = false )\n"
                 "} // %kernel\n");
  hir_val_snprint(hir_val_binary(f, HIR_SCALAR_MUL, hir_tv_extent(a, 0), hir_val_const(f, 3)), buf, sizeof buf);
  CHECK_STR(buf, "( i0 * 3 )");
  hir_fusion_free(f);
}

/* Host-builder misuse: NULL, an error message naming the culprit. */
static void expect_host_error(hir_program *p, const void *result, const char *needle, int line) {
  if (result || !strstr(hir_program_error(p), needle)) {
    fprintf(stderr, "  test_print.c:%d: result %p, error \"%s\"; wanted NULL with \"%s\"\n", line, result,
            hir_program_error(p), needle);
    hir_test_failures++;
  }
}
#define HOST_ERROR(expr, needle)                        \
  do {                                                  \
    hir_program *p = hir_program_create();              \
    hir_fusion *f = hir_program_fusion(p);              \
    hir_tv *a = hir_input(f, HIR_F32, 2);               \
    hir_tv *b = hir_set(f, a);                          \
    int team[3] = {0, 1, 1};                            \
    (void)a; (void)b; (void)team;                       \
    expect_host_error(p, (expr), needle, __LINE__);     \
    hir_program_free(p);                                \
  } while (0)

TEST(test_host_misuse, "print/host_misuse", TEST_CPU) {
  HOST_ERROR(hir_host_wait(p, hir_host_allocate(p, a)), "hir_host_wait: that expr cannot be waited on");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_GATHER, 2, team, 3, a, b), "the root 3 of the Gather is not in its team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 3, team, 0, a, b), "device 1 appears twice in the team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 0, team, 0, a, b), "empty team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 2, team, 0, NULL, b), "the Allgather needs an input and an output tensor (in is NULL)");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_REDUCE, 2, team, 0, a, NULL), "the Reduce needs an input and an output tensor (out is NULL)");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_BROADCAST, 2, team, 0, a, hir_input(f, HIR_F64, 2)),
             "the Broadcast moves T0 (float) into T2 (double); a collective keeps the dtype");
  HOST_ERROR(hir_host_alias_select(p, a, 5, hir_val_const(f, 0)), "axis 5 is out of range for T0");
  HOST_ERROR(hir_host_alias_select(p, a, 0, NULL), "index is NULL");
  HOST_ERROR(hir_host_alias_slice(p, a, 0, hir_val_const(f, 0), 0), "parts is 0; cut into 1 or more parts");
  HOST_ERROR(hir_host_alias_slice(p, a, -3, hir_val_const(f, 0), 2), "axis -3 is out of range for T0");
  HOST_ERROR(hir_host_alias_slice(p, a, 1, NULL, 2), "hir_host_alias_slice: index is NULL");
  HOST_ERROR(hir_host_p2p(p, HIR_P2P_SEND, a, NULL), "peer is NULL");
  HOST_ERROR(hir_host_p2p(p, (hir_p2p_type)9, a, hir_val_const(f, 0)), "unknown type 9");
  HOST_ERROR(hir_host_for_loop(p, NULL, 0), "hir_host_for_loop: argument 'tv' is NULL");
  HOST_ERROR(hir_host_if(p, NULL), "predicate is NULL");
  HOST_ERROR(hir_host_get_current_stream(p, hir_stream_indexed(p, hir_val_const(f, 1))), "is a pool stream");
  HOST_ERROR(hir_host_set(p, b, hir_input(f, HIR_F64, 2)), "mixed dtypes");
  HOST_ERROR(hir_host_post_on_stream(p, 1, &a, 1, &a), "the unit computes nothing");
  HOST_ERROR(hir_host_post_on_stream(p, 0, NULL, 1, &b), "T0 is needed but is neither an input of the unit");
  {
    hir_program *p = hir_program_create(), *q = hir_program_create();
    hir_tv *a = hir_input(hir_program_fusion(p), HIR_F32, 2);
    hir_expr *e = hir_host_allocate(p, a);
    expect_host_error(q, hir_host_allocate(q, a), "belongs to another fusion or program", __LINE__);
    CHECK(hir_scope_append(hir_program_body(p), e) == HIR_OK);
    CHECK(hir_scope_append(hir_program_body(p), e) == HIR_ERR_INVALID);
    CHECK(strstr(hir_program_error(p), "Allocate 0 is already in a scope") != NULL);
    CHECK(strstr(hir_program_error(p), "make a second one") != NULL); /* what to write instead */
    hir_program_free(p);
    hir_program_free(q);
  }
  { /* an output only allocated, its defining op never placed: it would come back unwritten */
    hir_program *p = hir_program_create();
    hir_fusion *f = hir_program_fusion(p);
    hir_tv *x = hir_input(f, HIR_F32, 1), *y = hir_set(f, x);
    hir_output(f, y);
    CHECK(hir_scope_append(hir_program_body(p), hir_host_allocate(p, y)) == HIR_OK);
    CHECK(hir_program_verify(p) == HIR_ERR_INVALID && strstr(hir_program_error(p), "program output 0, is never written") != NULL);
    hir_program_free(p);
  }
  hir_fusion_free(hir_program_fusion(NULL)); /* harmless */
}
