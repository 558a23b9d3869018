/* hostir_nccl.h - hostir's communicator (hir_comm) on NCCL, and its bootstrap.
   No warranty implied; MIT license (see hostir.h).

   Do this:
       #define HOSTIR_IMPLEMENTATION        (in one file, as for hostir.h)
       #define HOSTIR_NCCL_IMPLEMENTATION   (in one file)
       #include "hostir_nccl.h"
   and link -lnccl -lcudart. The implementation uses POSIX sockets and
   threads: compile it with POSIX features (the default of gcc, clang and
   nvcc; with -std=c11 add -D_POSIX_C_SOURCE=200809L).

   Two ways to start:
     - one process driving every local GPU, one thread per rank:
           hir_nccl_world *w; hir_nccl_world_create(4, &w);
           ... on thread r: hir_comm *c = hir_nccl_world_comm(w, r);
     - one process per GPU (torchrun, mpirun, srun): rank, world size and
       local rank come from RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_*, or
       SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; rank 0 hands out NCCL's ids
       over TCP at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500; under
       torchrun, whose own store holds MASTER_PORT, the port after it;
       HOSTIR_PORT overrides):
           hir_nccl_env env; hir_comm *c;
           if (hir_nccl_env_read(&env, err, sizeof err) != HIR_OK ||
               hir_nccl_comm_create(&env, 60000, &c) != HIR_OK) ...

   A rank's device id is its rank in the world. Collectives run on the stream
   the evaluator passes (the current stream); a team other than the whole
   world gets its own NCCL communicator, made by its members only. Every wait
   of the bootstrap has a deadline, and hir_evaluator_sync polls
   ncclCommGetAsyncError and aborts the communicators when a peer is dead.
   Nothing assumes one host. Private names start with hir_nccl__.

   Table of contents (grep the markers); a section calls only the ones above it:
       // >>nccl_store      rank 0's key-value store over TCP, for NCCL's ids
       // >>nccl_comm       hir_comm on NCCL: teams, collectives, copy-engine send/recv, errors
       // >>nccl_bootstrap  the threaded world, the launcher's environment, one process per GPU */
#ifndef HOSTIR_NCCL_H
#define HOSTIR_NCCL_H
#include "hostir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hir_nccl_world hir_nccl_world;
/* One process, `nranks` local GPUs (rank r on GPU r). On failure *out holds
   only the error (hir_nccl_world_error; free it), or is NULL. */
HIRDEF hir_status  hir_nccl_world_create(int nranks, hir_nccl_world **out);
HIRDEF hir_comm   *hir_nccl_world_comm(hir_nccl_world *w, int rank);  /* owned by the world */
HIRDEF const char *hir_nccl_world_error(const hir_nccl_world *w);
HIRDEF void        hir_nccl_world_free(hir_nccl_world *w);
/* Send/recv between the world's ranks on the GPUs' copy engines
   (cudaMemcpyPeerAsync over NVLink) instead of NCCL's kernels, which wait
   for SMs while a GEMM holds them all; collectives stay on NCCL. Off by
   default; switch it only while no rank is running a program. Each rank's
   hir_comm says so (p2p_copy_engine), for hir_lower_desc.comm. */
HIRDEF void        hir_nccl_world_set_copy_engine(hir_nccl_world *w, int enable);

/* One process per GPU. */
typedef struct hir_nccl_env {
  int rank, size, local_rank;
  char master_addr[256];
  int master_port;              /* where rank 0 serves the bootstrap */
} hir_nccl_env;
HIRDEF hir_status hir_nccl_env_read(hir_nccl_env *env, char *error, size_t cap);
/* Sets the device local_rank and joins the world (collective over all
   ranks). On failure *out holds only the error (its `error`; free it). */
HIRDEF hir_status hir_nccl_comm_create(const hir_nccl_env *env, int timeout_ms, hir_comm **out);
HIRDEF void       hir_nccl_comm_free(hir_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* HOSTIR_NCCL_H */

/* ======================================================================== */
#ifdef HOSTIR_NCCL_IMPLEMENTATION
#ifndef HOSTIR_NCCL_IMPLEMENTATION_DONE
#define HOSTIR_NCCL_IMPLEMENTATION_DONE

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// >>nccl_store
/* A tiny key-value store over TCP, served by rank 0, for NCCL's ids: a
   request is one fixed-size message (SET or GET), the answer one too. */
#define HIR_NCCL__KEY_BYTES 200
typedef struct hir_nccl__msg {
  char op;                      /* 'S' set, 'G' get, 'V' value, 'N' none yet */
  char key[HIR_NCCL__KEY_BYTES];
  unsigned char value[NCCL_UNIQUE_ID_BYTES];
} hir_nccl__msg;

typedef struct hir_nccl__kv {
  char key[HIR_NCCL__KEY_BYTES];
  unsigned char value[NCCL_UNIQUE_ID_BYTES];
} hir_nccl__kv;

typedef struct hir_nccl__kvstore {
  char addr[256];
  int port, listen_fd, serving;
  pthread_t thread;
  pthread_mutex_t mu;
  hir_nccl__kv *kv;
  int nkv, cap;
} hir_nccl__kvstore;

static int hir_nccl__io(int fd, void *buf, size_t n, int writing) {
  char *p = (char *)buf;
  while (n) {
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return 0;
    }
    p += k;
    n -= (size_t)k;
  }
  return 1;
}

static void *hir_nccl__store_serve(void *arg) {
  hir_nccl__kvstore *s = (hir_nccl__kvstore *)arg;
  for (;;) {
    hir_nccl__msg m;
    int fd = accept(s->listen_fd, NULL, NULL), i;
    if (fd < 0) {
      if (errno == EINTR) continue;
      return NULL; /* the listening socket was shut down */
    }
    if (hir_nccl__io(fd, &m, sizeof m, 0)) {
      m.key[HIR_NCCL__KEY_BYTES - 1] = '\0';
      pthread_mutex_lock(&s->mu);
      for (i = 0; i < s->nkv && strcmp(s->kv[i].key, m.key) != 0; i++) {}
      if (m.op == 'S') {
        if (i == s->nkv && s->nkv == s->cap) {
          int cap = s->cap ? 2 * s->cap : 16;
          hir_nccl__kv *kv = (hir_nccl__kv *)realloc(s->kv, (size_t)cap * sizeof *kv);
          if (kv) {
            s->kv = kv;
            s->cap = cap;
          }
        }
        if (i < s->cap) {
          memcpy(s->kv[i].key, m.key, HIR_NCCL__KEY_BYTES);
          memcpy(s->kv[i].value, m.value, NCCL_UNIQUE_ID_BYTES);
          if (i == s->nkv) s->nkv++;
        }
        m.op = 'V';
      } else if (i < s->nkv) {
        memcpy(m.value, s->kv[i].value, NCCL_UNIQUE_ID_BYTES);
        m.op = 'V';
      } else {
        m.op = 'N';
      }
      pthread_mutex_unlock(&s->mu);
      hir_nccl__io(fd, &m, sizeof m, 1);
    }
    close(fd);
  }
}

static double hir_nccl__wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void hir_nccl__sleep_ms(int ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static hir_status hir_nccl__store_serve_start(hir_nccl__kvstore *s, char *err, size_t cap) {
  struct sockaddr_in a;
  int one = 1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)s->port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if ((s->listen_fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
      setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(s->listen_fd, 128) != 0) {
    snprintf(err, cap, "hostir_nccl: rank 0 cannot listen on port %d for the bootstrap: %s (set HOSTIR_PORT to a free port, "
             "the same on every rank)", s->port, strerror(errno));
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
    return HIR_ERR_COMM;
  }
  pthread_mutex_init(&s->mu, NULL);
  if (pthread_create(&s->thread, NULL, hir_nccl__store_serve, s) != 0) {
    snprintf(err, cap, "hostir_nccl: cannot start the bootstrap thread");
    close(s->listen_fd);
    s->listen_fd = -1;
    return HIR_ERR_COMM;
  }
  s->serving = 1;
  return HIR_OK;
}

static void hir_nccl__store_stop(hir_nccl__kvstore *s) {
  if (!s->serving) return;
  shutdown(s->listen_fd, SHUT_RDWR);
  close(s->listen_fd);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  free(s->kv);
  s->serving = 0;
}

/* One request to the store; 1 with the answer in *m, 0 when unreachable. */
static int hir_nccl__store_ask(const hir_nccl__kvstore *s, hir_nccl__msg *m) {
  struct addrinfo hints, *res = NULL;
  char port[16];
  int fd, ok;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  snprintf(port, sizeof port, "%d", s->port);
  if (getaddrinfo(s->addr, port, &hints, &res) != 0 || !res) return 0;
  fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 && hir_nccl__io(fd, m, sizeof *m, 1) && hir_nccl__io(fd, m, sizeof *m, 0);
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return ok;
}

static hir_status hir_nccl__store_set(const hir_nccl__kvstore *s, const char *key, const void *value, int timeout_ms, char *err, size_t cap) {
  double deadline = hir_nccl__wall_ms() + timeout_ms;
  hir_nccl__msg m;
  for (;;) {
    memset(&m, 0, sizeof m);
    m.op = 'S';
    snprintf(m.key, sizeof m.key, "%s", key);
    memcpy(m.value, value, NCCL_UNIQUE_ID_BYTES);
    if (hir_nccl__store_ask(s, &m) && m.op == 'V') return HIR_OK;
    if (hir_nccl__wall_ms() > deadline) break;
    hir_nccl__sleep_ms(20);
  }
  snprintf(err, cap, "hostir_nccl: cannot reach rank 0 at %.64s:%d within %d ms to publish '%.40s' (check MASTER_ADDR/MASTER_PORT)",
           s->addr, s->port, timeout_ms, key);
  return HIR_ERR_TIMEOUT;
}

static hir_status hir_nccl__store_get(const hir_nccl__kvstore *s, const char *key, void *value, int timeout_ms, char *err, size_t cap) {
  double deadline = hir_nccl__wall_ms() + timeout_ms;
  hir_nccl__msg m;
  int reached = 0;
  for (;;) {
    memset(&m, 0, sizeof m);
    m.op = 'G';
    snprintf(m.key, sizeof m.key, "%s", key);
    if (hir_nccl__store_ask(s, &m)) {
      reached = 1;
      if (m.op == 'V') {
        memcpy(value, m.value, NCCL_UNIQUE_ID_BYTES);
        return HIR_OK;
      }
    }
    if (hir_nccl__wall_ms() > deadline) break;
    hir_nccl__sleep_ms(20);
  }
  snprintf(err, cap, "hostir_nccl: %s '%.40s' within %d ms (%.64s:%d); is every rank started?",
           reached ? "rank 0 never published" : "cannot reach rank 0 to fetch", key, timeout_ms, s->addr, s->port);
  return HIR_ERR_TIMEOUT;
}

// >>nccl_comm
typedef struct hir_nccl__team {
  struct hir_nccl__team *next;
  int n, me, *devices;
  ncclComm_t comm;
} hir_nccl__team;

typedef struct hir_nccl__reg {  /* a registered buffer: a handle per communicator */
  struct hir_nccl__reg *next;
  void *ptr;
  int n;
  ncclComm_t comms[16];
  void *handles[16];
} hir_nccl__reg;

enum { HIR_NCCL__CE_SLOTS = 64, HIR_NCCL__CE_GROUP = 256 };

/* Copy-engine P2P: a receive posts its buffer with an event that marks it
   writable; the matching send (in order, per pair of ranks) copies on the
   sender's copy stream once that event and the sender's own stream have
   reached it, and records `done`, on which both ranks' streams then wait.
   One copy stream per rank runs its sends one after another, each at the
   link's full rate, and starts them without waiting for the GEMMs queued on
   the pipeline's streams. The events are made by the device that records
   them. */
typedef struct hir_nccl__ce_post {
  void *buf;
  size_t bytes;
  cudaEvent_t ready, done;
} hir_nccl__ce_post;

typedef struct hir_nccl__ce_box {    /* receives that rank `to` posted for sender `from` */
  hir_nccl__ce_post slot[HIR_NCCL__CE_SLOTS];
  unsigned long long posted, sent, received;
} hir_nccl__ce_box;

typedef struct hir_nccl__ce_op {     /* a send or receive held until its group ends */
  int send, peer;
  void *buf, *stream;
  size_t bytes;
  unsigned long long seq;
} hir_nccl__ce_op;

typedef struct hir_nccl__rank {
  hir_comm comm;                /* what the evaluator sees; ctx points back here */
  hir_nccl__ce_op ce_ops[HIR_NCCL__CE_GROUP];
  int ce_nops, ce_group;
  cudaStream_t ce_stream;       /* this rank's sends, in order */
  cudaEvent_t ce_source;        /* a send's data is ready on the sender's stream */
  hir_nccl__reg *regs;
  ncclComm_t world;
  int device, timeout_ms, aborted;
  hir_nccl__team world_team;    /* the team of every rank in order: the world itself */
  hir_nccl__team *teams;
  hir_nccl_world *shared;       /* threaded: the ids of teams, shared by the ranks */
  hir_nccl__kvstore store;             /* one process per GPU: rank 0's id store */
  void *zeros;                  /* what a reduce root without data contributes */
  size_t zeros_cap;
} hir_nccl__rank;

struct hir_nccl_world {
  int n, peer_access;           /* copy engines: peer access enabled between every pair of GPUs */
  hir_nccl__rank *ranks;
  hir_nccl__ce_box *boxes;           /* [from * n + to] */
  pthread_cond_t ce_cv;         /* with mu: a post was made or taken */
  pthread_mutex_t mu;
  hir_nccl__kv *ids;                 /* team key -> ncclUniqueId */
  int nids, cap;
  char error[512];
};

static ncclDataType_t hir_nccl__type(hir_dtype d) {
  return d == HIR_F32 ? ncclFloat32 : d == HIR_F64 ? ncclFloat64 : d == HIR_F16 ? ncclFloat16 : ncclBfloat16;
}

static hir_nccl__rank *hir_nccl__of(hir_comm *c) { return (hir_nccl__rank *)c->ctx; }

/* Our communicators are nonblocking, so that a dead peer cannot hold the
   caller inside NCCL (connecting to it, say) past any deadline. */
static ncclConfig_t hir_nccl__config(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

static void hir_nccl__abort(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t;
  if (nc->aborted) return;
  nc->aborted = 1;
  for (t = nc->teams; t; t = t->next) ncclCommAbort(t->comm);
  if (nc->world) ncclCommAbort(nc->world);
}

/* Waits while `comm` is busy with a nonblocking call; its state after, or
   ncclInProgress past the deadline. */
static ncclResult_t hir_nccl__wait(ncclComm_t comm, double deadline) {
  ncclResult_t r = ncclSuccess, q;
  struct timespec nap = {0, 50000}; /* 50 us */
  while ((q = ncclCommGetAsyncError(comm, &r)) == ncclSuccess && r == ncclInProgress && hir_nccl__wall_ms() < deadline)
    nanosleep(&nap, NULL);
  return q != ncclSuccess ? q : r;
}

static hir_status hir_nccl__settle(hir_comm *c, ncclComm_t pending, const char *what) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  double deadline = hir_nccl__wall_ms() + nc->timeout_ms;
  hir_nccl__team *t = nc->teams;
  ncclComm_t comm = pending ? pending : nc->world;
  for (;;) {
    ncclResult_t r = comm ? hir_nccl__wait(comm, deadline) : ncclSuccess;
    if (r == ncclInProgress) {
      if (pending && pending != nc->world) ncclCommAbort(pending);
      hir_nccl__abort(c);
      snprintf(c->error, sizeof c->error,
               "%s on rank %d still waited for its peers after %d ms: a peer is dead or stuck, so the communicator was "
               "aborted (raise the timeout of hir_nccl_comm_create if they are only slow)",
               what, c->rank, nc->timeout_ms);
      return HIR_ERR_TIMEOUT;
    }
    if (r != ncclSuccess) {
      if (pending && pending != nc->world) ncclCommAbort(pending);
      snprintf(c->error, sizeof c->error, "%s failed on rank %d: %s", what, c->rank, ncclGetErrorString(r));
      return HIR_ERR_COMM;
    }
    if (pending) pending = NULL, comm = nc->world; /* then every other communicator */
    else if (t) comm = t->comm, t = t->next;
    else return HIR_OK;
  }
}

/* A call on a nonblocking communicator that has to wait for its peers (the
   connections NCCL makes on first use, a group) returns ncclInProgress
   instead of blocking: settle waits for it under the communicator's
   deadline. */
static hir_status hir_nccl__check(hir_comm *c, ncclResult_t r, const char *what, int line) {
  if (r == ncclSuccess) return HIR_OK;
  if (r == ncclInProgress) return hir_nccl__settle(c, NULL, what);
  snprintf(c->error, sizeof c->error, "%s failed on rank %d: %s (hostir_nccl.h:%d)", what, c->rank, ncclGetErrorString(r), line);
  return HIR_ERR_COMM;
}
#define HIR_NCCL__CHECK(c, call) hir_nccl__check(c, (call), #call, __LINE__)

static hir_status hir_nccl__init_comm(hir_comm *c, ncclComm_t *comm, int n, ncclUniqueId id, int me) {
  ncclConfig_t config = hir_nccl__config();
  ncclResult_t r = ncclCommInitRankConfig(comm, n, id, me, &config);
  if (r == ncclInProgress) return hir_nccl__settle(c, *comm, "ncclCommInitRankConfig");
  return HIR_NCCL__CHECK(c, r);
}

/* The id of a team's communicator: made by its first member, shared through
   the world (threads) or rank 0's store (processes). */
static hir_status hir_nccl__team_id(hir_nccl__rank *nc, const int *devices, int n, ncclUniqueId *id) {
  char key[HIR_NCCL__KEY_BYTES];
  size_t k = 0;
  int i;
  k += (size_t)snprintf(key, sizeof key, "team");
  for (i = 0; i < n && k < sizeof key - 12; i++) k += (size_t)snprintf(key + k, sizeof key - k, ":%d", devices[i]);
  if (nc->shared) {
    hir_nccl_world *w = nc->shared;
    hir_status s = HIR_OK;
    pthread_mutex_lock(&w->mu);
    for (i = 0; i < w->nids && strcmp(w->ids[i].key, key) != 0; i++) {}
    if (i == w->nids) {
      if (w->nids == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        hir_nccl__kv *ids = (hir_nccl__kv *)realloc(w->ids, (size_t)cap * sizeof *ids);
        if (ids) {
          w->ids = ids;
          w->cap = cap;
        }
      }
      if (w->nids < w->cap && ncclGetUniqueId((ncclUniqueId *)w->ids[i].value) == ncclSuccess) {
        snprintf(w->ids[i].key, sizeof w->ids[i].key, "%s", key);
        w->nids++;
      } else {
        snprintf(nc->comm.error, sizeof nc->comm.error, "hostir_nccl: cannot make an id for team %s", key);
        s = HIR_ERR_COMM;
      }
    }
    if (s == HIR_OK) memcpy(id, w->ids[i].value, sizeof *id);
    pthread_mutex_unlock(&w->mu);
    return s;
  }
  if (devices[0] == nc->comm.rank) {
    hir_status s = HIR_NCCL__CHECK(&nc->comm, ncclGetUniqueId(id));
    return s != HIR_OK ? s : hir_nccl__store_set(&nc->store, key, id, nc->timeout_ms, nc->comm.error, sizeof nc->comm.error);
  }
  return hir_nccl__store_get(&nc->store, key, id, nc->timeout_ms, nc->comm.error, sizeof nc->comm.error);
}

static hir_status hir_nccl__make_team(hir_comm *c, const int *devices, int n, void **out) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t;
  ncclUniqueId id;
  hir_status s;
  int i, me = -1, whole = n == c->size;
  for (i = 0; i < n; i++) {
    if (devices[i] < 0 || devices[i] >= c->size) {
      snprintf(c->error, sizeof c->error, "hostir_nccl: device %d of a team is outside the world of %d ranks", devices[i], c->size);
      return HIR_ERR_INVALID;
    }
    if (devices[i] == c->rank) me = i;
    whole &= devices[i] == i;
  }
  if (me < 0) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: rank %d asked for a team it is not in", c->rank);
    return HIR_ERR_INVALID;
  }
  if (whole) { /* the world itself, in rank order */
    *out = &nc->world_team;
    return HIR_OK;
  }
  for (t = nc->teams; t; t = t->next)
    if (t->n == n && memcmp(t->devices, devices, (size_t)n * sizeof(int)) == 0) {
      *out = t;
      return HIR_OK;
    }
  if ((s = hir_nccl__team_id(nc, devices, n, &id)) != HIR_OK) return s;
  if (!(t = (hir_nccl__team *)calloc(1, sizeof *t)) || !(t->devices = (int *)malloc((size_t)n * sizeof(int)))) {
    free(t);
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  memcpy(t->devices, devices, (size_t)n * sizeof(int));
  t->n = n;
  t->me = me;
  cudaSetDevice(nc->device);
  if ((s = hir_nccl__init_comm(c, &t->comm, n, id, me)) != HIR_OK) {
    free(t->devices);
    free(t);
    return s;
  }
  t->next = nc->teams;
  nc->teams = t;
  *out = t;
  return HIR_OK;
}

static hir_status hir_nccl__root(hir_comm *c, const hir_nccl__team *t, int root, int *index) {
  if ((*index = hir_team_index(t->devices, t->n, root)) >= 0) return HIR_OK;
  snprintf(c->error, sizeof c->error, "hostir_nccl: the root %d is not in the team", root);
  return HIR_ERR_INVALID;
}

static hir_status hir_nccl__allgather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  return HIR_NCCL__CHECK(c, ncclAllGather(send, recv, bytes, ncclUint8, t->comm, (cudaStream_t)stream));
}

static hir_status hir_nccl__allreduce(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt,
                                      void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  return HIR_NCCL__CHECK(c, ncclAllReduce(send, recv, count, hir_nccl__type(dt), ncclSum, t->comm, (cudaStream_t)stream));
}

static hir_status hir_nccl__reduce_scatter(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt,
                                           void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  return HIR_NCCL__CHECK(c, ncclReduceScatter(send, recv, count, hir_nccl__type(dt), ncclSum, t->comm, (cudaStream_t)stream));
}

static hir_status hir_nccl__reduce(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt, int root,
                                   void *stream) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t = (hir_nccl__team *)team;
  size_t bytes = count * hir_dtype_size(dt);
  hir_status s;
  int r;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (!send) { /* a root that holds no data contributes zeros */
    if (nc->zeros_cap < bytes) {
      if (nc->zeros) {
        cudaStreamSynchronize((cudaStream_t)stream);
        cudaFree(nc->zeros);
        nc->zeros = NULL;
        nc->zeros_cap = 0;
      }
      if (cudaMalloc(&nc->zeros, bytes) != cudaSuccess) {
        snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMalloc of %zu bytes for a reduce failed", bytes);
        return HIR_ERR_NOMEM;
      }
      nc->zeros_cap = bytes;
    }
    if (cudaMemsetAsync(nc->zeros, 0, bytes, (cudaStream_t)stream) != cudaSuccess) {
      snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemsetAsync failed");
      return HIR_ERR_BACKEND;
    }
    send = nc->zeros;
  }
  return HIR_NCCL__CHECK(c, ncclReduce(send, recv, count, hir_nccl__type(dt), ncclSum, r, t->comm, (cudaStream_t)stream));
}

static hir_status hir_nccl__broadcast(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_status s;
  int r;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (!recv) recv = (void *)send; /* the root need not keep a copy */
  return HIR_NCCL__CHECK(c, ncclBroadcast(send, recv, bytes, ncclUint8, r, t->comm, (cudaStream_t)stream));
}

/* Gather and scatter as grouped send/recv in the team's communicator. */
static hir_status hir_nccl__gather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  cudaStream_t st = (cudaStream_t)stream;
  hir_status s;
  int r, i;
  size_t at = 0;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (t->me != r) return HIR_NCCL__CHECK(c, ncclSend(send, bytes, ncclUint8, r, t->comm, st));
  if ((s = HIR_NCCL__CHECK(c, ncclGroupStart())) != HIR_OK) return s;
  for (i = 0; i < t->n && s == HIR_OK; i++) {
    if (i == r && !send) continue; /* the root holds no chunk */
    if (i == r)
      s = cudaMemcpyAsync((char *)recv + at, send, bytes, cudaMemcpyDeviceToDevice, st) == cudaSuccess ? HIR_OK : HIR_ERR_BACKEND;
    else
      s = HIR_NCCL__CHECK(c, ncclRecv((char *)recv + at, bytes, ncclUint8, i, t->comm, st));
    at += bytes;
  }
  if (s == HIR_ERR_BACKEND) snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemcpyAsync in a gather failed");
  return s == HIR_OK ? HIR_NCCL__CHECK(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

static hir_status hir_nccl__scatter(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  cudaStream_t st = (cudaStream_t)stream;
  hir_status s;
  int r, i;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (t->me != r) return HIR_NCCL__CHECK(c, ncclRecv(recv, bytes, ncclUint8, r, t->comm, st));
  if ((s = HIR_NCCL__CHECK(c, ncclGroupStart())) != HIR_OK) return s;
  for (i = 0; i < t->n && s == HIR_OK; i++) {
    const char *chunk = (const char *)send + (size_t)i * bytes;
    if (i == r)
      s = cudaMemcpyAsync(recv, chunk, bytes, cudaMemcpyDeviceToDevice, st) == cudaSuccess ? HIR_OK : HIR_ERR_BACKEND;
    else
      s = HIR_NCCL__CHECK(c, ncclSend(chunk, bytes, ncclUint8, i, t->comm, st));
  }
  if (s == HIR_ERR_BACKEND) snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemcpyAsync in a scatter failed");
  return s == HIR_OK ? HIR_NCCL__CHECK(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

/* ---- copy-engine send/recv (threaded world) ---- */

static int hir_nccl__ce_on(hir_comm *c) { return hir_nccl__of(c)->shared && c->p2p_copy_engine; }

static hir_status hir_nccl__ce_fail(hir_comm *c, hir_status s, const char *what, const char *detail) {
  snprintf(c->error, sizeof c->error, "hostir_nccl (copy engine): %s on rank %d: %s", what, c->rank, detail);
  return s;
}

/* Waits (mu held) until the counter *have reaches want, or the deadline. */
static hir_status hir_nccl__ce_wait(hir_comm *c, const unsigned long long *have, unsigned long long want, const char *what) {
  hir_nccl_world *w = hir_nccl__of(c)->shared;
  double deadline = hir_nccl__wall_ms() + hir_nccl__of(c)->timeout_ms;
  while (*have < want) {
    struct timespec ts;
    double now = hir_nccl__wall_ms();
    if (now > deadline || hir_nccl__of(c)->aborted) {
      snprintf(c->error, sizeof c->error,
               "hostir_nccl (copy engine): %s on rank %d: its peer did not come within %d ms (a peer is dead or stuck, "
               "or its sends and receives do not match)", what, c->rank, hir_nccl__of(c)->timeout_ms);
      return HIR_ERR_TIMEOUT;
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 1000000L; /* wake at least every ms to check the deadline */
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&w->ce_cv, &w->mu, &ts);
  }
  return HIR_OK;
}

static void hir_nccl__ce_advance(hir_nccl_world *w, unsigned long long *counter) {
  pthread_mutex_lock(&w->mu);
  ++*counter;
  pthread_cond_broadcast(&w->ce_cv);
  pthread_mutex_unlock(&w->mu);
}

static hir_status hir_nccl__ce_post_recv(hir_comm *c, hir_nccl__ce_op *op) {
  hir_nccl_world *w = hir_nccl__of(c)->shared;
  hir_nccl__ce_box *box = &w->boxes[op->peer * w->n + c->rank];
  hir_nccl__ce_post *slot;
  hir_status s;
  unsigned long long room;
  pthread_mutex_lock(&w->mu);
  room = box->posted + 1 > HIR_NCCL__CE_SLOTS ? box->posted + 1 - HIR_NCCL__CE_SLOTS : 0; /* the slot's last use is done */
  s = hir_nccl__ce_wait(c, &box->received, room, "a receive");
  slot = &box->slot[box->posted % HIR_NCCL__CE_SLOTS];
  pthread_mutex_unlock(&w->mu);
  if (s != HIR_OK) return s;
  if ((!slot->ready && cudaEventCreateWithFlags(&slot->ready, cudaEventDisableTiming) != cudaSuccess) ||
      cudaEventRecord(slot->ready, (cudaStream_t)op->stream) != cudaSuccess)
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "recording a receive", cudaGetErrorString(cudaGetLastError()));
  pthread_mutex_lock(&w->mu);
  slot->buf = op->buf;
  slot->bytes = op->bytes;
  op->seq = box->posted++;
  pthread_cond_broadcast(&w->ce_cv);
  pthread_mutex_unlock(&w->mu);
  return HIR_OK;
}

static hir_status hir_nccl__ce_send(hir_comm *c, const hir_nccl__ce_op *op) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl_world *w = nc->shared;
  hir_nccl__ce_box *box = &w->boxes[c->rank * w->n + op->peer];
  hir_nccl__ce_post *slot;
  hir_status s;
  cudaError_t e;
  char detail[160];
  pthread_mutex_lock(&w->mu);
  s = hir_nccl__ce_wait(c, &box->posted, box->sent + 1, "a send");
  slot = &box->slot[box->sent % HIR_NCCL__CE_SLOTS];
  pthread_mutex_unlock(&w->mu);
  if (s != HIR_OK) return s;
  if (slot->bytes != op->bytes) {
    snprintf(detail, sizeof detail, "it sends %zu bytes to rank %d, which receives %zu; match the sizes", op->bytes,
             op->peer, slot->bytes);
    return hir_nccl__ce_fail(c, HIR_ERR_SHAPE, "a send", detail);
  }
  if ((!slot->done && cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming) != cudaSuccess) ||
      (!nc->ce_stream && cudaStreamCreateWithFlags(&nc->ce_stream, cudaStreamNonBlocking) != cudaSuccess) ||
      (!nc->ce_source && cudaEventCreateWithFlags(&nc->ce_source, cudaEventDisableTiming) != cudaSuccess))
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "a send", cudaGetErrorString(cudaGetLastError()));
  if ((e = cudaEventRecord(nc->ce_source, (cudaStream_t)op->stream)) != cudaSuccess ||
      (e = cudaStreamWaitEvent(nc->ce_stream, nc->ce_source, 0)) != cudaSuccess ||
      (e = cudaStreamWaitEvent(nc->ce_stream, slot->ready, 0)) != cudaSuccess ||
      (e = cudaMemcpyPeerAsync(slot->buf, w->ranks[op->peer].device, op->buf, nc->device, op->bytes, nc->ce_stream)) !=
          cudaSuccess ||
      (e = cudaEventRecord(slot->done, nc->ce_stream)) != cudaSuccess ||
      (e = cudaStreamWaitEvent((cudaStream_t)op->stream, slot->done, 0)) != cudaSuccess) /* the buffer is the sender's again */
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "a peer copy", cudaGetErrorString(e));
  hir_nccl__ce_advance(w, &box->sent);
  return HIR_OK;
}

static hir_status hir_nccl__ce_finish_recv(hir_comm *c, const hir_nccl__ce_op *op) {
  hir_nccl_world *w = hir_nccl__of(c)->shared;
  hir_nccl__ce_box *box = &w->boxes[op->peer * w->n + c->rank];
  hir_status s;
  cudaError_t e;
  pthread_mutex_lock(&w->mu);
  s = hir_nccl__ce_wait(c, &box->sent, op->seq + 1, "a receive");
  pthread_mutex_unlock(&w->mu);
  if (s != HIR_OK) return s;
  if ((e = cudaStreamWaitEvent((cudaStream_t)op->stream, box->slot[op->seq % HIR_NCCL__CE_SLOTS].done, 0)) != cudaSuccess)
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "a receive", cudaGetErrorString(e));
  hir_nccl__ce_advance(w, &box->received);
  return HIR_OK;
}

/* Receives are posted first, so that every send of the group, in any order
   on any rank, finds its match. */
static hir_status hir_nccl__ce_run(hir_comm *c, hir_nccl__ce_op *ops, int n) {
  hir_status s = HIR_OK;
  int i;
  cudaSetDevice(hir_nccl__of(c)->device);
  for (i = 0; i < n && s == HIR_OK; i++)
    if (!ops[i].send) s = hir_nccl__ce_post_recv(c, &ops[i]);
  for (i = 0; i < n && s == HIR_OK; i++)
    if (ops[i].send) s = hir_nccl__ce_send(c, &ops[i]);
  for (i = 0; i < n && s == HIR_OK; i++)
    if (!ops[i].send) s = hir_nccl__ce_finish_recv(c, &ops[i]);
  return s;
}

static hir_status hir_nccl__ce_queue(hir_comm *c, int send, const void *buf, size_t bytes, int peer, void *stream) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__ce_op op;
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    char detail[96];
    snprintf(detail, sizeof detail, "peer %d is not another rank of the world of %d", peer, c->size);
    return hir_nccl__ce_fail(c, HIR_ERR_INVALID, send ? "a send" : "a receive", detail);
  }
  op.send = send;
  op.peer = peer;
  op.buf = (void *)buf;
  op.bytes = bytes;
  op.stream = stream;
  op.seq = 0;
  if (!nc->ce_group) return hir_nccl__ce_run(c, &op, 1);
  if (nc->ce_nops == HIR_NCCL__CE_GROUP)
    return hir_nccl__ce_fail(c, HIR_ERR_UNSUPPORTED, "a group", "more than 256 sends and receives in one group");
  nc->ce_ops[nc->ce_nops++] = op;
  return HIR_OK;
}

static hir_status hir_nccl__send(hir_comm *c, const void *buf, size_t bytes, int peer, void *stream) {
  if (hir_nccl__ce_on(c)) return hir_nccl__ce_queue(c, 1, buf, bytes, peer, stream);
  return HIR_NCCL__CHECK(c, ncclSend(buf, bytes, ncclUint8, peer, hir_nccl__of(c)->world, (cudaStream_t)stream));
}
static hir_status hir_nccl__recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  if (hir_nccl__ce_on(c)) return hir_nccl__ce_queue(c, 0, buf, bytes, peer, stream);
  return HIR_NCCL__CHECK(c, ncclRecv(buf, bytes, ncclUint8, peer, hir_nccl__of(c)->world, (cudaStream_t)stream));
}
static hir_status hir_nccl__group_start(hir_comm *c) {
  hir_nccl__of(c)->ce_group++;
  return HIR_NCCL__CHECK(c, ncclGroupStart());
}
static hir_status hir_nccl__group_end(hir_comm *c) { /* the copies of the outermost group, then NCCL's */
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_status s = HIR_OK;
  if (nc->ce_group > 0 && --nc->ce_group == 0 && nc->ce_nops) {
    s = hir_nccl__ce_run(c, nc->ce_ops, nc->ce_nops);
    nc->ce_nops = 0;
  }
  return s == HIR_OK ? HIR_NCCL__CHECK(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

/* User-buffer registration (where NCCL supports it; a buffer it refuses
   still works, through NCCL's own staging): with the world and each team. */
static void hir_nccl__register(hir_comm *c, void *ptr, size_t bytes) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__reg *r;
  hir_nccl__team *t;
  if (bytes < ((size_t)1 << 20) || nc->aborted || !(r = (hir_nccl__reg *)calloc(1, sizeof *r))) return;
  r->ptr = ptr;
  if (HIR_NCCL__CHECK(c, ncclCommRegister(nc->world, ptr, bytes, &r->handles[r->n])) == HIR_OK) r->comms[r->n++] = nc->world;
  for (t = nc->teams; t && r->n < 16; t = t->next)
    if (HIR_NCCL__CHECK(c, ncclCommRegister(t->comm, ptr, bytes, &r->handles[r->n])) == HIR_OK) r->comms[r->n++] = t->comm;
  r->next = nc->regs;
  nc->regs = r;
}

static void hir_nccl__deregister(hir_comm *c, void *ptr) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__reg **p, *r;
  int i;
  for (p = &nc->regs; (r = *p) && r->ptr != ptr; p = &r->next) {}
  if (!r) return;
  *p = r->next;
  for (i = 0; i < r->n && !nc->aborted; i++) HIR_NCCL__CHECK(c, ncclCommDeregister(r->comms[i], r->handles[i]));
  free(r);
}

/* An error raised asynchronously by work in flight (a peer that died). */
static hir_status hir_nccl__poll(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t;
  ncclResult_t r = ncclSuccess;
  if (nc->aborted) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: the communicator of rank %d was aborted", c->rank);
    return HIR_ERR_COMM;
  }
  if (ncclCommGetAsyncError(nc->world, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
    return hir_nccl__check(c, r, "NCCL (asynchronous, world)", __LINE__);
  for (t = nc->teams; t; t = t->next)
    if (ncclCommGetAsyncError(t->comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
      return hir_nccl__check(c, r, "NCCL (asynchronous, team)", __LINE__);
  return HIR_OK;
}

static void hir_nccl__init(hir_nccl__rank *nc, int rank, int size, int device) {
  hir_comm *c = &nc->comm;
  memset(nc, 0, sizeof *nc);
  nc->device = device;
  nc->timeout_ms = 60000;
  c->ctx = nc;
  c->rank = rank;
  c->size = size;
  c->needs_device_memory = 1;
  c->team = hir_nccl__make_team;
  c->allgather = hir_nccl__allgather;
  c->allreduce = hir_nccl__allreduce;
  c->reduce_scatter = hir_nccl__reduce_scatter;
  c->reduce = hir_nccl__reduce;
  c->broadcast = hir_nccl__broadcast;
  c->gather = hir_nccl__gather;
  c->scatter = hir_nccl__scatter;
  c->send = hir_nccl__send;
  c->recv = hir_nccl__recv;
  c->group_start = hir_nccl__group_start;
  c->group_end = hir_nccl__group_end;
  c->abort = hir_nccl__abort;
  c->poll = hir_nccl__poll;
  c->register_buffer = hir_nccl__register;
  c->deregister_buffer = hir_nccl__deregister;
}

static void hir_nccl__release(hir_nccl__rank *nc) {
  while (nc->regs) hir_nccl__deregister(&nc->comm, nc->regs->ptr);
  while (nc->teams) {
    hir_nccl__team *t = nc->teams;
    nc->teams = t->next;
    if (!nc->aborted) ncclCommDestroy(t->comm);
    free(t->devices);
    free(t);
  }
  if (nc->world && !nc->aborted) ncclCommDestroy(nc->world);
  if (nc->zeros) cudaFree(nc->zeros);
  if (nc->ce_stream) cudaStreamDestroy(nc->ce_stream);
  if (nc->ce_source) cudaEventDestroy(nc->ce_source);
  free(nc->world_team.devices);
}

static hir_status hir_nccl__world_team(hir_nccl__rank *nc) {
  int i;
  if (!(nc->world_team.devices = (int *)malloc((size_t)nc->comm.size * sizeof(int)))) {
    snprintf(nc->comm.error, sizeof nc->comm.error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  for (i = 0; i < nc->comm.size; i++) nc->world_team.devices[i] = i;
  nc->world_team.n = nc->comm.size;
  nc->world_team.me = nc->comm.rank;
  nc->world_team.comm = nc->world;
  return HIR_OK;
}

// >>nccl_bootstrap
HIRDEF hir_status hir_nccl_world_create(int nranks, hir_nccl_world **out) {
  hir_nccl_world *w;
  ncclComm_t *comms;
  int *devs, i, ndev = 0;
  hir_status s = HIR_OK;
  if (!out) return HIR_ERR_INVALID;
  if (!(w = *out = (hir_nccl_world *)calloc(1, sizeof *w))) return HIR_ERR_NOMEM;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->ce_cv, NULL);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || nranks < 1 || nranks > ndev) {
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: %d ranks asked, %d GPUs visible", nranks, ndev);
    return HIR_ERR_INVALID;
  }
  comms = (ncclComm_t *)calloc((size_t)nranks, sizeof *comms);
  devs = (int *)calloc((size_t)nranks, sizeof *devs);
  w->ranks = (hir_nccl__rank *)calloc((size_t)nranks, sizeof *w->ranks);
  if (!comms || !devs || !w->ranks) {
    free(comms);
    free(devs);
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: out of memory");
    return HIR_ERR_NOMEM;
  }
  for (i = 0; i < nranks; i++) devs[i] = i;
  if (ncclCommInitAll(comms, nranks, devs) != ncclSuccess) {
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: ncclCommInitAll over %d GPUs failed", nranks);
    s = HIR_ERR_COMM;
  }
  for (i = 0; i < nranks && s == HIR_OK; i++) {
    hir_nccl__init(&w->ranks[i], i, nranks, i);
    w->ranks[i].world = comms[i];
    w->ranks[i].shared = w;
    if ((s = hir_nccl__world_team(&w->ranks[i])) != HIR_OK) snprintf(w->error, sizeof w->error, "%s", w->ranks[i].comm.error);
  }
  if (s == HIR_OK && !(w->boxes = (hir_nccl__ce_box *)calloc((size_t)(nranks * nranks), sizeof *w->boxes))) {
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: out of memory");
    s = HIR_ERR_NOMEM;
  }
  w->n = s == HIR_OK ? nranks : 0;
  free(comms);
  free(devs);
  return s;
}

HIRDEF hir_comm *hir_nccl_world_comm(hir_nccl_world *w, int rank) {
  return (w && rank >= 0 && rank < w->n) ? &w->ranks[rank].comm : NULL;
}
HIRDEF const char *hir_nccl_world_error(const hir_nccl_world *w) { return w ? w->error : "hir_nccl_world: NULL"; }

/* Direct peer copies where the GPUs can reach each other (else CUDA stages
   them through the host, still off the SMs). */
HIRDEF void hir_nccl_world_set_copy_engine(hir_nccl_world *w, int enable) {
  int i, j, can, current = 0;
  if (!w || !w->n) return;
  cudaGetDevice(&current);
  for (i = 0; enable && !w->peer_access && i < w->n; i++)
    for (j = 0; j < w->n; j++)
      if (i != j && cudaSetDevice(i) == cudaSuccess && cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && can &&
          cudaDeviceEnablePeerAccess(j, 0) != cudaSuccess)
        cudaGetLastError(); /* already enabled */
  cudaSetDevice(current);
  w->peer_access |= enable != 0;
  for (i = 0; i < w->n; i++) w->ranks[i].comm.p2p_copy_engine = enable != 0;
}

HIRDEF void hir_nccl_world_free(hir_nccl_world *w) {
  int i, k;
  if (!w) return;
  for (i = 0; i < w->n; i++) {
    cudaSetDevice(w->ranks[i].device);
    hir_nccl__release(&w->ranks[i]);
  }
  for (i = 0; w->boxes && i < w->n * w->n; i++) /* a box's events: ready on the receiver, done on the sender */
    for (k = 0; k < HIR_NCCL__CE_SLOTS; k++) {
      if (w->boxes[i].slot[k].ready) cudaSetDevice(i % w->n), cudaEventDestroy(w->boxes[i].slot[k].ready);
      if (w->boxes[i].slot[k].done) cudaSetDevice(i / w->n), cudaEventDestroy(w->boxes[i].slot[k].done);
    }
  free(w->boxes);
  pthread_cond_destroy(&w->ce_cv);
  free(w->ranks);
  free(w->ids);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

static int hir_nccl__env_int(const char *const *names, int *value) {
  int i;
  for (i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      *value = atoi(v);
      return 1;
    }
  }
  return 0;
}

HIRDEF hir_status hir_nccl_env_read(hir_nccl_env *env, char *error, size_t cap) {
  static const char *const rank[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const size[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  static const char *const local[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
  static const char *const port[] = {"MASTER_PORT", NULL};
  static const char *const hostir_port[] = {"HOSTIR_PORT", NULL};
  const char *addr = getenv("MASTER_ADDR");
  if (!env) return HIR_ERR_INVALID;
  memset(env, 0, sizeof *env);
  if (!hir_nccl__env_int(rank, &env->rank) || !hir_nccl__env_int(size, &env->size)) {
    if (error && cap)
      snprintf(error, cap, "hir_nccl_env_read: no rank or world size in the environment (RANK/WORLD_SIZE, "
               "OMPI_COMM_WORLD_RANK/SIZE or SLURM_PROCID/NTASKS); start with torchrun, mpirun or srun");
    return HIR_ERR_INVALID;
  }
  if (!hir_nccl__env_int(local, &env->local_rank)) env->local_rank = env->rank;
  if (!hir_nccl__env_int(port, &env->master_port)) env->master_port = 29500;
  /* torchrun's own store listens on MASTER_PORT: ours takes the next port */
  if (getenv("TORCHELASTIC_RUN_ID")) env->master_port++;
  hir_nccl__env_int(hostir_port, &env->master_port);
  snprintf(env->master_addr, sizeof env->master_addr, "%s", addr && *addr ? addr : "127.0.0.1");
  if (env->size < 1 || env->rank < 0 || env->rank >= env->size || env->local_rank < 0) {
    if (error && cap)
      snprintf(error, cap, "hir_nccl_env_read: rank %d, world size %d and local rank %d do not fit", env->rank, env->size,
               env->local_rank);
    return HIR_ERR_INVALID;
  }
  return HIR_OK;
}

HIRDEF hir_status hir_nccl_comm_create(const hir_nccl_env *env, int timeout_ms, hir_comm **out) {
  hir_nccl__rank *nc;
  ncclUniqueId id;
  hir_status s;
  int ndev = 0;
  if (!env || !out) return HIR_ERR_INVALID;
  if (!(nc = (hir_nccl__rank *)malloc(sizeof *nc))) return HIR_ERR_NOMEM;
  hir_nccl__init(nc, env->rank, env->size, env->local_rank);
  *out = &nc->comm;
  if (timeout_ms > 0) nc->timeout_ms = timeout_ms;
  snprintf(nc->store.addr, sizeof nc->store.addr, "%s", env->master_addr);
  nc->store.port = env->master_port;
  nc->store.listen_fd = -1;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || env->local_rank >= ndev || cudaSetDevice(env->local_rank) != cudaSuccess) {
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create: rank %d wants GPU %d, %d visible", env->rank,
             env->local_rank, ndev);
    return HIR_ERR_INVALID;
  }
  if (env->rank == 0) {
    if ((s = hir_nccl__store_serve_start(&nc->store, nc->comm.error, sizeof nc->comm.error)) != HIR_OK) return s;
    if ((s = HIR_NCCL__CHECK(&nc->comm, ncclGetUniqueId(&id))) != HIR_OK ||
        (s = hir_nccl__store_set(&nc->store, "world", &id, nc->timeout_ms, nc->comm.error, sizeof nc->comm.error)) != HIR_OK)
      return s;
  } else if ((s = hir_nccl__store_get(&nc->store, "world", &id, nc->timeout_ms, nc->comm.error, sizeof nc->comm.error)) != HIR_OK) {
    return s;
  }
  if ((s = hir_nccl__init_comm(&nc->comm, &nc->world, env->size, id, env->rank)) != HIR_OK) return s;
  return hir_nccl__world_team(nc);
}

HIRDEF void hir_nccl_comm_free(hir_comm *c) {
  hir_nccl__rank *nc;
  if (!c) return;
  nc = hir_nccl__of(c);
  cudaSetDevice(nc->device);
  hir_nccl__release(nc);
  hir_nccl__store_stop(&nc->store);
  free(nc);
}

#endif /* HOSTIR_NCCL_IMPLEMENTATION_DONE */
#endif /* HOSTIR_NCCL_IMPLEMENTATION */
