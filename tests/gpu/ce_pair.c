/* make test-gpu, two processes on one GPU, joined by the copy engines alone (nccl_peer): exchanges, a
   peer that dies, buffers freed and made again. Included by tests/gpu/main.c after the files before
   it. */
/* ---- two processes on one GPU, joined by nccl_peer alone ----
   NCCL refuses two ranks on one GPU, but CUDA IPC between two processes on
   one GPU works: this joins them through the copy engines' shared block
   only (no NCCL world), so that the process path - segment, exports,
   imports, signal pad, a peer process gone - runs on a one-GPU machine too.
   Only send/recv work on such a communicator; its allgather (hir_run's
   check that the ranks pass the same shapes) is made of them. */
static hir_status ce_pair_allgather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, void *stream) {
  int peer = 1 - c->rank;
  hir_status s, end;
  (void)team;
  if (cudaMemcpyAsync((char *)recv + bytes * (size_t)c->rank, send, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess)
    return HIR_ERR_BACKEND;
  if ((s = c->group_start(c)) != HIR_OK) return s;
  if ((s = c->send(c, send, bytes, peer, stream)) == HIR_OK) s = c->recv(c, (char *)recv + bytes * (size_t)peer, bytes, peer, stream);
  end = c->group_end(c);
  return s != HIR_OK ? s : end;
}

static hir_comm *ce_pair_comm(int rank, const char *name, char *err, size_t cap) {
  hir_nccl__rank *nc = (hir_nccl__rank *)malloc(sizeof *nc);
  size_t bytes = hir_nccl__ce_bytes(2);
  unsigned char *block = NULL;
  double deadline = hir_nccl__wall_ms() + 20000;
  if (!nc) return NULL;
  hir_nccl__init(nc, rank, 2, 0);
  nc->store.wake[0] = nc->store.wake[1] = -1;
  cudaSetDevice(0);
  if (rank == 0 && (block = hir_nccl__ce_segment(name, bytes, 1, err, cap))) {
    ((hir_nccl__ce_head *)block)->nlocal = 2;
    __atomic_store_n(&((hir_nccl__ce_head *)block)->magic, (int)HIR_NCCL__CE_MAGIC, __ATOMIC_RELEASE);
  }
  while (rank == 1 && !block && hir_nccl__wall_ms() < deadline) /* until rank 0 has made and sized it */
    if (!(block = hir_nccl__ce_segment(name, bytes, 0, err, cap))) hir_nccl__sleep_ms(10);
  while (block && __atomic_load_n(&((hir_nccl__ce_head *)block)->magic, __ATOMIC_ACQUIRE) != (int)HIR_NCCL__CE_MAGIC &&
         hir_nccl__wall_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (!block || !(nc->ce.local = (int *)malloc(2 * sizeof(int)))) {
    if (block) munmap(block, bytes);
    free(nc);
    return NULL;
  }
  nc->ce.local[0] = 0;
  nc->ce.local[1] = 1;
  if (!hir_nccl__ce_attach(&nc->ce, block, 1, 2, rank, err, cap) || hir_nccl__world_team(nc) != HIR_OK) {
    hir_nccl__release(nc);
    free(nc);
    return NULL;
  }
  while (rank == 0 && !__atomic_load_n(&hir_nccl__ce_head_of(&nc->ce)->pid[1], __ATOMIC_ACQUIRE) && hir_nccl__wall_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (rank == 0) unlink(name); /* both have it */
  nc->ce_on = nc->comm.p2p_copy_engine = 1;
  nc->comm.allgather = ce_pair_allgather;
  return &nc->comm;
}

/* Rank 0 gathers over the ring with rank 1, which, after one run together,
   posts its receive of the next and exits without sending: rank 0's stream waits for bytes that never come,
   and hir_evaluator_sync must end with the peer named, well within the
   timeout (the process is looked for every 100 ms), its GPU released.
   In graph mode (HIR_GRAPH_BY_ADDRESS) the ranks run three times together (eager,
   captured, replayed), then rank 1 exits and rank 0's replay waits on its
   graph words for a peer that is gone. */
static int ce_pair_dead_peer(int rank, int graph) {
  const int mesh[2] = {0, 1};
  const int64_t N = 1 << 16;
  seed sd;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in, din, out;
  hir_status s;
  double t0, dt;
  int ok, i;
  seed_allgather_p2p(&sd, hir_fusion_create(), 2, mesh);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ld.stream.schedule = HIR_SCHEDULE_RING;
  ed.comm = mp_comm;
  ed.backend = hir_backend_cuda_create(0);
  ed.timeout_ms = 10000;
  ed.graph = graph;
  { int64_t sz[2] = {1, N};
    in = trand(HIR_F32, 2, sz); }
  din = to_backend(ed.backend, &in);
  memset(&out, 0, sizeof out);
  ok = hir_lower(sd.f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK;
  for (i = 0; i < (graph ? 3 : 1); i++) /* runs together */
    ok = ok && hir_run(ev, &din, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK;
  if (graph && strstr(hir_program_plan(p), "graph: eager")) ok = 0, printf("rank%d: not captured: %s\n", rank, hir_program_plan(p));
  if (rank == 1 && graph) {
    printf("rank1: ran three times in graph mode, then left (%s)\n", ok ? "ok" : hir_evaluator_error(ev));
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  if (rank == 1) {
    void *buf = NULL;
    cudaMalloc(&buf, (size_t)N * 4);
    mp_comm->what.tensor = -1;
    ok = ok && mp_comm->group_start(mp_comm) == HIR_OK && mp_comm->recv(mp_comm, buf, (size_t)N * 4, 0, NULL) == HIR_OK &&
         mp_comm->group_end(mp_comm) == HIR_OK;
    hir_nccl__sleep_ms(300); /* rank 0's send has taken the post by now */
    printf("rank1: ran once, then posted a receive from rank 0 and left without sending (%s)\n", ok ? "ok" : mp_comm->error);
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  t0 = hir__now_ms();
  s = ok ? hir_run(ev, &din, 1, &out, 1) : HIR_ERR_INTERNAL;
  if (s == HIR_OK) s = hir_evaluator_sync(ev);
  dt = hir__now_ms() - t0;
  ok = ok && (s == HIR_ERR_COMM || s == HIR_ERR_TIMEOUT) && dt < 3000 && strstr(hir_evaluator_error(ev), "exited");
  printf("rank0: a peer gone during a copy-engine exchange%s: %s after %.0f ms: %s\n", graph ? " (a graph replay)" : "",
         hir_status_str(s), dt,
         ev ? hir_evaluator_error(ev) : hir_program_error(p));
  backend_free(ed.backend, &in, &din);
  tfree(&in);
  t0 = hir__now_ms();
  hir_evaluator_free(ev); /* its streams drain: the abort released their waits */
  hir_program_free(p);
  hir_backend_free(ed.backend);
  hir_fusion_free(sd.f);
  hir_nccl_comm_free(mp_comm); /* its copy stream drains too, and the peer's mapping is closed */
  dt = hir__now_ms() - t0;
  printf("rank0: its evaluator and communicator freed in %.0f ms\n", dt);
  return ok && dt < 2000;
}

/* Rank 1 receives into a new allocation each round, the values checked
   each round. freed_first: it frees the last one before making the next
   (CUDA hands the same addresses out again): rank 0 must map each anew,
   not fail with "resource already mapped" on the freed one's mapping.
   Else it frees the last one after making the next (the addresses
   differ): rank 0 must close its mapping of each freed one, which would
   otherwise keep the memory from coming back (the exports of a tuning's
   candidates held their buffers on the GPU), and map only the live one. */
static int ce_pair_new_buffers(int rank, int freed_first) {
  enum { N = 1 << 18 };
  const int rounds = freed_first ? 4 : 6;
  const char *what = freed_first ? "remapped receives" : "freed receive buffers unmapped";
  float *host = (float *)malloc((size_t)N * 4);
  void *last = NULL;
  int round, i, k, mapped = 0, ok = host != NULL;
  hir_nccl__ce *ce = &hir_nccl__of(mp_comm)->ce;
  for (round = 0; round < rounds && ok; round++) {
    void *buf = NULL;
    for (i = 0; i < N; i++) host[i] = rank == 0 ? (float)(i % 977) + 1000.0f * (float)round : -1.0f;
    if (freed_first && last) cudaFree(last), last = NULL;
    ok = cudaMalloc(&buf, (size_t)N * 4) == cudaSuccess && cudaMemcpy(buf, host, (size_t)N * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    if (last) cudaFree(last);
    last = buf;
    ok = ok && mp_comm->group_start(mp_comm) == HIR_OK &&
         (rank == 0 ? mp_comm->send(mp_comm, buf, (size_t)N * 4, 1, NULL) : mp_comm->recv(mp_comm, buf, (size_t)N * 4, 0, NULL)) ==
             HIR_OK &&
         mp_comm->group_end(mp_comm) == HIR_OK;
    if (!ok) printf("rank%d: FAIL round %d of %s: %s\n", rank, round, what, mp_comm->error);
    ok = ok && cudaDeviceSynchronize() == cudaSuccess && cudaMemcpy(host, buf, (size_t)N * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (i = 0; rank == 1 && ok && i < N; i++)
      if (host[i] != (float)(i % 977) + 1000.0f * (float)round) {
        printf("rank1: FAIL round %d of %s: element %d is %g\n", round, what, i, host[i]);
        ok = 0;
      }
  }
  for (k = 0; !freed_first && rank == 0 && k < HIR_NCCL__CE_EXPORTS; k++)
    mapped += ce->imports[ce->local[1] * HIR_NCCL__CE_EXPORTS + k].base != NULL;
  if (!freed_first && rank == 0 && mapped != 1)
    printf("rank0: FAIL %d of rank 1's allocations mapped after %d rounds; only the live one should be\n", mapped, rounds), ok = 0;
  cudaFree(last);
  printf("rank%d: %s %s (%d rounds, a new allocation each)\n", rank, ok ? "ok  " : "FAIL", what, rounds);
  free(host);
  return ok;
}

static int ce_pair_child(int rank, const char *name, int dead, int *passed, int *failed) {
  static test_platform pair = {"cuda copy engines, 2 processes on GPU 0", 2, 2, mp_world, gpu_world_keep, mp_comm_of,
                               mp_backend, mp_run, 1, 0};
  static test_platform graphs = {"cuda copy engines, 2 processes on GPU 0, CUDA graphs", 2, 2, mp_world, gpu_world_keep,
                                 mp_comm_of, mp_backend, mp_run, 1, 1};
  static test_platform staged = {"cuda copy engines, 2 processes on GPU 0, CUDA graphs on staged arguments", 2, 2, mp_world,
                                 gpu_world_keep, mp_comm_of, mp_backend, mp_run, 1, 2};
  const test_platform *each[3] = {&pair, &graphs, &staged};
  int k;
  char err[256] = "", prefix[16];
  snprintf(prefix, sizeof prefix, "rank%d: ", rank);
  if (!(mp_comm = ce_pair_comm(rank, name, err, sizeof err))) {
    printf("%sjoining the pair: %s\n", prefix, err);
    return 0;
  }
  mp_env.rank = rank;
  mp_env.size = 2;
  mp_env.gpu = 0;
  if (dead) return ce_pair_dead_peer(rank, dead - 1);
  for (k = 0; k < 3; k++) { /* eager, then captured into CUDA graphs (graph words), at fixed and at new addresses */
    platform = each[k];
    hir_run_tests(TEST_GPU_WORLDS, "stream/numbers", prefix, 1, passed, failed);
    hir_run_tests(TEST_GPU_WORLDS, "mesh2d/p2p", prefix, 1, passed, failed); /* on the 1 x 2 and 2 x 1 meshes */
  }
  for (k = 1; k >= 0; k--) /* the same addresses again, then others */
    if (ce_pair_new_buffers(rank, k)) ++*passed;
    else ++*failed;
  hir_nccl_comm_free(mp_comm);
  return *failed == 0 && *passed > 0;
}

/* The parent starts the two ranks before CUDA is touched, waits for them
   (two minutes at most), and checks that the segment is gone. */
static int ce_pair(int dead) {
  char name[64];
  pid_t kid[2];
  int r, status, ok = 1;
  double deadline = hir__now_ms() + 120000;
  snprintf(name, sizeof name, "/dev/shm/hostir-test-%d", (int)getpid());
  fflush(stdout);
  for (r = 0; r < 2; r++)
    if ((kid[r] = fork()) == 0) {
      int passed = 0, failed = 0, good = ce_pair_child(r, name, dead, &passed, &failed);
      fflush(stdout);
      _exit(good ? 0 : 1);
    }
  for (r = 0; r < 2; r++) {
    while (waitpid(kid[r], &status, WNOHANG) == 0 && hir__now_ms() < deadline) hir_nccl__sleep_ms(10);
    if (hir__now_ms() >= deadline) {
      kill(kid[r], SIGKILL);
      waitpid(kid[r], &status, 0);
      printf("rank%d: still running after two minutes (killed)\n", r);
      ok = 0;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("rank%d: failed (status %d)\n", r, status);
      ok = 0;
    }
  }
  if (unlink(name) == 0) printf("FAIL the segment %s was left behind\n", name), ok = 0;
  return ok;
}
