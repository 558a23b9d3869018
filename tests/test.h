/* The test harness, shared by every test file and by the GPU suite (tests/gpu):
   CHECK records a failure and goes on; TEST defines and registers a test in
   one place (a GCC/Clang constructor runs the registration before main);
   host tensors, the SPMD harness that runs a program on every rank of a
   platform against a reference, and reference computations. Each test file
   includes this and compiles on its own after hostir.h's implementation. */
#ifndef HIR_TEST_H
#define HIR_TEST_H
#include "../hostir.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hir_test_failures; /* failures of the running test */

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      hir_test_failures++;                                                       \
    }                                                                            \
  } while (0)

#define CHECK_STR(got, want)                                                           \
  do {                                                                                 \
    const char *g_ = (got), *w_ = (want);                                              \
    if (strcmp(g_, w_) != 0) {                                                         \
      fprintf(stderr, "  %s:%d: got  \"%s\"\n  %*s want \"%s\"\n", __FILE__, __LINE__, g_, \
              (int)strlen(__FILE__) + 6, "", w_);                                      \
      hir_test_failures++;                                                             \
    }                                                                                  \
  } while (0)

#ifndef HIR_TEST_DIR
#define HIR_TEST_DIR "tests"
#endif

/* ---- registration ---- */
/* Where a test runs (TEST's third argument, a mask). */
enum {
  TEST_CPU = 1,         /* make test: the CPU backend and the local world */
  TEST_GPU_WORLDS = 2,  /* the GPU suite too, on its worlds of threads and of processes */
  TEST_GPU = 4,         /* the GPU suite, one process, before its worlds */
  TEST_GPU_THREADS = 8  /* the GPU suite's world of threads only */
};
typedef struct hir_test {
  const char *name;
  void (*fn)(void);
  unsigned where;
  int order;            /* registration in definition order (__COUNTER__) */
} hir_test;

static hir_test hir_tests[256];
static int hir_ntests, hir_tests_lost; /* lost: registered past the table's end (the runners fail) */

static void hir_test_register(const char *name, void (*fn)(void), unsigned where, int order) {
  int i = hir_ntests;
  if (hir_ntests == (int)(sizeof hir_tests / sizeof hir_tests[0])) {
    hir_tests_lost++;
    return;
  }
  for (; i > 0 && hir_tests[i - 1].order > order; i--) hir_tests[i] = hir_tests[i - 1];
  hir_tests[i].name = name;
  hir_tests[i].fn = fn;
  hir_tests[i].where = where;
  hir_tests[i].order = order;
  hir_ntests++;
}

#define TEST(fn, name, where)                                                                    \
  static void fn(void);                                                                          \
  __attribute__((constructor)) static void fn##_register(void) { hir_test_register(name, fn, where, __COUNTER__); } \
  static void fn(void)


/* ---- host tensors ---- */
static hir_tensor tn(hir_dtype dt, int nd, const int64_t *sizes) {
  hir_tensor t;
  int i;
  int64_t n = 1;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.ndims = nd;
  for (i = 0; i < nd; i++) n *= (t.sizes[i] = sizes[i]);
  t.data = calloc((size_t)(n ? n : 1), hir_dtype_size(dt));
  return t;
}
static int64_t tnumel(const hir_tensor *t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->ndims; i++) n *= t->sizes[i];
  return n;
}
static double tget(const hir_tensor *t, int64_t i) {
  switch (t->dtype) {
  case HIR_F32: return ((float *)t->data)[i];
  case HIR_F64: return ((double *)t->data)[i];
  case HIR_F16: return hir_half_to_float(((uint16_t *)t->data)[i]);
  case HIR_F8E4M3: return hir_e4m3_to_float(((uint8_t *)t->data)[i]);
  case HIR_F8E5M2: return hir_e5m2_to_float(((uint8_t *)t->data)[i]);
  case HIR_I64: return (double)((int64_t *)t->data)[i];
  default: return hir_bf16_to_float(((uint16_t *)t->data)[i]);
  }
}
static void tset(hir_tensor *t, int64_t i, double v) {
  switch (t->dtype) {
  case HIR_F32: ((float *)t->data)[i] = (float)v; break;
  case HIR_F64: ((double *)t->data)[i] = v; break;
  case HIR_F16: ((uint16_t *)t->data)[i] = hir_float_to_half((float)v); break;
  case HIR_F8E4M3: ((uint8_t *)t->data)[i] = hir_float_to_e4m3((float)v); break;
  case HIR_F8E5M2: ((uint8_t *)t->data)[i] = hir_float_to_e5m2((float)v); break;
  case HIR_I64: ((int64_t *)t->data)[i] = v != v || v < -9.2e18 ? INT64_MIN : v > 9.2e18 ? INT64_MAX : (int64_t)v; break;
  default: ((uint16_t *)t->data)[i] = hir_float_to_bf16((float)v); break;
  }
}
/* Element si of src into element di of dst, of one dtype: its bytes, exact for every dtype. */
static void tmove(hir_tensor *dst, int64_t di, const hir_tensor *src, int64_t si) {
  size_t es = hir_dtype_size(dst->dtype);
  memcpy((char *)dst->data + (size_t)di * es, (const char *)src->data + (size_t)si * es, es);
}
static unsigned test_seed = 12345u;
static double urand(void) { /* in [-1, 1], never near 0 */
  double v;
  do {
    test_seed = test_seed * 1103515245u + 12345u;
    v = ((double)((test_seed >> 8) & 0xffff) / 32768.0) - 1.0;
  } while (v > -0.05 && v < 0.05);
  return v;
}
static hir_tensor trand(hir_dtype dt, int nd, const int64_t *sizes) {
  hir_tensor t = tn(dt, nd, sizes);
  int64_t i;
  for (i = 0; i < tnumel(&t); i++) tset(&t, i, urand());
  return t;
}
static void tfree(hir_tensor *t) {
  free(t->data);
  t->data = NULL;
}
/* Row-major index of `idx` in t. */
static int64_t toff(const hir_tensor *t, const int64_t *idx) {
  int64_t off = 0;
  int d;
  for (d = 0; d < t->ndims; d++) off = off * t->sizes[d] + idx[d];
  return off;
}
static int tnext(const hir_tensor *t, int64_t *idx) {
  int d;
  for (d = t->ndims - 1; d >= 0; d--) {
    if (++idx[d] < t->sizes[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}

/* Where `device` sits along the mesh axis of parallel type pt (DIDx: its
   column, DIDy: its row; -1: not in the mesh), and how many devices split
   an axis of that type (*count; 0: pt is no mesh axis). */
static int mesh_pos(const hir_tv *tv, hir_ptype pt, int device, int *count) {
  int n, i, p = -1, cols = hir_tv_mesh_cols(tv);
  const int *mesh = hir_tv_mesh(tv, &n);
  for (i = 0; i < n; i++)
    if (mesh[i] == device) p = i;
  if (!cols) cols = n > 0 ? n : 1;
  *count = pt == HIR_DIDX ? n : 0;
  if (pt == HIR_DIDX && hir_tv_mesh_cols(tv)) *count = cols;
  if (pt == HIR_DIDY) *count = n / cols;
  return p < 0 ? -1 : pt == HIR_DIDY ? p / cols : p % cols;
}

/* Axis a of tv is split across devices: *pos is device's slice, *count how many. */
static int split_on(const hir_tv *tv, int a, int device, int *pos, int *count) {
  *pos = mesh_pos(tv, hir_tv_ptype(tv, a), device, count);
  return hir_tv_iter_type(tv, a) == HIR_ITERATION && *count > 1;
}

/* The local part of `full` (tv's logical axes) where tv has split axes: a
   split axis's parts are a mixed radix of its index, a DIDx (DIDy) part
   fixed at the device's position along its mesh axis (extents: DIDx the
   mesh axis's size, fixed parts theirs, the other what is left). */
static hir_tensor shard_split(const hir_tensor *full, const hir_tv *tv, int device) {
  int nmesh, i, a, nl = hir_tv_logical_ndims(tv), nparts = 0;
  const int *mesh = hir_tv_mesh(tv, &nmesh);
  int64_t sz[HIR_MAX_DIMS], glob[HIR_MAX_DIMS], loc[HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0};
  int part_of[HIR_MAX_DIMS], didx[HIR_MAX_DIMS], pos[HIR_MAX_DIMS], count, here = hir_team_index(mesh, nmesh, device) >= 0;
  hir_tensor t;
  for (i = 0; i < nl; i++) sz[i] = 1;
  for (a = 0; a < hir_tv_ndims(tv); a++) { /* the parts, in order, with their extents */
    const hir_val *x = hir_tv_extent(tv, a);
    if (hir_tv_iter_type(tv, a) == HIR_REDUCTION) continue;
    part_of[nparts] = hir_tv_logical_axis(tv, a);
    didx[nparts] = split_on(tv, a, device, &pos[nparts], &count);
    glob[nparts] = didx[nparts] ? count : x->kind == HIR__VAL_CONST ? x->value : -1;
    nparts++;
  }
  for (i = 0; i < nparts; i++)
    if (glob[i] < 0) { /* the part left: the axis over the others */
      int64_t others = 1;
      int j;
      for (j = 0; j < nparts; j++)
        if (j != i && part_of[j] == part_of[i]) others *= glob[j];
      glob[i] = full->sizes[part_of[i]] / others;
    }
  for (i = 0; i < nparts; i++) sz[part_of[i]] *= (loc[i] = didx[i] ? 1 : glob[i]);
  t = *full;
  t.ndims = nl;
  memcpy(t.sizes, sz, sizeof sz);
  if (nmesh && !here) {
    t.data = NULL;
    return t;
  }
  t = tn(full->dtype, nl, sz);
  if (tnumel(&t) == 0) return t;
  do { /* local logical index -> parts -> global logical index */
    int64_t src[HIR_MAX_DIMS], rem[HIR_MAX_DIMS], part_idx[HIR_MAX_DIMS];
    memcpy(rem, idx, sizeof rem);
    for (i = nparts - 1; i >= 0; i--) {
      part_idx[i] = rem[part_of[i]] % loc[i];
      rem[part_of[i]] /= loc[i];
      if (didx[i]) part_idx[i] = pos[i];
    }
    for (i = 0; i < nl; i++) src[i] = 0;
    for (i = 0; i < nparts; i++) src[part_of[i]] = src[part_of[i]] * glob[i] + part_idx[i];
    tmove(&t, toff(&t, idx), full, toff(full, src));
  } while (tnext(&t, idx));
  return t;
}

/* The local shard of `full` (the global tensor of tv's data axes) on `device`:
   a copy of the device's slice along each DIDx and DIDy axis (size 1 kept),
   the whole tensor when unsharded, shape-only (data NULL) when tv does not
   live there. */
static hir_tensor shard(const hir_tensor *full, const hir_tv *tv, int device) {
  int nmesh, i, k = 0, count, pos[HIR_MAX_DIMS], split[HIR_MAX_DIMS] = {0};
  const int *mesh = hir_tv_mesh(tv, &nmesh);
  hir_tensor t;
  int64_t idx[HIR_MAX_DIMS] = {0};
  if (tv->scalar) return *full; /* a scalar input: by value, on every rank */
  if (hir_tv_logical_ndims(tv)) return shard_split(full, tv, device);
  t = *full;
  for (i = 0; i < hir_tv_ndims(tv); i++) { /* in loop order (hir_reorder): each axis says which data axis it is */
    int d = hir_tv_logical_axis(tv, i);
    if (hir_tv_iter_type(tv, i) == HIR_REDUCTION) continue;
    if ((split[d] = split_on(tv, i, device, &pos[d], &count))) t.sizes[d] = 1;
    k++;
  }
  if (nmesh && hir_team_index(mesh, nmesh, device) < 0) { /* lives elsewhere: shape only */
    t.data = NULL;
    return t;
  }
  t = tn(full->dtype, full->ndims, t.sizes);
  if (tnumel(&t) == 0) return t;
  do {
    int64_t src[HIR_MAX_DIMS];
    memcpy(src, idx, sizeof src);
    for (i = 0; i < k; i++)
      if (split[i]) src[i] = pos[i];
    tmove(&t, toff(&t, idx), full, toff(full, src));
  } while (tnext(&t, idx));
  return t;
}

/* ---- the SPMD harness ---- */
#define MAXR 8
#define MAXT 16

/* Where the ranks run: the CPU and the local world by default; the GPU tests
   plug in CUDA and NCCL (threads, or one process per GPU) and run the same
   cases. */
typedef struct test_platform {
  const char *name;
  int min_world, max_world;            /* cases of other sizes are skipped */
  void *(*world_create)(int n);
  void (*world_free)(void *w);
  hir_comm *(*comm)(void *w, int rank);
  hir_backend *(*backend)(int rank);   /* NULL: the evaluator's own CPU backend */
  hir_status (*run)(int n, hir_status (*fn)(int rank, void *user), void *user);
  int p2p_only;                        /* its communicator has send/recv and an allgather, no other collective */
  int graph;                           /* evaluators in graph mode (hir_eval_desc.graph): runs captured, replayed, inputs
                                          moved (mode 1: unless the program communicates; it stays where captured) */
} test_platform;

static void *cpu_world_create(int n) {
  hir_local_world *w = hir_local_world_create(n);
  hir_local_world_set_timeout(w, 20000);
  return w;
}
static void cpu_world_free(void *w) { hir_local_world_free((hir_local_world *)w); }
static hir_comm *cpu_comm(void *w, int rank) { return hir_local_comm((hir_local_world *)w, rank); }
static const test_platform cpu_platform = {"cpu", 1, 1 << 20, cpu_world_create, cpu_world_free, cpu_comm, NULL, hir_spmd, 0, 0};
static const test_platform *platform = &cpu_platform;

/* A host tensor's copy in the backend's memory, or the tensor itself. */
static hir_tensor to_backend(hir_backend *b, const hir_tensor *t) {
  hir_tensor d = *t;
  size_t bytes = (size_t)tnumel(t) * hir_dtype_size(t->dtype);
  if (!b || b->host_memory || !t->data) return d;
  if (b->alloc(b, bytes, &d.data) != HIR_OK || b->upload(b, d.data, t->data, bytes) != HIR_OK) d.data = NULL;
  return d;
}
static void backend_free(hir_backend *b, const hir_tensor *host, hir_tensor *d) {
  if (b && !b->host_memory && d->data && d->data != host->data) b->release(b, d->data);
}
/* A host copy of a tensor in the backend's memory. */
static hir_tensor to_host(hir_backend *b, const hir_tensor *d) {
  hir_tensor h;
  if (!b || b->host_memory || !d->data) return *d;
  h = tn(d->dtype, d->ndims, d->sizes);
  b->download(b, h.data, d->data, (size_t)tnumel(&h) * hir_dtype_size(h.dtype));
  memcpy(h.strides, d->strides, sizeof h.strides); /* the same bytes */
  return h;
}

/* Row-major index i of t's sizes, at t's strides. */
static int64_t tstrided(const hir_tensor *t, int64_t i) {
  int64_t off = 0;
  int a;
  for (a = t->ndims - 1; a >= 0; a--) {
    off += (t->sizes[a] ? i % t->sizes[a] : 0) * t->strides[a];
    i = t->sizes[a] ? i / t->sizes[a] : 0;
  }
  return off;
}
/* t's values with its axes laid out in reverse order (a matrix column-major):
   another layout of the same tensor, dense in memory. */
static hir_tensor trev(const hir_tensor *t) {
  hir_tensor r;
  int64_t i, s = 1;
  int a;
  if (!t->data) return *t;
  r = tn(t->dtype, t->ndims, t->sizes);
  for (a = 0; a < t->ndims; a++) r.strides[a] = s, s *= t->sizes[a];
  for (i = 0; i < tnumel(t); i++) tmove(&r, tstrided(&r, i), t, i);
  return r;
}
/* A row-major copy of t (any strides; all 0: row-major already). */
static hir_tensor tdense(const hir_tensor *t) {
  hir_tensor d = tn(t->dtype, t->ndims, t->sizes);
  int64_t i;
  int a, zero = 1;
  for (a = 0; a < t->ndims; a++) zero &= t->strides[a] == 0;
  for (i = 0; i < tnumel(t); i++) tmove(&d, i, t, zero ? i : tstrided(t, i));
  return d;
}

/* An output the evaluator owns, poisoned after a run's check: the next run
   must write it again (a graph replay that copied nothing is caught). Only
   where its elements are its first numel ones and no input shares them. */
static void tpoison_owned(hir_backend *b, const hir_tensor *t, const hir_tensor *din, int nin) {
  size_t bytes = (size_t)tnumel(t) * hir_dtype_size(t->dtype);
  int64_t k, s = 1;
  int a, i, contiguous = 1, zero = 1;
  hir_tensor pz;
  for (a = t->ndims - 1; a >= 0; a--) zero &= t->strides[a] == 0, contiguous &= t->sizes[a] == 1 || t->strides[a] == s, s *= t->sizes[a];
  if (!t->data || !bytes || !(zero || contiguous)) return;
  for (i = 0; i < nin; i++) {
    const char *lo = (const char *)din[i].data, *at = (const char *)t->data;
    if (lo && at + bytes > lo && at < lo + (size_t)tnumel(&din[i]) * hir_dtype_size(din[i].dtype)) return;
  }
  pz = tn(t->dtype, t->ndims, t->sizes);
  for (k = 0; k < tnumel(&pz); k++) tset(&pz, k, 1e30);
  if (!b || b->host_memory) memcpy(t->data, pz.data, bytes);
  else b->upload(b, t->data, pz.data, bytes);
  tfree(&pz);
}

typedef hir_program *(*build_fn)(void *user, int rank);
typedef struct spmd_case {
  int world, nstreams, prealloc, nin, nout;
  int layout;                       /* the ranks' inputs (and preallocated outputs) in reversed axis order (trev);
                                       set before RUN_CASE: the case runs both ways on every platform */
  double tol;
  build_fn build;
  void *user;
  hir_tensor in[MAXT], out[MAXT];  /* global (unsharded) */
  void *w;
  char err[MAXR][600];
} spmd_case;

/* g within bound of w, where w is finite; else the same infinity, or NaN
   where NaN is due (a mean of nothing). A bound relative to an infinite w
   would take any g. */
static int close_enough(double g, double w, double bound) {
  if (isnan(g) || isnan(w)) return isnan(g) && isnan(w);
  if (isinf(g) || isinf(w)) return g == w;
  return fabs(g - w) <= bound;
}

static int compare(const hir_tensor *got, const hir_tensor *want, double tol, char *err, size_t cap, const char *what) {
  int64_t i;
  if (got->ndims != want->ndims || memcmp(got->sizes, want->sizes, (size_t)got->ndims * sizeof(int64_t)) != 0) {
    char gs[128] = "", ws[128] = "";
    int a;
    for (a = 0; a < got->ndims; a++) snprintf(gs + strlen(gs), sizeof gs - strlen(gs), "%s%lld", a ? "," : "", (long long)got->sizes[a]);
    for (a = 0; a < want->ndims; a++) snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%s%lld", a ? "," : "", (long long)want->sizes[a]);
    snprintf(err, cap, "%s: shape [%s], want [%s]", what, gs, ws);
    return 0;
  }
  if (!got->data) {
    snprintf(err, cap, "%s: no data", what);
    return 0;
  }
  for (i = 0; got->dtype == HIR_I64 && want->dtype == HIR_I64 && i < tnumel(want); i++) /* exactly */
    if (((int64_t *)got->data)[i] != ((int64_t *)want->data)[i]) {
      snprintf(err, cap, "%s: element %lld is %lld, want %lld", what, (long long)i, (long long)((int64_t *)got->data)[i],
               (long long)((int64_t *)want->data)[i]);
      return 0;
    }
  for (i = 0; got->dtype != HIR_I64 && i < tnumel(want); i++) {
    double g = tget(got, i), w = tget(want, i);
    if (!close_enough(g, w, tol * (1.0 + fabs(w)))) {
      snprintf(err, cap, "%s: element %lld is %.6g, want %.6g", what, (long long)i, g, w);
      return 0;
    }
  }
  return 1;
}

/* A backend's layer_norm and rms_norm calls that succeed, counted
   (count_layer_norm wraps them; one backend at a time): whether the
   evaluator ran a norm's primitives as one call. */
static hir_status (*counted_layer_norm)(hir_backend *, void *, const hir_tensor *, const hir_tensor *, const hir_tensor *,
                                        const hir_tensor *, int, double);
static int layer_norm_calls;
static hir_status counting_layer_norm(hir_backend *b, void *s, const hir_tensor *d, const hir_tensor *x, const hir_tensor *w,
                                      const hir_tensor *bias, int naxes, double eps) {
  hir_status st = counted_layer_norm(b, s, d, x, w, bias, naxes, eps);
  layer_norm_calls += st == HIR_OK;
  return st;
}
static hir_status (*counted_rms_norm)(hir_backend *, void *, const hir_tensor *, const hir_tensor *, const hir_tensor *, int, double);
static int rms_norm_calls;
static hir_status counting_rms_norm(hir_backend *b, void *s, const hir_tensor *d, const hir_tensor *x, const hir_tensor *w, int naxes,
                                    double eps) {
  hir_status st = counted_rms_norm(b, s, d, x, w, naxes, eps);
  rms_norm_calls += st == HIR_OK;
  return st;
}
static void count_layer_norm(hir_backend *b) { /* and its rms_norm */
  counted_layer_norm = b->layer_norm;
  b->layer_norm = counting_layer_norm;
  counted_rms_norm = b->rms_norm;
  b->rms_norm = counting_rms_norm;
  layer_norm_calls = rms_norm_calls = 0;
}

/* Set by a test around its cases: called on each rank right before each
   run, and whether graph mode may end eager (a backend whose captures fail
   on purpose, tests/test_stream.c's stream/recv_at_start_untouched). */
static void (*spmd_before_run)(hir_evaluator *ev, int rank, int run);
static int spmd_graph_may_fall_back;

static hir_status spmd_rank(int rank, void *user) {
  spmd_case *c = (spmd_case *)user;
  char *err = c->err[rank];
  hir_program *p = c->build(c->user, rank);
  hir_evaluator *ev = NULL;
  hir_eval_desc d;
  hir_backend *b = platform->backend ? platform->backend(rank) : NULL;
  hir_tensor in[MAXT], din[MAXT], out[MAXT], poison[MAXT], want[MAXT], kept[MAXT];
  void *first_addr[MAXT] = {0};
  int keep_outputs;   /* graph mode 1, communicating: the outputs stay in the allocations captured (re-poisoned) */
  int i, run;
  memset(&d, 0, sizeof d);
  memset(in, 0, sizeof in);
  memset(din, 0, sizeof din);
  memset(poison, 0, sizeof poison);
  memset(want, 0, sizeof want);
  memset(kept, 0, sizeof kept);
  if (!p || hir_program_error(p)[0]) {
    snprintf(err, 600, "build: %s", p ? hir_program_error(p) : "NULL program");
    hir_program_free(p);
    hir_backend_free(b);
    return HIR_ERR_INVALID;
  }
  d.comm = platform->comm(c->w, rank);
  d.backend = b;
  d.number_of_streams = c->nstreams;
  d.timeout_ms = 60000;
  d.graph = platform->graph;
  if (hir_evaluator_create(p, &d, &ev) != HIR_OK) {
    snprintf(err, 600, "create: %s", hir_evaluator_error(ev));
    goto done;
  }
  for (i = 0; i < c->nin; i++) {
    in[i] = shard(&c->in[i], hir_program_input(p, i), rank);
    if (c->layout && in[i].data) {
      hir_tensor r = trev(&in[i]);
      tfree(&in[i]);
      in[i] = r;
    }
    din[i] = to_backend(b, &in[i]);
  }
  for (i = 0; i < c->nout; i++) want[i] = shard(&c->out[i], hir_program_output(p, i), rank);
  keep_outputs = platform->graph == 1 && ev->communicates && b && !b->host_memory;
  for (run = 0; run < (platform->graph ? 4 : 2); run++) { /* graphs: eager, captured, replayed, inputs moved */
    /* inputs moved before the last run; graph mode 1 keeps a communicating program where it was captured */
    for (i = 0; run == 3 && (!ev->communicates || platform->graph == 2) && i < c->nin; i++) {
      hir_tensor moved = to_backend(b, &in[i]);
      backend_free(b, &in[i], &din[i]);
      din[i] = moved;
    }
    for (i = 0; i < c->nout; i++) {
      memset(&out[i], 0, sizeof out[i]);
      if (c->prealloc && want[i].data) { /* preallocated and poisoned */
        int64_t k;
        poison[i] = tn(want[i].dtype, want[i].ndims, want[i].sizes);
        for (k = 0; k < tnumel(&poison[i]); k++) tset(&poison[i], k, 1e30);
        if (c->layout) {
          hir_tensor r = trev(&poison[i]);
          tfree(&poison[i]);
          poison[i] = r;
        }
        if (keep_outputs && kept[i].data)
          b->upload(b, kept[i].data, poison[i].data, (size_t)tnumel(&poison[i]) * hir_dtype_size(poison[i].dtype));
        else
          kept[i] = to_backend(b, &poison[i]);
        out[i] = kept[i];
      }
    }
    if (spmd_before_run) spmd_before_run(ev, rank, run);
    if (hir_run(ev, din, c->nin, out, c->nout) != HIR_OK || hir_evaluator_sync(ev) != HIR_OK) {
      snprintf(err, 600, "run %d: %s", run, hir_evaluator_error(ev));
      goto done;
    }
    for (i = 0; i < c->nout; i++) {
      char what[64];
      hir_tensor got = to_host(b, &out[i]), host = got;
      int ok = 1;
      snprintf(what, sizeof what, "rank %d run %d output %d", rank, run, i);
      if (!want[i].data) {
        if (out[i].data || out[i].ndims) snprintf(err, 600, "%s: should be empty here", what);
      } else {
        got = tdense(&host);
        ok = compare(&got, &want[i], c->tol, err, 600, what);
        tfree(&got);
      }
      if (host.data != out[i].data) tfree(&host);
      if (!c->prealloc && want[i].data) { /* evaluator-owned: same buffer every run */
        if (run == 0) first_addr[i] = out[i].data;
        else if (out[i].data != first_addr[i]) snprintf(err, 600, "%s: moved from %p to %p", what, first_addr[i], out[i].data);
        if (ok) tpoison_owned(b, &out[i], din, c->nin);
      }
      if (c->prealloc && want[i].data) {
        if (!keep_outputs) backend_free(b, &poison[i], &kept[i]), memset(&kept[i], 0, sizeof kept[i]);
        tfree(&poison[i]);
      }
      if (!ok) goto done;
    }
  }
  if (platform->graph && ev->communicates && !spmd_graph_may_fall_back &&
      strstr(hir_program_plan(p), "graph: eager")) /* no fallback hides a comm's */
    snprintf(err, 600, "graph mode ran eagerly: %.500s", hir_program_plan(p));
  else if (platform->graph == 2 && !strstr(hir_program_plan(p), "graph: eager") && ev->ngraphs != 1)
    snprintf(err, 600, "graph mode 2 (staged) captured %d graphs; its arguments' copies stay put: want 1", ev->ngraphs);
done:
  for (i = 0; i < c->nin; i++) {
    backend_free(b, &in[i], &din[i]);
    tfree(&in[i]);
  }
  for (i = 0; i < c->nout; i++) {
    if (kept[i].data) backend_free(b, &poison[i], &kept[i]);
    tfree(&want[i]);
    tfree(&poison[i]);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_backend_free(b);
  return err[0] ? HIR_ERR_INTERNAL : HIR_OK;
}

/* Runs the case on every rank; reports each rank's failure. Cases of a
   world size the platform cannot host are skipped. */
static int cases_run, cases_skipped;
static void run_case(spmd_case *c, const char *name, const char *file, int line) {
  int r, i;
  memset(c->err, 0, sizeof c->err);
  if (c->world < platform->min_world || c->world > platform->max_world) {
    cases_skipped++;
  } else {
    int layout, layouts = platform->backend && !c->layout ? 1 : 2; /* on the CPU (or where asked), again in another layout */
    for (layout = 0; layout < layouts; layout++) {
      c->layout = layout;
      cases_run++;
      c->w = platform->world_create(c->world);
      platform->run(c->world, spmd_rank, c);
      for (r = 0, i = 0; r < c->world; r++) /* every rank's: one rank's wrong number leaves the others waiting for it */
        if (c->err[r][0]) {
          fprintf(stderr, "  %s:%d: %s (%s, world %d, %d streams%s%s): rank %d: %s\n", file, line, name, platform->name, c->world,
                  c->nstreams, c->prealloc ? ", preallocated" : "", layout ? ", axes laid out in reverse" : "", r, c->err[r]);
          hir_test_failures += !i++;
        }
      platform->world_free(c->w);
      memset(c->err, 0, sizeof c->err);
    }
  }
  for (i = 0; i < c->nin; i++) tfree(&c->in[i]);
  for (i = 0; i < c->nout; i++) tfree(&c->out[i]);
}
#define RUN_CASE(c, name) run_case(c, name, __FILE__, __LINE__)

/* Runs the registered tests whose mask meets `where` and whose name holds
   `filter` (NULL: all), a line each: "ok" or "FAIL", the name, and with
   show_cases how many SPMD cases it ran. */
/* The test running now and since when (a watchdog may read them), and a
   count a long test without cases bumps as it goes (the watchdog's sign of
   progress). */
static const char *volatile hir_test_running;
static volatile int hir_test_serial, hir_test_steps;
/* A test that could not run here (a suite whose tools are missing) sets
   hir_test_skipped; the runner says "skip" and counts it in
   hir_tests_skipped, not among the passed. */
static int hir_test_skipped, hir_tests_skipped;
/* Part `hir_test_part` of `hir_test_parts` runs the tests whose place in the
   registry is that part modulo the count (a suite longer than one sitting is
   run in parts; the parts together are the whole). */
static int hir_test_part = 0, hir_test_parts = 1;

static void hir_run_tests(unsigned where, const char *filter, const char *prefix, int show_cases, int *passed, int *failed) {
  int i;
  for (i = 0; i < hir_ntests; i++) {
    const hir_test *t = &hir_tests[i];
    int before = cases_run;
    struct timespec t0, t1;
    if (!(t->where & where) || (filter && !strstr(t->name, filter)) || i % hir_test_parts != hir_test_part) continue;
    hir_test_failures = hir_test_skipped = 0;
    hir_test_running = t->name;
    hir_test_serial++;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    t->fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    hir_test_running = NULL;
    printf("%s%s %s", prefix, hir_test_failures ? "FAIL" : hir_test_skipped ? "skip" : "ok  ", t->name);
    if (show_cases) /* the seconds too: they decide how a long suite is cut into parts */
      printf(" (%d cases run, %.1f s)", cases_run - before, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    printf("\n");
    fflush(stdout);
    if (hir_test_failures) ++*failed; else if (hir_test_skipped) hir_tests_skipped++; else ++*passed;
  }
}


/* Lowering as the program builder: the fusion, lowered for each rank. */
static hir_program *build_lowered(void *user, int rank) {
  hir_lower_desc d;
  hir_program *p;
  memset(&d, 0, sizeof d);
  d.my_device = rank;
  hir_lower((const hir_fusion *)user, &d, &p);
  return p;
}

/* Lowering with the caller's desc (its my_device set to each rank). */
typedef struct lowered_case {
  const hir_fusion *f;
  hir_lower_desc d;
} lowered_case;

static hir_program *build_lowered_with(void *user, int rank) {
  lowered_case *lc = (lowered_case *)user;
  hir_lower_desc d = lc->d;
  hir_program *p;
  d.my_device = rank;
  hir_lower(lc->f, &d, &p);
  return p;
}

static void case_init(spmd_case *c, int world) {
  memset(c, 0, sizeof *c);
  c->world = world;
  c->nstreams = 2;
  c->tol = 1e-5;
}

/* A case of fusion f lowered for every rank. */
__attribute__((unused)) static void case_lowered(spmd_case *c, int world, const hir_fusion *f, int nin, int nout) {
  case_init(c, world);
  c->build = build_lowered;
  c->user = (void *)f;
  c->nin = nin;
  c->nout = nout;
}

__attribute__((unused)) static const hir_dtype all_dtypes[4] = {HIR_F32, HIR_F64, HIR_F16, HIR_BF16};

/* Philox-4x32-10's first word for counter `index` and key `seed`, its top
   `bits` as a fraction: hir_rand_value written apart from the library
   (ops/random checks it against Random123's known answer). */
__attribute__((unused)) static double ref_rand(uint64_t seed, uint64_t index, int bits) {
  static const uint32_t mul[2] = {0xD2511F53u, 0xCD9E8D57u}, bump[2] = {0x9E3779B9u, 0xBB67AE85u};
  uint32_t x[4], k[2], y[4];
  int round;
  x[0] = (uint32_t)index, x[1] = (uint32_t)(index >> 32), x[2] = x[3] = 0;
  k[0] = (uint32_t)seed, k[1] = (uint32_t)(seed >> 32);
  for (round = 0; round < 10; round++) {
    uint64_t lo = (uint64_t)mul[0] * x[0], hi = (uint64_t)mul[1] * x[2];
    y[0] = (uint32_t)(hi >> 32) ^ x[1] ^ k[0], y[1] = (uint32_t)hi, y[2] = (uint32_t)(lo >> 32) ^ x[3] ^ k[1], y[3] = (uint32_t)lo;
    memcpy(x, y, sizeof x);
    k[0] += bump[0], k[1] += bump[1];
  }
  return (double)(x[0] >> (32 - bits)) / (double)((uint64_t)1 << bits);
}

__attribute__((unused)) static hir_tensor tcopy(const hir_tensor *t) {
  hir_tensor c = tn(t->dtype, t->ndims, t->sizes);
  memcpy(c.data, t->data, (size_t)tnumel(t) * hir_dtype_size(t->dtype));
  return c;
}

/* One input, one output: runs f on the world of D against `want` (taken). */
__attribute__((unused)) static void run_one(hir_fusion *f, int D, hir_tensor in, hir_tensor want, int prealloc, const char *name,
                                            const char *file, int line) {
  spmd_case c;
  CHECK(hir_fusion_error(f)[0] == 0);
  case_lowered(&c, D, f, 1, 1);
  c.in[0] = in;
  c.out[0] = want;
  c.prealloc = prealloc;
  run_case(&c, name, file, line);
  hir_fusion_free(f);
}
#define RUN_ONE(f, D, in, want, prealloc, name) run_one(f, D, in, want, prealloc, name, __FILE__, __LINE__)

/* run_one where the lowering may refuse: then every device must refuse, with
   one message (returns 0); else the program runs against the reference. */
__attribute__((unused)) static int run_or_refused(hir_fusion *f, int D, hir_tensor in, hir_tensor want, int prealloc,
                                                  const char *name, const char *file, int line) {
  char first[512] = "";
  int dev, refused = 0;
  for (dev = 0; dev < D; dev++) {
    hir_lower_desc d;
    hir_program *p = NULL;
    memset(&d, 0, sizeof d);
    d.my_device = dev;
    if (hir_lower(f, &d, &p) != HIR_OK) {
      if (!refused++) snprintf(first, sizeof first, "%s", hir_program_error(p));
      else if (strcmp(first, hir_program_error(p)) != 0) {
        printf("  %s:%d: %s: device %d refused with another message: %s\n", file, line, name, dev, hir_program_error(p));
        CHECK(0);
      }
    }
    hir_program_free(p);
  }
  if (refused) {
    if (refused != D) printf("  %s:%d: %s: %d of %d devices refused (%s)\n", file, line, name, refused, D, first);
    CHECK(refused == D);
    tfree(&in);
    tfree(&want);
    hir_fusion_free(f);
    return 0;
  }
  run_one(f, D, in, want, prealloc, name, file, line);
  return 1;
}

__attribute__((unused)) static const int worlds[5] = {1, 2, 3, 4, 8};
__attribute__((unused)) static int iota_mesh[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};

/* ---- references ---- */
/* out[b..., m, n] = sum_k a[b..., m, k] * x[b..., k, n] for 3-D [B, M, K] x [B or 1, K, N] */
static hir_tensor ref_bmm(const hir_tensor *a, const hir_tensor *x, int b_broadcast) {
  int64_t B = a->sizes[0], M = a->sizes[1], K = a->sizes[2], N = x->sizes[x->ndims - 1], sz[3], i, m, n, k;
  hir_tensor o;
  sz[0] = B; sz[1] = M; sz[2] = N;
  o = tn(a->dtype, 3, sz);
  for (i = 0; i < B; i++)
    for (m = 0; m < M; m++)
      for (n = 0; n < N; n++) {
        double s = 0;
        for (k = 0; k < K; k++)
          s += tget(a, (i * M + m) * K + k) * tget(x, ((b_broadcast ? 0 : i) * K + k) * N + n);
        tset(&o, (i * M + m) * N + n, s);
      }
  return o;
}

/* ---- goldens and lowered text ---- */
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
static void check_golden(const char *got, const char *name, const char *file, int line) {
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
    fprintf(stderr, "  %s:%d: cannot read %s\n", file, line, path);
    hir_test_failures++;
    return;
  }
  for (g = got, w = want; *g && *g == *w; g++, w++)
    if (*g == '\n') lineno++;
  if (*g || *w) {
    const char *gl = g, *wl = w;
    while (gl > got && gl[-1] != '\n') gl--;
    while (wl > want && wl[-1] != '\n') wl--;
    fprintf(stderr, "  %s:%d: %s differs at line %d\n  got:  %.*s\n  want: %.*s\n", file, line, path, lineno,
            (int)strcspn(gl, "\n"), gl, (int)strcspn(wl, "\n"), wl);
    hir_test_failures++;
  }
  free(want);
}

/* The program text of f lowered for `device`, or "error: <status>: <message>". */
static char *lower_text(const hir_fusion *f, const hir_lower_desc *desc, int device) {
  hir_lower_desc d;
  hir_program *p;
  hir_status s;
  char *buf;
  size_t n;
  if (desc) d = *desc; else memset(&d, 0, sizeof d);
  d.my_device = device;
  s = hir_lower(f, &d, &p);
  if (s != HIR_OK) {
    n = strlen(hir_program_error(p)) + 64;
    buf = (char *)malloc(n);
    snprintf(buf, n, "error: %s: %s", hir_status_str(s), hir_program_error(p));
  } else {
    n = hir_program_snprint(p, NULL, 0);
    buf = (char *)malloc(n + 1);
    hir_program_snprint(p, buf, n + 1);
  }
  hir_program_free(p);
  return buf;
}

static void check_lower_golden(const hir_fusion *f, int device, const char *name, const char *file, int line) {
  char *text = lower_text(f, NULL, device);
  check_golden(text, name, file, line);
  free(text);
}
#define CHECK_LOWER_GOLDEN(f, dev, name) check_lower_golden(f, dev, name, __FILE__, __LINE__)

static void check_lower_error(const hir_fusion *f, int device, hir_status want, const char *needle, const char *file, int line) {
  char *text = lower_text(f, NULL, device);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "error: %s: ", hir_status_str(want));
  if (strncmp(text, prefix, strlen(prefix)) != 0 || !strstr(text, needle)) {
    fprintf(stderr, "  %s:%d: got \"%.300s\"; wanted %s with \"%s\"\n", file, line, text, hir_status_str(want), needle);
    hir_test_failures++;
  }
  free(text);
}
#define CHECK_LOWER_ERROR(f, dev, want, needle) check_lower_error(f, dev, want, needle, __FILE__, __LINE__)
#endif
