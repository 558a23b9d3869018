/* make test-gpu, hostir's kernel collectives (hostir_nccl.h's nccl_kernels) against a plain reference,
   in graphs, and a peer that dies in one. Included by tests/gpu/main.c after the files before it. */
/* ---- hostir's kernel collectives (nccl_kernels) ----
   Every collective on its kernels, each dtype, counts from 1 element to past
   a call's slot (several calls), odd counts and buffers one element off
   their alignment, against a plain reference: each rank's input is a hash
   of (rank, element), so each rank computes every rank's, sums them in
   float in rank order (as the kernels do) and rounds once: the kernels'
   results must match it bit for bit, on every rank; NCCL's, run on the same
   inputs, within the dtype's rounding. */
static uint16_t kc_bits(hir_dtype dt, float v) { return dt == HIR_F16 ? hir_float_to_half(v) : hir_float_to_bf16(v); }
static float kc_value(hir_dtype dt, int rank, size_t i, unsigned salt) { /* random in [-1, 1), exact in dt */
  uint64_t h = ((uint64_t)rank * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ull) ^ ((uint64_t)salt << 40);
  float v;
  h ^= h >> 31, h *= 0x94d049bb133111ebull, h ^= h >> 29;
  v = (float)(h >> 40) / (float)(1ull << 24) * 2 - 1;
  return dt == HIR_F32 ? v : dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(v)) : hir_bf16_to_float(hir_float_to_bf16(v));
}
static void kc_store(hir_dtype dt, void *buf, size_t i, float v) {
  if (dt == HIR_F32) ((float *)buf)[i] = v;
  else ((uint16_t *)buf)[i] = kc_bits(dt, v);
}
static float kc_load(hir_dtype dt, const void *buf, size_t i) {
  return dt == HIR_F32 ? ((const float *)buf)[i] : dt == HIR_F16 ? hir_half_to_float(((const uint16_t *)buf)[i])
                                                                 : hir_bf16_to_float(((const uint16_t *)buf)[i]);
}

typedef struct kc_case {
  void *w;
  int n;
  int graph_replays;               /* > 0: one graph of the collectives, replayed this many times, inputs renewed */
  int bad[MAXR], checked[MAXR];
  char msg[MAXR][600];
} kc_case;

enum { KC_AR, KC_RS, KC_AG };

/* One collective on device buffers: `kind` of `count` (AR: elements; RS:
   elements a rank gets; AG: bytes a rank gives) on path p, its buffers one
   element (AG: byte) off their alignment where `off`, among the n world
   ranks `members` in team order, of which this is member `me`. */
typedef struct kc_op {
  int kind, off, ctas;             /* ctas: hir_nccl_comm_set_path's, 0: as measured */
  int n, me, members[MAXR];
  hir_dtype dt;
  size_t count, es, nin, nout;
  hir_nccl_path p;
  unsigned char *hin, *hout, *din, *dout;
} kc_op;

static int kc_op_make(kc_op *o, int kind, hir_dtype dt, size_t count, hir_nccl_path p, int off, int n, int me) {
  int q;
  memset(o, 0, sizeof *o);
  o->kind = kind, o->dt = dt, o->count = count, o->p = p, o->off = off, o->n = n, o->me = me;
  for (q = 0; q < n; q++) o->members[q] = q;
  o->es = kind == KC_AG ? 1 : hir_dtype_size(dt);
  o->nin = kind == KC_RS ? count * (size_t)n : count;
  o->nout = kind == KC_AG ? count * (size_t)n : count;
  return (o->hin = (unsigned char *)malloc(o->nin * o->es + 16)) && (o->hout = (unsigned char *)malloc(o->nout * o->es + 16)) &&
         cudaMalloc((void **)&o->din, o->nin * o->es + 16) == cudaSuccess && cudaMalloc((void **)&o->dout, o->nout * o->es + 16) == cudaSuccess;
}
static void kc_op_free(kc_op *o) {
  free(o->hin);
  free(o->hout);
  if (o->din) cudaFree(o->din);
  if (o->dout) cudaFree(o->dout);
}
/* This member's input for `salt` (a function of its world rank), and its output poisoned (NaN, 0xff bytes). */
static void kc_op_fill(kc_op *o, unsigned salt) {
  int rank = o->members[o->me];
  size_t i;
  for (i = 0; i < o->nin; i++)
    if (o->kind == KC_AG) o->hin[i] = (unsigned char)(kc_value(HIR_F32, rank, i, salt) * 127 + 128);
    else kc_store(o->dt, o->hin, i, kc_value(o->dt, rank, i, salt));
  cudaMemcpy(o->din + o->off * o->es, o->hin, o->nin * o->es, cudaMemcpyHostToDevice);
  cudaMemset(o->dout, 0xff, o->nout * o->es + 16);
  cudaDeviceSynchronize(); /* both ran on the legacy stream, which a nonblocking stream's collective does not wait for */
}
static hir_status kc_op_call(kc_op *o, hir_comm *c, void *team, cudaStream_t s) {
  hir_status st = hir_nccl_comm_set_path(c, o->p, o->ctas);
  unsigned char *in = o->din + o->off * o->es, *out = o->dout + o->off * o->es;
  if (st != HIR_OK) return st;
  return o->kind == KC_AR   ? c->allreduce(c, team, in, out, o->count, o->dt, s)
         : o->kind == KC_RS ? c->reduce_scatter(c, team, in, out, o->count, o->dt, s)
                            : c->allgather(c, team, in, out, o->count, s);
}
/* Whether the output is the reference's for `salt` (where `exact`, bit for
   bit), nothing written around it; else k->msg[rank] says where not. */
static int kc_op_check(kc_op *o, kc_case *k, int rank, unsigned salt, int exact) {
  static const char *const kinds[3] = {"all-reduce", "reduce-scatter", "all-gather"};
  size_t es = o->es, i;
  int ok = 1, q;
  cudaMemcpy(o->hout, o->dout, o->nout * es + 16, cudaMemcpyDeviceToHost);
  for (i = 0; i < o->off * es; i++) ok &= o->hout[i] == 0xff;
  for (i = (o->off + o->nout) * es; i < o->nout * es + 16; i++) ok &= o->hout[i] == 0xff;
  for (i = 0; i < o->nout && ok; i++) {
    double want, got;
    if (o->kind == KC_AG) {
      want = (unsigned char)(kc_value(HIR_F32, o->members[i / o->count], i % o->count, salt) * 127 + 128);
      got = o->hout[o->off + i];
    } else {
      float sum = 0.f;
      size_t at = o->kind == KC_RS ? (size_t)o->me * o->count + i : i;
      for (q = 0; q < o->n; q++) sum += kc_value(o->dt, o->members[q], at, salt); /* float, team order: the kernels' sum */
      want = o->dt == HIR_F32 ? sum : o->dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(sum)) : hir_bf16_to_float(hir_float_to_bf16(sum));
      got = kc_load(o->dt, o->hout + o->off * es, i);
    }
    ok = exact ? got == want : fabs(got - want) <= (o->dt == HIR_F32 ? 1e-5 : 2e-2) * o->n;
    if (!ok)
      snprintf(k->msg[rank], sizeof k->msg[rank], "%s %s of %zu (path %d, %d CTAs, %s): element %zu is %g, the reference %g",
               kinds[o->kind], hir_dtype_name(o->dt), o->count, (int)o->p, o->ctas, o->off ? "off alignment" : "aligned", i, got, want);
  }
  if (!ok && !k->msg[rank][0])
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s of %zu (path %d, off %d): a byte written outside its output", kinds[o->kind],
             o->count, (int)o->p, o->off);
  return ok;
}

/* Sets the op's team: the n world ranks `members` in team order, this rank among them. */
static void kc_op_team(kc_op *o, const int *members, int n, int rank) {
  int q;
  o->n = n;
  for (q = 0; q < n; q++) {
    o->members[q] = members[q];
    if (members[q] == rank) o->me = q;
  }
}

/* One call of the world's (members NULL) or of the team `members`. */
static int kc_one(kc_case *k, int rank, hir_comm *c, void *team, cudaStream_t s, int kind, hir_dtype dt, size_t count,
                  hir_nccl_path p, int off, unsigned salt, int exact, const int *members, int nmembers) {
  kc_op o;
  int ok = kc_op_make(&o, kind, dt, count, p, off, k->n, rank);
  if (members) kc_op_team(&o, members, nmembers, rank);
  /* a forced kernel on 1 to all of HIR_NCCL__KC_CTAS CTAs, a different grid from call to call (the same on every rank) */
  o.ctas = p == HIR_NCCL_PATH_ONE_SHOT || p == HIR_NCCL_PATH_TWO_SHOT ? 1 + (int)(salt * 53u % HIR_NCCL__KC_CTAS) : 0;
  if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "out of memory");
  if (ok) {
    kc_op_fill(&o, salt);
    if (kc_op_call(&o, c, team, s) != HIR_OK || cudaStreamSynchronize(s) != cudaSuccess || c->poll(c) != HIR_OK) {
      snprintf(k->msg[rank], sizeof k->msg[rank], "%s", c->error);
      ok = 0;
    }
  }
  ok = ok && kc_op_check(&o, k, rank, salt, exact);
  kc_op_free(&o);
  return ok;
}

/* Four collectives in one CUDA graph, replayed k->graph_replays times with
   no reset; every 100th replay on new inputs, checked. */
static int kc_graph(kc_case *k, int rank, hir_comm *c, void *team, cudaStream_t s) {
  kc_op o[4];
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  int i, r, ok = 1;
  ok &= kc_op_make(&o[0], KC_AR, HIR_BF16, 1000, HIR_NCCL_PATH_ONE_SHOT, 1, k->n, rank);
  ok &= kc_op_make(&o[1], KC_AR, HIR_BF16, 65537, HIR_NCCL_PATH_TWO_SHOT, 0, k->n, rank);
  ok &= kc_op_make(&o[2], KC_RS, HIR_F16, 4097, HIR_NCCL_PATH_TWO_SHOT, 1, k->n, rank);
  ok &= kc_op_make(&o[3], KC_AG, HIR_F32, 1001, HIR_NCCL_PATH_TWO_SHOT, 0, k->n, rank);
  o[1].ctas = HIR_NCCL__KC_CTAS, o[2].ctas = 3; /* caps: as measured, all (the grid its size asks), 3, as measured */
  if (ok) {
    hir_status st = HIR_OK;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (i = 0; i < 4 && st == HIR_OK; i++) st = kc_op_call(&o[i], c, team, s);
    ok = cudaStreamEndCapture(s, &g) == cudaSuccess && st == HIR_OK && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
    if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "capture: %s %s", c->error, cudaGetErrorString(cudaGetLastError()));
  }
  for (r = 0; ok && r < k->graph_replays; r++) {
    if (r % 100 == 0)
      for (i = 0; i < 4; i++) kc_op_fill(&o[i], 7000u + (unsigned)r + (unsigned)i);
    ok = cudaGraphLaunch(exec, s) == cudaSuccess;
    if (r % 100 == 0 || r == k->graph_replays - 1) {
      ok = ok && cudaStreamSynchronize(s) == cudaSuccess && c->poll(c) == HIR_OK;
      for (i = 0; ok && i < 4; i++) ok = kc_op_check(&o[i], k, rank, 7000u + (unsigned)(r / 100 * 100) + (unsigned)i, 1);
      if (!ok && !k->msg[rank][0]) snprintf(k->msg[rank], sizeof k->msg[rank], "replay %d: %s", r, c->error);
      k->checked[rank] += ok;
    }
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  for (i = 0; i < 4; i++) kc_op_free(&o[i]);
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_AUTO, 0);
  return ok;
}

/* The choice of paths as the tuner saves it (collective_choice) and takes
   it back (set_collective_choice): the same text again, an all-NCCL choice
   that the paths then follow, refusals that change nothing, and the
   measured choice restored. Every rank the same steps, before any call. */
static int kc_choice(kc_case *k, int rank, hir_comm *c, void *team) {
  char text[1024], again[1024], nccl[1024], bad[1100], before[160];
  size_t n = c->collective_choice(c, text, sizeof text);
  int ok = n > 0 && n < sizeof text && !strncmp(text, "kc1 ", 4), r, z, at;
  const char *why = "the text";
  snprintf(before, sizeof before, "%s", c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16));
  for (r = 0, at = snprintf(nccl, sizeof nccl, "kc1 %d", k->n); r < 3; r++)
    for (z = 0, at += snprintf(nccl + at, sizeof nccl - (size_t)at, " | %s", r == 0 ? "ar" : r == 1 ? "rs" : "ag"); z < 11; z++)
      at += snprintf(nccl + at, sizeof nccl - (size_t)at, " nccl");
  if (ok && (why = "taken back", c->set_collective_choice(c, text) != HIR_OK || c->collective_choice(c, again, sizeof again) != n ||
             strcmp(text, again) || !strstr(hir_nccl_comm_describe(c), "as saved with the tuner's plans")))
    ok = 0;
  if (ok && (why = "all NCCL", c->set_collective_choice(c, nccl) != HIR_OK ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), "NCCL") ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLGATHER, 4096, HIR_F32), "NCCL")))
    ok = 0;
  snprintf(bad, sizeof bad, "kc1 %d%s", k->n + 1, strstr(nccl, " |"));
  if (ok && (why = "another world size", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "made for")))
    ok = 0;
  snprintf(bad, sizeof bad, "kc1 %d | ar k/32%s", k->n, strstr(nccl, " | ar nccl") + 10);
  if (ok && (why = "a kernel the row lacks", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "names no path")))
    ok = 0;
  snprintf(bad, sizeof bad, "%.*s", (int)(strstr(nccl, " | ag") - nccl), nccl);
  if (ok && (why = "a row missing", c->set_collective_choice(c, bad) != HIR_ERR_INVALID || !strstr(c->error, "lacks its '| ag' row") ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), "NCCL")))
    ok = 0;
  if (ok && (why = "restored", c->set_collective_choice(c, text) != HIR_OK ||
             strcmp(c->collective_path(c, team, HIR_COLL_ALLREDUCE, (size_t)1 << 20, HIR_BF16), before)))
    ok = 0;
  if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "collective choice (%s): '%.250s': %.250s", why, text, c->error);
  return ok;
}

/* Teams other than the world: the even ranks and the odd ranks, each in
   descending order (2 ranks: the world reversed), so that a member's place
   in its team is not its rank. A team of 2 or more must take the kernels
   where a path forces them (its own workspace), and sum in team order. */
static void kc_teams(kc_case *k, int rank, hir_comm *c, cudaStream_t s, unsigned salt) {
  static const size_t counts[3] = {13, 4097, 65537};
  int members[MAXR], n = 0, q, z, off, p;
  void *team;
  for (q = k->n - 1; q >= 0; q--)
    if (q % 2 == rank % 2 || k->n == 2) members[n++] = q;
  if (c->team(c, members, n, &team) != HIR_OK) {
    snprintf(k->msg[rank], sizeof k->msg[rank], "team: %s", c->error);
    k->bad[rank]++;
    return;
  }
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_TWO_SHOT, 0);
  if (n > 1 && !strstr(c->collective_path(c, team, HIR_COLL_ALLREDUCE, 4096, HIR_BF16), "two-shot kernel")) {
    snprintf(k->msg[rank], sizeof k->msg[rank], "a team of %d on the two-shot path: %s", n,
             c->collective_path(c, team, HIR_COLL_ALLREDUCE, 4096, HIR_BF16));
    k->bad[rank]++;
    return;
  }
  for (z = 0; z < 3; z++)
    for (off = 0; off < 2; off++) {
      for (p = HIR_NCCL_PATH_AUTO; p <= HIR_NCCL_PATH_TWO_SHOT; p++) {
        int exact = p != HIR_NCCL_PATH_AUTO && p != HIR_NCCL_PATH_NCCL;
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, HIR_BF16, counts[z], (hir_nccl_path)p, off, salt++, exact, members, n);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, HIR_F32, counts[z], (hir_nccl_path)p, off, salt++, exact, members, n);
        k->checked[rank] += 2;
      }
      k->bad[rank] += !kc_one(k, rank, c, team, s, KC_RS, HIR_BF16, counts[z], HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1, members, n);
      k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AG, HIR_F32, counts[z], HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1, members, n);
      k->checked[rank] += 2;
      if (k->bad[rank]) return;
    }
}

static hir_status kc_rank(int rank, void *user) {
  kc_case *k = (kc_case *)user;
  hir_comm *c = platform->comm(k->w, rank);
  static const hir_dtype dts[3] = {HIR_F32, HIR_F16, HIR_BF16};
  size_t counts[8] = {1, 3, 8, 13, 1000, 4097, 65537, 0};
  int world[MAXR], i, d, z, p, off, device = platform->run == mp_run ? mp_env.gpu : rank;
  void *team;
  cudaStream_t s;
  unsigned salt = 1;
  cudaSetDevice(device);
  for (i = 0; i < k->n; i++) world[i] = i;
  if (c->team(c, world, k->n, &team) != HIR_OK || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s", c->error);
    k->bad[rank]++;
    return HIR_ERR_COMM;
  }
  if (k->graph_replays) {
    k->bad[rank] += !kc_graph(k, rank, c, team, s);
    goto out;
  }
  if (!kc_choice(k, rank, c, team)) {
    k->bad[rank]++;
    goto out;
  }
  for (d = 0; d < 3; d++) {
    counts[7] = ((size_t)32 << 20) / hir_dtype_size(dts[d]) + 1001; /* past a call's slot, one shot and two */
    for (z = 0; z < (d == 2 ? 8 : 7); z++)                          /* bf16 only there (the host's reference is slow) */
      for (off = 0; off < (z == 7 ? 1 : 2); off++) {
        for (p = HIR_NCCL_PATH_ONE_SHOT; p <= HIR_NCCL_PATH_TWO_SHOT; p++) {
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], (hir_nccl_path)p, off, salt++, 1, NULL, 0);
          k->checked[rank]++;
        }
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_RS, dts[d], counts[z], HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1, NULL, 0);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_NCCL, off, salt++, 0, NULL, 0);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_AUTO, off, salt++, 0, NULL, 0);
        k->checked[rank] += 3;
        if (d == 0) {
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AG, dts[d], counts[z] * 3, HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1, NULL, 0);
          k->checked[rank]++;
        }
        if (k->bad[rank]) goto out;
      }
  }
  kc_teams(k, rank, c, s, salt);
out:
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_AUTO, 0);
  cudaStreamDestroy(s);
  return k->bad[rank] ? HIR_ERR_COMM : HIR_OK;
}

static int kc_nccl_platform(void) { return !platform->graph && (platform->world_create == gpu_world_create || platform->run == mp_run); }

/* Each world size of threads (2 to the GPUs), or the launcher's processes. */
static void kc_worlds(int replays) {
  int n, r;
  if (!kc_nccl_platform()) return;
  for (n = platform->run == mp_run ? mp_env.size : 2; n <= (platform->run == mp_run ? mp_env.size : platform->max_world); n++) {
    kc_case k;
    hir_comm *c0;
    memset(&k, 0, sizeof k);
    k.n = n;
    k.graph_replays = replays;
    if (!(k.w = platform->world_create(n))) {
      CHECK(!"a world");
      return;
    }
    c0 = platform->comm(k.w, platform->run == mp_run ? mp_env.rank : 0);
    if (strstr(hir_nccl_comm_describe(c0), "on NCCL: ")) {
      printf("  (%d ranks: no kernel collectives: %s)\n", n, hir_nccl_comm_describe(c0));
      continue;
    }
    if (!replays) printf("  %d ranks: %s\n", n, strstr(hir_nccl_comm_describe(c0), "collectives by size"));
    CHECK(strstr(hir_nccl_comm_describe(c0), "collectives by size, as measured at creation: all-reduce: ") != NULL ||
          strstr(hir_nccl_comm_describe(c0), "collectives by size, as saved with the tuner's plans: all-reduce: ") != NULL);
    platform->run(n, kc_rank, &k);
    for (r = 0; r < n; r++) {
      if (platform->run == mp_run && r != mp_env.rank) continue;
      if (k.msg[r][0]) fprintf(stderr, "  %d ranks, rank %d: %s\n", n, r, k.msg[r]);
      CHECK(k.bad[r] == 0);
      CHECK(k.checked[r] >= (replays ? replays / 100 + 1 : 190));
    }
  }
}

TEST(test_gpu_kernel_collectives, "gpu/kernel_collectives", TEST_GPU_WORLDS) { kc_worlds(0); }
TEST(test_gpu_kernel_collectives_graph, "gpu/kernel_collectives_graph", TEST_GPU_WORLDS) { kc_worlds(1000); }

/* A peer that gives up while a kernel collective waits for it: rank 1
   aborts 300 ms in; rank 0's kernel quits (the host's stop word) and its
   poll names rank 1's failure within a second. A world of its own. */
typedef struct kc_dead { hir_nccl_world *w; hir_status status; double ms; int ended; char msg[512]; } kc_dead;
static hir_status kc_dead_rank(int rank, void *user) {
  kc_dead *x = (kc_dead *)user;
  hir_comm *c = hir_nccl_world_comm(x->w, rank);
  int world[2] = {0, 1};
  void *team, *buf;
  cudaStream_t s;
  double t0;
  cudaSetDevice(rank);
  if (c->team(c, world, 2, &team) != HIR_OK) return HIR_ERR_COMM;
  if (rank == 1) {
    struct timespec nap = {0, 300000000};
    nanosleep(&nap, NULL);
    snprintf(c->error, sizeof c->error, "rank 1 gives up (a test)");
    c->abort(c);
    return HIR_OK;
  }
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&buf, 4 << 20);
  cudaMemset(buf, 0, 4 << 20);
  hir_nccl_comm_set_path(c, HIR_NCCL_PATH_TWO_SHOT, 0);
  t0 = hir__now_ms();
  x->status = c->allreduce(c, team, buf, buf, 1 << 20, HIR_BF16, s);
  while (x->status == HIR_OK && cudaStreamQuery(s) == cudaErrorNotReady && hir__now_ms() - t0 < 5000) x->status = c->poll(c);
  x->ms = hir__now_ms() - t0;
  while (cudaStreamQuery(s) == cudaErrorNotReady && hir__now_ms() - t0 < 7000) {}
  x->ended = cudaStreamQuery(s) == cudaSuccess;
  snprintf(x->msg, sizeof x->msg, "%s", c->error);
  cudaFree(buf);
  cudaStreamDestroy(s);
  return HIR_OK;
}

TEST(test_gpu_kernel_collective_dead_peer, "gpu/kernel_collective_dead_peer", TEST_GPU_THREADS) {
  kc_dead x;
  if (platform->max_world < 2) return;
  memset(&x, 0, sizeof x);
  if (hir_nccl_world_create(2, &x.w) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(x.w));
    CHECK(!"a world of 2");
  } else if (strstr(hir_nccl_comm_describe(hir_nccl_world_comm(x.w, 0)), "on NCCL: ")) {
    printf("  (no kernel collectives: %s)\n", hir_nccl_comm_describe(hir_nccl_world_comm(x.w, 0)));
  } else {
    hir_spmd(2, kc_dead_rank, &x);
    if (x.status != HIR_ERR_COMM || !strstr(x.msg, "rank 1 gives up")) fprintf(stderr, "  rank 0: %s: %s\n", hir_status_str(x.status), x.msg);
    CHECK(x.status == HIR_ERR_COMM);
    CHECK(strstr(x.msg, "rank 1 gives up") != NULL);
    CHECK(x.ms < 1500);
    CHECK(x.ended); /* the kernel quit: its GPU is free */
  }
  hir_nccl_world_free(x.w);
}

/* A peer that never comes: rank 1 leaves at once (replay = 0), or after two
   runs as a CUDA graph on NCCL (eager, captured: replay = 1); rank 0's next
   allgather (a graph replay) must end in a timeout or a communication error
   within its deadline, not hang. replay = 2: no peer dies; both ranks run
   twice as a graph (an allgather) and call exit() with the evaluator,
   backend and communicator alive, as a user's process may: it must end
   with status 0, not crash in its teardown. replay = 3: both ranks run once
   (eager); rank 1 leaves a second later, while rank 0's second run waits
   for it on the GPU; rank 0 then passes a new shape, so that, behind that
   stuck work, it frees the old plan's buffers and the ranks meet: the run
   must end within its deadline all the same. */
static int dead_peer(int replay) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F32, 2), *b = hir_set(f, a);
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor in, out;
  int64_t sz[2] = {1, 1 << 20};
  hir_status s;
  double t0, dt;
  int mesh[2] = {0, 1}, ok;
  hir_output(f, b);
  hir_set_mesh(a, 2, mesh);
  hir_set_mesh(b, 2, mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = mp_env.rank;
  ed.comm = mp_comm;
  ed.backend = hir_backend_cuda_create(mp_env.gpu);
  ed.timeout_ms = 3000;
  ed.graph = replay == 1 || replay == 2;
  if (replay == 1 && hir_nccl_comm_set_copy_engine(mp_comm, 0) != HIR_OK) return 0;
  if (hir_lower(f, &ld, &p) != HIR_OK || hir_evaluator_create(p, &ed, &ev) != HIR_OK) {
    printf("rank%d: setup failed: %s\n", mp_env.rank, ev ? hir_evaluator_error(ev) : hir_program_error(p));
    return 0;
  }
  in = tn(HIR_F32, 2, sz);
  memset(&out, 0, sizeof out);
  { hir_tensor d = to_backend(ed.backend, &in), small = d;
    int run;
    for (run = 0; replay && run < (replay == 3 ? 1 : 2); run++) /* eager, then captured and launched: both ranks */
      if (hir_run(ev, &d, 1, &out, 1) != HIR_OK || hir_evaluator_sync(ev) != HIR_OK) {
        printf("rank%d: run %d failed: %s\n", mp_env.rank, run, hir_evaluator_error(ev));
        return 0;
      }
    if (replay == 2) {
      printf("rank%d: ran twice as a graph, calling exit() with everything alive\n", mp_env.rank);
      fflush(stdout);
      exit(0);
    }
    if (replay && mp_env.rank == 1) {
      printf("rank1: ran %s, leaving\n", replay == 3 ? "once, and a second later" : "twice as a graph");
      fflush(stdout);
      if (replay == 3) hir_nccl__sleep_ms(1000);
      _exit(0);
    }
    if (replay == 3) {
      s = hir_run(ev, &d, 1, &out, 1); /* rank 1 never runs it: its allgather waits on the GPU */
      printf("rank0: the second run, which rank 1 skips: %s\n", hir_status_str(s));
      small.sizes[1] /= 2; /* a new shape: the ranks meet */
    } else if (replay) {
      hir_nccl__sleep_ms(300); /* rank 1 is gone */
    }
    t0 = hir__now_ms();
    s = hir_run(ev, &small, 1, &out, 1);
    if (s == HIR_OK) s = hir_evaluator_sync(ev);
    dt = hir__now_ms() - t0;
    ok = (s == HIR_ERR_TIMEOUT || s == HIR_ERR_COMM) && dt < 20000;
    printf("rank0: dead peer%s: %s after %.0f ms: %s\n",
           replay == 3 ? " behind a run it skipped" : replay ? " during a graph replay" : "", hir_status_str(s), dt,
           hir_evaluator_error(ev));
    fflush(stdout); /* said before the frees: cudaFree waits for the device */
    backend_free(ed.backend, &in, &d); }
  tfree(&in);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(f);
  return ok;
}

/* ---- the kernels alone, every rank on one GPU ----
   NCCL refuses two ranks on one GPU, but the kernels need no NCCL: a
   workspace a rank on one GPU, each rank's calls on a stream of its own,
   all launched from this thread, as hir_nccl__team_kc sets a team up (the
   first rank's kernels, borrowed by the others). The grids are capped so
   that every rank's kernel is resident at once, since each waits for the
   others'. Times mean nothing here; the protocol, the sums, the sequence
   across graph replays and the deadlines are the ones of many GPUs. */
typedef struct kc1_world {
  int n, members[MAXR];           /* world ranks in team order */
  hir_nccl__kc kc[MAXR];
  cudaStream_t s[MAXR];
} kc1_world;
typedef struct kc1_host {         /* the host's words the kernels read and write (mapped host memory) */
  unsigned *words, *words_dev;    /* [0]: stop; [1 + r]: rank r's error */
  int cap;                        /* the most CTAs a call may take with every rank's kernel resident */
  char err[300];
} kc1_host;

static void kc1_free(kc1_world *w) {
  int i;
  for (i = w->n - 1; i >= 0; i--) { /* the first owns the library */
    if (w->s[i]) cudaStreamDestroy(w->s[i]);
    hir_nccl__kc_free(&w->kc[i]);
  }
  memset(w, 0, sizeof *w);
}

/* n ranks (`members`, NULL: 0..n-1) on GPU 0, on the kernels of `lib`
   (NULL: its first rank loads them). */
static int kc1_make(kc1_world *w, kc1_host *h, int n, const int *members, const hir_nccl__kc *lib) {
  int i, j, ok = 1;
  memset(w, 0, sizeof *w);
  w->n = n;
  for (i = 0; i < n; i++) w->members[i] = members ? members[i] : i;
  for (i = 0; i < n && ok; i++) {
    ok = (!i && !lib ? hir_nccl__kc_prepare(&w->kc[i], 0, h->err, sizeof h->err)
                     : hir_nccl__kc_borrow(&w->kc[i], lib ? lib : &w->kc[0], h->err, sizeof h->err)) &&
         cudaStreamCreateWithFlags(&w->s[i], cudaStreamNonBlocking) == cudaSuccess;
    w->kc[i].stop = h->words_dev;
    w->kc[i].error = h->words_dev + 1 + w->members[i];
  }
  for (i = 0; i < n && ok; i++) {
    w->kc[i].n = n, w->kc[i].me = i, w->kc[i].on = 1;
    for (j = 0; j < n; j++) w->kc[i].ws[j] = w->kc[j].mine;
  }
  if (!ok) kc1_free(w);
  return ok;
}

/* Rank i's call of op o on its stream: `two`, the all-reduce's two shots. */
static hir_status kc1_call(kc1_world *w, kc1_host *h, int i, kc_op *o, int two, unsigned long long timeout_ns) {
  unsigned char *in = o->din + o->off * o->es, *out = o->dout + o->off * o->es;
  return o->kind == KC_AR ? hir_nccl__kc_allreduce(&w->kc[i], two, o->ctas, in, out, o->count, o->dt, timeout_ns, w->s[i], h->err, sizeof h->err)
         : o->kind == KC_RS ? hir_nccl__kc_reduce_scatter(&w->kc[i], o->ctas, in, out, o->count, o->dt, timeout_ns, w->s[i], h->err, sizeof h->err)
                            : hir_nccl__kc_allgather(&w->kc[i], o->ctas, in, out, o->count, timeout_ns, w->s[i], h->err, sizeof h->err);
}

/* One collective on every rank of each of the `nw` worlds at once (teams
   side by side), checked bit for bit against the reference; 1: right. */
static int kc1_case(kc1_world **ws, int nw, kc1_host *h, kc_case *k, int kind, hir_dtype dt, size_t count, int two, int off, int ctas,
                    unsigned salt) {
  kc_op o[2][MAXR];
  int a, i, ok = 1;
  memset(o, 0, sizeof o);
  for (a = 0; a < nw; a++)
    for (i = 0; i < ws[a]->n && ok; i++) {
      ok = kc_op_make(&o[a][i], kind, dt, count, HIR_NCCL_PATH_TWO_SHOT, off, ws[a]->n, i);
      kc_op_team(&o[a][i], ws[a]->members, ws[a]->n, ws[a]->members[i]);
      o[a][i].ctas = ctas;
      if (ok) kc_op_fill(&o[a][i], salt + (unsigned)a);
    }
  for (a = 0; a < nw && ok; a++)
    for (i = 0; i < ws[a]->n && ok; i++) ok = kc1_call(ws[a], h, i, &o[a][i], two, 10000000000ull) == HIR_OK;
  for (a = 0; a < nw; a++)
    for (i = 0; i < ws[a]->n; i++) ok &= cudaStreamSynchronize(ws[a]->s[i]) == cudaSuccess && h->words[1 + ws[a]->members[i]] == 0;
  if (!ok) snprintf(k->msg[0], sizeof k->msg[0], "%s %s of %zu on %d CTAs: %s", kind == KC_AR ? two ? "two-shot" : "one-shot" : kind == KC_RS ? "reduce-scatter" : "all-gather",
                    hir_dtype_name(dt), count, ctas, h->err[0] ? h->err : "a kernel failed or gave up");
  for (a = 0; a < nw; a++)
    for (i = 0; i < ws[a]->n; i++) {
      if (ok) ok = kc_op_check(&o[a][i], k, 0, salt + (unsigned)a, 1);
      kc_op_free(&o[a][i]);
    }
  return ok;
}

/* Three collectives captured in a graph a rank, the graphs replayed
   together `replays` times with no reset, new inputs every 100th. */
static int kc1_graph(kc1_world *w, kc1_host *h, kc_case *k, int replays) {
  cudaGraph_t g[MAXR];
  cudaGraphExec_t exec[MAXR];
  kc_op o[MAXR][3];
  int i, j, r, ok = 1;
  memset(g, 0, sizeof g), memset(exec, 0, sizeof exec), memset(o, 0, sizeof o);
  for (i = 0; i < w->n && ok; i++) {
    ok = kc_op_make(&o[i][0], KC_AR, HIR_BF16, 1000, HIR_NCCL_PATH_ONE_SHOT, 1, w->n, i) &&
         kc_op_make(&o[i][1], KC_AR, HIR_BF16, 65537, HIR_NCCL_PATH_TWO_SHOT, 0, w->n, i) &&
         kc_op_make(&o[i][2], KC_AG, HIR_F32, 1001, HIR_NCCL_PATH_TWO_SHOT, 1, w->n, i);
    for (j = 0; j < 3; j++) o[i][j].ctas = h->cap - j;
    ok = ok && cudaStreamBeginCapture(w->s[i], cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (j = 0; j < 3 && ok; j++) ok = kc1_call(w, h, i, &o[i][j], j == 1, 10000000000ull) == HIR_OK;
    ok = cudaStreamEndCapture(w->s[i], &g[i]) == cudaSuccess && ok && cudaGraphInstantiate(&exec[i], g[i], 0) == cudaSuccess;
  }
  if (!ok) snprintf(k->msg[0], sizeof k->msg[0], "capture: %s %s", h->err, cudaGetErrorString(cudaGetLastError()));
  for (r = 0; ok && r < replays; r++) {
    if (r % 100 == 0)
      for (i = 0; i < w->n; i++)
        for (j = 0; j < 3; j++) kc_op_fill(&o[i][j], 9000u + (unsigned)r + (unsigned)j);
    for (i = 0; i < w->n && ok; i++) ok = cudaGraphLaunch(exec[i], w->s[i]) == cudaSuccess;
    if (r % 100 == 0 || r == replays - 1) {
      for (i = 0; i < w->n; i++) ok &= cudaStreamSynchronize(w->s[i]) == cudaSuccess && h->words[1 + i] == 0;
      for (i = 0; i < w->n; i++)
        for (j = 0; j < 3 && ok; j++) ok = kc_op_check(&o[i][j], k, 0, 9000u + (unsigned)(r / 100 * 100) + (unsigned)j, 1);
      if (!ok && !k->msg[0][0]) snprintf(k->msg[0], sizeof k->msg[0], "replay %d: a kernel failed or gave up", r);
      k->checked[0] += ok;
    }
  }
  for (i = 0; i < w->n; i++) {
    if (exec[i]) cudaGraphExecDestroy(exec[i]);
    if (g[i]) cudaGraphDestroy(g[i]);
    for (j = 0; j < 3; j++) kc_op_free(&o[i][j]);
  }
  return ok;
}

/* Every rank but the last calls; with `stop` the host's stop word rises
   50 ms in, else the deadline (100 ms) passes: every caller's kernel must
   end, its error word saying which (2 stopped, 1 its deadline). */
static int kc1_gone(kc1_world *w, kc1_host *h, kc_case *k, int stop) {
  kc_op o[MAXR];
  double t0;
  int i, ok = 1;
  memset(o, 0, sizeof o);
  for (i = 0; i < w->n - 1 && ok; i++) {
    ok = kc_op_make(&o[i], KC_AR, HIR_BF16, 65537, HIR_NCCL_PATH_TWO_SHOT, 0, w->n, i);
    o[i].ctas = h->cap;
    if (ok) kc_op_fill(&o[i], 1u);
  }
  t0 = hir__now_ms();
  for (i = 0; i < w->n - 1 && ok; i++) ok = kc1_call(w, h, i, &o[i], 1, stop ? 20000000000ull : 100000000ull) == HIR_OK;
  if (stop) {
    hir_nccl__sleep_ms(50);
    __atomic_store_n(&h->words[0], 1u, __ATOMIC_RELEASE);
  }
  for (i = 0; i < w->n - 1 && ok; i++) {
    while (cudaStreamQuery(w->s[i]) == cudaErrorNotReady && hir__now_ms() - t0 < 5000) hir_nccl__sleep_ms(1);
    ok = cudaStreamQuery(w->s[i]) == cudaSuccess && h->words[1 + i] == (stop ? 2u : 1u);
  }
  if (!ok)
    snprintf(k->msg[0], sizeof k->msg[0], "%d ranks, the last absent, %s: a kernel did not end as it should (rank 0's word %u, %.0f ms)",
             w->n, stop ? "the stop word raised" : "the deadline", h->words[1], hir__now_ms() - t0);
  for (i = 0; i < w->n - 1; i++) kc_op_free(&o[i]);
  memset(h->words, 0, (1 + MAXR) * sizeof *h->words);
  return ok;
}

/* The all-reduce with the rms_norm after it (hir_nccl__kc_allreduce_rms) on
   every rank at once: rows x cols of each rank's input, one residual and
   one weight (or none) for all; h checked bit for bit (the float sum in
   rank order rounded, plus the residual rounded), out against the norm of
   that h in double, within the dtype's rounding. 1: right. */
static int kc1_rms(kc1_world *w, kc1_host *h, kc_case *k, hir_dtype dt, size_t rows, size_t cols, int two, int ctas, int weighted,
                   unsigned salt) {
  size_t es = hir_dtype_size(dt), n = rows * cols, i, r, c;
  unsigned char *host = (unsigned char *)malloc((4 * n + cols) * es), *din[MAXR], *dh[MAXR], *dout[MAXR], *dres, *dw;
  unsigned char *hres = host, *hw = host + n * es, *hin = hw + cols * es, *got = hin + n * es;
  double *want_h = (double *)malloc(n * sizeof(double));
  int q, ok = host && want_h, bad = 0;
  memset(din, 0, sizeof din), memset(dh, 0, sizeof dh), memset(dout, 0, sizeof dout);
  dres = dw = NULL;
  ok = ok && cudaMalloc((void **)&dres, n * es) == cudaSuccess && cudaMalloc((void **)&dw, cols * es) == cudaSuccess;
  for (i = 0; ok && i < n; i++) kc_store(dt, hres, i, kc_value(dt, 100, i, salt));
  for (i = 0; ok && i < cols; i++) kc_store(dt, hw, i, kc_value(dt, 101, i, salt));
  ok = ok && cudaMemcpy(dres, hres, n * es, cudaMemcpyHostToDevice) == cudaSuccess && cudaMemcpy(dw, hw, cols * es, cudaMemcpyHostToDevice) == cudaSuccess;
  for (q = 0; ok && q < w->n; q++) {
    for (i = 0; i < n; i++) kc_store(dt, hin, i, kc_value(dt, w->members[q], i, salt));
    ok = cudaMalloc((void **)&din[q], n * es) == cudaSuccess && cudaMalloc((void **)&dh[q], n * es) == cudaSuccess &&
         cudaMalloc((void **)&dout[q], n * es) == cudaSuccess && cudaMemcpy(din[q], hin, n * es, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(dh[q], 0xff, n * es) == cudaSuccess && cudaMemset(dout[q], 0xff, n * es) == cudaSuccess;
  }
  for (q = 0; ok && q < w->n; q++)
    ok = hir_nccl__kc_allreduce_rms(&w->kc[q], two, ctas, din[q], dres, weighted ? dw : NULL, dh[q], dout[q], rows, cols, dt, 1e-6,
                                    10000000000ull, w->s[q], h->err, sizeof h->err) == HIR_OK;
  for (q = 0; q < w->n; q++) ok &= cudaStreamSynchronize(w->s[q]) == cudaSuccess && h->words[1 + w->members[q]] == 0;
  for (i = 0; ok && i < n; i++) { /* h, as the ops apart round it */
    float sum = 0.f;
    for (q = 0; q < w->n; q++) sum += kc_value(dt, w->members[q], i, salt);
    sum = dt == HIR_F32 ? sum : dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(sum)) : hir_bf16_to_float(hir_float_to_bf16(sum));
    sum += kc_value(dt, 100, i, salt);
    want_h[i] = dt == HIR_F32 ? sum : dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(sum)) : hir_bf16_to_float(hir_float_to_bf16(sum));
  }
  for (q = 0; ok && q < w->n && !bad; q++) {
    ok = cudaMemcpy(got, dh[q], n * es, cudaMemcpyDeviceToHost) == cudaSuccess && cudaMemcpy(got + n * es, dout[q], n * es, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (r = 0; ok && r < rows && !bad; r++) {
      double ms = 0;
      for (c = 0; c < cols; c++) ms += want_h[r * cols + c] * want_h[r * cols + c] / (double)cols;
      for (c = 0; c < cols && !bad; c++) {
        double hv = kc_load(dt, got, r * cols + c), ov = kc_load(dt, got + n * es, r * cols + c);
        double want_o = want_h[r * cols + c] / sqrt(ms + 1e-6) * (weighted ? kc_value(dt, 101, c, salt) : 1);
        if (hv != want_h[r * cols + c] || !(fabs(ov - want_o) <= (dt == HIR_F32 ? 1e-5 : 1e-2) * (1 + fabs(want_o)))) {
          snprintf(k->msg[0], sizeof k->msg[0], "%s-shot all-reduce + rms_norm %s of %zu x %zu on %d CTAs, rank %d, row %zu col %zu: h %g (want %g), out %g (want %g)",
                   two ? "two" : "one", hir_dtype_name(dt), rows, cols, ctas, q, r, c, hv, want_h[r * cols + c], ov, want_o);
          bad = 1;
        }
      }
    }
  }
  if (!ok && !k->msg[0][0]) snprintf(k->msg[0], sizeof k->msg[0], "all-reduce + rms_norm %s of %zu x %zu: %s", hir_dtype_name(dt), rows, cols,
                                     h->err[0] ? h->err : "a kernel failed or gave up");
  for (q = 0; q < w->n; q++) cudaFree(din[q]), cudaFree(dh[q]), cudaFree(dout[q]);
  cudaFree(dres), cudaFree(dw);
  free(host), free(want_h);
  return ok && !bad;
}

TEST(test_gpu_kernel_collectives_one_gpu, "gpu/kernel_collectives_one_gpu", TEST_GPU) {
  static const hir_dtype dts[3] = {HIR_F32, HIR_F16, HIR_BF16};
  size_t counts[8] = {1, 3, 8, 13, 1000, 4097, 65537, 0};
  kc1_host h;
  kc_case k;
  kc1_world world, even, odd, *both[2];
  int n, d, z, off, sms = 0, cases = 0, bad = 0;
  const int even_members[2] = {2, 0}, odd_members[2] = {3, 1};
  unsigned salt = 1;
  memset(&h, 0, sizeof h);
  memset(&k, 0, sizeof k);
  cudaSetDevice(0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  h.cap = sms / 4 < HIR_NCCL__KC_CTAS ? sms / 4 : HIR_NCCL__KC_CTAS; /* four ranks' kernels at once, a CTA an SM at least */
  if (cudaHostAlloc((void **)&h.words, (1 + MAXR) * sizeof *h.words, cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer((void **)&h.words_dev, h.words, 0) != cudaSuccess) {
    CHECK(!"mapped host words");
    return;
  }
  memset(h.words, 0, (1 + MAXR) * sizeof *h.words);
  for (n = 2; n <= 4 && !bad; n++) {
    if (!kc1_make(&world, &h, n, NULL, NULL)) {
      fprintf(stderr, "  %s\n", h.err);
      CHECK(!"a world of kernels on one GPU");
      break;
    }
    both[0] = &world;
    k.n = n;
    for (d = 0; d < 3 && !bad; d++) {
      counts[7] = ((size_t)32 << 20) / hir_dtype_size(dts[d]) + 1001; /* past a call's slot, one shot and two */
      for (z = 0; z < (d == 2 ? 8 : 7) && !bad; z++)
        for (off = 0; off < 2 && !bad; off++, salt += 4) {
          int ctas = 1 + (int)(salt * 53u % (unsigned)h.cap);
          bad += !kc1_case(both, 1, &h, &k, KC_AR, dts[d], counts[z], 0, off, ctas, salt);
          bad += !kc1_case(both, 1, &h, &k, KC_AR, dts[d], counts[z], 1, off, ctas, salt + 1);
          bad += !kc1_case(both, 1, &h, &k, KC_RS, dts[d], counts[z], 1, off, ctas, salt + 2);
          if (d == 0) bad += !kc1_case(both, 1, &h, &k, KC_AG, dts[d], counts[z] * 3, 1, off, ctas, salt + 3);
          cases += d == 0 ? 4 : 3;
        }
    }
    if (!bad) bad += !kc1_graph(&world, &h, &k, 1000);
    { /* the all-reduce with the rms_norm after it: rows fewer than the ranks, odd, and past a call's slots */
      static const size_t shapes[4][2] = {{1, 8}, {5, 24}, {33, 4096}, {0, 8192}};
      int sh, two;
      for (d = 0; d < 3 && !bad; d++)
        for (sh = 0; sh < 4 && !bad; sh++)
          for (two = 0; two < 2 && !bad; two++, salt++, cases++) {
            size_t cols = shapes[sh][1] / (dts[d] == HIR_F32 ? 2 : 1), rows = shapes[sh][0] ? shapes[sh][0] : ((size_t)20 << 20) / (cols * hir_dtype_size(dts[d])) + 3;
            if (!shapes[sh][0] && dts[d] != HIR_BF16) continue; /* the host's reference is slow */
            bad += !kc1_rms(&world, &h, &k, dts[d], rows, cols, two, 1 + (int)(salt * 29u % (unsigned)h.cap), (int)(salt & 1), salt);
          }
    }
    if (n == 4 && !bad) { /* teams beside the world: workspaces of their own, summed in team order */
      if (!kc1_make(&even, &h, 2, even_members, &world.kc[0]) || !kc1_make(&odd, &h, 2, odd_members, &world.kc[0])) {
        fprintf(stderr, "  %s\n", h.err);
        CHECK(!"two teams of kernels on one GPU");
      } else {
        both[0] = &even, both[1] = &odd;
        for (z = 3; z < 7 && !bad; z++, salt += 4, cases += 3) {
          bad += !kc1_case(both, 2, &h, &k, KC_AR, HIR_BF16, counts[z], 1, 1, h.cap, salt);
          bad += !kc1_case(both, 2, &h, &k, KC_RS, HIR_F32, counts[z], 1, 0, 7, salt + 1);
          both[0] = &world; /* the world and a team at once: six kernels */
          bad += !kc1_case(both, 2, &h, &k, KC_AR, HIR_F16, counts[z], 0, 0, h.cap * 2 / 3, salt + 2);
          both[0] = &even;
        }
      }
      kc1_free(&odd);
      kc1_free(&even);
    }
    kc1_free(&world);
  }
  if (bad) fprintf(stderr, "  %s\n", k.msg[0]);
  CHECK(bad == 0);
  printf("  %d collectives on 2-4 ranks of one GPU, %d graph checks, %d CTAs at most\n", cases, k.checked[0], h.cap);
  for (n = 0; n < 2 && !bad; n++) { /* a rank that never comes: the deadline, then the stop word */
    CHECK(kc1_make(&world, &h, 3, NULL, NULL));
    if (world.n) CHECK(kc1_gone(&world, &h, &k, n));
    if (k.msg[0][0]) fprintf(stderr, "  %s\n", k.msg[0]);
    kc1_free(&world); /* its workspaces are left mid-call: never used again */
  }
  cudaFreeHost(h.words);
}
