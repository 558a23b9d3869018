/* make test-bootstrap: hostir_nccl.h's bootstrap without a GPU - the
   launchers' variables (ranks, rank 0's host, port, secret, GPU), team keys,
   rank 0's store on 127.0.0.1 (and ::1 where the host has IPv6) against
   garbage, stalled connections, wrong secrets and too many keys, and the
   abort note that a failing rank leaves for the others (threads and
   processes), the copy engines' shared block: host ids, layout, notes and
   ended peers, and the blocking twins' watchdog (a deadline, another
   rank's note in the world, on the host or in rank 0's store), and the kernel collectives' host side (their
   source compiles with NVRTC and agrees with the host's layout; which path a size takes). Needs NCCL's and
   CUDA's headers and libraries to link, no GPU. The last line is "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../../hostir_nccl.h"
#include "../test.h"
#include <sys/resource.h>
#include <sys/wait.h>

/* ---- the launchers' variables ---- */
typedef struct vars {
  const char *kv[32]; /* name, value, name, value, ..., NULL */
} vars;
static const char *vars_get(void *user, const char *name) {
  const vars *v = (const vars *)user;
  int i;
  for (i = 0; v->kv[i]; i += 2)
    if (!strcmp(v->kv[i], name)) return v->kv[i + 1];
  return NULL;
}
static hir_status parse(const vars *v, int visible, hir_nccl_env *env, char *err) {
  err[0] = '\0';
  return hir_nccl__env_parse(vars_get, (void *)v, visible, env, err, 512);
}
/* The variables are refused, with a message holding `want`. */
static void refused(const vars *v, int visible, const char *want) {
  hir_nccl_env env;
  char err[512];
  hir_status s = parse(v, visible, &env, err);
  if (s != HIR_ERR_INVALID || !strstr(err, want)) {
    fprintf(stderr, "  %s: %s, wanted a refusal holding \"%s\"\n", hir_status_str(s), err, want);
    hir_test_failures++;
  }
}

TEST(test_env_torchrun, "env/torchrun", TEST_CPU) {
  vars v = {{"RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "4", "MASTER_ADDR", "10.0.0.1",
             "MASTER_PORT", "29400", "TORCHELASTIC_RUN_ID", "f00d", NULL}};
  hir_nccl_env env;
  char err[512];
  CHECK(parse(&v, 4, &env, err) == HIR_OK);
  CHECK(env.rank == 1 && env.size == 4 && env.local_rank == 1 && env.local_size == 4 && !env.spans_hosts);
  CHECK(env.master_port == 29401); /* torchrun's own store holds MASTER_PORT */
  CHECK_STR(env.master_addr, "10.0.0.1");
  CHECK(env.gpu == 1);
  CHECK(strstr(env.secret, "TORCHELASTIC_RUN_ID=f00d") != NULL && !env.weak_secret);
  CHECK(strstr(env.origin, "torchrun; rank 0 at 10.0.0.1:29401 from MASTER_ADDR") != NULL);
  { /* HOSTIR_PORT wins; HOSTIR_SECRET wins */
    vars w = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "29400", "TORCHELASTIC_RUN_ID", "x", "HOSTIR_PORT", "31000",
               "HOSTIR_SECRET", "s3cret", NULL}};
    CHECK(parse(&w, 2, &env, err) == HIR_OK && env.master_port == 31000 && !strcmp(env.secret, "s3cret"));
    CHECK_STR(env.master_addr, "127.0.0.1"); /* one host, as nobody says otherwise */
  }
  { /* a run id of "none" (no --rdzv-id) is no secret: a weak one, said */
    vars w = {{"RANK", "0", "WORLD_SIZE", "2", "TORCHELASTIC_RUN_ID", "none", NULL}};
    CHECK(parse(&w, 2, &env, err) == HIR_OK && !strstr(env.secret, "none") && env.weak_secret);
    CHECK(strstr(env.origin, "secret from the world's size and port only (WEAK: set HOSTIR_SECRET)") != NULL);
  }
  { /* MPICH tells nothing of the job: weak */
    vars w = {{"PMI_RANK", "1", "PMI_SIZE", "2", NULL}};
    CHECK(parse(&w, 2, &env, err) == HIR_OK && env.weak_secret && strstr(env.origin, "WEAK"));
  }
  { /* an empty or over-long HOSTIR_SECRET is refused by name, not replaced */
    static char long_secret[300];
    vars w = {{"RANK", "0", "WORLD_SIZE", "2", "HOSTIR_SECRET", "", NULL}};
    refused(&w, 2, "HOSTIR_SECRET is empty");
    memset(long_secret, 'k', 256);
    w.kv[5] = long_secret;
    refused(&w, 2, "HOSTIR_SECRET is longer than 255 characters");
    long_secret[255] = 0;
    CHECK(parse(&w, 2, &env, err) == HIR_OK && strlen(env.secret) == 255 && !env.weak_secret);
  }
}

TEST(test_env_malformed, "env/malformed", TEST_CPU) {
  static const char *bad_ranks[] = {"abc", " 1", "1x", "-1", "+1", "99999999999", "0x1", ""};
  size_t i;
  for (i = 0; i < sizeof bad_ranks / sizeof bad_ranks[0]; i++) {
    vars v = {{"RANK", bad_ranks[i], "WORLD_SIZE", "4", "OMPI_COMM_WORLD_RANK", "0", NULL}};
    char want[64];
    snprintf(want, sizeof want, "RANK=\"%s\" is not a whole number", bad_ranks[i]);
    /* an empty RANK counts as unset: Open MPI's variables are read instead */
    if (!bad_ranks[i][0]) refused(&v, 1, "OMPI_COMM_WORLD_RANK is set but not the world's size (OMPI_COMM_WORLD_SIZE");
    else refused(&v, 1, want);
  }
  { vars v = {{"RANK", "1", NULL}}; refused(&v, 1, "RANK is set but not the world's size (WORLD_SIZE; torchrun sets both)"); }
  { vars v = {{"RANK", "4", "WORLD_SIZE", "4", NULL}}; refused(&v, 1, "RANK=4 is not below WORLD_SIZE=4"); }
  { vars v = {{"RANK", "0", "WORLD_SIZE", "0", NULL}}; refused(&v, 1, "WORLD_SIZE=\"0\" is not a whole number from 1"); }
  { vars v = {{"RANK", "0", "WORLD_SIZE", "2", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2", NULL}};
    refused(&v, 1, "local rank 2 and 2 ranks on this host do not fit a world of 2"); }
  { vars v = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "70000", NULL}};
    refused(&v, 1, "MASTER_PORT=\"70000\" is not a TCP port (1 to 65535)"); }
  { vars v = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "65535", "TORCHELASTIC_RUN_ID", "r", NULL}};
    refused(&v, 1, "MASTER_PORT=\"65535\" is not a TCP port"); } /* the port after it does not exist */
  { vars v = {{"HOSTNAME", "x", NULL}}; refused(&v, 1, "no rank in the environment"); }
}

/* Slurm: rank 0's host is the first of the step's node list; one visible
   GPU per task is GPU 0. */
TEST(test_env_slurm, "env/slurm", TEST_CPU) {
  static const char *lists[][2] = {{"gpu[07-09,12],io01", "gpu07"}, {"node01", "node01"}, {"a[1-2]-b[03-04]", "a1-b03"},
                                   {"x[5,7]y,z", "x5y"}, {"h1,h2", "h1"}};
  vars v = {{"SLURM_PROCID", "3", "SLURM_NTASKS", "8", "SLURM_STEP_NUM_TASKS", "8", "SLURM_LOCALID", "1",
             "SLURM_STEP_NUM_NODES", "4", "SLURM_STEP_NODELIST", "gpu[07-09,12]", "SLURM_JOB_ID", "77", "SLURM_STEP_ID", "0",
             "CUDA_VISIBLE_DEVICES", "3", NULL}};
  hir_nccl_env env;
  char err[512], host[64];
  size_t i;
  CHECK(parse(&v, 1, &env, err) == HIR_OK);
  CHECK(env.rank == 3 && env.size == 8 && env.local_rank == 1 && env.spans_hosts && env.gpu == 0);
  CHECK_STR(env.master_addr, "gpu07");
  CHECK(strstr(env.secret, "SLURM_JOB_ID=77|SLURM_STEP_ID=0") != NULL);
  CHECK(strstr(env.origin, "from the first host of SLURM_STEP_NODELIST") != NULL);
  for (i = 0; i < sizeof lists / sizeof lists[0]; i++) {
    CHECK(hir_nccl__first_host(lists[i][0], host, sizeof host));
    CHECK_STR(host, lists[i][1]);
  }
  { /* another job's secret differs */
    hir_nccl_env other;
    v.kv[13] = "78";
    CHECK(parse(&v, 1, &other, err) == HIR_OK && strcmp(other.secret, env.secret) != 0);
  }
}

TEST(test_env_mpi, "env/mpi", TEST_CPU) {
  hir_nccl_env env;
  char err[512];
  { /* Open MPI 4: mpirun's host from the HNP URI */
    vars v = {{"OMPI_COMM_WORLD_RANK", "9", "OMPI_COMM_WORLD_SIZE", "16", "OMPI_COMM_WORLD_LOCAL_RANK", "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE", "8", "OMPI_MCA_orte_hnp_uri", "3170238464.0;tcp://192.168.1.10,10.0.0.2:41627",
               "OMPI_MCA_ess_base_jobid", "3170238465", "SLURM_PROCID", "0", NULL}};
    CHECK(parse(&v, 8, &env, err) == HIR_OK && env.rank == 9 && env.gpu == 1 && env.spans_hosts);
    CHECK_STR(env.master_addr, "192.168.1.10");
    CHECK(strstr(env.secret, "OMPI_MCA_ess_base_jobid=3170238465") != NULL);
    v.kv[9] = "3170238464.0;tcp6://[fe80::1]:4000";
    CHECK(parse(&v, 8, &env, err) == HIR_OK);
    CHECK_STR(env.master_addr, "fe80::1");
  }
  { /* Open MPI 5: its PMIx namespace names mpirun's host */
    vars v = {{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "0",
               "OMPI_COMM_WORLD_LOCAL_SIZE", "2", "PMIX_NAMESPACE", "prterun-dgx-a-01-12345@1", NULL}};
    CHECK(parse(&v, 2, &env, err) == HIR_OK);
    CHECK_STR(env.master_addr, "dgx-a-01");
  }
  { /* MPICH: one host, or MASTER_ADDR (Hydra passes the environment) */
    vars v = {{"PMI_RANK", "2", "PMI_SIZE", "4", "MPI_LOCALRANKID", "0", "MPI_LOCALNRANKS", "2", NULL}};
    refused(&v, 2, "the world spans hosts (4 ranks, 2 on this one) and nothing names rank 0's host: set MASTER_ADDR");
    v.kv[8] = "MASTER_ADDR", v.kv[9] = "head-node";
    CHECK(parse(&v, 2, &env, err) == HIR_OK && env.rank == 2 && env.gpu == 0);
    CHECK_STR(env.master_addr, "head-node");
  }
  { /* many hosts, nothing names rank 0's */
    vars v = {{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "0",
               "OMPI_COMM_WORLD_LOCAL_SIZE", "2", NULL}};
    refused(&v, 2, "the world spans hosts (4 ranks, 2 on this one) and nothing names rank 0's host: set MASTER_ADDR");
  }
  { /* many hosts, and MASTER_ADDR names this one only */
    vars v = {{"RANK", "0", "WORLD_SIZE", "4", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "localhost", NULL}};
    refused(&v, 2, "rank 0's host is localhost (MASTER_ADDR), which the other hosts of the world cannot reach");
  }
}

TEST(test_env_gpu, "env/gpu", TEST_CPU) {
  hir_nccl_env env;
  char err[512];
  vars v = {{"RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "5", "LOCAL_WORLD_SIZE", "8", NULL}};
  CHECK(parse(&v, 8, &env, err) == HIR_OK && env.gpu == 5);
  refused(&v, 4, "local rank 5 (LOCAL_RANK) has no GPU of its own: 4 visible (CUDA_VISIBLE_DEVICES=unset)");
  refused(&v, 1, "8 ranks on this host and it has one GPU: hostir needs a GPU per rank");
  CHECK(parse(&v, 0, &env, err) == HIR_OK && env.gpu == -1); /* hir_nccl_comm_create says so */
  v.kv[8] = "CUDA_VISIBLE_DEVICES", v.kv[9] = "5";
  CHECK(parse(&v, 1, &env, err) == HIR_OK && env.gpu == 0);  /* a GPU per process */
  /* what a user sees: hir_nccl_env_read on the process's environment */
  setenv("RANK", "abc", 1);
  setenv("WORLD_SIZE", "2", 1);
  CHECK(hir_nccl_env_read(&env, err, sizeof err) == HIR_ERR_INVALID && strstr(err, "RANK=\"abc\" is not a whole number"));
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

/* ---- team keys ---- */
TEST(test_team_keys, "bootstrap/team_keys", TEST_CPU) {
  int a[100], b[2] = {0, 1}, c[2] = {1, 0}, i;
  hir_nccl_world *w = (hir_nccl_world *)calloc(1, sizeof *w);
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(1, sizeof *r);
  ncclUniqueId ids[5];
  for (i = 0; i < 100; i++) a[i] = i;
  /* threads: teams are told apart by their whole list of devices */
  pthread_mutex_init(&w->mu, NULL);
  hir_nccl__init(r, 0, 100, 0);
  r->shared = w;
  CHECK(hir_nccl__team_id_of(r, a, 100, &ids[0]) == HIR_OK && hir_nccl__team_id_of(r, a, 80, &ids[1]) == HIR_OK);
  CHECK(hir_nccl__team_id_of(r, b, 2, &ids[2]) == HIR_OK && hir_nccl__team_id_of(r, c, 2, &ids[3]) == HIR_OK);
  CHECK(hir_nccl__team_id_of(r, a, 100, &ids[4]) == HIR_OK);
  CHECK(memcmp(&ids[0], &ids[1], sizeof ids[0]) != 0 && memcmp(&ids[2], &ids[3], sizeof ids[0]) != 0);
  CHECK(memcmp(&ids[0], &ids[4], sizeof ids[0]) == 0); /* the same team, the same id */
  hir_nccl__free_team_ids(w);
  pthread_mutex_destroy(&w->mu);
  free(w);
  free(r);
}

/* ---- rank 0's store on the loopback ---- */
/* A port nobody holds now. */
static int free_port(int family) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  int fd = socket(family, SOCK_STREAM, 0), port = 0;
  memset(&a, 0, sizeof a);
  a.ss_family = (sa_family_t)family;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port : ((struct sockaddr_in6 *)&a)->sin6_port);
  if (fd >= 0) close(fd);
  return port;
}

static hir_status open_store(hir_nccl__store *s, const char *addr, int port, const char *secret, int serve, char *err) {
  hir_status st = hir_nccl__store_open(s, addr, port, secret, hir_nccl__wall_ms() + 5000, err, 512);
  return st == HIR_OK && serve ? hir_nccl__store_serve_start(s, 0, err, 512) : st;
}

/* A raw connection, as a stranger makes it. */
static int raw_connect(hir_nccl__store *s) {
  return hir_nccl__connect(s->addrs, s->lens, s->naddrs, hir_nccl__wall_ms() + 2000);
}

static int turned_away(hir_nccl__store *s) {
  int n;
  pthread_mutex_lock(&s->mu);
  n = s->turned_away;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void store_on(const char *addr, int family) {
  hir_nccl__store server, client, stranger;
  unsigned char value[HIR_NCCL__VALUE_BYTES], got[HIR_NCCL__VALUE_BYTES];
  char err[512], log[400];
  int port = free_port(family), i, fd;
  double t0;
  memset(value, 0, sizeof value);
  for (i = 0; i < 128; i++) value[i] = (unsigned char)(urand() * 100 + 128);
  CHECK(port > 0);
  if (open_store(&server, addr, port, "job-1", 1, err) != HIR_OK) {
    fprintf(stderr, "  %s\n", err);
    hir_test_failures++;
    return;
  }
  CHECK(open_store(&client, addr, port, "job-1", 0, err) == HIR_OK);
  CHECK(open_store(&stranger, addr, port, "job-2", 0, err) == HIR_OK);

  /* a key from a client, read on rank 0 and back; the first value stays */
  CHECK(hir_nccl__store_call(&client, 'S', "team/2/x", value, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_OK);
  memset(got, 0, sizeof got);
  CHECK(hir_nccl__store_call(&server, 'G', "team/2/x", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_OK &&
        !memcmp(got, value, 128));
  CHECK(hir_nccl__store_call(&client, 'S', "team/2/x", value, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_OK);
  got[0] ^= 1; /* another value for a set key: refused to its setter, by name */
  CHECK(hir_nccl__store_call(&server, 'S', "team/2/x", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_ERR_COMM &&
        strstr(err, "'team/2/x' holds another rank's value already"));
  CHECK(hir_nccl__store_call(&client, 'S', "team/2/x", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_ERR_COMM &&
        strstr(err, "refused this rank: 'team/2/x' holds another rank's value already"));
  memset(got, 0, sizeof got);
  CHECK(hir_nccl__store_call(&client, 'G', "team/2/x", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_OK &&
        !memcmp(got, value, 128));

  /* a wrong secret gets nothing, at once, and rank 0 logs it */
  t0 = hir_nccl__wall_ms();
  CHECK(hir_nccl__store_call(&stranger, 'G', "team/2/x", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_ERR_COMM);
  CHECK(strstr(err, "refused this rank without proof that it knows the job's secret: 'wrong job secret") != NULL &&
        hir_nccl__wall_ms() - t0 < 1000);
  CHECK(hir_nccl__store_call(&stranger, 'S', "world", got, 128, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_ERR_COMM);
  CHECK(hir_nccl__store_call(&client, 'G', "world", got, 128, hir_nccl__wall_ms() + 300, err, sizeof err) == HIR_ERR_TIMEOUT);
  CHECK(strstr(err, "never got 'world' in time") != NULL); /* the stranger's SET did not land */
  hir_nccl__store_log(&server, log, sizeof log);
  CHECK(turned_away(&server) == 2 && strstr(log, "turned away 2 connections, the last from") && strstr(log, "wrong job secret"));

  /* garbage is answered 'R' (after the hello) and dropped */
  if ((fd = raw_connect(&server)) >= 0) {
    char http[] = "GET / HTTP/1.0\r\n\r\n";
    hir_nccl__hello hello;
    hir_nccl__msg m;
    CHECK(hir_nccl__io(fd, http, sizeof http - 1, 1, hir_nccl__wall_ms() + 1000));
    CHECK(hir_nccl__io(fd, &hello, sizeof hello, 0, hir_nccl__wall_ms() + 1000) && !memcmp(hello.magic, hir_nccl__magic, 4));
    CHECK(hir_nccl__io(fd, &m, sizeof m, 0, hir_nccl__wall_ms() + 1000) && m.op == 'R' &&
          strstr((char *)m.value, "not a hostir bootstrap request"));
    close(fd);
  } else {
    CHECK(!"connect");
  }

  /* a request seen on the wire and sent again is refused: its MAC is bound to the hello it answered */
  {
    hir_nccl__hello hello;
    hir_nccl__msg m, replay;
    int a = raw_connect(&server), b;
    memset(&m, 0, sizeof m);
    memcpy(m.magic, hir_nccl__magic, 4);
    hir_nccl__random(m.nonce, sizeof m.nonce);
    m.op = 'G';
    snprintf(m.key, sizeof m.key, "team/2/x");
    CHECK(a >= 0 && hir_nccl__io(a, &hello, sizeof hello, 0, hir_nccl__wall_ms() + 1000));
    hir_nccl__mac(client.key, "request", hello.nonce, &m, m.mac);
    replay = m;
    CHECK(hir_nccl__io(a, &m, sizeof m, 1, hir_nccl__wall_ms() + 1000) && hir_nccl__io(a, &m, sizeof m, 0, hir_nccl__wall_ms() + 1000) &&
          m.op == 'V' && !memcmp(m.value, value, 128)); /* the genuine one */
    close(a);
    b = raw_connect(&server);
    CHECK(b >= 0 && hir_nccl__io(b, &hello, sizeof hello, 0, hir_nccl__wall_ms() + 1000));
    CHECK(hir_nccl__io(b, &replay, sizeof replay, 1, hir_nccl__wall_ms() + 1000) &&
          hir_nccl__io(b, &replay, sizeof replay, 0, hir_nccl__wall_ms() + 1000) && replay.op == 'R' &&
          strstr((char *)replay.value, "wrong job secret") && memcmp(replay.value, value, 128));
    if (b >= 0) close(b);
  }

  /* a stalled request is answered 'R' after its second */
  {
    int half = raw_connect(&server);
    hir_nccl__hello hello;
    hir_nccl__msg m;
    memcpy(m.magic, hir_nccl__magic, 4);
    t0 = hir_nccl__wall_ms();
    CHECK(half >= 0 && hir_nccl__io(half, &hello, sizeof hello, 0, hir_nccl__wall_ms() + 1000) &&
          hir_nccl__io(half, &m, 10, 1, hir_nccl__wall_ms() + 1000));
    CHECK(hir_nccl__io(half, &m, sizeof m, 0, hir_nccl__wall_ms() + 3000) && m.op == 'R' &&
          strstr((char *)m.value, "no complete request within 1000 ms") && hir_nccl__wall_ms() - t0 < 2000);
    if (half >= 0) close(half);
  }

  /* at most 4096 keys (the rest through rank 0's own path, for speed) */
  {
    char key[32];
    hir_status s = HIR_OK;
    for (i = 0; i < HIR_NCCL__MAX_KEYS && s == HIR_OK; i++) {
      snprintf(key, sizeof key, "k%d", i);
      s = hir_nccl__store_call(i % 512 ? &server : &client, 'S', key, value, 8, hir_nccl__wall_ms() + 3000, err, sizeof err);
    }
    CHECK(s == HIR_OK || (s == HIR_ERR_COMM && strstr(err, "holds 4096 keys already"))); /* the keys above count too */
    CHECK(hir_nccl__store_call(&client, 'S', "one-too-many", value, 8, hir_nccl__wall_ms() + 3000, err, sizeof err) ==
              HIR_ERR_COMM &&
          strstr(err, "refused this rank: it holds 4096 keys already"));
    CHECK(hir_nccl__store_call(&client, 'G', "k7", got, 8, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_OK); /* still served */
  }

  /* a second rank 0 on the same port */
  {
    hir_nccl__store second;
    CHECK(open_store(&second, addr, port, "job-2", 1, err) == HIR_ERR_COMM && strstr(err, "another job or program holds the port"));
    hir_nccl__store_close(&second);
  }
  hir_nccl__store_close(&stranger);
  hir_nccl__store_close(&client);
  t0 = hir_nccl__wall_ms();
  fd = raw_connect(&server); /* closing does not wait for a stalled connection */
  hir_nccl__store_close(&server);
  CHECK(hir_nccl__wall_ms() - t0 < 500);
  if (fd >= 0) close(fd);
}

TEST(test_store_ipv4, "bootstrap/store_ipv4", TEST_CPU) { store_on("127.0.0.1", AF_INET); }

/* A flood: 1,000 idle connections held open that never speak, and new
   ones arriving all the while (bounded in count and time, on the
   loopback); a rank still gets its value within 1 s, every time. */
typedef struct flood {
  hir_nccl__store *server;
  volatile int stop, held, opened;
} flood;

static void *flood_run(void *arg) {
  flood *f = (flood *)arg;
  int fds[1000], n = 0, at = 0, fd;
  double end = hir_nccl__wall_ms() + 8000;
  while (!f->stop && f->opened < 200000 && hir_nccl__wall_ms() < end) {
    if ((fd = hir_nccl__connect(f->server->addrs, f->server->lens, f->server->naddrs, hir_nccl__wall_ms() + 200)) < 0) continue;
    f->opened++;
    if (n < 1000) {
      fds[n++] = fd;
      f->held = n;
    } else { /* the oldest goes, the newest stays: 1,000 held */
      close(fds[at]);
      fds[at] = fd;
      at = (at + 1) % 1000;
    }
  }
  while (n) close(fds[--n]);
  return NULL;
}

TEST(test_store_flood, "bootstrap/store_flood", TEST_CPU) {
  hir_nccl__store server, client;
  unsigned char value[HIR_NCCL__VALUE_BYTES], got[HIR_NCCL__VALUE_BYTES];
  char err[512], log[400];
  struct rlimit lim;
  int port = free_port(AF_INET), i;
  double worst = 0, t0;
  pthread_t thread;
  flood f;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 2048) {
    lim.rlim_cur = lim.rlim_max < 4096 ? lim.rlim_max : 4096;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < 1500) {
    printf("  skipped: 1,500 descriptors needed, %ld allowed\n", (long)lim.rlim_cur);
    return;
  }
  for (i = 0; i < (int)sizeof value; i++) value[i] = (unsigned char)(urand() * 255);
  if (open_store(&server, "127.0.0.1", port, "job-f", 1, err) != HIR_OK || open_store(&client, "127.0.0.1", port, "job-f", 0, err) != HIR_OK) {
    fprintf(stderr, "  %s\n", err);
    hir_test_failures++;
    return;
  }
  CHECK(hir_nccl__store_call(&server, 'S', "world", value, sizeof value - 1, hir_nccl__wall_ms() + 1000, err, sizeof err) == HIR_OK);
  memset(&f, 0, sizeof f);
  f.server = &server;
  CHECK(pthread_create(&thread, NULL, flood_run, &f) == 0);
  while (f.held < 1000 && !f.stop) hir_nccl__sleep_ms(5);
  for (i = 0; i < 10; i++) {
    hir_nccl__sleep_ms(200);
    memset(got, 0, sizeof got);
    t0 = hir_nccl__wall_ms();
    CHECK(hir_nccl__store_call(&client, 'G', "world", got, sizeof got - 1, hir_nccl__wall_ms() + 5000, err, sizeof err) == HIR_OK &&
          !memcmp(got, value, sizeof value - 1));
    if (hir_nccl__wall_ms() - t0 > worst) worst = hir_nccl__wall_ms() - t0;
  }
  f.stop = 1;
  pthread_join(thread, NULL);
  hir_nccl__store_log(&server, log, sizeof log);
  printf("  under a flood (1,000 idle connections held, %d opened in all): the slowest of 10 fetches took %.1f ms%s\n", f.opened,
         worst, log);
  CHECK(worst < 1000 && f.opened > 1000);
  hir_nccl__store_close(&client);
  hir_nccl__store_close(&server);
}

/* Something else on rank 0's port, without the secret: whatever it
   answers, the rank refuses it, naming it. */
static void *impostor_run(void *arg) {
  int lfd = *(int *)arg, fd, k;
  for (k = 0; k < 2; k++) {
    hir_nccl__hello hello;
    hir_nccl__msg m;
    if (!hir_nccl__ready(lfd, POLLIN, hir_nccl__wall_ms() + 5000) || (fd = accept(lfd, NULL, NULL)) < 0) return NULL;
    memcpy(hello.magic, hir_nccl__magic, 4);
    hir_nccl__random(hello.nonce, sizeof hello.nonce);
    if (hir_nccl__io(fd, &hello, sizeof hello, 1, hir_nccl__wall_ms() + 1000) &&
        hir_nccl__io(fd, &m, sizeof m, 0, hir_nccl__wall_ms() + 1000)) {
      m.op = 'V'; /* "here is the world's id": its own */
      memset(m.value, 0x5a, sizeof m.value);
      if (k == 1) hir_nccl__mac(m.mac, "answer", hello.nonce, &m, m.mac); /* a MAC under a key of its own */
      hir_nccl__io(fd, &m, sizeof m, 1, hir_nccl__wall_ms() + 1000);
    }
    close(fd);
  }
  return NULL;
}

TEST(test_store_impostor, "bootstrap/store_impostor", TEST_CPU) {
  hir_nccl__store client;
  struct sockaddr_in a;
  unsigned char got[64];
  char err[512];
  int lfd = socket(AF_INET, SOCK_STREAM, 0), k, port;
  socklen_t len = sizeof a;
  pthread_t thread;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 4) != 0 ||
      getsockname(lfd, (struct sockaddr *)&a, &len) != 0) {
    CHECK(!"listen");
    return;
  }
  port = ntohs(a.sin_port);
  CHECK(pthread_create(&thread, NULL, impostor_run, &lfd) == 0);
  CHECK(open_store(&client, "127.0.0.1", port, "job-i", 0, err) == HIR_OK);
  for (k = 0; k < 2; k++) {
    memset(got, 0, sizeof got);
    CHECK(hir_nccl__store_call(&client, 'G', "world", got, sizeof got, hir_nccl__wall_ms() + 3000, err, sizeof err) == HIR_ERR_COMM &&
          strstr(err, "answered without proof that it knows the job's secret: another program holds rank 0's port") &&
          got[0] == 0);
  }
  pthread_join(thread, NULL);
  hir_nccl__store_close(&client);
  close(lfd);
}

TEST(test_store_ipv6, "bootstrap/store_ipv6_and_names", TEST_CPU) {
  hir_nccl__store s;
  char err[512];
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof a);
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0) store_on("::1", AF_INET6);
  else printf("  (no IPv6 loopback here: ::1 not tried)\n");
  if (fd >= 0) close(fd);
  /* names are looked up; a name that does not exist says so */
  CHECK(hir_nccl__store_open(&s, "localhost", 29999, "x", hir_nccl__wall_ms() + 5000, err, sizeof err) == HIR_OK && s.naddrs >= 1);
  CHECK(hir_nccl__store_open(&s, "no-such-host.invalid", 29999, "x", hir_nccl__wall_ms() + 5000, err, sizeof err) ==
            HIR_ERR_COMM &&
        strstr(err, "cannot look up rank 0's host no-such-host.invalid:29999"));
  /* rank 0 listens only where MASTER_ADDR says: an address of another host is refused */
  CHECK(open_store(&s, "192.0.2.1", 29999, "x", 1, err) == HIR_ERR_COMM && strstr(err, "not an address of rank 0's host"));
  hir_nccl__store_close(&s);
  /* a loopback address cannot serve a world that spans hosts */
  CHECK(hir_nccl__store_open(&s, "127.0.0.1", 29999, "x", hir_nccl__wall_ms() + 5000, err, sizeof err) == HIR_OK &&
        hir_nccl__store_serve_start(&s, 1, err, sizeof err) == HIR_ERR_INVALID && strstr(err, "a loopback address"));
  hir_nccl__store_close(&s);
}

/* ---- a failing rank's note ---- */
/* Processes: rank 1 fails; rank 0 (which serves the store) and rank 2 find
   its note at their next poll; then the note of a second failure does not
   replace the first. */
TEST(test_abort_processes, "bootstrap/abort_note_processes", TEST_CPU) {
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(3, sizeof *r);
  char err[512];
  int port = free_port(AF_INET), i;
  double t0;
  for (i = 0; i < 3; i++) {
    hir_nccl__init(&r[i], i, 3, 0);
    CHECK(open_store(&r[i].store, "127.0.0.1", port, "job", i == 0, err) == HIR_OK);
  }
  for (i = 0; i < 3; i++) CHECK(r[i].comm.poll(&r[i].comm) == HIR_OK);
  snprintf(r[1].comm.error, sizeof r[1].comm.error, "hir_run: input 1 (B) has K = 3, the program expects 4");
  r[1].comm.abort(&r[1].comm);
  t0 = hir_nccl__wall_ms();
  for (i = 0; i < 3; i += 2) {
    while (r[i].comm.poll(&r[i].comm) == HIR_OK && hir_nccl__wall_ms() - t0 < 2000) hir_nccl__sleep_ms(1);
    CHECK(strstr(r[i].comm.error, "the world was aborted: rank 1 failed: hir_run: input 1 (B) has K = 3, the program expects 4"));
  }
  CHECK(hir_nccl__wall_ms() - t0 < 1000);
  snprintf(r[2].comm.error, sizeof r[2].comm.error, "rank 2's own trouble");
  r[2].comm.abort(&r[2].comm); /* told already: leaves no note */
  {
    hir_nccl__rank late;
    hir_nccl__init(&late, 2, 3, 0);
    CHECK(open_store(&late.store, "127.0.0.1", port, "job", 0, err) == HIR_OK);
    CHECK(late.comm.poll(&late.comm) == HIR_ERR_COMM && strstr(late.comm.error, "rank 1 failed"));
    /* a rank still waiting for a key learns it too, at once */
    CHECK(hir_nccl__store_call(&late.store, 'G', "team/never", err, 8, hir_nccl__wall_ms() + 5000, late.comm.error,
                               sizeof late.comm.error) == HIR_ERR_COMM &&
          strstr(late.comm.error, "the world was aborted while this rank waited for 'team/never': rank 1 failed"));
    hir_nccl__store_close(&late.store);
  }
  for (i = 2; i >= 0; i--) hir_nccl__store_close(&r[i].store);
  free(r);
}

/* Threads: the note lives in the world. */
TEST(test_abort_threads, "bootstrap/abort_note_threads", TEST_CPU) {
  hir_nccl_world *w = (hir_nccl_world *)calloc(1, sizeof *w);
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(2, sizeof *r);
  int i;
  pthread_mutex_init(&w->mu, NULL);
  for (i = 0; i < 2; i++) {
    hir_nccl__init(&r[i], i, 2, i);
    r[i].shared = w;
    r[i].store.wake[0] = r[i].store.wake[1] = -1;
  }
  CHECK(r[0].comm.poll(&r[0].comm) == HIR_OK);
  snprintf(r[1].comm.error, sizeof r[1].comm.error, "hir_evaluator_create: device 5 is outside the world");
  r[1].comm.abort(&r[1].comm);
  CHECK(r[0].comm.poll(&r[0].comm) == HIR_ERR_COMM &&
        strstr(r[0].comm.error, "rank 0 stopped: the world was aborted: rank 1 failed: hir_evaluator_create: device 5"));
  for (i = 0; i < 2; i++) { /* then every call is refused before it reaches NCCL, naming what ended the world */
    hir_comm *c = &r[i].comm;
    const int team[2] = {0, 1};
    void *t = NULL;
    float x = 1;
    int k;
    for (k = 0; k < 5; k++) {
      hir_status s = k == 0   ? c->send(c, &x, 4, 1 - i, NULL)
                     : k == 1 ? c->recv(c, &x, 4, 1 - i, NULL)
                     : k == 2 ? c->group_start(c)
                     : k == 3 ? c->group_end(c)
                              : c->team(c, team, 2, &t);
      CHECK(s == HIR_ERR_COMM && strstr(c->error, "communicator was aborted by an earlier failure") &&
            strstr(c->error, "rank 1 failed: hir_evaluator_create: device 5"));
    }
  }
  pthread_mutex_destroy(&w->mu);
  free(w);
  free(r);
}

/* ---- the copy engines' block (nccl_peer), without a GPU ---- */

/* NCCL_HOSTID decides which ranks share a host, as in NCCL; else the host's
   name and boot id, the same on every call. */
TEST(test_peer_host_id, "peer/host_id", TEST_CPU) {
  unsigned long long a, a2, b, plain;
  setenv("NCCL_HOSTID", "node-a", 1);
  a = hir_nccl__host_id();
  a2 = hir_nccl__host_id();
  setenv("NCCL_HOSTID", "node-b", 1);
  b = hir_nccl__host_id();
  unsetenv("NCCL_HOSTID");
  plain = hir_nccl__host_id();
  CHECK(a == a2 && a != b && plain != a && plain != b && plain == hir_nccl__host_id());
}

/* The block's parts do not overlap, every pad word is its own and inside
   the block, for hosts of 2, 3 and 8 ranks. */
TEST(test_peer_layout, "peer/layout", TEST_CPU) {
  int n, from, to, which, seen_outside = 0, collisions = 0;
  for (n = 2; n <= 8; n += n == 3 ? 5 : 1) {
    hir_nccl__ce ce;
    size_t words = (size_t)n * n * HIR_NCCL__CE_SLOTS * 2, i;
    unsigned char *hit = (unsigned char *)calloc(words, 1);
    unsigned long long seq;
    memset(&ce, 0, sizeof ce);
    ce.nlocal = n;
    CHECK(hir_nccl__ce_exports_at() >= sizeof(hir_nccl__ce_head) &&
          hir_nccl__ce_boxes_at(n) >= hir_nccl__ce_exports_at() + (size_t)n * HIR_NCCL__CE_EXPORTS * sizeof(hir_nccl__ce_export) &&
          hir_nccl__ce_pad_at(n) >= hir_nccl__ce_boxes_at(n) + (size_t)n * n * sizeof(hir_nccl__ce_box));
    for (from = 0; from < n; from++)
      for (to = 0; to < n; to++)
        for (seq = 0; seq < 2 * HIR_NCCL__CE_SLOTS; seq++)
          for (which = 0; which < 2; which++) {
            size_t at = hir_nccl__ce_word(&ce, from, to, seq, which);
            seen_outside += at < hir_nccl__ce_pad_at(n) || at + sizeof(unsigned) > hir_nccl__ce_bytes(n);
            i = (at - hir_nccl__ce_pad_at(n)) / sizeof(unsigned);
            if (i < words && seq < HIR_NCCL__CE_SLOTS) collisions += hit[i]++ != 0;
          }
    free(hit);
  }
  CHECK(seen_outside == 0 && collisions == 0);
}

/* Two ranks of a host map one segment: the first failure's note reaches the
   other (a second note does not replace it), a peer process that ended,
   even one its parent has not reaped yet, is named within 100 ms, and a pid
   that is not the peer's process here (another pid namespace) is not
   watched rather than taken for dead. */
TEST(test_peer_notes, "peer/notes_and_ended_peers", TEST_CPU) {
  char name[64], err[256] = "", note[512];
  size_t bytes = hir_nccl__ce_bytes(2);
  hir_nccl__ce a, b;
  int local[2] = {0, 1}, status;
  unsigned long long started = 0, kid_started = 0;
  char state = 0;
  pid_t kid;
  double t0;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  snprintf(name, sizeof name, "/dev/shm/hostir-bootstrap-test-%d", (int)getpid());
  a.block = hir_nccl__ce_segment(name, bytes, 1, err, sizeof err);
  b.block = hir_nccl__ce_segment(name, bytes, 0, err, sizeof err);
  CHECK(a.block && b.block && a.block != b.block);
  CHECK(hir_nccl__ce_segment(name, bytes, 1, err, sizeof err) == NULL && strstr(err, "File exists")); /* made once */
  unlink(name);
  if (!a.block || !b.block) return;
  a.nlocal = b.nlocal = 2;
  a.me = 0, b.me = 1;
  a.local = b.local = local;
  a.segment = b.segment = 1;
  a.block_bytes = b.block_bytes = bytes;
  CHECK(hir_nccl__process((int)getpid(), &state, &started) && state == 'R' && started > 0);
  hir_nccl__ce_head_of(&a)->pid[0] = (int)getpid();
  hir_nccl__ce_head_of(&a)->started[0] = started;
  hir_nccl__ce_head_of(&a)->pid[1] = (int)getpid(); /* a pid this host shows as another process: not watched */
  hir_nccl__ce_head_of(&a)->started[1] = started + 1;
  a.next_pid_look_ms = 0;
  hir_nccl__ce_heard(&a, note, sizeof note);
  CHECK(note[0] == 0 && a.watch[1] == -1);
  a.watch[1] = 0;
  if ((kid = fork()) == 0) _exit(0);
  hir_nccl__sleep_ms(50); /* it has exited; not reaped */
  CHECK(hir_nccl__process((int)kid, &state, &kid_started) && state == 'Z');
  hir_nccl__ce_head_of(&b)->started[1] = kid_started; /* seen through the other mapping */
  hir_nccl__ce_head_of(&b)->pid[1] = (int)kid;
  t0 = hir_nccl__wall_ms();
  a.next_pid_look_ms = 0;
  do hir_nccl__ce_heard(&a, note, sizeof note);
  while (!note[0] && hir_nccl__wall_ms() < t0 + 1000);
  CHECK(strstr(note, "rank 1 (process") && strstr(note, "exited") && hir_nccl__wall_ms() < t0 + 150);
  waitpid(kid, &status, 0);
  hir_nccl__ce_head_of(&a)->pid[1] = (int)getpid();
  hir_nccl__ce_tell(&b, "rank 1 failed: first");
  hir_nccl__ce_tell(&a, "rank 0 failed: second");
  hir_nccl__ce_heard(&a, note, sizeof note);
  CHECK(!strcmp(note, "rank 1 failed: first"));
  a.local = b.local = NULL;
  hir_nccl__ce_detach(&a, 0);
  hir_nccl__ce_detach(&b, 0);
}

/* ---- the blocking twins' watchdog (hir_nccl__twin), without NCCL ----
   The ranks have no communicators (aborting none does nothing); a blocked
   call is one that returns once the watchdog has ended it, as NCCL does on
   its abort flag, or after `ms`. */
static ncclResult_t blocked_call(hir_nccl__rank *nc, int ms) {
  double until = hir_nccl__wall_ms() + ms;
  while (__atomic_load_n(&nc->inside, __ATOMIC_ACQUIRE) > 0 && hir_nccl__wall_ms() < until) hir_nccl__sleep_ms(1);
  return ncclSuccess;
}

static void twins_rank(hir_nccl__rank *r, int rank, int timeout_ms) {
  hir_nccl__init(r, rank, 2, -1);
  r->store.wake[0] = r->store.wake[1] = -1;
  r->timeout_ms = timeout_ms;
  CHECK(hir_nccl__twins_on(r) == 1);
  r->twins = 1;
}

/* Quick calls pass untouched; a call past its rank's deadline ends in
   HIR_ERR_TIMEOUT naming it, soon after the deadline; then a call on the
   other rank of the threaded world ends in HIR_ERR_COMM naming the first
   rank's failure, long before its own deadline. */
TEST(test_twins_watchdog, "twins/watchdog_deadline_and_note", TEST_CPU) {
  hir_nccl_world *w = (hir_nccl_world *)calloc(1, sizeof *w);
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(2, sizeof *r);
  hir_status s = HIR_OK;
  double t0, dt;
  int i;
  hir_nccl__rank off;
  memset(&off, 0, sizeof off);
  setenv("HOSTIR_NCCL_BLOCKING", "0", 1); /* the opt-out: no twins, no watchdog */
  CHECK(hir_nccl__twins_on(&off) == 0 && !off.watching);
  unsetenv("HOSTIR_NCCL_BLOCKING"); /* the default: twins */
  pthread_mutex_init(&w->mu, NULL);
  twins_rank(&r[0], 0, 300);
  twins_rank(&r[1], 1, 60000);
  r[0].shared = r[1].shared = w;
  for (i = 0; i < 2000 && s == HIR_OK; i++) s = HIR_NCCL__DATA(&r[1].comm, blocked_call(&r[1], 0));
  CHECK(s == HIR_OK && r[1].inside == 0);
  CHECK(HIR_NCCL__DATA(&r[0].comm, blocked_call(&r[0], 30)) == HIR_OK);
  t0 = hir_nccl__wall_ms();
  s = HIR_NCCL__DATA(&r[0].comm, blocked_call(&r[0], 5000));
  dt = hir_nccl__wall_ms() - t0;
  CHECK(s == HIR_ERR_TIMEOUT && dt >= 300 && dt < 2500 && r[0].aborted && w->aborted &&
        strstr(r[0].comm.error, "blocked_call(&r[0], 5000) on rank 0 still waited for its peers after 300 ms"));
  t0 = hir_nccl__wall_ms();
  s = HIR_NCCL__DATA(&r[1].comm, blocked_call(&r[1], 5000));
  dt = hir_nccl__wall_ms() - t0;
  CHECK(s == HIR_ERR_COMM && dt < 1000 &&
        strstr(r[1].comm.error, "rank 1 stopped: the world was aborted: rank 0 failed: blocked_call(&r[0], 5000)"));
  for (i = 0; i < 2; i++) hir_nccl__watch_stop(&r[i]);
  pthread_mutex_destroy(&w->mu);
  free(w);
  free(r);
}

/* One process per GPU: a peer process of this host that has ended (seen
   before as itself) ends a blocked call within a few polls, naming it. */
TEST(test_twins_host_block, "twins/watchdog_peer_process_gone", TEST_CPU) {
  char name[64], err[256] = "";
  size_t bytes = hir_nccl__ce_bytes(2);
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(1, sizeof *r);
  int local[2] = {0, 1}, status;
  unsigned long long started = 0, kid_started = 0;
  char state = 0;
  hir_status s;
  double t0, dt;
  pid_t kid;
  unsetenv("HOSTIR_NCCL_BLOCKING"); /* the default: twins */
  twins_rank(r, 0, 60000);
  snprintf(name, sizeof name, "/dev/shm/hostir-bootstrap-twins-%d", (int)getpid());
  r->ce.block = hir_nccl__ce_segment(name, bytes, 1, err, sizeof err);
  unlink(name);
  CHECK(r->ce.block != NULL);
  if (r->ce.block) {
    r->ce.nlocal = 2;
    r->ce.me = 0;
    r->ce.local = local;
    r->ce.segment = 1;
    r->ce.block_bytes = bytes;
    hir_nccl__process((int)getpid(), &state, &started);
    hir_nccl__ce_head_of(&r->ce)->pid[0] = (int)getpid();
    hir_nccl__ce_head_of(&r->ce)->started[0] = started;
    if ((kid = fork()) == 0) _exit(0);
    hir_nccl__sleep_ms(50);
    hir_nccl__process((int)kid, &state, &kid_started);
    hir_nccl__ce_head_of(&r->ce)->started[1] = kid_started;
    hir_nccl__ce_head_of(&r->ce)->pid[1] = (int)kid;
    r->ce.watch[1] = 1; /* the rank's thread saw it as itself before */
    t0 = hir_nccl__wall_ms();
    s = HIR_NCCL__DATA(&r->comm, blocked_call(r, 5000));
    dt = hir_nccl__wall_ms() - t0;
    CHECK(s == HIR_ERR_COMM && dt < 1000 && strstr(r->comm.error, "rank 1 (process") && strstr(r->comm.error, "exited"));
    waitpid(kid, &status, 0);
    r->ce.local = NULL;
    hir_nccl__ce_detach(&r->ce, 0);
  }
  hir_nccl__watch_stop(r);
  free(r);
}

/* Processes on other hosts: rank 0's note in its store ends rank 1's
   blocked call (a call under its deadline, before the note, is not). */
TEST(test_twins_store, "twins/watchdog_store_note", TEST_CPU) {
  hir_nccl__rank *r = (hir_nccl__rank *)calloc(2, sizeof *r);
  char err[512];
  int port = free_port(AF_INET), i;
  hir_status s;
  double t0, dt;
  unsetenv("HOSTIR_NCCL_BLOCKING"); /* the default: twins */
  for (i = 0; i < 2; i++) {
    twins_rank(&r[i], i, 60000);
    CHECK(open_store(&r[i].store, "127.0.0.1", port, "job", i == 0, err) == HIR_OK);
  }
  CHECK(HIR_NCCL__DATA(&r[1].comm, blocked_call(&r[1], 300)) == HIR_OK);
  snprintf(r[0].comm.error, sizeof r[0].comm.error, "hir_run: input 0 (A) has M = 3, the program expects 4");
  r[0].comm.abort(&r[0].comm);
  t0 = hir_nccl__wall_ms();
  s = HIR_NCCL__DATA(&r[1].comm, blocked_call(&r[1], 5000));
  dt = hir_nccl__wall_ms() - t0;
  CHECK(s == HIR_ERR_COMM && dt < 1000 &&
        strstr(r[1].comm.error, "rank 1 stopped: the world was aborted: rank 0 failed: hir_run: input 0 (A) has M = 3"));
  for (i = 1; i >= 0; i--) {
    hir_nccl__watch_stop(&r[i]);
    hir_nccl__store_close(&r[i].store);
  }
  free(r);
}

/* ---- the kernel collectives' host side (nccl_kernels) ---- */
/* The kernel collectives' switches: a malformed value refuses the
   communicator's creation by name; 0 turns the measurement off. */
TEST(test_kernels_switches, "kernels/switches", TEST_CPU) {
  char err[300] = "";
  setenv("HOSTIR_MEASURE_COLLECTIVES", "maybe", 1);
  CHECK(hir_nccl__check_switches(err, sizeof err) == HIR_ERR_INVALID && strstr(err, "HOSTIR_MEASURE_COLLECTIVES") != NULL);
  setenv("HOSTIR_MEASURE_COLLECTIVES", "0", 1);
  CHECK(hir_nccl__check_switches(err, sizeof err) == HIR_OK && !hir_nccl__switch("HOSTIR_MEASURE_COLLECTIVES"));
  unsetenv("HOSTIR_MEASURE_COLLECTIVES");
  CHECK(hir_nccl__switch("HOSTIR_MEASURE_COLLECTIVES"));
}

/* The kernels' source compiles with NVRTC for Hopper (no GPU needed), with
   every kernel the host looks up, its argument block the host's size and
   its constants the host's (asserted inside the source). */
TEST(test_kernels_source, "kernels/source_compiles", TEST_CPU) {
  static const char *const names[] = {"hir_allreduce_one_f32", "hir_allreduce_one_f16", "hir_allreduce_one_bf16",
                                      "hir_allreduce_two_f32", "hir_allreduce_two_f16", "hir_allreduce_two_bf16",
                                      "hir_reduce_scatter_f32", "hir_reduce_scatter_f16", "hir_reduce_scatter_bf16",
                                      "hir_allgather_bytes"};
  hir__nvrtc nvrtc;
  hir__map_build m;
  char why[200], *text = hir_nccl__kc_text(), *src;
  size_t i, cap;
  CHECK(text != NULL);
  if (!text) return;
  if (!hir__nvrtc_open(&nvrtc, why, sizeof why)) {
    printf("  (not run: %s)\n", why); /* no CUDA toolkit's NVRTC here */
    free(text);
    return;
  }
  cap = strlen(text) + 1024;
  src = (char *)malloc(cap);
  snprintf(src, cap, "%s\nstatic_assert(sizeof(hir_coll_args) == %zu, \"the host's size\");\n" /* NVRTC has no offsetof */
           "static_assert(MAXR == %d && MAXCTAS == %d && THREADS == %d && DATA_AT == %d, \"the host's constants\");\n",
           text, sizeof(hir_nccl__kargs), HIR_NCCL__KC_RANKS, HIR_NCCL__KC_CTAS, HIR_NCCL__KC_THREADS, HIR_NCCL__KC_DATA_AT);
  memset(&m, 0, sizeof m);
  m.nvrtc = &nvrtc;
  m.name = "hostir_nccl's collectives";
  m.src = src;
  snprintf(m.option, sizeof m.option, "--gpu-architecture=sm_90");
  hir__map_compile(&m);
  if (!m.bin) fprintf(stderr, "  %s\n", m.error);
  CHECK(m.bin != NULL);
  for (i = 0; m.bin && i < sizeof names / sizeof names[0]; i++) {
    size_t k, len = strlen(names[i]);
    int found = 0;
    for (k = 0; k + len <= m.size && !found; k++) found = !memcmp(m.bin + k, names[i], len);
    if (!found) fprintf(stderr, "  the cubin lacks %s\n", names[i]);
    CHECK(found);
  }
  free(m.bin);
  free(src);
  free(text); /* NVRTC stays loaded: its runtime keeps memory it never frees, which a leak check would report */
}

/* Which path a collective takes: the same for every rank of a world (it
   reads only sizes, the dtype, the team, the choice and the cap). Before a
   measurement, the fixed rule: one shot up to 2 MB / (n - 1), the kernels up
   to 16 MB, NCCL above, for f64 and for a team other than the world; a
   measured choice is followed, with its CTAs, under the cap; a slot's calls
   fit the workspace. */
TEST(test_kernels_choice, "kernels/choice", TEST_CPU) {
  hir_nccl__rank *nc = (hir_nccl__rank *)calloc(1, sizeof *nc);
  hir_nccl__team other;
  unsigned char pad[4096];
  hir_nccl__ce ce;
  int n, z, ctas, bad = 0;
  memset(&ce, 0, sizeof ce);
  memset(&other, 0, sizeof other);
  ce.pad_dev = pad;
  bad += hir_nccl__kc_class(1) != 0 || hir_nccl__kc_class((size_t)8 << 10) != 0 || hir_nccl__kc_class(((size_t)8 << 10) + 1) != 1;
  bad += hir_nccl__kc_class((size_t)64 << 20) != HIR_NCCL__KC_CLASSES - 1 || hir_nccl__kc_class((size_t)1 << 30) != HIR_NCCL__KC_CLASSES - 1;
  for (z = 1; z < HIR_NCCL__KC_CLASSES; z++) bad += hir_nccl__kc_class_bytes[z] <= hir_nccl__kc_class_bytes[z - 1];
  for (n = 2; n <= HIR_NCCL__KC_RANKS; n++) {
    size_t slot = hir_nccl__kc_slot(n), es, two = (size_t)2 << 20;
    memset(nc, 0, sizeof *nc);
    nc->kc.on = 1;
    nc->kc.n = n;
    nc->world_team.n = other.n = n;
    hir_nccl__kc_words(&nc->kc, &ce);
    for (z = 0; z < HIR_NCCL__KC_CLASSES; z++) { /* the rule at each class's size */
      size_t b = hir_nccl__kc_class_bytes[z];
      int want = b <= two / (size_t)(n - 1) ? HIR_NCCL__AR_ONE : b <= (size_t)16 << 20 ? HIR_NCCL__AR_TWO : -1;
      ctas = -1;
      bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, b, &ctas) != want;
      bad += want >= 0 && ctas != HIR_NCCL__KC_FEW;
      bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__RS, HIR_F16, b, &ctas) != (b <= (size_t)16 << 20 ? HIR_NCCL__RS : -1);
    }
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, two, &ctas) != (n == 2 ? HIR_NCCL__AR_ONE : HIR_NCCL__AR_TWO);
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, two + 2, &ctas) != HIR_NCCL__AR_TWO;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_F32, (size_t)16 << 20, &ctas) != HIR_NCCL__AR_TWO;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_F32, ((size_t)16 << 20) + 4, &ctas) != -1;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_F64, 8, &ctas) != -1;
    bad += hir_nccl__kc_pick(nc, &other, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != -1;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AG, HIR_F8E4M3, ((size_t)16 << 20) + 1, &ctas) != -1;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AG, HIR_F8E4M3, 1, &ctas) != HIR_NCCL__AG;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 0, &ctas) != -1;
    nc->path = HIR_NCCL_PATH_ONE_SHOT; /* forced: any size */
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, (size_t)1 << 30, &ctas) != HIR_NCCL__AR_ONE;
    nc->path = HIR_NCCL_PATH_TWO_SHOT;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != HIR_NCCL__AR_TWO;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AG, HIR_BF16, (size_t)1 << 30, &ctas) != HIR_NCCL__AG;
    nc->kc.cap = 100; /* a forced path takes the cap whole */
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != HIR_NCCL__AR_TWO || ctas != 100;
    nc->path = HIR_NCCL_PATH_NCCL;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != -1;
    nc->path = HIR_NCCL_PATH_AUTO; /* the choice's CTAs, under the cap */
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != HIR_NCCL__AR_ONE || ctas != HIR_NCCL__KC_FEW;
    nc->kc.cap = 16;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != HIR_NCCL__AR_ONE || ctas != 16;
    nc->kc.cap = 0;
    nc->comm.ctx = nc;
    if (n == 2 && !strstr(hir_nccl_comm_describe(&nc->comm), "by size, by a fixed rule: all-reduce: one shot on 32 CTAs to 2 MiB, "
                                                                "two shots on 32 CTAs to 16 MiB, NCCL above; reduce-scatter: kernel on "
                                                                "32 CTAs to 16 MiB, NCCL above")) {
      fprintf(stderr, "  %s\n", hir_nccl_comm_describe(&nc->comm));
      bad++;
    }
    bad += strcmp(hir_nccl__collective_path(&nc->comm, &nc->world_team, HIR_COLL_ALLREDUCE, 8, HIR_BF16), "hostir's one-shot kernel (32 CTAs, the input read in place)") != 0;
    bad += strcmp(hir_nccl__collective_path(&nc->comm, &nc->world_team, HIR_COLL_ALLGATHER, 64, HIR_F8E4M3), "hostir's kernel (32 CTAs, the input read in place)") != 0;
    bad += hir_nccl__collective_path(&nc->comm, &nc->world_team, HIR_COLL_BROADCAST, 64, HIR_BF16) != NULL;
    bad += strcmp(hir_nccl__collective_path(&nc->comm, &other, HIR_COLL_ALLREDUCE, 64, HIR_BF16), "NCCL") != 0;
    /* a measured choice: two shots on 128 CTAs from 1 MiB, NCCL from 32 MiB */
    for (z = hir_nccl__kc_class((size_t)1 << 20); z < HIR_NCCL__KC_CLASSES; z++) {
      nc->kc.use[HIR_NCCL__AR_ONE][z] = (signed char)(hir_nccl__kc_class_bytes[z] < ((size_t)32 << 20) ? HIR_NCCL__AR_TWO : -1);
      nc->kc.ctas[HIR_NCCL__AR_TWO][z] = HIR_NCCL__KC_CTAS;
    }
    nc->kc.measured = 1;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, (size_t)1 << 20, &ctas) != HIR_NCCL__AR_TWO || ctas != HIR_NCCL__KC_CTAS;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, ((size_t)16 << 20) + 2, &ctas) != -1;
    bad += strcmp(hir_nccl__collective_path(&nc->comm, &nc->world_team, HIR_COLL_ALLREDUCE, 4 << 20, HIR_BF16),
                  "hostir's two-shot kernel (128 CTAs, the input read in place)") != 0;
    if (n == 2 && !strstr(hir_nccl_comm_describe(&nc->comm), "as measured at creation: all-reduce: one shot on 32 CTAs to 512 KiB, "
                                                   "two shots on 128 CTAs to 16 MiB, NCCL above")) {
      fprintf(stderr, "  %s\n", hir_nccl_comm_describe(&nc->comm));
      bad++;
    }
    nc->kc.on = 0;
    bad += hir_nccl__kc_pick(nc, &nc->world_team, HIR_NCCL__AR_ONE, HIR_BF16, 8, &ctas) != -1;
    /* a call's slots: n of them in a half's first region, 16-byte multiples; two shots' segments of the
       most elements a call takes fit one */
    bad += slot % 16 != 0 || slot * (size_t)n > (size_t)HIR_NCCL__KC_HALF / 2;
    for (es = 2; es <= 4; es += 2) {
      size_t most = slot / es * (size_t)n, per_vector = 16 / es;
      bad += ((most + (size_t)n - 1) / (size_t)n + per_vector - 1) / per_vector * per_vector * es > slot;
    }
  }
  /* the flags, then the CTAs' call counters, before the data */
  bad += (HIR_NCCL__KC_CTAS * 2 * HIR_NCCL__KC_RANKS + HIR_NCCL__KC_CTAS) * (int)sizeof(unsigned) > HIR_NCCL__KC_DATA_AT;
  CHECK(bad == 0);
  free(nc);
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  hir_run_tests(TEST_CPU, argc > 1 ? argv[1] : NULL, "", 0, &passed, &failed);
  if (hir_tests_lost) printf("FAIL %d tests were not registered (tests/test.h)\n", hir_tests_lost), failed++;
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
