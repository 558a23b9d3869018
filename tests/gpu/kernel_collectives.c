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
   element (AG: byte) off their alignment where `off`. */
typedef struct kc_op {
  int kind, off, ctas;             /* ctas: hir_nccl_comm_set_path's, 0: as measured */
  hir_dtype dt;
  size_t count, es, nin, nout;
  hir_nccl_path p;
  unsigned char *hin, *hout, *din, *dout;
} kc_op;

static int kc_op_make(kc_op *o, int kind, hir_dtype dt, size_t count, hir_nccl_path p, int off, int n) {
  memset(o, 0, sizeof *o);
  o->kind = kind, o->dt = dt, o->count = count, o->p = p, o->off = off;
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
/* This rank's input for `salt`, and its output poisoned (NaN, 0xff bytes). */
static void kc_op_fill(kc_op *o, int rank, unsigned salt) {
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
   bit), nothing written around it; else k->msg says where not. */
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
      want = (unsigned char)(kc_value(HIR_F32, (int)(i / o->count), i % o->count, salt) * 127 + 128);
      got = o->hout[o->off + i];
    } else {
      float sum = 0.f;
      size_t at = o->kind == KC_RS ? (size_t)rank * o->count + i : i;
      for (q = 0; q < k->n; q++) sum += kc_value(o->dt, q, at, salt); /* float, rank order: the kernels' sum */
      want = o->dt == HIR_F32 ? sum : o->dt == HIR_F16 ? hir_half_to_float(hir_float_to_half(sum)) : hir_bf16_to_float(hir_float_to_bf16(sum));
      got = kc_load(o->dt, o->hout + o->off * es, i);
    }
    ok = exact ? got == want : fabs(got - want) <= (o->dt == HIR_F32 ? 1e-5 : 2e-2) * k->n;
    if (!ok)
      snprintf(k->msg[rank], sizeof k->msg[rank], "%s %s of %zu (path %d, %d CTAs, %s): element %zu is %g, the reference %g",
               kinds[o->kind], hir_dtype_name(o->dt), o->count, (int)o->p, o->ctas, o->off ? "off alignment" : "aligned", i, got, want);
  }
  if (!ok && !k->msg[rank][0])
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s of %zu (path %d, off %d): a byte written outside its output", kinds[o->kind],
             o->count, (int)o->p, o->off);
  return ok;
}

static int kc_one(kc_case *k, int rank, hir_comm *c, void *team, cudaStream_t s, int kind, hir_dtype dt, size_t count,
                  hir_nccl_path p, int off, unsigned salt, int exact) {
  kc_op o;
  int ok = kc_op_make(&o, kind, dt, count, p, off, k->n);
  /* a forced kernel on 1 to all of HIR_NCCL__KC_CTAS CTAs, a different grid from call to call (the same on every rank) */
  o.ctas = p == HIR_NCCL_PATH_ONE_SHOT || p == HIR_NCCL_PATH_TWO_SHOT ? 1 + (int)(salt * 53u % HIR_NCCL__KC_CTAS) : 0;
  if (!ok) snprintf(k->msg[rank], sizeof k->msg[rank], "out of memory");
  if (ok) {
    kc_op_fill(&o, rank, salt);
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
  ok &= kc_op_make(&o[0], KC_AR, HIR_BF16, 1000, HIR_NCCL_PATH_ONE_SHOT, 1, k->n);
  ok &= kc_op_make(&o[1], KC_AR, HIR_BF16, 65537, HIR_NCCL_PATH_TWO_SHOT, 0, k->n);
  ok &= kc_op_make(&o[2], KC_RS, HIR_F16, 4097, HIR_NCCL_PATH_TWO_SHOT, 1, k->n);
  ok &= kc_op_make(&o[3], KC_AG, HIR_F32, 1001, HIR_NCCL_PATH_TWO_SHOT, 0, k->n);
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
      for (i = 0; i < 4; i++) kc_op_fill(&o[i], rank, 7000u + (unsigned)r + (unsigned)i);
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
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], (hir_nccl_path)p, off, salt++, 1);
          k->checked[rank]++;
        }
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_RS, dts[d], counts[z], HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_NCCL, off, salt++, 0);
        k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AR, dts[d], counts[z], HIR_NCCL_PATH_AUTO, off, salt++, 0);
        k->checked[rank] += 3;
        if (d == 0) {
          k->bad[rank] += !kc_one(k, rank, c, team, s, KC_AG, dts[d], counts[z] * 3, HIR_NCCL_PATH_TWO_SHOT, off, salt++, 1);
          k->checked[rank]++;
        }
        if (k->bad[rank]) goto out;
      }
  }
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
