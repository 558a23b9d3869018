/* The elementwise ops, casts, tensor-scalar ops, mean and layer_norm: each
   run on the local world (1, 2, 3, 4, 8 ranks, sharded inputs) against a
   reference written here with the C library, on random data; their printed
   forms; their argument errors. The nvFuser test each case mirrors is named
   beside it. */
#include "test.h"

/* The reference of each unary op, written apart from the library's table. */
static double ref_unary(hir_unary_op op, double x, double s) {
  switch (op) {
  case HIR_UNARY_NEG: return -x;
  case HIR_UNARY_ABS: return fabs(x);
  case HIR_UNARY_RELU: return x > 0 ? x : 0;
  case HIR_UNARY_SIN: return sin(x);
  case HIR_UNARY_COS: return cos(x);
  case HIR_UNARY_EXP: return exp(x);
  case HIR_UNARY_LOG: return log(x);
  case HIR_UNARY_TANH: return tanh(x);
  case HIR_UNARY_SQRT: return sqrt(x);
  case HIR_UNARY_RSQRT: return 1 / sqrt(x);
  case HIR_UNARY_RECIPROCAL: return 1 / x;
  case HIR_UNARY_SIGMOID: return 1 / (1 + exp(-x));
  case HIR_UNARY_SILU: return x / (1 + exp(-x));
  case HIR_UNARY_GELU: return x * 0.5 * erfc(-x / sqrt(2.0));
  case HIR_UNARY_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / acos(-1.0)) * (x + 0.044715 * pow(x, 3)))); /* torch's approximate="tanh" */
  case HIR_UNARY_CAST: return x;
  case HIR_UNARY_ADD_SCALAR: return x + s;
  case HIR_UNARY_SUB_SCALAR: return x - s;
  case HIR_UNARY_MUL_SCALAR: return x * s;
  case HIR_UNARY_DIV_SCALAR: return x / s;
  case HIR_UNARY_SCALAR_SUB: return s - x;
  case HIR_UNARY_SCALAR_DIV: return s / x;
  default: return NAN;
  }
}

/* Whether an op needs positive inputs (the test takes |x| first). */
static int needs_positive(hir_unary_op op) {
  return op == HIR_UNARY_LOG || op == HIR_UNARY_SQRT || op == HIR_UNARY_RSQRT;
}

static double op_tol(hir_dtype dt) { return dt == HIR_F64 ? 1e-12 : dt == HIR_F32 ? 2e-6 : dt == HIR_F16 ? 2e-3 : 1.6e-2; }


/* out = op(x) with x [D, 3, 5] split along axis 0: the op runs on each shard.
   Mirrors nvFuser's PointwiseTest / MultiDeviceTest pointwise cases (unary
   op of a DIDx-sharded tensor, no communication). */
TEST(test_ops_unary, "ops/unary", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, op, di;
  for (wi = 0; wi < 5; wi++)
    for (op = 0; op < HIR_UNARY_ADD_SCALAR; op++) {
      int D = worlds[wi];
      hir_dtype dt = all_dtypes[(op + wi) % 4];
      int64_t sz[3] = {D, 3, 5}, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 3), *y;
      if (op == HIR_UNARY_CAST) {
        y = hir_cast(f, x, all_dtypes[(op + wi + 1) % 4]);
      } else {
        hir_tv *in = needs_positive((hir_unary_op)op) ? hir_abs(f, x) : x;
        y = hir_unary(f, (hir_unary_op)op, in);
      }
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_parallelize(x, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(dt, 3, sz);
      c.out[0] = tn(hir_tv_dtype(y), 3, sz);
      c.tol = op_tol(dt) > op_tol(hir_tv_dtype(y)) ? op_tol(dt) : op_tol(hir_tv_dtype(y));
      for (i = 0; i < tnumel(&c.in[0]); i++) {
        double v = tget(&c.in[0], i);
        tset(&c.out[0], i, ref_unary((hir_unary_op)op, needs_positive((hir_unary_op)op) ? fabs(v) : v, 0));
      }
      c.prealloc = op & 1;
      RUN_CASE(&c, "unary op");
      hir_fusion_free(f);
    }
  for (di = 0; di < 4; di++) { /* every cast, on one rank */
    int to;
    for (to = 0; to < 4; to++) {
      int64_t sz[2] = {4, 7}, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, all_dtypes[di], 2), *y = hir_cast(f, x, all_dtypes[to]);
      hir_output(f, y);
      case_lowered(&c, 1, f, 1, 1);
      c.in[0] = trand(all_dtypes[di], 2, sz);
      c.out[0] = tn(all_dtypes[to], 2, sz);
      for (i = 0; i < 28; i++) tset(&c.out[0], i, tget(&c.in[0], i)); /* rounded as the output's dtype rounds */
      c.tol = 0;
      RUN_CASE(&c, "cast");
      hir_fusion_free(f);
    }
  }
}

/* a / b with b broadcast along axis 1, and every tensor-scalar form, a
   chain of them on a sharded tensor (nvFuser's BinaryOp with a scalar
   operand: add(tv, IrBuilder::create<Val>(2.5))). */
TEST(test_ops_binary_scalar, "ops/binary_scalar", TEST_CPU | TEST_GPU_WORLDS) {
  static const double scalars[4] = {2.5, -0.75, 3.0, 0.5};
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], flags[3] = {0, 1, 0};
    hir_dtype dt = all_dtypes[wi % 4];
    int64_t sa[3] = {D, 4, 6}, sb[2] = {D, 6}, i, j, k;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, dt, 3), *b = hir_input(f, dt, 2), *q = hir_div(f, a, hir_broadcast(f, b, 3, flags)), *y;
    double s = scalars[wi % 4];
    y = hir_binary_scalar(f, HIR_BINARY_ADD, q, s);                 /* q + s */
    y = hir_scalar_binary(f, HIR_BINARY_SUB, s, y);                 /* s - (q + s) */
    y = hir_binary_scalar(f, HIR_BINARY_MUL, y, s);                 /* .. * s */
    y = hir_binary_scalar(f, HIR_BINARY_DIV, y, s);                 /* .. / s */
    y = hir_binary_scalar(f, HIR_BINARY_SUB, y, s);                 /* .. - s */
    y = hir_scalar_binary(f, HIR_BINARY_DIV, s, y);                 /* s / .. */
    hir_output(f, q);
    hir_output(f, y);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(b, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    hir_parallelize(b, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_init(&c, D);
    c.build = build_lowered;
    c.user = f;
    c.nin = c.nout = 2;
    c.in[0] = trand(dt, 3, sa);
    c.in[1] = trand(dt, 2, sb);
    c.out[0] = tn(dt, 3, sa);
    c.out[1] = tn(dt, 3, sa);
    for (i = 0; i < D; i++)
      for (j = 0; j < 4; j++)
        for (k = 0; k < 6; k++) {
          int64_t at = (i * 4 + j) * 6 + k;
          hir_tensor one = tn(dt, 1, sb + 1);
          double v;
          tset(&one, 0, tget(&c.in[0], at) / tget(&c.in[1], i * 6 + k)); /* each step rounded to dt, as the ops store */
          tset(&c.out[0], at, tget(&one, 0));
          v = tget(&one, 0);
          tset(&one, 0, v + s), v = tget(&one, 0);
          tset(&one, 0, s - v), v = tget(&one, 0);
          tset(&one, 0, v * s), v = tget(&one, 0);
          tset(&one, 0, v / s), v = tget(&one, 0);
          tset(&one, 0, v - s), v = tget(&one, 0);
          tset(&c.out[1], at, s / v);
          tfree(&one);
        }
    c.tol = op_tol(dt) * 4;
    c.prealloc = wi & 1;
    RUN_CASE(&c, "div_and_scalars");
    hir_fusion_free(f);
  }
}

/* layer_norm over the last axes, with weight and bias, in every dtype:
   rows split across devices (no communication), and the normalized axes
   split (the means become allreduces); rms_norm alike, with a weight or
   none. Mirrors nvFuser's
   DistributedTransformerTest's layer norms and MultiDeviceReductionTest
   (a reduction over a DIDx axis). */
static hir_tensor ref_norm(const hir_tensor *x, int64_t rows, int64_t cols, const hir_tensor *w, const hir_tensor *b, double eps,
                           int center) {
  hir_tensor y = tn(x->dtype, x->ndims, x->sizes);
  int64_t r, j;
  for (r = 0; r < rows; r++) {
    double mean = 0, var = 0;
    for (j = 0; center && j < cols; j++) mean += tget(x, r * cols + j);
    mean /= (double)cols;
    for (j = 0; j < cols; j++) var += (tget(x, r * cols + j) - mean) * (tget(x, r * cols + j) - mean);
    var /= (double)cols;
    for (j = 0; j < cols; j++) {
      double v = (tget(x, r * cols + j) - mean) / sqrt(var + eps);
      if (w) v *= tget(w, j);
      if (b) v += tget(b, j);
      tset(&y, r * cols + j, v);
    }
  }
  return y;
}

/* hir_rand and hir_uniform, and a dropout made of them and hir_lt's scalar
   form: on worlds of 1-8 the numbers of the whole tensor whatever its
   sharding (a device axis as nvFuser's BackpropMeshes and ResidualAdd, a
   split axis, a Stream axis after), the seed from a constant or a scalar
   input (above 32 bits), every dtype's bits; hir_lt and its scalar forms;
   the printed op; refusals. */
TEST(test_ops_random, "ops/random", TEST_CPU | TEST_GPU_WORLDS) {
  static const uint64_t seeds[3] = {7, 0x123456789aull, 0xfffffffffull};
  int wi, form;
  CHECK(hir_rand_value(0, 0, 32) == 0x6627e8d5u / 4294967296.0); /* Random123's philox4x32-10 known answer (counter and key 0) */
  CHECK(ref_rand(0, 0, 32) == 0x6627e8d5u / 4294967296.0);
  CHECK(hir_rand_value(~0ull, ~0ull, 32) != ref_rand(~0ull, ~0ull - 1, 32)); /* the counter counts */
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 3; form++) {
      int D = worlds[wi], bits;
      uint64_t seed = seeds[form];
      hir_dtype dt = form == 0 ? HIR_F32 : form == 1 ? HIR_BF16 : HIR_F16;
      int64_t sx[3] = {D, 3, 4}, sl[2] = {2 * D, 5}, n, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, form == 1 ? 2 : 3), *y, *z = NULL;
      hir_val *s = form == 0 ? hir_val_const(f, (int64_t)seed) : hir_input_scalar(f);
      bits = dt == HIR_F32 ? 24 : dt == HIR_BF16 ? 8 : 11;
      y = hir_rand(f, x, dt, s);
      if (form == 0) z = hir_add(f, x, y); /* nvFuser's BackpropMeshes: z sharded as x */
      if (form == 2) /* a dropout of p = 0.3, and numbers in [-2, 3) */
        z = hir_mul(f, hir_binary_scalar(f, HIR_BINARY_MUL, x, 1 / 0.7), hir_binary_scalar(f, HIR_BINARY_LT, hir_rand(f, x, HIR_F32, s), 0.7));
      hir_output(f, y);
      if (z) hir_output(f, z);
      if (form == 0) { /* and the numbers transposed: written into the permute's output, where the evaluator lays them */
        int perm[3] = {0, 2, 1};
        hir_output(f, hir_permute(f, hir_rand(f, x, HIR_F32, s), perm));
      }
      if (form == 2) { /* [-2, 3); x < u, or 0.5 < x */
        hir_output(f, hir_uniform(f, x, HIR_F32, -2, 3, s));
        hir_output(f, hir_add(f, hir_lt(f, x, hir_rand(f, x, HIR_F32, s)), hir_scalar_binary(f, HIR_BINARY_LT, 0.5, x)));
      }
      hir_set_mesh(x, D, iota_mesh);
      if (form == 1) hir_split(x, 0, D, 1); /* [2D, 5] as [DIDx D, 2, 5] */
      hir_parallelize(x, 0, HIR_DIDX);
      if (form == 0) hir_parallelize(z, 1, HIR_STREAM);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, form == 0 ? 1 : 2, form == 0 ? 3 : form == 1 ? 1 : 4);
      c.in[0] = trand(HIR_F32, form == 1 ? 2 : 3, form == 1 ? sl : sx);
      if (form) {
        memset(&c.in[1], 0, sizeof c.in[1]); /* the seed, by value */
        c.in[1].sizes[0] = (int64_t)seed;
      }
      n = tnumel(&c.in[0]);
      c.out[0] = tn(dt, c.in[0].ndims, c.in[0].sizes);
      for (i = 0; i < n; i++) tset(&c.out[0], i, ref_rand(seed, (uint64_t)i, bits));
      if (form != 1) c.out[1] = tn(HIR_F32, 3, sx);
      for (i = 2; form == 2 && i < 4; i++) c.out[i] = tn(HIR_F32, 3, sx);
      if (form == 0) {
        int64_t st[3] = {D, 4, 3}, j, k;
        c.out[2] = tn(HIR_F32, 3, st);
        for (i = 0; i < D; i++)
          for (j = 0; j < 3; j++)
            for (k = 0; k < 4; k++) tset(&c.out[2], (i * 4 + k) * 3 + j, ref_rand(seed, (uint64_t)((i * 3 + j) * 4 + k), 24));
      }
      for (i = 0; form != 1 && i < n; i++) {
        double xv = tget(&c.in[0], i), u = ref_rand(seed, (uint64_t)i, 24);
        tset(&c.out[1], i, form == 0 ? xv + u : (u < 0.7 ? (double)(float)(xv * (1 / 0.7)) : 0));
        if (form != 2) continue;
        tset(&c.out[2], i, (double)(float)(u * 5) - 2);
        tset(&c.out[3], i, (xv < u) + (0.5 < xv));
      }
      c.tol = 1e-6;
      RUN_CASE(&c, form == 0 ? "rand beside x, then x + it on streams" : form == 1 ? "rand of a split axis, bf16"
                                                                               : "dropout and uniform, f16");
      hir_fusion_free(f);
    }
  { /* the printed op and the refusals */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2);
    char text[4096];
    hir_output(f, hir_rand(f, x, HIR_BF16, hir_val_const(f, 5)));
    hir_fusion_snprint(f, text, sizeof text);
    CHECK(strstr(text, "= rand_like( T0") && strstr(text, "seed = 5"));
    CHECK(!hir_rand(f, x, HIR_F8E4M3, hir_val_const(f, 1)) && strstr(hir_fusion_error(f), "dtype 4; random numbers are"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_F32, 2);
    CHECK(!hir_rand(f, x, HIR_F32, NULL) && strstr(hir_fusion_error(f), "hir_rand: seed is NULL"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_F32, 2);
    CHECK(!hir_uniform(f, x, HIR_F32, 1, 1, hir_val_const(f, 1)) && strstr(hir_fusion_error(f), "[1, 1) is not a range"));
    hir_fusion_free(f);
  }
}

TEST(test_ops_layer_norm, "ops/layer_norm", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, split_hidden, rms;
  for (rms = 0; rms < 2; rms++)
  for (wi = 0; wi < 5; wi++)
    for (split_hidden = 0; split_hidden < 2; split_hidden++) {
      int D = worlds[wi], affine = rms ? (wi + split_hidden) % 2 : (wi + split_hidden) % 3;
      hir_dtype dt = all_dtypes[(wi + split_hidden) % 4];
      /* [D, 5, 8] rows split; or [5, D, 8] normalized over (D, 8), D split */
      int64_t sx[3] = {D, 5, 8}, sh[3] = {5, D, 8}, sw[2] = {D, 8}, sw1[1] = {8};
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      int nw = split_hidden ? 2 : 1;
      hir_tv *x = hir_input(f, dt, 3), *w = affine >= 1 ? hir_input(f, dt, nw) : NULL, *b = affine >= 2 ? hir_input(f, dt, nw) : NULL;
      hir_tv *y = rms ? hir_rms_norm(f, x, nw, w, 1e-5) : hir_layer_norm(f, x, nw, w, b, 1e-5);
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_parallelize(x, split_hidden ? 1 : 0, HIR_DIDX);
      if (w) hir_set_mesh(w, D, iota_mesh);
      if (b) hir_set_mesh(b, D, iota_mesh);
      if (w && split_hidden) hir_parallelize(w, 0, HIR_DIDX);
      if (b && split_hidden) hir_parallelize(b, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1 + (w != NULL) + (b != NULL), 1);
      c.in[0] = trand(dt, 3, split_hidden ? sh : sx);
      if (w) c.in[1] = trand(dt, nw, split_hidden ? sw : sw1);
      if (b) c.in[2] = trand(dt, nw, split_hidden ? sw : sw1);
      c.out[0] = split_hidden ? ref_norm(&c.in[0], 5, D * 8, w ? &c.in[1] : NULL, b ? &c.in[2] : NULL, 1e-5, !rms)
                              : ref_norm(&c.in[0], D * 5, 8, w ? &c.in[1] : NULL, b ? &c.in[2] : NULL, 1e-5, !rms);
      c.tol = dt == HIR_F64 ? 1e-10 : dt == HIR_F32 ? 1e-5 : op_tol(dt) * 2;
      c.prealloc = split_hidden;
      RUN_CASE(&c, rms ? split_hidden ? "rms_norm_split_hidden" : "rms_norm_split_rows"
                       : split_hidden ? "layer_norm_split_hidden" : "layer_norm_split_rows");
      hir_fusion_free(f);
    }
}

/* hir_layer_norm's primitives as one backend call (hir_backend.layer_norm,
   counted) where they stay together, on one rank: a plain one. Where they
   do not, the primitives, the plan silent: x's rows a Stream axis (stream
   lowering loops over the chunks of some primitives, not all); the value
   before the bias (rms_norm: the weight) an output too (the primitives must
   write it). The numbers against the reference each time; then rms_norm
   the same three ways (hir_backend.rms_norm). */
TEST(test_ops_layer_norm_one_call, "ops/layer_norm_one_call", TEST_CPU) {
  int round;
  for (round = 0; round < 6; round++) {
    int64_t sx[2] = {6, 10}, sw[1] = {10};
    int mode = round % 3, rms = round >= 3;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *w = hir_input(f, HIR_F32, 1), *b = hir_input(f, HIR_F32, 1);
    hir_tv *y = rms ? hir_rms_norm(f, x, 1, w, 1e-5) : hir_layer_norm(f, x, 1, w, b, 1e-5);
    hir_tv *scaled = hir_expr_input(hir_tv_definition(y), 0);
    hir_backend *be = hir_backend_cpu_create();
    hir_lower_desc ld;
    hir_eval_desc ed;
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_tensor in[3], out[2], want = {0}, want_scaled = {0};
    char err[256] = "";
    int k, fused = -1, nout = mode == 2 ? 2 : 1;
    hir_output(f, y);
    if (mode == 1) hir_parallelize(x, 0, HIR_STREAM);
    if (mode == 2) hir_output(f, scaled);
    memset(&ld, 0, sizeof ld);
    memset(&ed, 0, sizeof ed);
    memset(out, 0, sizeof out);
    count_layer_norm(be);
    ed.backend = be;
    ed.number_of_streams = 2;
    in[0] = trand(HIR_F32, 2, sx), in[1] = trand(HIR_F32, 1, sw), in[2] = trand(HIR_F32, 1, sw);
    CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    if (ev && hir_run(ev, in, 3, out, nout) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK) {
      fused = strstr(hir_program_plan(p), rms ? "fused: the rms_norm" : "fused: the layer_norm") != NULL;
      want = ref_norm(&in[0], 6, 10, &in[1], rms ? NULL : &in[2], 1e-5, !rms);
      if (!compare(&out[0], &want, 1e-5, err, sizeof err, "the norm")) printf("  round %d: %s\n", round, err), hir_test_failures++;
      if (mode == 2) {
        want_scaled = ref_norm(&in[0], 6, 10, rms ? NULL : &in[1], NULL, 1e-5, !rms);
        if (!compare(&out[1], &want_scaled, 1e-5, err, sizeof err, "its value before the bias"))
          printf("  round %d: %s\n", round, err), hir_test_failures++;
      }
    } else {
      printf("  round %d: %s\n", round, ev ? hir_evaluator_error(ev) : hir_program_error(p));
      hir_test_failures++;
    }
    CHECK(fused == (mode == 0));
    CHECK(layer_norm_calls == (mode == 0 && !rms));
    CHECK(rms_norm_calls == (mode == 0 && rms));
    tfree(&want);
    tfree(&want_scaled);
    for (k = 0; k < 3; k++) tfree(&in[k]);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_backend_free(be);
    hir_fusion_free(f);
  }
}

/* The row-parallel linear of tensor parallelism, then a residual add and an
   RMSNorm, as a decode step writes them: A [D, M, K] and W [D, K, N] split
   on D, the partial products summed over D (an Allreduce), h = that + r,
   out = rms_norm(h) * g, h and out the outputs. The communicator's fused
   call (hir_comm.allreduce_rms_norm) takes the three where it offers to;
   the numbers are the plain reference's either way. Forms: r + y, no
   weight, out first; the sum an output too (never fused); rows of 12 (not
   whole 16-byte vectors of bf16). */
static spmd_case *arn_case(spmd_case *c, hir_fusion **pf, int D, int form, hir_dtype dt) {
  const int64_t M = 3, K = 4, N = form == 3 ? 12 : 16;
  int64_t sa[3] = {D, M, K}, sw[3] = {D, K, N}, sr[2] = {M, N}, sg[1] = {N}, d, m, n, k;
  int axis0 = 0, t;
  hir_fusion *f = *pf = hir_fusion_create();
  hir_tv *a = hir_input(f, dt, 3), *w = hir_input(f, dt, 3), *r = hir_input(f, dt, 2), *g = form == 1 ? NULL : hir_input(f, dt, 1);
  hir_tv *y = hir_sum(f, hir_matmul(f, a, w), 1, &axis0), *h = form == 1 ? hir_add(f, r, y) : hir_add(f, y, r);
  hir_tv *o = hir_rms_norm(f, h, 1, g, 1e-6), *mesh_of[5];
  hir_tensor part, sum;
  if (form == 1) hir_output(f, o), hir_output(f, h);
  else hir_output(f, h), hir_output(f, o);
  if (form == 2) hir_output(f, y);
  mesh_of[0] = a, mesh_of[1] = w, mesh_of[2] = r, mesh_of[3] = y, mesh_of[4] = g;
  for (t = 0; t < 5; t++)
    if (mesh_of[t]) hir_set_mesh(mesh_of[t], D, iota_mesh);
  hir_parallelize(a, 0, HIR_DIDX);
  hir_parallelize(w, 0, HIR_DIDX);
  case_lowered(c, D, f, g ? 4 : 3, form == 2 ? 3 : 2);
  c->in[0] = trand(dt, 3, sa), c->in[1] = trand(dt, 3, sw), c->in[2] = trand(dt, 2, sr);
  if (g) c->in[3] = trand(dt, 1, sg);
  part = tn(dt, 2, sr), sum = tn(dt, 2, sr);
  c->out[form == 1] = tn(dt, 2, sr), c->out[form != 1] = tn(dt, 2, sr);
  for (m = 0; m < M; m++) {
    double ms = 0;
    for (n = 0; n < N; n++) {
      double y_mn = 0;
      for (d = 0; d < D; d++) { /* each rank's partial product in dt, then their sum in dt */
        double acc = 0;
        for (k = 0; k < K; k++) acc += tget(&c->in[0], (d * M + m) * K + k) * tget(&c->in[1], (d * K + k) * N + n);
        tset(&part, m * N + n, acc);
        y_mn += tget(&part, m * N + n);
      }
      tset(&sum, m * N + n, y_mn);
      tset(&c->out[form == 1], m * N + n, tget(&sum, m * N + n) + tget(&c->in[2], m * N + n));
      ms += tget(&c->out[form == 1], m * N + n) * tget(&c->out[form == 1], m * N + n) / (double)N;
    }
    for (n = 0; n < N; n++)
      tset(&c->out[form != 1], m * N + n, tget(&c->out[form == 1], m * N + n) / sqrt(ms + 1e-6) * (g ? tget(&c->in[3], n) : 1));
  }
  if (form == 2) c->out[2] = sum;
  else tfree(&sum);
  tfree(&part);
  c->tol = dt == HIR_F32 ? 1e-5 : op_tol(dt) * 4;
  return c;
}

TEST(test_ops_allreduce_rms_norm, "ops/allreduce_rms_norm", TEST_CPU | TEST_GPU_WORLDS) {
  static const hir_dtype dts[3] = {HIR_BF16, HIR_F32, HIR_F16};
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 4; form++) {
      spmd_case c;
      hir_fusion *f;
      char name[64];
      snprintf(name, sizeof name, "allreduce_rms_norm form %d, %s", form, hir_dtype_name(dts[(wi + form) % 3]));
      RUN_CASE(arn_case(&c, &f, worlds[wi], form, dts[(wi + form) % 3]), name);
      hir_fusion_free(f);
    }
}

/* The same programs on 2 and 3 CPU ranks, the communicator's fused call
   counted: taken where the plan says (every form but the one whose sum is
   an output), the numbers bit for bit those of the three ops apart (the
   same communicator without the call). */
typedef struct arn_comm {
  hir_comm comm; /* first: the evaluator's handle; the local world's, its fused call counted or dropped */
  int calls, fail; /* fail: the call fails on rank 1, which aborts */
} arn_comm;
static hir_status arn_counting(hir_comm *c, void *t, const void *s, const void *r, const void *w, void *h, void *o, size_t rows,
                               size_t cols, hir_dtype dt, double eps, void *st) {
  ((arn_comm *)c)->calls++;
  if (((arn_comm *)c)->fail && c->rank == 1) {
    snprintf(c->error, sizeof c->error, "rank 1's fused call fails (a test)");
    c->abort(c);
    return HIR_ERR_COMM;
  }
  return hir__lw_allreduce_rms_norm(c, t, s, r, w, h, o, rows, cols, dt, eps, st);
}
typedef struct arn_run {
  spmd_case *c;
  hir_local_world *w;
  int fused; /* 1: the call offered; 2: offered, failing on rank 1 */
  int calls[MAXR], planned[MAXR];
  hir_tensor out[3][MAXR][3]; /* [fused][rank] */
  char err[MAXR][600];
} arn_run;
static hir_status arn_rank(int rank, void *user) {
  arn_run *x = (arn_run *)user;
  spmd_case *c = x->c;
  arn_comm comm;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[4];
  hir_status s;
  int i;
  comm.comm = *hir_local_comm(x->w, rank);
  comm.comm.allreduce_rms_norm = x->fused ? arn_counting : NULL;
  comm.calls = 0;
  comm.fail = x->fused == 2;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  ld.my_device = rank;
  ed.comm = &comm.comm;
  memset(in, 0, sizeof in);
  s = hir_lower((hir_fusion *)c->user, &ld, &p);
  for (i = 0; s == HIR_OK && i < c->nin; i++) in[i] = shard(&c->in[i], hir_program_input(p, i), rank);
  for (i = 0; i < c->nout; i++) { /* the caller's, poisoned */
    int64_t k;
    x->out[x->fused][rank][i] = tn(c->out[i].dtype, c->out[i].ndims, c->out[i].sizes);
    for (k = 0; k < tnumel(&c->out[i]); k++) tset(&x->out[x->fused][rank][i], k, 1e30);
  }
  if (s == HIR_OK) s = hir_evaluator_create(p, &ed, &ev);
  if (s == HIR_OK) s = hir_run(ev, in, c->nin, x->out[x->fused][rank], c->nout);
  if (s == HIR_OK) s = hir_evaluator_sync(ev);
  if (s != HIR_OK) snprintf(x->err[rank], sizeof x->err[rank], "%s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  x->planned[rank] = p && strstr(hir_program_plan(p), "the add of T2 and the rms_norm after it in one call") != NULL;
  x->calls[rank] = comm.calls;
  for (i = 0; i < c->nin; i++) tfree(&in[i]);
  hir_evaluator_free(ev);
  hir_program_free(p);
  return s;
}
TEST(test_ops_allreduce_rms_norm_fused, "ops/allreduce_rms_norm_fused", TEST_CPU) {
  int D, form, fused, r, k;
  for (D = 2; D <= 3; D++)
    for (form = 0; form < 4; form++) {
      spmd_case c;
      hir_fusion *f;
      arn_run x;
      memset(&x, 0, sizeof x);
      x.c = arn_case(&c, &f, D, form, form == 1 ? HIR_F32 : HIR_BF16);
      x.w = hir_local_world_create(D);
      for (fused = 0; fused < 2; fused++) {
        x.fused = fused;
        hir_spmd(D, arn_rank, &x);
        for (r = 0; r < D; r++) {
          if (x.err[r][0]) printf("  D %d form %d fused %d rank %d: %s\n", D, form, fused, r, x.err[r]), hir_test_failures++;
          CHECK(x.planned[r] == (fused && form != 2));
          CHECK(x.calls[r] == (fused && form != 2));
        }
      }
      if (form == 0) { /* the call fails on rank 1: every rank's run fails, naming it */
        hir_local_world_free(x.w);
        x.w = hir_local_world_create(D);
        x.fused = 2;
        hir_spmd(D, arn_rank, &x);
        for (r = 0; r < D; r++) {
          if (!strstr(x.err[r], "rank 1's fused call fails")) printf("  D %d rank %d: %s\n", D, r, x.err[r]);
          CHECK(strstr(x.err[r], "rank 1's fused call fails") != NULL);
          for (k = 0; k < c.nout; k++) tfree(&x.out[2][r][k]);
        }
      }
      for (r = 0; r < D; r++)
        for (k = 0; k < c.nout; k++) {
          char err[300];
          if (!compare(&x.out[1][r][k], &x.out[0][r][k], 0, err, sizeof err, "fused against apart"))
            printf("  D %d form %d rank %d output %d: %s\n", D, form, r, k, err), hir_test_failures++;
          if (!compare(&x.out[1][r][k], &c.out[k], c.tol, err, sizeof err, "fused against the reference"))
            printf("  D %d form %d rank %d output %d: %s\n", D, form, r, k, err), hir_test_failures++;
          tfree(&x.out[0][r][k]);
          tfree(&x.out[1][r][k]);
        }
      for (k = 0; k < c.nin; k++) tfree(&c.in[k]);
      for (k = 0; k < c.nout; k++) tfree(&c.out[k]);
      hir_local_world_free(x.w);
      hir_fusion_free(f);
    }
}

/* A sum over the DIDx axis and a local one (lowered as a local sum, then an
   Allreduce), and over an inner DIDx axis (MultiDeviceReductionTest's
   reduction on dim 1). */
TEST(test_ops_sum_sharded_and_local, "ops/sum_sharded_and_local", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, inner;
  for (wi = 0; wi < 5; wi++)
    for (inner = 0; inner < 2; inner++) {
      int D = worlds[wi], axes[2] = {0, 1};
      hir_dtype dt = all_dtypes[wi % 2];
      int64_t sz[3] = {D, 3, 4}, szi[3] = {3, D, 4}, so[1] = {4}, i, j, k;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 3), *y = hir_sum(f, x, 2, axes);
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_parallelize(x, inner, HIR_DIDX);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(dt, 3, inner ? szi : sz);
      c.out[0] = tn(dt, 1, so);
      for (k = 0; k < 4; k++) {
        double t = 0;
        for (i = 0; i < (inner ? 3 : D); i++)
          for (j = 0; j < (inner ? D : 3); j++) t += tget(&c.in[0], (i * (inner ? D : 3) + j) * 4 + k);
        tset(&c.out[0], k, t);
      }
      c.tol = dt == HIR_F64 ? 1e-12 : 1e-5;
      c.prealloc = inner;
      RUN_CASE(&c, inner ? "sum_inner_didx" : "sum_didx_and_local");
      hir_fusion_free(f);
    }
}

/* The printed forms, in nvFuser's spelling. */
TEST(test_ops_print, "ops/print", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 1), *h = hir_input(f, HIR_BF16, 1);
  char buf[4096];
  int axis = 0;
  hir_output(f, hir_relu(f, x));
  hir_output(f, hir_sin(f, x));
  hir_output(f, hir_neg(f, x));
  hir_output(f, hir_cast(f, h, HIR_F32));
  hir_output(f, hir_cast(f, x, HIR_F64));
  hir_output(f, hir_binary_scalar(f, HIR_BINARY_ADD, x, 2.5));
  hir_output(f, hir_scalar_binary(f, HIR_BINARY_DIV, 1, x));
  hir_output(f, hir_div(f, x, x));
  hir_output(f, hir_mean(f, x, 1, &axis));
  {
    hir_tv *la = hir_input(f, HIR_F32, 2), *lw = hir_input(f, HIR_F32, 2), *lb = hir_input(f, HIR_F32, 1);
    hir_output(f, hir_linear(f, la, lw, lb));
  }
  {
    hir_tv *v = hir_input(f, HIR_F32, 2);
    int64_t flat[1] = {-1};
    hir_output(f, hir_select(f, v, 1, 1));
    hir_output(f, hir_slice(f, v, 1, 1, 3));
    hir_output(f, hir_reshape(f, v, 1, flat));
  }
  CHECK(hir_fusion_error(f)[0] == 0);
  hir_fusion_snprint(f, buf, sizeof buf);
  CHECK(strstr(buf, " = relu(T0_g_float[iS0{i0}]);\n") != NULL);
  CHECK(strstr(buf, " = sinf(T0_g_float[iS0{i0}]);\n") != NULL);
  CHECK(strstr(buf, " = -T0_g_float[iS0{i0}];\n") != NULL);
  CHECK(strstr(buf, " = __bfloat2float(T1_g___bfloat[iS1{i2}]);\n") != NULL);
  CHECK(strstr(buf, " = (double)(T0_g_float[iS0{i0}]);\n") != NULL);
  CHECK(strstr(buf, "T0_g_float[iS0{i0}]\n   + 2.5;\n") != NULL);
  CHECK(strstr(buf, " = 1.0\n   / T0_g_float[iS0{i0}];\n") != NULL);
  CHECK(strstr(buf, "T0_g_float[iS0{i0}]\n   / T0_g_float[iS0{i0}];\n") != NULL);
  CHECK(strstr(buf, "\n   / i0;\n") != NULL); /* the mean divides by the extent */
  CHECK(strstr(buf, " = select( T16_g_float[iS19{i8}, iS20{i9}], axis = iS20{i9}, index = 1 )\n") != NULL);
  CHECK(strstr(buf, " = slice( T16_g_float[iS19{i8}, iS20{i9}], { {0, i8, 1} {1, 3, 1} } )\n") != NULL);
  CHECK(strstr(buf, "T19_g_float[iS24{( i8 * i9 )}]\n   = view( T16_g_float[iS19{i8}, iS20{i9}] )\n") != NULL);
  CHECK(strstr(buf, " = linear(T12_g_float[iS11{i3}, iS12{i4}],\n            T13_g_float[iS13{i5}, iS14{i6}],\n            T14_g_float[iS15{i7}])\n") != NULL);
  if (hir_test_failures) fprintf(stderr, "%s", buf);
  hir_fusion_free(f);
}

/* Python's bounds, resolved against the run's size: x[:, -3::2] of a
   [2, 4] input is columns 1 and 3; of a [2, 2] input it starts outside
   the axis and the run is refused, naming the range and the size. */
TEST(test_ops_slice_bounds, "ops/slice_bounds", TEST_CPU) {
  hir_fusion *f = hir_fusion_create();
  hir_tv *x = hir_input(f, HIR_F32, 2), *y = hir_slice_step(f, x, 1, -3, HIR_END, 2);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_tensor in, out;
  char buf[4096];
  int64_t sz[2] = {2, 4}, i;
  hir_output(f, y);
  hir_fusion_snprint(f, buf, sizeof buf);
  CHECK(strstr(buf, "= slice( T0_g_float[iS0{i0}, iS1{i2}], { {0, i0, 1} {-3, i2, 2} } )") != NULL);
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  CHECK(hir_lower(f, &ld, &p) == HIR_OK && hir_evaluator_create(p, &ed, &ev) == HIR_OK);
  in = trand(HIR_F32, 2, sz);
  memset(&out, 0, sizeof out);
  CHECK(ev && hir_run(ev, &in, 1, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
  CHECK(out.ndims == 2 && out.sizes[0] == 2 && out.sizes[1] == 2);
  for (i = 0; ev && i < 4; i++) CHECK(tget(&out, i) == tget(&in, (i / 2) * 4 + 1 + 2 * (i % 2)));
  in.sizes[1] = 2; /* strides 0: contiguous */
  memset(&out, 0, sizeof out);
  CHECK(ev && hir_run(ev, &in, 1, &out, 1) == HIR_ERR_SHAPE &&
        strstr(hir_evaluator_error(ev), "the range -3: (step 2) is outside T0's axis 1 of size 2"));
  if (hir_test_failures) fprintf(stderr, "%s\n%s\n", buf, ev ? hir_evaluator_error(ev) : "");
  tfree(&in);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
}

/* Each misuse names the culprit. */
TEST(test_ops_errors, "ops/errors", TEST_CPU) {
  static const struct { int which; const char *want; } cases[] = {
      {0, "is not a unary op without a scalar; use hir_cast"},
      {1, "hir_cast: unknown dtype 9"},
      {2, "hir_binary_scalar: the scalar is inf; give a finite number"},
      {3, "hir_layer_norm: naxes 3 is out of range for T0, which has 2 data axes (valid: 1..2)"},
      {4, "hir_layer_norm: weight T1 has 2 data axes; it needs the 1 normalized axes"},
      {5, "hir_layer_norm: eps is nan; give a finite number >= 0"},
      {6, "hir_binary: unknown binary op 7"},
      {7, "hir_div: mixed dtypes: T0 is float, T1 is double"},
      {8, "hir_reshape: sizes[1] = -1 is a second -1 (T0 has 2 data axes)"},
      {9, "hir_slice: [3, 2) is not a range; give 0 <= start < stop, or stop = -1 for the end"},
      {10, "hir_select: the index is negative"},
      {11, "hir_permute: perm[1] = 0 is listed twice"},
      {12, "hir_slice_step: 1:3:0 is not a range"},
      {13, "hir_slice_step: -1:-3:1 is not a range"},
  };
  static const int64_t two_inferred[2] = {-1, -1};
  static const int dup[2] = {0, 0};
  size_t i;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2), *w;
    switch (cases[i].which) {
    case 0: hir_unary(f, HIR_UNARY_CAST, x); break;
    case 1: hir_cast(f, x, (hir_dtype)9); break;
    case 2: hir_binary_scalar(f, HIR_BINARY_ADD, x, INFINITY); break;
    case 3: hir_layer_norm(f, x, 3, NULL, NULL, 1e-5); break;
    case 4: w = hir_input(f, HIR_F32, 2), hir_layer_norm(f, x, 1, w, NULL, 1e-5); break;
    case 5: hir_layer_norm(f, x, 1, NULL, NULL, NAN); break;
    case 6: hir_binary(f, (hir_binary_op)7, x, x); break;
    case 7: w = hir_input(f, HIR_F64, 2), hir_div(f, x, w); break;
    case 8: hir_reshape(f, x, 2, two_inferred); break;
    case 9: hir_slice(f, x, 0, 3, 2); break;
    case 10: hir_select(f, x, 1, -1); break;
    case 12: hir_slice_step(f, x, 1, 1, 3, 0); break;
    case 13: hir_slice_step(f, x, 1, -1, -3, 1); break;
    default: hir_permute(f, x, dup); break;
    }
    if (!strstr(hir_fusion_error(f), cases[i].want)) {
      fprintf(stderr, "  case %d: got \"%s\"\n", cases[i].which, hir_fusion_error(f));
      hir_test_failures++;
    }
    hir_fusion_free(f);
  }
}

/* out = a x weight^T + bias: a [R, M, K], weight [N, K], bias [N]; or, with
   the weight split on a leading axis, a [M, K], weight [D, N/D, K], bias
   [D, N/D] and out [D, M, N/D]. */
static hir_tensor ref_linear(const hir_tensor *a, const hir_tensor *w, const hir_tensor *bias, int split_weight) {
  int64_t R = split_weight ? 1 : a->sizes[0], M = a->sizes[a->ndims - 2], K = a->sizes[a->ndims - 1];
  int64_t D = split_weight ? w->sizes[0] : 1, N = w->sizes[w->ndims - 2], so[3] = {D, M, N}, sr[3] = {R, M, N}, r, d, m, n, k;
  hir_tensor o = tn(a->dtype, 3, split_weight ? so : sr);
  for (d = 0; d < D; d++)
    for (r = 0; r < R; r++)
      for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
          double t = bias ? tget(bias, d * N + n) : 0;
          for (k = 0; k < K; k++) t += tget(a, (r * M + m) * K + k) * tget(w, (d * N + n) * K + k);
          tset(&o, ((d * R + r) * M + m) * N + n, t);
        }
  return o;
}

/* linear: rows split (data parallel, no communication), the weight split on
   its first axis (column parallel, the output split alike), and rows split
   then gathered for a replicated output (AG + linear, also pipelined on
   streams). nvFuser's LinearOp tests and DistributedTransformerTest's MLP. */
TEST(test_ops_linear, "ops/linear", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, m;
  for (wi = 0; wi < 5; wi++)
    for (m = 0; m < 6; m++) { /* 4, 5: modes 0 and 1 followed by gelu_tanh, relu (the GEMM's epilogue) */
      int mode = m % 4, D = worlds[wi], split_weight = mode == 1, with_bias = mode != 2;
      hir_unary_op act = m == 4 ? HIR_UNARY_GELU_TANH : m == 5 ? HIR_UNARY_RELU : HIR_UNARY_COUNT;
      hir_dtype dt = all_dtypes[(wi + mode) % 4];
      int64_t sa[3] = {D, 3, 4}, sw[3] = {D, 5, 4}, sb[2] = {D, 5};
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, dt, split_weight ? 2 : 3), *w = hir_input(f, dt, split_weight ? 3 : 2), *b = with_bias ? hir_input(f, dt, split_weight ? 2 : 1) : NULL;
      hir_tv *y = hir_linear(f, a, w, b);
      if (act != HIR_UNARY_COUNT) y = hir_unary(f, act, y);
      hir_output(f, y);
      hir_set_mesh(a, D, iota_mesh);
      hir_set_mesh(w, D, iota_mesh);
      if (b) hir_set_mesh(b, D, iota_mesh);
      if (mode != 1) hir_parallelize(a, 0, HIR_DIDX);
      if (split_weight) {
        hir_parallelize(w, 0, HIR_DIDX);
        hir_parallelize(b, 0, HIR_DIDX);
      }
      if (mode >= 2) { /* the output whole: the rows gathered first; mode 3 pipelines it on streams */
        hir_set_mesh(y, D, iota_mesh);
        if (mode == 3) hir_parallelize(y, 0, HIR_STREAM);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 2 + with_bias, 1);
      c.in[0] = split_weight ? trand(dt, 2, sa + 1) : trand(dt, 3, sa);
      c.in[1] = trand(dt, split_weight ? 3 : 2, split_weight ? sw : sw + 1);
      if (b) c.in[2] = trand(dt, split_weight ? 2 : 1, split_weight ? sb : sb + 1);
      c.out[0] = ref_linear(&c.in[0], &c.in[1], b ? &c.in[2] : NULL, split_weight);
      if (act != HIR_UNARY_COUNT) {
        int64_t i;
        for (i = 0; i < tnumel(&c.out[0]); i++) tset(&c.out[0], i, ref_unary(act, tget(&c.out[0], i), 0));
      }
      c.tol = dt == HIR_F64 ? 1e-12 : dt == HIR_F32 ? 1e-5 : op_tol(dt) * 4;
      c.prealloc = wi & 1;
      RUN_CASE(&c, m == 4 ? "gelu_tanh(linear_rows_split)" : m == 5 ? "relu(linear_column_parallel)" : mode == 0 ? "linear_rows_split"
                   : mode == 1 ? "linear_column_parallel" : mode == 2 ? "ag_linear" : "ag_linear_streams");
      hir_fusion_free(f);
    }
}

/* linear with a weight and a bias broadcast along a batch axis (size 1
   where the output has B): the bias is read again for every batch, not
   past its end (the bias and fp8 scales were once mapped onto the output's
   axes with their size-1 axis's stride). */
TEST(test_ops_linear_broadcast_bias, "ops/linear_broadcast_bias", TEST_CPU | TEST_GPU_WORLDS) {
  int di;
  for (di = 0; di < 4; di++) {
    hir_dtype dt = all_dtypes[di];
    int64_t sa[3] = {3, 2, 8}, sw[2] = {5, 8}, sb[1] = {5};
    int flags_w[3] = {1, 0, 0}, flags_b[2] = {1, 0};
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, dt, 3), *w = hir_input(f, dt, 2), *b = hir_input(f, dt, 1);
    hir_output(f, hir_linear(f, a, hir_broadcast(f, w, 3, flags_w), hir_broadcast(f, b, 2, flags_b)));
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, 1, f, 3, 1);
    c.in[0] = trand(dt, 3, sa);
    c.in[1] = trand(dt, 2, sw);
    c.in[2] = trand(dt, 1, sb);
    c.out[0] = ref_linear(&c.in[0], &c.in[1], &c.in[2], 0); /* the values broadcast, not copied: the same product */
    c.tol = dt == HIR_F64 ? 1e-12 : dt == HIR_F32 ? 1e-5 : op_tol(dt) * 4;
    c.prealloc = di & 1;
    RUN_CASE(&c, "linear_broadcast_bias");
    hir_fusion_free(f);
  }
}

/* gelu_tanh(linear) runs as one op (the plan says the MatmulOp takes the
   UnaryOp), with the numbers of the two; where the linear's output is also
   a fusion output, the two stay apart. Mirrors nvFuser's LinearOp + GELU
   (the MLP's first half, as cuBLASLt's GELU_BIAS epilogue runs it). */
TEST(test_ops_linear_epilogue, "ops/linear_epilogue", TEST_CPU) {
  int keep;
  for (keep = 0; keep < 2; keep++) {
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F32, 3), *w = hir_input(f, HIR_F32, 2), *b = hir_input(f, HIR_F32, 1);
    hir_tv *y = hir_linear(f, a, w, b), *g = hir_unary(f, HIR_UNARY_GELU_TANH, y);
    int64_t sa[3] = {2, 3, 4}, sw[2] = {5, 4}, sb[1] = {5}, i;
    hir_tensor in[3], out[2], want;
    hir_program *p = NULL;
    hir_evaluator *ev = NULL;
    hir_output(f, g);
    if (keep) hir_output(f, y);
    in[0] = trand(HIR_F32, 3, sa), in[1] = trand(HIR_F32, 2, sw), in[2] = trand(HIR_F32, 1, sb);
    want = ref_linear(&in[0], &in[1], &in[2], 0);
    memset(out, 0, sizeof out);
    CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, NULL, &ev) == HIR_OK);
    CHECK(ev && hir_run(ev, in, 3, out, 1 + keep) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
    CHECK((strstr(hir_program_plan(p), "epilogue: MatmulOp") != NULL) == !keep);
    for (i = 0; ev && i < tnumel(&want); i++) {
      CHECK(fabs(tget(&out[0], i) - ref_unary(HIR_UNARY_GELU_TANH, tget(&want, i), 0)) < 1e-5);
      if (keep) CHECK(fabs(tget(&out[1], i) - tget(&want, i)) < 1e-5);
    }
    if (hir_test_failures) fprintf(stderr, "  plan: %s\n", p ? hir_program_plan(p) : "");
    for (i = 0; i < 3; i++) tfree(&in[i]);
    tfree(&want);
    hir_evaluator_free(ev);
    hir_program_free(p);
    hir_fusion_free(f);
  }
}

/* A reshape that keeps a split axis (size 0): kept first (axis 0, the
   others reshaped), kept last with as many axes on both sides, or kept
   between changed axes ([2, D, 3] -> [3, D, 2]), where row-major order
   mixes the D rows: that one is gathered first, the others stay split.
   Every world, against the row-major reference. */
TEST(test_ops_reshape_kept_axis, "ops/reshape_kept_axis", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, which;
  for (wi = 0; wi < 5; wi++)
    for (which = 0; which < 3; which++) {
      int D = worlds[wi], split = which == 0 ? 0 : which == 1 ? 2 : 1;
      hir_dtype dt = all_dtypes[(wi + which) % 4];
      int64_t first_in[3] = {D, 2, 3}, first_ask[3] = {0, 3, 2}, last_in[3] = {2, 3, D}, last_ask[3] = {3, 2, 0};
      int64_t mid_in[3] = {2, D, 3}, mid_ask[3] = {3, 0, 2}, osz[3], i;
      const int64_t *sz = which == 0 ? first_in : which == 1 ? last_in : mid_in, *ask = which == 0 ? first_ask : which == 1 ? last_ask : mid_ask;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 3), *y = hir_reshape(f, x, 3, ask);
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_parallelize(x, split, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, 1);
      for (i = 0; i < 3; i++) osz[i] = ask[i] ? ask[i] : sz[i];
      c.in[0] = trand(dt, 3, sz);
      c.out[0] = tn(dt, 3, osz);
      for (i = 0; i < tnumel(&c.in[0]); i++) tset(&c.out[0], i, tget(&c.in[0], i)); /* row-major order is what a reshape keeps */
      c.tol = 0;
      c.prealloc = wi & 1;
      c.layout = 1;
      RUN_CASE(&c, which == 0 ? "reshape keeping axis 0" : which == 1 ? "reshape keeping the last axis" : "reshape keeping a middle axis");
      hir_fusion_free(f);
    }
}

/* select, slice and reshape of a tensor split on axis 0: along other axes
   each rank works on its shard; along the split axis (or a reshape merging
   it) the tensor is gathered first; slices with steps and negative bounds
   (Python's in[start:stop:step]). Mirrors nvFuser's SelectOp / SliceOp
   (SliceTest's negative indices) / ReshardingTest view cases. */
TEST(test_ops_select_slice_reshape, "ops/select_slice_reshape", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, which;
  for (wi = 0; wi < 5; wi++)
    for (which = 0; which < 10; which++) {
      int D = worlds[wi];
      hir_dtype dt = all_dtypes[(wi + which) % 4];
      int64_t sz[3] = {D, 4, 6}, keep_merge[2] = {0, -1}, split_inner[4] = {0, 2, 2, 6}, merge_split[2] = {-1, 6};
      int64_t onto_split[3] = {4, D, 6};
      int64_t i, j, k, n = 0, osz[4];
      int ond = 0;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 3), *y = NULL;
      switch (which) {
      case 0: y = hir_select(f, x, 2, 3), ond = 2, osz[0] = D, osz[1] = 4; break;
      case 1: y = hir_slice(f, x, 1, 1, 3), ond = 3, osz[0] = D, osz[1] = 2, osz[2] = 6; break;
      case 2: y = hir_reshape(f, x, 2, keep_merge), ond = 2, osz[0] = D, osz[1] = 24; break;
      case 3: y = hir_reshape(f, x, 4, split_inner), ond = 4, osz[0] = D, osz[1] = 2, osz[2] = 2, osz[3] = 6; break;
      case 4: y = hir_select(f, x, 0, D - 1), ond = 2, osz[0] = 4, osz[1] = 6; break;   /* along the split axis */
      case 5: y = hir_reshape(f, x, 2, merge_split), ond = 2, osz[0] = D * 4, osz[1] = 6; break;
      case 6: y = hir_reshape(f, x, 3, onto_split), ond = 3, osz[0] = 4, osz[1] = D, osz[2] = 6; break; /* x whole, y split */
      case 7: y = hir_slice_step(f, x, 2, 1, HIR_END, 2), ond = 3, osz[0] = D, osz[1] = 4, osz[2] = 3; break; /* x[:, :, 1::2] */
      case 8: y = hir_slice_step(f, x, 1, -3, -1, 1), ond = 3, osz[0] = D, osz[1] = 2, osz[2] = 6; break;     /* x[:, -3:-1] */
      default: y = hir_slice_step(f, x, 2, -5, 6, 3), ond = 3, osz[0] = D, osz[1] = 4, osz[2] = 2; break;     /* x[:, :, -5:6:3] */
      }
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      if (which == 6) {
        hir_set_mesh(y, D, iota_mesh);
        hir_parallelize(y, 1, HIR_DIDX);
      } else {
        hir_parallelize(x, 0, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(dt, 3, sz);
      c.out[0] = tn(dt, ond, osz);
      for (i = 0; i < D; i++) /* row-major order is what a reshape keeps; select and slice pick */
        for (j = 0; j < 4; j++)
          for (k = 0; k < 6; k++) {
            double v = tget(&c.in[0], (i * 4 + j) * 6 + k);
            if (which == 0 && k == 3) tset(&c.out[0], i * 4 + j, v);
            if (which == 1 && j >= 1 && j < 3) tset(&c.out[0], (i * 2 + j - 1) * 6 + k, v);
            if (which == 2 || which == 3 || which == 5 || which == 6) tset(&c.out[0], n++, v);
            if (which == 4 && i == D - 1) tset(&c.out[0], j * 6 + k, v);
            if (which == 7 && k % 2 == 1) tset(&c.out[0], (i * 4 + j) * 3 + k / 2, v);
            if (which == 8 && j >= 1 && j < 3) tset(&c.out[0], (i * 2 + j - 1) * 6 + k, v);
            if (which == 9 && (k == 1 || k == 4)) tset(&c.out[0], (i * 4 + j) * 2 + k / 3, v);
          }
      c.tol = 0;
      c.prealloc = wi & 1;
      c.layout = 1; /* also with transposed layouts, on the GPUs too */
      RUN_CASE(&c, "select_slice_reshape");
      hir_fusion_free(f);
    }
}

/* int64 tensors: nvFuser's HostIrIntegrationTest.TensorAndScalarInputs
   ((x + s0) * s1 of an int64 x and scalar inputs), and exactness beyond
   2^53: sums across the devices (an Allreduce), a gather, a local sum and
   max, wrapping add and mul, neg and abs of the most negative, comparisons,
   indices, casts both ways (to int64 toward zero, NaN the most negative),
   on worlds 1-8; the ops int64 refuses. */
static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static int64_t to_i64(double v) { /* toward zero, saturating, NaN the most negative (CUDA's __double2ll_rz) */
  return v != v || v <= -9223372036854775808.0 ? INT64_MIN : v >= 9223372036854775808.0 ? INT64_MAX : (int64_t)v;
}
static uint64_t test_u64(void) {
  uint64_t v = 0;
  int k;
  for (k = 0; k < 4; k++) v = (v << 16) ^ (uint64_t)(urand() * 32767 + 32768);
  return v;
}

TEST(test_ops_int64, "ops/int64", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 2; form++) {
      int D = worlds[wi], zero = 0, one = 1;
      int64_t sx[2] = {D, 4}, s1[1] = {4}, sd[1] = {D}, i, j;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_I64, 2);
      if (form == 0) { /* (x + s0) * s1, x sharded by rows */
        hir_val *s0 = hir_input_scalar(f), *s1v = hir_input_scalar(f);
        hir_output(f, hir_binary_val(f, HIR_BINARY_MUL, hir_binary_val(f, HIR_BINARY_ADD, x, s0), s1v));
      } else {
        hir_tv *y = hir_input(f, HIR_I64, 2), *g = hir_input(f, HIR_F32, 2);
        hir_output(f, hir_sum(f, x, 1, &zero));                                   /* an Allreduce, exact */
        hir_output(f, hir_set(f, x));                                             /* gathered */
        hir_output(f, hir_add(f, hir_mul(f, x, y), hir_binary_scalar(f, HIR_BINARY_MUL, x, 3))); /* wrapping */
        hir_output(f, hir_add(f, hir_neg(f, y), hir_abs(f, y)));
        hir_output(f, hir_add(f, hir_lt(f, x, y), hir_binary_scalar(f, HIR_BINARY_LT, x, 0)));
        hir_output(f, hir_max(f, x, 1, &one));
        hir_output(f, hir_add(f, hir_sum(f, y, 1, &one), hir_iota(f, hir_sum(f, y, 1, &one), 0, HIR_I64)));
        hir_output(f, hir_cast(f, hir_cast(f, x, HIR_F64), HIR_I64));            /* rounded through double */
        hir_output(f, hir_cast(f, g, HIR_I64));
        hir_output(f, hir_cast(f, y, HIR_F32));
        hir_set_mesh(y, D, iota_mesh), hir_set_mesh(g, D, iota_mesh);
      }
      hir_set_mesh(x, D, iota_mesh);
      hir_parallelize(x, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 3, form == 0 ? 1 : 10);
      c.in[0] = tn(HIR_I64, 2, sx);
      if (form == 0) {
        int64_t a = 2 + wi, m = 3;
        for (i = 0; i < 4 * D; i++) ((int64_t *)c.in[0].data)[i] = 1 + (int64_t)((urand() + 1) * 4.4);
        memset(&c.in[1], 0, sizeof c.in[1]), memset(&c.in[2], 0, sizeof c.in[2]); /* the scalars, by value */
        c.in[1].sizes[0] = a, c.in[2].sizes[0] = m;
        c.out[0] = tn(HIR_I64, 2, sx);
        for (i = 0; i < 4 * D; i++) ((int64_t *)c.out[0].data)[i] = (((int64_t *)c.in[0].data)[i] + a) * m;
        c.tol = 0;
        RUN_CASE(&c, "TensorAndScalarInputs: (x + s0) * s1, int64");
      } else {
        int64_t *X, *Y;
        float *G;
        c.in[1] = tn(HIR_I64, 2, sx), c.in[2] = tn(HIR_F32, 2, sx);
        X = (int64_t *)c.in[0].data, Y = (int64_t *)c.in[1].data, G = (float *)c.in[2].data;
        for (i = 0; i < 4 * D; i++) X[i] = (int64_t)test_u64(), Y[i] = (int64_t)test_u64(), G[i] = (float)(urand() * 1e19);
        Y[0] = INT64_MIN, G[1] = NAN, G[2] = -3.75f, G[3] = 1e30f;
        c.out[0] = tn(HIR_I64, 1, s1), c.out[1] = tn(HIR_I64, 2, sx), c.out[2] = tn(HIR_I64, 2, sx), c.out[3] = tn(HIR_I64, 2, sx);
        c.out[4] = tn(HIR_I64, 2, sx), c.out[5] = tn(HIR_I64, 1, sd), c.out[6] = tn(HIR_I64, 1, sd), c.out[7] = tn(HIR_I64, 2, sx);
        c.out[8] = tn(HIR_I64, 2, sx), c.out[9] = tn(HIR_F32, 2, sx);
        for (j = 0; j < 4; j++) {
          int64_t t = 0;
          for (i = 0; i < D; i++) t = wrap_add(t, X[i * 4 + j]);
          ((int64_t *)c.out[0].data)[j] = t;
        }
        for (i = 0; i < 4 * D; i++) {
          double gd = G[i];
          ((int64_t *)c.out[1].data)[i] = X[i];
          ((int64_t *)c.out[2].data)[i] = wrap_add(wrap_mul(X[i], Y[i]), wrap_mul(X[i], 3));
          ((int64_t *)c.out[3].data)[i] = Y[i] < 0 && Y[i] != INT64_MIN ? wrap_mul(Y[i], -2) : 0; /* -y + |y|: -MIN + |MIN| wraps to 0 */
          ((int64_t *)c.out[4].data)[i] = (X[i] < Y[i]) + (X[i] < 0);
          ((int64_t *)c.out[7].data)[i] = to_i64((double)X[i]);
          ((int64_t *)c.out[8].data)[i] = to_i64(gd);
          ((float *)c.out[9].data)[i] = (float)Y[i];
        }
        for (i = 0; i < D; i++) {
          int64_t m = INT64_MIN, t = 0;
          for (j = 0; j < 4; j++) m = X[i * 4 + j] > m ? X[i * 4 + j] : m, t = wrap_add(t, Y[i * 4 + j]);
          ((int64_t *)c.out[5].data)[i] = m, ((int64_t *)c.out[6].data)[i] = t + i;
        }
        c.tol = 0;
        RUN_CASE(&c, "int64 beyond 2^53: sums, gathers, wrapping ops, casts");
      }
      hir_fusion_free(f);
    }
  { /* what int64 refuses, by name */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_I64, 2), *y = hir_input(f, HIR_I64, 2);
    CHECK(!hir_div(f, x, y) && strstr(hir_fusion_error(f), "BinaryOp: T0 is int64, which only moves, casts, add, sub, mul"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_I64, 2);
    CHECK(!hir_unary(f, HIR_UNARY_EXP, x) && strstr(hir_fusion_error(f), "cast it (hir_cast) to compute"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_I64, 2), y = hir_input(f, HIR_I64, 2);
    CHECK(!hir_matmul(f, x, y) && strstr(hir_fusion_error(f), "MatmulOp: T0 is int64"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_I64, 2);
    CHECK(!hir_binary_scalar(f, HIR_BINARY_ADD, x, 0.5) && strstr(hir_fusion_error(f), "the scalar 0.5 is not an integer"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_I64, 2);
    CHECK(!hir_rand(f, x, HIR_I64, hir_val_const(f, 1)) && strstr(hir_fusion_error(f), "random numbers are"));
    hir_fusion_free(f);
  }
}
