/* The printer: hand-built host programs print byte-for-byte as the seeds'
   dumps (golden texts in tests/golden/), and host-builder misuse. */
#include "seeds.h"
#include "test.h"

static char *read_file(const char *path) {
  FILE *fp = fopen(path, "rb");
  char *buf;
  long n;
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  buf = (char *)malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) n = 0;
  if (buf) buf[n] = '\0';
  fclose(fp);
  return buf;
}

/* Compares with tests/golden/<name>.txt; reports the first differing line.
   HIR_UPDATE_GOLDENS=1 rewrites the file instead (review the diff). */
static void check_golden(const char *got, const char *name, int line) {
  char path[512];
  char *want;
  const char *g, *w;
  int lineno = 1;
  snprintf(path, sizeof path, "%s/golden/%s.txt", HIR_TEST_DIR, name);
  if (getenv("HIR_UPDATE_GOLDENS")) {
    FILE *fp = fopen(path, "w");
    if (!fp || fputs(got, fp) < 0) hir_test_failures++;
    if (fp) fclose(fp);
    return;
  }
  want = read_file(path);
  if (!want) {
    fprintf(stderr, "  test_print.c:%d: cannot read %s\n", line, path);
    hir_test_failures++;
    return;
  }
  for (g = got, w = want; *g && *g == *w; g++, w++)
    if (*g == '\n') lineno++;
  if (*g || *w) {
    const char *gl = g, *wl = w;
    while (gl > got && gl[-1] != '\n') gl--;
    while (wl > want && wl[-1] != '\n') wl--;
    fprintf(stderr, "  test_print.c:%d: %s differs at line %d\n  got:  %.*s\n  want: %.*s\n", line, path, lineno,
            (int)strcspn(gl, "\n"), gl, (int)strcspn(wl, "\n"), wl);
    hir_test_failures++;
  }
  free(want);
}

static void check_program_golden(const hir_program *p, const char *name, int line) {
  size_t n = hir_program_snprint(p, NULL, 0);
  char *buf = (char *)malloc(n + 1);
  CHECK(hir_program_snprint(p, buf, n + 1) == n);
  if (hir_program_error(p)[0]) {
    fprintf(stderr, "  test_print.c:%d: program error: %s\n", line, hir_program_error(p));
    hir_test_failures++;
  }
  check_golden(buf, name, line);
  free(buf);
}
#define CHECK_GOLDEN(p, name) check_program_golden(p, name, __LINE__)

/* The stream scaffolding of DESIGN.md §5, built by hand. */
typedef struct streams {
  hir_program *p;
  hir_stream *caller, *pool;
  hir_val *idx;
} streams;

static streams stream_prologue(hir_program *p, hir_tv *loop_tv) {
  hir_fusion *f = hir_program_fusion(p);
  hir_scope *top = hir_program_body(p);
  hir_expr *sync;
  streams s;
  s.p = p;
  s.caller = hir_stream_new(p);
  s.idx = hir_val_named(f, HIR_NAMED_STREAM_IDX);
  s.pool = hir_stream_indexed(p, hir_val_binary(f, HIR_SCALAR_MOD, s.idx, hir_val_named(f, HIR_NAMED_NUM_STREAMS)));
  hir_scope_append(top, hir_host_get_current_stream(p, s.caller));
  sync = hir_host_for_loop(p, loop_tv, 0);
  hir_scope_append(hir_expr_body(sync), hir_host_set_current_stream(p, s.pool));
  hir_scope_append(hir_expr_body(sync), hir_host_synchronize(p, s.caller));
  hir_scope_append(top, sync);
  return s;
}

static hir_expr *loop_begin(streams *s, hir_tv *loop_tv) {
  hir_expr *loop = hir_host_for_loop(s->p, loop_tv, 0);
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(s->p, s->pool));
  return loop;
}

static void loop_end(streams *s, hir_expr *loop) {
  hir_scope_append(hir_expr_body(loop), hir_host_set_current_stream(s->p, s->caller));
  hir_scope_append(hir_expr_body(loop), hir_host_synchronize(s->p, s->pool));
  hir_scope_append(hir_program_body(s->p), loop);
}

static hir_tv *view(hir_expr *select) { return hir_expr_output(select, 0); }

/* IF (i == rank) copy my shard ELSE coalesced recv from / send to peer i. */
static hir_expr *p2p_exchange(streams *s, hir_tv *in, hir_tv *out_slice, hir_expr *in_slice) {
  hir_program *p = s->p;
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *ite = hir_host_if(p, hir_val_binary(f, HIR_SCALAR_EQ, s->idx, hir_val_named(f, HIR_NAMED_RANK)));
  hir_expr *end;
  hir_scope_append(hir_expr_body(ite), in_slice);
  hir_scope_append(hir_expr_body(ite), hir_host_set(p, out_slice, view(in_slice)));
  hir_scope_append(hir_expr_else(ite), hir_host_start_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_RECV, out_slice, s->idx));
  hir_scope_append(hir_expr_else(ite), hir_host_p2p(p, HIR_P2P_SEND, in, s->idx));
  hir_scope_append(hir_expr_else(ite), end = hir_host_end_coalescing(p));
  hir_scope_append(hir_expr_else(ite), hir_host_wait(p, end));
  return ite;
}

static const int mesh8p[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/* Seed 003, AllgatherP2p, as lowered by nvFuser. */
static hir_program *prog_allgather_p2p(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *out_slice;
  streams s;
  seed sd;
  seed_allgather_p2p(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[1]));
  s = stream_prologue(p, sd.t[1]);
  loop = loop_begin(&s, sd.t[1]);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, hir_val_const(f, 0));
  out_slice = hir_host_alias_select(p, sd.t[1], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), p2p_exchange(&s, sd.t[0], view(out_slice), in_slice));
  loop_end(&s, loop);
  return p;
}

/* Seed 003, AG_matmul_P2p: the gathered T3 feeds a matmul per chunk. */
static hir_program *prog_ag_matmul_p2p(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *buf_slice, *out_slice;
  hir_tv *gathered;
  streams s;
  seed sd;
  seed_ag_matmul_p2p(&sd, f, D, mesh);
  gathered = hir_set(f, sd.t[0]);
  hir_set_mesh(gathered, D, mesh);
  hir_parallelize(gathered, 0, HIR_STREAM);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, gathered));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[2]));
  s = stream_prologue(p, gathered);
  loop = loop_begin(&s, gathered);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, hir_val_const(f, 0));
  buf_slice = hir_host_alias_select(p, gathered, 0, s.idx);
  hir_scope_append(hir_expr_body(loop), buf_slice);
  hir_scope_append(hir_expr_body(loop), p2p_exchange(&s, sd.t[0], view(buf_slice), in_slice));
  out_slice = hir_host_alias_select(p, sd.t[2], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), hir_host_matmul(p, view(out_slice), view(buf_slice), sd.t[1]));
  loop_end(&s, loop);
  return p;
}

/* Seed 004, Allgather: a collective per chunk. */
static hir_program *prog_allgather_collective(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *in_slice, *out_slice, *comm;
  streams s;
  seed sd;
  seed_allgather(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[1]));
  s = stream_prologue(p, sd.t[1]);
  loop = loop_begin(&s, sd.t[1]);
  in_slice = hir_host_alias_select(p, sd.t[0], 0, s.idx);
  out_slice = hir_host_alias_select(p, sd.t[1], 0, s.idx);
  hir_scope_append(hir_expr_body(loop), in_slice);
  hir_scope_append(hir_expr_body(loop), out_slice);
  hir_scope_append(hir_expr_body(loop), hir_host_allocate(p, view(out_slice)));
  comm = hir_host_communication(p, HIR_COLL_ALLGATHER, D, mesh, 0, view(in_slice), view(out_slice));
  hir_scope_append(hir_expr_body(loop), comm);
  hir_scope_append(hir_expr_body(loop), hir_host_wait(p, comm));
  loop_end(&s, loop);
  (void)f;
  return p;
}

/* Seed 004, matmul_RS_through_bcast: a PostOnStream of a broadcast HostUnit,
   a matmul and a ReduceScatter per chunk, then Deallocates. */
static hir_program *prog_post_on_stream(int D, const int *mesh) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  hir_expr *loop, *a, *b, *mm, *rs_out, *comm;
  streams s;
  seed sd;
  seed_matmul_rs_through_bcast(&sd, f, D, mesh);
  hir_scope_append(hir_program_body(p), hir_host_post_on_stream(p, 1, &sd.t[1], 1, &sd.t[2]));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[3]));
  hir_scope_append(hir_program_body(p), hir_host_allocate(p, sd.t[4]));
  s = stream_prologue(p, sd.t[3]);
  loop = loop_begin(&s, sd.t[3]);
  hir_scope_append(hir_expr_body(loop), a = hir_host_alias_select(p, sd.t[0], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), b = hir_host_alias_select(p, sd.t[2], 0, hir_val_const(f, 0)));
  hir_scope_append(hir_expr_body(loop), mm = hir_host_alias_select(p, sd.t[3], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), hir_host_matmul(p, view(mm), view(a), view(b)));
  hir_scope_append(hir_expr_body(loop), rs_out = hir_host_alias_select(p, sd.t[4], 0, s.idx));
  hir_scope_append(hir_expr_body(loop), hir_host_allocate(p, view(rs_out)));
  comm = hir_host_communication(p, HIR_COLL_REDUCESCATTER, D, mesh, 0, view(mm), view(rs_out));
  hir_scope_append(hir_expr_body(loop), comm);
  hir_scope_append(hir_expr_body(loop), hir_host_wait(p, comm));
  loop_end(&s, loop);
  hir_scope_append(hir_program_body(p), hir_host_deallocate(p, sd.t[2]));
  hir_scope_append(hir_program_body(p), hir_host_deallocate(p, sd.t[3]));
  return p;
}

static void test_print_allgather_p2p(void) {
  hir_program *p = prog_allgather_p2p(8, mesh8p);
  CHECK_GOLDEN(p, "allgather_p2p");
  CHECK(hir_program_ntop(p) == 4);
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 0)), "Allocate");
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 3)), "ForLoop");
  CHECK_STR(hir_expr_kind_name(hir_scope_at(hir_expr_else(hir_scope_at(hir_expr_body(hir_program_top(p, 3)), 2)), 1)),
            "P2PCommunication");
  hir_program_free(p);
}

static void test_print_ag_matmul_p2p(void) {
  hir_program *p = prog_ag_matmul_p2p(8, mesh8p);
  CHECK_GOLDEN(p, "ag_matmul_p2p");
  hir_program_free(p);
}

static void test_print_allgather_collective(void) {
  hir_program *p = prog_allgather_collective(8, mesh8p);
  CHECK_GOLDEN(p, "allgather_collective");
  hir_program_free(p);
}

static void test_print_post_on_stream(void) {
  hir_program *p = prog_post_on_stream(8, mesh8p);
  CHECK_GOLDEN(p, "post_on_stream");
  CHECK_STR(hir_expr_kind_name(hir_program_top(p, 0)), "PostOnStream");
  hir_program_free(p);
}

/* Roots print for rooted collectives; a program prints to a FILE the same. */
static void test_print_rooted_and_file(void) {
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

static void test_print_fusion(void) {
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

static void test_host_misuse(void) {
  HOST_ERROR(hir_host_wait(p, hir_host_allocate(p, a)), "hir_host_wait: that expr cannot be waited on");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_GATHER, 2, team, 3, a, b), "the root 3 of the Gather is not in its team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 3, team, 0, a, b), "device 1 appears twice in the team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 0, team, 0, a, b), "empty team");
  HOST_ERROR(hir_host_communication(p, HIR_COLL_ALLGATHER, 2, team, 0, NULL, NULL), "neither an input nor an output");
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
    hir_program_free(p);
    hir_program_free(q);
  }
  hir_fusion_free(hir_program_fusion(NULL)); /* harmless */
}

#define PRINT_TESTS                                                          \
  {"print/allgather_p2p", test_print_allgather_p2p},                        \
  {"print/ag_matmul_p2p", test_print_ag_matmul_p2p},                        \
  {"print/allgather_collective", test_print_allgather_collective},          \
  {"print/post_on_stream", test_print_post_on_stream},                      \
  {"print/rooted_and_file", test_print_rooted_and_file},                    \
  {"print/fusion", test_print_fusion},                                      \
  {"print/host_misuse", test_host_misuse},
