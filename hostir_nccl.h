/* hostir_nccl.h - hostir's communicator (hir_comm) on NCCL, and its bootstrap.
   No warranty implied; MIT license (see hostir.h).

   Do this:
       #define HOSTIR_IMPLEMENTATION        (in one file, as for hostir.h)
       #define HOSTIR_NCCL_IMPLEMENTATION   (in one file)
       #include "hostir_nccl.h"
   and link -lnccl -lcudart. The implementation uses POSIX sockets, threads
   and shared memory; where the compiler is strict ISO C (-std=c11) it asks
   for POSIX itself, so include it before any system header there.

   Three ways to start:
     - one process driving every local GPU, one thread per rank:
           hir_nccl_world *w; hir_nccl_world_create(4, &w);
           ... on thread r: hir_comm *c = hir_nccl_world_comm(w, r);
     - one process per GPU (torchrun, mpirun, srun, MPICH's mpiexec):
           hir_nccl_env env; hir_comm *c;
           if (hir_nccl_env_read(&env, err, sizeof err) != HIR_OK ||
               hir_nccl_comm_create(&env, 60000, &c) != HIR_OK) ...
       hir_nccl_env_read takes the rank, the world's size and the local rank
       from the launcher's variables, and rank 0's host from MASTER_ADDR, else
       from the launcher (Slurm's node list: its first host; Open MPI's
       mpirun host, where rank 0 runs under its default mapping); where
       nothing names it and the world spans hosts it says what to set.
       The GPU is GPU 0 where the process sees one GPU (srun --gpus-per-task,
       a CUDA_VISIBLE_DEVICES per rank), else the local rank.
       Rank 0 hands out NCCL's ids over TCP at MASTER_ADDR:MASTER_PORT
       (default 29500; under torchrun, whose own store holds MASTER_PORT, the
       port after it; HOSTIR_PORT overrides; host names, IPv4 and IPv6).
       It listens only there and answers only ranks that prove, by an HMAC
       over fresh nonces, that they know the job's secret (and proves the
       same to them): HOSTIR_SECRET where set (give every rank the same),
       else one derived from what the launcher tells every rank of one job
       alone (torchrun's run id, Slurm's job and step ids, Open MPI's job
       id) with the world's size and the port (weak where the launcher
       tells nothing of the job: hir_nccl_comm_describe says so). Strangers,
       replays, garbage and stalled connections are refused, and counted in
       rank 0's timeout messages; nccl_store says what is not covered (the
       values cross the network in the clear).
     - one process per GPU in a runtime that has NCCL set up already:
       hir_nccl_comm_create_from_id from the id it broadcast, or
       hir_nccl_comm_from_nccl on its communicator (no port, no store).

   A rank's device id is its rank in the world. Collectives run on the stream
   the evaluator passes (the current stream); a team other than the whole
   world gets its own NCCL communicator, made by its members only. Every wait
   of the bootstrap has a deadline, and hir_evaluator_sync polls
   ncclCommGetAsyncError and aborts the communicators when a peer is dead. A
   rank that fails (hir_comm.abort) leaves its message for the others - in
   the world (threads), in its host's shared block (processes with copy
   engines) and in rank 0's store (processes from hir_nccl_comm_create) -
   and every rank that waits for it returns HIR_ERR_COMM with that message
   within a few hundred milliseconds. Send/recv between the GPUs of one host
   run on the copy engines (nccl_peer): by default between processes,
   switched for the threaded world. Private names start with hir_nccl__.

   Table of contents (grep the markers); a section calls only the ones above it:
       // >>nccl_net        sockets under deadlines: name lookup, connect, send, receive
       // >>nccl_store      rank 0's store for NCCL's ids and the abort note: a mutual HMAC handshake, bounded requests
       // >>nccl_env        the launcher's variables: ranks, rank 0's host, port, secret, GPU
       // >>nccl_peer       copy engines between the ranks of a host: shared mailboxes, signal pad, IPC exports
       // >>nccl_kernels    collectives on kernels of ours: peers' mapped workspaces, data that lands as its own flag
       // >>nccl_comm       hir_comm on NCCL: teams, collectives, copy-engine send/recv, errors
       // >>nccl_bootstrap  the threaded world, one process per GPU, the caller's NCCL */
#ifndef HOSTIR_NCCL_H
#define HOSTIR_NCCL_H
#if defined(HOSTIR_NCCL_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE) && \
    !defined(_DEFAULT_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "hostir.h"
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hir_nccl_world hir_nccl_world;
/* One process, `nranks` local GPUs (rank r on GPU r). On failure *out holds
   only the error (hir_nccl_world_error; free it), or is NULL. */
HIRDEF hir_status  hir_nccl_world_create(int nranks, hir_nccl_world **out);
HIRDEF hir_comm   *hir_nccl_world_comm(hir_nccl_world *w, int rank);  /* owned by the world */
HIRDEF const char *hir_nccl_world_error(const hir_nccl_world *w);
HIRDEF void        hir_nccl_world_free(hir_nccl_world *w);  /* after the evaluators (see hir_nccl_comm_free) */
/* Send/recv between the world's ranks on the GPUs' copy engines
   (cudaMemcpyPeerAsync over NVLink) instead of NCCL's kernels, which wait
   for SMs while a GEMM holds them all; collectives stay on NCCL. Off by
   default; switch it only while no rank is running a program. Each rank's
   hir_comm says so (p2p_copy_engine), for hir_lower_desc.comm. */
HIRDEF void        hir_nccl_world_set_copy_engine(hir_nccl_world *w, int enable);

/* One process per GPU: what hir_nccl_env_read found (or fill it yourself). */
typedef struct hir_nccl_env {
  int rank, size, local_rank;
  char master_addr[256];        /* rank 0's host: a name, an IPv4 or an IPv6 address */
  int master_port;              /* where rank 0 serves the bootstrap */
  int local_size;               /* ranks on this host; 0 where the launcher does not say */
  int spans_hosts;              /* the launcher says the world spans hosts */
  int gpu;                      /* the CUDA device this rank uses; -1: none visible */
  char secret[256];             /* what every rank of the job proves it knows to the bootstrap (1 to 255 characters) */
  int weak_secret;              /* 1: derived from the launcher's name, the size and the port alone, which another user
                                   of the host can guess: set HOSTIR_SECRET (hir_nccl_comm_describe says so too) */
  char origin[300];             /* where these came from, for messages */
} hir_nccl_env;
HIRDEF hir_status hir_nccl_env_read(hir_nccl_env *env, char *error, size_t cap);
/* Sets the device env->gpu and joins the world (collective over all
   ranks). On failure *out holds only the error (its `error`; free it). */
HIRDEF hir_status hir_nccl_comm_create(const hir_nccl_env *env, int timeout_ms, hir_comm **out);
/* For runtimes that set up NCCL themselves. From an id the runtime made
   (ncclGetUniqueId on one rank) and handed to every rank (MPI_Bcast,
   torch.distributed.broadcast_object_list): the GPU is the only one visible,
   else the local rank's. Or on the runtime's own communicator, borrowed:
   hostir never destroys or aborts it (after a dead peer, abort it yourself);
   make it nonblocking (ncclConfig_t.blocking = 0) for hostir's deadlines to
   hold inside NCCL. Teams are new communicators, made by their members. */
HIRDEF hir_status hir_nccl_comm_create_from_id(int rank, int size, int local_rank, const ncclUniqueId *id, int timeout_ms,
                                               hir_comm **out);
HIRDEF hir_status hir_nccl_comm_from_nccl(ncclComm_t comm, int timeout_ms, hir_comm **out);
/* Send/recv between the ranks of one host run on the GPUs' copy engines
   (CUDA IPC, see nccl_peer), those to other hosts on NCCL. On by default
   where every rank of the host could set it up (HOSTIR_COPY_ENGINE=0 on
   any of them turns it off there); its hir_comm says so (p2p_copy_engine,
   1 when every peer shares the host). Switch it on every rank alike, while
   no rank runs a program: HIR_ERR_UNSUPPORTED where it could not be set up. */
HIRDEF hir_status hir_nccl_comm_set_copy_engine(hir_comm *c, int enable);
/* 1 where this rank's collectives and NCCL send/recv run on blocking twins
   of hostir's communicators, watched for its deadlines (the default: a
   launch on a nonblocking communicator costs the host 60-240 us); 0 where
   they run on the nonblocking ones (HOSTIR_NCCL_BLOCKING=0 on any rank, or
   a borrowed communicator). Every rank of a world answers alike. */
HIRDEF int        hir_nccl_comm_blocking(hir_comm *c);
/* Where every rank of the world shares one host (at most 8), all-reduce,
   reduce-scatter and all-gather over the world or a team of its ranks run
   on kernels of hostir's (nccl_kernels: one-shot and two-shot all-reduce
   through the peers' mapped workspaces) where they beat NCCL's, else on
   NCCL (HOSTIR_KERNEL_COLLECTIVES=0 on any rank: always NCCL). Which, and
   on how many CTAs (32 or 128), is measured for each size class when the
   communicator is made, the same on every rank (hir_nccl_comm_describe
   says it; HOSTIR_MEASURE_COLLECTIVES=0 on any rank: a fixed rule
   instead); a team of fewer ranks than the world measures its own when it
   is made (tens of milliseconds; plans saved by hir_tuner_save keep the
   world's only), and has a workspace of its own (64 MiB on each member's
   GPU). A
   path other than AUTO forces one for every size (for benchmarks and
   tests; ONE_SHOT and TWO_SHOT name the all-reduce's, the others take
   their kernel either way); ctas > 0 caps the CTAs a kernel
   collective takes (1 to 128; a forced path takes exactly that many), so a
   GEMM beside keeps the other SMs; 0: as measured. Set it on every rank
   alike, while no rank runs a program: HIR_ERR_UNSUPPORTED where a kernel
   path is asked and there are none. */
typedef enum hir_nccl_path { HIR_NCCL_PATH_AUTO, HIR_NCCL_PATH_NCCL, HIR_NCCL_PATH_ONE_SHOT, HIR_NCCL_PATH_TWO_SHOT } hir_nccl_path;
HIRDEF hir_status hir_nccl_comm_set_path(hir_comm *c, hir_nccl_path path, int ctas);
/* One line on how this rank joined and runs: the launcher and rank 0's
   address, where the bootstrap's secret came from (and whether it is weak:
   derived from nothing that is this job's alone), copy engines, twins. */
HIRDEF const char *hir_nccl_comm_describe(hir_comm *c);
/* Free the evaluators that use a communicator first: after a failure NCCL
   frees it only once the CUDA graphs that captured it are gone. */
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
#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// >>nccl_net
/* Every socket is nonblocking and every wait has a deadline (a time of
   hir_nccl__wall_ms), so that no peer, stranger or name server holds a rank. */
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

/* The wall-clock time `ms` from now, for timed condition waits. */
static struct timespec hir_nccl__after(double ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(ms / 1000);
  ts.tv_nsec += (long)(ms - 1000.0 * (double)(long)(ms / 1000)) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  return ts;
}

/* Whether fd became ready for `events` before the deadline. */
static int hir_nccl__ready(int fd, short events, double deadline) {
  for (;;) {
    struct pollfd p;
    double left = deadline - hir_nccl__wall_ms();
    int k;
    if (left <= 0) return 0;
    p.fd = fd;
    p.events = events;
    p.revents = 0;
    if ((k = poll(&p, 1, (int)left + 1)) > 0) return 1;
    if (k < 0 && errno != EINTR) return 0;
  }
}

/* All n bytes, or 0: closed, failed, or past the deadline. */
static int hir_nccl__io(int fd, void *buf, size_t n, int writing, double deadline) {
  char *p = (char *)buf;
  while (n) {
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (!(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
                 hir_nccl__ready(fd, writing ? POLLOUT : POLLIN, deadline))) {
      return 0;
    }
  }
  return 1;
}

static void hir_nccl__nonblocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* An address as text, "10.0.0.1" or "fe80::1". */
static void hir_nccl__addr_text(const struct sockaddr_storage *a, char *out, size_t cap) {
  const void *at = a->ss_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
                                            : (const void *)&((const struct sockaddr_in *)a)->sin_addr;
  if (!inet_ntop(a->ss_family, at, out, (socklen_t)cap)) snprintf(out, cap, "?");
}

static int hir_nccl__is_loopback(const struct sockaddr_storage *a) {
  if (a->ss_family == AF_INET) return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
  if (a->ss_family == AF_INET6) {
    const unsigned char *b = ((const struct sockaddr_in6 *)a)->sin6_addr.s6_addr;
    static const unsigned char v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    int i, zero = 1;
    for (i = 0; i < 15; i++) zero &= b[i] == 0;
    return (zero && b[15] == 1) || (memcmp(b, v4, 12) == 0 && b[12] == 127);
  }
  return 0;
}

/* A name lookup runs on a thread of its own, so that a slow name server
   costs the caller its deadline and no more; the thread and the caller
   share this, and the last one out frees it. */
typedef struct hir_nccl__lookup {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs, done, rc;
  char host[256], port[8];
  struct addrinfo *res;
} hir_nccl__lookup;

static void hir_nccl__lookup_leave(hir_nccl__lookup *l) { /* with mu held; releases it */
  int last = --l->refs == 0;
  pthread_mutex_unlock(&l->mu);
  if (!last) return;
  if (l->res) freeaddrinfo(l->res);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

static void *hir_nccl__lookup_run(void *arg) {
  hir_nccl__lookup *l = (hir_nccl__lookup *)arg;
  struct addrinfo hints, *res = NULL;
  int rc;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  rc = getaddrinfo(l->host, l->port, &hints, &res);
  pthread_mutex_lock(&l->mu);
  l->rc = rc;
  l->res = rc == 0 ? res : NULL;
  l->done = 1;
  pthread_cond_broadcast(&l->cv);
  hir_nccl__lookup_leave(l);
  return NULL;
}

/* host:port as at most `max` addresses (IPv4, IPv6) by the deadline; the
   count, or 0 with `why` filled. */
static int hir_nccl__resolve(const char *host, int port, double deadline, struct sockaddr_storage *addrs, socklen_t *lens,
                             int max, char *why, size_t cap) {
  hir_nccl__lookup *l = (hir_nccl__lookup *)calloc(1, sizeof *l);
  struct addrinfo *a;
  pthread_t thread;
  int n = 0;
  if (!l) {
    snprintf(why, cap, "out of memory");
    return 0;
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  snprintf(l->host, sizeof l->host, "%s", host);
  snprintf(l->port, sizeof l->port, "%d", port);
  l->refs = 2;
  if (pthread_create(&thread, NULL, hir_nccl__lookup_run, l) == 0) pthread_detach(thread);
  else hir_nccl__lookup_run(l); /* no thread to spare: look it up here */
  pthread_mutex_lock(&l->mu);
  while (!l->done && hir_nccl__wall_ms() < deadline) {
    struct timespec ts = hir_nccl__after(10);
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
  }
  if (!l->done) snprintf(why, cap, "the name lookup did not finish in time");
  else if (l->rc != 0) snprintf(why, cap, "%s", gai_strerror(l->rc));
  for (a = l->done ? l->res : NULL; a && n < max; a = a->ai_next)
    if (a->ai_addrlen <= sizeof *addrs) {
      memcpy(&addrs[n], a->ai_addr, a->ai_addrlen);
      lens[n++] = (socklen_t)a->ai_addrlen;
    }
  if (l->done && l->rc == 0 && n == 0) snprintf(why, cap, "no address");
  hir_nccl__lookup_leave(l);
  return n;
}

/* A connected nonblocking socket to the first address that answers, or -1. */
static int hir_nccl__connect(const struct sockaddr_storage *addrs, const socklen_t *lens, int n, double deadline) {
  int i;
  for (i = 0; i < n; i++) {
    int fd = socket(addrs[i].ss_family, SOCK_STREAM, 0), err = 0;
    socklen_t len = sizeof err;
    if (fd < 0) continue;
    hir_nccl__nonblocking(fd);
    if (connect(fd, (const struct sockaddr *)&addrs[i], lens[i]) == 0 ||
        (errno == EINPROGRESS && hir_nccl__ready(fd, POLLOUT, deadline) &&
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0))
      return fd;
    close(fd);
  }
  return -1;
}

/* 64 bits of FNV-1a, finished with a mixer; `seed` picks one of many. */
static uint64_t hir_nccl__hash(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

// >>nccl_store
/* Rank 0's store: NCCL's ids by key, and the note of the first rank that
   failed ("abort"). One request per connection, in a handshake that needs
   the job's secret on both sides and can be replayed by nobody:
     rank 0 -> client   hello: magic, a fresh random nonce (rank 0's)
     client -> rank 0   request: magic, a fresh random nonce (the client's),
                        op, key, value, HMAC-SHA-256 over ("request", both
                        nonces, op, key, value) keyed by SHA-256(secret)
     rank 0 -> client   answer: the same fields, op and value replaced, HMAC
                        over ("answer", both nonces, op, key, value)
   Rank 0 answers only a request whose MAC holds (a captured one is bound to
   the hello it answered, which no later connection gets), and a client
   takes only an answer whose MAC holds: a program that took rank 0's port
   without the secret is refused by every rank, naming it. A key keeps its
   first value; a different value for it is refused to its setter.
   Bounds: the server is one thread polling its listening sockets and at
   most 256 connections, each dropped unless its request is complete within
   1 s; when all 256 are taken the oldest is dropped for the newcomer, so
   idle connections cannot shut ranks out (a rank's request follows its
   hello at once); a message is fixed-size, the store at most 4096 keys.
   Rank 0 asks itself directly.
   Not covered: secrecy (the values, NCCL's ids among them, cross the
   network in the clear: a reader of the job's traffic learns them), an
   attacker who can drop or delay the traffic (he can stall the job, until
   its deadlines), and a flood fast enough to cycle 256 connections within
   one rank's round trip. */
enum {
  HIR_NCCL__KEY_BYTES = 64, HIR_NCCL__VALUE_BYTES = 512, HIR_NCCL__MAX_KEYS = 4096, HIR_NCCL__MAX_CONNS = 256,
  HIR_NCCL__HANDSHAKE_MS = 1000, HIR_NCCL__MAX_ADDRS = 4, HIR_NCCL__NONCE_BYTES = 16
};
static const unsigned char hir_nccl__magic[4] = {'h', 'i', 'r', '2'};

typedef struct hir_nccl__hello {
  unsigned char magic[4];
  unsigned char nonce[HIR_NCCL__NONCE_BYTES];
} hir_nccl__hello;

typedef struct hir_nccl__msg {
  unsigned char magic[4];
  unsigned char nonce[HIR_NCCL__NONCE_BYTES]; /* the client's */
  char op; /* asked: 'S' set, 'G' get; answered: 'V' the value, 'N' none yet, 'A' none and the job was
              aborted (value: why), 'R' refused (value: why), 'F' full */
  char key[HIR_NCCL__KEY_BYTES];
  unsigned char value[HIR_NCCL__VALUE_BYTES];
  unsigned char mac[32];
} hir_nccl__msg;

typedef struct hir_nccl__kv {
  char key[HIR_NCCL__KEY_BYTES];
  unsigned char value[HIR_NCCL__VALUE_BYTES];
} hir_nccl__kv;

typedef struct hir_nccl__conn {
  int fd;
  size_t have;
  double deadline;
  char peer[64];
  unsigned char nonce[HIR_NCCL__NONCE_BYTES]; /* the hello's */
  hir_nccl__msg m;
} hir_nccl__conn;

typedef struct hir_nccl__store {
  char where[280];              /* rank 0's host:port, for messages */
  unsigned char key[32];        /* SHA-256 of the job's secret: the MACs' key */
  struct sockaddr_storage addrs[HIR_NCCL__MAX_ADDRS];
  socklen_t lens[HIR_NCCL__MAX_ADDRS];
  int naddrs;
  /* rank 0 */
  int serving, nlisten, listen_fd[HIR_NCCL__MAX_ADDRS], wake[2];
  pthread_t thread;
  pthread_mutex_t mu;
  hir_nccl__kv *kv;
  int nkv, cap;
  hir_nccl__conn *conns;
  int turned_away;              /* requests refused or dropped */
  char last_turned_away[200];
} hir_nccl__store;

/* n random bytes: the kernel's, else (no /dev/urandom) the clock's and the
   process's, mixed. */
static void hir_nccl__random(void *out, size_t n) {
  unsigned char *p = (unsigned char *)out;
  size_t have = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  while (fd >= 0 && have < n) {
    ssize_t k = read(fd, p + have, n - have);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    have += (size_t)k;
  }
  if (fd >= 0) close(fd);
  if (have < n) {
    static unsigned long long counter;
    unsigned long long mix[4];
    unsigned char digest[32];
    size_t i;
    mix[0] = (unsigned long long)(hir_nccl__wall_ms() * 1e6), mix[1] = (unsigned long long)getpid();
    mix[2] = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED), mix[3] = (unsigned long long)(uintptr_t)out;
    for (i = have; i < n; i++) {
      if ((i - have) % 32 == 0) hir_hmac_sha256(mix, sizeof mix, &i, sizeof i, digest);
      p[i] = digest[(i - have) % 32];
    }
  }
}

/* The MAC of a request or an answer, bound to both nonces. */
static void hir_nccl__mac(const unsigned char key[32], const char *what, const unsigned char server_nonce[HIR_NCCL__NONCE_BYTES],
                          const hir_nccl__msg *m, unsigned char out[32]) {
  unsigned char buf[16 + HIR_NCCL__NONCE_BYTES + sizeof *m];
  size_t n = offsetof(hir_nccl__msg, mac);
  memset(buf, 0, 16);
  memcpy(buf, what, strlen(what) < 16 ? strlen(what) : 16);
  memcpy(buf + 16, server_nonce, HIR_NCCL__NONCE_BYTES);
  memcpy(buf + 16 + HIR_NCCL__NONCE_BYTES, m, n);
  hir_hmac_sha256(key, 32, buf, 16 + HIR_NCCL__NONCE_BYTES + n, out);
}

static int hir_nccl__same_mac(const unsigned char *a, const unsigned char *b) {
  unsigned diff = 0;
  int i;
  for (i = 0; i < 32; i++) diff |= (unsigned)(a[i] ^ b[i]); /* in constant time */
  return diff == 0;
}

/* Where the server answers a request: the answer replaces it. */
static void hir_nccl__store_answer(hir_nccl__store *s, hir_nccl__msg *m) {
  int i, aborted;
  m->key[HIR_NCCL__KEY_BYTES - 1] = '\0';
  pthread_mutex_lock(&s->mu);
  for (i = 0; i < s->nkv && strcmp(s->kv[i].key, m->key) != 0; i++) {}
  if (m->op == 'S') {
    if (i == s->nkv && s->nkv == s->cap && s->cap < HIR_NCCL__MAX_KEYS) {
      int cap = s->cap ? 2 * s->cap : 16;
      hir_nccl__kv *kv = (hir_nccl__kv *)realloc(s->kv, (size_t)cap * sizeof *kv);
      if (kv) s->kv = kv, s->cap = cap;
    }
    if (i < s->nkv && memcmp(m->value, s->kv[i].value, sizeof m->value)) { /* the first value stays */
      snprintf((char *)m->value, sizeof m->value, "'%.60s' holds another rank's value already: each key has one setter "
               "(two jobs or worlds share this port, or a rank ran twice)", m->key);
      m->op = 'R';
    } else if (i < s->nkv) {
      m->op = 'V';
    } else if (i < s->cap) {
      memcpy(s->kv[i].key, m->key, sizeof m->key);
      memcpy(s->kv[i].value, m->value, sizeof m->value);
      s->nkv++;
      m->op = 'V';
    } else {
      m->op = 'F';
    }
  } else if (m->op == 'G' && i < s->nkv) {
    memcpy(m->value, s->kv[i].value, sizeof m->value);
    m->op = 'V';
  } else if (m->op == 'G') {
    for (i = 0; i < s->nkv && strcmp(s->kv[i].key, "abort") != 0; i++) {}
    aborted = i < s->nkv;
    if (aborted) memcpy(m->value, s->kv[i].value, sizeof m->value);
    m->op = aborted ? 'A' : 'N';
  } else {
    snprintf((char *)m->value, sizeof m->value, "unknown request '%c'", m->op);
    m->op = 'R';
  }
  pthread_mutex_unlock(&s->mu);
}

/* A refusal (MAC'd, for a client that can check it) in one try: the
   server waits on nobody. */
static void hir_nccl__turn_away(hir_nccl__store *s, hir_nccl__conn *c, const char *why, int tell) {
  hir_nccl__msg m;
  if (tell) {
    memset(&m, 0, sizeof m);
    memcpy(m.magic, hir_nccl__magic, sizeof m.magic);
    if (c->have >= offsetof(hir_nccl__msg, op)) memcpy(m.nonce, c->m.nonce, sizeof m.nonce);
    m.op = 'R';
    snprintf((char *)m.value, sizeof m.value, "%s", why);
    hir_nccl__mac(s->key, "answer", c->nonce, &m, m.mac);
    if (send(c->fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}
  }
  pthread_mutex_lock(&s->mu);
  s->turned_away++;
  snprintf(s->last_turned_away, sizeof s->last_turned_away, "%s: %s", c->peer, why);
  pthread_mutex_unlock(&s->mu);
}

/* Reads what a connection sent; 1 while its request is incomplete. */
static int hir_nccl__serve_conn(hir_nccl__store *s, hir_nccl__conn *c) {
  unsigned char mac[32];
  ssize_t k = recv(c->fd, (char *)&c->m + c->have, sizeof c->m - c->have, MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 1;
  if (k <= 0) {
    if (c->have) hir_nccl__turn_away(s, c, "closed in the middle of a request", 0);
    return 0;
  }
  c->have += (size_t)k;
  if (c->have >= sizeof c->m.magic && memcmp(c->m.magic, hir_nccl__magic, sizeof c->m.magic) != 0) {
    hir_nccl__turn_away(s, c, "not a hostir bootstrap request (or one of another hostir version)", 1);
    return 0;
  }
  if (c->have < sizeof c->m) return 1;
  hir_nccl__mac(s->key, "request", c->nonce, &c->m, mac);
  if (!hir_nccl__same_mac(mac, c->m.mac)) {
    hir_nccl__turn_away(s, c, "wrong job secret (every rank must have the same HOSTIR_SECRET, or the same launcher job)", 1);
    return 0;
  }
  hir_nccl__store_answer(s, &c->m);
  hir_nccl__mac(s->key, "answer", c->nonce, &c->m, c->m.mac);
  hir_nccl__io(c->fd, &c->m, sizeof c->m, 1, hir_nccl__wall_ms() + 100); /* fits the socket's buffer */
  return 0;
}

/* Takes what waits on a listening socket, a batch at a time, each greeted
   with its hello; with every slot taken, the oldest connection (none has
   sent a whole request: those are answered at once) makes room. 0 where
   the process is out of descriptors: the rest waits in the kernel's queue. */
static int hir_nccl__accept(hir_nccl__store *s, int listen_fd, int *nconns) {
  int batch;
  for (batch = 0; batch < HIR_NCCL__MAX_CONNS / 4; batch++) { /* then the connections again: a rank's request is read before
                                                                  the next batch could drop it */
    struct sockaddr_storage peer;
    socklen_t len = sizeof peer;
    hir_nccl__conn *c;
    hir_nccl__hello hello;
    int fd = accept(listen_fd, (struct sockaddr *)&peer, &len), i, oldest = 0;
    if (fd < 0) return errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM;
    hir_nccl__nonblocking(fd);
    if (*nconns == HIR_NCCL__MAX_CONNS) {
      for (i = 1; i < *nconns; i++)
        if (s->conns[i].deadline < s->conns[oldest].deadline) oldest = i;
      hir_nccl__turn_away(s, &s->conns[oldest], "dropped without a request: every connection slot was taken", 0);
      close(s->conns[oldest].fd);
      s->conns[oldest] = s->conns[--*nconns];
    }
    c = &s->conns[(*nconns)++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->deadline = hir_nccl__wall_ms() + HIR_NCCL__HANDSHAKE_MS;
    hir_nccl__addr_text(&peer, c->peer, sizeof c->peer);
    memcpy(hello.magic, hir_nccl__magic, sizeof hello.magic);
    hir_nccl__random(c->nonce, sizeof c->nonce);
    memcpy(hello.nonce, c->nonce, sizeof hello.nonce);
    if (send(fd, &hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof hello) { /* a fresh socket takes 20 bytes */
      close(fd);
      --*nconns;
    }
  }
  return 1;
}

static void *hir_nccl__store_serve(void *arg) {
  hir_nccl__store *s = (hir_nccl__store *)arg;
  struct pollfd p[1 + HIR_NCCL__MAX_ADDRS + HIR_NCCL__MAX_CONNS];
  int nconns = 0, i;
  double listen_again = 0; /* out of descriptors: listening pauses until then */
  for (;;) {
    double now = hir_nccl__wall_ms();
    int np = 0, wait_ms = 1000, first_conn;
    p[np].fd = s->wake[0], p[np++].events = POLLIN;
    for (i = 0; i < s->nlisten; i++) p[np].fd = now >= listen_again ? s->listen_fd[i] : -1, p[np++].events = POLLIN;
    if (now < listen_again) wait_ms = (int)(listen_again - now) + 1;
    first_conn = np;
    for (i = 0; i < nconns; i++) {
      int left = (int)(s->conns[i].deadline - now) + 1;
      p[np].fd = s->conns[i].fd, p[np++].events = POLLIN;
      if (left < wait_ms) wait_ms = left < 0 ? 0 : left;
    }
    for (i = 0; i < np; i++) p[i].revents = 0;
    if (poll(p, (nfds_t)np, wait_ms) < 0 && errno != EINTR) break;
    if (p[0].revents) break; /* hir_nccl__store_stop */
    now = hir_nccl__wall_ms();
    for (i = nconns - 1; i >= 0; i--) { /* from the end: a finished connection takes the last one's place */
      hir_nccl__conn *c = &s->conns[i];
      int open = 1;
      if (p[first_conn + i].revents) open = hir_nccl__serve_conn(s, c);
      else if (now > c->deadline) hir_nccl__turn_away(s, c, "no complete request within 1000 ms", 1), open = 0;
      if (!open) {
        close(c->fd);
        *c = s->conns[--nconns];
      }
    }
    for (i = 0; i < s->nlisten; i++)
      if (p[1 + i].revents && !hir_nccl__accept(s, s->listen_fd[i], &nconns)) listen_again = now + 50;
  }
  for (i = 0; i < nconns; i++) close(s->conns[i].fd);
  return NULL;
}

/* The client side, on every rank: rank 0's addresses, looked up once. */
static hir_status hir_nccl__store_open(hir_nccl__store *s, const char *addr, int port, const char *secret, double deadline,
                                       char *err, size_t cap) {
  char why[128] = "";
  hir_sha256 h;
  memset(s, 0, sizeof *s);
  s->wake[0] = s->wake[1] = -1;
  snprintf(s->where, sizeof s->where, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, port);
  hir_sha256_init(&h);
  hir_sha256_update(&h, secret, strlen(secret));
  hir_sha256_final(&h, s->key);
  if ((s->naddrs = hir_nccl__resolve(addr, port, deadline, s->addrs, s->lens, HIR_NCCL__MAX_ADDRS, why, sizeof why)) > 0)
    return HIR_OK;
  snprintf(err, cap, "hostir_nccl: cannot look up rank 0's host %s: %s (MASTER_ADDR must name rank 0's host, the same on every rank)",
           s->where, why);
  return HIR_ERR_COMM;
}

/* Rank 0: listens at each of its addresses (only there), then serves. */
static hir_status hir_nccl__store_serve_start(hir_nccl__store *s, int spans_hosts, char *err, size_t cap) {
  char text[64];
  int i, one = 1, failure = 0, loopback = 1;
  for (i = 0; i < s->naddrs; i++) loopback &= hir_nccl__is_loopback(&s->addrs[i]);
  if (spans_hosts && loopback) {
    hir_nccl__addr_text(&s->addrs[0], text, sizeof text);
    snprintf(err, cap, "hostir_nccl: rank 0's host %s is %s on rank 0, a loopback address that the other hosts of the world "
             "cannot reach: set MASTER_ADDR to rank 0's address on the network", s->where, text);
    return HIR_ERR_INVALID;
  }
  for (i = 0; i < s->naddrs; i++) {
    int fd = socket(s->addrs[i].ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
      failure = errno;
      continue;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->addrs[i].ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&s->addrs[i], s->lens[i]) != 0 || listen(fd, SOMAXCONN) != 0) {
      failure = errno;
      close(fd);
      continue;
    }
    hir_nccl__nonblocking(fd);
    s->listen_fd[s->nlisten++] = fd;
  }
  if (!s->nlisten) {
    snprintf(err, cap, "hostir_nccl: rank 0 cannot listen at %s: %s (%s)", s->where, strerror(failure),
             failure == EADDRINUSE ? "another job or program holds the port: set MASTER_PORT or HOSTIR_PORT to a free one, "
                                     "the same on every rank"
             : failure == EADDRNOTAVAIL ? "that is not an address of rank 0's host: MASTER_ADDR must name rank 0's host"
                                        : "set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port");
    return HIR_ERR_COMM;
  }
  if (!(s->conns = (hir_nccl__conn *)calloc(HIR_NCCL__MAX_CONNS, sizeof *s->conns)) || pipe(s->wake) != 0) {
    snprintf(err, cap, "hostir_nccl: rank 0 cannot start the bootstrap: %s", s->conns ? strerror(errno) : "out of memory");
    return HIR_ERR_COMM;
  }
  pthread_mutex_init(&s->mu, NULL);
  if (pthread_create(&s->thread, NULL, hir_nccl__store_serve, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    snprintf(err, cap, "hostir_nccl: rank 0 cannot start the bootstrap's thread");
    return HIR_ERR_COMM;
  }
  s->serving = 1;
  return HIR_OK;
}

static void hir_nccl__store_close(hir_nccl__store *s) {
  int i;
  if (s->serving) {
    char stop = 1;
    if (write(s->wake[1], &stop, 1) != 1) shutdown(s->listen_fd[0], SHUT_RDWR);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    s->serving = 0;
  }
  for (i = 0; i < s->nlisten; i++) close(s->listen_fd[i]);
  for (i = 0; i < 2; i++)
    if (s->wake[i] >= 0) close(s->wake[i]);
  s->nlisten = 0;
  s->wake[0] = s->wake[1] = -1;
  free(s->kv);
  free(s->conns);
  s->kv = NULL;
  s->conns = NULL;
}

/* Who the server turned away, for rank 0's messages; "" if nobody. */
static void hir_nccl__store_log(hir_nccl__store *s, char *out, size_t cap) {
  out[0] = '\0';
  if (!s->serving) return;
  pthread_mutex_lock(&s->mu);
  if (s->turned_away)
    snprintf(out, cap, "; the bootstrap at %.80s turned away %d connections, the last from %.150s", s->where, s->turned_away,
             s->last_turned_away);
  pthread_mutex_unlock(&s->mu);
}

/* One request. 1: answered by rank 0, the answer in *m; 0: no answer by
   the deadline; -1: an answer without proof of the job's secret (m->op 0,
   m->value what it said, made printable). */
static int hir_nccl__store_ask(hir_nccl__store *s, hir_nccl__msg *m, double deadline) {
  hir_nccl__hello hello;
  unsigned char nonce[HIR_NCCL__NONCE_BYTES], mac[32];
  int fd, ok;
  size_t i;
  memcpy(m->magic, hir_nccl__magic, sizeof m->magic);
  if (s->serving) { /* rank 0 asks itself (its abort polls, often): no handshake */
    hir_nccl__store_answer(s, m);
    return 1;
  }
  hir_nccl__random(m->nonce, sizeof m->nonce);
  memcpy(nonce, m->nonce, sizeof nonce);
  if ((fd = hir_nccl__connect(s->addrs, s->lens, s->naddrs, deadline)) < 0) return 0;
  ok = hir_nccl__io(fd, &hello, sizeof hello, 0, deadline) && !memcmp(hello.magic, hir_nccl__magic, sizeof hello.magic);
  if (ok) hir_nccl__mac(s->key, "request", hello.nonce, m, m->mac);
  ok = ok && hir_nccl__io(fd, m, sizeof *m, 1, deadline) && hir_nccl__io(fd, m, sizeof *m, 0, deadline) &&
       !memcmp(m->magic, hir_nccl__magic, sizeof m->magic);
  close(fd);
  if (!ok) return 0;
  hir_nccl__mac(s->key, "answer", hello.nonce, m, mac);
  if (hir_nccl__same_mac(mac, m->mac) && !memcmp(m->nonce, nonce, sizeof nonce)) return 1;
  m->value[sizeof m->value - 1] = 0;
  for (i = 0; m->value[i]; i++)
    if (m->value[i] < 32 || m->value[i] > 126) m->value[i] = '?';
  if (m->op != 'R') m->value[0] = 0;
  m->op = 0;
  return -1;
}

/* Sets (op 'S', `value` in) or waits for (op 'G', `value` out) a key until
   the deadline. A get that finds the job aborted returns HIR_ERR_COMM with
   the failing rank's note. */
static hir_status hir_nccl__store_call(hir_nccl__store *s, char op, const char *key, void *value, size_t bytes,
                                       double deadline, char *err, size_t cap) {
  hir_nccl__msg m;
  int reached = 0, got;
  for (;;) {
    double attempt = hir_nccl__wall_ms() + 1000;
    memset(&m, 0, sizeof m);
    m.op = op;
    snprintf(m.key, sizeof m.key, "%s", key);
    if (op == 'S') memcpy(m.value, value, bytes);
    if ((got = hir_nccl__store_ask(s, &m, attempt < deadline ? attempt : deadline)) < 0) {
      if (m.value[0])
        snprintf(err, cap, "hostir_nccl: the bootstrap at %.100s refused this rank without proof that it knows the job's "
                 "secret: '%.200s'; every rank must have the same HOSTIR_SECRET (or the same launcher job)", s->where,
                 (char *)m.value);
      else
        snprintf(err, cap, "hostir_nccl: the bootstrap at %.100s answered without proof that it knows the job's secret: another "
                 "program holds rank 0's port, or rank 0 has another HOSTIR_SECRET; nothing it said was used", s->where);
      return HIR_ERR_COMM;
    }
    if (got) {
      m.value[sizeof m.value - 1] = 0;
      reached = 1;
      if (m.op == 'V') {
        if (op == 'G') memcpy(value, m.value, bytes);
        return HIR_OK;
      }
      if (m.op == 'A') {
        snprintf(err, cap, "hostir_nccl: the world was aborted while this rank waited for '%.40s': %.400s", key, (char *)m.value);
        return HIR_ERR_COMM;
      }
      if (m.op == 'R' || m.op == 'F') {
        snprintf(err, cap, "hostir_nccl: rank 0's bootstrap at %.100s refused this rank: %.300s", s->where,
                 m.op == 'F' ? "it holds 4096 keys already" : (char *)m.value);
        return HIR_ERR_COMM;
      }
    }
    if (hir_nccl__wall_ms() + 20 > deadline) break;
    hir_nccl__sleep_ms(20);
  }
  if (op == 'S' || !reached)
    snprintf(err, cap, "hostir_nccl: cannot reach rank 0 at %s to %s '%s' in time: is rank 0 running, and does that name "
             "rank 0's host and port on every rank?", s->where, op == 'S' ? "publish" : "fetch", key);
  else
    snprintf(err, cap, "hostir_nccl: rank 0 at %s never got '%s' in time: is every rank of the world started?", s->where, key);
  return HIR_ERR_TIMEOUT;
}

// >>nccl_env
/* The launcher's variables, read through `get` (getenv, or a test's table).
   A launcher is known by its rank variable; every number is checked and a
   message names the variable and what to do. Alternatives are separated by
   spaces, the first one set wins. */
typedef const char *(*hir_nccl__getter)(void *user, const char *name);

typedef struct hir_nccl__launcher {
  const char *name, *rank, *size, *local_rank, *local_size, *nodes;
} hir_nccl__launcher;

static const hir_nccl__launcher hir_nccl__launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", ""},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", ""},
    {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""},
    {"Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS SLURM_NTASKS", "SLURM_LOCALID", "", "SLURM_STEP_NUM_NODES SLURM_NNODES"},
};

/* The value of the first of `names` that is set and not empty (its name in
   *which), or NULL. */
static const char *hir_nccl__var(hir_nccl__getter get, void *user, const char *names, char *which, size_t cap) {
  while (*names) {
    size_t n = strcspn(names, " ");
    const char *v;
    snprintf(which, cap, "%.*s", (int)n, names);
    if ((v = get(user, which)) && *v) return v;
    names += n;
    names += strspn(names, " ");
  }
  return NULL;
}

/* A whole decimal number from lo to hi, nothing else. */
static int hir_nccl__number(const char *text, long lo, long hi, int *out) {
  char *end;
  long v;
  if (!text || *text < '0' || *text > '9') return 0;
  errno = 0;
  v = strtol(text, &end, 10);
  if (errno || *end || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

/* A launcher's number variable: 1 read, 0 absent, -1 malformed (err filled). */
static int hir_nccl__env_number(hir_nccl__getter get, void *user, const char *names, long lo, int *out, char *which,
                                size_t which_cap, char *err, size_t cap) {
  const char *v = hir_nccl__var(get, user, names, which, which_cap);
  if (!v) return 0;
  if (hir_nccl__number(v, lo, INT_MAX, out)) return 1;
  snprintf(err, cap, "hir_nccl_env_read: %s=\"%.40s\" is not a whole number from %ld (the launcher sets it; unset it or fix it)",
           which, v, lo);
  return -1;
}

/* The first host of a Slurm host list: "gpu[07-09,12],io01" -> "gpu07". */
static int hir_nccl__first_host(const char *list, char *out, size_t cap) {
  size_t n = 0;
  const char *p = list;
  while (*p && *p != ',' && n + 1 < cap) {
    if (*p == '[') { /* a range: its first number, zeros kept */
      for (p++; *p && *p != ',' && *p != '-' && *p != ']' && n + 1 < cap; p++) out[n++] = *p;
      while (*p && *p != ']') p++;
      if (*p) p++;
    } else {
      out[n++] = *p++;
    }
  }
  out[n] = '\0';
  return n > 0 && (*p == '\0' || *p == ',');
}

/* The host part of "tcp://10.0.0.1,10.0.0.2:port", "tcp6://[fe80::1]:port"
   (Open MPI 4's HNP URI: mpirun's addresses; what = 'u') or
   "prterun-HOST-PID@1" (Open MPI 5's PMIx namespace; what = 'n'). */
static int hir_nccl__host_in(const char *text, char what, char *out, size_t cap) {
  const char *p, *end;
  if (what == 'u') {
    if ((p = strstr(text, "tcp6://[")) && (!strstr(text, "tcp://") || strstr(text, "tcp://") > p)) {
      p += 8;
      end = strchr(p, ']');
    } else if ((p = strstr(text, "tcp://"))) {
      p += 6;
      end = p + strcspn(p, ",:;");
    } else {
      return 0;
    }
  } else {
    if (strncmp(text, "prterun-", 8) != 0 || !(end = strchr(text, '@'))) return 0;
    for (p = text + 8; end > p && end[-1] != '-'; end--) {}
    if (end <= p) return 0;
    end--; /* the '-' before the pid */
  }
  if (!end || end <= p || (size_t)(end - p) >= cap) return 0;
  snprintf(out, cap, "%.*s", (int)(end - p), p);
  return 1;
}

/* Rank 0's host from the launcher, where it says: 1 with its source. */
static int hir_nccl__launcher_host(hir_nccl__getter get, void *user, const hir_nccl__launcher *l, char *out, size_t cap,
                                   char *source, size_t source_cap) {
  char which[64];
  const char *v;
  if (!strcmp(l->name, "Slurm") &&
      (v = hir_nccl__var(get, user, "SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_NODELIST", which, sizeof which)) &&
      hir_nccl__first_host(v, out, cap)) {
    snprintf(source, source_cap, "the first host of %s", which);
    return 1;
  }
  if (!strcmp(l->name, "Open MPI") &&
      (((v = hir_nccl__var(get, user, "OMPI_MCA_orte_hnp_uri", which, sizeof which)) && hir_nccl__host_in(v, 'u', out, cap)) ||
       ((v = hir_nccl__var(get, user, "PMIX_NAMESPACE", which, sizeof which)) && hir_nccl__host_in(v, 'n', out, cap)))) {
    snprintf(source, source_cap, "mpirun's host, from %s", which);
    return 1;
  }
  return 0;
}

static int hir_nccl__names_loopback(const char *host) {
  return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

/* The job's secret: HOSTIR_SECRET (1 to 255 characters), else what the
   launcher tells every rank of this job alone, with the world's size and
   the port; where the launcher tells nothing of the job, env->weak_secret. */
static int hir_nccl__secret(hir_nccl__getter get, void *user, const hir_nccl__launcher *l, hir_nccl_env *env,
                            char *source, size_t source_cap, char *err, size_t cap) {
  static const struct { const char *launcher, *names; } facts[] = {
      {"torchrun", "TORCHELASTIC_RUN_ID"},
      {"Slurm", "SLURM_JOB_ID"}, {"Slurm", "SLURM_STEP_ID"},
      {"Open MPI", "OMPI_MCA_ess_base_jobid"}, {"Open MPI", "PMIX_NAMESPACE"}, {"Open MPI", "OMPI_MCA_orte_hnp_uri"},
  };
  char which[64];
  const char *v = get(user, "HOSTIR_SECRET");
  size_t n = 0, i;
  if (v && (!v[0] || strlen(v) >= sizeof env->secret)) {
    snprintf(err, cap, "hir_nccl_env_read: HOSTIR_SECRET is %s; give every rank the same secret of 1 to %d characters, or "
             "unset it to derive one from the launcher's job", v[0] ? "longer than 255 characters" : "empty",
             (int)sizeof env->secret - 1);
    return 0;
  }
  if (v) {
    snprintf(env->secret, sizeof env->secret, "%s", v);
    snprintf(source, source_cap, "HOSTIR_SECRET");
    return 1;
  }
  n += (size_t)snprintf(env->secret, sizeof env->secret, "%s", l->name);
  snprintf(source, source_cap, "the world's size and port only (WEAK: set HOSTIR_SECRET)");
  env->weak_secret = 1;
  for (i = 0; i < sizeof facts / sizeof facts[0] && n < sizeof env->secret; i++) {
    if (strcmp(facts[i].launcher, l->name) || !(v = hir_nccl__var(get, user, facts[i].names, which, sizeof which)) ||
        !strcmp(v, "none")) /* torchrun's run id when no --rdzv-id was given */
      continue;
    n += (size_t)snprintf(env->secret + n, sizeof env->secret - n, "|%s=%s", which, v);
    snprintf(source, source_cap, "%s", which);
    env->weak_secret = 0;
  }
  if (n < sizeof env->secret) snprintf(env->secret + n, sizeof env->secret - n, "|%d|%d", env->size, env->master_port);
  return 1;
}

/* Reads the launcher's variables into env: the whole of hir_nccl_env_read
   but the count of visible GPUs. */
static hir_status hir_nccl__env_parse(hir_nccl__getter get, void *user, int visible_gpus, hir_nccl_env *env, char *err,
                                      size_t cap) {
  const hir_nccl__launcher *l = NULL;
  char which[64], rank_name[64], size_name[64], local_name[64], host_source[96], secret_source[96], port_source[64];
  const char *v;
  size_t i;
  int got, nodes = 0, have_local;
  memset(env, 0, sizeof *env);
  for (i = 0; i < sizeof hir_nccl__launchers / sizeof hir_nccl__launchers[0] && !l; i++)
    if (hir_nccl__var(get, user, hir_nccl__launchers[i].rank, which, sizeof which)) l = &hir_nccl__launchers[i];
  if (!l) {
    snprintf(err, cap, "hir_nccl_env_read: no rank in the environment (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID): "
             "start the processes with torchrun, mpirun, mpiexec or srun, or set RANK and WORLD_SIZE");
    return HIR_ERR_INVALID;
  }
  if (hir_nccl__env_number(get, user, l->rank, 0, &env->rank, rank_name, sizeof rank_name, err, cap) < 0 ||
      (got = hir_nccl__env_number(get, user, l->size, 1, &env->size, size_name, sizeof size_name, err, cap)) < 0 ||
      (have_local = hir_nccl__env_number(get, user, l->local_rank, 0, &env->local_rank, local_name, sizeof local_name, err,
                                         cap)) < 0 ||
      hir_nccl__env_number(get, user, l->local_size, 1, &env->local_size, which, sizeof which, err, cap) < 0 ||
      hir_nccl__env_number(get, user, l->nodes, 1, &nodes, which, sizeof which, err, cap) < 0)
    return HIR_ERR_INVALID;
  if (!got) {
    snprintf(err, cap, "hir_nccl_env_read: %s is set but not the world's size (%s; %s sets both)", rank_name, l->size, l->name);
    return HIR_ERR_INVALID;
  }
  if (env->rank >= env->size) {
    snprintf(err, cap, "hir_nccl_env_read: %s=%d is not below %s=%d", rank_name, env->rank, size_name, env->size);
    return HIR_ERR_INVALID;
  }
  if (!have_local) env->local_rank = env->size == 1 ? 0 : env->rank; /* one host, as far as anyone says */
  if (env->local_size && (env->local_rank >= env->local_size || env->local_size > env->size)) {
    snprintf(err, cap, "hir_nccl_env_read: local rank %d and %d ranks on this host do not fit a world of %d", env->local_rank,
             env->local_size, env->size);
    return HIR_ERR_INVALID;
  }
  env->spans_hosts = (env->local_size && env->local_size < env->size) || nodes > 1;

  /* the port: HOSTIR_PORT, else MASTER_PORT (the one after it under torchrun), else 29500 */
  if ((v = hir_nccl__var(get, user, "HOSTIR_PORT MASTER_PORT", which, sizeof which))) {
    int torchrun = !strcmp(which, "MASTER_PORT") && get(user, "TORCHELASTIC_RUN_ID");
    if (!hir_nccl__number(v, 1, torchrun ? 65534 : 65535, &env->master_port)) {
      snprintf(err, cap, "hir_nccl_env_read: %s=\"%.40s\" is not a TCP port (1 to 65535)", which, v);
      return HIR_ERR_INVALID;
    }
    env->master_port += torchrun;
    snprintf(port_source, sizeof port_source, "%.24s%s", which, torchrun ? " + 1 (torchrun's)" : "");
  } else {
    env->master_port = 29500;
    snprintf(port_source, sizeof port_source, "the default port");
  }

  /* rank 0's host */
  if ((v = hir_nccl__var(get, user, "MASTER_ADDR", which, sizeof which))) {
    if (strlen(v) >= sizeof env->master_addr) {
      snprintf(err, cap, "hir_nccl_env_read: MASTER_ADDR is longer than %d characters", (int)sizeof env->master_addr - 1);
      return HIR_ERR_INVALID;
    }
    snprintf(env->master_addr, sizeof env->master_addr, "%s", v);
    snprintf(host_source, sizeof host_source, "MASTER_ADDR");
  } else if (!hir_nccl__launcher_host(get, user, l, env->master_addr, sizeof env->master_addr, host_source,
                                      sizeof host_source)) {
    if (env->spans_hosts) {
      snprintf(err, cap, "hir_nccl_env_read: the world spans hosts (%d ranks, %d on this one) and nothing names rank 0's "
               "host: set MASTER_ADDR to it on every rank (mpirun -x MASTER_ADDR=host; srun and torchrun pass the environment)",
               env->size, env->local_size);
      return HIR_ERR_INVALID;
    }
    snprintf(env->master_addr, sizeof env->master_addr, "127.0.0.1");
    snprintf(host_source, sizeof host_source, "one host");
  }
  if (env->spans_hosts && hir_nccl__names_loopback(env->master_addr)) {
    snprintf(err, cap, "hir_nccl_env_read: rank 0's host is %s (%s), which the other hosts of the world cannot reach: set "
             "MASTER_ADDR to rank 0's host name or address", env->master_addr, host_source);
    return HIR_ERR_INVALID;
  }

  if (!hir_nccl__secret(get, user, l, env, secret_source, sizeof secret_source, err, cap)) return HIR_ERR_INVALID;

  /* the GPU: the only one visible, else the local rank's */
  v = get(user, "CUDA_VISIBLE_DEVICES");
  if (visible_gpus < 1) {
    env->gpu = -1;
  } else if (visible_gpus == 1) {
    if (env->local_size > 1 && !v) {
      snprintf(err, cap, "hir_nccl_env_read: %d ranks on this host and it has one GPU: hostir needs a GPU per rank", env->local_size);
      return HIR_ERR_INVALID;
    }
    env->gpu = 0;
  } else if (env->local_rank < visible_gpus) {
    env->gpu = env->local_rank;
  } else {
    snprintf(err, cap, "hir_nccl_env_read: local rank %d (%s) has no GPU of its own: %d visible (CUDA_VISIBLE_DEVICES=%.40s); "
             "start at most one rank per GPU on a host", env->local_rank, have_local ? local_name : "the rank", visible_gpus,
             v ? v : "unset");
    return HIR_ERR_INVALID;
  }
  snprintf(env->origin, sizeof env->origin, "%s; rank 0 at %.64s:%d from %.48s, %.32s; secret from %.64s", l->name,
           env->master_addr, env->master_port, host_source, port_source, secret_source);
  return HIR_OK;
}

// >>nccl_peer
/* Copy-engine send/recv between the ranks of one host, threads and processes
   alike. The ranks of a host share one block of host memory, pinned and
   mapped for their GPUs: the threaded world's own, or a POSIX shared-memory
   segment (a file in /dev/shm) that the host's first rank creates, every
   other rank maps, and the first rank unlinks once all have it (so a crash
   leaves nothing behind).
   The block holds
     - a mailbox per ordered pair of ranks: the receiver posts where a receive
       lands (an allocation it exported, the offset, the size) in a ring of
       slots; the sender takes the posts in order. The sender's host waits
       for the post; a receiver's host runs on, except among threads of one
       process, where it waits for the sender to have queued its copy
       (hir_nccl__ce_finish_recv says why);
     - the signal pad, two words per slot: `ready` (the receiver's stream has
       reached the receive, its buffer may be written) and `arrived` (the
       sender's copy has landed). The GPUs write and wait on them with stream
       memory operations (cuStreamWriteValue32, cuStreamWaitValue32), which
       take no SM and no host; the copy runs on the sender's copy stream;
     - each rank's exports: CUDA IPC handles of the allocations it receives
       into, by their buffer id (unique in a process, never reused), so a
       peer maps an allocation once, not once per run;
     - each rank's process id (a dead peer is noticed within 100 ms) and the
       first failure's note.
   Pad words hold a slot's sequence number plus one and are compared
   cyclically (GEQ), so they never need resetting; an aborting rank raises
   every word its own streams wait on, so no GPU of it waits for a dead peer.
   Why not IPC events: a wait on an event takes the event's last record at
   the time of the call, so across processes every wait would need the
   host to know the record happened first - a host round trip per receive.
   A CUDA graph replays the values it captured, so a receive captured into
   one uses a pair of graph words of its own instead (the receiver hands
   them out, for as long as its graph lives): flags, set to 1 by the side
   that signals and back to 0 by the side that waited, ready for the next
   replay (replays on a stream never overlap); the wait and the take-back
   are one memory-operation node (cuStreamBatchMemOp), each node on a
   replay's path costing microseconds.
   A captured receive the evaluator says nothing touches before it in the
   run (hir_comm.recv_at_start) raises its ready flag before each launch of
   the graph, on the launch stream, instead of where the receiving stream
   reaches it: the sender's copy then waits for the receiver's previous
   work, not for its graph to get that far. */
enum {
  HIR_NCCL__CE_SLOTS = 32, HIR_NCCL__CE_GROUP = 256, HIR_NCCL__CE_EXPORTS = 64, HIR_NCCL__LOCAL_MAX = 64,
  HIR_NCCL__CE_GRAPH_WORDS = 512,    /* word pairs a receiver hands out to a sender's captured receives */
  HIR_NCCL__CE_MAGIC = 0x68697263 /* "hirc" */
};

typedef struct hir_nccl__ce_slot {   /* one posted receive */
  unsigned long long buffer_id;      /* the export's allocation; 0: `offset` is the address (threads) */
  unsigned long long offset, bytes;
  int export_index;
  int graph_word;                    /* captured: its graph words; -1 eager; -2 captured, none were free */
  hir_comm_what what;                /* for a size mismatch's message */
} hir_nccl__ce_slot;

typedef struct hir_nccl__ce_box {    /* the receives rank `to` posts for sender `from` */
  unsigned long long posted;         /* written by the receiver */
  char apart[56];                    /* the two counters on their own cache lines */
  unsigned long long taken;          /* written by the sender */
  char apart2[56];
  hir_nccl__ce_slot slot[HIR_NCCL__CE_SLOTS];
} hir_nccl__ce_box;

typedef struct hir_nccl__ce_export {
  unsigned long long buffer_id, bytes, start; /* start: the allocation's address in its process */
  cudaIpcMemHandle_t handle;
} hir_nccl__ce_export;

typedef struct hir_nccl__ce_head {
  int magic, nlocal;
  int failed;                        /* the first failing rank sets it, then writes `note`, then note_ready */
  int note_ready;
  char note[512];
  int pid[HIR_NCCL__LOCAL_MAX];
  unsigned long long started[HIR_NCCL__LOCAL_MAX]; /* when each process started (/proc): a pid is that process */
  unsigned kernel_stop;              /* raised by any rank that aborts: the kernel collectives of the host quit */
  unsigned kernel_error[HIR_NCCL__LOCAL_MAX]; /* a rank's kernel collective quit: 1 its deadline passed, 2 stopped */
} hir_nccl__ce_head;

typedef struct hir_nccl__ce_import {
  unsigned long long buffer_id, start, bytes; /* start, bytes: the allocation's in the peer's process */
  void *base;
} hir_nccl__ce_import;

/* The graph words a receiver hands out, and its exports that captured
   receives name (not replaced while so): shared with the release callbacks
   of the graphs, which CUDA runs on a thread of its own once a graph is
   destroyed, so counted references and atomics. */
typedef struct hir_nccl__ce_graphs {
  int refs;
  int export_graphs[HIR_NCCL__CE_EXPORTS];
  unsigned char used[1];             /* [sender index][GRAPH_WORDS] */
} hir_nccl__ce_graphs;

typedef CUresult (*hir_nccl__write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*hir_nccl__wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*hir_nccl__pointer_attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
typedef CUresult (*hir_nccl__batch_memops_fn)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int);

typedef struct hir_nccl__ce {
  unsigned char *block;              /* the shared block; NULL: copy engines off */
  size_t block_bytes;
  int segment, registered;           /* processes: mapped from a segment; pinned by this rank */
  int nlocal, me;                    /* ranks on this host; this rank's index among them */
  int *local;                        /* world rank -> index on this host, -1: another host */
  unsigned char *pad_dev;            /* the block's device address */
  hir_nccl__ce_graphs *graphs;
  hir_nccl__ce_import *imports;      /* [peer index * EXPORTS]: peers' allocations mapped here */
  unsigned long long uses, export_used[HIR_NCCL__CE_EXPORTS];
  cudaStream_t stream;               /* this rank's copies, in order */
  cudaEvent_t source, done;
  hir_nccl__write_value_fn write_value;
  hir_nccl__wait_value_fn wait_value;
  hir_nccl__pointer_attrs_fn pointer_attrs;
  hir_nccl__batch_memops_fn batch_memops;
  double next_pid_look_ms;
  signed char watch[HIR_NCCL__LOCAL_MAX]; /* a peer's process: 1 seen as itself, -1 not visible here (another pid namespace) */
} hir_nccl__ce;

/* The block's layout for n ranks: head, exports [n][EXPORTS], boxes [n*n],
   pad words [n*n][SLOTS][2], graph words [n*n][GRAPH_WORDS][2]. */
static size_t hir_nccl__ce_exports_at(void) { return (sizeof(hir_nccl__ce_head) + 63) / 64 * 64; }
static size_t hir_nccl__ce_boxes_at(int n) {
  return hir_nccl__ce_exports_at() + (size_t)n * HIR_NCCL__CE_EXPORTS * sizeof(hir_nccl__ce_export);
}
static size_t hir_nccl__ce_pad_at(int n) { return (hir_nccl__ce_boxes_at(n) + (size_t)n * n * sizeof(hir_nccl__ce_box) + 63) / 64 * 64; }
static size_t hir_nccl__ce_graph_at(int n) { return hir_nccl__ce_pad_at(n) + (size_t)n * n * HIR_NCCL__CE_SLOTS * 2 * sizeof(unsigned); }
static size_t hir_nccl__ce_bytes(int n) {
  size_t page = 4096;
  return (hir_nccl__ce_graph_at(n) + (size_t)n * n * HIR_NCCL__CE_GRAPH_WORDS * 2 * sizeof(unsigned) + page - 1) / page * page;
}
static hir_nccl__ce_head *hir_nccl__ce_head_of(const hir_nccl__ce *ce) { return (hir_nccl__ce_head *)ce->block; }
static hir_nccl__ce_export *hir_nccl__ce_exports(const hir_nccl__ce *ce, int rank) {
  return (hir_nccl__ce_export *)(ce->block + hir_nccl__ce_exports_at()) + (size_t)rank * HIR_NCCL__CE_EXPORTS;
}
static hir_nccl__ce_box *hir_nccl__ce_box_of(const hir_nccl__ce *ce, int from, int to) {
  return (hir_nccl__ce_box *)(ce->block + hir_nccl__ce_boxes_at(ce->nlocal)) + (size_t)from * ce->nlocal + to;
}
/* Offset in the block of a pad word: which 0 is `ready`, 1 `arrived`. */
static size_t hir_nccl__ce_word(const hir_nccl__ce *ce, int from, int to, unsigned long long seq, int which) {
  size_t i = (((size_t)from * ce->nlocal + to) * HIR_NCCL__CE_SLOTS + (size_t)(seq % HIR_NCCL__CE_SLOTS)) * 2 + (size_t)which;
  return hir_nccl__ce_pad_at(ce->nlocal) + i * sizeof(unsigned);
}

/* Offset in the block of graph word pair k from `from` to `to`: which 0 is
   `ready`, 1 `arrived`. */
static size_t hir_nccl__ce_graph_word(const hir_nccl__ce *ce, int from, int to, int k, int which) {
  size_t i = (((size_t)from * ce->nlocal + to) * HIR_NCCL__CE_GRAPH_WORDS + (size_t)k) * 2 + (size_t)which;
  return hir_nccl__ce_graph_at(ce->nlocal) + i * sizeof(unsigned);
}

static unsigned long long hir_nccl__counter(const unsigned long long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void hir_nccl__set_counter(unsigned long long *p, unsigned long long v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* The driver's stream memory operations and pointer attributes, through the
   runtime (no -lcuda). */
static int hir_nccl__ce_driver(hir_nccl__ce *ce, char *err, size_t cap) {
  enum cudaDriverEntryPointQueryResult q;
  void *fn[4] = {NULL, NULL, NULL, NULL};
  const char *names[4] = {"cuStreamWriteValue32", "cuStreamWaitValue32", "cuPointerGetAttributes", "cuStreamBatchMemOp"};
  int i;
  for (i = 0; i < 4; i++)
    if (cudaGetDriverEntryPointByVersion(names[i], &fn[i], 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn[i]) {
      cudaGetLastError();
      snprintf(err, cap, "the CUDA driver has no %s", names[i]);
      return 0;
    }
  memcpy(&ce->write_value, &fn[0], sizeof fn[0]); /* ISO C has no cast from void * to a function */
  memcpy(&ce->wait_value, &fn[1], sizeof fn[1]);
  memcpy(&ce->pointer_attrs, &fn[2], sizeof fn[2]);
  memcpy(&ce->batch_memops, &fn[3], sizeof fn[3]);
  return 1;
}

/* Processes: the host's segment, a file in /dev/shm (what shm_open makes,
   without needing -lrt on older C libraries), created by its first rank
   (create = 1) or opened by the others. */
static unsigned char *hir_nccl__ce_segment(const char *path, size_t bytes, int create, char *err, size_t cap) {
  int fd = open(path, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  void *p;
  struct stat st;
  if (fd < 0) {
    snprintf(err, cap, "opening the shared segment %s: %s", path, strerror(errno));
    return NULL;
  }
  if ((create && ftruncate(fd, (off_t)bytes) != 0) || fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
    snprintf(err, cap, "sizing the shared segment %s (%zu bytes): %s", path, bytes, strerror(errno));
    close(fd);
    return NULL;
  }
  p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(err, cap, "mapping the shared segment %s: %s", path, strerror(errno));
    return NULL;
  }
  return (unsigned char *)p;
}

/* Process `pid` as /proc shows it: its state letter and start time (in
   clock ticks since boot); 0 where /proc has no such process. */
static int hir_nccl__process(int pid, char *state, unsigned long long *started) {
  char path[48], text[1024];
  const char *p;
  FILE *f;
  size_t n;
  int field;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  if (!(f = fopen(path, "r"))) return 0;
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  if (!(p = strrchr(text, ')')) || p[1] != ' ') return 0; /* "pid (name) state ppid ..." */
  *state = p[2];
  for (p += 2, field = 3; *p && field < 22; p++) field += *p == ' ';
  return field == 22 && sscanf(p, "%llu", started) == 1;
}

/* Joins a block of `nlocal` ranks as index `me`, on the calling thread's
   device; `segment`: the block was mapped from a segment (pin it here). */
static int hir_nccl__ce_attach(hir_nccl__ce *ce, unsigned char *block, int segment, int nlocal, int me, char *err,
                               size_t cap) {
  size_t bytes = hir_nccl__ce_bytes(nlocal);
  void *dev = NULL;
  cudaError_t e;
  ce->block = block;
  ce->block_bytes = bytes;
  ce->segment = segment;
  ce->nlocal = nlocal;
  ce->me = me;
  if (!hir_nccl__ce_driver(ce, err, cap)) return 0;
  if (segment) {
    if ((e = cudaHostRegister(block, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped)) != cudaSuccess) {
      snprintf(err, cap, "cudaHostRegister of the shared segment: %s", cudaGetErrorString(e));
      return 0;
    }
    ce->registered = 1;
  }
  if ((e = cudaHostGetDevicePointer(&dev, block, 0)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&ce->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&ce->source, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&ce->done, cudaEventDisableTiming)) != cudaSuccess) {
    snprintf(err, cap, "setting up the copy stream: %s", cudaGetErrorString(e));
    return 0;
  }
  ce->pad_dev = (unsigned char *)dev;
  if (!(ce->imports = (hir_nccl__ce_import *)calloc((size_t)nlocal * HIR_NCCL__CE_EXPORTS, sizeof *ce->imports)) ||
      !(ce->graphs = (hir_nccl__ce_graphs *)calloc(1, sizeof *ce->graphs + (size_t)nlocal * HIR_NCCL__CE_GRAPH_WORDS))) {
    snprintf(err, cap, "out of memory");
    return 0;
  }
  ce->graphs->refs = 1;
  {
    char state;
    unsigned long long started = 0;
    hir_nccl__process((int)getpid(), &state, &started);
    __atomic_store_n(&hir_nccl__ce_head_of(ce)->started[me], started, __ATOMIC_RELEASE);
    __atomic_store_n(&hir_nccl__ce_head_of(ce)->pid[me], (int)getpid(), __ATOMIC_RELEASE);
  }
  return 1;
}

/* Waits for the copy stream without trusting it: false past the deadline. */
static int hir_nccl__ce_drain(hir_nccl__ce *ce, double deadline) {
  cudaError_t e;
  while ((e = cudaStreamQuery(ce->stream)) == cudaErrorNotReady && hir_nccl__wall_ms() < deadline) hir_nccl__sleep_ms(0);
  return e == cudaSuccess;
}

static void hir_nccl__ce_graphs_unref(hir_nccl__ce_graphs *g) {
  if (g && __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) == 0) free(g);
}

static void hir_nccl__ce_detach(hir_nccl__ce *ce, int drained) {
  int i;
  if (ce->stream && drained) drained = hir_nccl__ce_drain(ce, hir_nccl__wall_ms() + 1000);
  for (i = 0; ce->imports && drained && i < ce->nlocal * HIR_NCCL__CE_EXPORTS; i++) /* mapped peers' memory */
    if (ce->imports[i].base) cudaIpcCloseMemHandle(ce->imports[i].base);
  if (ce->stream) cudaStreamDestroy(ce->stream);
  if (ce->source) cudaEventDestroy(ce->source);
  if (ce->done) cudaEventDestroy(ce->done);
  if (ce->registered) cudaHostUnregister(ce->block);
  if (ce->segment && ce->block) munmap(ce->block, ce->block_bytes);
  free(ce->imports);
  free(ce->local);
  hir_nccl__ce_graphs_unref(ce->graphs); /* graphs still alive keep it */
  memset(ce, 0, sizeof *ce);
}

/* The first failure on this host: its note, for the other ranks. */
static void hir_nccl__ce_tell(hir_nccl__ce *ce, const char *note) {
  hir_nccl__ce_head *h = hir_nccl__ce_head_of(ce);
  int expected = 0;
  if (__atomic_compare_exchange_n(&h->failed, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    snprintf(h->note, sizeof h->note, "%s", note);
    __atomic_store_n(&h->note_ready, 1, __ATOMIC_RELEASE);
  }
}

/* Whether a peer's process has ended: gone, a zombie its launcher has not
   reaped yet, or its pid now another process's. A pid this host's /proc
   does not show as the peer when the rank's thread first looks (`learn`:
   as the rank joins the world; another pid namespace, or a peer gone that
   soon) is not watched: timeouts still catch that peer.
   The data path's watchdog (its own thread) asks without learning. */
static int hir_nccl__peer_ended(hir_nccl__ce *ce, int i, int learn) {
  hir_nccl__ce_head *h = hir_nccl__ce_head_of(ce);
  unsigned long long started = 0, want = __atomic_load_n(&h->started[i], __ATOMIC_ACQUIRE);
  char state = 0;
  int seen;
  if (!learn && __atomic_load_n(&ce->watch[i], __ATOMIC_ACQUIRE) != 1) return 0;
  seen = hir_nccl__process(__atomic_load_n(&h->pid[i], __ATOMIC_ACQUIRE), &state, &started);
  if (!ce->watch[i]) __atomic_store_n(&ce->watch[i], (signed char)(seen && started == want && want ? 1 : -1), __ATOMIC_RELEASE);
  if (ce->watch[i] < 0) return 0;
  return !seen || started != want || state == 'Z' || state == 'X';
}

/* For the watchdog: a note on this host's block, or a watched peer gone. */
static int hir_nccl__ce_noted(hir_nccl__ce *ce) {
  int i;
  if (!ce->block) return 0;
  if (__atomic_load_n(&hir_nccl__ce_head_of(ce)->note_ready, __ATOMIC_ACQUIRE)) return 1;
  for (i = 0; ce->segment && i < ce->nlocal; i++)
    if (i != ce->me && hir_nccl__peer_ended(ce, i, 0)) return 1;
  return 0;
}

/* Another rank's failure on this host: its note, or a peer process that has
   ended (looked for at most every 100 ms). Empty where none. */
static void hir_nccl__ce_heard(hir_nccl__ce *ce, char *note, size_t cap) {
  hir_nccl__ce_head *h = hir_nccl__ce_head_of(ce);
  int i;
  note[0] = 0;
  if (__atomic_load_n(&h->note_ready, __ATOMIC_ACQUIRE)) {
    snprintf(note, cap, "%s", h->note);
    return;
  }
  if (!ce->segment || hir_nccl__wall_ms() < ce->next_pid_look_ms) return;
  ce->next_pid_look_ms = hir_nccl__wall_ms() + 100;
  for (i = 0; i < ce->nlocal; i++)
    if (i != ce->me && __atomic_load_n(&h->pid[i], __ATOMIC_ACQUIRE) > 0 && hir_nccl__peer_ended(ce, i, 1)) {
      int r;
      for (r = 0; ce->local[r] != i; r++) {}
      snprintf(note, cap, "rank %d (process %d on this host) exited", r, h->pid[i]);
      return;
    }
}

/* Lets every stream of this rank past its waits for peers: after an abort,
   so that no GPU waits for a rank that is gone. */
static void hir_nccl__ce_release(hir_nccl__ce *ce) {
  int p, k;
  if (ce->block) __atomic_store_n(&hir_nccl__ce_head_of(ce)->kernel_stop, 1u, __ATOMIC_RELEASE);
  for (p = 0; ce->block && p < ce->nlocal; p++) {
    for (k = 0; k < HIR_NCCL__CE_SLOTS; k++) {
      unsigned *ready = (unsigned *)(ce->block + hir_nccl__ce_word(ce, ce->me, p, (unsigned long long)k, 0)); /* my copies wait */
      unsigned *arrived = (unsigned *)(ce->block + hir_nccl__ce_word(ce, p, ce->me, (unsigned long long)k, 1)); /* my receives */
      __atomic_add_fetch(ready, 1u << 30, __ATOMIC_RELEASE);
      __atomic_add_fetch(arrived, 1u << 30, __ATOMIC_RELEASE);
    }
    for (k = 0; k < HIR_NCCL__CE_GRAPH_WORDS; k++) { /* graphs wait for flags of 1 */
      __atomic_store_n((unsigned *)(ce->block + hir_nccl__ce_graph_word(ce, ce->me, p, k, 0)), 1u, __ATOMIC_RELEASE);
      __atomic_store_n((unsigned *)(ce->block + hir_nccl__ce_graph_word(ce, p, ce->me, k, 1)), 1u, __ATOMIC_RELEASE);
    }
  }
}

/* Whether export i is named by a receive not yet taken, or by a graph. */
static int hir_nccl__ce_export_pending(hir_nccl__ce *ce, int i) {
  int p;
  for (p = 0; p < ce->nlocal && hir_nccl__ce_exports(ce, ce->me)[i].buffer_id; p++) {
    hir_nccl__ce_box *box = hir_nccl__ce_box_of(ce, p, ce->me);
    unsigned long long k;
    for (k = hir_nccl__counter(&box->taken); k < box->posted; k++)
      if (box->slot[k % HIR_NCCL__CE_SLOTS].export_index == i) return 1;
  }
  return __atomic_load_n(&ce->graphs->export_graphs[i], __ATOMIC_ACQUIRE) > 0; /* a graph copies into it */
}

/* The export that holds `buf` (processes): found by its allocation's buffer
   id, else made, in a free entry or the least recently used one that no
   pending post names. Making one first withdraws the exports of
   allocations freed since: a peer's mapping keeps a freed allocation's
   memory from coming back until the peer closes it, which it does once it
   sees the export gone (hir_nccl__ce_target); without that, the 64 exports
   of a tuning's candidates held their buffers on the GPU (cudaMalloc
   failed on an 80 GiB H100, bench/NOTES.md section 40). */
static int hir_nccl__ce_export_of(hir_nccl__ce *ce, void *buf, hir_nccl__ce_slot *slot, char *err, size_t cap) {
  hir_nccl__ce_export *ex = hir_nccl__ce_exports(ce, ce->me);
  CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID};
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long id = 0;
  void *values[3] = {&start, &size, &id};
  int i, pick = -1;
  cudaError_t e;
  if (ce->pointer_attrs(3, which, values, (CUdeviceptr)(uintptr_t)buf) != CUDA_SUCCESS || !id) {
    snprintf(err, cap, "the receive buffer %p is not the GPU's memory", buf);
    return 0;
  }
  ce->uses++;
  for (i = 0; i < HIR_NCCL__CE_EXPORTS && ex[i].buffer_id != id; i++) {}
  if (i == HIR_NCCL__CE_EXPORTS) {
    unsigned long long oldest = ~0ull;
    for (i = 0; i < HIR_NCCL__CE_EXPORTS; i++) {
      unsigned long long still = 0;
      void *at = &still;
      int pending = hir_nccl__ce_export_pending(ce, i);
      if (ex[i].buffer_id && !pending &&
          (ce->pointer_attrs(1, &which[2], &at, (CUdeviceptr)ex[i].start) != CUDA_SUCCESS || still != ex[i].buffer_id)) {
        __atomic_store_n(&ex[i].buffer_id, 0ull, __ATOMIC_RELEASE); /* freed: withdrawn */
        ce->export_used[i] = 0;
      }
      if (!pending && ce->export_used[i] < oldest) oldest = ce->export_used[i], pick = i;
    }
    if (pick < 0) {
      snprintf(err, cap, "more than %d allocations wait for their copies at once, or are kept by CUDA graphs",
               HIR_NCCL__CE_EXPORTS);
      return 0;
    }
    if ((e = cudaIpcGetMemHandle(&ex[pick].handle, (void *)(uintptr_t)start)) != cudaSuccess) {
      cudaGetLastError();
      snprintf(err, cap, "the receive buffer %p cannot be shared with the other processes (cudaIpcGetMemHandle: %s); "
               "allocate it with cudaMalloc (not cudaMallocAsync or cuMemCreate)", buf, cudaGetErrorString(e));
      return 0;
    }
    ex[pick].buffer_id = id;
    ex[pick].bytes = size;
    ex[pick].start = (unsigned long long)start;
    i = pick;
  }
  ce->export_used[i] = ce->uses;
  slot->buffer_id = id;
  slot->export_index = i;
  slot->offset = (unsigned long long)((uintptr_t)buf - (uintptr_t)start);
  return 1;
}

/* Where a post's bytes go, in this process: the peer's allocation, mapped
   once (a mapping the peer replaced is closed once this rank's copies into
   it are done). CUDA refuses to map what looks mapped already ("resource
   already mapped"): an allocation the peer exports again under another
   index keeps its mapping, and one the peer freed, whose addresses a new
   allocation took, is closed first. */
static int hir_nccl__ce_drain_for(hir_nccl__ce *ce, int captured, double deadline, char *err, size_t cap) {
  if (!captured && hir_nccl__ce_drain(ce, deadline)) return 1;
  snprintf(err, cap, "%s", captured ? "a captured send would map a peer's new buffer over an old mapping, which needs the copy "
           "stream idle; capture a program after it has run eagerly on the same buffers (hostir's graph modes do)"
           : "the copy stream stayed busy while a mapping was replaced");
  return 0;
}

static void *hir_nccl__ce_target(hir_nccl__ce *ce, int peer, const hir_nccl__ce_slot *slot, int captured, double deadline,
                                 char *err, size_t cap) {
  hir_nccl__ce_import *im;
  const hir_nccl__ce_export *ex;
  cudaError_t e;
  int k;
  if (!slot->buffer_id) return (void *)(uintptr_t)slot->offset;
  if (slot->export_index < 0 || slot->export_index >= HIR_NCCL__CE_EXPORTS) {
    snprintf(err, cap, "a post names export %d (hostir bug)", slot->export_index);
    return NULL;
  }
  im = &ce->imports[peer * HIR_NCCL__CE_EXPORTS + slot->export_index];
  ex = &hir_nccl__ce_exports(ce, peer)[slot->export_index];
  for (k = 0; !captured && k < HIR_NCCL__CE_EXPORTS; k++) { /* the peer withdrew or replaced these exports: closed */
    hir_nccl__ce_import *held = &ce->imports[peer * HIR_NCCL__CE_EXPORTS + k];
    if (!held->base || held->buffer_id == slot->buffer_id ||
        __atomic_load_n(&hir_nccl__ce_exports(ce, peer)[k].buffer_id, __ATOMIC_ACQUIRE) == held->buffer_id)
      continue;
    if (!hir_nccl__ce_drain_for(ce, captured, deadline, err, cap)) return NULL;
    cudaIpcCloseMemHandle(held->base);
    held->base = NULL;
    held->buffer_id = 0;
  }
  if (im->buffer_id != slot->buffer_id) {
    if (ex->buffer_id != slot->buffer_id || slot->offset + slot->bytes > ex->bytes) {
      snprintf(err, cap, "a post names an allocation its export does not hold (hostir bug)");
      return NULL;
    }
    if (im->base) {
      if (!hir_nccl__ce_drain_for(ce, captured, deadline, err, cap)) return NULL;
      cudaIpcCloseMemHandle(im->base);
      im->base = NULL;
      im->buffer_id = 0;
    }
    for (k = 0; k < HIR_NCCL__CE_EXPORTS; k++) {
      hir_nccl__ce_import *held = &ce->imports[peer * HIR_NCCL__CE_EXPORTS + k];
      if (held == im || !held->base || held->start >= ex->start + ex->bytes || ex->start >= held->start + held->bytes) continue;
      if (held->buffer_id == slot->buffer_id) {
        im->base = held->base;
      } else if (!hir_nccl__ce_drain_for(ce, captured, deadline, err, cap)) {
        return NULL;
      } else {
        cudaIpcCloseMemHandle(held->base);
      }
      held->base = NULL;
      held->buffer_id = 0;
    }
    if (!im->base && (e = cudaIpcOpenMemHandle(&im->base, ex->handle, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
      cudaGetLastError();
      im->base = NULL;
      snprintf(err, cap, "cudaIpcOpenMemHandle of a peer's buffer: %s", cudaGetErrorString(e));
      return NULL;
    }
    im->buffer_id = slot->buffer_id;
    im->start = ex->start;
    im->bytes = ex->bytes;
  }
  return (unsigned char *)im->base + slot->offset;
}

// >>nccl_kernels
/* Collectives as kernels of ours, between the ranks of one host: each rank
   owns a workspace in its GPU's memory that every other rank maps (CUDA IPC
   between processes, peer access among threads): a pad of flags, a counter
   per CTA, and two halves of data, each two regions of a slot per rank. A
   call's CTAs push the caller's input (read where it lies: no staging
   copy) into the peers' slots with plain stores over NVLink, which need no
   round trip, each rank starting with the next rank so that the ranks
   write to different peers at once. What a rank then reads is in its own
   GPU's memory. One shot: each rank pushes its whole input to every peer
   and sums its slots. Two shots: segment s goes to rank s, which sums it
   and pushes the sum to every peer's second region, from which each
   copies the sums out. Reduce-scatter and all-gather are the first and
   second halves of that.
   How a reader knows the bytes are there: 16-bit data (bf16, f16) carries
   its own flag. Every slot holds a sentinel (each halfword 0x8000, a
   negative zero) until a peer's bytes land; writers turn negative zeros
   positive (no sum changes: sums start at +0); a reader spins on each 16
   bytes until no halfword is the sentinel and puts the sentinel back. Each
   16 bytes are summed as they land, with no flag, fence or phase between.
   f32 and the all-gather's bytes can take any bit pattern, so there each
   CTA meets its namesake CTA on every rank: it raises its flag in each
   peer's pad to the call's sequence number (a release: its stores land
   first) and waits until every peer has raised its own; the readers put
   the sentinel back all the same.
   A CTA's sequence number is its own counter plus one, kept in its rank's
   workspace: a CUDA graph replays any number of times with no reset. Calls
   alternate halves, so a call writes a peer's half only once that peer
   has begun the call between (which it does only once its previous kernel
   has ended, its sentinels put back: calls on one communicator are
   ordered, whatever their streams). Every wait ends at a deadline (the
   communicator's timeout) or when the host's stop word rises (any rank of
   the host aborting); the kernel then leaves its cause in the host's block,
   where the rank's next poll finds it. Sums run in float, in rank order, so
   every rank gets the same bits. A team other than the world has its own
   workspaces (hir_nccl__team_kc), so its sequence and halves are its own.
   No multicast object is ever made. */
enum {
  HIR_NCCL__KC_RANKS = 8,            /* the most ranks of a kernel collective (its arguments carry their addresses) */
  HIR_NCCL__KC_CTAS = 128,           /* the most CTAs a call takes (the pad has their flags) */
  HIR_NCCL__KC_HALF = 32 << 20,      /* bytes of a workspace's half: 16 MiB of slots, then 16 of two shots' sums */
  HIR_NCCL__KC_DATA_AT = 16384,      /* the workspace: flags at 0, the CTAs' call counters at 8192, the halves from here */
  HIR_NCCL__KC_THREADS = 512,
  HIR_NCCL__KC_FEW = 32,             /* CTAs: of an H100's or H200's 132 SMs, a GEMM beside keeps the others */
  HIR_NCCL__KC_CLASSES = 11          /* sizes the choice is made for (hir_nccl__kc_class_bytes) */
};
enum { HIR_NCCL__AR_ONE, HIR_NCCL__AR_TWO, HIR_NCCL__RS, HIR_NCCL__AG, HIR_NCCL__KC_KINDS };
/* The kernels: those of the kinds, then the all-reduce's with the rms_norm after it (hir_comm.allreduce_rms_norm). */
enum { HIR_NCCL__AR_RMS_ONE = HIR_NCCL__KC_KINDS, HIR_NCCL__AR_RMS_TWO, HIR_NCCL__KC_KERNELS };
/* The sizes (bytes: an all-reduce's buffer, a reduce-scatter's input, an
   all-gather's output) the path is chosen for; a call takes the choice of
   the smallest not under its size (the last past them). */
static const size_t hir_nccl__kc_class_bytes[HIR_NCCL__KC_CLASSES] = {
    (size_t)8 << 10, (size_t)32 << 10, (size_t)128 << 10, (size_t)512 << 10, (size_t)1 << 20, (size_t)2 << 20,
    (size_t)4 << 20, (size_t)8 << 20, (size_t)16 << 20, (size_t)32 << 20, (size_t)64 << 20};

/* hir_coll_args, as the kernels read it. */
typedef struct hir_nccl__kargs {
  unsigned char *ws[HIR_NCCL__KC_RANKS];
  const void *in;
  void *out;
  unsigned long long count, in_stride, out_stride, half, timeout_ns; /* in_stride, out_stride: bytes */
  const unsigned *stop;
  unsigned *error;
  int n, me;
  const void *residual, *weight;
  void *h;
  unsigned long long cols;
  double eps;
} hir_nccl__kargs;

typedef struct hir_nccl__kc {
  int on;                            /* set up on every rank of the world, all on this host */
  int n, me;
  unsigned char *mine;               /* this rank's workspace */
  unsigned char *ws[HIR_NCCL__KC_RANKS]; /* every rank's, as mapped here; [me] is `mine` */
  int opened[HIR_NCCL__KC_RANKS];    /* mapped by cudaIpcOpenMemHandle (processes) */
  void *library;                     /* cudaLibrary_t; NULL where borrowed from the world's (a team's) */
  cudaKernel_t kernel[HIR_NCCL__KC_KERNELS][3]; /* by dtype: f32, f16, bf16 (all-gather: [0], bytes) */
  cudaKernel_t fill;                 /* hir_fill_sentinel: a new workspace's halves */
  const unsigned *stop;              /* device addresses of the host block's words */
  unsigned *error;
  int cap;                           /* the most CTAs a call takes (hir_nccl_comm_set_path); 0: as chosen */
  /* The choice, by size class: the kernel each collective takes (indexed by
     HIR_NCCL__AR_ONE for the all-reduce, _RS, _AG; -1: NCCL's), and the CTAs
     each kernel runs on. Measured at creation (hir_nccl__kc_measure), the
     same on every rank. */
  signed char use[HIR_NCCL__KC_KINDS][HIR_NCCL__KC_CLASSES];
  unsigned char ctas[HIR_NCCL__KC_KINDS][HIR_NCCL__KC_CLASSES];
  int measured;                      /* 1: by hir_nccl__kc_measure; 2: from saved plans; 0: the fixed rule of hir_nccl__kc_words */
  cudaEvent_t last;                  /* the previous call's end, and where it was */
  cudaStream_t last_stream;
  unsigned long long last_capture;   /* its capture's id; 0: eager */
} hir_nccl__kc;

/* The kernels' source (their CUDA C++, compiled by NVRTC once and kept in
   hostir's kernel cache). */
static const char *const hir_nccl__kc_source[] = { /* pieces under C's 4095-character limit */
    "typedef unsigned short u16;\n"
    "typedef unsigned long long u64;\n"
    "enum : unsigned long long { STOP_AFTER_NS = 500000, STOP_EVERY_NS = 2000000 };\n"
    "enum { MAXR = 8, MAXCTAS = 128, PHASES = 2, THREADS = 512, UNROLL = 4, COUNTERS_AT = MAXCTAS * PHASES * MAXR * 4, DATA_AT = 2 * COUNTERS_AT };\n"
    "\n"
    "struct hir_coll_args {\n"
    "  unsigned char *ws[MAXR];        /* every rank's workspace, as mapped here */\n"
    "  const unsigned char *in;\n"
    "  unsigned char *out;\n"
    "  u64 count;                      /* AR: elements; RS: elements each rank gets; AG: bytes each rank gives */\n"
    "  u64 in_stride;                  /* RS: bytes from one rank's segment of `in` to the next */\n"
    "  u64 out_stride;                 /* AG: bytes from one rank's block of `out` to the next */\n"
    "  u64 half;                       /* bytes of a workspace's half: slots, then (from half / 2) the two-shot's gathered sums */\n"
    "  u64 timeout_ns;\n"
    "  const unsigned *stop;           /* host memory: nonzero once a rank of the host aborted */\n"
    "  unsigned *error;                /* host memory: 1 this rank's kernel passed its deadline, 2 it was stopped */\n"
    "  int n, me;\n"
    "  const unsigned char *res, *wt;  /* the all-reduce's rms_norm after it: the residual, the weight (or NULL) */\n"
    "  unsigned char *h;               /* where h = sum + residual goes */\n"
    "  u64 cols;                       /* elements a row */\n"
    "  double eps;\n"
    "};\n"
    "\n"
    "__device__ __forceinline__ unsigned hir_ld_acquire(const unsigned *p) {\n"
    "  unsigned v;\n"
    "  asm volatile(\"ld.acquire.sys.global.u32 %0, [%1];\" : \"=r\"(v) : \"l\"(p) : \"memory\");\n"
    "  return v;\n"
    "}\n"
    "__device__ __forceinline__ void hir_st_release(unsigned *p, unsigned v) {\n"
    "  asm volatile(\"st.release.sys.global.u32 [%0], %1;\" ::\"l\"(p), \"r\"(v) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ u64 hir_now_ns(void) {\n"
    "  u64 t;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "  return t;\n"
    "}\n"
    "__device__ __forceinline__ unsigned *hir_flag(unsigned char *ws, int phase, int from) {\n"
    "  return (unsigned *)ws + ((blockIdx.x * PHASES + phase) * MAXR + from);\n"
    "}\n"
    "\n"
    "/* Where rank `from`'s bytes land in rank `to`'s half of call `seq`: its\n"
    "   slot (region 0), or its gathered sums (region 1). */\n"
    "__device__ __forceinline__ unsigned char *hir_slot(const hir_coll_args &a, int to, int from, unsigned seq, int region) {\n"
    "  u64 slot = a.half / 2 / a.n / 16 * 16;\n"
    "  return a.ws[to] + DATA_AT + (seq & 1) * a.half + region * (a.half / 2) + from * slot;\n"
    "}\n"
    "\n"
    "/* A block's waits: when it started, when one of its threads next reads the\n"
    "   host's stop word, and whether one gave up, after which all do. The stop\n"
    "   word lies in host memory: a read crosses PCIe, and the GPU serves such\n"
    "   reads one after another, so many spinning threads reading it often delay\n"
    "   one another by tens of microseconds. A block reads it only once it has\n"
    "   run STOP_AFTER_NS, then one thread every STOP_EVERY_NS. Waits call\n"
    "   hir_tick every 64 spins; false: give up (the cause is in a.error). */\n"
    "struct hir_wait { u64 start, next_stop; int failed; };\n"
    "__device__ bool hir_tick(const hir_coll_args &a, hir_wait *w) {\n"
    "  if (*(volatile int *)&w->failed) return false;\n"
    "  u64 now = hir_now_ns(), due = *(volatile u64 *)&w->next_stop;\n"
    "  unsigned why = now - w->start > a.timeout_ns ? 1u : 0u;\n"
    "  if (!why && now >= due && atomicCAS((unsigned long long *)&w->next_stop, due, now + STOP_EVERY_NS) == due)\n"
    "    why = *(volatile const unsigned *)a.stop ? 2u : 0u;\n"
    "  if (!why) return true;\n"
    "  *(volatile unsigned *)a.error = why;\n"
    "  *(volatile int *)&w->failed = 1;\n"
    "  return false;\n"
    "}\n"
    "/* The block meets its namesakes on every rank: it raises its flag in each\n"
    "   rank's pad to `seq` (after every write of the block before it, to any\n"
    "   GPU), then waits for theirs in its own. */\n"
    "__device__ bool hir_meet(const hir_coll_args &a, int phase, unsigned seq, hir_wait *w) {\n",
    "  __syncthreads();\n"
    "  if (threadIdx.x < a.n) {\n"
    "    int p = threadIdx.x;\n"
    "    const unsigned *mine = hir_flag(a.ws[a.me], phase, p);\n"
    "    unsigned spins = 0;\n"
    "    hir_st_release(hir_flag(a.ws[p], phase, a.me), seq);\n"
    "    while ((int)(hir_ld_acquire(mine) - seq) < 0)\n"
    "      if ((++spins & 63) == 0 && !hir_tick(a, w)) break;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return !*(volatile int *)&w->failed;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ unsigned hir_word(const uint4 &v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }\n"
    "__device__ __forceinline__ void hir_set_word(uint4 &v, int j, unsigned w) {\n"
    "  if (j == 0) v.x = w; else if (j == 1) v.y = w; else if (j == 2) v.z = w; else v.w = w;\n"
    "}\n"
    "\n"
    "/* 16 bytes of the caller's memory, `valid` of them (the rest 0), at any\n"
    "   element alignment; and back. */\n"
    "__device__ __forceinline__ uint4 hir_load(const unsigned char *src, int valid, int es) {\n"
    "  uint4 v = make_uint4(0, 0, 0, 0);\n"
    "  if (valid == 16 && ((unsigned long)src & 15) == 0) return __ldcg((const uint4 *)src);\n"
    "  for (int i = 0; i < valid; i += es) {\n"
    "    unsigned w = es == 4 ? *(const unsigned *)(src + i) : es == 2 ? *(const u16 *)(src + i) : src[i];\n"
    "    hir_set_word(v, i / 4, hir_word(v, i / 4) | w << (8 * (i & 3)));\n"
    "  }\n"
    "  return v;\n"
    "}\n"
    "__device__ __forceinline__ void hir_store(unsigned char *dst, const uint4 &v, int valid, int es) {\n"
    "  if (valid == 16 && ((unsigned long)dst & 15) == 0) {\n"
    "    *(uint4 *)dst = v;\n"
    "    return;\n"
    "  }\n"
    "  for (int i = 0; i < valid; i += es) {\n"
    "    unsigned w = hir_word(v, i / 4) >> (8 * (i & 3));\n"
    "    if (es == 4) *(unsigned *)(dst + i) = w;\n"
    "    else if (es == 2) *(u16 *)(dst + i) = (u16)w;\n"
    "    else dst[i] = (unsigned char)w;\n"
    "  }\n"
    "}\n"
    "__device__ __forceinline__ int hir_valid(u64 bytes, u64 v) { return bytes - v * 16 < 16 ? (int)(bytes - v * 16) : 16; }\n"
    "\n"
    "/* Sums of 16 bytes of each dtype (0 f32, 1 f16, 2 bf16), lanes in float. */\n"
    "template <int K> struct hir_lanes;\n"
    "template <> struct hir_lanes<0> {\n"
    "  enum { N = 4, ES = 4 };\n"
    "  static __device__ __forceinline__ void add(float *acc, const uint4 &v) {\n"
    "    for (int j = 0; j < 4; j++) acc[j] += __uint_as_float(hir_word(v, j));\n"
    "  }\n"
    "  static __device__ __forceinline__ uint4 pack(const float *acc) {\n"
    "    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]), __float_as_uint(acc[3]));\n"
    "  }\n"
    "};\n"
    "__device__ __forceinline__ float hir_h2f(u16 h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
    "__device__ __forceinline__ unsigned hir_pack_h(float lo, float hi) {\n"
    "  unsigned w; asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(w) : \"f\"(hi), \"f\"(lo)); return w;\n"
    "}\n"
    "__device__ __forceinline__ unsigned hir_pack_b(float lo, float hi) {\n"
    "  unsigned w; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(w) : \"f\"(hi), \"f\"(lo)); return w;\n"
    "}\n"
    "template <> struct hir_lanes<1> {\n"
    "  enum { N = 8, ES = 2 };\n"
    "  static __device__ __forceinline__ void add(float *acc, const uint4 &v) {\n"
    "    for (int j = 0; j < 4; j++) {\n"
    "      unsigned w = hir_word(v, j);\n"
    "      acc[2 * j] += hir_h2f((u16)(w & 0xffff));\n"
    "      acc[2 * j + 1] += hir_h2f((u16)(w >> 16));\n"
    "    }\n"
    "  }\n"
    "  static __device__ __forceinline__ uint4 pack(const float *a) {\n"
    "    return make_uint4(hir_pack_h(a[0], a[1]), hir_pack_h(a[2], a[3]), hir_pack_h(a[4], a[5]), hir_pack_h(a[6], a[7]));\n"
    "  }\n"
    "};\n"
    "template <> struct hir_lanes<2> {\n"
    "  enum { N = 8, ES = 2 };\n"
    "  static __device__ __forceinline__ void add(float *acc, const uint4 &v) {\n"
    "    for (int j = 0; j < 4; j++) {\n"
    "      unsigned w = hir_word(v, j);\n"
    "      acc[2 * j] += __uint_as_float(w << 16);\n",
    "      acc[2 * j + 1] += __uint_as_float(w & 0xffff0000u);\n"
    "    }\n"
    "  }\n"
    "  static __device__ __forceinline__ uint4 pack(const float *a) {\n"
    "    return make_uint4(hir_pack_b(a[0], a[1]), hir_pack_b(a[2], a[3]), hir_pack_b(a[4], a[5]), hir_pack_b(a[6], a[7]));\n"
    "  }\n"
    "};\n"
    "\n"
    "/* Lamport's way, for 16-bit data. Every slot of the workspace holds the\n"
    "   sentinel (each halfword 0x8000, a negative zero) until a peer's bytes\n"
    "   land, so the data is its own flag: a reader spins on each 16 bytes until\n"
    "   none of its halfwords is the sentinel, takes them, and puts the sentinel\n"
    "   back (kernels on flags put it back too). Writers turn negative zeros\n"
    "   positive, which changes no sum (every sum starts at +0). Each 16 bytes\n"
    "   are summed as they land: no flag, no fence, no phase waits for another\n"
    "   to end. A vector that lands in parts shows the sentinel where it has\n"
    "   not, and the reader waits on. */\n"
    "enum : unsigned { SENTINEL = 0x80008000u };\n"
    "__device__ __forceinline__ unsigned hir_unneg_word(unsigned w) {\n"
    "  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;\n"
    "  if ((w >> 16) == 0x8000u) w &= 0xffffu;\n"
    "  return w;\n"
    "}\n"
    "__device__ __forceinline__ uint4 hir_unneg(const uint4 &v) {\n"
    "  return make_uint4(hir_unneg_word(v.x), hir_unneg_word(v.y), hir_unneg_word(v.z), hir_unneg_word(v.w));\n"
    "}\n"
    "__device__ __forceinline__ bool hir_landed(const uint4 &v) {\n"
    "  return hir_unneg_word(v.x) == v.x && hir_unneg_word(v.y) == v.y && hir_unneg_word(v.z) == v.z && hir_unneg_word(v.w) == v.w;\n"
    "}\n"
    "__device__ __forceinline__ void hir_clear(unsigned char *p) { *(uint4 *)p = make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL); }\n"
    "__device__ __forceinline__ uint4 hir_ld_volatile(const unsigned char *p) {\n"
    "  uint4 v;\n"
    "  asm volatile(\"ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];\" : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p) : \"memory\");\n"
    "  return v;\n"
    "}\n"
    "\n"
    "/* x, first read from p: the 16 bytes once landed, the sentinel put back. */\n"
    "__device__ __forceinline__ bool hir_take(const hir_coll_args &a, unsigned char *p, uint4 &x, hir_wait *w) {\n"
    "  unsigned spins = 0;\n"
    "  while (!hir_landed(x)) {\n"
    "    if ((++spins & 63) == 0 && !hir_tick(a, w)) return false;\n"
    "    x = hir_ld_volatile(p);\n"
    "  }\n"
    "  hir_clear(p);\n"
    "  return true;\n"
    "}\n"
    "\n"
    "/* This block's part of `vectors`: [*v0, *v1). */\n"
    "__device__ __forceinline__ void hir_part(u64 vectors, u64 *v0, u64 *v1) {\n"
    "  u64 per = (vectors + gridDim.x - 1) / gridDim.x;\n"
    "  *v0 = per * blockIdx.x < vectors ? per * blockIdx.x : vectors;\n"
    "  *v1 = *v0 + per < vectors ? *v0 + per : vectors;\n"
    "}\n"
    "\n"
    "/* Vectors [v0, v1) of `src` (bytes long: the last may be short) pushed to\n"
    "   offset v * 16 of `to` on every rank where to(p) is not NULL, UNROLL\n"
    "   vectors a thread in flight. */\n"
    "template <bool UNNEG = false, typename To>\n"
    "__device__ __forceinline__ void hir_push(const unsigned char *src, u64 bytes, u64 v0, u64 v1, int es, const hir_coll_args &a, To to) {\n"
    "  for (u64 v = v0 + threadIdx.x; v < v1; v += (u64)blockDim.x * UNROLL) {\n"
    "    uint4 x[UNROLL];\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < UNROLL; k++)\n"
    "      if (v + k * blockDim.x < v1) {\n"
    "        x[k] = hir_load(src + (v + k * blockDim.x) * 16, hir_valid(bytes, v + k * blockDim.x), es);\n"
    "        if (UNNEG) x[k] = hir_unneg(x[k]);\n"
    "      }\n"
    "    for (int i = 1; i <= a.n; i++) { /* from the next rank on: the ranks write to different peers at once */\n"
    "      int p = (a.me + i) % a.n;\n"
    "      unsigned char *dst = to(p);\n"
    "      if (!dst) continue;\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < UNROLL; k++)\n",
    "        if (v + k * blockDim.x < v1) *(uint4 *)(dst + (v + k * blockDim.x) * 16) = x[k];\n"
    "    }\n"
    "  }\n"
    "}\n"
    "\n"
    "/* A slot's 16 bytes at p, read once the peer's bytes are there (LANDING:\n"
    "   spinning on the sentinel; otherwise the block has met the peer), and the\n"
    "   sentinel put back; false: the wait gave up. */\n"
    "template <bool LANDING> __device__ __forceinline__ uint4 hir_slot_read(unsigned char *p) {\n"
    "  return LANDING ? hir_ld_volatile(p) : __ldcg((const uint4 *)p);\n"
    "}\n"
    "template <bool LANDING> __device__ __forceinline__ bool hir_slot_take(const hir_coll_args &a, unsigned char *p, uint4 &x, hir_wait *w) {\n"
    "  if (LANDING) return hir_take(a, p, x, w);\n"
    "  hir_clear(p);\n"
    "  return true;\n"
    "}\n"
    "\n"
    "/* Vectors [v0, v1) of every rank's slot here (this rank's own from `own`,\n"
    "   the caller's input, own_bytes long) summed in rank order, so every rank\n"
    "   that sums them gets the same bits; each sum given to put(v, sum). */\n"
    "template <int K, bool LANDING, typename Put>\n"
    "__device__ __forceinline__ bool hir_reduce(const hir_coll_args &a, unsigned seq, u64 v0, u64 v1, const unsigned char *own, u64 own_bytes,\n"
    "                                           hir_wait *w, Put put) {\n"
    "  for (u64 v = v0 + threadIdx.x; v < v1; v += (u64)blockDim.x * UNROLL) {\n"
    "    float acc[UNROLL][hir_lanes<K>::N];\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < UNROLL; k++)\n"
    "      for (int j = 0; j < hir_lanes<K>::N; j++) acc[k][j] = 0.f;\n"
    "    for (int q = 0; q < a.n; q++) {\n"
    "      unsigned char *slot = hir_slot(a, a.me, q, seq, 0);\n"
    "      uint4 x[UNROLL];\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < UNROLL; k++)\n"
    "        if (v + k * blockDim.x < v1)\n"
    "          x[k] = q == a.me ? hir_load(own + (v + k * blockDim.x) * 16, hir_valid(own_bytes, v + k * blockDim.x), hir_lanes<K>::ES)\n"
    "                           : hir_slot_read<LANDING>(slot + (v + k * blockDim.x) * 16);\n"
    "#pragma unroll\n"
    "      for (int k = 0; k < UNROLL; k++)\n"
    "        if (v + k * blockDim.x < v1) {\n"
    "          if (q != a.me && !hir_slot_take<LANDING>(a, slot + (v + k * blockDim.x) * 16, x[k], w)) return false;\n"
    "          hir_lanes<K>::add(acc[k], x[k]);\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < UNROLL; k++)\n"
    "      if (v + k * blockDim.x < v1) put(v + k * blockDim.x, hir_lanes<K>::pack(acc[k]));\n"
    "  }\n"
    "  return true;\n"
    "}\n"
    "\n"
    "/* Vectors [v0, v1) of src (a slot of ours) to the caller's dst, bytes long. */\n"
    "template <bool LANDING>\n"
    "__device__ __forceinline__ bool hir_copy_out(const hir_coll_args &a, unsigned char *dst, unsigned char *src, u64 bytes, u64 v0, u64 v1,\n"
    "                                             int es, hir_wait *w) {\n"
    "  for (u64 v = v0 + threadIdx.x; v < v1; v += (u64)blockDim.x * UNROLL) {\n"
    "    uint4 x[UNROLL];\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < UNROLL; k++)\n"
    "      if (v + k * blockDim.x < v1) x[k] = hir_slot_read<LANDING>(src + (v + k * blockDim.x) * 16);\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < UNROLL; k++)\n"
    "      if (v + k * blockDim.x < v1) {\n"
    "        if (!hir_slot_take<LANDING>(a, src + (v + k * blockDim.x) * 16, x[k], w)) return false;\n"
    "        hir_store(dst + (v + k * blockDim.x) * 16, x[k], hir_valid(bytes, v + k * blockDim.x), es);\n"
    "      }\n"
    "  }\n"
    "  return true;\n"
    "}\n"
    "\n"
    "/* A call's sequence number, the same for every block of the call: one more\n"
    "   than the last call's. Each block keeps a counter in the workspace; at its\n"
    "   end a block advances its own and those of the blocks this grid lacks\n"
    "   that fall to it (every gridDim.x-th from its own), so all MAXCTAS\n"
    "   counters stay equal from call to call whatever the grids, with no block\n",
    "   waiting for another of its own GPU. Every block of a call using the\n"
    "   call's number keeps consecutive calls on alternate halves. */\n"
    "__device__ __forceinline__ unsigned hir_begin(const hir_coll_args &a, unsigned *seq_shared, hir_wait *w) {\n"
    "  if (threadIdx.x == 0) {\n"
    "    *seq_shared = ((volatile unsigned *)(a.ws[a.me] + COUNTERS_AT))[blockIdx.x] + 1;\n"
    "    w->start = hir_now_ns();\n"
    "    w->next_stop = w->start + STOP_AFTER_NS;\n"
    "    w->failed = 0;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return *seq_shared;\n"
    "}\n"
    "__device__ __forceinline__ void hir_end(const hir_coll_args &a, unsigned seq) {\n"
    "  unsigned *counter = (unsigned *)(a.ws[a.me] + COUNTERS_AT);\n"
    "  for (unsigned b = blockIdx.x + threadIdx.x * gridDim.x; b < MAXCTAS; b += blockDim.x * gridDim.x) counter[b] = seq;\n"
    "}\n"
    "\n"
    "/* The kernels, on flags (f32, bytes) or on landing data (16-bit: LANDING,\n"
    "   with no meeting at all). */\n"
    "\n"
    "/* One shot: every rank's input pushed whole into every other rank's slot\n"
    "   for it, then each sums its slots and its own input. */\n"
    "template <int K, bool LANDING> __device__ void hir_allreduce_one(const hir_coll_args &a) {\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ hir_wait w;\n"
    "  const int es = hir_lanes<K>::ES;\n"
    "  u64 bytes = a.count * es, v0, v1;\n"
    "  unsigned seq = hir_begin(a, &seq_s, &w);\n"
    "  hir_part((bytes + 15) / 16, &v0, &v1);\n"
    "  hir_push<LANDING>(a.in, bytes, v0, v1, es, a, [&](int p) { return p == a.me ? (unsigned char *)0 : hir_slot(a, p, a.me, seq, 0); });\n"
    "  if (!LANDING && !hir_meet(a, 0, seq, &w)) return;\n"
    "  if (hir_reduce<K, LANDING>(a, seq, v0, v1, a.in, bytes, &w,\n"
    "                             [&](u64 v, const uint4 &sum) { hir_store(a.out + v * 16, sum, hir_valid(bytes, v), es); }))\n"
    "    hir_end(a, seq);\n"
    "}\n"
    "\n"
    "/* Two shots: segment s of every rank's input pushed into rank s's slot for\n"
    "   it; rank s sums its slots with its own segment and pushes the sum to\n"
    "   every rank's gathered region; each copies the others' sums out. */\n"
    "template <int K, bool LANDING> __device__ void hir_allreduce_two(const hir_coll_args &a) {\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ hir_wait w;\n"
    "  const int es = hir_lanes<K>::ES, per_vector = hir_lanes<K>::N;\n"
    "  u64 bytes = a.count * es, v0, v1;\n"
    "  u64 seg_bytes = ((a.count + a.n - 1) / a.n + per_vector - 1) / per_vector * per_vector * es;\n"
    "  unsigned seq = hir_begin(a, &seq_s, &w);\n"
    "  int s;\n"
    "  hir_part(seg_bytes / 16, &v0, &v1);\n"
    "  for (int i = 1; i < a.n; i++) {\n"
    "    s = (a.me + i) % a.n;\n"
    "    u64 lo = s * seg_bytes, len = lo < bytes ? (bytes - lo < seg_bytes ? bytes - lo : seg_bytes) : 0, w1 = (len + 15) / 16;\n"
    "    hir_push<LANDING>(a.in + lo, len, v0, v1 < w1 ? v1 : w1, es, a, [&](int p) { return p == s ? hir_slot(a, s, a.me, seq, 0) : (unsigned char *)0; });\n"
    "  }\n"
    "  if (!LANDING && !hir_meet(a, 0, seq, &w)) return;\n"
    "  {\n"
    "    u64 lo = a.me * seg_bytes, len = lo < bytes ? (bytes - lo < seg_bytes ? bytes - lo : seg_bytes) : 0, w1 = (len + 15) / 16;\n"
    "    if (!hir_reduce<K, LANDING>(a, seq, v0, v1 < w1 ? v1 : w1, a.in + lo, len, &w, [&](u64 v, const uint4 &sum) {\n"
    "          uint4 x = LANDING ? hir_unneg(sum) : sum; /* every rank keeps the same bits */\n"
    "          for (int i = 1; i < a.n; i++) *(uint4 *)(hir_slot(a, (a.me + i) % a.n, a.me, seq, 1) + v * 16) = x;\n"
    "          hir_store(a.out + lo + v * 16, x, hir_valid(len, v), es);\n"
    "        }))\n"
    "      return;\n"
    "  }\n"
    "  if (!LANDING && !hir_meet(a, 1, seq, &w)) return;\n"
    "  for (s = 0; s < a.n; s++) {\n"
    "    u64 lo = s * seg_bytes, len = lo < bytes ? (bytes - lo < seg_bytes ? bytes - lo : seg_bytes) : 0, w1 = (len + 15) / 16;\n",
    "    if (s != a.me && !hir_copy_out<LANDING>(a, a.out + lo, hir_slot(a, a.me, s, seq, 1), len, v0, v1 < w1 ? v1 : w1, es, &w)) return;\n"
    "  }\n"
    "  hir_end(a, seq);\n"
    "}\n"
    "\n"
    "/* Reduce-scatter: segment s of `in` (a.in_stride bytes apart) pushed into\n"
    "   rank s's slot for this rank; each rank sums its slots and its own\n"
    "   segment into out. */\n"
    "template <int K, bool LANDING> __device__ void hir_reduce_scatter(const hir_coll_args &a) {\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ hir_wait w;\n"
    "  const int es = hir_lanes<K>::ES;\n"
    "  u64 bytes = a.count * es, v0, v1;\n"
    "  unsigned seq = hir_begin(a, &seq_s, &w);\n"
    "  int s;\n"
    "  hir_part((bytes + 15) / 16, &v0, &v1);\n"
    "  for (int i = 1; i < a.n; i++) {\n"
    "    s = (a.me + i) % a.n;\n"
    "    hir_push<LANDING>(a.in + s * a.in_stride, bytes, v0, v1, es, a, [&](int p) { return p == s ? hir_slot(a, s, a.me, seq, 0) : (unsigned char *)0; });\n"
    "  }\n"
    "  if (!LANDING && !hir_meet(a, 0, seq, &w)) return;\n"
    "  if (hir_reduce<K, LANDING>(a, seq, v0, v1, a.in + a.me * a.in_stride, bytes, &w,\n"
    "                             [&](u64 v, const uint4 &sum) { hir_store(a.out + v * 16, sum, hir_valid(bytes, v), es); }))\n"
    "    hir_end(a, seq);\n"
    "}\n"
    "\n"
    "/* All-gather of a.count bytes a rank (any bytes: on flags): pushed into\n"
    "   every other rank's slot for it (and copied to this rank's own block of\n"
    "   out), then the slots copied out (a.out_stride bytes apart). */\n"
    "__device__ void hir_allgather(const hir_coll_args &a) {\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ hir_wait w;\n"
    "  u64 v0, v1;\n"
    "  unsigned seq = hir_begin(a, &seq_s, &w);\n"
    "  int p;\n"
    "  hir_part((a.count + 15) / 16, &v0, &v1);\n"
    "  hir_push(a.in, a.count, v0, v1, 1, a, [&](int q) { return q == a.me ? (unsigned char *)0 : hir_slot(a, q, a.me, seq, 0); });\n"
    "  for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x)\n"
    "    hir_store(a.out + a.me * a.out_stride + v * 16, hir_load(a.in + v * 16, hir_valid(a.count, v), 1), hir_valid(a.count, v), 1);\n"
    "  if (!hir_meet(a, 0, seq, &w)) return;\n"
    "  for (p = 0; p < a.n; p++)\n"
    "    if (p != a.me && !hir_copy_out<false>(a, a.out + p * a.out_stride, hir_slot(a, a.me, p, seq, 0), a.count, v0, v1, 1, &w)) return;\n"
    "  hir_end(a, seq);\n"
    "}\n"
    "\n"
    "/* The all-reduce then, row by row, h = sum + residual and out = h *\n"
    "   rsqrt(mean(h^2) + eps) * weight (a.h, a.out; a.res, a.wt; rows of\n"
    "   a.cols, whole 16-byte vectors): whole rows to a block, every gridDim.x-th\n"
    "   from blockIdx.x, pushes and sums alike, so a block meets (f32) the\n"
    "   namesakes that pushed its rows. One shot: every rank sums every row;\n"
    "   two shots: rank s the rows of segment s, whose h and out it pushes to\n"
    "   every rank's gathered region (h, then out a segment's bytes after).\n"
    "   The sum is rounded to the dtype before the add and h before the norm,\n"
    "   as the ops apart round them. */\n"
    "__device__ float hir_block_sum(float v, float *part) {\n"
    "  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  __syncthreads();\n"
    "  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;\n"
    "  __syncthreads();\n"
    "  v = (threadIdx.x & 31) < blockDim.x / 32 ? part[threadIdx.x & 31] : 0.f;\n"
    "  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n",
    "template <int K, bool LANDING, bool TWO> __device__ void hir_allreduce_rms(const hir_coll_args &a) {\n"
    "  typedef hir_lanes<K> L;\n"
    "  __shared__ unsigned seq_s;\n"
    "  __shared__ hir_wait w;\n"
    "  __shared__ float part[32];\n"
    "  const int es = L::ES;\n"
    "  u64 row = a.cols * es, nvec = row / 16, total = a.count * es, rows = a.count / a.cols;\n"
    "  u64 per = TWO ? (rows + a.n - 1) / a.n : rows, seg = per * row;\n"
    "  unsigned seq = hir_begin(a, &seq_s, &w);\n"
    "  for (int i = 1; i < (TWO ? a.n : 2); i++) { /* one shot: our rows to every peer; two: segment s's to rank s */\n"
    "    int s = (a.me + i) % a.n;\n"
    "    u64 lo = TWO ? s * seg : 0, len = lo < total ? (total - lo < seg ? total - lo : seg) : 0;\n"
    "    for (u64 j = blockIdx.x; j * row < len; j += gridDim.x)\n"
    "      hir_push<LANDING>(a.in + lo, len, j * nvec, (j + 1) * nvec, es, a, [&](int p) {\n"
    "        return (TWO ? p == s : p != a.me) ? hir_slot(a, p, a.me, seq, 0) : (unsigned char *)0;\n"
    "      });\n"
    "  }\n"
    "  if (!LANDING && !hir_meet(a, 0, seq, &w)) return;\n"
    "  u64 lo = TWO ? a.me * seg : 0, len = lo < total ? (total - lo < seg ? total - lo : seg) : 0;\n"
    "  for (u64 j = blockIdx.x; j * row < len; j += gridDim.x) {\n"
    "    float sq = 0.f;\n"
    "    hir_reduce<K, LANDING>(a, seq, j * nvec, (j + 1) * nvec, a.in + lo, len, &w, [&](u64 v, const uint4 &sum) {\n"
    "      float x[L::N];\n"
    "      for (int q = 0; q < L::N; q++) x[q] = 0.f;\n"
    "      L::add(x, sum);\n"
    "      L::add(x, hir_load(a.res + lo + v * 16, 16, es));\n"
    "      uint4 h = L::pack(x);\n"
    "      if (LANDING) h = hir_unneg(h);\n"
    "      for (int q = 0; q < L::N; q++) x[q] = 0.f;\n"
    "      L::add(x, h);\n"
    "      for (int q = 0; q < L::N; q++) sq += x[q] * x[q];\n"
    "      hir_store(a.h + lo + v * 16, h, 16, es);\n"
    "      for (int i = 1; TWO && i < a.n; i++) *(uint4 *)(hir_slot(a, (a.me + i) % a.n, a.me, seq, 1) + v * 16) = h;\n"
    "    });\n"
    "    float rstd = rsqrtf(hir_block_sum(sq, part) / (float)a.cols + (float)a.eps);\n" /* its barriers: every thread's h written, any failure seen */
    "    if (*(volatile int *)&w.failed) return;\n"
    "    for (u64 v = j * nvec + threadIdx.x; v < (j + 1) * nvec; v += blockDim.x) {\n"
    "      float x[L::N], g[L::N];\n"
    "      for (int q = 0; q < L::N; q++) x[q] = g[q] = 0.f;\n"
    "      L::add(x, hir_load(a.h + lo + v * 16, 16, es));\n"
    "      if (a.wt) L::add(g, hir_load(a.wt + (v - j * nvec) * 16, 16, es));\n"
    "      for (int q = 0; q < L::N; q++) x[q] = a.wt ? x[q] * rstd * g[q] : x[q] * rstd;\n"
    "      uint4 o = L::pack(x);\n"
    "      if (LANDING) o = hir_unneg(o);\n"
    "      hir_store(a.out + lo + v * 16, o, 16, es);\n"
    "      for (int i = 1; TWO && i < a.n; i++) *(uint4 *)(hir_slot(a, (a.me + i) % a.n, a.me, seq, 1) + seg + v * 16) = o;\n"
    "    }\n"
    "  }\n"
    "  if (TWO) {\n"
    "    if (!LANDING && !hir_meet(a, 1, seq, &w)) return;\n"
    "    for (int s = 0; s < a.n; s++) {\n"
    "      u64 at = s * seg, n = at < total ? (total - at < seg ? total - at : seg) : 0;\n"
    "      unsigned char *from = hir_slot(a, a.me, s, seq, 1);\n"
    "      for (u64 j = blockIdx.x; s != a.me && j * row < n; j += gridDim.x)\n"
    "        if (!hir_copy_out<LANDING>(a, a.h + at, from, n, j * nvec, (j + 1) * nvec, es, &w) ||\n"
    "            !hir_copy_out<LANDING>(a, a.out + at, from + seg, n, j * nvec, (j + 1) * nvec, es, &w))\n"
    "          return;\n"
    "    }\n"
    "  }\n"
    "  hir_end(a, seq);\n"
    "}\n",
    "/* The workspace's halves at their start: the sentinel everywhere. */\n"
    "extern \"C\" __global__ void hir_fill_sentinel(unsigned char *p, u64 vectors) {\n"
    "  for (u64 v = blockIdx.x * (u64)blockDim.x + threadIdx.x; v < vectors; v += (u64)gridDim.x * blockDim.x) hir_clear(p + v * 16);\n"
    "}\n"
    "\n"
    "#define HIR_COLL(name, body) extern \"C\" __global__ void __launch_bounds__(THREADS) name(hir_coll_args a) { body; }\n"
    "HIR_COLL(hir_allreduce_one_f32, (hir_allreduce_one<0, false>(a)))\n"
    "HIR_COLL(hir_allreduce_one_f16, (hir_allreduce_one<1, true>(a)))\n"
    "HIR_COLL(hir_allreduce_one_bf16, (hir_allreduce_one<2, true>(a)))\n"
    "HIR_COLL(hir_allreduce_two_f32, (hir_allreduce_two<0, false>(a)))\n"
    "HIR_COLL(hir_allreduce_two_f16, (hir_allreduce_two<1, true>(a)))\n"
    "HIR_COLL(hir_allreduce_two_bf16, (hir_allreduce_two<2, true>(a)))\n"
    "HIR_COLL(hir_reduce_scatter_f32, (hir_reduce_scatter<0, false>(a)))\n"
    "HIR_COLL(hir_reduce_scatter_f16, (hir_reduce_scatter<1, true>(a)))\n"
    "HIR_COLL(hir_reduce_scatter_bf16, (hir_reduce_scatter<2, true>(a)))\n"
    "HIR_COLL(hir_allgather_bytes, hir_allgather(a))\n"
    "HIR_COLL(hir_allreduce_rms_one_f32, (hir_allreduce_rms<0, false, false>(a)))\n"
    "HIR_COLL(hir_allreduce_rms_one_f16, (hir_allreduce_rms<1, true, false>(a)))\n"
    "HIR_COLL(hir_allreduce_rms_one_bf16, (hir_allreduce_rms<2, true, false>(a)))\n"
    "HIR_COLL(hir_allreduce_rms_two_f32, (hir_allreduce_rms<0, false, true>(a)))\n"
    "HIR_COLL(hir_allreduce_rms_two_f16, (hir_allreduce_rms<1, true, true>(a)))\n"
    "HIR_COLL(hir_allreduce_rms_two_bf16, (hir_allreduce_rms<2, true, true>(a)))\n"};

static char *hir_nccl__kc_text(void) {
  size_t i, n = 1;
  char *text;
  for (i = 0; i < sizeof hir_nccl__kc_source / sizeof hir_nccl__kc_source[0]; i++) n += strlen(hir_nccl__kc_source[i]);
  if (!(text = (char *)malloc(n))) return NULL;
  text[0] = 0;
  for (i = 0; i < sizeof hir_nccl__kc_source / sizeof hir_nccl__kc_source[0]; i++) strcat(text, hir_nccl__kc_source[i]);
  return text;
}

/* A workspace of kc's: its flags and counters zeroed, its halves holding
   the sentinel, and the event that orders its calls. */
static int hir_nccl__kc_workspace(hir_nccl__kc *kc, char *err, size_t cap) {
  unsigned char *halves;
  unsigned long long vectors = 2 * (unsigned long long)HIR_NCCL__KC_HALF / 16;
  void *argv[2] = {&halves, &vectors};
  dim3 grid = {256, 1, 1}, block = {256, 1, 1};
  cudaError_t e;
  if ((e = cudaMalloc((void **)&kc->mine, HIR_NCCL__KC_DATA_AT + 2 * (size_t)HIR_NCCL__KC_HALF)) != cudaSuccess ||
      (e = cudaMemset(kc->mine, 0, HIR_NCCL__KC_DATA_AT)) != cudaSuccess ||
      (halves = kc->mine + HIR_NCCL__KC_DATA_AT, e = cudaLaunchKernel((const void *)kc->fill, grid, block, argv, 0, 0)) != cudaSuccess ||
      (e = cudaStreamSynchronize(0)) != cudaSuccess || /* done before any stream of ours (nonblocking) touches it */
      (e = cudaEventCreateWithFlags(&kc->last, cudaEventDisableTiming)) != cudaSuccess) {
    cudaGetLastError();
    snprintf(err, cap, "the collectives' workspace (%d MiB): %s", (HIR_NCCL__KC_DATA_AT + 2 * HIR_NCCL__KC_HALF) >> 20,
             cudaGetErrorString(e));
    return 0;
  }
  return 1;
}

/* This rank's part of the setup: the kernels, and a workspace. */
static int hir_nccl__kc_prepare(hir_nccl__kc *kc, int device, char *err, size_t cap) {
  static const char *const kinds[HIR_NCCL__KC_KERNELS + 1] = {"hir_allreduce_one_", "hir_allreduce_two_", "hir_reduce_scatter_",
                                                               "hir_allgather_bytes", "hir_allreduce_rms_one_", "hir_allreduce_rms_two_",
                                                               "hir_fill_sentinel"};
  static const char *const types[3] = {"f32", "f16", "bf16"};
  char *text = hir_nccl__kc_text(), name[64];
  hir_status s;
  int k, t;
  if (!text) {
    snprintf(err, cap, "out of memory");
    return 0;
  }
  s = hir_cuda_library_load(device, text, "hostir_nccl's collectives", &kc->library, err, cap);
  free(text);
  if (s != HIR_OK) return 0;
  for (k = 0; k <= HIR_NCCL__KC_KERNELS; k++)
    for (t = 0; t < (k == HIR_NCCL__AG || k == HIR_NCCL__KC_KERNELS ? 1 : 3); t++) {
      int bytes = k == HIR_NCCL__AG || k == HIR_NCCL__KC_KERNELS;
      snprintf(name, sizeof name, "%s%s", kinds[k], bytes ? "" : types[t]);
      if (cudaLibraryGetKernel(k == HIR_NCCL__KC_KERNELS ? &kc->fill : &kc->kernel[k][t], (cudaLibrary_t)kc->library, name) !=
          cudaSuccess) {
        cudaGetLastError();
        snprintf(err, cap, "the collectives' library lacks %s", name);
        return 0;
      }
    }
  return hir_nccl__kc_workspace(kc, err, cap);
}

/* A team's kc on `from`'s kernels (the world's), with a workspace of its own. */
static int hir_nccl__kc_borrow(hir_nccl__kc *kc, const hir_nccl__kc *from, char *err, size_t cap) {
  memcpy(kc->kernel, from->kernel, sizeof kc->kernel);
  kc->fill = from->fill;
  return hir_nccl__kc_workspace(kc, err, cap);
}

/* The words of this host's block a rank's kernel collectives read and
   write; and the choice until it is measured (hir_nccl__kc_measure): where
   the kernels beat NCCL's on 2 H200s on 32 CTAs (bench/NOTES.md, kernel
   collectives). One shot moves (n-1) x S a rank, two shots 2 (n-1)/n x S. */
static void hir_nccl__kc_words(hir_nccl__kc *kc, const hir_nccl__ce *ce) {
  int z, k;
  kc->stop = (const unsigned *)(ce->pad_dev + offsetof(hir_nccl__ce_head, kernel_stop));
  kc->error = (unsigned *)(ce->pad_dev + offsetof(hir_nccl__ce_head, kernel_error)) + ce->me;
  for (z = 0; z < HIR_NCCL__KC_CLASSES; z++) {
    size_t bytes = hir_nccl__kc_class_bytes[z], most = (size_t)16 << 20;
    kc->use[HIR_NCCL__AR_ONE][z] = (signed char)(bytes <= ((size_t)2 << 20) / (size_t)(kc->n - 1) ? HIR_NCCL__AR_ONE
                                                 : bytes <= most ? HIR_NCCL__AR_TWO : -1);
    kc->use[HIR_NCCL__AR_TWO][z] = -1; /* unread: the all-reduce's row is AR_ONE's */
    kc->use[HIR_NCCL__RS][z] = (signed char)(bytes <= most ? HIR_NCCL__RS : -1);
    kc->use[HIR_NCCL__AG][z] = (signed char)(bytes <= most ? HIR_NCCL__AG : -1);
    for (k = 0; k < HIR_NCCL__KC_KINDS; k++) kc->ctas[k][z] = HIR_NCCL__KC_FEW;
  }
  kc->measured = 0;
}

static void hir_nccl__kc_free(hir_nccl__kc *kc) {
  int i;
  for (i = 0; i < HIR_NCCL__KC_RANKS; i++)
    if (kc->opened[i]) cudaIpcCloseMemHandle(kc->ws[i]);
  if (kc->mine) cudaFree(kc->mine);
  if (kc->last) cudaEventDestroy(kc->last);
  if (kc->library) cudaLibraryUnload((cudaLibrary_t)kc->library);
  memset(kc, 0, sizeof *kc);
}

/* The id of the capture `stream` is in (its graph in *graph), 0 where none. */
static unsigned long long hir_nccl__capture_of(void *stream, cudaGraph_t *graph) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaStreamGetCaptureInfo((cudaStream_t)stream, &status, &id, graph, NULL, NULL, NULL);
#else
  cudaError_t e = cudaStreamGetCaptureInfo((cudaStream_t)stream, &status, &id, graph, NULL, NULL);
#endif
  if (e != cudaSuccess) cudaGetLastError(); /* the capture is broken already: it fails at its end */
  return e == cudaSuccess && status == cudaStreamCaptureStatusActive ? (id ? id : 1) : 0;
}

/* One call of kernel `kind` on `stream`, after the previous call (which may
   be on another stream of the same capture, or eager), on as many CTAs as
   its `vectors` (16 bytes each, a thread's) ask, at most `ctas`. */
static hir_status hir_nccl__kc_launch(hir_nccl__kc *kc, int kind, hir_dtype dt, hir_nccl__kargs *a, unsigned long long vectors,
                                      int ctas, cudaStream_t stream, char *err, size_t cap) {
  cudaGraph_t graph = NULL;
  unsigned long long capture = hir_nccl__capture_of(stream, &graph);
  unsigned long long blocks = (vectors + HIR_NCCL__KC_THREADS - 1) / HIR_NCCL__KC_THREADS;
  cudaKernel_t kernel = kc->kernel[kind][kind == HIR_NCCL__AG ? 0 : dt == HIR_F32 ? 0 : dt == HIR_F16 ? 1 : 2];
  void *argv[1];
  dim3 grid, block;
  cudaError_t e = cudaSuccess;
  a->n = kc->n;
  a->me = kc->me;
  memcpy(a->ws, kc->ws, sizeof a->ws);
  a->half = HIR_NCCL__KC_HALF;
  a->stop = kc->stop;
  a->error = kc->error;
  grid.x = (unsigned)(blocks < 1 ? 1 : blocks > (unsigned long long)ctas ? (unsigned long long)ctas : blocks);
  grid.y = grid.z = 1;
  block.x = HIR_NCCL__KC_THREADS, block.y = block.z = 1;
  argv[0] = a;
  if (kc->last_stream && kc->last_stream != stream && kc->last_capture == capture) e = cudaStreamWaitEvent(stream, kc->last, 0);
  if (e == cudaSuccess) e = cudaLaunchKernel((const void *)kernel, grid, block, argv, 0, stream);
  if (e == cudaSuccess) e = cudaEventRecord(kc->last, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(err, cap, "launching a kernel collective: %s", cudaGetErrorString(e));
    return HIR_ERR_BACKEND;
  }
  kc->last_stream = stream;
  kc->last_capture = capture;
  return HIR_OK;
}

/* A slot's bytes: what one rank pushes into another's half in one call. */
static size_t hir_nccl__kc_slot(int n) { return (size_t)HIR_NCCL__KC_HALF / 2 / (size_t)n / 16 * 16; }

/* An all-reduce of `count` elements: at most a slot (one shot) or a slot a
   rank (two shots) in one call; larger ones run as several calls. */
static hir_status hir_nccl__kc_allreduce(hir_nccl__kc *kc, int two, int ctas, const void *send, void *recv, size_t count,
                                         hir_dtype dt, unsigned long long timeout_ns, cudaStream_t stream, char *err, size_t cap) {
  size_t es = hir_dtype_size(dt), most = hir_nccl__kc_slot(kc->n) / es * (two ? (size_t)kc->n : 1), done;
  hir_status s = HIR_OK;
  for (done = 0; done < count && s == HIR_OK; done += most) {
    hir_nccl__kargs a;
    size_t part = count - done < most ? count - done : most;
    unsigned long long seg_vectors = ((part + (size_t)kc->n - 1) / (size_t)kc->n * es + 15) / 16;
    memset(&a, 0, sizeof a);
    a.in = (const unsigned char *)send + done * es;
    a.out = (unsigned char *)recv + done * es;
    a.count = part;
    a.timeout_ns = timeout_ns;
    s = hir_nccl__kc_launch(kc, two ? HIR_NCCL__AR_TWO : HIR_NCCL__AR_ONE, dt, &a, two ? seg_vectors : (part * es + 15) / 16,
                            ctas, stream, err, cap);
  }
  return s;
}

/* An all-reduce of `rows` rows of `cols` elements (whole 16-byte vectors)
   with the rms_norm after it (hir_comm.allreduce_rms_norm): as many whole
   rows a call as its slots take (one shot: all of them, a slot; two
   shots: a rank's segment of h and of out, a slot), a block a row. */
static hir_status hir_nccl__kc_allreduce_rms(hir_nccl__kc *kc, int two, int ctas, const void *send, const void *residual,
                                             const void *weight, void *h, void *out, size_t rows, size_t cols, hir_dtype dt, double eps,
                                             unsigned long long timeout_ns, cudaStream_t stream, char *err, size_t cap) {
  size_t row = cols * hir_dtype_size(dt), slot = hir_nccl__kc_slot(kc->n), most = two ? slot / 2 / row * (size_t)kc->n : slot / row;
  size_t done, at;
  hir_status s = HIR_OK;
  for (done = 0; done < rows && s == HIR_OK; done += most) {
    hir_nccl__kargs a;
    size_t part = rows - done < most ? rows - done : most, per = two ? (part + (size_t)kc->n - 1) / (size_t)kc->n : part;
    memset(&a, 0, sizeof a);
    at = done * row;
    a.in = (const unsigned char *)send + at;
    a.out = (unsigned char *)out + at;
    a.residual = (const unsigned char *)residual + at;
    a.weight = weight;
    a.h = (unsigned char *)h + at;
    a.count = part * cols;
    a.cols = cols;
    a.eps = eps;
    a.timeout_ns = timeout_ns;
    s = hir_nccl__kc_launch(kc, two ? HIR_NCCL__AR_RMS_TWO : HIR_NCCL__AR_RMS_ONE, dt, &a, per * HIR_NCCL__KC_THREADS, ctas, stream,
                            err, cap);
  }
  return s;
}

/* count: elements each rank gets. */
static hir_status hir_nccl__kc_reduce_scatter(hir_nccl__kc *kc, int ctas, const void *send, void *recv, size_t count, hir_dtype dt,
                                              unsigned long long timeout_ns, cudaStream_t stream, char *err, size_t cap) {
  size_t es = hir_dtype_size(dt), most = hir_nccl__kc_slot(kc->n) / es, done;
  hir_status s = HIR_OK;
  for (done = 0; done < count && s == HIR_OK; done += most) {
    hir_nccl__kargs a;
    size_t part = count - done < most ? count - done : most;
    memset(&a, 0, sizeof a);
    a.in = (const unsigned char *)send + done * es;
    a.out = (unsigned char *)recv + done * es;
    a.count = part;
    a.in_stride = count * es;
    a.timeout_ns = timeout_ns;
    s = hir_nccl__kc_launch(kc, HIR_NCCL__RS, dt, &a, (part * es + 15) / 16, ctas, stream, err, cap);
  }
  return s;
}

/* bytes: what each rank gives. */
static hir_status hir_nccl__kc_allgather(hir_nccl__kc *kc, int ctas, const void *send, void *recv, size_t bytes,
                                         unsigned long long timeout_ns, cudaStream_t stream, char *err, size_t cap) {
  size_t most = hir_nccl__kc_slot(kc->n), done;
  hir_status s = HIR_OK;
  for (done = 0; done < bytes && s == HIR_OK; done += most) {
    hir_nccl__kargs a;
    size_t part = bytes - done < most ? bytes - done : most;
    memset(&a, 0, sizeof a);
    a.in = (const unsigned char *)send + done;
    a.out = (unsigned char *)recv + done;
    a.count = part;
    a.out_stride = bytes;
    a.timeout_ns = timeout_ns;
    s = hir_nccl__kc_launch(kc, HIR_NCCL__AG, HIR_F32, &a, (part + 15) / 16, ctas, stream, err, cap);
  }
  return s;
}

// >>nccl_comm
typedef struct hir_nccl__team {
  struct hir_nccl__team *next;
  int n, me, *devices;
  ncclComm_t comm;              /* nonblocking: setup, and the parent of `fast` */
  ncclComm_t fast;              /* blocking twin for the data path (hir_nccl__twin); NULL: `comm` */
  hir_nccl__kc *kc;             /* a team other than the world: its kernel collectives (hir_nccl__team_kc); NULL: NCCL's */
} hir_nccl__team;

typedef struct hir_nccl__team_id {
  struct hir_nccl__team_id *next;
  int n, *devices;
  ncclUniqueId id;
} hir_nccl__team_id;

typedef struct hir_nccl__reg {  /* a registered buffer: a handle per communicator */
  struct hir_nccl__reg *next;
  void *ptr;
  int n;
  ncclComm_t comms[16];
  void *handles[16];
} hir_nccl__reg;

typedef struct hir_nccl__ce_op {     /* a send or receive held until its group ends */
  int send, peer;
  void *buf, *stream;
  size_t bytes;
  unsigned long long seq;
  int graph_word;               /* a captured receive's graph words; -1: eager */
  int at_start;                 /* a captured receive posted at the replay's start (hir_comm.recv_at_start) */
  hir_comm_what what;
} hir_nccl__ce_op;

typedef struct hir_nccl__rank {
  hir_comm comm;                /* what the evaluator sees; ctx points back here */
  hir_nccl__ce_op ce_ops[HIR_NCCL__CE_GROUP];
  int ce_nops, ce_group;
  int ce_on;                    /* send/recv to peers of this host on the copy engines */
  hir_nccl__ce ce;
  hir_nccl__kc kc;              /* collectives on kernels of ours, where every rank shares this host */
  hir_nccl_path path;           /* which path collectives take (hir_nccl_comm_set_path) */
  char kc_why[200];             /* why kernel collectives are off, for hir_nccl_comm_describe */
  char path_words[96];          /* hir_nccl__collective_path's answer */
  struct hir_nccl__start_signals *start_pending; /* receives captured to be posted at a replay's start, not yet taken */
  hir_nccl__reg *regs;
  ncclComm_t world;
  int borrowed;                 /* the world communicator is the caller's: never aborted or destroyed here */
  int device, timeout_ms, aborted;
  int told;                     /* another rank's failure ended this one's communication */
  char why[HIR_NCCL__VALUE_BYTES]; /* what ended it (aborted) */
  double next_look_ms;          /* processes: when to look for an abort note in rank 0's store next */
  hir_nccl__team world_team;    /* the team of every rank in order: the world itself */
  hir_nccl__team *teams;
  hir_nccl_world *shared;       /* threaded: the ids of teams, shared by the ranks */
  hir_nccl__store store;        /* one process per GPU: rank 0's store */
  void *zeros;                  /* what a reduce root without data contributes */
  size_t zeros_cap;
  void *zeros_old[16];          /* outgrown, kept: a run never frees (see HIR__CUDA_RETIRED) */
  int nzeros_old;
  pthread_t *aborting;          /* each aborting a communicator and its twin (hir_nccl__abort_comms) */
  ncclComm_t (*abort_pairs)[2];
  int naborting;
  int twins;                    /* the data path runs on blocking twins, watched (hir_nccl__twin) */
  long long inside;             /* atomic: > 0 when a data-path call began (us); the watchdog's states below */
  pthread_t watchdog;
  int watching, watch_stop;
  pthread_mutex_t watch_mu;
  pthread_cond_t watch_cv;
  char trip_why[200];           /* why the watchdog ended a call */
  double watch_next_look_ms;    /* the watchdog's next look in rank 0's store */
  char how[640];                /* how the rank joined, for hir_nccl_comm_describe */
  char description[1600];
} hir_nccl__rank;

struct hir_nccl_world {
  int n, peer_access;           /* copy engines: peer access enabled between every pair of GPUs */
  hir_nccl__rank *ranks;
  unsigned char *block;         /* the ranks' shared block for copy-engine send/recv (pinned) */
  pthread_mutex_t mu;
  hir_nccl__team_id *ids;       /* the ids of the teams made so far */
  int aborted;                  /* set (atomically, with mu) after the first failing rank's note */
  char abort_note[512];
  char error[512];
};

static ncclDataType_t hir_nccl__type(hir_dtype d) { /* fp8 only moves (hostir never reduces it): bytes */
  return d == HIR_F32 ? ncclFloat32 : d == HIR_F64 ? ncclFloat64 : d == HIR_F16 ? ncclFloat16 : d == HIR_BF16 ? ncclBfloat16
         : d == HIR_I64 ? ncclInt64 : ncclUint8;
}

static hir_nccl__rank *hir_nccl__of(hir_comm *c) { return (hir_nccl__rank *)c->ctx; }

/* Our communicators are nonblocking, so that a dead peer cannot hold the
   caller inside NCCL (connecting to it, say) past any deadline. Their
   splits share their connections and abort flag: NCCL takes that from the
   parent's config, and the data path's blocking twins need it
   (hir_nccl__twin). */
static ncclConfig_t hir_nccl__config(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 1;
  return config;
}

/* A blocking twin's (hir_nccl__twin). */
static ncclConfig_t hir_nccl__twin_config(void) {
  ncclConfig_t config = hir_nccl__config();
  config.blocking = 1;
  return config;
}

/* Waits, up to the deadline, until a communicator made in a group from
   this thread (a threaded world's) is no longer in progress: its state. */
static ncclResult_t hir_nccl__made(ncclComm_t comm, double deadline) {
  ncclResult_t q, state = ncclInProgress;
  while ((q = ncclCommGetAsyncError(comm, &state)) == ncclSuccess && state == ncclInProgress && hir_nccl__wall_ms() < deadline)
    hir_nccl__sleep_ms(1);
  return q != ncclSuccess ? q : state;
}

/* Stops this rank's NCCL work for good. ncclCommAbort first tells the
   kernels in flight to quit, then waits until every CUDA graph that captured
   the communicator is destroyed - graphs of evaluators that are still
   running, on this very thread maybe. So each communicator is aborted on a
   thread of its own (not one thread for all: while it waited on the first
   one's graphs, the next one's kernels would keep spinning), joined when the
   rank is released, after its evaluators. A communicator and its blocking
   twin share one abort flag, so one thread aborts both, the parent first
   (no graph holds it). */
static void *hir_nccl__abort_thread(void *pair) {
  ncclCommAbort(((ncclComm_t *)pair)[0]); /* NULL where the watchdog aborted it already */
  ncclCommAbort(((ncclComm_t *)pair)[1]);
  return NULL;
}

static void hir_nccl__abort_async(hir_nccl__rank *nc, ncclComm_t parent, ncclComm_t twin) {
  ncclComm_t *pair = nc->abort_pairs ? nc->abort_pairs[nc->naborting] : NULL;
  if (!parent && !twin) return;
  if (pair) pair[0] = parent, pair[1] = twin;
  if (pair && pthread_create(&nc->aborting[nc->naborting], NULL, hir_nccl__abort_thread, pair) == 0) nc->naborting++;
  else ncclCommAbort(parent), ncclCommAbort(twin); /* no thread to be had: here, then */
}

static void hir_nccl__abort_comms(hir_nccl__rank *nc, const char *why) {
  hir_nccl__team *t;
  size_t n = (nc->world && !nc->borrowed) || nc->world_team.fast;
  if (nc->aborted) return;
  nc->aborted = 1;
  snprintf(nc->why, sizeof nc->why, "%s", why);
  for (t = nc->teams; t; t = t->next) n++;
  if (n) {
    nc->aborting = (pthread_t *)malloc(n * sizeof *nc->aborting);
    nc->abort_pairs = (ncclComm_t(*)[2])malloc(n * sizeof *nc->abort_pairs);
  }
  if (!nc->aborting || !nc->abort_pairs) free(nc->aborting), free(nc->abort_pairs), nc->aborting = NULL, nc->abort_pairs = NULL;
  for (t = nc->teams; t; t = t->next) hir_nccl__abort_async(nc, t->comm, t->fast);
  hir_nccl__abort_async(nc, nc->borrowed ? NULL : nc->world, nc->world_team.fast);
  hir_nccl__ce_release(&nc->ce);
}

/* hir_comm.abort: unless another rank's note ended this one, this rank's
   failure (its `error`) becomes the note the others find: on this host (the
   copy engines' block), in the world (threads) or in rank 0's store
   (processes, where the first note stays). */
static void hir_nccl__abort(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  char note[HIR_NCCL__VALUE_BYTES];
  if (c->error[0]) snprintf(note, sizeof note, "rank %d failed: %.480s", c->rank, c->error);
  else snprintf(note, sizeof note, "rank %d aborted", c->rank);
  if (!nc->told) {
    if (nc->ce.block) hir_nccl__ce_tell(&nc->ce, note);
    if (nc->shared) {
      pthread_mutex_lock(&nc->shared->mu);
      if (!__atomic_load_n(&nc->shared->aborted, __ATOMIC_ACQUIRE))
        snprintf(nc->shared->abort_note, sizeof nc->shared->abort_note, "%s", note);
      __atomic_store_n(&nc->shared->aborted, 1, __ATOMIC_RELEASE); /* after the note: told() reads it without the lock */
      pthread_mutex_unlock(&nc->shared->mu);
    } else if (nc->store.naddrs) {
      char ignored[HIR_NCCL__VALUE_BYTES];
      hir_nccl__store_call(&nc->store, 'S', "abort", note, sizeof note, hir_nccl__wall_ms() + 1000, ignored, sizeof ignored);
    }
    nc->told = 1;
  }
  hir_nccl__abort_comms(nc, note);
}

/* Whether another rank's note ended the world; if so this rank's
   communicators are aborted and `error` says why. The host's block is read
   every time, rank 0's store at most every 100 ms (rank 0 in its own
   memory). */
static int hir_nccl__told(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  char note[HIR_NCCL__VALUE_BYTES] = "";
  if (nc->told) return 1;
  if (nc->ce.block) hir_nccl__ce_heard(&nc->ce, note, sizeof note);
  if (note[0]) {
  } else if (nc->shared) { /* polled while NCCL works: the lock only once a rank has failed */
    if (__atomic_load_n(&nc->shared->aborted, __ATOMIC_ACQUIRE)) {
      pthread_mutex_lock(&nc->shared->mu);
      snprintf(note, sizeof note, "%s", nc->shared->abort_note);
      pthread_mutex_unlock(&nc->shared->mu);
    }
  } else if (nc->store.naddrs && (nc->store.serving || hir_nccl__wall_ms() >= nc->next_look_ms)) {
    hir_nccl__msg m;
    memset(&m, 0, sizeof m);
    m.op = 'G';
    snprintf(m.key, sizeof m.key, "abort");
    if (hir_nccl__store_ask(&nc->store, &m, hir_nccl__wall_ms() + 250) && m.op == 'V')
      snprintf(note, sizeof note, "%.*s", (int)sizeof m.value - 1, (const char *)m.value);
    nc->next_look_ms = hir_nccl__wall_ms() + 100;
  }
  if (!note[0]) return 0;
  nc->told = 1;
  hir_nccl__abort_comms(nc, note);
  snprintf(c->error, sizeof c->error, "hostir_nccl: rank %d stopped: the world was aborted: %.440s", c->rank, note);
  return 1;
}

/* Waits while `comm` is busy with a nonblocking call; its state after, or
   ncclInProgress past the deadline or when another rank's note came. */
static ncclResult_t hir_nccl__wait(hir_comm *c, ncclComm_t comm, double deadline) {
  ncclResult_t r = ncclSuccess, q;
  struct timespec nap = {0, 50000}; /* 50 us */
  double spin_until = hir_nccl__wall_ms() + 0.3; /* a launch settles in microseconds: a nap would cost ~60 us a call */
  while ((q = ncclCommGetAsyncError(comm, &r)) == ncclSuccess && r == ncclInProgress && hir_nccl__wall_ms() < deadline &&
         !hir_nccl__told(c))
    if (hir_nccl__wall_ms() >= spin_until) nanosleep(&nap, NULL);
  return q != ncclSuccess ? q : r;
}

static hir_status hir_nccl__settle(hir_comm *c, ncclComm_t pending, const char *what) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  double deadline = hir_nccl__wall_ms() + nc->timeout_ms;
  hir_nccl__team *t = nc->teams;
  ncclComm_t comm = pending ? pending : nc->world;
  for (;;) {
    ncclResult_t r = comm ? hir_nccl__wait(c, comm, deadline) : ncclSuccess;
    if (r == ncclInProgress && nc->told) {
      if (pending && pending != nc->world) ncclCommAbort(pending);
      return HIR_ERR_COMM;
    }
    if (r == ncclInProgress) {
      char log[340];
      hir_nccl__store_log(&nc->store, log, sizeof log);
      if (pending && pending != nc->world) ncclCommAbort(pending);
      snprintf(c->error, sizeof c->error,
               "%s on rank %d still waited for its peers after %d ms: a peer is dead or stuck, so the communicator was "
               "aborted (raise the timeout of hir_nccl_comm_create if they are only slow)%s",
               what, c->rank, nc->timeout_ms, log);
      hir_nccl__abort(c);
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

/* After an abort this rank's communicators are gone: every later call is
   refused, saying what ended them, instead of reaching NCCL. */
static int hir_nccl__ended(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  if (!nc->aborted) return 0;
  snprintf(c->error, sizeof c->error, "hostir_nccl: rank %d's communicator was aborted by an earlier failure and runs "
           "nothing more (free it and make a new one on every rank): %.300s", c->rank, nc->why);
  return 1;
}

static hir_status hir_nccl__init_comm(hir_comm *c, ncclComm_t *comm, int n, ncclUniqueId id, int me) {
  ncclConfig_t config = hir_nccl__config();
  ncclResult_t r = ncclCommInitRankConfig(comm, n, id, me, &config);
  if (r == ncclInProgress) return hir_nccl__settle(c, *comm, "ncclCommInitRankConfig");
  return HIR_NCCL__CHECK(c, r);
}

/* ---- the data path's blocking twins, and their watchdog ----
   Each launch on a nonblocking communicator costs the host 60-240 us: NCCL
   starts a thread to make it (bench/NOTES.md section 37). So the data path
   runs on a blocking twin of every communicator, split from it with
   splitShare, which shares the parent's connections and its abort flag;
   setup stays on the nonblocking parent. A blocking call waits on the host
   for its peers only while NCCL connects (a peer's or an algorithm's first
   use). A watchdog thread bounds that wait: once a call has run past the
   deadline, or another rank has failed (a threaded world's note; this
   host's block: a note, a peer process gone; rank 0's store, asked every
   100 ms once a call has waited that long), it aborts the idle parents,
   which raises the flag the call's loops read, and the call returns. On
   by default; HOSTIR_NCCL_BLOCKING=0 on any rank keeps every rank's data
   path on the nonblocking parents (each launch then pays NCCL's thread).
   `inside` is the call's start (us, > 0), 0 outside a call, or one of: */
enum { HIR_NCCL__TRIPPING = -1, HIR_NCCL__TRIPPED = -2 };

static long long hir_nccl__now_us(void) { return (long long)(hir_nccl__wall_ms() * 1000.0) + 1; }

/* Whether another rank's failure has been noted, for the watchdog of a
   call that began at `since` (rank 0's store answers from any thread). */
static int hir_nccl__watch_told(hir_nccl__rank *nc, long long since) {
  hir_nccl__msg m;
  double now = hir_nccl__wall_ms();
  if ((nc->shared && __atomic_load_n(&nc->shared->aborted, __ATOMIC_ACQUIRE)) || hir_nccl__ce_noted(&nc->ce)) return 1;
  if (!nc->store.naddrs || hir_nccl__now_us() - since < 100000 || now < nc->watch_next_look_ms) return 0;
  nc->watch_next_look_ms = now + 100;
  memset(&m, 0, sizeof m);
  m.op = 'G';
  snprintf(m.key, sizeof m.key, "abort");
  return hir_nccl__store_ask(&nc->store, &m, now + 250) && m.op == 'V';
}

/* Past the deadline (or told), the watchdog takes the call over and aborts
   every parent, leaving NULL where one was. Only the rank's own thread
   writes a start, and only the watchdog a negative state, so the exchange
   decides who goes on. */
static void hir_nccl__watch(hir_nccl__rank *nc) {
  long long since = __atomic_load_n(&nc->inside, __ATOMIC_ACQUIRE);
  hir_nccl__team *t;
  int told;
  if (since <= 0) return;
  told = hir_nccl__watch_told(nc, since);
  if (!told && hir_nccl__now_us() - since < (long long)nc->timeout_ms * 1000) return;
  if (!__atomic_compare_exchange_n(&nc->inside, &since, (long long)HIR_NCCL__TRIPPING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  if (told) snprintf(nc->trip_why, sizeof nc->trip_why, "was ended by another rank's failure");
  else snprintf(nc->trip_why, sizeof nc->trip_why, "still waited for its peers after %d ms (NCCL connecting to them): a peer "
                "is dead or stuck, so the communicator was aborted (raise the timeout of hir_nccl_comm_create if they are "
                "only slow)", nc->timeout_ms);
  for (t = nc->teams; t; t = t->next) ncclCommAbort(t->comm), t->comm = NULL;
  if (nc->world && !nc->borrowed) ncclCommAbort(nc->world), nc->world = nc->world_team.comm = NULL;
  __atomic_store_n(&nc->inside, (long long)HIR_NCCL__TRIPPED, __ATOMIC_RELEASE);
}

static void *hir_nccl__watchdog(void *arg) {
  hir_nccl__rank *nc = (hir_nccl__rank *)arg;
  pthread_mutex_lock(&nc->watch_mu);
  while (!nc->watch_stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20000000L; /* 20 ms: a failing peer's note is heard that soon */
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&nc->watch_cv, &nc->watch_mu, &until);
    if (!nc->watch_stop) hir_nccl__watch(nc);
  }
  pthread_mutex_unlock(&nc->watch_mu);
  return NULL;
}

static void hir_nccl__watch_stop(hir_nccl__rank *nc) {
  if (!nc->watching) return;
  pthread_mutex_lock(&nc->watch_mu);
  nc->watch_stop = 1;
  pthread_cond_signal(&nc->watch_cv);
  pthread_mutex_unlock(&nc->watch_mu);
  pthread_join(nc->watchdog, NULL);
  pthread_cond_destroy(&nc->watch_cv);
  pthread_mutex_destroy(&nc->watch_mu);
  nc->watching = 0;
}

/* Whether this rank's data path can take twins: its watchdog runs. The
   ranks then agree (every rank's data path must be on the same kind). */
/* HOSTIR_NCCL_BLOCKING, HOSTIR_COPY_ENGINE and HOSTIR_KERNEL_COLLECTIVES (0/1, on/off, true/false;
   default on), checked when a rank is made: anything else refuses it. */
static int hir_nccl__switch(const char *name) {
  int on = 1;
  hir_env_switch(name, 1, &on, NULL, 0);
  return on;
}

static hir_status hir_nccl__check_switches(char *err, size_t cap) {
  int on;
  char why[160];
  if (hir_env_switch("HOSTIR_NCCL_BLOCKING", 1, &on, why, sizeof why) == HIR_OK &&
      hir_env_switch("HOSTIR_COPY_ENGINE", 1, &on, why, sizeof why) == HIR_OK &&
      hir_env_switch("HOSTIR_KERNEL_COLLECTIVES", 1, &on, why, sizeof why) == HIR_OK &&
      hir_env_switch("HOSTIR_MEASURE_COLLECTIVES", 1, &on, why, sizeof why) == HIR_OK)
    return HIR_OK;
  snprintf(err, cap, "hostir_nccl: %s", why);
  return HIR_ERR_INVALID;
}

static int hir_nccl__twins_on(hir_nccl__rank *nc) {
  const char *share = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  if (nc->borrowed || !hir_nccl__switch("HOSTIR_NCCL_BLOCKING")) return 0; /* a borrowed communicator: the caller's mode */
  if (share && strcmp(share, "1")) return 0;          /* a twin that shares nothing could not be ended */
  if (nc->watching) return 1;
  pthread_mutex_init(&nc->watch_mu, NULL);
  pthread_cond_init(&nc->watch_cv, NULL);
  nc->watch_stop = 0;
  if (pthread_create(&nc->watchdog, NULL, hir_nccl__watchdog, nc) != 0) {
    pthread_cond_destroy(&nc->watch_cv);
    pthread_mutex_destroy(&nc->watch_mu);
    return 0;
  }
  return nc->watching = 1;
}

/* The blocking twin of `parent` (this rank's `me` in it), or none (NULL)
   where twins are off. Collective over the parent's ranks; waited for
   under the deadline like every setup call. */
static hir_status hir_nccl__twin(hir_comm *c, ncclComm_t parent, int me, ncclComm_t *fast) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  ncclConfig_t config = hir_nccl__twin_config();
  ncclResult_t r;
  *fast = NULL;
  if (!nc->twins) return HIR_OK;
  r = ncclCommSplit(parent, 0, me, fast, &config);
  /* from a nonblocking parent the split goes on after the call returns (even
     ncclSuccess): done once the parent is no longer in progress */
  if (r == ncclSuccess || r == ncclInProgress) r = hir_nccl__wait(c, parent, hir_nccl__wall_ms() + nc->timeout_ms);
  if (r == ncclSuccess && *fast) return HIR_OK;
  if (*fast) ncclCommAbort(*fast), *fast = NULL;
  if (r == ncclInProgress) {
    snprintf(c->error, sizeof c->error, "ncclCommSplit (the data path's blocking twin) on rank %d still waited for its peers "
             "after %d ms: a peer is dead or stuck", c->rank, nc->timeout_ms);
    hir_nccl__abort(c);
    return HIR_ERR_TIMEOUT;
  }
  snprintf(c->error, sizeof c->error, "ncclCommSplit (the data path's blocking twin) failed on rank %d: %s", c->rank,
           r == ncclSuccess ? "no communicator came back" : ncclGetErrorString(r));
  return HIR_ERR_COMM;
}

/* The communicator a team's data path uses. */
static ncclComm_t hir_nccl__data(const hir_nccl__team *t) { return t->fast ? t->fast : t->comm; }

/* The world's team, then every other: for (t = &nc->world_team; t; t = hir_nccl__next_team(nc, t)). */
static hir_nccl__team *hir_nccl__next_team(hir_nccl__rank *nc, hir_nccl__team *t) {
  return t == &nc->world_team ? nc->teams : t->next;
}

/* A data-path call's end: its result, or the watchdog's verdict. */
static hir_status hir_nccl__data_check(hir_comm *c, ncclResult_t r, const char *what, int line) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  long long since;
  if (!nc->twins) return hir_nccl__check(c, r, what, line);
  since = __atomic_load_n(&nc->inside, __ATOMIC_ACQUIRE);
  if (since > 0 && __atomic_compare_exchange_n(&nc->inside, &since, 0LL, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return hir_nccl__check(c, r, what, line);
  while (__atomic_load_n(&nc->inside, __ATOMIC_ACQUIRE) != HIR_NCCL__TRIPPED) hir_nccl__sleep_ms(1);
  __atomic_store_n(&nc->inside, 0LL, __ATOMIC_RELEASE);
  if (hir_nccl__told(c)) return HIR_ERR_COMM;
  snprintf(c->error, sizeof c->error, "%s on rank %d %s", what, c->rank, nc->trip_why);
  hir_nccl__abort(c);
  return HIR_ERR_TIMEOUT;
}
#define HIR_NCCL__DATA(c, call)                                                                                               \
  (hir_nccl__of(c)->twins ? __atomic_store_n(&hir_nccl__of(c)->inside, hir_nccl__now_us(), __ATOMIC_RELEASE) : (void)0,     \
   hir_nccl__data_check(c, (call), #call, __LINE__))

/* Waits for the setup's own work on `stream` (an exchange between ranks)
   under the communicator's deadline: a dead peer aborts the world. */
static hir_status hir_nccl__setup_wait(hir_comm *c, cudaStream_t stream, const char *what) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  double deadline = hir_nccl__wall_ms() + nc->timeout_ms;
  cudaError_t e;
  while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady) {
    if (hir_nccl__told(c)) return HIR_ERR_COMM;
    if (hir_nccl__wall_ms() > deadline) {
      snprintf(c->error, sizeof c->error, "%s on rank %d still waited for its peers after %d ms: a peer is dead or stuck, "
               "so the communicator was aborted", what, c->rank, nc->timeout_ms);
      hir_nccl__abort(c);
      return HIR_ERR_TIMEOUT;
    }
    hir_nccl__sleep_ms(0);
  }
  if (e == cudaSuccess) return HIR_OK;
  snprintf(c->error, sizeof c->error, "%s on rank %d: %s", what, c->rank, cudaGetErrorString(e));
  return HIR_ERR_BACKEND;
}

/* Moves a few bytes between the `size` ranks of `comm` (this one `rank` in
   it), for the setup: every rank's `bytes` into `all` in rank order
   (allgather), or, with root >= 0, root's to the ranks of `to`. */
static hir_status hir_nccl__exchange_on(hir_comm *c, ncclComm_t comm, int size, int rank, const void *mine, void *all, size_t bytes,
                                        int root, const int *to, int nto) {
  size_t total = root < 0 ? bytes * (size_t)size : bytes;
  unsigned char *buf = NULL;
  cudaStream_t stream = NULL;
  hir_status s = HIR_OK;
  cudaError_t e;
  int i;
  if ((e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaMalloc((void **)&buf, total)) != cudaSuccess ||
      /* on `stream`: a pageable copy on the legacy stream returns once staged, and a nonblocking stream does not wait for it */
      (e = cudaMemcpyAsync(root < 0 ? buf + bytes * (size_t)rank : buf, mine, bytes, cudaMemcpyHostToDevice, stream)) != cudaSuccess) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: the setup's exchange on rank %d: %s", c->rank, cudaGetErrorString(e));
    s = HIR_ERR_BACKEND;
  } else if (root < 0) {
    s = HIR_NCCL__CHECK(c, ncclAllGather(buf + bytes * (size_t)rank, buf, bytes, ncclUint8, comm, stream));
  } else if ((s = HIR_NCCL__CHECK(c, ncclGroupStart())) == HIR_OK) {
    for (i = 0; i < nto && s == HIR_OK; i++)
      if (rank == root && to[i] != root) s = HIR_NCCL__CHECK(c, ncclSend(buf, bytes, ncclUint8, to[i], comm, stream));
    if (rank != root && s == HIR_OK) s = HIR_NCCL__CHECK(c, ncclRecv(buf, bytes, ncclUint8, root, comm, stream));
    s = s == HIR_OK ? HIR_NCCL__CHECK(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
  }
  if (s == HIR_OK && (s = hir_nccl__setup_wait(c, stream, "hostir_nccl: the setup's exchange")) == HIR_OK &&
      (e = cudaMemcpy(all, buf, total, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: the setup's exchange on rank %d: %s", c->rank, cudaGetErrorString(e));
    s = HIR_ERR_BACKEND;
  }
  if (s == HIR_OK || s == HIR_ERR_BACKEND) { /* else a dead peer may still hold them */
    if (buf) cudaFree(buf);
    if (stream) cudaStreamDestroy(stream);
  }
  return s;
}

/* The world's setup exchange (hir_nccl__exchange_on through the world communicator). */
static hir_status hir_nccl__exchange(hir_comm *c, const void *mine, void *all, size_t bytes, int root, const int *to, int nto) {
  return hir_nccl__exchange_on(c, hir_nccl__of(c)->world, c->size, c->rank, mine, all, bytes, root, to, nto);
}

/* The id of a team's communicator: made by its first member, shared through
   the world (threads: by its exact list of devices), rank 0's store
   (processes: keyed by its size and two 64-bit hashes of the list), or,
   where there is no store (the caller's communicator or id), sent by the
   first member to the others through the world communicator. */
static hir_status hir_nccl__team_id_of(hir_nccl__rank *nc, const int *devices, int n, ncclUniqueId *id) {
  size_t bytes = (size_t)n * sizeof(int);
  char key[HIR_NCCL__KEY_BYTES];
  hir_status s;
  if (nc->shared) {
    hir_nccl_world *w = nc->shared;
    hir_nccl__team_id *t;
    pthread_mutex_lock(&w->mu);
    for (t = w->ids; t && !(t->n == n && memcmp(t->devices, devices, bytes) == 0); t = t->next) {}
    if (!t) {
      if ((t = (hir_nccl__team_id *)calloc(1, sizeof *t)) && (t->devices = (int *)malloc(bytes)) &&
          ncclGetUniqueId(&t->id) == ncclSuccess) {
        memcpy(t->devices, devices, bytes);
        t->n = n;
        t->next = w->ids;
        w->ids = t;
      } else if (t) {
        free(t->devices);
        free(t);
        t = NULL;
      }
    }
    if (t) memcpy(id, &t->id, sizeof *id);
    pthread_mutex_unlock(&w->mu);
    if (t) return HIR_OK;
    snprintf(nc->comm.error, sizeof nc->comm.error, "hostir_nccl: cannot make an id for a team of %d ranks", n);
    return HIR_ERR_COMM;
  }
  if (!nc->store.naddrs) {
    if (devices[0] == nc->comm.rank && (s = HIR_NCCL__CHECK(&nc->comm, ncclGetUniqueId(id))) != HIR_OK) return s;
    return hir_nccl__exchange(&nc->comm, id, id, sizeof *id, devices[0], devices, n);
  }
  snprintf(key, sizeof key, "team/%d/%016llx%016llx", n, (unsigned long long)hir_nccl__hash(devices, bytes, 1),
           (unsigned long long)hir_nccl__hash(devices, bytes, 2));
  if (devices[0] == nc->comm.rank) {
    if ((s = HIR_NCCL__CHECK(&nc->comm, ncclGetUniqueId(id))) != HIR_OK) return s;
    return hir_nccl__store_call(&nc->store, 'S', key, id, sizeof *id, hir_nccl__wall_ms() + nc->timeout_ms, nc->comm.error,
                                sizeof nc->comm.error);
  }
  return hir_nccl__store_call(&nc->store, 'G', key, id, sizeof *id, hir_nccl__wall_ms() + nc->timeout_ms, nc->comm.error,
                              sizeof nc->comm.error);
}

static void hir_nccl__free_team_ids(hir_nccl_world *w) {
  while (w->ids) {
    hir_nccl__team_id *t = w->ids;
    w->ids = t->next;
    free(t->devices);
    free(t);
  }
}

static hir_status hir_nccl__root(hir_comm *c, const hir_nccl__team *t, int root, int *index) {
  if ((*index = hir_team_index(t->devices, t->n, root)) >= 0) return HIR_OK;
  snprintf(c->error, sizeof c->error, "hostir_nccl: the root %d is not in the team", root);
  return HIR_ERR_INVALID;
}

/* A kernel collective that quit (its deadline, or stopped by an abort):
   the rank aborts, saying why; HIR_OK where none did. */
static hir_status hir_nccl__kc_failed(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  unsigned why;
  if (!nc->kc.on || !(why = __atomic_load_n(&hir_nccl__ce_head_of(&nc->ce)->kernel_error[nc->kc.me], __ATOMIC_ACQUIRE)))
    return HIR_OK;
  if (nc->aborted || hir_nccl__told(c)) return HIR_ERR_COMM; /* another rank's failure stopped it: its note says why */
  if (why == 1)
    snprintf(c->error, sizeof c->error, "a kernel collective on rank %d waited for its peers longer than %d ms: a peer is dead "
             "or stuck, so the communicator was aborted (raise the timeout of hir_nccl_comm_create if they are only slow)",
             c->rank, nc->timeout_ms);
  else
    snprintf(c->error, sizeof c->error, "a kernel collective on rank %d was stopped by a failure on this host", c->rank);
  hir_nccl__abort(c);
  return why == 1 ? HIR_ERR_TIMEOUT : HIR_ERR_COMM;
}

/* The size class of a collective of `bytes` (hir_nccl__kc_class_bytes). */
static int hir_nccl__kc_class(size_t bytes) {
  int z = 0;
  while (z < HIR_NCCL__KC_CLASSES - 1 && hir_nccl__kc_class_bytes[z] < bytes) z++;
  return z;
}

/* Which kernel a collective of `bytes` (all-reduce: its input; reduce-scatter:
   its input; all-gather: its output) takes: HIR_NCCL__AR_ONE or _TWO for an
   all-reduce (`kind` HIR_NCCL__AR_ONE), `kind` for the others; -1: NCCL's.
   *ctas: the CTAs it runs on. Every rank decides alike: the same sizes,
   paths, choice and cap. A team of the world's size takes the world's
   choice (measured, or saved with the plans); a smaller one its own. */
static hir_nccl__kc *hir_nccl__kc_of(hir_nccl__rank *nc, const hir_nccl__team *t) {
  return !nc->kc.on ? NULL : t == &nc->world_team ? &nc->kc : t->kc;
}
static int hir_nccl__kc_pick(hir_nccl__rank *nc, const hir_nccl__team *t, int kind, hir_dtype dt, size_t bytes, int *ctas) {
  const hir_nccl__kc *kc = hir_nccl__kc_of(nc, t), *choice = kc && kc->n == nc->kc.n ? &nc->kc : kc;
  int z = hir_nccl__kc_class(bytes), k, cap = nc->kc.cap;
  if (!kc || nc->path == HIR_NCCL_PATH_NCCL || !bytes) return -1;
  if (kind != HIR_NCCL__AG && dt != HIR_F32 && dt != HIR_F16 && dt != HIR_BF16) return -1;
  if (nc->path == HIR_NCCL_PATH_AUTO) k = choice->use[kind][z];
  else k = kind != HIR_NCCL__AR_ONE ? kind : nc->path == HIR_NCCL_PATH_ONE_SHOT ? HIR_NCCL__AR_ONE : HIR_NCCL__AR_TWO;
  if (k >= 0) *ctas = cap && (nc->path != HIR_NCCL_PATH_AUTO || cap < choice->ctas[k][z]) ? cap : choice->ctas[k][z];
  return k;
}

/* A kernel collective's launch: a failure aborts the rank. */
static hir_status hir_nccl__kc_done(hir_comm *c, hir_status s, const char *what) {
  char detail[300];
  if (s == HIR_OK) return HIR_OK;
  snprintf(detail, sizeof detail, "%.299s", c->error);
  snprintf(c->error, sizeof c->error, "%s on rank %d: %s", what, c->rank, detail);
  hir_nccl__abort(c);
  return s;
}

/* hir_comm.collective_path: what hir_nccl__kc_pick decides, in words, for the plan (the others: not said); a
   kernel reads the caller's input where it lies (no staging copy) and writes the output through its workspace. */
static const char *hir_nccl__collective_path(hir_comm *c, void *team, hir_collective type, size_t bytes, hir_dtype dt) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  int kind = type == HIR_COLL_ALLREDUCE ? HIR_NCCL__AR_ONE : type == HIR_COLL_REDUCESCATTER ? HIR_NCCL__RS
             : type == HIR_COLL_ALLGATHER ? HIR_NCCL__AG : -1;
  int ctas = 0, k = kind < 0 ? -1 : hir_nccl__kc_pick(nc, (const hir_nccl__team *)team, kind, dt, bytes, &ctas);
  if (kind < 0) return NULL;
  if (k < 0) return "NCCL";
  snprintf(nc->path_words, sizeof nc->path_words, "hostir's %skernel (%d CTAs, the input read in place)",
           k == HIR_NCCL__AR_ONE ? "one-shot " : k == HIR_NCCL__AR_TWO ? "two-shot " : "", ctas);
  return nc->path_words;
}

/* The choice as a plans file keeps it (hir_comm.collective_choice): "kc1 N
   | ar W... | rs W... | ag W...", the world's size, then a word for each
   size class of hir_nccl__kc_class_bytes: "nccl", or the kernel and its
   CTAs ("one/32", "two/128" for the all-reduce, "k/32" for the others). */
static const char *const hir_nccl__choice_rows[3] = {"ar", "rs", "ag"};
static const int hir_nccl__choice_kinds[3] = {HIR_NCCL__AR_ONE, HIR_NCCL__RS, HIR_NCCL__AG};
static size_t hir_nccl__choice_text(hir_comm *c, char *buf, size_t cap) {
  const hir_nccl__kc *kc = &hir_nccl__of(c)->kc;
  size_t at = 0;
  int r, z;
#define HIR_NCCL__ADD(...) (at += (size_t)snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, __VA_ARGS__))
  if (!kc->on) return 0;
  HIR_NCCL__ADD("kc1 %d", kc->n);
  for (r = 0; r < 3; r++) {
    HIR_NCCL__ADD(" | %s", hir_nccl__choice_rows[r]);
    for (z = 0; z < HIR_NCCL__KC_CLASSES; z++) {
      int k = kc->use[hir_nccl__choice_kinds[r]][z];
      if (k < 0) HIR_NCCL__ADD(" nccl");
      else HIR_NCCL__ADD(" %s/%d", k == HIR_NCCL__AR_ONE ? "one" : k == HIR_NCCL__AR_TWO ? "two" : "k", kc->ctas[k][z]);
    }
  }
#undef HIR_NCCL__ADD
  return at;
}

/* hir_comm.set_collective_choice: that text taken back, whole or not at all. */
static hir_status hir_nccl__set_choice(hir_comm *c, const char *text) {
  hir_nccl__kc *kc = &hir_nccl__of(c)->kc;
  signed char use[3][HIR_NCCL__KC_CLASSES];
  int ctas[3][HIR_NCCL__KC_CLASSES], r, z, n, used, kernels = 0;
  const char *p = text;
  char word[16];
#define HIR_NCCL__REFUSE(...) return snprintf(c->error, sizeof c->error, __VA_ARGS__), HIR_ERR_INVALID
  if (!text || sscanf(p, "kc1 %d%n", &n, &used) != 1) HIR_NCCL__REFUSE("the collective choice '%.40s' is not hostir_nccl's "
                                                                     "(it starts 'kc1 <ranks>')", text ? text : "(null)");
  if (n != kc->n && kc->on) HIR_NCCL__REFUSE("the collective choice was made for %d ranks; this world has %d: tune again", n, kc->n);
  for (p += used, r = 0; r < 3; r++) {
    if (strncmp(p, " | ", 3) || strncmp(p + 3, hir_nccl__choice_rows[r], 2) || p[5] != ' ')
      HIR_NCCL__REFUSE("the collective choice lacks its '| %s' row", hir_nccl__choice_rows[r]);
    for (p += 5, z = 0; z < HIR_NCCL__KC_CLASSES; z++) {
      int len = 0, k;
      unsigned v = 0;
      if (*p != ' ' || sscanf(p + 1, "%15[a-z0-9/]%n", word, &len) != 1 || (p[1 + len] && p[1 + len] != ' '))
        HIR_NCCL__REFUSE("the collective choice's '%s' row has fewer than %d words", hir_nccl__choice_rows[r], HIR_NCCL__KC_CLASSES);
      p += 1 + len;
      if (!strcmp(word, "nccl")) {
        use[r][z] = -1, ctas[r][z] = 0;
        continue;
      }
      k = !strncmp(word, "one/", 4) && !r ? HIR_NCCL__AR_ONE : !strncmp(word, "two/", 4) && !r ? HIR_NCCL__AR_TWO
          : !strncmp(word, "k/", 2) && r ? hir_nccl__choice_kinds[r] : -1;
      if (k < 0 || sscanf(strchr(word, '/') + 1, "%u%n", &v, &len) != 1 || strchr(word, '/')[1 + len] || v < 1 ||
          v > HIR_NCCL__KC_CTAS)
        HIR_NCCL__REFUSE("the collective choice's word '%s' (row %s) names no path: 'nccl', %s and 1 to %d CTAs", word,
                         hir_nccl__choice_rows[r], r ? "'k/N'" : "'one/N' or 'two/N'", HIR_NCCL__KC_CTAS);
      use[r][z] = (signed char)k, ctas[r][z] = (int)v, kernels++;
    }
  }
  if (*p) HIR_NCCL__REFUSE("the collective choice has text after its rows ('%.20s')", p);
  if (kernels && !kc->on)
    HIR_NCCL__REFUSE("the collective choice takes hostir's kernels, which this communicator does not have (%.200s)",
                     hir_nccl__of(c)->kc_why);
#undef HIR_NCCL__REFUSE
  for (r = 0; r < 3; r++)
    for (z = 0; z < HIR_NCCL__KC_CLASSES; z++) {
      kc->use[hir_nccl__choice_kinds[r]][z] = use[r][z];
      if (use[r][z] >= 0) kc->ctas[use[r][z]][z] = (unsigned char)ctas[r][z];
    }
  kc->measured = 2;
  return HIR_OK;
}

static unsigned long long hir_nccl__kc_deadline_ns(const hir_nccl__rank *nc) { return (unsigned long long)nc->timeout_ms * 1000000ull; }

/* The choice for collective `kind` (HIR_NCCL__AR_ONE: the all-reduce) in
   words, "all-reduce: one shot on 32 CTAs to 512 KiB, ..., NCCL above";
   what snprintf returns. */
static int hir_nccl__kc_say(const hir_nccl__kc *kc, int kind, char *buf, size_t cap) {
  static const char *const names[HIR_NCCL__KC_KINDS] = {"all-reduce", "", "; reduce-scatter", "; all-gather"};
  int z, at = snprintf(buf, cap, "%s:", names[kind]);
  for (z = 0; z < HIR_NCCL__KC_CLASSES && at < (int)cap; z++) {
    int k = kc->use[kind][z], last = z == HIR_NCCL__KC_CLASSES - 1;
    size_t b = hir_nccl__kc_class_bytes[z];
    if (!last && kc->use[kind][z + 1] == k && (k < 0 || kc->ctas[k][z + 1] == kc->ctas[k][z])) continue; /* the run goes on */
    if (k < 0) at += snprintf(buf + at, cap - (size_t)at, " NCCL");
    else at += snprintf(buf + at, cap - (size_t)at, " %s on %d CTAs", k == HIR_NCCL__AR_ONE ? "one shot" : k == HIR_NCCL__AR_TWO
                        ? "two shots" : "kernel", kc->ctas[k][z]);
    if (at < (int)cap)
      at += last ? snprintf(buf + at, cap - (size_t)at, " above")
                 : snprintf(buf + at, cap - (size_t)at, " to %zu %s,", b >> (b >= (1u << 20) ? 20 : 10), b >= (1u << 20) ? "MiB" : "KiB");
  }
  return at;
}

/* The choice, measured at creation, for this machine and team (the world,
   when the communicator is made; a team smaller than the world, when it is
   made): every path of every collective at each size class, timed on this
   rank (bf16 calls captured in a CUDA graph and replayed between two
   events, so the device's time is measured, not the host's launches; eager
   calls where capture fails; the forms in turns, each its fastest of
   HIR_NCCL__KC_ROUNDS rounds), the times summed over the team's ranks (the
   setup's exchange: every rank decides from the same numbers), then per
   class the fastest: a kernel only where it beats NCCL's by 2%, on all of
   HIR_NCCL__KC_CTAS CTAs only where they beat HIR_NCCL__KC_FEW by 5% (fewer
   leave a GEMM beside more SMs). It takes tens of milliseconds and 128 MiB
   of the GPU's memory for that long; where a rank cannot spare it, or has
   HOSTIR_MEASURE_COLLECTIVES=0 (a faster start, the same paths from run to
   run), every rank keeps the fixed rule of hir_nccl__kc_words (so does a
   failure, which also fails the communicator's or the team's creation, and
   so do choices that differ, checked before any is kept). The caller's
   path and CTA cap come back after. */
enum { HIR_NCCL__KC_WARM = 2, HIR_NCCL__KC_TRIES = 6, HIR_NCCL__KC_ROUNDS = 3, HIR_NCCL__KC_FORMS = 5 };
static hir_status hir_nccl__kc_calls(hir_comm *c, hir_nccl__team *t, int kind, size_t bytes, void *in, void *out, cudaStream_t st,
                                     int calls) {
  hir_status s = HIR_OK;
  int i;
  for (i = 0; i < calls && s == HIR_OK; i++)
    s = kind == HIR_NCCL__AR_ONE ? c->allreduce(c, t, in, out, bytes / 2, HIR_BF16, st)
        : kind == HIR_NCCL__RS   ? c->reduce_scatter(c, t, in, out, bytes / 2 / (size_t)t->n, HIR_BF16, st)
                                 : c->allgather(c, t, in, out, bytes / (size_t)t->n, st);
  return s;
}
/* The form the communicator's path now takes, warmed up and captured in
   *exec (NULL where capture failed: the form is then timed eagerly). */
static hir_status hir_nccl__kc_capture(hir_comm *c, hir_nccl__team *t, int kind, size_t bytes, void *in, void *out, cudaStream_t st,
                                       cudaGraphExec_t *exec) {
  cudaGraph_t g = NULL;
  hir_status s = hir_nccl__kc_calls(c, t, kind, bytes, in, out, st, HIR_NCCL__KC_WARM), captured = HIR_ERR_BACKEND;
  *exec = NULL;
  if (s == HIR_OK && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    captured = hir_nccl__kc_calls(c, t, kind, bytes, in, out, st, HIR_NCCL__KC_TRIES);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || captured != HIR_OK || cudaGraphInstantiate(exec, g, 0) != cudaSuccess)
      *exec = NULL;
    if (g) cudaGraphDestroy(g);
  }
  cudaGetLastError();
  if (s == HIR_OK && captured != HIR_OK) s = hir_nccl__kc_failed(c); /* a capture that failed only as a capture: eager */
  if (s == HIR_OK && *exec && cudaGraphLaunch(*exec, st) != cudaSuccess) cudaGetLastError(), cudaGraphExecDestroy(*exec), *exec = NULL;
  if (s == HIR_OK && (s = hir_nccl__setup_wait(c, st, "measuring the collectives")) == HIR_OK) s = hir_nccl__kc_failed(c);
  return s;
}
static hir_status hir_nccl__kc_time(hir_comm *c, hir_nccl__team *t, int kind, size_t bytes, void *in, void *out, cudaStream_t st,
                                    cudaGraphExec_t exec, cudaEvent_t *e, double *us) {
  hir_status s = HIR_OK;
  float ms = 0;
  cudaEventRecord(e[0], st);
  if (!exec) s = hir_nccl__kc_calls(c, t, kind, bytes, in, out, st, HIR_NCCL__KC_TRIES);
  else if (cudaGraphLaunch(exec, st) != cudaSuccess) {
    snprintf(c->error, sizeof c->error, "measuring the collectives on rank %d: %s", c->rank, cudaGetErrorString(cudaGetLastError()));
    s = HIR_ERR_BACKEND;
  }
  cudaEventRecord(e[1], st);
  if (s == HIR_OK && (s = hir_nccl__setup_wait(c, st, "measuring the collectives")) == HIR_OK) s = hir_nccl__kc_failed(c);
  if (s == HIR_OK && cudaEventElapsedTime(&ms, e[0], e[1]) != cudaSuccess) ms = 0, cudaGetLastError();
  *us = ms * 1e3 / HIR_NCCL__KC_TRIES;
  return s;
}
/* vals[0..count) summed over the team's ranks, in place: the setup's
   exchange, then sums in rank order, so every rank gets the same bits. */
static hir_status hir_nccl__kc_sum(hir_comm *c, hir_nccl__team *t, double *vals, size_t count) {
  double *all = (double *)malloc(count * (size_t)t->n * sizeof *all);
  size_t i;
  int r;
  hir_status s;
  if (!all) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM; /* the other ranks' exchange ends at their deadline */
  }
  if ((s = hir_nccl__exchange_on(c, t->comm, t->n, t->me, vals, all, count * sizeof *vals, -1, NULL, 0)) == HIR_OK)
    for (i = 0; i < count; i++)
      for (vals[i] = 0, r = 0; r < t->n; r++) vals[i] += all[(size_t)r * count + i];
  free(all);
  return s;
}
static hir_status hir_nccl__kc_measure(hir_comm *c, hir_nccl__team *t) {
  static const int ctas_tried[2] = {HIR_NCCL__KC_FEW, HIR_NCCL__KC_CTAS};
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__kc *kc = hir_nccl__kc_of(nc, t);
  hir_nccl_path path = nc->path; /* the forms are timed on forced paths and CTAs; the caller's come back after */
  int cap = nc->kc.cap;
  size_t top = hir_nccl__kc_class_bytes[HIR_NCCL__KC_CLASSES - 1];
  /* [collective: AR_ONE (all-reduce), RS, AG][class][NCCL, kernel on few, on many, (all-reduce) two shots on few, on many] */
  double us[3][HIR_NCCL__KC_CLASSES][HIR_NCCL__KC_FORMS], every, us_now;
  signed char use[HIR_NCCL__KC_KINDS][HIR_NCCL__KC_CLASSES];
  unsigned char ctas[HIR_NCCL__KC_KINDS][HIR_NCCL__KC_CLASSES];
  void *in = NULL, *out = NULL;
  cudaStream_t st = NULL;
  cudaEvent_t e[2] = {NULL, NULL};
  hir_status s = HIR_OK;
  int coll, z, f, round;
  memset(us, 0, sizeof us);
  memcpy(use, kc->use, sizeof use);
  memcpy(ctas, kc->ctas, sizeof ctas);
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(c->error, sizeof c->error, "measuring the collectives on rank %d: %s", c->rank, cudaGetErrorString(cudaGetLastError()));
    s = HIR_ERR_BACKEND; /* the other ranks' first sum ends at their deadline */
  }
  every = s == HIR_OK && hir_nccl__switch("HOSTIR_MEASURE_COLLECTIVES") && cudaMalloc(&in, top) == cudaSuccess &&
          cudaMalloc(&out, top) == cudaSuccess &&
          cudaMemsetAsync(in, 0x3c, top, st) == cudaSuccess && /* 0x3c3c: bf16 0.0115 */
          cudaEventCreate(&e[0]) == cudaSuccess && cudaEventCreate(&e[1]) == cudaSuccess;
  cudaGetLastError();
  if (s == HIR_OK && (s = hir_nccl__kc_sum(c, t, &every, 1)) == HIR_OK && every == (double)t->n) { /* every rank able */
    for (coll = 0; coll < 3 && s == HIR_OK; coll++)
      for (z = 0; z < HIR_NCCL__KC_CLASSES && s == HIR_OK; z++) {
        size_t bytes = hir_nccl__kc_class_bytes[z];
        int kind = coll == 0 ? HIR_NCCL__AR_ONE : coll == 1 ? HIR_NCCL__RS : HIR_NCCL__AG, forms = coll ? 3 : HIR_NCCL__KC_FORMS;
        cudaGraphExec_t exec[HIR_NCCL__KC_FORMS] = {NULL, NULL, NULL, NULL, NULL};
        for (round = -1; round < HIR_NCCL__KC_ROUNDS && s == HIR_OK; round++) /* each form captured, then timed in turns */
          for (f = 0; f < forms && s == HIR_OK; f++) {
            us_now = 0;
            if (coll == 0 && (f == 1 || f == 2) && bytes > ((size_t)8 << 20)) continue; /* one shot past 8 MiB: never */
            nc->path = f == 0 ? HIR_NCCL_PATH_NCCL : f <= 2 && coll == 0 ? HIR_NCCL_PATH_ONE_SHOT : HIR_NCCL_PATH_TWO_SHOT;
            nc->kc.cap = f == 0 ? 0 : ctas_tried[(f - 1) % 2]; /* the world's cap bounds every team's calls */
            if (round < 0) {
              s = hir_nccl__kc_capture(c, t, kind, bytes, in, out, st, &exec[f]);
              continue;
            }
            s = hir_nccl__kc_time(c, t, kind, bytes, in, out, st, exec[f], e, &us_now);
            if (!round || us_now < us[coll][z][f]) us[coll][z][f] = us_now;
          }
        for (f = 0; f < forms; f++)
          if (exec[f]) cudaGraphExecDestroy(exec[f]);
      }
    nc->path = path;
    nc->kc.cap = cap;
    if (s == HIR_OK) s = hir_nccl__kc_sum(c, t, &us[0][0][0], sizeof us / sizeof(double));
    for (coll = 0; coll < 3 && s == HIR_OK; coll++)
      for (z = 0; z < HIR_NCCL__KC_CLASSES; z++) {
        double *t = us[coll][z], best = t[0] * 0.98;
        int kinds[2] = {coll == 0 ? HIR_NCCL__AR_ONE : coll == 1 ? HIR_NCCL__RS : HIR_NCCL__AG, HIR_NCCL__AR_TWO}, j;
        use[kinds[0]][z] = -1;
        for (j = 0; j < (coll ? 1 : 2); j++) {
          double few = t[1 + 2 * j], many = t[2 + 2 * j];
          int on_many = many > 0 && (few <= 0 || many < 0.95 * few) && /* below this both launch the same grid */
                        hir_nccl__kc_class_bytes[z] > (size_t)HIR_NCCL__KC_FEW * HIR_NCCL__KC_THREADS * 16;
          ctas[kinds[j]][z] = (unsigned char)ctas_tried[on_many];
          if ((few > 0 || many > 0) && (on_many ? many : few) < best) best = on_many ? many : few, use[kinds[0]][z] = (signed char)kinds[j];
        }
      }
    if (s == HIR_OK) { /* the same sums give every rank the same choice; a choice that differs anyway would hang a
                          collective or mix its data, so the ranks check, and keep the fixed rule unless all agree */
      double mine = (double)(hir_nccl__hash(use, sizeof use, hir_nccl__hash(ctas, sizeof ctas, 0)) & 0xffffffffu), all = mine;
      if ((s = hir_nccl__kc_sum(c, t, &all, 1)) == HIR_OK) {
        every = all == mine * t->n;
        if ((s = hir_nccl__kc_sum(c, t, &every, 1)) == HIR_OK && every == (double)t->n) {
          memcpy(kc->use, use, sizeof use);
          memcpy(kc->ctas, ctas, sizeof ctas);
          kc->measured = 1;
        }
      }
    }
  }
  nc->path = path;
  nc->kc.cap = cap;
  if (st) cudaStreamDestroy(st);
  if (e[0]) cudaEventDestroy(e[0]);
  if (e[1]) cudaEventDestroy(e[1]);
  cudaFree(in), cudaFree(out);
  cudaGetLastError();
  return s;
}

/* A team other than the world, where the world has kernel collectives
   (every rank on this host): a workspace of its own on the world's
   kernels, mapped by every member (threads: its address; processes: CUDA
   IPC), so that its calls count their own sequence and never meet the
   world's or another team's, and, for a team smaller than the world, its
   own choice of path measured (hir_nccl__kc_measure). Every member agrees,
   or the team keeps NCCL's collectives; an error only where an exchange
   or the measurement failed. */
static hir_status hir_nccl__team_kc(hir_comm *c, hir_nccl__team *t) {
  typedef struct { cudaIpcMemHandle_t handle; unsigned long long at; int ok; } hir_nccl__team_hello;
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team_hello me, *all = NULL;
  hir_nccl__kc *kc = NULL;
  char why[200];
  hir_status s;
  int i, every = 1, round;
  if (!nc->kc.on || t->n < 2) return HIR_OK;
  memset(&me, 0, sizeof me);
  if ((kc = (hir_nccl__kc *)calloc(1, sizeof *kc)) && hir_nccl__kc_borrow(kc, &nc->kc, why, sizeof why)) {
    me.at = (unsigned long long)(uintptr_t)kc->mine;
    me.ok = nc->shared || cudaIpcGetMemHandle(&me.handle, kc->mine) == cudaSuccess || (cudaGetLastError(), 0);
  }
  if (!(all = (hir_nccl__team_hello *)calloc((size_t)t->n, sizeof *all))) {
    if (kc) hir_nccl__kc_free(kc);
    free(kc);
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  for (round = 0, s = HIR_OK; round < 2 && s == HIR_OK; round++) { /* the handles, then whether every member mapped them */
    if ((s = hir_nccl__exchange_on(c, t->comm, t->n, t->me, &me, all, sizeof me, -1, NULL, 0)) != HIR_OK) break;
    for (i = 0; i < t->n; i++) every &= all[i].ok;
    for (i = 0; !round && every && i < t->n; i++) {
      void *base = NULL;
      if (i == t->me) kc->ws[i] = kc->mine;
      else if (nc->shared) kc->ws[i] = (unsigned char *)(uintptr_t)all[i].at;
      else if (cudaIpcOpenMemHandle(&base, all[i].handle, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess)
        kc->ws[i] = (unsigned char *)base, kc->opened[i] = 1;
      else every = 0, cudaGetLastError();
    }
    me.ok = every;
  }
  free(all);
  if (s != HIR_OK || !every) {
    if (kc) hir_nccl__kc_free(kc);
    free(kc);
    return s;
  }
  kc->n = t->n;
  kc->me = t->me;
  hir_nccl__kc_words(kc, &nc->ce);
  kc->on = 1;
  t->kc = kc;
  /* a team of the world's size takes the world's choice; a smaller one measures its own, as the world does */
  return t->n == c->size ? HIR_OK : hir_nccl__kc_measure(c, t);
}

static hir_status hir_nccl__make_team(hir_comm *c, const int *devices, int n, void **out) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t;
  ncclUniqueId id;
  hir_status s;
  int i, me = -1, whole = n == c->size;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
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
  if ((s = hir_nccl__team_id_of(nc, devices, n, &id)) != HIR_OK) return s;
  if (!(t = (hir_nccl__team *)calloc(1, sizeof *t)) || !(t->devices = (int *)malloc((size_t)n * sizeof(int)))) {
    free(t);
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  memcpy(t->devices, devices, (size_t)n * sizeof(int));
  t->n = n;
  t->me = me;
  cudaSetDevice(nc->device);
  if ((s = hir_nccl__init_comm(c, &t->comm, n, id, me)) == HIR_OK && (s = hir_nccl__twin(c, t->comm, me, &t->fast)) != HIR_OK)
    ncclCommAbort(t->comm); /* made, but its twin failed */
  if (s != HIR_OK) {
    free(t->devices);
    free(t);
    return s;
  }
  t->next = nc->teams;
  nc->teams = t;
  if ((s = hir_nccl__team_kc(c, t)) != HIR_OK) return s; /* the team stays listed: the release frees it */
  *out = t;
  return HIR_OK;
}

static hir_status hir_nccl__allgather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_status s;
  int ctas;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__kc_failed(c)) != HIR_OK) return s;
  if (hir_nccl__kc_pick(nc, t, HIR_NCCL__AG, HIR_F32, bytes * (size_t)t->n, &ctas) >= 0)
    return hir_nccl__kc_done(c, hir_nccl__kc_allgather(hir_nccl__kc_of(nc, t), ctas, send, recv, bytes, hir_nccl__kc_deadline_ns(nc),
                                                       (cudaStream_t)stream, c->error, sizeof c->error), "an all-gather kernel");
  return HIR_NCCL__DATA(c, ncclAllGather(send, recv, bytes, ncclUint8, hir_nccl__data(t), (cudaStream_t)stream));
}

static hir_status hir_nccl__allreduce(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt,
                                      void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_status s;
  int kind, ctas;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__kc_failed(c)) != HIR_OK) return s;
  if ((kind = hir_nccl__kc_pick(nc, t, HIR_NCCL__AR_ONE, dt, count * hir_dtype_size(dt), &ctas)) >= 0)
    return hir_nccl__kc_done(c, hir_nccl__kc_allreduce(hir_nccl__kc_of(nc, t), kind == HIR_NCCL__AR_TWO, ctas, send, recv, count, dt,
                                                       hir_nccl__kc_deadline_ns(nc), (cudaStream_t)stream, c->error,
                                                       sizeof c->error), "an all-reduce kernel");
  return HIR_NCCL__DATA(c, ncclAllReduce(send, recv, count, hir_nccl__type(dt), ncclSum, hir_nccl__data(t), (cudaStream_t)stream));
}

/* hir_comm.allreduce_rms_norm: on the all-reduce's kernel where it takes
   one (the same choice, so every rank decides alike) and each row is whole
   16-byte vectors that fit a slot twice over; else HIR_ERR_UNSUPPORTED. */
static hir_status hir_nccl__allreduce_rms_norm(hir_comm *c, void *team, const void *send, const void *residual, const void *weight,
                                               void *h, void *out, size_t rows, size_t cols, hir_dtype dt, double eps, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_nccl__rank *nc = hir_nccl__of(c);
  size_t row = cols * hir_dtype_size(dt);
  hir_status s;
  int kind, ctas;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__kc_failed(c)) != HIR_OK) return s;
  if (!rows || !row || row % 16 || (kind = hir_nccl__kc_pick(nc, t, HIR_NCCL__AR_ONE, dt, rows * row, &ctas)) < 0 ||
      row > hir_nccl__kc_slot(hir_nccl__kc_of(nc, t)->n) / 2)
    return HIR_ERR_UNSUPPORTED;
  return hir_nccl__kc_done(c, hir_nccl__kc_allreduce_rms(hir_nccl__kc_of(nc, t), kind == HIR_NCCL__AR_TWO, ctas, send, residual, weight, h,
                                                         out, rows, cols, dt, eps, hir_nccl__kc_deadline_ns(nc), (cudaStream_t)stream,
                                                         c->error, sizeof c->error), "an all-reduce kernel with its rms_norm");
}

static hir_status hir_nccl__reduce_scatter(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt,
                                           void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_status s;
  int ctas;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__kc_failed(c)) != HIR_OK) return s;
  if (hir_nccl__kc_pick(nc, t, HIR_NCCL__RS, dt, count * hir_dtype_size(dt) * (size_t)t->n, &ctas) >= 0)
    return hir_nccl__kc_done(c, hir_nccl__kc_reduce_scatter(hir_nccl__kc_of(nc, t), ctas, send, recv, count, dt, hir_nccl__kc_deadline_ns(nc),
                                                            (cudaStream_t)stream, c->error, sizeof c->error),
                             "a reduce-scatter kernel");
  return HIR_NCCL__DATA(c, ncclReduceScatter(send, recv, count, hir_nccl__type(dt), ncclSum, hir_nccl__data(t), (cudaStream_t)stream));
}

static hir_status hir_nccl__reduce(hir_comm *c, void *team, const void *send, void *recv, size_t count, hir_dtype dt, int root,
                                   void *stream) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__team *t = (hir_nccl__team *)team;
  size_t bytes = count * hir_dtype_size(dt);
  hir_status s;
  int r;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (!send) { /* a root that holds no data contributes zeros */
    if (nc->zeros_cap < bytes) {
      size_t cap = bytes > 2 * nc->zeros_cap ? bytes : 2 * nc->zeros_cap;
      void *p;
      int i;
      if (cudaMalloc(&p, cap) != cudaSuccess) {
        cudaGetLastError();
        snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMalloc of %zu bytes for a reduce failed", cap);
        return HIR_ERR_NOMEM;
      }
      if (nc->nzeros_old == 16) { /* growth doubles: not seen in practice */
        cudaDeviceSynchronize();
        for (i = 0; i < 16; i++) cudaFree(nc->zeros_old[i]);
        nc->nzeros_old = 0;
      }
      if (nc->zeros) nc->zeros_old[nc->nzeros_old++] = nc->zeros;
      nc->zeros = p;
      nc->zeros_cap = cap;
    }
    if (cudaMemsetAsync(nc->zeros, 0, bytes, (cudaStream_t)stream) != cudaSuccess) {
      snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemsetAsync failed");
      return HIR_ERR_BACKEND;
    }
    send = nc->zeros;
  }
  return HIR_NCCL__DATA(c, ncclReduce(send, recv, count, hir_nccl__type(dt), ncclSum, r, hir_nccl__data(t), (cudaStream_t)stream));
}

static hir_status hir_nccl__broadcast(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  hir_status s;
  int r;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (!recv) recv = (void *)send; /* the root need not keep a copy */
  return HIR_NCCL__DATA(c, ncclBroadcast(send, recv, bytes, ncclUint8, r, hir_nccl__data(t), (cudaStream_t)stream));
}

/* Gather and scatter as grouped send/recv in the team's communicator. */
static hir_status hir_nccl__gather(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  cudaStream_t st = (cudaStream_t)stream;
  hir_status s;
  int r, i;
  size_t at = 0;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (t->me != r) return HIR_NCCL__DATA(c, ncclSend(send, bytes, ncclUint8, r, hir_nccl__data(t), st));
  if ((s = HIR_NCCL__CHECK(c, ncclGroupStart())) != HIR_OK) return s;
  for (i = 0; i < t->n && s == HIR_OK; i++) {
    if (i == r && !send) continue; /* the root holds no chunk */
    if (i == r)
      s = cudaMemcpyAsync((char *)recv + at, send, bytes, cudaMemcpyDeviceToDevice, st) == cudaSuccess ? HIR_OK : HIR_ERR_BACKEND;
    else
      s = HIR_NCCL__DATA(c, ncclRecv((char *)recv + at, bytes, ncclUint8, i, hir_nccl__data(t), st));
    at += bytes;
  }
  if (s == HIR_ERR_BACKEND) snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemcpyAsync in a gather failed");
  return s == HIR_OK ? HIR_NCCL__DATA(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

static hir_status hir_nccl__scatter(hir_comm *c, void *team, const void *send, void *recv, size_t bytes, int root, void *stream) {
  hir_nccl__team *t = (hir_nccl__team *)team;
  cudaStream_t st = (cudaStream_t)stream;
  hir_status s;
  int r, i;
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if ((s = hir_nccl__root(c, t, root, &r)) != HIR_OK) return s;
  if (t->me != r) return HIR_NCCL__DATA(c, ncclRecv(recv, bytes, ncclUint8, r, hir_nccl__data(t), st));
  if ((s = HIR_NCCL__CHECK(c, ncclGroupStart())) != HIR_OK) return s;
  for (i = 0; i < t->n && s == HIR_OK; i++) {
    const char *chunk = (const char *)send + (size_t)i * bytes;
    if (i == r)
      s = cudaMemcpyAsync(recv, chunk, bytes, cudaMemcpyDeviceToDevice, st) == cudaSuccess ? HIR_OK : HIR_ERR_BACKEND;
    else
      s = HIR_NCCL__DATA(c, ncclSend(chunk, bytes, ncclUint8, i, hir_nccl__data(t), st));
  }
  if (s == HIR_ERR_BACKEND) snprintf(c->error, sizeof c->error, "hostir_nccl: cudaMemcpyAsync in a scatter failed");
  return s == HIR_OK ? HIR_NCCL__DATA(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

/* ---- copy-engine send/recv (nccl_peer's block) ---- */

static int hir_nccl__ce_peer(hir_comm *c, int peer) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  return nc->ce_on && peer >= 0 && peer < c->size && peer != c->rank && nc->ce.local[peer] >= 0;
}

static hir_status hir_nccl__ce_fail(hir_comm *c, hir_status s, const char *what, const char *detail) {
  snprintf(c->error, sizeof c->error, "hostir_nccl (copy engine): %s on rank %d: %s", what, c->rank, detail);
  return s;
}

/* Waits until a peer's host moves *counter to `want`: HIR_ERR_TIMEOUT past
   the deadline, HIR_ERR_COMM as soon as a rank's note or a gone peer says
   it never will. Spins briefly first: the peer is usually microseconds
   behind; notes are looked for once it is not (rank 0's store is a round
   trip away). */
static hir_status hir_nccl__ce_wait(hir_comm *c, const unsigned long long *counter, unsigned long long want, int peer,
                                    const char *what) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  double now = hir_nccl__wall_ms(), spin_until = now + 0.2, look_after = now + 2, deadline = now + nc->timeout_ms;
  struct timespec nap = {0, 20000}; /* 20 us */
  while (hir_nccl__counter(counter) < want) {
    now = hir_nccl__wall_ms();
    if (now >= look_after && hir_nccl__told(c)) return HIR_ERR_COMM;
    if (now > deadline) {
      snprintf(c->error, sizeof c->error,
               "hostir_nccl (copy engine): %s on rank %d: rank %d did not come within %d ms (it is dead or stuck, or its "
               "sends and receives do not match this rank's)", what, c->rank, peer, nc->timeout_ms);
      return HIR_ERR_TIMEOUT;
    }
    if (now >= spin_until) nanosleep(&nap, NULL);
  }
  return HIR_OK;
}

static hir_status hir_nccl__ce_cuda(hir_comm *c, const char *what, cudaError_t e) {
  return e == cudaSuccess ? HIR_OK : hir_nccl__ce_fail(c, HIR_ERR_BACKEND, what, cudaGetErrorString(e));
}
static hir_status hir_nccl__ce_cu(hir_comm *c, const char *what, CUresult r) {
  char detail[48];
  if (r == CUDA_SUCCESS) return HIR_OK;
  snprintf(detail, sizeof detail, "CUDA driver error %d", (int)r);
  return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, what, detail);
}

/* `stream` waits until a pad word reaches `value`. Captured, a graph word is a
   flag: the wait is for 1 and takes the flag back to 0 for the next replay in
   the same memory-operation node, one node fewer on a replay's path. */
static CUresult hir_nccl__ce_wait_word(const hir_nccl__ce *ce, void *stream, CUdeviceptr word, cuuint32_t value,
                                       int captured) {
  CUstreamBatchMemOpParams op[2];
  if (!captured) return ce->wait_value((CUstream)stream, word, value, CU_STREAM_WAIT_VALUE_GEQ);
  memset(op, 0, sizeof op);
  op[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op[0].waitValue.address = word;
  op[0].waitValue.value = 1;
  op[0].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  op[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op[1].writeValue.address = word;
  op[1].writeValue.value = 0;
  op[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return ce->batch_memops((CUstream)stream, 2, op, 0);
}

/* Whether `stream`'s work is being captured into a CUDA graph (*graph). */
static int hir_nccl__capturing(void *stream, cudaGraph_t *graph) { return hir_nccl__capture_of(stream, graph) != 0; }

typedef struct hir_nccl__ce_held {   /* what a graph keeps of the receiver's: a graph word pair, an export */
  hir_nccl__ce_graphs *graphs;
  int word, export_index;            /* word: sender index * GRAPH_WORDS + k */
} hir_nccl__ce_held;

static void CUDART_CB hir_nccl__ce_graph_gone(void *p) { /* on CUDA's thread: no CUDA calls */
  hir_nccl__ce_held *h = (hir_nccl__ce_held *)p;
  __atomic_store_n(&h->graphs->used[h->word], (unsigned char)0, __ATOMIC_RELEASE);
  if (h->export_index >= 0) __atomic_sub_fetch(&h->graphs->export_graphs[h->export_index], 1, __ATOMIC_ACQ_REL);
  hir_nccl__ce_graphs_unref(h->graphs);
  free(h);
}

/* A captured receive's graph words: a free pair from `peer`, zeroed, kept
   (with the receive's export) until `graph` is destroyed. */
static hir_status hir_nccl__ce_graph_words(hir_comm *c, int peer, cudaGraph_t graph, hir_nccl__ce_slot *slot) {
  hir_nccl__ce *ce = &hir_nccl__of(c)->ce;
  hir_nccl__ce_held *h;
  cudaUserObject_t obj;
  unsigned char *used = ce->graphs->used + (size_t)peer * HIR_NCCL__CE_GRAPH_WORDS, no = 0;
  int k;
  cudaError_t e;
  for (k = 0; k < HIR_NCCL__CE_GRAPH_WORDS; k++)
    if (__atomic_compare_exchange_n(&used[k], &no, (unsigned char)1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) break;
    else no = 0;
  if (k == HIR_NCCL__CE_GRAPH_WORDS) {
    char detail[160];
    snprintf(detail, sizeof detail, "more than %d receives from one peer are held by CUDA graphs at once; free graphs "
             "(evaluators) that are no longer replayed", HIR_NCCL__CE_GRAPH_WORDS);
    slot->graph_word = -2;
    return hir_nccl__ce_fail(c, HIR_ERR_UNSUPPORTED, "a captured receive", detail);
  }
  if (!(h = (hir_nccl__ce_held *)malloc(sizeof *h))) {
    used[k] = 0;
    slot->graph_word = -2;
    return hir_nccl__ce_fail(c, HIR_ERR_NOMEM, "a captured receive", "out of memory");
  }
  __atomic_store_n((unsigned *)(ce->block + hir_nccl__ce_graph_word(ce, peer, ce->me, k, 0)), 0u, __ATOMIC_RELEASE);
  __atomic_store_n((unsigned *)(ce->block + hir_nccl__ce_graph_word(ce, peer, ce->me, k, 1)), 0u, __ATOMIC_RELEASE);
  h->graphs = ce->graphs;
  h->word = peer * HIR_NCCL__CE_GRAPH_WORDS + k;
  h->export_index = slot->buffer_id ? slot->export_index : -1;
  __atomic_add_fetch(&ce->graphs->refs, 1, __ATOMIC_ACQ_REL);
  if (h->export_index >= 0) __atomic_add_fetch(&ce->graphs->export_graphs[h->export_index], 1, __ATOMIC_ACQ_REL);
  if ((e = cudaUserObjectCreate(&obj, h, hir_nccl__ce_graph_gone, 1, cudaUserObjectNoDestructorSync)) != cudaSuccess) {
    hir_nccl__ce_graph_gone(h);
    slot->graph_word = -2;
    return hir_nccl__ce_cuda(c, "a captured receive", e);
  }
  if ((e = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove)) != cudaSuccess) {
    cudaUserObjectRelease(obj, 1); /* runs hir_nccl__ce_graph_gone */
    slot->graph_word = -2;
    return hir_nccl__ce_cuda(c, "a captured receive", e);
  }
  slot->graph_word = k;
  return HIR_OK;
}

/* Receives posted at a replay's start (hir_comm.recv_at_start): the writes
   that raise their ready flags, made as they are captured and kept until
   the evaluator takes them for the graph just captured (the list itself,
   so taking cannot fail); 0 where there is no room (the flag then stays in
   the graph). */
typedef struct hir_nccl__start_signals {
  int n, cap;
  CUstreamBatchMemOpParams write[1];
} hir_nccl__start_signals;

static int hir_nccl__keep_start_word(hir_nccl__rank *nc, CUdeviceptr word) {
  hir_nccl__start_signals *sig = nc->start_pending;
  CUstreamBatchMemOpParams *w;
  if (!sig || sig->n == sig->cap) {
    int cap = sig ? 2 * sig->cap : 32;
    size_t bytes = sizeof *sig + (size_t)cap * sizeof(CUstreamBatchMemOpParams);
    hir_nccl__start_signals *grown = (hir_nccl__start_signals *)realloc(sig, bytes);
    if (!grown) return 0;
    if (!sig) grown->n = 0;
    grown->cap = cap;
    nc->start_pending = sig = grown;
  }
  w = &sig->write[sig->n++];
  memset(w, 0, sizeof *w);
  w->writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  w->writeValue.address = word;
  w->writeValue.value = 1;
  w->writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return 1;
}

static void *hir_nccl__start_signals_take(hir_comm *c) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  void *sig = nc->start_pending;
  nc->start_pending = NULL;
  return sig;
}

/* The graph's receive buffers are free from here on `stream`: their ready
   flags raised, up to 255 to a memory-operation node (the driver's most). */
static hir_status hir_nccl__start_signals_raise(hir_comm *c, void *signals, void *stream) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__start_signals *sig = (hir_nccl__start_signals *)signals;
  int i, k;
  hir_status s = HIR_OK;
  cudaSetDevice(nc->device);
  for (i = 0; i < sig->n && s == HIR_OK; i += k) {
    k = sig->n - i < 255 ? sig->n - i : 255;
    s = hir_nccl__ce_cu(c, "marking a graph's receive buffers writable",
                        nc->ce.batch_memops((CUstream)stream, (unsigned)k, sig->write + i, 0));
  }
  return s;
}

static void hir_nccl__start_signals_release(hir_comm *c, void *signals) {
  (void)c;
  free(signals);
}

/* A receive: posted in the sender's mailbox (waiting only while its ring of
   slots is full), its buffer marked writable on the receiving stream. A
   receive that cannot be captured is posted all the same, so that its
   sender fails too rather than wait. */
static hir_status hir_nccl__ce_post_recv(hir_comm *c, hir_nccl__ce_op *op) {
  hir_nccl__ce *ce = &hir_nccl__of(c)->ce;
  int peer = ce->local[op->peer];
  hir_nccl__ce_box *box = hir_nccl__ce_box_of(ce, peer, ce->me);
  unsigned long long seq = box->posted;
  hir_nccl__ce_slot *slot = &box->slot[seq % HIR_NCCL__CE_SLOTS];
  cudaGraph_t graph = NULL;
  char detail[256];
  size_t word;
  cuuint32_t value;
  hir_status s, captured = HIR_OK;
  if (seq >= HIR_NCCL__CE_SLOTS &&
      (s = hir_nccl__ce_wait(c, &box->taken, seq - HIR_NCCL__CE_SLOTS + 1, op->peer, "a receive")) != HIR_OK)
    return s;
  slot->bytes = op->bytes;
  slot->what = op->what;
  slot->graph_word = -1;
  if (!ce->segment) { /* one process: the address itself */
    slot->buffer_id = 0;
    slot->export_index = -1;
    slot->offset = (unsigned long long)(uintptr_t)op->buf;
  } else if (!hir_nccl__ce_export_of(ce, op->buf, slot, detail, sizeof detail)) {
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "a receive", detail);
  }
  if (hir_nccl__capturing(op->stream, &graph)) captured = hir_nccl__ce_graph_words(c, peer, graph, slot);
  op->seq = seq;
  op->graph_word = slot->graph_word;
  if (captured != HIR_OK) return hir_nccl__set_counter(&box->posted, seq + 1), captured;
  word = op->graph_word >= 0 ? hir_nccl__ce_graph_word(ce, peer, ce->me, op->graph_word, 0) : hir_nccl__ce_word(ce, peer, ce->me, seq, 0);
  value = op->graph_word >= 0 ? 1 : (cuuint32_t)(seq + 1);
  if (op->graph_word >= 0 && op->at_start &&
      hir_nccl__keep_start_word(hir_nccl__of(c), (CUdeviceptr)(uintptr_t)(ce->pad_dev + word))) {
    hir_nccl__set_counter(&box->posted, seq + 1); /* its flag is raised before each launch instead */
    return HIR_OK;
  }
  if ((s = hir_nccl__ce_cu(c, "marking a receive's buffer writable",
                           ce->write_value((CUstream)op->stream, (CUdeviceptr)(uintptr_t)(ce->pad_dev + word), value,
                                           CU_STREAM_WRITE_VALUE_DEFAULT))) != HIR_OK)
    return s;
  hir_nccl__set_counter(&box->posted, seq + 1);
  return HIR_OK;
}

/* A send: takes the receiver's post, then on the copy stream waits for the
   sending stream and the receiver's buffer, copies, and signals arrival; the
   sending stream may reuse its buffer once the copy is done. Captured, it
   waits for and signals the graph words its receive names, and takes the
   ready flag back for the next replay. */
static hir_status hir_nccl__ce_send(hir_comm *c, const hir_nccl__ce_op *op) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__ce *ce = &nc->ce;
  int peer = ce->local[op->peer], captured;
  hir_nccl__ce_box *box = hir_nccl__ce_box_of(ce, ce->me, peer);
  unsigned long long seq = box->taken;
  hir_nccl__ce_slot slot;
  cudaGraph_t graph = NULL;
  char detail[320];
  void *dst;
  CUdeviceptr ready, arrived;
  cuuint32_t value = (cuuint32_t)(seq + 1);
  hir_status s;
  if ((s = hir_nccl__ce_wait(c, &box->posted, seq + 1, op->peer, "a send")) != HIR_OK) return s;
  slot = box->slot[seq % HIR_NCCL__CE_SLOTS];
  captured = hir_nccl__capturing(op->stream, &graph);
  if (slot.graph_word == -2 || captured != (slot.graph_word >= 0)) {
    hir_nccl__set_counter(&box->taken, seq + 1);
    snprintf(detail, sizeof detail, "%s", slot.graph_word == -2 ? "its receiver could not capture its receive"
             : captured ? "it is captured into a CUDA graph and its receiver's receive is not; capture on every rank alike"
             : "its receiver's receive is captured into a CUDA graph and this send is not; capture on every rank alike");
    return hir_nccl__ce_fail(c, HIR_ERR_INVALID, "a send", detail);
  }
  if (slot.bytes != op->bytes) {
    char mine[96], theirs[96];
    hir_comm_what_snprint(&op->what, mine, sizeof mine);
    hir_comm_what_snprint(&slot.what, theirs, sizeof theirs);
    snprintf(detail, sizeof detail, "it sends %s (%zu bytes) to rank %d, which receives %s (%llu bytes); the ranks must "
             "pass matching shapes", mine, op->bytes, op->peer, theirs, slot.bytes);
    return hir_nccl__ce_fail(c, HIR_ERR_SHAPE, "a send", detail);
  }
  if (!(dst = hir_nccl__ce_target(ce, peer, &slot, captured, hir_nccl__wall_ms() + nc->timeout_ms, detail, sizeof detail)))
    return hir_nccl__ce_fail(c, HIR_ERR_BACKEND, "a send", detail);
  ready = (CUdeviceptr)(uintptr_t)(ce->pad_dev + (captured ? hir_nccl__ce_graph_word(ce, ce->me, peer, slot.graph_word, 0)
                                                            : hir_nccl__ce_word(ce, ce->me, peer, seq, 0)));
  arrived = (CUdeviceptr)(uintptr_t)(ce->pad_dev + (captured ? hir_nccl__ce_graph_word(ce, ce->me, peer, slot.graph_word, 1)
                                                              : hir_nccl__ce_word(ce, ce->me, peer, seq, 1)));
  if (captured) value = 1;
  if ((s = hir_nccl__ce_cuda(c, "a send", cudaEventRecord(ce->source, (cudaStream_t)op->stream))) != HIR_OK ||
      (s = hir_nccl__ce_cuda(c, "a send", cudaStreamWaitEvent(ce->stream, ce->source, 0))) != HIR_OK ||
      (s = hir_nccl__ce_cu(c, "waiting for the receiver's buffer",
                           hir_nccl__ce_wait_word(ce, ce->stream, ready, value, captured))) != HIR_OK ||
      (s = hir_nccl__ce_cuda(c, "a peer copy", cudaMemcpyAsync(dst, op->buf, op->bytes, cudaMemcpyDefault, ce->stream))) !=
          HIR_OK ||
      (s = hir_nccl__ce_cu(c, "signalling a copy's arrival",
                           ce->write_value((CUstream)ce->stream, arrived, value, CU_STREAM_WRITE_VALUE_DEFAULT))) != HIR_OK ||
      (s = hir_nccl__ce_cuda(c, "a send", cudaEventRecord(ce->done, ce->stream))) != HIR_OK ||
      (s = hir_nccl__ce_cuda(c, "a send", cudaStreamWaitEvent((cudaStream_t)op->stream, ce->done, 0))) != HIR_OK)
    return s;
  hir_nccl__set_counter(&box->taken, seq + 1);
  return HIR_OK;
}

/* The receiving stream goes on once the copy has landed (captured: and
   takes the arrival flag back for the next replay). */
static hir_status hir_nccl__ce_finish_recv(hir_comm *c, const hir_nccl__ce_op *op) {
  hir_nccl__ce *ce = &hir_nccl__of(c)->ce;
  int peer = ce->local[op->peer];
  CUdeviceptr arrived;
  hir_status s;
  /* Threads of one process: the sender's copy queued before this GPU waits
     for it. Else the GPU could wait on work a peer thread has not queued
     while this thread holds the driver's lock in a kernel's first launch
     (lazy module loading drains the GPU under it), and the peer's
     cudaMemcpyAsync into this GPU's memory waits for that lock: the hang of
     bench/NOTES.md section 43. The local world's receives wait for their
     send alike, so a program that runs there runs here. */
  if (!ce->segment && (s = hir_nccl__ce_wait(c, &hir_nccl__ce_box_of(ce, peer, ce->me)->taken, op->seq + 1, op->peer,
                                             "a receive")) != HIR_OK)
    return s;
  arrived = (CUdeviceptr)(uintptr_t)(ce->pad_dev + (op->graph_word >= 0
                                                        ? hir_nccl__ce_graph_word(ce, peer, ce->me, op->graph_word, 1)
                                                        : hir_nccl__ce_word(ce, peer, ce->me, op->seq, 1)));
  return hir_nccl__ce_cu(c, "waiting for a copy", hir_nccl__ce_wait_word(ce, op->stream, arrived, (cuuint32_t)(op->seq + 1),
                                                                         op->graph_word >= 0));
}

/* Receives are posted first, so that every send of the group, in any order
   on any rank, finds its match. A group holds at most a ring of receives
   from one peer (more would wait for sends that come after them). */
static hir_status hir_nccl__ce_run(hir_comm *c, hir_nccl__ce_op *ops, int n) {
  hir_status s = HIR_OK;
  int i, j, same;
  cudaSetDevice(hir_nccl__of(c)->device);
  for (i = 0; i < n; i++) {
    for (j = same = 0; j < n; j++) same += ops[j].send == ops[i].send && ops[j].peer == ops[i].peer;
    if (same > HIR_NCCL__CE_SLOTS) {
      char detail[128];
      snprintf(detail, sizeof detail, "%d %s rank %d in one group; at most %d", same, ops[i].send ? "sends to" : "receives from",
               ops[i].peer, HIR_NCCL__CE_SLOTS);
      return hir_nccl__ce_fail(c, HIR_ERR_UNSUPPORTED, "a group", detail);
    }
  }
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
  op.send = send;
  op.peer = peer;
  op.buf = (void *)buf;
  op.bytes = bytes;
  op.stream = stream;
  op.seq = 0;
  op.graph_word = -1;
  op.at_start = c->recv_at_start;
  op.what = c->what;
  if (!nc->ce_group) return hir_nccl__ce_run(c, &op, 1);
  if (nc->ce_nops == HIR_NCCL__CE_GROUP)
    return hir_nccl__ce_fail(c, HIR_ERR_UNSUPPORTED, "a group", "more than 256 sends and receives in one group");
  nc->ce_ops[nc->ce_nops++] = op;
  return HIR_OK;
}

static hir_status hir_nccl__send(hir_comm *c, const void *buf, size_t bytes, int peer, void *stream) {
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if (hir_nccl__ce_peer(c, peer)) return hir_nccl__ce_queue(c, 1, buf, bytes, peer, stream);
  return HIR_NCCL__DATA(c, ncclSend(buf, bytes, ncclUint8, peer, hir_nccl__data(&hir_nccl__of(c)->world_team), (cudaStream_t)stream));
}
static hir_status hir_nccl__recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  if (hir_nccl__ce_peer(c, peer)) return hir_nccl__ce_queue(c, 0, buf, bytes, peer, stream);
  return HIR_NCCL__DATA(c, ncclRecv(buf, bytes, ncclUint8, peer, hir_nccl__data(&hir_nccl__of(c)->world_team), (cudaStream_t)stream));
}
static hir_status hir_nccl__group_start(hir_comm *c) {
  if (hir_nccl__ended(c)) return HIR_ERR_COMM;
  hir_nccl__of(c)->ce_group++;
  return HIR_NCCL__CHECK(c, ncclGroupStart());
}
static hir_status hir_nccl__group_end(hir_comm *c) { /* the copies of the outermost group, then NCCL's */
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_status s = HIR_OK;
  if (nc->ce_group == 0 && hir_nccl__ended(c)) return HIR_ERR_COMM; /* its start was refused: no group is open */
  if (nc->ce_group > 0 && --nc->ce_group == 0 && nc->ce_nops) {
    s = hir_nccl__ended(c) ? HIR_ERR_COMM : hir_nccl__ce_run(c, nc->ce_ops, nc->ce_nops);
    nc->ce_nops = 0;
  }
  return s == HIR_OK ? HIR_NCCL__DATA(c, ncclGroupEnd()) : (ncclGroupEnd(), s);
}

/* User-buffer registration (where NCCL supports it; a buffer it refuses
   still works, through NCCL's own staging): with the data path's
   communicator of the world and of each team. */
static void hir_nccl__register(hir_comm *c, void *ptr, size_t bytes) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  hir_nccl__reg *r;
  hir_nccl__team *t = &nc->world_team;
  if (bytes < ((size_t)1 << 20) || nc->aborted || !(r = (hir_nccl__reg *)calloc(1, sizeof *r))) return;
  r->ptr = ptr;
  for (; t && r->n < 16; t = hir_nccl__next_team(nc, t))
    if (HIR_NCCL__CHECK(c, ncclCommRegister(hir_nccl__data(t), ptr, bytes, &r->handles[r->n])) == HIR_OK)
      r->comms[r->n++] = hir_nccl__data(t);
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
  int k;
  ncclResult_t r = ncclSuccess;
  hir_status s;
  if ((s = hir_nccl__kc_failed(c)) != HIR_OK) return s;
  if (hir_nccl__told(c)) return HIR_ERR_COMM;
  if (nc->aborted) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: the communicator of rank %d was aborted", c->rank);
    return HIR_ERR_COMM;
  }
  for (t = &nc->world_team; t; t = hir_nccl__next_team(nc, t)) {
    ncclComm_t both[2] = {t->comm, t->fast}; /* the parent, its twin */
    for (k = 0; k < 2; k++)
      if (both[k] && ncclCommGetAsyncError(both[k], &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
        return hir_nccl__check(c, r, t == &nc->world_team ? "NCCL (asynchronous, world)" : "NCCL (asynchronous, team)", __LINE__);
  }
  return HIR_OK;
}

/* hir_comm.allocation_of: between processes a captured copy writes through
   this rank's mapping of the receiver's allocation, which a new allocation
   at the same address is not. */
static unsigned long long hir_nccl__allocation_of(hir_comm *c, const void *ptr) {
  hir_nccl__ce *ce = &hir_nccl__of(c)->ce;
  CUpointer_attribute which = CU_POINTER_ATTRIBUTE_BUFFER_ID;
  unsigned long long id = 0;
  void *value = &id;
  if (!hir_nccl__of(c)->ce_on || !ce->segment || ce->pointer_attrs(1, &which, &value, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    return 0;
  return id;
}

/* hir_comm.set_copy_engine: this rank's send/recv on its copy engines, where
   it has them (a threaded world's once hir_nccl_world_set_copy_engine has
   enabled its peers' access), or on NCCL. */
static hir_status hir_nccl__set_copy_engine(hir_comm *c, int enable) {
  hir_nccl__rank *nc = hir_nccl__of(c);
  int i, all_local = 1;
  if (enable && (!nc->ce.stream || !nc->ce.local || (nc->shared && !nc->shared->peer_access))) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: rank %d has no copy engines to its peers (%s)", c->rank,
             c->size == 1 ? "it is alone" : nc->shared ? "hir_nccl_world_set_copy_engine has not enabled them"
             : "its host's ranks could not set them up, or HOSTIR_COPY_ENGINE=0");
    return HIR_ERR_UNSUPPORTED;
  }
  for (i = 0; enable && i < c->size; i++) all_local &= nc->ce.local[i] >= 0;
  nc->ce_on = enable != 0;
  c->p2p_copy_engine = enable && all_local;
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
  c->capturable = 1; /* NCCL's calls are, and copy-engine send/recv (captured receives use graph words) */
  c->what.tensor = -1;
  snprintf(nc->kc_why, sizeof nc->kc_why, "%s", size == 1 ? "a world of one rank" : "the ranks share no host block (another host, "
           "HOSTIR_COPY_ENGINE=0, or it could not be set up)");
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
  c->set_copy_engine = hir_nccl__set_copy_engine;
  c->allocation_of = hir_nccl__allocation_of;
  c->start_signals_take = hir_nccl__start_signals_take;
  c->start_signals_raise = hir_nccl__start_signals_raise;
  c->start_signals_release = hir_nccl__start_signals_release;
  c->collective_path = hir_nccl__collective_path;
  c->collective_choice = hir_nccl__choice_text;
  c->set_collective_choice = hir_nccl__set_choice;
  c->allreduce_rms_norm = hir_nccl__allreduce_rms_norm;
}

static void hir_nccl__release(hir_nccl__rank *nc) {
  hir_nccl__watch_stop(nc);
  free(nc->start_pending);
  while (nc->regs) hir_nccl__deregister(&nc->comm, nc->regs->ptr);
  while (nc->teams) {
    hir_nccl__team *t = nc->teams;
    nc->teams = t->next;
    if (!nc->aborted) {
      if (t->fast) ncclCommDestroy(t->fast);
      ncclCommDestroy(t->comm);
    }
    if (t->kc) hir_nccl__kc_free(t->kc);
    free(t->kc);
    free(t->devices);
    free(t);
  }
  if (nc->world_team.fast && !nc->aborted) ncclCommDestroy(nc->world_team.fast);
  if (nc->world && !nc->borrowed && !nc->aborted) ncclCommDestroy(nc->world);
  while (nc->naborting) pthread_join(nc->aborting[--nc->naborting], NULL);
  free(nc->aborting);
  free(nc->abort_pairs);
  nc->aborting = NULL;
  nc->abort_pairs = NULL;
  if (nc->zeros) cudaFree(nc->zeros);
  while (nc->nzeros_old) cudaFree(nc->zeros_old[--nc->nzeros_old]);
  hir_nccl__kc_free(&nc->kc);
  hir_nccl__ce_detach(&nc->ce, 1);
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

/* The world's blocking twin, on a rank of one process per GPU, where every
   rank can take one (a threaded world makes its ranks' twins in one group:
   hir_nccl_world_create). */
static hir_status hir_nccl__world_twin(hir_nccl__rank *nc) {
  hir_comm *c = &nc->comm;
  int want = hir_nccl__twins_on(nc), every = want, i, *all;
  hir_status s = HIR_OK;
  if (nc->borrowed) return HIR_OK;
  if (c->size > 1) {
    if (!(all = (int *)calloc((size_t)c->size, sizeof *all))) {
      snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
      return HIR_ERR_NOMEM;
    }
    s = hir_nccl__exchange(c, &want, all, sizeof want, -1, NULL, 0);
    for (i = 0; i < c->size; i++) every &= all[i];
    free(all);
  }
  if (s != HIR_OK || !every) {
    hir_nccl__watch_stop(nc);
    return s;
  }
  nc->twins = 1;
  return hir_nccl__twin(c, nc->world, c->rank, &nc->world_team.fast);
}

// >>nccl_bootstrap
/* Each GPU of a threaded world given access to every other's memory where
   it can be (else copies go through the host); 1 where every pair can. */
static int hir_nccl__world_peers(hir_nccl_world *w) {
  int i, j, can, every = 1, current = 0;
  cudaGetDevice(&current);
  for (i = 0; i < w->n; i++)
    for (j = 0; j < w->n; j++) {
      if (i == j) continue;
      if (cudaSetDevice(i) != cudaSuccess || cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess || !can) every = can = 0;
      if (can && cudaDeviceEnablePeerAccess(j, 0) != cudaSuccess) cudaGetLastError(); /* already enabled */
    }
  cudaSetDevice(current);
  cudaGetLastError();
  return every;
}

/* One process per GPU, the whole world on this host, its block up: kernel
   collectives. Every rank prepares its kernels and workspace, the ranks
   swap its IPC handle, each maps the others', and they agree: on for every
   rank, or off for every rank (kc_why says why). */
static hir_status hir_nccl__kc_join(hir_nccl__rank *nc) {
  typedef struct { cudaIpcMemHandle_t handle; int ok; } hir_nccl__kc_hello;
  hir_comm *c = &nc->comm;
  hir_nccl__kc_hello me, *all;
  hir_status s;
  int i, every = 1;
  memset(&me, 0, sizeof me);
  nc->kc_why[0] = 0;
  if (!hir_nccl__switch("HOSTIR_KERNEL_COLLECTIVES")) snprintf(nc->kc_why, sizeof nc->kc_why, "HOSTIR_KERNEL_COLLECTIVES=0");
  else if (c->size > HIR_NCCL__KC_RANKS) snprintf(nc->kc_why, sizeof nc->kc_why, "more than %d ranks", HIR_NCCL__KC_RANKS);
  else if (hir_nccl__kc_prepare(&nc->kc, nc->device, nc->kc_why, sizeof nc->kc_why))
    me.ok = cudaIpcGetMemHandle(&me.handle, nc->kc.mine) == cudaSuccess || (cudaGetLastError(), 0);
  if (!(all = (hir_nccl__kc_hello *)calloc((size_t)c->size, sizeof *all))) {
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  if ((s = hir_nccl__exchange(c, &me, all, sizeof me, -1, NULL, 0)) == HIR_OK) {
    for (i = 0; i < c->size; i++) every &= all[i].ok;
    nc->kc.n = c->size;
    nc->kc.me = c->rank;
    for (i = 0; every && i < c->size; i++) {
      void *base = NULL;
      if (i == c->rank) nc->kc.ws[i] = nc->kc.mine;
      else if (cudaIpcOpenMemHandle(&base, all[i].handle, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess)
        nc->kc.ws[i] = (unsigned char *)base, nc->kc.opened[i] = 1;
      else {
        snprintf(nc->kc_why, sizeof nc->kc_why, "mapping rank %d's workspace: %s", i, cudaGetErrorString(cudaGetLastError()));
        every = 0;
      }
    }
    me.ok = every;
    if (!every && !nc->kc_why[0]) snprintf(nc->kc_why, sizeof nc->kc_why, "another rank could not set them up");
    if ((s = hir_nccl__exchange(c, &me, all, sizeof me, -1, NULL, 0)) == HIR_OK)
      for (i = 0; i < c->size; i++) every &= all[i].ok;
    if (s == HIR_OK && !every && !nc->kc_why[0]) snprintf(nc->kc_why, sizeof nc->kc_why, "another rank could not map them");
  }
  free(all);
  if (s != HIR_OK || !every) {
    hir_nccl__kc_free(&nc->kc);
    return s;
  }
  hir_nccl__kc_words(&nc->kc, &nc->ce);
  nc->kc.on = 1;
  return HIR_OK;
}

/* Threads: a rank's share of hir_nccl__kc_measure. */
static hir_status hir_nccl__kc_measure_rank(int rank, void *user) {
  hir_nccl_world *w = (hir_nccl_world *)user;
  cudaSetDevice(rank);
  return hir_nccl__kc_measure(&w->ranks[rank].comm, &w->ranks[rank].world_team);
}

/* Threads: every rank's kernels and workspace, each GPU's access to the
   others', then every rank on, or none (kc_why says why). */
static void hir_nccl__kc_world(hir_nccl_world *w) {
  char why[200] = "";
  int i, j, ok = 1, current = 0;
  if (!hir_nccl__switch("HOSTIR_KERNEL_COLLECTIVES")) snprintf(why, sizeof why, "HOSTIR_KERNEL_COLLECTIVES=0");
  else if (w->n > HIR_NCCL__KC_RANKS) snprintf(why, sizeof why, "more than %d ranks", HIR_NCCL__KC_RANKS);
  else if (!w->block || !w->ranks[w->n - 1].ce.stream) snprintf(why, sizeof why, "the ranks' shared block is missing");
  ok = !why[0];
  cudaGetDevice(&current);
  for (i = 0; ok && i < w->n; i++) ok = cudaSetDevice(i) == cudaSuccess && hir_nccl__kc_prepare(&w->ranks[i].kc, i, why, sizeof why);
  if (ok && !(ok = hir_nccl__world_peers(w))) snprintf(why, sizeof why, "the GPUs cannot all reach each other (peer access)");
  for (i = 0; i < w->n; i++) {
    hir_nccl__kc *kc = &w->ranks[i].kc;
    if (!ok) {
      cudaSetDevice(i);
      hir_nccl__kc_free(kc);
      snprintf(w->ranks[i].kc_why, sizeof w->ranks[i].kc_why, "%s", why);
      continue;
    }
    kc->n = w->n;
    kc->me = i;
    for (j = 0; j < w->n; j++) kc->ws[j] = w->ranks[j].kc.mine;
    hir_nccl__kc_words(kc, &w->ranks[i].ce);
    kc->on = 1;
  }
  cudaSetDevice(current);
  cudaGetLastError();
}

/* Which host a rank runs on: NCCL_HOSTID where set (as NCCL does), else the
   host's name and boot id. */
static unsigned long long hir_nccl__host_id(void) {
  char text[600] = "";
  const char *v = getenv("NCCL_HOSTID");
  FILE *f;
  size_t n;
  if (v && *v) return hir_nccl__hash(v, strlen(v), 3);
  if (gethostname(text, 256) != 0) text[0] = 0;
  text[256] = 0;
  n = strlen(text);
  if ((f = fopen("/proc/sys/kernel/random/boot_id", "r"))) {
    n += fread(text + n, 1, sizeof text - 1 - n, f);
    fclose(f);
  }
  return hir_nccl__hash(text, n, 3);
}

/* What each rank tells the others while the world is set up. */
typedef struct hir_nccl__who {
  unsigned long long host, nonce;
  int pid, ok;
} hir_nccl__who;

/* One process per GPU, once the world communicator exists: the ranks learn
   which of them share a host, and each host's ranks set up the block of
   nccl_peer (its first rank creates the segment, the others map it, then it
   is unlinked). Three exchanges, made by every rank whatever happens, so
   every rank of a host ends with the same answer: copy engines on for the
   whole host, or off (HOSTIR_COPY_ENGINE=0 on any of its ranks, a failure
   anywhere). */
static hir_status hir_nccl__join(hir_nccl__rank *nc) {
  hir_comm *c = &nc->comm;
  hir_nccl__who me, *all;
  char name[80], why[256] = "";
  unsigned char *block = NULL;
  int i, round, leader = -1, nlocal = 0, on = 0, created = 0;
  hir_status s;
  size_t bytes = 0;
  if ((s = hir_nccl__world_team(nc)) != HIR_OK || (s = hir_nccl__world_twin(nc)) != HIR_OK || c->size == 1) return s;
  if (!(all = (hir_nccl__who *)calloc((size_t)c->size, sizeof *all)) ||
      !(nc->ce.local = (int *)malloc((size_t)c->size * sizeof(int)))) {
    free(all);
    snprintf(c->error, sizeof c->error, "hostir_nccl: out of memory");
    return HIR_ERR_NOMEM;
  }
  memset(&me, 0, sizeof me);
  me.host = hir_nccl__host_id();
  me.nonce = hir_nccl__hash(&me, sizeof me, (unsigned long long)hir_nccl__wall_ms() * 1000003ull ^ (unsigned long long)getpid());
  me.pid = (int)getpid();
  me.ok = hir_nccl__switch("HOSTIR_COPY_ENGINE");
  for (round = 0; round < 3; round++) {
    if ((s = hir_nccl__exchange(c, &me, all, sizeof me, -1, NULL, 0)) != HIR_OK) break;
    if (round == 0) { /* who shares this host; its first rank leads */
      for (i = 0; i < c->size; i++) {
        nc->ce.local[i] = all[i].host == me.host ? nlocal++ : -1;
        if (all[i].host == me.host && leader < 0) leader = i;
      }
      for (i = on = 0; i < c->size; i++) on += nc->ce.local[i] >= 0 && all[i].ok;
      on = nlocal >= 2 && nlocal <= HIR_NCCL__LOCAL_MAX && on == nlocal;
      snprintf(name, sizeof name, "/dev/shm/hostir-%016llx-%016llx", me.host, all[leader].nonce);
      bytes = hir_nccl__ce_bytes(nlocal);
      if (on && leader == c->rank && (block = hir_nccl__ce_segment(name, bytes, 1, why, sizeof why))) {
        created = 1;
        memset(block, 0, bytes);
        ((hir_nccl__ce_head *)block)->magic = HIR_NCCL__CE_MAGIC;
        ((hir_nccl__ce_head *)block)->nlocal = nlocal;
      }
      me.ok = on && (leader != c->rank || block);
    } else if (round == 1) { /* the segment exists: map it, pin it */
      on = on && all[leader].ok;
      if (on && !block) block = hir_nccl__ce_segment(name, bytes, 0, why, sizeof why);
      if (block && ((hir_nccl__ce_head *)block)->magic != HIR_NCCL__CE_MAGIC) snprintf(why, sizeof why, "%s is not hostir's", name);
      me.ok = on && block && !why[0] &&
              hir_nccl__ce_attach(&nc->ce, block, 1, nlocal, nc->ce.local[c->rank], why, sizeof why);
    } else { /* everyone has it: copy engines on where every rank of the host succeeded */
      for (i = 0; i < c->size; i++) on = on && (nc->ce.local[i] < 0 || all[i].ok);
    }
  }
  if (created) unlink(name);
  free(all);
  if (s != HIR_OK || !on) {
    int *local = nc->ce.local;
    if (!nc->ce.block && block) munmap(block, bytes);
    nc->ce.local = NULL;
    hir_nccl__ce_detach(&nc->ce, 1);
    free(local);
    return s;
  }
  nc->ce_on = 1;
  c->p2p_copy_engine = nlocal == c->size; /* peers on other hosts take NCCL's kernels */
  if (nlocal == c->size && (s = hir_nccl__kc_join(nc)) != HIR_OK) return s; /* every rank alike: one host, its block on */
  for (i = 0; i < nlocal; i++) /* each peer's process learnt now, while it lives: one first looked at once gone is not watched */
    if (i != nc->ce.me) hir_nccl__peer_ended(&nc->ce, i, 1);
  return nc->kc.on ? hir_nccl__kc_measure(c, &nc->world_team) : HIR_OK;
}

/* ncclCommInitAll, but nonblocking like every communicator of ours (a
   blocking one would hold a rank inside ncclGroupEnd while it connects to a
   peer that failed): one rank per GPU 0..n-1, in one group, each ready or
   failed within a minute. */
static int hir_nccl__init_all(ncclComm_t *comms, int n, char *err, size_t cap) {
  ncclConfig_t config = hir_nccl__config();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id), q;
  double deadline = hir_nccl__wall_ms() + 60000;
  int i, current = 0;
  cudaGetDevice(&current);
  if (r == ncclSuccess) r = ncclGroupStart();
  for (i = 0; i < n && r == ncclSuccess; i++) {
    cudaSetDevice(i);
    r = ncclCommInitRankConfig(&comms[i], n, id, i, &config);
    if (r == ncclInProgress) r = ncclSuccess;
  }
  q = ncclGroupEnd();
  if (r == ncclSuccess && q != ncclInProgress) r = q;
  for (i = 0; i < n && r == ncclSuccess; i++) r = hir_nccl__made(comms[i], deadline);
  cudaSetDevice(current);
  if (r == ncclSuccess) return 1;
  for (i = 0; i < n; i++)
    if (comms[i]) ncclCommAbort(comms[i]), comms[i] = NULL;
  snprintf(err, cap, "hir_nccl_world_create: NCCL's communicators over %d GPUs %s", n,
           r == ncclInProgress ? "were not ready after 60 s" : ncclGetErrorString(r));
  return 0;
}

/* The ranks' blocking twins (hir_nccl__twin), split in one group as
   hir_nccl__init_all makes their parents; every rank or none. */
static int hir_nccl__world_twins(hir_nccl_world *w, int n, char *err, size_t cap) {
  ncclConfig_t config = hir_nccl__twin_config();
  ncclResult_t r = ncclSuccess, q;
  double deadline = hir_nccl__wall_ms() + 60000;
  int i, every = 1, current = 0;
  for (i = 0; i < n; i++) every &= hir_nccl__twins_on(&w->ranks[i]);
  if (!every) {
    for (i = 0; i < n; i++) hir_nccl__watch_stop(&w->ranks[i]);
    return 1;
  }
  cudaGetDevice(&current);
  r = ncclGroupStart();
  for (i = 0; i < n && r == ncclSuccess; i++) {
    cudaSetDevice(i);
    r = ncclCommSplit(w->ranks[i].world, 0, i, &w->ranks[i].world_team.fast, &config);
    if (r == ncclInProgress) r = ncclSuccess;
  }
  q = ncclGroupEnd();
  if (r == ncclSuccess && q != ncclInProgress) r = q;
  for (i = 0; i < n && r == ncclSuccess; i++)
    if ((r = hir_nccl__made(w->ranks[i].world, deadline)) == ncclSuccess && !w->ranks[i].world_team.fast) r = ncclInternalError;
  cudaSetDevice(current);
  for (i = 0; i < n; i++) w->ranks[i].twins = r == ncclSuccess;
  if (r == ncclSuccess) return 1;
  for (i = 0; i < n; i++) { /* the world is not made: nothing of it runs on */
    hir_nccl__rank *nc = &w->ranks[i];
    hir_nccl__watch_stop(nc);
    ncclCommAbort(nc->world);
    ncclCommAbort(nc->world_team.fast);
    nc->world = nc->world_team.comm = nc->world_team.fast = NULL;
  }
  snprintf(err, cap, "hir_nccl_world_create: the data path's blocking twins over %d GPUs %s", n,
           r == ncclInProgress ? "were not ready after 60 s" : ncclGetErrorString(r));
  return 0;
}

HIRDEF hir_status hir_nccl_world_create(int nranks, hir_nccl_world **out) {
  hir_nccl_world *w;
  ncclComm_t *comms;
  int i, ndev = 0;
  hir_status s = HIR_OK;
  if (!out) return HIR_ERR_INVALID;
  if (!(w = *out = (hir_nccl_world *)calloc(1, sizeof *w))) return HIR_ERR_NOMEM;
  pthread_mutex_init(&w->mu, NULL);
  if (hir_nccl__check_switches(w->error, sizeof w->error) != HIR_OK) return HIR_ERR_INVALID;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || nranks < 1 || nranks > ndev) {
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: %d ranks asked, %d GPUs visible", nranks, ndev);
    return HIR_ERR_INVALID;
  }
  comms = (ncclComm_t *)calloc((size_t)nranks, sizeof *comms);
  w->ranks = (hir_nccl__rank *)calloc((size_t)nranks, sizeof *w->ranks);
  if (!comms || !w->ranks) {
    free(comms);
    snprintf(w->error, sizeof w->error, "hir_nccl_world_create: out of memory");
    return HIR_ERR_NOMEM;
  }
  if (!hir_nccl__init_all(comms, nranks, w->error, sizeof w->error)) s = HIR_ERR_COMM;
  for (i = 0; i < nranks && s == HIR_OK; i++) {
    hir_nccl__init(&w->ranks[i], i, nranks, i);
    w->ranks[i].world = comms[i];
    w->ranks[i].shared = w;
    snprintf(w->ranks[i].how, sizeof w->ranks[i].how, "a thread of one process driving %d GPUs", nranks);
    if ((s = hir_nccl__world_team(&w->ranks[i])) != HIR_OK) snprintf(w->error, sizeof w->error, "%s", w->ranks[i].comm.error);
  }
  if (s == HIR_OK && !hir_nccl__world_twins(w, nranks, w->error, sizeof w->error)) s = HIR_ERR_COMM;
  w->n = s == HIR_OK ? nranks : 0;
  free(comms);
  /* the copy engines' block, in pinned memory every GPU maps; without it
     hir_nccl_world_set_copy_engine leaves send/recv on NCCL */
  if (s == HIR_OK && nranks > 1 && cudaHostAlloc((void **)&w->block, hir_nccl__ce_bytes(nranks),
                                                 cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess) {
    char why[256];
    memset(w->block, 0, hir_nccl__ce_bytes(nranks));
    ((hir_nccl__ce_head *)w->block)->magic = HIR_NCCL__CE_MAGIC;
    ((hir_nccl__ce_head *)w->block)->nlocal = nranks;
    for (i = 0; i < nranks; i++) {
      hir_nccl__ce *ce = &w->ranks[i].ce;
      int k;
      cudaSetDevice(i);
      if (!(ce->local = (int *)malloc((size_t)nranks * sizeof(int))) || !hir_nccl__ce_attach(ce, w->block, 0, nranks, i, why, sizeof why)) {
        snprintf(w->error, sizeof w->error, "hir_nccl_world_create: copy engines unavailable: %s", ce->local ? why : "out of memory");
        break;
      }
      for (k = 0; k < nranks; k++) ce->local[k] = k;
    }
  }
  if (s == HIR_OK && nranks > 1) hir_nccl__kc_world(w);
  if (s == HIR_OK && nranks > 1 && w->ranks[0].kc.on && (s = hir_spmd(nranks, hir_nccl__kc_measure_rank, w)) != HIR_OK)
    for (i = 0; i < nranks && !w->error[0]; i++) snprintf(w->error, sizeof w->error, "%s", w->ranks[i].comm.error);
  cudaGetLastError();
  return s;
}

HIRDEF hir_comm *hir_nccl_world_comm(hir_nccl_world *w, int rank) {
  return (w && rank >= 0 && rank < w->n) ? &w->ranks[rank].comm : NULL;
}
HIRDEF const char *hir_nccl_world_error(const hir_nccl_world *w) { return w ? w->error : "hir_nccl_world: NULL"; }

/* Direct peer copies where the GPUs can reach each other (else CUDA stages
   them through the host, still off the SMs). */
HIRDEF void hir_nccl_world_set_copy_engine(hir_nccl_world *w, int enable) {
  int i, ready = 1;
  if (!w || !w->n) return;
  for (i = 0; i < w->n; i++) ready &= w->ranks[i].ce.stream != NULL;
  enable = enable && ready && w->n > 1;
  if (enable) hir_nccl__world_peers(w);
  w->peer_access |= enable != 0;
  for (i = 0; i < w->n; i++) hir_nccl__set_copy_engine(&w->ranks[i].comm, enable);
}

HIRDEF void hir_nccl_world_free(hir_nccl_world *w) {
  int i;
  if (!w) return;
  for (i = 0; i < w->n; i++) {
    cudaSetDevice(w->ranks[i].device);
    hir_nccl__release(&w->ranks[i]);
  }
  if (w->block) cudaFreeHost(w->block);
  free(w->ranks);
  hir_nccl__free_team_ids(w);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

static const char *hir_nccl__getenv(void *user, const char *name) {
  (void)user;
  return getenv(name);
}

HIRDEF hir_status hir_nccl_env_read(hir_nccl_env *env, char *error, size_t cap) {
  char scratch[8];
  int visible = 0;
  if (!env) return HIR_ERR_INVALID;
  if (!error || !cap) error = scratch, cap = sizeof scratch;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) {
    cudaGetLastError();
    visible = 0;
  }
  return hir_nccl__env_parse(hir_nccl__getenv, NULL, visible, env, error, cap);
}

HIRDEF hir_status hir_nccl_comm_create(const hir_nccl_env *env, int timeout_ms, hir_comm **out) {
  hir_nccl__rank *nc;
  ncclUniqueId id;
  hir_status s;
  double deadline;
  if (!env || !out) return HIR_ERR_INVALID;
  if (!(nc = (hir_nccl__rank *)malloc(sizeof *nc))) return HIR_ERR_NOMEM;
  hir_nccl__init(nc, env->rank, env->size, env->gpu);
  *out = &nc->comm;
  if (timeout_ms > 0) nc->timeout_ms = timeout_ms;
  deadline = hir_nccl__wall_ms() + nc->timeout_ms;
  nc->store.wake[0] = nc->store.wake[1] = -1;
  if (env->size < 1 || env->rank < 0 || env->rank >= env->size) {
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create: rank %d of a world of %d", env->rank, env->size);
    return HIR_ERR_INVALID;
  }
  if (!env->secret[0] || !memchr(env->secret, 0, sizeof env->secret)) {
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create: env->secret is %s; fill it with hir_nccl_env_read, or "
             "give every rank the same secret of 1 to 255 characters", env->secret[0] ? "not NUL-terminated" : "empty");
    return HIR_ERR_INVALID;
  }
  if ((s = hir_nccl__check_switches(nc->comm.error, sizeof nc->comm.error)) != HIR_OK) return s;
  if (env->gpu < 0 || cudaSetDevice(env->gpu) != cudaSuccess) {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
    cudaGetLastError();
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create: rank %d cannot use GPU %d: %d visible (%s)",
             env->rank, env->gpu, visible, env->origin);
    return HIR_ERR_INVALID;
  }
  if ((s = hir_nccl__store_open(&nc->store, env->master_addr, env->master_port, env->secret, deadline, nc->comm.error,
                                sizeof nc->comm.error)) != HIR_OK ||
      (env->rank == 0 &&
       (s = hir_nccl__store_serve_start(&nc->store, env->spans_hosts, nc->comm.error, sizeof nc->comm.error)) != HIR_OK))
    return s;
  if (env->rank == 0) {
    if ((s = HIR_NCCL__CHECK(&nc->comm, ncclGetUniqueId(&id))) != HIR_OK ||
        (s = hir_nccl__store_call(&nc->store, 'S', "world", &id, sizeof id, deadline, nc->comm.error, sizeof nc->comm.error)) !=
            HIR_OK)
      return s;
  } else if ((s = hir_nccl__store_call(&nc->store, 'G', "world", &id, sizeof id, deadline, nc->comm.error,
                                       sizeof nc->comm.error)) != HIR_OK) {
    size_t n = strlen(nc->comm.error);
    snprintf(nc->comm.error + n, sizeof nc->comm.error - n, " [%s]", env->origin);
    return s;
  }
  snprintf(nc->how, sizeof nc->how, "one process per GPU (%.280s)%s", env->origin,
           env->weak_secret ? "; the bootstrap's secret is WEAK (the launcher names no job: the size and port alone, which "
                              "other users of these hosts can guess): set HOSTIR_SECRET to one random string on every rank" : "");
  if ((s = hir_nccl__init_comm(&nc->comm, &nc->world, env->size, id, env->rank)) != HIR_OK) return s;
  return hir_nccl__join(nc);
}

HIRDEF hir_status hir_nccl_comm_create_from_id(int rank, int size, int local_rank, const ncclUniqueId *id, int timeout_ms,
                                               hir_comm **out) {
  hir_nccl__rank *nc;
  hir_status s;
  int visible = 0, gpu;
  if (!id || !out) return HIR_ERR_INVALID;
  if (!(nc = (hir_nccl__rank *)malloc(sizeof *nc))) return HIR_ERR_NOMEM;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  cudaGetLastError();
  gpu = visible == 1 ? 0 : local_rank;
  hir_nccl__init(nc, rank, size, gpu);
  *out = &nc->comm;
  if (timeout_ms > 0) nc->timeout_ms = timeout_ms;
  nc->store.wake[0] = nc->store.wake[1] = -1;
  if (size < 1 || rank < 0 || rank >= size) {
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create_from_id: rank %d of a world of %d", rank, size);
    return HIR_ERR_INVALID;
  }
  if ((s = hir_nccl__check_switches(nc->comm.error, sizeof nc->comm.error)) != HIR_OK) return s;
  if (gpu < 0 || gpu >= visible || cudaSetDevice(gpu) != cudaSuccess) {
    cudaGetLastError();
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_create_from_id: rank %d (local rank %d) has no GPU of its "
             "own: %d visible; start at most one rank per GPU on a host", rank, local_rank, visible);
    return HIR_ERR_INVALID;
  }
  snprintf(nc->how, sizeof nc->how, "one process per GPU, from the caller's NCCL id");
  if ((s = hir_nccl__init_comm(&nc->comm, &nc->world, size, *id, rank)) != HIR_OK) return s;
  return hir_nccl__join(nc);
}

HIRDEF hir_status hir_nccl_comm_from_nccl(ncclComm_t comm, int timeout_ms, hir_comm **out) {
  hir_nccl__rank *nc;
  int rank = -1, size = 0, device = -1;
  if (!out) return HIR_ERR_INVALID;
  if (!(nc = (hir_nccl__rank *)malloc(sizeof *nc))) return HIR_ERR_NOMEM;
  hir_nccl__init(nc, 0, 1, -1);
  *out = &nc->comm;
  nc->store.wake[0] = nc->store.wake[1] = -1;
  if (!comm || ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess ||
      ncclCommCuDevice(comm, &device) != ncclSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    snprintf(nc->comm.error, sizeof nc->comm.error, "hir_nccl_comm_from_nccl: %s is not a usable NCCL communicator",
             comm ? "the one passed" : "NULL");
    return HIR_ERR_INVALID;
  }
  hir_nccl__init(nc, rank, size, device);
  if (timeout_ms > 0) nc->timeout_ms = timeout_ms;
  nc->store.wake[0] = nc->store.wake[1] = -1;
  if (hir_nccl__check_switches(nc->comm.error, sizeof nc->comm.error) != HIR_OK) return HIR_ERR_INVALID;
  nc->world = comm;
  nc->borrowed = 1;
  snprintf(nc->how, sizeof nc->how, "on the caller's NCCL communicator");
  return hir_nccl__join(nc);
}

HIRDEF hir_status hir_nccl_comm_set_copy_engine(hir_comm *c, int enable) {
  if (!c) return HIR_ERR_INVALID;
  if (hir_nccl__of(c)->shared) {
    snprintf(c->error, sizeof c->error, "hir_nccl_comm_set_copy_engine: rank %d belongs to a threaded world: use "
             "hir_nccl_world_set_copy_engine", c->rank);
    return HIR_ERR_INVALID;
  }
  return hir_nccl__set_copy_engine(c, enable);
}

HIRDEF int hir_nccl_comm_blocking(hir_comm *c) { return c && hir_nccl__of(c)->twins; }

HIRDEF hir_status hir_nccl_comm_set_path(hir_comm *c, hir_nccl_path path, int ctas) {
  hir_nccl__rank *nc;
  if (!c) return HIR_ERR_INVALID;
  nc = hir_nccl__of(c);
  if ((int)path < HIR_NCCL_PATH_AUTO || (int)path > HIR_NCCL_PATH_TWO_SHOT || ctas < 0 || ctas > HIR_NCCL__KC_CTAS) {
    snprintf(c->error, sizeof c->error, "hir_nccl_comm_set_path: path %d and ctas %d: use a hir_nccl_path, and 0 to %d CTAs",
             (int)path, ctas, HIR_NCCL__KC_CTAS);
    return HIR_ERR_INVALID;
  }
  if (!nc->kc.on && path != HIR_NCCL_PATH_AUTO && path != HIR_NCCL_PATH_NCCL) {
    snprintf(c->error, sizeof c->error, "hir_nccl_comm_set_path: rank %d has no kernel collectives: %s", c->rank, nc->kc_why);
    return HIR_ERR_UNSUPPORTED;
  }
  nc->path = path;
  nc->kc.cap = ctas;
  return HIR_OK;
}

HIRDEF const char *hir_nccl_comm_describe(hir_comm *c) {
  hir_nccl__rank *nc;
  char kernels[700];
  if (!c) return "hir_nccl_comm_describe: NULL";
  nc = hir_nccl__of(c);
  if (!nc->kc.on) snprintf(kernels, sizeof kernels, "on NCCL: %.150s", nc->kc_why);
  else if (nc->path != HIR_NCCL_PATH_AUTO && nc->kc.cap)
    snprintf(kernels, sizeof kernels, "on %s (hir_nccl_comm_set_path), on %d CTAs", nc->path == HIR_NCCL_PATH_NCCL ? "NCCL"
             : nc->path == HIR_NCCL_PATH_ONE_SHOT ? "hostir's one-shot kernels" : "hostir's two-shot kernels", nc->kc.cap);
  else if (nc->path != HIR_NCCL_PATH_AUTO)
    snprintf(kernels, sizeof kernels, "on %s (hir_nccl_comm_set_path)", nc->path == HIR_NCCL_PATH_NCCL ? "NCCL"
             : nc->path == HIR_NCCL_PATH_ONE_SHOT ? "hostir's one-shot kernels" : "hostir's two-shot kernels");
  else {
    int k, at = snprintf(kernels, sizeof kernels, "by size, %s: ", nc->kc.measured == 2 ? "as saved with the tuner's plans"
                         : nc->kc.measured ? "as measured at creation" : "by a fixed rule");
    for (k = 0; k < HIR_NCCL__KC_KINDS; k++)
      if (k != HIR_NCCL__AR_TWO && at < (int)sizeof kernels)
        at += hir_nccl__kc_say(&nc->kc, k, kernels + at, sizeof kernels - (size_t)at);
    if (nc->kc.cap && at < (int)sizeof kernels) snprintf(kernels + at, sizeof kernels - (size_t)at, " (at most %d CTAs)", nc->kc.cap);
  }
  snprintf(nc->description, sizeof nc->description, "hostir_nccl: rank %d of %d on GPU %d, %s; send/recv within a host on %s; "
           "NCCL's calls %s; collectives %s", c->rank, c->size, nc->device, nc->how[0] ? nc->how : "not joined",
           c->p2p_copy_engine ? "copy engines" : "NCCL's kernels",
           nc->borrowed ? "on the caller's communicator" : nc->twins ? "on blocking twins, watched" : "nonblocking", kernels);
  return nc->description;
}

HIRDEF void hir_nccl_comm_free(hir_comm *c) {
  hir_nccl__rank *nc;
  if (!c) return;
  nc = hir_nccl__of(c);
  cudaSetDevice(nc->device);
  hir_nccl__release(nc);
  hir_nccl__store_close(&nc->store);
  free(nc);
}

#endif /* HOSTIR_NCCL_IMPLEMENTATION_DONE */
#endif /* HOSTIR_NCCL_IMPLEMENTATION */
