/* The differential check: random fusions - sets, binary ops (with broadcast
   axes), elementwise and tensor-scalar ops, random numbers, sums over one or two axes,
   selects, slices, reshapes, matmuls, layer_norm and rms_norm (one seed in
   71: a sum over a split axis, a residual added, an rms_norm, which the
   local world's fused call takes where the placements allow), split axes - on random meshes (1-D,
   and 2-D for one seed in seven) with random DIDx, DIDy and Stream axes and
   stream options, maybe an intermediate returned beside the result, lowered
   for every rank of a local world (by the seed, tuned by hir_tuner) and run
   on random data, against a plain reference computed here on the whole
   (unsharded) tensors. Every program either gives the reference's numbers
   on every rank, or is refused: by every rank's lowering, with one message,
   or by a run on every rank of the fusion's meshes, with a message that is
   neither an internal error nor a timeout. HIR_DIFF_PROGRAMS=N sets how many (make test: 300),
   HIR_DIFF_OFFSET=S the first seed (0; "fresh": one drawn from the clock,
   printed; CI and make diff run fresh ones); a failure prints its seed and
   the fusion, HIR_DIFF_SEED=S runs (and prints) only that program, HIR_DIFF_VERBOSE=1
   says why each refused program was refused. One program in 21 is bf16 or
   f16, one in 47 f64, one in 59 int64 (diff_dtype: HIR_DIFF_DTYPES=bf16,f16
   makes them all so). */
#include "seeds.h"
#include "test.h"

#define DIFF_MAX_TVS 10  /* a program's tensors; a long one's (one in 59, by the seed) DIFF_LONG_TVS */
#define DIFF_LONG_TVS 16

typedef struct diff_rng { uint64_t s; } diff_rng;
static int diff_next(diff_rng *r, int n) { /* uniform in [0, n) */
  r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
  return (int)((r->s >> 33) % (uint64_t)n);
}

/* A tensor of the program and its whole (unsharded) value, row-major. */
typedef struct diff_tv {
  hir_tv *tv;
  hir_dtype dt;                /* f32, or an fp8 input's */
  int nd;                      /* data axes */
  int64_t sizes[HIR_MAX_DIMS];
  double *v;
  double bound;                /* no value's magnitude exceeds it (low-precision programs' tolerances) */
  int inexact;                 /* bf16 or f16 values the op may round otherwise than the reference (diff_finish) */
  double arg_err;              /* f32/f64: how far a sine's value may be off, its argument's roundings (many ulps of a
                                  large argument, summed otherwise than the reference) carried through it */
} diff_tv;

/* Where programs run. NULL (make test): the local world's ranks on the
   evaluator's CPU backend. A GPU suite's: a backend a rank, and maybe a
   communicator of its own for each rank in place of the local world's. */
typedef struct diff_target {
  int min_world, max_world;            /* programs of other sizes are not run */
  hir_backend *backends[4];            /* a rank's */
  hir_comm *(*comm)(struct diff_target *t, hir_comm *local, int rank);   /* NULL: the local world's */
  void (*after)(struct diff_target *t, int world, int refused_run);      /* optional: after each program's runs */
  void *ctx;
} diff_target;

typedef struct diff_prog {
  uint64_t seed;
  hir_fusion *f;
  hir_local_world *w;
  diff_target *target;
  int nout, outs[2];           /* the program's outputs: indices into t */
  int world, ntv, nin, nstreams;
  int rows, cols, reversed;    /* a program on one 2-D mesh of the world (rows x cols, devices maybe reversed); 0: 1-D meshes */
  hir_dtype dt;                /* its tensors' dtype: f32, or by the seed bf16 or f16 (diff_dtype) */
  diff_tv t[DIFF_LONG_TVS];
  int max_tvs;                 /* DIFF_MAX_TVS, or DIFF_LONG_TVS: a longer chain of ops */
  int permuted;                /* the last permute's output (an index into t; 0: none) */
  int weight;                  /* the matmul's B or the linear's weight (an index into t; 0: none) */
  hir_lower_desc ld;
  /* per rank, after a run */
  hir_status status[8];
  int lowered[8];
  char error[8][512];
} diff_prog;

static int64_t diff_numel(int nd, const int64_t *sizes) {
  int64_t n = 1;
  int i;
  for (i = 0; i < nd; i++) n *= sizes[i];
  return n;
}

static int64_t diff_off(int nd, const int64_t *sizes, const int64_t *idx) {
  int64_t off = 0;
  int i;
  for (i = 0; i < nd; i++) off = off * sizes[i] + idx[i];
  return off;
}

static int diff_step(int nd, const int64_t *sizes, int64_t *idx) {
  int d;
  for (d = nd - 1; d >= 0; d--) {
    if (++idx[d] < sizes[d]) return 1;
    idx[d] = 0;
  }
  return 0;
}

static diff_tv *diff_new(diff_prog *p, hir_tv *tv, int nd, const int64_t *sizes) {
  diff_tv *t = &p->t[p->ntv++];
  int64_t n = diff_numel(nd, sizes);
  t->tv = tv;
  t->dt = tv ? hir_tv_dtype(tv) : HIR_F32;
  t->nd = nd;
  memcpy(t->sizes, sizes, (size_t)nd * sizeof(int64_t));
  t->v = (double *)calloc((size_t)(n ? n : 1), sizeof(double));
  t->arg_err = 0;
  return t;
}

/* By the seed (one in 43 each), a program in bf16 or in f16: its inputs
   halves in [-3, 3], every op's result rounded by the reference as the op
   stores it (diff_finish); one in 47 in f64; one in 59 in int64 (inputs
   integers in [-20, 20], the ops exact on integers). The other seeds'
   programs stay f32, unless HIR_DIFF_DTYPES names dtypes ("bf16,f16", "i64"):
   then every program is in one of them, by the seed. */
static hir_dtype diff_dtype(uint64_t seed) {
  static const struct { const char *name; hir_dtype dt; } names[] = {
      {"f32", HIR_F32}, {"f64", HIR_F64}, {"f16", HIR_F16}, {"bf16", HIR_BF16}, {"i64", HIR_I64}};
  const char *only = getenv("HIR_DIFF_DTYPES"), *at;
  hir_dtype chosen[8];
  int n = 0, k;
  for (at = only; at && *at && n < 8; at += strcspn(at, ","), at += *at == ',')
    for (k = 0; k < 5; k++)
      if (strlen(names[k].name) == strcspn(at, ",") && !strncmp(at, names[k].name, strlen(names[k].name))) chosen[n++] = names[k].dt;
  if (n) return chosen[seed % (uint64_t)n];
  return seed % 43 == 21 ? HIR_BF16 : seed % 43 == 42 ? HIR_F16 : seed % 47 == 23 ? HIR_F64 : seed % 59 == 29 ? HIR_I64 : HIR_F32;
}
/* int64 programs draw the ops exact on integers only: moves, views, sums, maxima, add, sub, mul, relu, abs, neg. */
static int diff_int(const diff_prog *p) { return p->dt == HIR_I64; }
static int diff_low(const diff_prog *p) { return p->dt == HIR_BF16 || p->dt == HIR_F16; }
static int diff_bits(hir_dtype dt) { return dt == HIR_BF16 ? 8 : dt == HIR_F16 ? 11 : 24; } /* significand bits */

static double diff_input_value(diff_rng *r, const diff_prog *p) {
  if (diff_int(p)) return (double)(diff_next(r, 41) - 20);
  return diff_low(p) ? (double)(diff_next(r, 13) - 6) / 2.0 : (double)(diff_next(r, 2001) - 1000) / 256.0;
}

/* The smallest q such that every value of t is a multiple of 2^-q (at most 60). */
static int diff_grain(const diff_tv *t) {
  int64_t i;
  int q = 0;
  for (i = 0; i < diff_numel(t->nd, t->sizes); i++)
    while (q < 60 && ldexp(t->v[i], q) != floor(ldexp(t->v[i], q))) q++;
  return q;
}

static double diff_max_abs(const diff_tv *t) {
  int64_t i;
  double m = 0;
  for (i = 0; i < diff_numel(t->nd, t->sizes); i++) m = fabs(t->v[i]) > m ? fabs(t->v[i]) : m;
  return m;
}

/* After an op's exact values: each rounded to t's dtype where it is bf16 or
   f16, as the op stores it. The op may sum in another order than the
   reference, and round its partial sums (a sum's local part before the
   collective, a chunk of K): those are all exact where the terms of
   element i, multiples of 2^-q, have absolute values summing to at most
   abs_sum[i] < 2^(significand bits - q). Else, or from an inexact operand,
   t is inexact: compared within a tolerance of its bound. An f16 value out
   of its range makes t unusable (inexact 2: the program is not run). */
static void diff_finish(diff_tv *t, const double *abs_sum, int q, int inexact) {
  int64_t i;
  t->inexact = inexact;
  if (t->dt != HIR_BF16 && t->dt != HIR_F16) return;
  for (i = 0; i < diff_numel(t->nd, t->sizes); i++) {
    if (abs_sum && ldexp(abs_sum[i], q) > ldexp(1.0, diff_bits(t->dt)) && !t->inexact) t->inexact = 1;
    if (t->dt == HIR_F16 && fabs(t->v[i]) > 32768) t->inexact = 2;
    t->v[i] = t->dt == HIR_BF16 ? hir_bf16_to_float(hir_float_to_bf16((float)t->v[i])) : hir_half_to_float(hir_float_to_half((float)t->v[i]));
  }
}

/* t is a's values moved or viewed. */
static diff_tv *diff_like(diff_tv *t, const diff_tv *a) {
  t->bound = a->bound;
  t->inexact = a->inexact;
  t->arg_err = a->arg_err;
  return t;
}

/* A mesh: the whole world, reversed, its first or last devices, or one. */
static int diff_mesh(diff_rng *r, int world, int *mesh) {
  int kind = diff_next(r, 5), n = world, i, first = 0;
  if (kind == 2 || kind == 3) n = 1 + diff_next(r, world);
  if (kind == 3) first = world - n;
  if (kind == 4) n = 1, first = diff_next(r, world);
  for (i = 0; i < n; i++) mesh[i] = kind == 1 ? world - 1 - i : first + i;
  return n;
}

/* Places t on a mesh (unless the program has none) and maybe splits an axis
   whose whole size is the mesh size across it (DIDx). */
static void diff_place(diff_rng *r, diff_prog *p, diff_tv *t, int meshless) {
  int mesh[8], n, i, cand[HIR_MAX_DIMS], nc = 0, data = 0;
  if (meshless) return;
  if (p->rows) { /* the program's 2-D mesh; maybe a DIDx axis (size cols), maybe a DIDy one (rows) */
    int q;
    for (i = 0; i < p->world; i++) mesh[i] = p->reversed ? p->world - 1 - i : i;
    hir_set_mesh_2d(t->tv, p->rows, p->cols, mesh);
    for (q = 0; q < 2; q++) {
      int want = q ? p->rows : p->cols;
      nc = data = 0;
      for (i = 0; i < hir_tv_ndims(t->tv); i++) {
        if (hir_tv_iter_type(t->tv, i) == HIR_REDUCTION) continue;
        if (want > 1 && t->sizes[data] == want && hir_tv_iter_type(t->tv, i) == HIR_ITERATION && hir_tv_ptype(t->tv, i) == HIR_SERIAL)
          cand[nc++] = i;
        data++;
      }
      if (nc && diff_next(r, 3)) hir_parallelize(t->tv, cand[diff_next(r, nc)], q ? HIR_DIDY : HIR_DIDX);
    }
    return;
  }
  n = diff_mesh(r, p->world, mesh);
  hir_set_mesh(t->tv, n, mesh);
  for (i = 0; i < hir_tv_ndims(t->tv); i++) {
    if (hir_tv_iter_type(t->tv, i) == HIR_REDUCTION) continue;
    if (n > 1 && t->sizes[data] == n && hir_tv_iter_type(t->tv, i) == HIR_ITERATION) cand[nc++] = i;
    data++;
  }
  if (nc && diff_next(r, 3)) hir_parallelize(t->tv, cand[diff_next(r, nc)], HIR_DIDX);
}

/* t = sum of a over data axis ax; with mean, divided by its whole extent
   (hir_mean: a sharded axis counts every device's part); with max, the
   largest (NaN where one is NaN; a non-empty axis). */
static diff_tv *diff_reduce(diff_prog *p, diff_tv *a, int ax, int mean, int max) {
  int64_t sz[HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0}, oidx[HIR_MAX_DIMS], k, across = a->sizes[ax];
  int i, n = 0;
  diff_tv *t;
  double *abs_sum;
  for (i = 0; i < a->nd; i++)
    if (i != ax) sz[n++] = a->sizes[i];
  t = diff_new(p, max ? hir_max(p->f, a->tv, 1, &ax) : mean ? hir_mean(p->f, a->tv, 1, &ax) : hir_sum(p->f, a->tv, 1, &ax), n, sz);
  abs_sum = (double *)calloc((size_t)diff_numel(n, sz) + 1, sizeof(double));
  for (k = 0; max && k < diff_numel(t->nd, t->sizes); k++) t->v[k] = -INFINITY;
  if (diff_numel(a->nd, a->sizes))
    do {
      int64_t at;
      double x = a->v[diff_off(a->nd, a->sizes, idx)];
      for (i = 0, n = 0; i < a->nd; i++)
        if (i != ax) oidx[n++] = idx[i];
      at = diff_off(t->nd, t->sizes, oidx);
      if (max) t->v[at] = x != x || t->v[at] != t->v[at] ? NAN : x > t->v[at] ? x : t->v[at];
      else t->v[at] += x, abs_sum[at] += fabs(x);
    } while (diff_step(a->nd, a->sizes, idx));
  if (max) {
    t->bound = a->bound;
    diff_finish(t, NULL, 0, a->inexact);
    free(abs_sum);
    return t;
  }
  for (k = 0; mean && k < diff_numel(t->nd, t->sizes); k++) t->v[k] /= (double)across;
  t->bound = mean ? a->bound : (double)across * a->bound;
  diff_finish(t, abs_sum, diff_grain(a), a->inexact || (mean && (across & (across - 1)))); /* dividing by 3: rounded twice maybe */
  free(abs_sum);
  return t;
}

static diff_tv *diff_sum(diff_prog *p, diff_tv *a, int ax) { return diff_reduce(p, a, ax, 0, 0); }

/* t = sum of a (3 data axes) over axes ax0 < ax1, in one hir_sum. */
static diff_tv *diff_sum2(diff_prog *p, diff_tv *a, int ax0, int ax1) {
  int64_t idx[HIR_MAX_DIMS] = {0};
  int axes[2], keep = 3 - ax0 - ax1;
  diff_tv *t;
  double *abs_sum = (double *)calloc((size_t)a->sizes[keep] + 1, sizeof(double));
  axes[0] = ax0, axes[1] = ax1;
  t = diff_new(p, hir_sum(p->f, a->tv, 2, axes), 1, &a->sizes[keep]);
  if (diff_numel(a->nd, a->sizes))
    do {
      t->v[idx[keep]] += a->v[diff_off(a->nd, a->sizes, idx)];
      abs_sum[idx[keep]] += fabs(a->v[diff_off(a->nd, a->sizes, idx)]);
    } while (diff_step(a->nd, a->sizes, idx));
  t->bound = (double)(a->sizes[ax0] * a->sizes[ax1]) * a->bound;
  diff_finish(t, abs_sum, diff_grain(a), a->inexact);
  free(abs_sum);
  return t;
}

/* t = a op b, where b is a's shape or a's shape with size 1 at axis `bax`
   (a broadcast axis: b = broadcast(x) of x without that axis). */
static diff_tv *diff_binary(diff_prog *p, int op, diff_tv *a, diff_tv *b, int bax) {
  int64_t idx[HIR_MAX_DIMS] = {0}, bidx[HIR_MAX_DIMS];
  hir_tv *tv = op == 0 ? hir_add(p->f, a->tv, b->tv) : op == 1 ? hir_sub(p->f, a->tv, b->tv) : hir_mul(p->f, a->tv, b->tv);
  diff_tv *t = diff_new(p, tv, a->nd, a->sizes);
  if (diff_numel(a->nd, a->sizes))
    do {
      double x = a->v[diff_off(a->nd, a->sizes, idx)], y;
      memcpy(bidx, idx, sizeof bidx);
      if (bax >= 0) bidx[bax] = 0;
      y = b->v[diff_off(b->nd, b->sizes, bidx)];
      t->v[diff_off(t->nd, t->sizes, idx)] = op == 0 ? x + y : op == 1 ? x - y : x * y;
    } while (diff_step(a->nd, a->sizes, idx));
  t->bound = op == 2 ? a->bound * b->bound : a->bound + b->bound;
  diff_finish(t, NULL, 0, a->inexact || b->inexact);
  return t;
}

/* t = an elementwise op of a, exact on the generator's values (multiples of 1/256); relu keeps a NaN (a mean over an
   empty axis), as torch's does. */
static diff_tv *diff_unary(diff_prog *p, int which, diff_tv *a) {
  static const hir_unary_op ops[6] = {HIR_UNARY_RELU, HIR_UNARY_ABS, HIR_UNARY_NEG, HIR_UNARY_MUL_SCALAR,
                                      HIR_UNARY_ADD_SCALAR, HIR_UNARY_SCALAR_SUB};
  hir_tv *tv;
  diff_tv *t;
  int64_t i;
  switch (ops[which]) {
  case HIR_UNARY_MUL_SCALAR: tv = hir_binary_scalar(p->f, HIR_BINARY_MUL, a->tv, 0.5); break;
  case HIR_UNARY_ADD_SCALAR: tv = hir_binary_scalar(p->f, HIR_BINARY_ADD, a->tv, 1.25); break;
  case HIR_UNARY_SCALAR_SUB: tv = hir_scalar_binary(p->f, HIR_BINARY_SUB, 2, a->tv); break;
  default: tv = hir_unary(p->f, ops[which], a->tv); break;
  }
  t = diff_new(p, tv, a->nd, a->sizes);
  for (i = 0; i < diff_numel(a->nd, a->sizes); i++) {
    double x = a->v[i];
    t->v[i] = which == 0 ? (x < 0 ? 0 : x) : which == 1 ? fabs(x) : which == 2 ? -x : which == 3 ? x * 0.5 : which == 4 ? x + 1.25 : 2 - x;
  }
  t->bound = which == 3 ? a->bound * 0.5 : which == 4 ? a->bound + 1.25 : which == 5 ? a->bound + 2 : a->bound;
  diff_finish(t, NULL, 0, a->inexact);
  return t;
}

/* t = random numbers shaped like a (hir_rand, a seed of the program's):
   those of the whole tensor's row-major indices, wherever t and a are placed. */
static diff_tv *diff_random(diff_prog *p, diff_tv *a) {
  uint64_t key = (p->seed * 2654435761u) & 0xffffffffffffull;
  diff_tv *t = diff_new(p, hir_rand(p->f, a->tv, p->dt, hir_val_const(p->f, (int64_t)key)), a->nd, a->sizes);
  int64_t i;
  for (i = 0; i < diff_numel(a->nd, a->sizes); i++) t->v[i] = hir_rand_value(key, (uint64_t)i, diff_bits(p->dt));
  t->bound = 1;
  diff_finish(t, NULL, 0, 0);
  return t;
}

/* t = a / (|b| + 0.5), b a or an earlier tensor of a's shape (the
   denominator its own two ops, placed anywhere), or (sine) sin(a): the
   kernels' division and transcendental, within the dtype's roundings. */
static diff_tv *diff_divide(diff_rng *r, diff_prog *p, diff_tv *a, int sine, int meshless) {
  diff_tv *b = a, *m, *d, *t;
  int64_t i, n = diff_numel(a->nd, a->sizes);
  if (sine) {
    t = diff_new(p, hir_sin(p->f, a->tv), a->nd, a->sizes);
    for (i = 0; i < n; i++) t->v[i] = sin(a->v[i]);
    t->bound = 1;
    if (t->dt == HIR_F32 || t->dt == HIR_F64) t->arg_err = ldexp(diff_max_abs(a), t->dt == HIR_F32 ? -16 : -45);
    diff_finish(t, NULL, 0, 1);
    return t;
  }
  for (i = 0; i < p->ntv && diff_next(r, 2); i++)
    if (&p->t[i] != a && p->t[i].nd == a->nd && !memcmp(p->t[i].sizes, a->sizes, (size_t)a->nd * sizeof(int64_t))) b = &p->t[i];
  m = diff_new(p, hir_abs(p->f, b->tv), a->nd, a->sizes);
  for (i = 0; i < n; i++) m->v[i] = fabs(b->v[i]);
  m->bound = b->bound;
  diff_finish(m, NULL, 0, b->inexact);
  diff_place(r, p, m, meshless);
  d = diff_new(p, hir_binary_scalar(p->f, HIR_BINARY_ADD, m->tv, 0.5), a->nd, a->sizes);
  for (i = 0; i < n; i++) d->v[i] = m->v[i] + 0.5;
  d->bound = m->bound + 0.5;
  diff_finish(d, NULL, 0, m->inexact);
  diff_place(r, p, d, meshless);
  t = diff_new(p, hir_div(p->f, a->tv, d->tv), a->nd, a->sizes);
  for (i = 0; i < n; i++) t->v[i] = a->v[i] / d->v[i];
  t->bound = 2 * a->bound;
  diff_finish(t, NULL, 0, 1);
  return t;
}

/* t = a cast to bf16 (placed anywhere: moved as 2-byte elements), cast back
   to f32, then moved again; a is an input, whose f32 values the reference
   rounds alike. The bf16 tensor is not among the last two, which later ops
   take (the reference does not round their results). */
static diff_tv *diff_bf16_trip(diff_rng *r, diff_prog *p, diff_tv *a, int meshless) {
  diff_tv *h = diff_new(p, hir_cast(p->f, a->tv, HIR_BF16), a->nd, a->sizes), *t, *u;
  size_t bytes = (size_t)diff_numel(a->nd, a->sizes) * sizeof(double);
  int64_t i;
  for (i = 0; i < diff_numel(a->nd, a->sizes); i++) h->v[i] = hir_bf16_to_float(hir_float_to_bf16((float)a->v[i]));
  diff_place(r, p, h, meshless);
  t = diff_new(p, hir_cast(p->f, h->tv, HIR_F32), a->nd, a->sizes);
  memcpy(t->v, h->v, bytes);
  diff_place(r, p, t, meshless);
  u = diff_new(p, hir_set(p->f, t->tv), a->nd, a->sizes);
  memcpy(u->v, h->v, bytes);
  return u;
}

/* Whether a layer_norm of a is well conditioned: every row's spread far
   above the rounding noise its values may carry. A row of sums that cancel
   (the sums of a layer_norm's output) is noise, which normalizing would
   magnify to the order of one, differently here and in the backend. */
static int diff_spread(const diff_tv *a) {
  int64_t C = a->nd ? a->sizes[a->nd - 1] : 1, rows = diff_numel(a->nd - 1, a->sizes), m, k;
  for (m = 0; m < rows && C; m++) {
    double mean = 0, var = 0;
    for (k = 0; k < C; k++) mean += a->v[m * C + k] / (double)C;
    for (k = 0; k < C; k++) var += (a->v[m * C + k] - mean) * (a->v[m * C + k] - mean) / (double)C;
    if (sqrt(var) < 1e-3 * (a->bound + 1)) return 0;
  }
  return 1;
}

/* t = hir_layer_norm of a over its last axis (every other such seed:
   hir_rms_norm), times a weight (one in two: an earlier 1-D tensor of that
   size, where there is one): the backend's fused call where its primitives
   stay together, else the primitives (a sharded last axis: a collective
   among them). */
static diff_tv *diff_layer_norm(diff_rng *r, diff_prog *p, diff_tv *a, int rms) {
  int64_t C = a->sizes[a->nd - 1], rows = diff_numel(a->nd - 1, a->sizes), m, k;
  diff_tv *w = NULL, *t;
  int i;
  for (i = 0; i < p->ntv && diff_next(r, 2); i++)
    if (p->t[i].nd == 1 && p->t[i].sizes[0] == C && &p->t[i] != a) w = &p->t[i];
  t = diff_new(p, rms ? hir_rms_norm(p->f, a->tv, 1, w ? w->tv : NULL, 1e-5) : hir_layer_norm(p->f, a->tv, 1, w ? w->tv : NULL, NULL, 1e-5),
               a->nd, a->sizes);
  for (m = 0; m < rows; m++) {
    double mean = 0, var = 0;
    for (k = 0; !rms && k < C; k++) mean += a->v[m * C + k] / (double)C;
    for (k = 0; k < C; k++) var += (a->v[m * C + k] - mean) * (a->v[m * C + k] - mean) / (double)C;
    for (k = 0; k < C; k++) t->v[m * C + k] = (a->v[m * C + k] - mean) / sqrt(var + 1e-5) * (w ? w->v[k] : 1);
  }
  t->bound = sqrt((double)C) * (w ? w->bound : 1);
  diff_finish(t, NULL, 0, 1);
  return t;
}

/* Whether every split reached an axis whose size its fixed parts divide: a
   split passes a reshape to an axis of another size, which the sizes drawn
   may not fit (the program is then not built). */
static int diff_splits_fit(const diff_prog *p) {
  int i, a, l;
  for (i = 0; i < p->ntv; i++) {
    const diff_tv *t = &p->t[i];
    for (l = 0; t->tv && hir_tv_logical_ndims(t->tv) && l < t->nd; l++) {
      int64_t known = 1;
      for (a = 0; a < hir_tv_ndims(t->tv); a++)
        if (hir_tv_iter_type(t->tv, a) != HIR_REDUCTION && hir_tv_logical_axis(t->tv, a) == l &&
            hir_tv_extent(t->tv, a)->kind == HIR__VAL_CONST)
          known *= hir_tv_extent(t->tv, a)->value;
      if (known > 0 && t->sizes[l] % known) return 0;
    }
  }
  return 1;
}

/* t = a view op of a: select index 0 of axis ax, slice [0, 1) of it, or a
   reshape (flattened, or keeping axis 0; by the seed, on 3+ axes, keeping
   a's DIDx axis past axis 0, else axis ax (1 if 0), with the others' sizes
   in reverse order: an axis kept among changed ones, which row-major order
   mixes); a's whole values, row-major. */
static diff_tv *diff_view(diff_prog *p, int which, diff_tv *a, int ax) {
  int64_t sz[HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0}, n = diff_numel(a->nd, a->sizes), keep[2] = {0, -1}, flat[1] = {-1}, at = 0;
  int i, nd = 0;
  hir_tv *tv;
  diff_tv *t;
  if (which == 2 && a->nd >= 3 && p->seed % 7 == 3 && n) {
    int64_t asked[HIR_MAX_DIMS];
    int k = ax ? ax : 1, others[HIR_MAX_DIMS], no = 0, data = 0;
    for (i = 0; i < hir_tv_ndims(a->tv); i++) /* a's split axis, where it has one past axis 0 */
      if (hir_tv_iter_type(a->tv, i) != HIR_REDUCTION && data++ > 0 && hir_tv_ptype(a->tv, i) == HIR_DIDX &&
          !hir_tv_logical_ndims(a->tv))
        k = data - 1;
    for (i = 0; i < a->nd; i++)
      if (i != k) others[no++] = i;
    for (i = 0; i < a->nd; i++) {
      if (i == k) sz[i] = a->sizes[k], asked[i] = 0;
      else asked[i] = sz[i] = a->sizes[others[--no]];
    }
    t = diff_new(p, hir_reshape(p->f, a->tv, a->nd, asked), a->nd, sz);
    memcpy(t->v, a->v, (size_t)n * sizeof(double));
    return diff_like(t, a);
  }
  if (which == 2) {
    tv = a->nd >= 2 ? hir_reshape(p->f, a->tv, 2, keep) : hir_reshape(p->f, a->tv, 1, flat);
    sz[nd++] = a->nd >= 2 ? a->sizes[0] : n;
    if (a->nd >= 2) sz[nd++] = a->sizes[0] ? n / a->sizes[0] : 0;
    t = diff_new(p, tv, nd, sz);
    memcpy(t->v, a->v, (size_t)n * sizeof(double));
    return diff_like(t, a);
  }
  for (i = 0; i < a->nd; i++)
    if (i != ax || which == 1) sz[nd++] = i == ax ? 1 : a->sizes[i];
  tv = which == 0 ? hir_select(p->f, a->tv, ax, 0) : hir_slice_step(p->f, a->tv, ax, -1, HIR_END, 1); /* the first; the last */
  t = diff_new(p, tv, nd, sz);
  if (n)
    do
      if (idx[ax] == (which == 0 ? 0 : a->sizes[ax] - 1)) t->v[at++] = a->v[diff_off(a->nd, a->sizes, idx)];
    while (diff_step(a->nd, a->sizes, idx));
  return diff_like(t, a);
}

/* t = broadcast of a with a size-1 axis inserted at `at`. */
static diff_tv *diff_broadcast(diff_prog *p, diff_tv *a, int at) {
  int flags[HIR_MAX_DIMS] = {0}, i;
  int64_t sz[HIR_MAX_DIMS];
  diff_tv *t;
  flags[at] = 1;
  for (i = 0; i <= a->nd; i++) sz[i] = i < at ? a->sizes[i] : i == at ? 1 : a->sizes[i - 1];
  t = diff_new(p, hir_broadcast(p->f, a->tv, a->nd + 1, flags), a->nd + 1, sz);
  memcpy(t->v, a->v, (size_t)diff_numel(a->nd, a->sizes) * sizeof(double));
  return diff_like(t, a);
}

/* t = a's axes in a random order (torch.permute: output axis i is a's perm[i]). */
static diff_tv *diff_permute(diff_rng *r, diff_prog *p, diff_tv *a) {
  int perm[HIR_MAX_DIMS], i;
  int64_t sz[HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0}, src[HIR_MAX_DIMS];
  diff_tv *t;
  for (i = 0; i < a->nd; i++) perm[i] = i;
  for (i = a->nd - 1; i > 0; i--) { /* Fisher-Yates */
    int j = diff_next(r, i + 1), k = perm[i];
    perm[i] = perm[j], perm[j] = k;
  }
  for (i = 0; i < a->nd; i++) sz[i] = a->sizes[perm[i]];
  t = diff_new(p, hir_permute(p->f, a->tv, perm), a->nd, sz);
  p->permuted = p->ntv - 1;
  if (diff_numel(a->nd, sz))
    do {
      for (i = 0; i < a->nd; i++) src[perm[i]] = idx[i];
      t->v[diff_off(a->nd, sz, idx)] = a->v[diff_off(a->nd, a->sizes, src)];
    } while (diff_step(a->nd, sz, idx));
  return diff_like(t, a);
}

/* t = hir_linear(a, w, bias) of a [..., M, K]: w [N, K] and bias [N]
   inputs of the program's dtype, the bias maybe broadcast to [1, N] (and w
   to [1, N, K]) for a 3-D a. */
static diff_tv *diff_linear(diff_rng *r, diff_prog *p, diff_tv *a, int meshless) {
  int64_t K = a->sizes[a->nd - 1], N = 1 + diff_next(r, 3), ws[2], rows = diff_numel(a->nd - 1, a->sizes), m, n, k, i;
  diff_tv *w, *bias, *t;
  int64_t sz[HIR_MAX_DIMS];
  double *abs_sum;
  ws[0] = N, ws[1] = K;
  w = diff_new(p, hir_input(p->f, p->dt, 2), 2, ws);
  p->weight = p->ntv - 1;
  bias = diff_new(p, hir_input(p->f, p->dt, 1), 1, ws);
  p->nin += 2;
  for (i = 0; i < N * K; i++) w->v[i] = diff_input_value(r, p);
  for (i = 0; i < N; i++) bias->v[i] = diff_input_value(r, p);
  w->bound = diff_max_abs(w), bias->bound = diff_max_abs(bias);
  diff_place(r, p, w, meshless);
  diff_place(r, p, bias, meshless);
  if (a->nd == 3 && diff_next(r, 2)) { /* the same values, seen through a batch axis */
    diff_place(r, p, w = diff_broadcast(p, w, 0), meshless);
    diff_place(r, p, bias = diff_broadcast(p, bias, 0), meshless);
  }
  memcpy(sz, a->sizes, sizeof sz);
  sz[a->nd - 1] = N;
  t = diff_new(p, hir_linear(p->f, a->tv, w->tv, bias->tv), a->nd, sz);
  abs_sum = (double *)calloc((size_t)(rows * N) + 1, sizeof(double));
  for (m = 0; m < rows; m++)
    for (n = 0; n < N; n++) {
      double acc = bias->v[n], abs_acc = fabs(bias->v[n]);
      for (k = 0; k < K; k++) acc += a->v[m * K + k] * w->v[n * K + k], abs_acc += fabs(a->v[m * K + k] * w->v[n * K + k]);
      t->v[m * N + n] = acc;
      abs_sum[m * N + n] = abs_acc;
    }
  t->bound = (double)K * a->bound * w->bound + bias->bound;
  i = diff_grain(a) + diff_grain(w);
  diff_finish(t, abs_sum, i > diff_grain(bias) ? (int)i : diff_grain(bias), a->inexact);
  free(abs_sum);
  return t;
}

/* t = a x b: [M, K] x [K, N], [B, M, K] x [K, N] or [B, M, K] x [B, K, N]. */
static diff_tv *diff_matmul(diff_prog *p, diff_tv *a, diff_tv *b) {
  int64_t B = a->nd == 3 ? a->sizes[0] : 1, M = a->sizes[a->nd - 2], K = a->sizes[a->nd - 1], N = b->sizes[b->nd - 1];
  int64_t sz[3] = {B, M, N}, i, m, n, k;
  diff_tv *t = diff_new(p, hir_matmul(p->f, a->tv, b->tv), a->nd, a->nd == 3 ? sz : sz + 1);
  double *abs_sum = (double *)calloc((size_t)(B * M * N) + 1, sizeof(double));
  for (i = 0; i < B; i++)
    for (m = 0; m < M; m++)
      for (n = 0; n < N; n++) {
        double s = 0, abs_s = 0;
        for (k = 0; k < K; k++) {
          double term = a->v[(i * M + m) * K + k] * b->v[((b->nd == 3 ? i : 0) * K + k) * N + n];
          s += term, abs_s += fabs(term);
        }
        t->v[(i * M + m) * N + n] = s;
        abs_sum[(i * M + m) * N + n] = abs_s;
      }
  t->bound = (double)K * a->bound * b->bound;
  diff_finish(t, abs_sum, diff_grain(a) + diff_grain(b), a->inexact || b->inexact);
  free(abs_sum);
  return t;
}

/* By the seed (one in fifteen), a program whose fp8 linear has K and N 16,
   so that a GPU runs cuBLASLt's fp8 GEMM (not the widened one), on values
   of quarters up to 4: every product and sum exact however the GEMM
   accumulates. */
static int diff_fp8_aligned(const diff_prog *p) { return p->seed % 5 == 3 && (p->seed / 5) % 3 == 1 && !diff_int(p); } /* not 141003 (always run) */

/* t = hir_scaled_linear(e4m3(a), w, sa, sw) of a [..., M, K]: the weight w
   [N, K] an e4m3 input, the scales f32 inputs of one value or per row
   (sa a's shape without K, sw [N]), the output of the program's dtype. By the seed, a 3-D a
   takes the weight (and a per-row sw) broadcast to a batch axis of size 1. */
static diff_tv *diff_scaled(diff_rng *r, diff_prog *p, diff_tv *a, int meshless) {
  int64_t K = a->sizes[a->nd - 1], N = diff_fp8_aligned(p) ? 16 : 1 + diff_next(r, 3), ws[2], one[1] = {1};
  int64_t rows = diff_numel(a->nd - 1, a->sizes), m, n, k, i;
  int row_a = diff_next(r, 2), row_w = diff_next(r, 2);
  diff_tv *w, *sa, *sw, *a8, *t;
  ws[0] = N, ws[1] = K;
  w = diff_new(p, hir_input(p->f, HIR_F8E4M3, 2), 2, ws);
  sa = row_a ? diff_new(p, hir_input(p->f, HIR_F32, a->nd - 1), a->nd - 1, a->sizes) : diff_new(p, hir_input_sized(p->f, HIR_F32, 1, one), 1, one);
  sw = row_w ? diff_new(p, hir_input(p->f, HIR_F32, 1), 1, ws) : diff_new(p, hir_input_sized(p->f, HIR_F32, 1, one), 1, one);
  p->nin += 3;
  for (i = 0; i < N * K; i++)
    w->v[i] = diff_fp8_aligned(p) ? (double)(diff_next(r, 33) - 16) / 4.0
                                  : hir_e4m3_to_float(hir_float_to_e4m3((float)(diff_next(r, 2001) - 1000) / 64.0f));
  for (i = 0; i < diff_numel(sa->nd, sa->sizes); i++) sa->v[i] = (double)(1 + diff_next(r, 512)) / 256.0;
  for (i = 0; i < diff_numel(sw->nd, sw->sizes); i++) sw->v[i] = (double)(1 + diff_next(r, 512)) / 256.0;
  a8 = diff_new(p, hir_cast(p->f, a->tv, HIR_F8E4M3), a->nd, a->sizes);
  for (i = 0; i < diff_numel(a->nd, a->sizes); i++) a8->v[i] = hir_e4m3_to_float(hir_float_to_e4m3((float)a->v[i]));
  diff_place(r, p, w, meshless);
  diff_place(r, p, sa, meshless);
  diff_place(r, p, sw, meshless);
  diff_place(r, p, a8, meshless);
  if (a->nd == 3 && p->seed % 13 == 6 && p->ntv < p->max_tvs - 4) { /* the same values, seen through a batch axis */
    diff_place(r, p, w = diff_broadcast(p, w, 0), meshless);
    if (row_w) diff_place(r, p, sw = diff_broadcast(p, sw, 0), meshless);
  }
  ws[1] = N; /* the output: a's shape with N for K */
  {
    int64_t sz[HIR_MAX_DIMS];
    memcpy(sz, a->sizes, sizeof sz);
    sz[a->nd - 1] = N;
    t = diff_new(p, hir_scaled_linear(p->f, a8->tv, w->tv, sa->tv, sw->tv, p->dt), a->nd, sz);
  }
  for (m = 0; m < rows; m++)
    for (n = 0; n < N; n++) {
      double acc = 0;
      for (k = 0; k < K; k++) acc += a8->v[m * K + k] * w->v[n * K + k];
      t->v[m * N + n] = acc * sa->v[row_a ? m : 0] * sw->v[row_w ? n : 0];
    }
  t->bound = (double)K * diff_max_abs(a8) * diff_max_abs(w) * diff_max_abs(sa) * diff_max_abs(sw);
  diff_finish(t, NULL, 0, 1); /* bf16 or f16: the scaled f32 value rounds twice, maybe otherwise than here */
  return t;
}

/* A random program; 0 when the builder refused it (the caller moves on). */
static int diff_build(diff_rng *r, diff_prog *p) {
  int meshless = diff_next(r, 8) == 0, nops = 1 + diff_next(r, 3), k, i, j, D = p->world;
  if (p->max_tvs > DIFF_MAX_TVS) nops += 3 + diff_next(r, 6);
  p->f = hir_fusion_create();
  for (k = 0; k < 1 + diff_next(r, 2); k++) { /* inputs of 1-3 axes, some of them the world's size */
    int64_t sz[3], n;
    int nd = 1 + diff_next(r, 3);
    diff_tv *t;
    for (i = 0; i < nd; i++) sz[i] = diff_next(r, 3) == 0 ? (p->rows && diff_next(r, 2) ? p->rows : p->rows ? p->cols : D) : 1 + diff_next(r, 4);
    if (k == 0 && diff_fp8_aligned(p) && nd >= 2) sz[nd - 1] = 16; /* an fp8 linear's K as GPUs' fp8 GEMMs take it */
    else if (k == 0 && p->seed % 53 == 26) sz[diff_next(r, nd)] = 0; /* by the seed: an empty axis (a matmul's K maybe) */
    else if (k == 0 && p->seed % 73 == 36) sz[diff_next(r, nd)] = 17 + diff_next(r, 300); /* a long axis: kernels' vectors, blocks */
    t = diff_new(p, hir_input(p->f, p->dt, nd), nd, sz);
    for (n = 0; n < diff_numel(nd, sz); n++)
      t->v[n] = k == 0 && diff_fp8_aligned(p) ? (double)(diff_next(r, 33) - 16) / 4.0 : diff_input_value(r, p);
    t->bound = diff_max_abs(t);
    diff_place(r, p, t, meshless);
    p->nin++;
  }
  if (!diff_int(p) && p->seed % 71 == 35 && p->t[0].nd >= 2 && p->ntv < p->max_tvs - 6) {
    /* by the seed: a row-parallel linear's tail on the first input, its sum over its split axis (an Allreduce; else
       over axis 0, split where it can be) plus a residual input, then an rms_norm: the communicator's fused call where
       the placements allow */
    diff_tv *a = &p->t[0], *t[4];
    int64_t n, rs[HIR_MAX_DIMS];
    int whole = !p->rows && diff_next(r, 4), nmesh = 0, ax = 0, data = 0; /* mostly all on a's mesh, whole: the fusion's case */
    const int *mesh = hir_tv_mesh(a->tv, &nmesh);
    for (i = 0; i < hir_tv_ndims(a->tv); i++) { /* its split axis, as a data axis */
      if (hir_tv_iter_type(a->tv, i) == HIR_REDUCTION) continue;
      if (hir_tv_ptype(a->tv, i) == HIR_DIDX) ax = data;
      data++;
    }
    for (i = 0, j = whole && nmesh > 1 && a->sizes[0] == nmesh; j && i < hir_tv_ndims(a->tv); i++) j = hir_tv_ptype(a->tv, i) == HIR_SERIAL;
    if (j) hir_parallelize(a->tv, 0, HIR_DIDX);
    for (i = 0, j = 0; i < a->nd; i++)
      if (i != ax) rs[j++] = a->sizes[i];
    t[0] = diff_new(p, hir_input(p->f, p->dt, a->nd - 1), a->nd - 1, rs); /* the residual */
    for (n = 0; n < diff_numel(t[0]->nd, t[0]->sizes); n++) t[0]->v[n] = diff_input_value(r, p);
    t[0]->bound = diff_max_abs(t[0]);
    p->nin++;
    t[1] = diff_sum(p, a, ax);
    t[2] = diff_binary(p, 0, t[1], t[0], -1);
    t[3] = (!diff_low(p) || !t[2]->inexact) && diff_spread(t[2]) ? diff_layer_norm(r, p, t[2], 1) : NULL;
    for (i = 0; i < 4 && t[i]; i++)
      if (whole && nmesh) hir_set_mesh(t[i]->tv, nmesh, mesh);
      else diff_place(r, p, t[i], meshless);
  } else if (!diff_int(p) && diff_next(r, 2)) { /* a matmul on the first input: B is [K, N] or [batch, K, N] */
    diff_tv *a = &p->t[0], *b;
    int64_t bs[3], n;
    if (a->nd >= 2 && p->ntv < p->max_tvs - 5 && p->seed % 5 == 3) { /* by the seed: the programs of other seeds stay */
      diff_place(r, p, diff_scaled(r, p, a, meshless), meshless);
    } else if (a->nd >= 2 && p->ntv < p->max_tvs - 5 && p->seed % 17 == 8) {
      diff_place(r, p, diff_linear(r, p, a, meshless), meshless);
    } else if (a->nd >= 2 && p->ntv < p->max_tvs - 2) {
      int batched = a->nd == 3 && diff_next(r, 2);
      bs[0] = a->sizes[0], bs[batched] = a->sizes[a->nd - 1], bs[batched + 1] = 1 + diff_next(r, 3);
      if (!batched) bs[1] = 1 + diff_next(r, 3), bs[0] = a->sizes[a->nd - 1];
      b = diff_new(p, hir_input(p->f, p->dt, 2 + batched), 2 + batched, bs);
      for (n = 0; n < diff_numel(b->nd, bs); n++) b->v[n] = diff_input_value(r, p);
      b->bound = diff_max_abs(b);
      diff_place(r, p, b, meshless);
      p->nin++;
      p->weight = p->ntv - 1;
      diff_place(r, p, diff_matmul(p, a, b), meshless);
    }
  }
  for (k = 0; k < nops && p->ntv < p->max_tvs - 3; k++) {
    diff_tv *a = &p->t[p->ntv - 1 - diff_next(r, p->ntv < 2 ? 1 : 2)], *t = NULL;
    switch (diff_next(r, 5)) {
    case 3: /* an elementwise op; by the seed, a layer_norm (the programs of other seeds stay) */
      t = diff_int(p) ? (a->nd >= 2 && diff_next(r, 2) ? diff_permute(r, p, a) : diff_unary(p, diff_next(r, 3), a))
          : p->seed % 11 == 4 && p->ntv < p->max_tvs - 4 && (!diff_low(p) || !a->inexact) && diff_spread(a) ? diff_layer_norm(r, p, a, p->seed / 11 % 2)
          : (p->seed % 19 == 10 || p->seed % 89 == 44) && a->nd >= 2 ? diff_permute(r, p, a)
          : p->seed % 31 == 15 && a - p->t < p->nin && p->ntv < p->max_tvs - 3 && p->dt == HIR_F32 ? diff_bf16_trip(r, p, a, meshless)
          : (p->seed % 61 == 30 || p->seed % 67 == 33) && p->ntv < p->max_tvs - 4 ? diff_divide(r, p, a, p->seed % 67 == 33, meshless)
          : p->seed % 97 == 48 ? diff_random(p, a)
                                                               : diff_unary(p, diff_next(r, 6), a);
      break;
    case 4: { /* a select, slice or reshape (select and slice of a non-empty axis, select of a 2+-axis tensor) */
      int which = diff_next(r, 3), ax = diff_next(r, a->nd);
      if (which < 2 && (a->sizes[ax] == 0 || (which == 0 && a->nd < 2))) continue;
      t = diff_view(p, which, a, ax);
      break;
    }
    case 0: /* a move: a set onto its own or another placement */
      t = diff_like(diff_new(p, hir_set(p->f, a->tv), a->nd, a->sizes), a);
      memcpy(t->v, a->v, (size_t)diff_numel(a->nd, a->sizes) * sizeof(double));
      break;
    case 1: /* a sum over one axis, or two (one of them maybe split: a local sum, then a collective) */
      if (a->nd < 2) continue;
      if (a->nd == 3 && diff_next(r, 3) == 0) {
        int keep = diff_next(r, 3);
        t = diff_sum2(p, a, keep == 0 ? 1 : 0, keep == 2 ? 1 : 2);
      } else { /* by the seed, a mean or a max (of a non-empty axis) */
        int ax = diff_next(r, a->nd);
        t = diff_reduce(p, a, ax, p->seed % 23 == 11 && !diff_int(p), p->seed % 29 == 14 && a->sizes[ax] > 0);
      }
      break;
    default: /* a op b: b is a itself, another tensor of a's shape, or a's sum over an axis broadcast back */
      j = diff_next(r, 3);
      if (j == 2 && a->nd >= 2) {
        int ax = diff_next(r, a->nd);
        diff_tv *s = diff_sum(p, a, ax);
        diff_place(r, p, s, meshless);
        t = diff_binary(p, diff_next(r, 3), a, diff_broadcast(p, s, ax), ax);
      } else {
        diff_tv *b = a;
        for (i = 0; i < p->ntv && j == 1; i++)
          if (&p->t[i] != a && p->t[i].nd == a->nd && !memcmp(p->t[i].sizes, a->sizes, (size_t)a->nd * sizeof(int64_t))) b = &p->t[i];
        t = diff_binary(p, diff_next(r, 3), a, b, -1);
      }
      break;
    }
    diff_place(r, p, t, meshless);
    if (hir_fusion_status(p->f) != HIR_OK || t->inexact == 2) return 0; /* the builder refused the combination; an f16 overflow */
  }
  if (p->seed % 89 == 44 && !p->permuted && p->t[p->ntv - 1].nd >= 2 && p->ntv < p->max_tvs) { /* a permute to split through */
    diff_tv *t = diff_permute(r, p, &p->t[p->ntv - 1]);
    diff_place(r, p, t, meshless);
    if (hir_fusion_status(p->f) != HIR_OK) return 0;
  }
  p->outs[p->nout++] = p->ntv - 1;
  if (p->seed % 37 == 17 && p->ntv - 1 > p->nin) /* by the seed: an intermediate too, read by later ops and returned */
    p->outs[p->nout++] = p->nin + diff_next(r, p->ntv - 1 - p->nin);
  for (i = 0; i < p->nout; i++) hir_output(p->f, p->t[p->outs[i]].tv);
  if (hir_fusion_status(p->f) != HIR_OK) return 0;
  /* split axes: outer by the mesh size (then maybe sharded), or by 2; by the seed, at least one (through permutes), or
     one of a matmul's or linear's weight (its K or N: tensor parallelism on logical shapes) */
  for (i = 0; i < 2 && (diff_next(r, 3) == 0 || (i == 0 && (p->seed % 89 == 44 || (p->seed % 11 == 7 && p->weight)))); i++) {
    int weight = i == 0 && p->seed % 11 == 7 && p->weight && p->seed % 89 != 44;
    diff_tv *t = weight ? &p->t[p->weight] : &p->t[diff_next(r, p->ntv)];
    int through = i == 0 && p->seed % 89 == 44 && p->permuted, ax, n, id = -1, k, y;
    int64_t factor, size;
    if (through) t = &p->t[p->permuted]; /* a split through the permute */
    ax = diff_next(r, t->nd);
    y = p->rows && diff_next(r, 2);
    hir_tv_mesh(t->tv, &n);
    if (p->rows) n = y ? p->rows : p->cols; /* split for DIDy or for DIDx */
    factor = n > 1 ? n : 2;
    for (k = 0; (through || weight) && k < t->nd; k++) /* an axis it can split */
      if ((t->sizes[k] > factor || weight) && t->sizes[k] % factor == 0 && (!weight || k == ax || t->sizes[ax] % factor)) ax = k;
    size = t->sizes[ax];
    for (k = 0; k < hir_tv_ndims(t->tv); k++) /* the data axis's part left by earlier splits, and its size */
      if (hir_tv_iter_type(t->tv, k) != HIR_REDUCTION && hir_tv_logical_axis(t->tv, k) == ax) {
        if (hir_tv_extent(t->tv, k)->kind == HIR__VAL_CONST) size /= hir_tv_extent(t->tv, k)->value;
        else id = k;
      }
    if (id >= 0 && (size > factor || ((through || weight) && size == factor)) && size % factor == 0 &&
        hir_split(t->tv, id, factor, 1) == HIR_OK && n > 1 && diff_next(r, 2))
      hir_parallelize(t->tv, id, y ? HIR_DIDY : HIR_DIDX);
    if (hir_fusion_status(p->f) != HIR_OK || !diff_splits_fit(p)) return 0;
  }
  for (i = 0; i < 2 && diff_next(r, 2); i++) { /* Stream axes on one or two tensors (an input's pass to its consumers) */
    diff_tv *t = &p->t[diff_next(r, 4) ? p->nin + diff_next(r, p->ntv - p->nin) : diff_next(r, p->nin)];
    int ax = diff_next(r, hir_tv_ndims(t->tv));
    if (hir_tv_iter_type(t->tv, ax) != HIR_BROADCAST && hir_tv_ptype(t->tv, ax) == HIR_SERIAL)
      hir_parallelize(t->tv, ax, HIR_STREAM);
  }
  for (i = 0; i < p->nin + p->nout; i++) { /* by the seed: outputs, or inputs and outputs, laid out in another order */
    hir_tv *tv = i < p->nin ? p->t[i].tv : p->t[p->outs[i - p->nin]].tv;
    int nd = hir_tv_ndims(tv), nl = 0, k, q, n = 0, logical[HIR_MAX_DIMS], from[HIR_MAX_DIMS], to[HIR_MAX_DIMS];
    if (p->seed % 31 != 7 && (i < p->nin || p->seed % 79 != 39)) continue;
    for (k = 0; k < nd; k++)
      if (hir_tv_iter_type(tv, k) != HIR_REDUCTION && hir_tv_logical_axis(tv, k) + 1 > nl) nl = hir_tv_logical_axis(tv, k) + 1;
    for (k = 0; k < nl; k++) logical[k] = k;
    for (k = nl - 1; k > 0; k--) { /* shuffled */
      int j = diff_next(r, k + 1), t = logical[k];
      logical[k] = logical[j], logical[j] = t;
    }
    for (q = 0; q <= nl; q++) /* each axis's parts together, outer first; reduction axes last */
      for (k = 0; k < nd; k++)
        if (q < nl ? hir_tv_iter_type(tv, k) != HIR_REDUCTION && hir_tv_logical_axis(tv, k) == logical[q]
                   : hir_tv_iter_type(tv, k) == HIR_REDUCTION)
          from[k] = k, to[k] = n++;
    if (n == nd && (hir_reorder(tv, nd, from, to) != HIR_OK || hir_set_allocation_loop(tv) != HIR_OK)) return 0;
  }
  p->ld.stream.schedule = diff_next(r, 2) ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
  p->ld.stream.bounded_buffers = diff_next(r, 2);
  p->ld.stream.parts = 1 + diff_next(r, 2);
  p->nstreams = 1 + diff_next(r, 4);
  if (!diff_next(r, 4)) p->ld.stream.schedule = HIR_SCHEDULE_COLLECTIVE, p->ld.stream.parts = 2; /* one program in four */
  p->ld.stream.gather_first = !diff_next(r, 4);             /* one in four: P2P allgathers first, their readers whole */
  p->ld.stream.experimental.column_parts = diff_next(r, 4) ? 0 : 2 + diff_next(r, 2); /* one in four: a gathered GEMM's columns in parts */
  return hir_fusion_status(p->f) == HIR_OK;
}

/* The whole value of t as a host tensor. */
static hir_tensor diff_tensor(const diff_tv *t) {
  hir_tensor h = tn(t->dt, t->nd, t->sizes);
  int64_t i;
  for (i = 0; i < diff_numel(t->nd, t->sizes); i++) tset(&h, i, t->v[i]);
  return h;
}

/* How far output o may be from the reference: in f32 1e-4 relative (-1:
   compare's), a sine's value of a large argument within its arg_err; in
   bf16 or f16 nothing where it is exact (diff_finish), else 8 roundings of
   its bound. */
static double diff_tolerance(const diff_prog *x, int o) {
  const diff_tv *t = &x->t[x->outs[o]];
  if (t->dt != HIR_BF16 && t->dt != HIR_F16) return t->arg_err > 0 ? t->arg_err + 2e-4 : -1;
  return t->inexact ? ldexp(t->bound, 3 - diff_bits(t->dt)) : 0;
}

/* In f32 and f64, where 1e-4 relative fails: 8 roundings of the output's
   bound, as in bf16. A sum whose terms cancel keeps its terms' absolute
   error (seed 874968898513: a row summing to 1e-5 of its terms' size,
   then multiplied back in, came out 1% off in f32, right to f32's
   precision). 0: none. */
static double diff_abs_tolerance(const diff_prog *x, int o) {
  const diff_tv *t = &x->t[x->outs[o]];
  return t->dt == HIR_F32 ? ldexp(t->bound, 3 - diff_bits(t->dt)) : t->dt == HIR_F64 ? ldexp(t->bound, 3 - 53) : 0;
}

/* Checks got (the backend's) against mine (this rank's part of the
   reference, NULL data where the output is not here) within tol
   (diff_tolerance), else within abs (diff_abs_tolerance); 0 on a
   difference. */
static int diff_check(hir_backend *b, const hir_tensor *got_there, const hir_tensor *mine, double tol, double abs, char *err,
                      const char *what) {
  hir_tensor got, dense;
  int ok = 1;
  int64_t i;
  if (!mine->data) {
    if (got_there->data || got_there->ndims) snprintf(err, 512, "%s should be empty here", what), ok = 0;
    return ok;
  }
  got = to_host(b, got_there);
  dense = tdense(&got);
  ok = compare(&dense, mine, tol < 0 ? 1e-4 : 0, err, 512, what);
  if (!ok && (tol > 0 || abs > 0)) /* within an absolute tolerance, then */
    for (i = 0, ok = 1, tol = tol > 0 ? tol : abs; i < tnumel(mine) && ok && dense.data && dense.ndims == mine->ndims; i++)
      if (!close_enough(tget(&dense, i), tget(mine, i), tol))
        snprintf(err, 512, "%s: element %lld is %.6g, want %.6g (within %.3g)", what, (long long)i, tget(&dense, i), tget(mine, i), tol), ok = 0;
  if (got.data != got_there->data) tfree(&got);
  tfree(&dense);
  return ok;
}

/* What runs a program: its evaluator, or (by the seed) a tuner that times
   the candidate schedules on every rank, agrees on one, and runs it. */
typedef struct diff_runner {
  hir_evaluator *ev;
  hir_tuner *tuner;
} diff_runner;

static hir_status diff_run(diff_runner *r, hir_tensor *in, int nin, hir_tensor *out, int nout) {
  hir_status s = r->tuner ? hir_tuner_run(r->tuner, in, nin, out, nout) : hir_run(r->ev, in, nin, out, nout);
  return s != HIR_OK ? s : r->tuner ? hir_tuner_sync(r->tuner) : hir_evaluator_sync(r->ev);
}
static const char *diff_error(const diff_runner *r) { return r->tuner ? hir_tuner_error(r->tuner) : hir_evaluator_error(r->ev); }

static hir_status diff_rank(int rank, void *user) {
  diff_prog *x = (diff_prog *)user;
  hir_lower_desc ld = x->ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  diff_runner run = {NULL, NULL};
  hir_tensor whole[8], in[8], out[2], mine[2]; /* inputs: 1-2, and a matmul's 1 or a scaled linear's 3 */
  int i, o;
  char *err = x->error[rank], what[64];
  hir_tensor din[8];
  hir_backend *b = x->target ? x->target->backends[rank] : NULL;
  int k;
  memset(&ed, 0, sizeof ed);
  memset(out, 0, sizeof out);
  memset(mine, 0, sizeof mine);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  if (x->target && x->target->comm) ed.comm = x->target->comm(x->target, ed.comm, rank);
  ed.number_of_streams = x->nstreams;
  ed.backend = b;
  ed.graph = b ? platform->graph : 0;
  if ((x->status[rank] = hir_lower(x->f, &ld, &p)) != HIR_OK) {
    snprintf(err, 512, "%s", hir_program_error(p));
    hir_program_free(p);
    return x->status[rank];
  }
  x->lowered[rank] = 1;
  for (i = 0; i < x->nin; i++) {
    whole[i] = diff_tensor(&x->t[i]);
    in[i] = shard(&whole[i], hir_program_input(p, i), rank);
    din[i] = to_backend(b, &in[i]);
  }
  for (o = 0; o < x->nout; o++) {
    hir_tensor want = diff_tensor(&x->t[x->outs[o]]);
    mine[o] = shard(&want, hir_program_output(p, o), rank);
    tfree(&want);
  }
  if (x->seed % 41 == 20) { /* by the seed: tuned on the ranks (a few runs of each candidate) */
    hir_tune_desc td;
    memset(&td, 0, sizeof td);
    td.lower = ld, td.eval = ed, td.warmup = 2, td.iters = 1;
    x->status[rank] = hir_tuner_create(x->f, &td, &run.tuner);
  } else {
    x->status[rank] = hir_evaluator_create(p, &ed, &run.ev);
  }
  if (x->status[rank] == HIR_OK && (x->status[rank] = diff_run(&run, din, x->nin, out, x->nout)) == HIR_OK) {
    for (o = 0; o < x->nout && x->status[rank] == HIR_OK; o++) {
      snprintf(what, sizeof what, "output %d", o);
      if (!diff_check(b, &out[o], &mine[o], diff_tolerance(x, o), diff_abs_tolerance(x, o), err, what)) x->status[rank] = HIR_ERR_INTERNAL; /* a wrong number */
    }
    for (k = 0; b && ed.graph && k < 2 && x->status[rank] == HIR_OK; k++) { /* graphs: captured, replayed */
      hir_tensor again[2];
      for (o = 0; o < x->nout; o++) { /* the run must write it all again */
        hir_tensor poison = tn(mine[o].dtype, mine[o].ndims, mine[o].sizes);
        int64_t e;
        for (e = 0; mine[o].data && e < tnumel(&poison); e++) tset(&poison, e, 1e30);
        if (mine[o].data) b->upload(b, out[o].data, poison.data, (size_t)tnumel(&poison) * hir_dtype_size(poison.dtype));
        tfree(&poison);
      }
      memset(again, 0, sizeof again);
      if ((x->status[rank] = diff_run(&run, din, x->nin, again, x->nout)) != HIR_OK) {
        snprintf(err, 512, "graph run %d: %.480s", k + 2, diff_error(&run));
        break;
      }
      for (o = 0; o < x->nout && x->status[rank] == HIR_OK; o++) {
        snprintf(what, sizeof what, "output %d, %s", o, k ? "replayed" : "captured");
        if (!diff_check(b, &again[o], &mine[o], diff_tolerance(x, o), diff_abs_tolerance(x, o), err, what)) x->status[rank] = HIR_ERR_INTERNAL;
        out[o] = again[o];
      }
    }
    /* by the seed, again: strided inputs, strided poisoned outputs (new buffers: graph mode 1 refuses them where peers
       captured theirs, so not on worlds of several ranks) */
    if (x->status[rank] == HIR_OK && (x->seed % 29 == 14 || b) && !(ed.graph == 1 && x->world > 1)) {
      hir_tensor rin[8], drin[8], given[2], dgiven[2];
      int64_t e;
      for (i = 0; i < x->nin; i++) rin[i] = trev(&in[i]), drin[i] = to_backend(b, &rin[i]);
      for (o = 0; o < x->nout; o++) {
        hir_tensor poison = mine[o];
        memset(&given[o], 0, sizeof given[o]);
        if (mine[o].data) {
          poison = tn(mine[o].dtype, mine[o].ndims, mine[o].sizes);
          for (e = 0; e < tnumel(&poison); e++) tset(&poison, e, 1e30);
          given[o] = trev(&poison);
          tfree(&poison);
        }
        dgiven[o] = to_backend(b, &given[o]);
      }
      if ((x->status[rank] = diff_run(&run, drin, x->nin, dgiven, x->nout)) != HIR_OK)
        snprintf(err, 512, "run 2: %.480s", diff_error(&run));
      for (o = 0; o < x->nout && x->status[rank] == HIR_OK; o++) {
        snprintf(what, sizeof what, "run 2 (strided), output %d", o);
        if (mine[o].data && !diff_check(b, &dgiven[o], &mine[o], diff_tolerance(x, o), diff_abs_tolerance(x, o), err, what)) x->status[rank] = HIR_ERR_INTERNAL;
      }
      for (i = 0; i < x->nin; i++) {
        backend_free(b, &rin[i], &drin[i]);
        if (rin[i].data != in[i].data) tfree(&rin[i]);
      }
      for (o = 0; o < x->nout; o++) {
        backend_free(b, &given[o], &dgiven[o]);
        tfree(&given[o]);
      }
    }
  } else {
    snprintf(err, 512, "%.500s", diff_error(&run));
  }
  hir_evaluator_free(run.ev); /* before the inputs' device copies go: a failed run may still have work queued on them */
  hir_tuner_free(run.tuner);
  for (i = 0; i < x->nin; i++) {
    backend_free(b, &in[i], &din[i]);
    tfree(&whole[i]);
    tfree(&in[i]);
  }
  for (o = 0; o < x->nout; o++) tfree(&mine[o]);
  hir_program_free(p);
  return x->status[rank];
}

/* One program: 0 on a wrong number, an internal error, a timeout, or ranks
   whose lowerings disagree; *how: 0 ran, 1 refused when lowering, 2 refused
   by a run, 3 not built. */
static int diff_one(uint64_t seed, diff_target *target, int *how) {
  diff_rng r;
  diff_prog x;
  int i, ok = 1, lowered = 0, refused_run = 0;
  char text[4096];
  memset(&x, 0, sizeof x);
  r.s = seed * 0x9E3779B97F4A7C15ull + 1;
  x.seed = seed;
  x.dt = diff_dtype(seed);
  x.max_tvs = seed % 59 == 29 ? DIFF_LONG_TVS : DIFF_MAX_TVS;
  x.world = 1 + diff_next(&r, 4);
  x.target = target;
  if (seed % 7 == 5) { /* by the seed: 2-D meshes, the programs of other seeds stay */
    x.rows = x.world == 4 ? 2 : diff_next(&r, 2) ? x.world : 1;
    x.cols = x.world / x.rows;
    x.reversed = diff_next(&r, 2);
  }
  *how = 3;
  if ((!target || (x.world >= target->min_world && x.world <= target->max_world)) && diff_build(&r, &x)) {
    x.w = hir_local_world_create(x.world);
    hir_local_world_set_timeout(x.w, 5000);
    hir_spmd(x.world, diff_rank, &x);
    hir_local_world_free(x.w);
    for (i = 0; i < x.world; i++) {
      lowered += x.lowered[i];
      if (x.status[i] == HIR_ERR_INTERNAL || x.status[i] == HIR_ERR_TIMEOUT) ok = 0;
      else if (x.status[i] != HIR_OK) refused_run = 1;
    }
    if (target && target->after) target->after(target, x.world, refused_run || !ok);
    if (ok && refused_run && lowered) { /* refused by a run: on every rank of the fusion's meshes, none returning success;
                                           a rank outside them has no part in the program (it meets nobody: disjoint
                                           meshes, as pipeline stages, run programs of their own) and returns success */
      int *devices = NULL, ndev = hir__fusion_devices(x.f, &devices);
      for (i = 0; i < x.world && ok; i++) /* no mesh at all: every rank runs the whole */
        ok = (x.status[i] != HIR_OK) == (!ndev || hir_team_index(devices, ndev, i) >= 0);
      HIR_FREE(devices);
    }
    for (i = 0; i < x.world && ok && refused_run && !lowered; i++) /* refused by every lowering */
      ok = x.status[i] != HIR_OK;
    for (i = 1; i < x.world && ok && lowered == 0; i++) /* refused by every lowering: with one message */
      ok = x.status[i] == x.status[0] && !strcmp(x.error[i], x.error[0]);
    if (ok && lowered && lowered < x.world) ok = 0; /* some ranks lowered, some did not */
    *how = !lowered ? 1 : refused_run ? 2 : 0;
    if (getenv("HIR_DIFF_VERBOSE") && !lowered) fprintf(stderr, "seed %llu refused by every lowering: %.150s\n", (unsigned long long)seed, x.error[0]);
    if (getenv("HIR_DIFF_VERBOSE") && lowered && refused_run)
      for (i = 0; i < x.world; i++)
        if (x.status[i] != HIR_OK && x.status[i] != HIR_ERR_COMM) fprintf(stderr, "seed %llu rank %d refused by a run: %s: %.150s\n", (unsigned long long)seed, i, hir_status_str(x.status[i]), x.error[i]);
    if (!ok || getenv("HIR_DIFF_SEED")) {
      hir_fusion_snprint(x.f, text, sizeof text);
      if (x.rows) fprintf(stderr, "  diff: a %d x %d mesh\n", x.rows, x.cols);
      fprintf(stderr, "  diff: seed %llu: %s, world %d, %s, bounded %d, %d parts, gather first %d, %d column "
              "parts, %d streams\n%s", (unsigned long long)seed, hir_dtype_name(x.dt), x.world,
              x.ld.stream.schedule == HIR_SCHEDULE_COLLECTIVE ? "collective" : x.ld.stream.schedule == HIR_SCHEDULE_RING ? "ring" : "linear",
              x.ld.stream.bounded_buffers, x.ld.stream.parts, x.ld.stream.gather_first,
              x.ld.stream.experimental.column_parts, x.nstreams, text);
      fprintf(stderr, "  whole sizes:");
      for (i = 0; i < x.ntv; i++) {
        int a;
        fprintf(stderr, " T%d [", hir_tv_name(x.t[i].tv));
        for (a = 0; a < x.t[i].nd; a++) fprintf(stderr, "%s%lld", a ? "," : "", (long long)x.t[i].sizes[a]);
        fprintf(stderr, "]");
      }
      fprintf(stderr, "\n");
      for (i = 0; i < x.world; i++) fprintf(stderr, "    rank %d: %s: %s\n", i, hir_status_str(x.status[i]), x.error[i]);
    }
  }
  for (i = 0; i < x.ntv; i++) free(x.t[i].v);
  hir_fusion_free(x.f);
  return ok;
}

/* The first seed: HIR_DIFF_OFFSET, a number or "fresh" (drawn from the
   clock, so that each run tries programs no run tried before). */
static uint64_t diff_offset(void) {
  const char *s = getenv("HIR_DIFF_OFFSET");
  struct timespec ts;
  if (!s || strcmp(s, "fresh")) return s ? strtoull(s, NULL, 10) : 0;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ((uint64_t)ts.tv_sec * 1000003u + (uint64_t)ts.tv_nsec / 1000u) % 1000000000000ull; /* 12 digits: easy to quote */
}

/* n seeds from HIR_DIFF_OFFSET on a target (NULL: the CPU's local world),
   at most 5 failures; counted and said. The check has teeth: more than
   `share` of the seeds must run against the reference. */
static void diff_seeds(diff_target *target, int n, double share, const char *where) {
  int i, how, counts[4] = {0, 0, 0, 0}, failures = 0;
  uint64_t offset = diff_offset();
  if (getenv("HIR_DIFF_SEED")) { /* that one alone, printed */
    CHECK(diff_one(strtoull(getenv("HIR_DIFF_SEED"), NULL, 10), target, &how));
    return;
  }
  for (i = 0; i < n && failures < 5; i++, hir_test_steps++) {
    if (!diff_one(offset + (uint64_t)i, target, &how)) failures++;
    counts[how]++;
  }
  printf("  diff%s: %d seeds from %llu (HIR_DIFF_SEED=S repeats seed S): %d ran against the reference, %d refused by every "
         "lowering, %d refused by a run, %d not built or of other ranks; %d failed\n", where, i, (unsigned long long)offset,
         counts[0], counts[1], counts[2], counts[3], failures);
  CHECK(failures == 0);
  CHECK(counts[0] > share * i);
}

TEST(test_diff_random_programs, "diff/random_programs", TEST_CPU) {
  const char *n_env = getenv("HIR_DIFF_PROGRAMS");
  /* seeds that found bugs, always run: their ranks chained Stream loops differently around an op only some
     of them run (2244: one without a Stream axis; 141003: one whose Stream axis is its input's) and deadlocked;
     5507147's allgather (gather first) joined the loop of the reduce-scatter whose sum it reads, which runs after it;
     860462250413: a rank outside a P2P allgather's mesh broadcast rows in its loop while the others took parts of
     columns (wrong numbers); 860463037301: a run refused on the fusion's ranks, the rest of the world untouched;
     861571490316 (a crash) and 861571134282 (a refusal): a split of a summed axis moved a later select's axis;
     862931903874: an allgather and a reduce-scatter in one linear loop, their messages paired crosswise;
     863803986063: a loop that read a permuted tensor along another axis than it wrote it by; 866232520831: no
     bug, the sine of an argument near 80 a GEMM summed otherwise (arg_err); 874968898513: no bug, an f32 row sum
     that cancels to 1e-5 of its terms (diff_abs_tolerance) */
  static const unsigned long long always[] = {2244, 141003, 5507147, 860462250413ull, 860463037301ull, 861571490316ull,
                                               861571134282ull, 862931903874ull, 863803986063ull, 866232520831ull,
                                               874968898513ull};
  int n = n_env ? atoi(n_env) : 300, k, how;
  diff_seeds(NULL, n, 0.25, ""); /* most programs run */
  for (k = 0; !getenv("HIR_DIFF_SEED") && k < (int)(sizeof always / sizeof always[0]); k++)
    CHECK(diff_one(always[k], NULL, &how));
}

/* The same programs on the platform's backend (the GPU suite's one-process
   stage: the CUDA backend; in its graph modes each is also captured and
   replayed, its output poisoned before each), those of one rank: the backend's
   kernels on random shapes, broadcasts, permutes, strided inputs and
   outputs, against the reference. HIR_DIFF_BACKEND_PROGRAMS: how many seeds
   (20,000; about a fifth are one-rank programs that run: 4,013 on one H100,
   none refused by a run). The programs of 2-4 ranks: tests/gpu/main.c
   (diff/random_programs_ranks). */
TEST(test_diff_backend, "diff/random_programs_backend", TEST_GPU_WORLDS) {
  const char *n_env = getenv("HIR_DIFF_BACKEND_PROGRAMS");
  diff_target target;
  char where[96];
  if (!platform->backend || platform->run != hir_spmd || platform->min_world > 1) return; /* the one-process suite: eager, graphs */
  memset(&target, 0, sizeof target);
  target.min_world = target.max_world = 1;
  if (!(target.backends[0] = platform->backend(0))) return;
  snprintf(where, sizeof where, " on the %s backend, one rank", target.backends[0]->name);
  diff_seeds(&target, n_env ? atoi(n_env) : 20000, 0.125, where);
  hir_backend_free(target.backends[0]);
}
