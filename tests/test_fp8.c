/* fp8: the conversions against a brute-force nearest
   value, casts, and hir_scaled_linear sharded the ways tensor parallelism
   shards it, on the local world (1, 2, 3, 4, 8 ranks) against a reference
   computed here in double from the fp8 values. torch._scaled_mm and
   Transformer Engine's fp8 Linear compute the same product; nvFuser's
   ScaledMmaOp tests mirror it. */
#include "test.h"

/* The fp8 code nearest x (ties to the even code), saturating: by scanning every finite code. */
static int fp8_nearest(double x, float (*decode)(uint8_t)) {
  int best = -1, c;
  double bd = 0;
  for (c = 0; c < 256; c++) {
    double v = decode((uint8_t)c), d;
    if (isnan(v) || isinf(v) || ((c & 0x80) != 0) != (x < 0)) continue; /* its own sign: -0 for small negatives */
    d = fabs(v - x);
    if (best < 0 || d < bd || (d == bd && !(c & 1) && (best & 1))) best = c, bd = d;
  }
  return best;
}

TEST(test_fp8_conversions, "fp8/conversions", TEST_CPU) {
  float (*dec[2])(uint8_t) = {hir_e4m3_to_float, hir_e5m2_to_float};
  uint8_t (*enc[2])(float) = {hir_float_to_e4m3, hir_float_to_e5m2};
  double max[2] = {448, 57344};
  int t, c, i;
  for (t = 0; t < 2; t++) {
    for (c = 0; c < 256; c++) { /* every finite code comes back */
      float v = dec[t]((uint8_t)c);
      if (!isnan(v) && !isinf(v)) CHECK(enc[t](v) == c);
    }
    CHECK(dec[t](enc[t](1e6f)) == max[t] && dec[t](enc[t](-1e6f)) == -max[t]);
    CHECK(dec[t](enc[t](INFINITY)) == max[t]); /* satfinite, as the GPUs' conversions */
    CHECK(isnan(dec[t](enc[t](NAN))));
    for (i = 0; i < 20000; i++) { /* random magnitudes over the whole range, subnormals included */
      double x = (urand() > 0 ? 1 : -1) * pow(2.0, -20.0 + 38.0 * (urand() + 1) / 2) * (1 + urand() / 2);
      int want = fabs(x) >= max[t] ? enc[t]((float)(x > 0 ? max[t] : -max[t])) : fp8_nearest((float)x, dec[t]);
      if (enc[t]((float)x) != want) {
        printf("  %s: %.9g encodes as 0x%02x, the nearest is 0x%02x\n", t ? "e5m2" : "e4m3", x, enc[t]((float)x), want);
        CHECK(0);
        break;
      }
    }
  }
  CHECK(dec[0](0x7e) == 448 && dec[0](0x01) == ldexpf(1, -9) && dec[1](0x01) == ldexpf(1, -16) && isinf(dec[1](0x7c)));
}

/* out [..., M, N] = sum_k a[..., M, k] * w[N, k] * a_scale (one, or per row) * w_scale (one, or per N); a 2-D a
   and a weight [B, N, K] give out [B, M, N] (w_scale one, or [B, N]). */
static hir_tensor ref_scaled(const hir_tensor *a, const hir_tensor *w, const hir_tensor *sa, const hir_tensor *sw, hir_dtype dt) {
  int64_t K = a->sizes[a->ndims - 1], rows = tnumel(a) / (K ? K : 1), N = w->sizes[w->ndims - 2], B = w->ndims == 3 ? w->sizes[0] : 1;
  int64_t r, n, k, bi, so[HIR_MAX_DIMS];
  hir_tensor o;
  int d, nd = 0;
  if (w->ndims == 3) so[nd++] = B;
  for (d = 0; d < a->ndims - 1; d++) so[nd++] = a->sizes[d];
  so[nd++] = N;
  o = tn(dt, nd, so);
  for (bi = 0; bi < B; bi++)
    for (r = 0; r < rows; r++)
      for (n = 0; n < N; n++) {
        double t = 0;
        for (k = 0; k < K; k++) t += tget(a, r * K + k) * tget(w, (bi * N + n) * K + k);
        tset(&o, (bi * rows + r) * N + n, t * tget(sa, tnumel(sa) == 1 ? 0 : r) * tget(sw, tnumel(sw) == 1 ? 0 : bi * N + n));
      }
  return o;
}

/* Positive scales of either kind, as quantization gives them. */
static hir_tensor scale_values(int nd, const int64_t *sizes) {
  hir_tensor s = tn(HIR_F32, nd, sizes);
  int64_t i;
  for (i = 0; i < tnumel(&s); i++) tset(&s, i, 0.25 + fabs(urand()));
  return s;
}

/* hir_scaled_linear: rows split (data parallel); the weight [D, N, K]
   split on its first axis with its scales (column parallel);
   rows and row scales gathered for a whole output (AG + GEMM), also
   pipelined on streams (the P2P ring); batched rows with per-row scales;
   each with fp8 kinds and output dtypes in turn. K and N multiples of 16,
   as GPUs' fp8 GEMMs take them. */
TEST(test_fp8_scaled_linear, "fp8/scaled_linear", TEST_CPU | TEST_GPU_WORLDS) {
  static const hir_dtype outs[3] = {HIR_BF16, HIR_F32, HIR_F16};
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 5; mode++) {
      int D = worlds[wi], rowwise = mode >= 2, column = mode == 1, gathered = mode == 2 || mode == 3;
      hir_dtype adt = (wi + mode) % 3 == 2 ? HIR_F8E5M2 : HIR_F8E4M3, out_dt = outs[(wi + mode) % 3];
      int64_t K = 32, sa[3] = {D, 3, K}, sw[3] = {D, 16, K}, one[1] = {1}, ssa[2] = {D, 3}, ssw[2] = {D, 16};
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, adt, column ? 2 : 3), *w = hir_input(f, HIR_F8E4M3, column ? 3 : 2);
      hir_tv *as = rowwise ? hir_input(f, HIR_F32, 2) : hir_input_sized(f, HIR_F32, 1, one);
      hir_tv *ws = column ? hir_input(f, HIR_F32, 2) : hir_input_sized(f, HIR_F32, 1, one);
      hir_tv *y = hir_scaled_linear(f, a, w, as, ws, out_dt);
      hir_output(f, y);
      if (mode != 4) { /* 4: batched rows on no mesh */
        hir_set_mesh(a, D, iota_mesh);
        hir_set_mesh(w, D, iota_mesh);
        hir_set_mesh(as, D, iota_mesh);
        hir_set_mesh(ws, D, iota_mesh);
        if (!column) hir_parallelize(a, 0, HIR_DIDX);
        if (rowwise) hir_parallelize(as, 0, HIR_DIDX);
        if (column) {
          hir_parallelize(w, 0, HIR_DIDX);
          hir_parallelize(ws, 0, HIR_DIDX);
        }
        if (gathered) hir_set_mesh(y, D, iota_mesh);
        if (mode == 3) hir_parallelize(y, 0, HIR_STREAM);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 4, 1);
      c.in[0] = column ? trand(adt, 2, sa + 1) : trand(adt, 3, sa);
      c.in[1] = column ? trand(HIR_F8E4M3, 3, sw) : trand(HIR_F8E4M3, 2, sw + 1);
      c.in[2] = rowwise ? scale_values(2, ssa) : scale_values(1, one);
      c.in[3] = column ? scale_values(2, ssw) : scale_values(1, one);
      c.out[0] = ref_scaled(&c.in[0], &c.in[1], &c.in[2], &c.in[3], out_dt);
      c.tol = out_dt == HIR_F32 ? 1e-3 : out_dt == HIR_F16 ? 2e-3 : 1.6e-2; /* f32: Hopper's fp8 MMA accumulates to ~2^-13 */
      c.prealloc = wi & 1;
      RUN_CASE(&c, mode == 0 ? "scaled_linear_rows_split" : mode == 1 ? "scaled_linear_column_parallel"
                   : mode == 2 ? "ag_scaled_linear_rowwise" : mode == 3 ? "ag_scaled_linear_streams" : "scaled_linear_batched_rowwise");
      hir_fusion_free(f);
    }
}

/* hir_scaled_linear of a 4-D A chunked on streams along its second axis:
   each chunk's A and output are strided batches, which cuBLASLt's fp8 GEMM
   does not fold into M; the CUDA backend makes them dense first (and copies
   the output back). Per-row and per-column scales, bf16 and f32 out. */
TEST(test_fp8_strided_batches, "fp8/strided_batches", TEST_CPU | TEST_GPU_WORLDS) {
  int k;
  for (k = 0; k < 2; k++) {
    int64_t K = 32, N = 16, sa[4] = {2, 3, 4, K}, sw[2] = {N, K}, ssa[3] = {2, 3, 4}, ssw[1] = {N};
    hir_dtype out_dt = k ? HIR_F32 : HIR_BF16;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F8E4M3, 4), *w = hir_input(f, HIR_F8E4M3, 2);
    hir_tv *as = hir_input(f, HIR_F32, 3), *ws = hir_input(f, HIR_F32, 1), *y = hir_scaled_linear(f, a, w, as, ws, out_dt);
    hir_output(f, y);
    hir_parallelize(y, 1, HIR_STREAM);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, 1, f, 4, 1);
    c.in[0] = trand(HIR_F8E4M3, 4, sa);
    c.in[1] = trand(HIR_F8E4M3, 2, sw);
    c.in[2] = scale_values(3, ssa);
    c.in[3] = scale_values(1, ssw);
    c.out[0] = ref_scaled(&c.in[0], &c.in[1], &c.in[2], &c.in[3], out_dt);
    c.tol = out_dt == HIR_F32 ? 1e-3 : 1.6e-2;
    c.prealloc = k;
    RUN_CASE(&c, "scaled_linear_strided_batches");
    hir_fusion_free(f);
  }
}

/* hir_scaled_linear of shapes cuBLASLt's fp8 GEMM does not take (K and N
   not multiples of 16, M odd, batched): the CUDA backend widens the values
   to bf16 (exactly) for cuBLAS and applies the scales itself. One value or
   per row, e4m3 and e5m2, bf16 and f32 out, on 1-3 ranks (rows split). */
TEST(test_fp8_any_shape, "fp8/any_shape", TEST_CPU | TEST_GPU_WORLDS) {
  int k;
  for (k = 0; k < 6; k++) {
    int D = 1 + k % 3, rowwise = k % 2;
    int64_t K = 5 + 2 * k, N = 3 + k, sa[3] = {D, 7, K}, sw[2] = {N, K}, ssa[2] = {D, 7}, ssw[1] = {N}, one[1] = {1};
    hir_dtype adt = k < 3 ? HIR_F8E4M3 : HIR_F8E5M2, out_dt = k % 3 ? HIR_F32 : HIR_BF16;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, adt, 3), *w = hir_input(f, HIR_F8E4M3, 2);
    hir_tv *as = rowwise ? hir_input(f, HIR_F32, 2) : hir_input_sized(f, HIR_F32, 1, one);
    hir_tv *ws = rowwise ? hir_input(f, HIR_F32, 1) : hir_input_sized(f, HIR_F32, 1, one);
    hir_tv *y = hir_scaled_linear(f, a, w, as, ws, out_dt);
    hir_output(f, y);
    hir_set_mesh(a, D, iota_mesh);
    hir_set_mesh(w, D, iota_mesh);
    hir_set_mesh(as, D, iota_mesh);
    hir_set_mesh(ws, D, iota_mesh);
    hir_parallelize(a, 0, HIR_DIDX);
    if (rowwise) hir_parallelize(as, 0, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 4, 1);
    c.in[0] = trand(adt, 3, sa);
    c.in[1] = trand(HIR_F8E4M3, 2, sw);
    c.in[2] = rowwise ? scale_values(2, ssa) : scale_values(1, one);
    c.in[3] = rowwise ? scale_values(1, ssw) : scale_values(1, one);
    c.out[0] = ref_scaled(&c.in[0], &c.in[1], &c.in[2], &c.in[3], out_dt);
    c.tol = out_dt == HIR_F32 ? 1e-4 : 1.6e-2; /* f32: exact products, summed in f32 */
    c.prealloc = k & 1;
    RUN_CASE(&c, "scaled_linear_any_shape");
    hir_fusion_free(f);
  }
}

/* hir_scaled_linear whose output has a Stream axis on N: each chunk is a
   GEMM of one output column (N 1, K 16), a strided view, with per-row and
   per-column scales. cuBLASLt's heuristic offered an fp8 GEMM for N 1 that
   wrote wrong rows (found by the differential check, seed 1823); such a
   chunk goes to the widened GEMM. */
TEST(test_fp8_stream_on_n, "fp8/stream_on_n", TEST_CPU | TEST_GPU_WORLDS) {
  int k;
  for (k = 0; k < 2; k++) {
    int64_t K = 16, N = 16, sa[3] = {2, 4, K}, sw[2] = {N, K}, ssa[2] = {2, 4}, ssw[1] = {N};
    hir_dtype out_dt = k ? HIR_BF16 : HIR_F32;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *a = hir_input(f, HIR_F8E4M3, 3), *w = hir_input(f, HIR_F8E4M3, 2);
    hir_tv *as = hir_input(f, HIR_F32, 2), *ws = hir_input(f, HIR_F32, 1), *y = hir_scaled_linear(f, a, w, as, ws, out_dt);
    hir_output(f, y);
    hir_parallelize(y, 2, HIR_STREAM);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, 1, f, 4, 1);
    c.in[0] = trand(HIR_F8E4M3, 3, sa);
    c.in[1] = trand(HIR_F8E4M3, 2, sw);
    c.in[2] = scale_values(2, ssa);
    c.in[3] = scale_values(1, ssw);
    c.out[0] = ref_scaled(&c.in[0], &c.in[1], &c.in[2], &c.in[3], out_dt);
    c.tol = out_dt == HIR_F32 ? 1e-4 : 1.6e-2;
    c.prealloc = k;
    RUN_CASE(&c, "scaled_linear_stream_on_n");
    hir_fusion_free(f);
  }
}

/* fp8 GEMM + reduce-scatter (the row-parallel linear: K split): each rank's
   A [1 (DIDx), D, m, k] and weight [1 (DIDx), N, k], scaled_linear summed
   over the ranks, rank j keeping rows j: out [D (DIDx), m, N]; the scales
   one value each (replicated), or A's per row and the weight's per column
   on each rank ([1 (DIDx), D, m] and [1 (DIDx), N]: each rank quantized its
   part of K); serial, and pipelined on streams (the P2P reduce-scatter). The
   partial products are f32, summed, then cast to the output dtype (partials
   in bf16 would round D times before the sum: torch's
   _fused_scaled_matmul_reduce_scatter does that; Transformer Engine's fp8
   Linear with ub_overlap_rs computes the same function). */
TEST(test_fp8_gemm_rs, "fp8/gemm_rs", TEST_CPU | TEST_GPU_WORLDS) {
  static const hir_dtype outs[3] = {HIR_BF16, HIR_F32, HIR_F16};
  int wi, mode;
  for (wi = 0; wi < 5; wi++)
    for (mode = 0; mode < 4; mode++) {
      int D = worlds[wi], rowwise = mode == 1 || mode == 3, streams = mode >= 2, flags[4] = {0, 1, 0, 0};
      hir_dtype out_dt = outs[(wi + mode) % 3], wdt = (wi + mode) % 2 ? HIR_F8E5M2 : HIR_F8E4M3;
      int64_t m = 3, k = 32, N = 16, sa[4] = {D, D, m, k}, sw[3] = {D, N, k}, ssa[3] = {D, D, m}, ssw[2] = {D, N}, one[1] = {1},
              so[3] = {D, m, N};
      int64_t r, j, i, n, q;
      hir_tensor ref;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *a = hir_input(f, HIR_F8E4M3, 4), *w = hir_input(f, wdt, 3);
      hir_tv *as = rowwise ? hir_input(f, HIR_F32, 3) : hir_input_sized(f, HIR_F32, 1, one);
      hir_tv *ws = rowwise ? hir_input(f, HIR_F32, 2) : hir_input_sized(f, HIR_F32, 1, one);
      hir_tv *p = hir_scaled_linear(f, a, hir_broadcast(f, w, 4, flags), as, rowwise ? hir_broadcast(f, ws, 3, flags) : ws, HIR_F32);
      hir_tv *sum, *y;
      int sum_axis = 0;
      sum = hir_sum(f, p, 1, &sum_axis);
      y = hir_cast(f, sum, out_dt);
      hir_output(f, y);
      hir_set_mesh(a, D, iota_mesh);
      hir_set_mesh(w, D, iota_mesh);
      hir_set_mesh(as, D, iota_mesh);
      hir_set_mesh(ws, D, iota_mesh);
      hir_set_mesh(sum, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_parallelize(a, 0, HIR_DIDX);
      hir_parallelize(w, 0, HIR_DIDX);
      if (rowwise) hir_parallelize(as, 0, HIR_DIDX), hir_parallelize(ws, 0, HIR_DIDX);
      if (streams) hir_parallelize(p, 1, HIR_STREAM);
      hir_parallelize(sum, 1, HIR_DIDX); /* [r (summed), D (DIDx), m, N] */
      hir_parallelize(y, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 4, 1);
      c.in[0] = trand(HIR_F8E4M3, 4, sa);
      c.in[1] = trand(wdt, 3, sw);
      c.in[2] = rowwise ? scale_values(3, ssa) : scale_values(1, one);
      c.in[3] = rowwise ? scale_values(2, ssw) : scale_values(1, one);
      ref = tn(out_dt, 3, so); /* rows j: the sum over ranks r of their products of rows j */
      for (j = 0; j < D; j++)
        for (i = 0; i < m; i++)
          for (n = 0; n < N; n++) {
            double t = 0;
            for (r = 0; r < D; r++) {
              double dot = 0;
              for (q = 0; q < k; q++) dot += tget(&c.in[0], ((r * D + j) * m + i) * k + q) * tget(&c.in[1], (r * N + n) * k + q);
              t += dot * tget(&c.in[2], rowwise ? (r * D + j) * m + i : 0) * tget(&c.in[3], rowwise ? r * N + n : 0);
            }
            tset(&ref, (j * m + i) * N + n, t);
          }
      c.out[0] = ref;
      c.tol = out_dt == HIR_F32 ? 1e-3 : out_dt == HIR_F16 ? 2e-3 : 1.6e-2;
      c.prealloc = wi & 1;
      RUN_CASE(&c, mode == 0 ? "gemm_rs_scaled" : mode == 1 ? "gemm_rs_scaled_rowwise"
                   : mode == 2 ? "gemm_rs_scaled_streams" : "gemm_rs_scaled_rowwise_streams");
      hir_fusion_free(f);
    }
}

/* fp8 moves and casts: x (f32) cast to fp8, gathered as fp8 (a quarter of
   the bytes), cast back. */
TEST(test_fp8_cast_and_move, "fp8/cast_and_move", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, kind;
  for (wi = 0; wi < 5; wi++)
    for (kind = 0; kind < 2; kind++) {
      int D = worlds[wi];
      hir_dtype f8 = kind ? HIR_F8E5M2 : HIR_F8E4M3;
      int64_t sz[2] = {D, 7}, i;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, HIR_F32, 2), *q = hir_cast(f, x, f8), *g = hir_set(f, q), *y = hir_cast(f, g, HIR_F32);
      hir_output(f, y);
      hir_set_mesh(x, D, iota_mesh);
      hir_set_mesh(q, D, iota_mesh);
      hir_set_mesh(g, D, iota_mesh);
      hir_set_mesh(y, D, iota_mesh);
      hir_parallelize(x, 0, HIR_DIDX);
      hir_parallelize(q, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, 1);
      c.in[0] = trand(HIR_F32, 2, sz);
      for (i = 0; i < 7 * D; i++) tset(&c.in[0], i, tget(&c.in[0], i) * 300); /* beyond e4m3's 448 too: saturated */
      c.out[0] = tn(HIR_F32, 2, sz);
      for (i = 0; i < 7 * D; i++) {
        float v = (float)tget(&c.in[0], i);
        tset(&c.out[0], i, kind ? hir_e5m2_to_float(hir_float_to_e5m2(v)) : hir_e4m3_to_float(hir_float_to_e4m3(v)));
      }
      c.tol = 0;
      RUN_CASE(&c, kind ? "cast_e5m2_gather" : "cast_e4m3_gather");
      hir_fusion_free(f);
    }
}

/* A scaled linear of a [3, 32] and a weight [16, 32], its scales declared per
   row (row_a, row_w) or one value, given na and nw values: refused by the
   run with a message holding `want`, never read past. */
static void fp8_refused_run(int row_a, int row_w, int64_t na, int64_t nw, const char *want) {
  int64_t sa[2] = {3, 32}, sw[2] = {16, 32}, one[1] = {1}, sna[1], snw[1];
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F8E4M3, 2), *w = hir_input(f, HIR_F8E4M3, 2);
  hir_tv *as = row_a ? hir_input(f, HIR_F32, 1) : hir_input_sized(f, HIR_F32, 1, one);
  hir_tv *ws = row_w ? hir_input(f, HIR_F32, 1) : hir_input_sized(f, HIR_F32, 1, one);
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[4], out[1];
  memset(out, 0, sizeof out);
  sna[0] = na, snw[0] = nw;
  hir_output(f, hir_scaled_linear(f, a, w, as, ws, HIR_F32));
  CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, NULL, &ev) == HIR_OK);
  in[0] = trand(HIR_F8E4M3, 2, sa), in[1] = trand(HIR_F8E4M3, 2, sw), in[2] = scale_values(1, sna), in[3] = scale_values(1, snw);
  CHECK(hir_run(ev, in, 4, out, 1) == HIR_ERR_SHAPE && strstr(hir_evaluator_error(ev), want));
  tfree(&in[0]), tfree(&in[1]), tfree(&in[2]), tfree(&in[3]);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
}

/* What fp8 cannot do names the tensor and the way out. */
TEST(test_fp8_errors, "fp8/errors", TEST_CPU) {
  int64_t one[1] = {1};
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F8E4M3, 2), *b = hir_input(f, HIR_F8E4M3, 2), *s;
  CHECK(hir_add(f, a, b) == NULL && strstr(hir_fusion_error(f), "T0 is __e4m3, an fp8 dtype") &&
        strstr(hir_fusion_error(f), "hir_cast"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F8E5M2, 2), b = hir_input(f, HIR_F8E5M2, 2);
  s = hir_input_sized(f, HIR_F32, 1, one);
  CHECK(hir_scaled_linear(f, a, b, s, s, HIR_BF16) == NULL && strstr(hir_fusion_error(f), "not both e5m2"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F8E4M3, 2), b = hir_input(f, HIR_F8E4M3, 2), s = hir_input(f, HIR_F16, 1);
  CHECK(hir_scaled_linear(f, a, b, s, hir_input_sized(f, HIR_F32, 1, one), HIR_BF16) == NULL &&
        strstr(hir_fusion_error(f), "a_scale (T2) is __half"));
  hir_fusion_free(f);
  f = hir_fusion_create();
  a = hir_input(f, HIR_F8E4M3, 2), b = hir_input(f, HIR_F8E4M3, 2);
  s = hir_input_sized(f, HIR_F32, 1, one);
  CHECK(hir_scaled_linear(f, a, b, s, s, HIR_F8E4M3) == NULL && strstr(hir_fusion_error(f), "output dtype __e4m3"));
  hir_fusion_free(f);
  fp8_refused_run(1, 0, 2, 1, "a_scale holds one value");  /* 2 row scales for 3 rows */
  fp8_refused_run(0, 1, 1, 1, "w_scale holds one value");  /* one value for scales declared per N (the fuzzer found it read past it) */
}

/* The printer names the op as nvFuser's dumps would read it. */
TEST(test_fp8_print, "fp8/print", TEST_CPU) {
  int64_t one[1] = {1};
  char text[2048];
  hir_fusion *f = hir_fusion_create();
  hir_tv *a = hir_input(f, HIR_F8E4M3, 2), *w = hir_input(f, HIR_F8E5M2, 2), *as = hir_input(f, HIR_F32, 1);
  hir_tv *ws = hir_input_sized(f, HIR_F32, 1, one);
  hir_output(f, hir_scaled_linear(f, a, w, as, ws, HIR_BF16));
  hir_fusion_snprint(f, text, sizeof text);
  CHECK(strstr(text, "T4_g___bfloat[iS") && strstr(text, "= scaled_linear(T0_g___e4m3[iS0{i0}, iS1{i2}],") &&
        strstr(text, "T1_g___e5m2[iS2{i3}, iS3{i4}],") && strstr(text, "T3_g_float[iS5{1}])"));
  hir_fusion_free(f);
}

/* The AG pipeline with row scales of the wrong length: the scales' gather
   shares the rows' loop (their extent), so the run must check their size
   against it and refuse on every rank, never read past them. */
typedef struct fp8_bad_scales {
  hir_local_world *w;
  hir_fusion *f;
  hir_tensor in[2][4];  /* each rank's, drawn before the ranks start (the generator is not thread-safe) */
  char error[2][512];
} fp8_bad_scales;

static hir_status fp8_bad_scales_rank(int rank, void *user) {
  fp8_bad_scales *x = (fp8_bad_scales *)user;
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor out[1];
  hir_status s;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  if ((s = hir_lower(x->f, &ld, &p)) == HIR_OK && (s = hir_evaluator_create(p, &ed, &ev)) == HIR_OK)
    s = hir_run(ev, x->in[rank], 4, out, 1);
  snprintf(x->error[rank], sizeof x->error[rank], "%s", ev ? hir_evaluator_error(ev) : hir_program_error(p));
  hir_evaluator_free(ev);
  hir_program_free(p);
  return s;
}

TEST(test_fp8_bad_row_scales, "fp8/bad_row_scales", TEST_CPU) {
  int64_t one[1] = {1}, sa[3] = {1, 3, 32}, sw[2] = {16, 32}, ss[2] = {1, 2}; /* 2 row scales for 3 rows */
  int mesh[2] = {0, 1}, r, k;
  fp8_bad_scales x;
  hir_tv *a, *w, *as, *ws, *y;
  memset(&x, 0, sizeof x);
  for (r = 0; r < 2; r++)
    x.in[r][0] = trand(HIR_F8E4M3, 3, sa), x.in[r][1] = trand(HIR_F8E4M3, 2, sw), x.in[r][2] = scale_values(2, ss),
    x.in[r][3] = scale_values(1, one);
  x.f = hir_fusion_create();
  a = hir_input(x.f, HIR_F8E4M3, 3), w = hir_input(x.f, HIR_F8E4M3, 2), as = hir_input(x.f, HIR_F32, 2);
  ws = hir_input_sized(x.f, HIR_F32, 1, one);
  y = hir_scaled_linear(x.f, a, w, as, ws, HIR_BF16);
  hir_output(x.f, y);
  hir_set_mesh(a, 2, mesh), hir_set_mesh(w, 2, mesh), hir_set_mesh(as, 2, mesh), hir_set_mesh(ws, 2, mesh), hir_set_mesh(y, 2, mesh);
  hir_parallelize(a, 0, HIR_DIDX), hir_parallelize(as, 0, HIR_DIDX), hir_parallelize(y, 0, HIR_STREAM);
  x.w = hir_local_world_create(2);
  hir_local_world_set_timeout(x.w, 5000);
  CHECK(hir_spmd(2, fp8_bad_scales_rank, &x) == HIR_ERR_SHAPE);
  CHECK(strstr(x.error[0], "a_scale holds one value or a's shape without K") && !strcmp(x.error[0], x.error[1]));
  if (!strstr(x.error[0], "a_scale")) printf("  %s\n", x.error[0]);
  hir_local_world_free(x.w);
  hir_fusion_free(x.f);
  for (r = 0; r < 2; r++)
    for (k = 0; k < 4; k++) tfree(&x.in[r][k]);
}
