/* make test-gpu, the platforms the suite runs the CPU suite's cases on: NCCL worlds of threads
   (send/recv on NCCL or the copy engines), one process per GPU; a failing rank. Included by
   tests/gpu/main.c after the files before it. */
/* ---- platforms ---- */
/* Whether hostir_nccl should put the data path on blocking twins: its
   default, unless HOSTIR_NCCL_BLOCKING=0, NCCL_COMM_SPLIT_SHARE_RESOURCES=0
   (a twin could not be ended) or the communicator is borrowed. */
static int data_path_blocking(int borrowed) {
  const char *v = getenv("HOSTIR_NCCL_BLOCKING"), *share = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  return !borrowed && !(v && !strcmp(v, "0")) && !(share && strcmp(share, "1"));
}

static hir_nccl_world *gpu_worlds[MAXR + 1];
static int gpu_copy_engine; /* send/recv on the copy engines */
static void *gpu_world_create(int n) {
  if (!gpu_worlds[n] && hir_nccl_world_create(n, &gpu_worlds[n]) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(gpu_worlds[n]));
    hir_nccl_world_free(gpu_worlds[n]);
    gpu_worlds[n] = NULL;
  }
  hir_nccl_world_set_copy_engine(gpu_worlds[n], gpu_copy_engine);
  return gpu_worlds[n];
}

/* Every stream-lowered program again (P2P allgather, GEMM + P2P
   reduce-scatter, both schedules, bounded buffers), their sends and receives
   on the copy engines. */
TEST(test_gpu_copy_engine, "gpu/copy_engine_p2p", TEST_GPU_THREADS) {
  hir_nccl_world *w;
  int r;
  gpu_copy_engine = 1;
  test_stream_numbers();
  gpu_copy_engine = 0;
  if (platform->max_world < 2 || !(w = (hir_nccl_world *)gpu_world_create(2))) return;
  for (r = 0; r < 2; r++) CHECK(hir_nccl_world_comm(w, r)->p2p_copy_engine == 0); /* each rank says what it does */
  for (r = 0; r < 2; r++) CHECK(hir_nccl_comm_blocking(hir_nccl_world_comm(w, r)) == data_path_blocking(0));
  hir_nccl_world_set_copy_engine(w, 1);
  for (r = 0; r < 2; r++) CHECK(hir_nccl_world_comm(w, r)->p2p_copy_engine == 1);
  hir_nccl_world_set_copy_engine(w, 0);
}
/* One rank rejects its input (a wrong K) 200 ms after the others started
   waiting for it in their exchanges: they return HIR_ERR_COMM within a
   second naming it and why (robust/failing_rank's case, on NCCL). Its
   world is aborted: the threads get a world of their own. With disagree,
   that rank's M differs instead (a shape it cannot find wrong alone): every
   rank refuses the run with the same message (robust/ranks_disagree's
   case, on NCCL), and the next run, its shape mended, succeeds. */
typedef struct gpu_failing {
  hir_fusion *f;
  hir_comm *comm[MAXR];
  int gpu[MAXR], wrong, disagree; /* the rank with a wrong K, or M */
  hir_tensor in[MAXR][2];         /* made before the ranks start (trand is not thread-safe) */
  hir_tensor mended;              /* the wrong rank's input 0 in the second run */
  hir_status status[MAXR], second[MAXR];
  char error[MAXR][512];
  double ms[MAXR];
} gpu_failing;

static void gpu_failing_begin(gpu_failing *x, int n, int wrong, int disagree) {
  seed s;
  int64_t sa[3] = {1, 2, 4};
  int r;
  memset(x, 0, sizeof *x);
  seed_ag_matmul_p2p(&s, hir_fusion_create(), n, iota_mesh); /* P2P exchanges, then matmuls */
  x->f = s.f;
  x->wrong = wrong;
  x->disagree = disagree;
  for (r = 0; r < n; r++) {
    int64_t m3[3] = {1, 3, 4}, sb[2] = {r == wrong && !disagree ? 3 : 4, 5};
    x->in[r][0] = trand(HIR_F32, 3, r == wrong && disagree ? m3 : sa);
    x->in[r][1] = trand(HIR_F32, 2, sb);
  }
  x->mended = trand(HIR_F32, 3, sa);
}

static hir_status gpu_failing_rank(int rank, void *user) {
  gpu_failing *x = (gpu_failing *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p;
  hir_evaluator *ev = NULL;
  hir_tensor d[2], out[1];
  double t0;
  int i;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = x->comm[rank];
  ed.backend = hir_backend_cuda_create(x->gpu[rank]);
  for (i = 0; i < 2; i++) d[i] = to_backend(ed.backend, &x->in[rank][i]);
  if (rank == x->wrong) hir_nccl__sleep_ms(200); /* the others are already waiting in their first exchange */
  t0 = hir__now_ms();
  if ((x->status[rank] = hir_lower(x->f, &ld, &p)) == HIR_OK && (x->status[rank] = hir_evaluator_create(p, &ed, &ev)) == HIR_OK &&
      (x->status[rank] = hir_run(ev, d, 2, out, 1)) == HIR_OK)
    x->status[rank] = hir_evaluator_sync(ev);
  x->ms[rank] = hir__now_ms() - t0;
  snprintf(x->error[rank], sizeof x->error[rank], "%s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  x->second[rank] = HIR_ERR_INVALID;
  if (x->disagree && x->status[rank] == HIR_ERR_SHAPE) {
    if (rank == x->wrong) backend_free(ed.backend, &x->in[rank][0], &d[0]), d[0] = to_backend(ed.backend, &x->mended);
    if ((x->second[rank] = hir_run(ev, d, 2, out, 1)) == HIR_OK) x->second[rank] = hir_evaluator_sync(ev);
    if (x->second[rank] != HIR_OK) printf("  rank %d's second run: %.300s\n", rank, hir_evaluator_error(ev));
    if (rank == x->wrong) backend_free(ed.backend, &x->mended, &d[0]), d[0] = x->in[rank][0];
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  for (i = 0; i < 2; i++) backend_free(ed.backend, &x->in[rank][i], &d[i]);
  hir_backend_free(ed.backend);
  return x->status[rank];
}

/* Checks ranks [from, to) of a finished run and frees what the run used. */
static int gpu_failing_end(gpu_failing *x, int n, int from, int to) {
  char rank_failed[32];
  int r, ok = 1;
  snprintf(rank_failed, sizeof rank_failed, "rank %d failed: hir_run:", x->wrong);
  for (r = from; r < to; r++) {
    int good = x->disagree ? x->status[r] == HIR_ERR_SHAPE && x->ms[r] < 1000 && x->second[r] == HIR_OK &&
                                 strstr(x->error[r], "hir_run: the ranks passed different shapes for input 0 (T0): [1, 2, 4] on "
                                                     "device") && strcmp(x->error[r], x->error[from]) == 0
             : r == x->wrong ? x->status[r] == HIR_ERR_SHAPE && strstr(x->error[r], "the contracted sizes differ")
                             : x->status[r] == HIR_ERR_COMM && x->ms[r] < 1000 && strstr(x->error[r], rank_failed) &&
                                   strstr(x->error[r], "the contracted sizes differ");
    printf("  rank %d: %s after %.0f ms: %.300s\n", r, hir_status_str(x->status[r]), x->ms[r], x->error[r]);
    ok &= good;
  }
  for (r = 0; r < n; r++) tfree(&x->in[r][0]), tfree(&x->in[r][1]);
  tfree(&x->mended);
  hir_fusion_free(x->f);
  return ok;
}

TEST(test_gpu_failing_rank, "gpu/failing_rank", TEST_GPU_THREADS) {
  static gpu_failing x;
  hir_nccl_world *w = NULL;
  int n = platform->max_world < 4 ? platform->max_world : 4, r;
  if (n < 2) return;
  if (hir_nccl_world_create(n, &w) != HIR_OK) {
    fprintf(stderr, "  %s\n", hir_nccl_world_error(w));
    hir_test_failures++;
    hir_nccl_world_free(w);
    return;
  }
  gpu_failing_begin(&x, n, n - 1, 1); /* the world stays whole */
  for (r = 0; r < n; r++) x.comm[r] = hir_nccl_world_comm(w, r), x.gpu[r] = r;
  CHECK(hir_spmd(n, gpu_failing_rank, &x) == HIR_ERR_SHAPE);
  CHECK(gpu_failing_end(&x, n, 0, n));
  gpu_failing_begin(&x, n, n - 1, 0);
  for (r = 0; r < n; r++) x.comm[r] = hir_nccl_world_comm(w, r), x.gpu[r] = r;
  CHECK(hir_spmd(n, gpu_failing_rank, &x) == HIR_ERR_SHAPE); /* the cause */
  CHECK(gpu_failing_end(&x, n, 0, n));
  hir_nccl_world_free(w);
}

static void gpu_world_keep(void *w) { (void)w; } /* NCCL worlds are kept for the whole run */
static hir_comm *gpu_comm(void *w, int rank) { return hir_nccl_world_comm((hir_nccl_world *)w, rank); }
static hir_backend *gpu_backend(int rank) { return hir_backend_cuda_create(rank); }

static hir_comm *mp_comm;
static hir_nccl_env mp_env;
static void *mp_world(int n) {
  (void)n;
  return mp_comm;
}
static hir_comm *mp_comm_of(void *w, int rank) {
  (void)rank;
  return (hir_comm *)w;
}
static hir_backend *mp_backend(int rank) {
  (void)rank;
  return hir_backend_cuda_create(mp_env.gpu);
}
static hir_status mp_run(int n, hir_status (*fn)(int rank, void *user), void *user) {
  (void)n;
  return fn(mp_env.rank, user);
}
