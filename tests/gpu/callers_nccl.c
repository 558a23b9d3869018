/* make test-gpu, the caller's NCCL: an id it handed out, a communicator it lends. Included by
   tests/gpu/main.c after the files before it. */
/* ---- the caller's NCCL: an id it handed out, a communicator it lends ----
   Rank 0 makes the id and leaves it in a file the others read, as a runtime
   would broadcast it (MPI_Bcast, torch.distributed). */
static int shared_id(const hir_nccl_env *env, ncclUniqueId *id) {
  char path[256], tmp[280];
  double deadline = hir__now_ms() + 60000;
  FILE *f;
  snprintf(path, sizeof path, "/tmp/hostir-test-id-%016llx", /* the job's own: its secret names it */
           (unsigned long long)hir_nccl__hash(env->secret, strlen(env->secret), (unsigned long long)env->size));
  if (env->rank == 0) {
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (ncclGetUniqueId(id) != ncclSuccess || !(f = fopen(tmp, "wb"))) return 0;
    fwrite(id, sizeof *id, 1, f);
    fclose(f);
    return rename(tmp, path) == 0;
  }
  while (hir__now_ms() < deadline) {
    if ((f = fopen(path, "rb"))) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 1;
    }
    hir_nccl__sleep_ms(20);
  }
  return 0;
}

/* A nonblocking communicator of the caller's own, for hir_nccl_comm_from_nccl. */
static ncclComm_t own_nccl(const hir_nccl_env *env, const ncclUniqueId *id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  ncclResult_t r, state = ncclInProgress;
  double deadline = hir__now_ms() + 60000;
  config.blocking = 0;
  cudaSetDevice(env->gpu);
  r = ncclCommInitRankConfig(&comm, env->size, *id, env->rank, &config);
  while ((r == ncclSuccess || r == ncclInProgress) && ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
         state == ncclInProgress && hir__now_ms() < deadline)
    hir_nccl__sleep_ms(1);
  return (r == ncclSuccess || r == ncclInProgress) && state == ncclSuccess ? comm : NULL;
}

/* The lent communicator still works after hostir is done with it: an
   allreduce of the ranks' numbers on it. */
static int lent_still_works(const hir_nccl_env *env, ncclComm_t comm) {
  float *x = NULL, got = 0;
  ncclResult_t r, state = ncclInProgress;
  double deadline = hir__now_ms() + 30000;
  float mine = (float)(env->rank + 1);
  if (cudaMalloc((void **)&x, sizeof *x) != cudaSuccess || cudaMemcpy(x, &mine, sizeof mine, cudaMemcpyHostToDevice) != cudaSuccess)
    return 0;
  r = ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, NULL);
  while (r == ncclInProgress && ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
         hir__now_ms() < deadline)
    hir_nccl__sleep_ms(1);
  if (cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) got = -1;
  cudaFree(x);
  return got == (float)(env->size * (env->size + 1) / 2);
}
