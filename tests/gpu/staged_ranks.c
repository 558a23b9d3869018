/* make test-gpu, ranks as threads on one GPU, their messages staged through host memory; the
   differential check on them and on NCCL worlds. Included by tests/gpu/main.c after the files before
   it. */
/* ---- ranks as threads on one GPU, their messages through host memory ----
   NCCL refuses two ranks on one GPU; the local world moves host memory.
   This joins them: a rank's communicator stages each message through the
   host (the data read after its stream's work, written back on its
   stream) and hands it to the local world. Slow, but every multi-rank
   program then runs on the CUDA backend on a one-GPU machine: its kernels,
   streams and events around the collectives, the staging of strided ones,
   the stream pipelines' sends and receives. */
#define STAGED_OPS 256
typedef struct staged_comm {
  hir_comm comm;                /* first: the evaluator's handle */
  hir_comm *local;              /* the local world's rank */
  int grouping, nops;
  struct { void *host, *dev, *stream; size_t bytes; } ops[STAGED_OPS];   /* a group's: receives have dev */
} staged_comm;

static int staged_fail(hir_comm *c, const char *what, cudaError_t e) {
  snprintf(c->error, sizeof c->error, "staged comm: rank %d: %s: %s", c->rank, what, cudaGetErrorString(e));
  return 0;
}

/* A host copy of `bytes` at dev once the stream's work is done (NULL for no data); 0 on failure. */
static int staged_in(hir_comm *c, const void *dev, size_t bytes, void *stream, void **host) {
  cudaError_t e;
  *host = NULL;
  if (!dev || !bytes) return 1;
  if (!(*host = malloc(bytes))) return staged_fail(c, "malloc", cudaErrorMemoryAllocation);
  if ((e = cudaMemcpyAsync(*host, dev, bytes, cudaMemcpyDefault, (cudaStream_t)stream)) != cudaSuccess ||
      (e = cudaStreamSynchronize((cudaStream_t)stream)) != cudaSuccess)
    return staged_fail(c, "reading a message", e);
  return 1;
}

/* Writes host back to dev on the stream (a pageable copy: host is free to go once it returns). */
static int staged_out(hir_comm *c, void *dev, const void *host, size_t bytes, void *stream) {
  cudaError_t e;
  if (!dev || !host || !bytes) return 1;
  if ((e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDefault, (cudaStream_t)stream)) != cudaSuccess)
    return staged_fail(c, "writing a message", e);
  return 1;
}

/* A collective's two halves around the local world's op on host memory:
   the send side staged in and room for the receive side (in, out: their
   bytes, 0 for none here); then the receive side staged out. */
static hir_status staged_begin(hir_comm *c, const void *send, size_t in, void *recv, size_t out, void *stream, void **hs,
                               void **hr) {
  hir_comm *l = ((staged_comm *)c)->local;
  l->what = c->what;
  l->error[0] = '\0'; /* set again only by the op */
  *hr = NULL;
  if (!staged_in(c, send, in, stream, hs)) return HIR_ERR_BACKEND;
  if (recv && out && !(*hr = calloc(1, out))) return staged_fail(c, "calloc", cudaErrorMemoryAllocation), HIR_ERR_BACKEND;
  return HIR_OK;
}
static hir_status staged_end(hir_comm *c, hir_status s, void *recv, size_t out, void *stream, void *hs, void *hr) {
  hir_comm *l = ((staged_comm *)c)->local;
  if (s != HIR_OK && l->error[0]) snprintf(c->error, sizeof c->error, "%s", l->error);
  else if (s == HIR_OK && !staged_out(c, recv, hr, out, stream)) s = HIR_ERR_BACKEND;
  free(hs);
  free(hr);
  return s;
}

static size_t staged_team_size(void *team) { return (size_t)((hir__lw_team *)team)->n; }

static hir_status staged_team(hir_comm *c, const int *devices, int n, void **team) {
  hir_comm *l = ((staged_comm *)c)->local;
  hir_status s = l->team(l, devices, n, team);
  if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", l->error);
  return s;
}
static hir_status staged_allgather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t out = bytes * staged_team_size(t);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->allgather(l, t, hs, hr, bytes, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_allreduce(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->allreduce(l, t, hs, hr, count, dt, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_reduce_scatter(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt);
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes * staged_team_size(t), r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->reduce_scatter(l, t, hs, hr, count, dt, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_reduce(hir_comm *c, void *t, const void *s, void *r, size_t count, hir_dtype dt, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t bytes = count * hir_dtype_size(dt), out = c->rank == root ? bytes : 0;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->reduce(l, t, hs, hr, count, dt, root, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_broadcast(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, c->rank == root ? bytes : 0, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->broadcast(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}
static hir_status staged_gather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  size_t chunks = staged_team_size(t) - (s ? 0 : 1), out = c->rank == root ? bytes * chunks : 0; /* a root without data: the others' */
  void *hs, *hr;
  hir_status e = staged_begin(c, s, bytes, r, out, st, &hs, &hr);
  if (e == HIR_OK) e = l->gather(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, out, st, hs, hr);
}
static hir_status staged_scatter(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  hir_comm *l = ((staged_comm *)c)->local;
  void *hs, *hr;
  hir_status e = staged_begin(c, s, c->rank == root ? bytes * staged_team_size(t) : 0, r, bytes, st, &hs, &hr);
  if (e == HIR_OK) e = l->scatter(l, t, hs, hr, bytes, root, NULL);
  return staged_end(c, e, r, bytes, st, hs, hr);
}

static hir_status staged_group_start(hir_comm *c) {
  staged_comm *sc = (staged_comm *)c;
  if (!sc->grouping++) sc->nops = 0;
  return sc->local->group_start(sc->local);
}

/* The group's messages move at its end; then its receives are written back
   and every staged copy freed. */
static hir_status staged_group_end(hir_comm *c) {
  staged_comm *sc = (staged_comm *)c;
  hir_status s = sc->local->group_end(sc->local);
  int i;
  if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", sc->local->error);
  if (sc->grouping > 0 && --sc->grouping) return s;
  for (i = 0; i < sc->nops; i++) {
    if (s == HIR_OK && sc->ops[i].dev && !staged_out(c, sc->ops[i].dev, sc->ops[i].host, sc->ops[i].bytes, sc->ops[i].stream))
      s = HIR_ERR_BACKEND;
    free(sc->ops[i].host);
  }
  sc->nops = 0;
  return s;
}

/* A send or receive: queued in a group (one of its own outside one). */
static hir_status staged_p2p(hir_comm *c, int is_send, void *buf, size_t bytes, int peer, void *stream) {
  staged_comm *sc = (staged_comm *)c;
  hir_status s, end;
  void *host = NULL;
  if ((s = staged_group_start(c)) != HIR_OK) return s;
  if (sc->nops == STAGED_OPS) {
    snprintf(c->error, sizeof c->error, "staged comm: more than %d sends and receives in a group", STAGED_OPS);
    s = HIR_ERR_UNSUPPORTED;
  } else if (is_send ? !staged_in(c, buf, bytes, stream, &host) : !(host = malloc(bytes ? bytes : 1))) {
    free(host);
    s = HIR_ERR_BACKEND;
  } else { /* freed at the group's end */
    sc->ops[sc->nops].host = host;
    sc->ops[sc->nops].dev = is_send ? NULL : buf;
    sc->ops[sc->nops].stream = stream;
    sc->ops[sc->nops++].bytes = bytes;
    sc->local->what = c->what;
    s = is_send ? sc->local->send(sc->local, host, bytes, peer, NULL) : sc->local->recv(sc->local, host, bytes, peer, NULL);
    if (s != HIR_OK) snprintf(c->error, sizeof c->error, "%s", sc->local->error);
  }
  end = staged_group_end(c);
  return s != HIR_OK ? s : end;
}
static hir_status staged_send(hir_comm *c, const void *buf, size_t bytes, int peer, void *stream) {
  return staged_p2p(c, 1, (void *)buf, bytes, peer, stream);
}
static hir_status staged_recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  return staged_p2p(c, 0, buf, bytes, peer, stream);
}
static void staged_abort(hir_comm *c) {
  hir_comm *l = ((staged_comm *)c)->local;
  snprintf(l->error, sizeof l->error, "%s", c->error);
  l->abort(l);
}

static void staged_init(staged_comm *sc, hir_comm *local) {
  memset(sc, 0, sizeof *sc);
  sc->local = local;
  sc->comm.rank = local->rank;
  sc->comm.size = local->size;
  sc->comm.needs_device_memory = 1;
  sc->comm.what.tensor = -1;
  sc->comm.team = staged_team;
  sc->comm.allgather = staged_allgather;
  sc->comm.allreduce = staged_allreduce;
  sc->comm.reduce_scatter = staged_reduce_scatter;
  sc->comm.reduce = staged_reduce;
  sc->comm.broadcast = staged_broadcast;
  sc->comm.gather = staged_gather;
  sc->comm.scatter = staged_scatter;
  sc->comm.send = staged_send;
  sc->comm.recv = staged_recv;
  sc->comm.group_start = staged_group_start;
  sc->comm.group_end = staged_group_end;
  sc->comm.abort = staged_abort;
}

/* The platform: a world of n ranks, all on GPU 0. */
typedef struct staged_world {
  hir_local_world *local;
  staged_comm comms[MAXR];
} staged_world;

static void *staged_world_create(int n) {
  staged_world *sw = (staged_world *)calloc(1, sizeof *sw);
  int r;
  if (!sw || !(sw->local = hir_local_world_create(n))) {
    free(sw);
    return NULL;
  }
  hir_local_world_set_timeout(sw->local, 20000);
  for (r = 0; r < n; r++) staged_init(&sw->comms[r], hir_local_comm(sw->local, r));
  return sw;
}
static void staged_world_free(void *w) {
  if (w) hir_local_world_free(((staged_world *)w)->local);
  free(w);
}
static hir_comm *staged_world_comm(void *w, int rank) { return &((staged_world *)w)->comms[rank].comm; }
static hir_backend *staged_backend(int rank) {
  (void)rank;
  return hir_backend_cuda_create(0);
}
static test_platform staged_ranks = {"cuda, ranks as threads on GPU 0, messages staged through the host", 2, MAXR,
                                     staged_world_create, staged_world_free, staged_world_comm, staged_backend, hir_spmd, 0, 0};

/* diff_target's comm: the rank's staged communicator over the local world's rank. */
static hir_comm *staged_comm_of(diff_target *t, hir_comm *local, int rank) {
  staged_comm *sc = &((staged_comm *)t->ctx)[rank];
  staged_init(sc, local);
  return &sc->comm;
}

/* The differential check's programs of 2-4 ranks on the platform above: a
   CUDA backend a rank. HIR_DIFF_RANKS_PROGRAMS: how many seeds (4,000). */
TEST(test_diff_ranks_one_gpu, "diff/random_programs_ranks", TEST_GPU_WORLDS) {
  const char *n_env = getenv("HIR_DIFF_RANKS_PROGRAMS");
  static staged_comm comms[4];
  diff_target target;
  int r, made = 1;
  if (platform != &staged_ranks) return;
  memset(&target, 0, sizeof target);
  target.min_world = 2;
  target.max_world = 4;
  target.comm = staged_comm_of;
  target.ctx = comms;
  for (r = 0; r < 4; r++) made = made && (target.backends[r] = staged_backend(r)) != NULL;
  if (made) diff_seeds(&target, n_env ? atoi(n_env) : 4000, 0.15, " on the cuda backend, 2-4 ranks on GPU 0");
  CHECK(made);
  for (r = 0; r < 4; r++) hir_backend_free(target.backends[r]);
}

/* The same programs on NCCL worlds of threads, a GPU a rank (2 to 4 ranks,
   as many as there are GPUs; on one GPU its one-rank programs):
   hostir_nccl's collectives and its send/recv on NCCL, then on the copy
   engines; eager in the suite, captured where the filter names it on the
   graph platforms. A run refused on a world aborts it (its ranks tell each
   other): the next program gets a new one. HIR_DIFF_NCCL_PROGRAMS: how many
   seeds each way (1,500 / (ranks - 1): 4 H200 took 0.2 s a seed, and 1,500
   each way outlasted a 560 s call). */
static hir_nccl_world *diff_worlds[5];
static int diff_copy_engine;

static hir_comm *diff_nccl_comm(diff_target *t, hir_comm *local, int rank) {
  (void)t;
  cudaSetDevice(rank); /* the rank's thread on its backend's GPU */
  return hir_nccl_world_comm(diff_worlds[local->size], rank);
}

static void diff_nccl_world(diff_target *t, int n, int refused_run) {
  if (diff_worlds[n] && !refused_run) return;
  hir_nccl_world_free(diff_worlds[n]);
  diff_worlds[n] = NULL;
  if (hir_nccl_world_create(n, &diff_worlds[n]) != HIR_OK) {
    fprintf(stderr, "  diff: a world of %d ranks: %s\n", n, hir_nccl_world_error(diff_worlds[n]));
    hir_nccl_world_free(diff_worlds[n]);
    diff_worlds[n] = NULL;
    t->max_world = n - 1; /* its programs are not run */
    hir_test_failures++;
    return;
  }
  hir_nccl_world_set_copy_engine(diff_worlds[n], diff_copy_engine);
}

TEST(test_diff_nccl, "diff/random_programs_nccl", TEST_GPU_WORLDS) {
  const char *n_env = getenv("HIR_DIFF_NCCL_PROGRAMS");
  diff_target target;
  char where[96];
  int r, n;
  if (platform->world_create != gpu_world_create || gpu_copy_engine) return; /* NCCL, one process; both ways below */
  for (diff_copy_engine = 0; diff_copy_engine < 2; diff_copy_engine++) {
    memset(&target, 0, sizeof target);
    target.max_world = platform->max_world < 4 ? platform->max_world : 4;
    target.min_world = target.max_world > 1 ? 2 : 1;
    target.comm = diff_nccl_comm;
    target.after = diff_nccl_world;
    for (n = target.min_world; n <= target.max_world; n++) diff_nccl_world(&target, n, 1);
    for (r = 0; r < target.max_world; r++) CHECK((target.backends[r] = hir_backend_cuda_create(r)) != NULL);
    snprintf(where, sizeof where, " on NCCL, %d-%d ranks a GPU each, send/recv on %s", target.min_world, target.max_world,
             diff_copy_engine ? "the copy engines" : "NCCL");
    diff_seeds(&target, n_env ? atoi(n_env) : 1500 / (target.max_world > 1 ? target.max_world - 1 : 1), 0.1, where);
    for (r = 0; r < 4; r++) hir_backend_free(target.backends[r]);
    for (n = 1; n <= 4; n++) hir_nccl_world_free(diff_worlds[n]), diff_worlds[n] = NULL;
  }
  cudaSetDevice(0);
}
