/* Attention: hir_max and hir_iota, and the scaled dot-product attention
   built of them (hir_sdpa, hir_sdpa_backward), sharded by heads, by query
   rows and by batch, against attention written here in double; then
   nvFuser's DistributedTransformerTest's multi-head attention, forward and
   backward, tensor parallel as it writes it ([D, ...] weights). */
#include "test.h"

/* hir_max over every axis pattern and hir_iota along each axis, on a split
   and sharded tensor; the max of a sharded axis (gathered first); NaN. */
TEST(test_attention_max_iota, "attention/max_iota", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 3; form++) {
      int D = worlds[wi], last = 2, first_two[2] = {0, 1}, mid = 1;
      hir_dtype dt = all_dtypes[(wi + form) % 4];
      int64_t sx[3] = {2 * D, 3, 5}, s2[2] = {2 * D, 5}, s1[1] = {5}, s3[2] = {2 * D, 3}, i, j, k;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 3);
      /* form 0: x's rows split, DIDx outer: max over the last axis and over the middle one, the index along
         each axis; form 1: x sharded on axis 0 (a DIDx of extent D times 2 is a split), max over the sharded
         axes (gathered first); form 2: one NaN in x, max over the last axis */
      hir_output(f, form == 1 ? hir_max(f, x, 2, first_two) : hir_max(f, x, 1, &last));
      if (form == 0) {
        hir_output(f, hir_max(f, x, 1, &mid));
        for (k = 0; k < 3; k++) hir_output(f, hir_iota(f, x, (int)k - (k == 2 ? 3 : 0), HIR_F32));
      }
      hir_set_mesh(x, D, iota_mesh);
      hir_split(x, 0, D, 1);
      hir_parallelize(x, 0, HIR_DIDX);
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, 1, form == 0 ? 5 : 1);
      c.in[0] = trand(dt, 3, sx);
      if (form == 2) tset(&c.in[0], 7, NAN);
      c.out[0] = form == 1 ? tn(dt, 1, s1) : tn(dt, 2, s3);
      for (i = 0; i < 2 * D; i++)
        for (j = 0; j < 3; j++) {
          double m = -INFINITY;
          for (k = 0; k < 5; k++) {
            double v = tget(&c.in[0], (i * 3 + j) * 5 + k);
            m = v != v || m != m ? NAN : v > m ? v : m;
          }
          if (form != 1) tset(&c.out[0], i * 3 + j, m);
        }
      if (form == 1)
        for (k = 0; k < 5; k++) {
          double m = -INFINITY;
          for (i = 0; i < 6 * D; i++) m = fmax(m, tget(&c.in[0], i * 5 + k));
          tset(&c.out[0], k, m);
        }
      if (form == 0) {
        c.out[1] = tn(dt, 2, s2);
        for (i = 0; i < 2 * D; i++)
          for (k = 0; k < 5; k++) {
            double m = -INFINITY;
            for (j = 0; j < 3; j++) m = fmax(m, tget(&c.in[0], (i * 3 + j) * 5 + k));
            tset(&c.out[1], i * 5 + k, m);
          }
        for (k = 0; k < 3; k++) {
          c.out[2 + k] = tn(HIR_F32, 3, sx);
          for (i = 0; i < 30 * D; i++) tset(&c.out[2 + k], i, k == 0 ? i / 15 : k == 1 ? i / 5 % 3 : i % 5);
        }
      }
      c.tol = 0;
      RUN_CASE(&c, form == 0 ? "max over an axis, iota along each" : form == 1 ? "max over the sharded axes" : "max with a NaN");
      hir_fusion_free(f);
    }
  { /* printed forms and refusals */
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input(f, HIR_F32, 2);
    int ax = 1, bad = 2;
    char text[4096];
    hir_output(f, hir_max(f, x, 1, &ax));
    hir_output(f, hir_iota(f, x, -1, HIR_F32));
    hir_fusion_snprint(f, text, sizeof text);
    CHECK(strstr(text, "op = max, initial value = -inf") && strstr(text, "= iota_like( T0_g_float") && strstr(text, "], axis = 1 );"));
    CHECK(!hir_iota(f, x, 2, HIR_F32) && strstr(hir_fusion_error(f), "hir_iota: axis 2 is out of range for T0"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_F32, 2);
    CHECK(!hir_max(f, x, 1, &bad) && strstr(hir_fusion_error(f), "hir_max: axis 2 is out of range"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    x = hir_input(f, HIR_F8E4M3, 2);
    CHECK(!hir_max(f, x, 1, &ax) && strstr(hir_fusion_error(f), "an fp8 dtype"));
    hir_fusion_free(f);
  }
}

/* Attention in double over nb (batch x heads) independent problems:
   q [nb, L, E], k [nb, S, E], v [nb, S, Ev]; the dropout's numbers are
   hir_rand's of the weights' logical places [nb, L, S]. out [nb, L, Ev],
   lse [nb, L]; with dout, the gradients. */
typedef struct ref_attention {
  int64_t nb, L, S, E, Ev;
  double scale, dropout;
  int causal;
  uint64_t seed;
} ref_attention;

static double ref_weight_keep(const ref_attention *a, int64_t b, int64_t i, int64_t j) {
  if (!(a->dropout > 0)) return 1;
  return ref_rand(a->seed, (uint64_t)((b * a->L + i) * a->S + j), 24) < 1 - a->dropout ? 1 / (1 - a->dropout) : 0;
}

/* p[b][i][j], the softmax's weights before the dropout, and lse. */
static void ref_attention_weights(const ref_attention *a, const double *q, const double *k, double *p, double *lse) {
  int64_t b, i, j, e;
  for (b = 0; b < a->nb; b++)
    for (i = 0; i < a->L; i++) {
      double *row = p + (b * a->L + i) * a->S, m = -INFINITY, sum = 0;
      for (j = 0; j < a->S; j++) {
        double s = 0;
        for (e = 0; e < a->E; e++) s += q[(b * a->L + i) * a->E + e] * k[(b * a->S + j) * a->E + e];
        row[j] = a->causal && j > i ? -INFINITY : s * a->scale;
        m = fmax(m, row[j]);
      }
      for (j = 0; j < a->S; j++) sum += row[j] = exp(row[j] - m);
      for (j = 0; j < a->S; j++) row[j] /= sum;
      if (lse) lse[b * a->L + i] = m + log(sum);
    }
}

static void ref_attention_forward(const ref_attention *a, const double *q, const double *k, const double *v, double *out,
                                  double *lse) {
  double *p = (double *)malloc(sizeof(double) * (size_t)(a->nb * a->L * a->S));
  int64_t b, i, j, e;
  ref_attention_weights(a, q, k, p, lse);
  for (b = 0; b < a->nb; b++)
    for (i = 0; i < a->L; i++)
      for (e = 0; e < a->Ev; e++) {
        double t = 0;
        for (j = 0; j < a->S; j++) t += p[(b * a->L + i) * a->S + j] * ref_weight_keep(a, b, i, j) * v[(b * a->S + j) * a->Ev + e];
        out[(b * a->L + i) * a->Ev + e] = t;
      }
  free(p);
}

static void ref_attention_backward(const ref_attention *a, const double *q, const double *k, const double *v, const double *dout,
                                   double *dq, double *dk, double *dv) {
  size_t n = (size_t)(a->nb * a->L * a->S);
  double *p = (double *)malloc(sizeof(double) * n), *ds = (double *)malloc(sizeof(double) * n);
  double *out = (double *)malloc(sizeof(double) * (size_t)(a->nb * a->L * a->Ev));
  int64_t b, i, j, e;
  ref_attention_forward(a, q, k, v, out, NULL);
  ref_attention_weights(a, q, k, p, NULL);
  for (b = 0; b < a->nb; b++)
    for (i = 0; i < a->L; i++) {
      double delta = 0;
      for (e = 0; e < a->Ev; e++) delta += dout[(b * a->L + i) * a->Ev + e] * out[(b * a->L + i) * a->Ev + e];
      for (j = 0; j < a->S; j++) {
        double dp = 0, pij = p[(b * a->L + i) * a->S + j];
        for (e = 0; e < a->Ev; e++) dp += dout[(b * a->L + i) * a->Ev + e] * v[(b * a->S + j) * a->Ev + e];
        ds[(b * a->L + i) * a->S + j] = pij * (dp * ref_weight_keep(a, b, i, j) - delta) * a->scale;
      }
    }
  for (b = 0; b < a->nb; b++) {
    for (i = 0; i < a->L; i++)
      for (e = 0; e < a->E; e++) {
        double t = 0;
        for (j = 0; j < a->S; j++) t += ds[(b * a->L + i) * a->S + j] * k[(b * a->S + j) * a->E + e];
        dq[(b * a->L + i) * a->E + e] = t;
      }
    for (j = 0; j < a->S; j++) {
      for (e = 0; e < a->E; e++) {
        double t = 0;
        for (i = 0; i < a->L; i++) t += ds[(b * a->L + i) * a->S + j] * q[(b * a->L + i) * a->E + e];
        dk[(b * a->S + j) * a->E + e] = t;
      }
      for (e = 0; e < a->Ev; e++) {
        double t = 0;
        for (i = 0; i < a->L; i++)
          t += p[(b * a->L + i) * a->S + j] * ref_weight_keep(a, b, i, j) * dout[(b * a->L + i) * a->Ev + e];
        dv[(b * a->S + j) * a->Ev + e] = t;
      }
    }
  }
  free(p), free(ds), free(out);
}

static double *tdoubles(const hir_tensor *t) {
  int64_t n = tnumel(t), i;
  double *d = (double *)malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (i = 0; i < n; i++) d[i] = tget(t, i);
  return d;
}

static hir_tensor tfrom(hir_dtype dt, int nd, const int64_t *sizes, const double *v) {
  hir_tensor t = tn(dt, nd, sizes);
  int64_t i, n = tnumel(&t);
  for (i = 0; i < n; i++) tset(&t, i, v[i]);
  return t;
}

/* hir_sdpa and hir_sdpa_backward on worlds 1-8, q, k, v [B, H, L, E]:
   form 0: heads on the devices (H = D, its DIDx), causal, the default
   scale, f32, forward and backward, the output's batch a Stream axis;
   form 1: the heads split (H = 2D, DIDx outer), L != S, a dropout from a
   scalar seed, bf16; form 2: the query rows split (L = 3D, DIDx outer; k
   and v whole on every device), causal (the mask's rows numbered from each
   device's place), f64 with the backward; form 3: the batch on the
   devices, causal, f16, a dropout from a constant seed, forward and
   backward, the output's rows a Stream axis. */
TEST(test_attention_sdpa, "attention/sdpa", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 4; form++) {
      int D = worlds[wi], backward = form != 1, nin, nout;
      hir_dtype dt = form == 0 ? HIR_F32 : form == 1 ? HIR_BF16 : form == 2 ? HIR_F64 : HIR_F16;
      ref_attention a;
      int64_t B = form == 3 ? D : 2, H = form == 0 ? D : form == 1 ? 2 * D : 1, L = form == 2 ? 3 * D : 4,
              S = form == 1 ? 6 : form == 2 ? 3 * D : 4, E = 4, Ev = form == 1 ? 3 : 4;
      int64_t sq[4] = {B, H, L, E}, sk[4] = {B, H, S, E}, sv[4] = {B, H, S, Ev}, so[4] = {B, H, L, Ev}, sl[3] = {B, H, L};
      hir_sdpa_desc d;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *q = hir_input_sized(f, dt, 4, sq), *k = hir_input(f, dt, 4), *v = hir_input(f, dt, 4), *dout = NULL, *out, *lse;
      hir_tv *gq, *gk, *gv;
      double *qd, *kd, *vd, *ref;
      memset(&d, 0, sizeof d);
      memset(&a, 0, sizeof a);
      d.causal = form != 1;
      d.scale = form == 1 ? 0.3 : 0;
      d.dropout = form == 1 ? 0.25 : form == 3 ? 0.1 : 0;
      d.seed = form == 1 ? hir_input_scalar(f) : form == 3 ? hir_val_const(f, 99) : NULL;
      out = hir_sdpa(f, q, k, v, &d, &lse);
      hir_output(f, out);
      hir_output(f, lse);
      if (backward) {
        dout = hir_input(f, dt, 4);
        hir_sdpa_backward(f, dout, q, k, v, out, lse, &d, &gq, &gk, &gv);
        hir_output(f, gq), hir_output(f, gk), hir_output(f, gv);
      }
      hir_set_mesh(q, D, iota_mesh);
      hir_set_mesh(k, D, iota_mesh);
      hir_set_mesh(v, D, iota_mesh);
      if (dout) hir_set_mesh(dout, D, iota_mesh);
      if (form == 0 || form == 3) { /* heads (batch) on the devices: every operand; out a Stream axis, batch (rows) */
        hir_parallelize(q, form == 0 ? 1 : 0, HIR_DIDX), hir_parallelize(k, form == 0 ? 1 : 0, HIR_DIDX);
        hir_parallelize(v, form == 0 ? 1 : 0, HIR_DIDX);
        if (dout) hir_parallelize(dout, form == 0 ? 1 : 0, HIR_DIDX);
        hir_parallelize(out, form == 0 ? 0 : 2, HIR_STREAM);
      } else if (form == 1) {
        hir_split(q, 1, D, 1), hir_parallelize(q, 1, HIR_DIDX);
      } else {
        hir_split(q, 2, D, 1), hir_parallelize(q, 2, HIR_DIDX); /* the split reaches dout */
        hir_parallelize(dout, 2, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      nin = 3 + (form == 1) + backward;
      nout = backward ? 5 : 2;
      case_lowered(&c, D, f, nin, nout);
      c.in[0] = trand(dt, 4, sq), c.in[1] = trand(dt, 4, sk), c.in[2] = trand(dt, 4, sv);
      if (form == 1) {
        memset(&c.in[3], 0, sizeof c.in[3]); /* the seed, by value */
        c.in[3].sizes[0] = 0x5eed;
      }
      if (backward) c.in[3] = trand(dt, 4, so);
      a.nb = B * H, a.L = L, a.S = S, a.E = E, a.Ev = Ev, a.causal = d.causal, a.dropout = d.dropout;
      a.scale = d.scale ? d.scale : 0.5, a.seed = form == 1 ? 0x5eed : 99;
      qd = tdoubles(&c.in[0]), kd = tdoubles(&c.in[1]), vd = tdoubles(&c.in[2]);
      ref = (double *)malloc(sizeof(double) * (size_t)(B * H * (L + S) * (E + Ev) * 2));
      ref_attention_forward(&a, qd, kd, vd, ref, ref + B * H * L * Ev);
      c.out[0] = tfrom(dt, 4, so, ref);
      c.out[1] = tfrom(dt == HIR_F64 ? HIR_F64 : HIR_F32, 3, sl, ref + B * H * L * Ev);
      if (backward) {
        double *dd = tdoubles(&c.in[3]);
        ref_attention_backward(&a, qd, kd, vd, dd, ref, ref + B * H * L * E, ref + B * H * (L + S) * E);
        c.out[2] = tfrom(dt, 4, sq, ref), c.out[3] = tfrom(dt, 4, sk, ref + B * H * L * E);
        c.out[4] = tfrom(dt, 4, sv, ref + B * H * (L + S) * E);
        free(dd);
      }
      c.tol = dt == HIR_F64 ? 1e-12 : dt == HIR_F32 ? 2e-5 : dt == HIR_F16 ? 8e-3 : 4e-2;
      RUN_CASE(&c, form == 0 ? "heads on the devices, causal, backward" : form == 1 ? "heads split, dropout, bf16"
                   : form == 2 ? "query rows split, causal, f64, backward" : "batch on the devices, dropout, f16, backward");
      free(qd), free(kd), free(vd), free(ref);
      hir_fusion_free(f);
    }
  { /* refusals, each naming what to give */
    hir_sdpa_desc d;
    hir_fusion *f = hir_fusion_create();
    hir_tv *q = hir_input(f, HIR_F32, 3), *k = hir_input(f, HIR_F32, 3), *v = hir_input(f, HIR_F32, 3), *l;
    memset(&d, 0, sizeof d);
    CHECK(!hir_sdpa(f, q, k, v, &d, &l) && !l && strstr(hir_fusion_error(f), "has no fixed size, so 1/sqrt(E)"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    q = hir_input(f, HIR_F32, 3), k = hir_input(f, HIR_F32, 3), v = hir_input(f, HIR_F16, 3);
    d.scale = 1;
    CHECK(!hir_sdpa(f, q, k, v, &d, NULL) && strstr(hir_fusion_error(f), "need one dtype and as many data axes"));
    hir_fusion_free(f);
    f = hir_fusion_create();
    q = hir_input(f, HIR_F32, 3), k = hir_input(f, HIR_F32, 3), v = hir_input(f, HIR_F32, 3);
    d.dropout = 0.5;
    CHECK(!hir_sdpa(f, q, k, v, &d, NULL) && strstr(hir_fusion_error(f), "a dropout needs its seed"));
    hir_fusion_free(f);
  }
}

/* out[m][n] = sum over k of a[m][k] * bm[k][n], a read at strides (a_m,
   a_k), bm at (b_k, b_n): a plain GEMM for the references. */
static void ref_gemm(int64_t M, int64_t K, int64_t N, const double *a, int64_t a_m, int64_t a_k, const double *bm, int64_t b_k,
                     int64_t b_n, double *out) {
  int64_t m, n, k;
  for (m = 0; m < M; m++)
    for (n = 0; n < N; n++) {
      double t = 0;
      for (k = 0; k < K; k++) t += a[m * a_m + k * a_k] * bm[k * b_k + n * b_n];
      out[m * N + n] = t;
    }
}

/* Heads [D, B, Hd, S, Eh] and rows [D, B * S, Hd * Eh] (the MHA test's
   transpose and reshape): heads into rows (to_rows), else rows into heads. */
static void heads_rows(double *heads, double *rows, int64_t D, int64_t B, int64_t Hd, int64_t S, int64_t Eh, int to_rows) {
  int64_t d, b, h, s, e;
  for (d = 0; d < D; d++)
    for (b = 0; b < B; b++)
      for (h = 0; h < Hd; h++)
        for (s = 0; s < S; s++)
          for (e = 0; e < Eh; e++) {
            int64_t hi = (((d * B + b) * Hd + h) * S + s) * Eh + e, ri = ((d * B + b) * S + s) * Hd * Eh + h * Eh + e;
            if (to_rows) rows[ri] = heads[hi];
            else heads[hi] = rows[ri];
          }
}

/* nvFuser's DistributedTransformerTest.MultiheadAttention and .MHA_Backward
   as it writes them: the weights [D, ...] with DIDx on D (w0 [D, 3E/D, E]
   the q, k and v rows of each device's heads, w1 [D, E, E/D]); linear0 =
   linear(x, w0, b0) [D, B*S, 3E/D], cut into q, k, v and reshaped into
   heads [D, B, H/D, S, E/H], causal attention, back to [D, B*S, E/D],
   times w1 transposed, summed over D (an Allreduce), plus b1, and a
   dropout. The backward takes x, the weights, the loss's gradient, the
   dropout's mask, the attention's out and logsumexp and linear0 (the
   forward's, from the reference), and gives the gradients nvFuser's does:
   the dropout's, linear1's weight and bias, q's, k's and v's, linear0's
   weight, bias and input; linear0's weight and bias gradients come as the
   q, k and v parts (hostir has no cat: the caller joins them). */
TEST(test_attention_mha, "attention/mha", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 3; form++) {
      int D = worlds[wi], backward = form == 2, axis0 = 0, part, i;
      hir_dtype dt = form == 1 ? HIR_BF16 : HIR_F32;
      const int64_t B = 2, S = 4, H = 2 * D, Eh = 2, E = H * Eh, Ed = E / D, BS = B * S;
      const double p_drop = 0.1, scale = 1e-3 * 100; /* nvFuser's 1e-3 scale, larger here so that the softmax is not flat */
      int64_t sx[2] = {BS, E}, sw0[3] = {D, 3 * Ed, E}, sb0[2] = {D, 3 * Ed}, sw1[3] = {D, E, Ed}, sb1[1] = {E};
      int64_t sl0[3] = {D, BS, 3 * Ed}, sh[5] = {D, B, H / D, S, Eh}, slse[4] = {D, B, H / D, S};
      int64_t qkv_cut[5] = {0, B, S, H / D, Eh}, rows[3] = {0, BS, Ed}, split_bs[4] = {0, B, S, 3 * Ed};
      ref_attention a;
      hir_sdpa_desc d;
      spmd_case c;
      hir_fusion *f = hir_fusion_create();
      hir_tv *x = hir_input(f, dt, 2), *w0 = hir_input(f, dt, 3), *b0 = backward ? NULL : hir_input(f, dt, 2);
      hir_tv *w1 = hir_input(f, dt, 3), *b1 = backward ? NULL : hir_input(f, dt, 1), *grad = NULL, *mask = NULL;
      hir_tv *sdpa_out = NULL, *lse = NULL, *linear0, *qkv[3], *heads_out, *seed_like;
      hir_val *seed = hir_val_const(f, 2024);
      double *xd, *w0d, *b0d = NULL, *w1d, *b1d = NULL, *l0, *qh, *kh, *vh, *oh, *lh, *cat_rows, *m1;
      int64_t dd, b, s, h, e, j;
      memset(&d, 0, sizeof d);
      d.scale = scale, d.causal = 1;
      if (backward) {
        grad = hir_input(f, HIR_F32, 2), mask = hir_input(f, HIR_F32, 2);
        sdpa_out = hir_input(f, dt, 5), lse = hir_input(f, HIR_F32, 4), linear0 = hir_input(f, dt, 3);
      } else {
        linear0 = hir_linear(f, x, w0, b0);
      }
      for (part = 0; part < 3; part++) { /* q, k, v: [D, B, H/D, S, Eh] */
        hir_tv *t = hir_slice(f, hir_reshape(f, linear0, 4, split_bs), 3, part * Ed, (part + 1) * Ed);
        qkv[part] = hir_transpose(f, hir_reshape(f, t, 5, qkv_cut), 2, 3);
      }
      if (!backward) {
        hir_tv *att = hir_sdpa(f, qkv[0], qkv[1], qkv[2], &d, NULL), *m1t, *lin1;
        int flags[2] = {1, 0};
        heads_out = hir_reshape(f, hir_transpose(f, att, 2, 3), 3, rows); /* [D, B*S, E/D] */
        m1t = hir_sum(f, hir_matmul(f, heads_out, hir_transpose(f, w1, 1, 2)), 1, &axis0); /* an Allreduce */
        lin1 = hir_add(f, m1t, hir_broadcast(f, b1, 2, flags));
        seed_like = lin1;
        hir_output(f, linear0), hir_output(f, att), hir_output(f, lin1);
        hir_output(f, hir_mul(f, hir_binary_scalar(f, HIR_BINARY_MUL, lin1, 1 / (1 - p_drop)),
                              hir_binary_scalar(f, HIR_BINARY_LT, hir_rand(f, seed_like, dt, seed), 1 - p_drop)));
      } else {
        hir_tv *dgrad = hir_binary_scalar(f, HIR_BINARY_MUL, hir_mul(f, grad, mask), 1 / (1 - p_drop));
        hir_tv *gq = hir_cast(f, dgrad, dt), *sdpa_rows, *gx1, *gw1, *gb1, *dq, *dk, *dv, *gx0 = NULL, *g[3];
        int last_axes[1] = {1}, flags[3] = {1, 0, 0};
        (void)flags;
        sdpa_rows = hir_reshape(f, hir_transpose(f, sdpa_out, 2, 3), 3, rows);
        gx1 = hir_matmul(f, gq, w1);                                  /* [D, B*S, E/D] */
        gw1 = hir_matmul(f, hir_transpose(f, gq, 0, 1), sdpa_rows);   /* [D, E, E/D] */
        gb1 = hir_cast(f, hir_sum(f, dgrad, 1, &axis0), dt);
        hir_sdpa_backward(f, hir_transpose(f, hir_reshape(f, gx1, 5, qkv_cut), 2, 3), qkv[0], qkv[1], qkv[2], sdpa_out, lse, &d,
                          &dq, &dk, &dv);
        g[0] = dq, g[1] = dk, g[2] = dv;
        hir_output(f, dgrad), hir_output(f, gw1), hir_output(f, gb1);
        hir_output(f, dq), hir_output(f, dk), hir_output(f, dv);
        for (part = 0; part < 3; part++) { /* linear0's backward, a part of its rows at a time */
          hir_tv *gp = hir_reshape(f, hir_transpose(f, g[part], 2, 3), 3, rows); /* [D, B*S, E/D] */
          hir_tv *w0p = hir_slice(f, w0, 1, part * Ed, (part + 1) * Ed);       /* [D, E/D, E] */
          hir_tv *gx = hir_matmul(f, gp, w0p);                                 /* [D, B*S, E], partial */
          hir_output(f, hir_matmul(f, hir_transpose(f, gp, 1, 2), x));        /* [D, E/D, E] */
          hir_output(f, hir_cast(f, hir_sum(f, hir_cast(f, gp, HIR_F32), 1, last_axes), dt)); /* [D, E/D] */
          gx0 = gx0 ? hir_add(f, gx0, gx) : gx;
        }
        hir_output(f, hir_sum(f, gx0, 1, &axis0)); /* one Allreduce */
      }
      hir_set_mesh(x, D, iota_mesh), hir_set_mesh(w0, D, iota_mesh), hir_set_mesh(w1, D, iota_mesh);
      hir_parallelize(w0, 0, HIR_DIDX), hir_parallelize(w1, 0, HIR_DIDX);
      if (b0) hir_set_mesh(b0, D, iota_mesh), hir_parallelize(b0, 0, HIR_DIDX), hir_set_mesh(b1, D, iota_mesh);
      if (backward) {
        hir_set_mesh(grad, D, iota_mesh), hir_set_mesh(mask, D, iota_mesh);
        hir_set_mesh(sdpa_out, D, iota_mesh), hir_parallelize(sdpa_out, 0, HIR_DIDX);
        hir_set_mesh(lse, D, iota_mesh), hir_parallelize(lse, 0, HIR_DIDX);
        hir_set_mesh(linear0, D, iota_mesh), hir_parallelize(linear0, 0, HIR_DIDX);
      }
      CHECK(hir_fusion_error(f)[0] == 0);
      case_lowered(&c, D, f, backward ? 8 : 5, backward ? 13 : 4);
      /* the inputs, and the reference in double */
      c.in[0] = trand(dt, 2, sx), c.in[1] = trand(dt, 3, sw0), c.in[backward ? 2 : 3] = trand(dt, 3, sw1);
      if (!backward) c.in[2] = trand(dt, 2, sb0), c.in[4] = trand(dt, 1, sb1);
      xd = tdoubles(&c.in[0]), w0d = tdoubles(&c.in[1]), w1d = tdoubles(&c.in[backward ? 2 : 3]);
      if (!backward) b0d = tdoubles(&c.in[2]), b1d = tdoubles(&c.in[4]);
      l0 = (double *)calloc((size_t)(D * BS * 3 * Ed), sizeof(double));
      for (dd = 0; dd < D; dd++) { /* linear0 = x w0[d]^T + b0[d] */
        ref_gemm(BS, E, 3 * Ed, xd, E, 1, w0d + dd * 3 * Ed * E, 1, E, l0 + dd * BS * 3 * Ed);
        for (i = 0; b0d && i < BS * 3 * Ed; i++) l0[dd * BS * 3 * Ed + i] += b0d[dd * 3 * Ed + i % (3 * Ed)];
      }
      if (dt != HIR_F32) /* the operands of attention are linear0 rounded to the dtype */
        for (i = 0; i < D * BS * 3 * Ed; i++) l0[i] = dt == HIR_BF16 ? hir_bf16_to_float(hir_float_to_bf16((float)l0[i])) : l0[i];
      qh = (double *)malloc(sizeof(double) * (size_t)(D * BS * E)), kh = (double *)malloc(sizeof(double) * (size_t)(D * BS * E));
      vh = (double *)malloc(sizeof(double) * (size_t)(D * BS * E)), oh = (double *)malloc(sizeof(double) * (size_t)(D * BS * E));
      lh = (double *)malloc(sizeof(double) * (size_t)(D * BS * H));
      for (dd = 0; dd < D; dd++) /* [D, B, H/D, S, Eh] from linear0 [D, B, S, 3, H/D, Eh] */
        for (b = 0; b < B; b++)
          for (h = 0; h < H / D; h++)
            for (s = 0; s < S; s++)
              for (e = 0; e < Eh; e++) {
                int64_t at = (((dd * B + b) * (H / D) + h) * S + s) * Eh + e, from = (dd * BS + b * S + s) * 3 * Ed + h * Eh + e;
                qh[at] = l0[from], kh[at] = l0[from + Ed], vh[at] = l0[from + 2 * Ed];
              }
      memset(&a, 0, sizeof a);
      a.nb = D * B * (H / D), a.L = a.S = S, a.E = a.Ev = Eh, a.scale = scale, a.causal = 1;
      ref_attention_forward(&a, qh, kh, vh, oh, lh);
      cat_rows = (double *)malloc(sizeof(double) * (size_t)(D * BS * Ed)); /* attention's out as [D, B*S, E/D] */
      heads_rows(oh, cat_rows, D, B, H / D, S, Eh, 1);
      m1 = (double *)calloc((size_t)(BS * E), sizeof(double));
      if (!backward) {
        double *part_m = (double *)malloc(sizeof(double) * (size_t)(BS * E));
        for (dd = 0; dd < D; dd++) { /* sum over d of rows_d w1[d]^T, w1[d] [E, E/D] */
          ref_gemm(BS, Ed, E, cat_rows + dd * BS * Ed, Ed, 1, w1d + dd * E * Ed, 1, Ed, part_m);
          for (i = 0; i < BS * E; i++) m1[i] += part_m[i];
        }
        for (i = 0; i < BS * E; i++) m1[i] += b1d[i % E];
        c.out[0] = tfrom(dt, 3, sl0, l0), c.out[1] = tfrom(dt, 5, sh, oh), c.out[2] = tfrom(dt, 2, sx, m1);
        c.out[3] = tn(dt, 2, sx);
        for (i = 0; i < BS * E; i++)
          tset(&c.out[3], i, ref_rand(2024, (uint64_t)i, dt == HIR_BF16 ? 8 : 24) < 1 - p_drop ? m1[i] / (1 - p_drop) : 0);
        free(part_m);
      } else {
        double *gd = (double *)malloc(sizeof(double) * (size_t)(BS * E)), *gx1 = (double *)malloc(sizeof(double) * (size_t)(D * BS * Ed));
        double *gw1 = (double *)malloc(sizeof(double) * (size_t)(D * E * Ed)), *gb1 = (double *)calloc((size_t)E, sizeof(double));
        double *dout = (double *)malloc(sizeof(double) * (size_t)(D * BS * E)), *g3 = (double *)malloc(sizeof(double) * (size_t)(3 * D * BS * E));
        double *gw0 = (double *)malloc(sizeof(double) * (size_t)(D * Ed * E)), *gb0 = (double *)malloc(sizeof(double) * (size_t)(D * Ed));
        double *gx0 = (double *)calloc((size_t)(BS * E), sizeof(double)), *tmp = (double *)malloc(sizeof(double) * (size_t)(BS * E));
        int64_t sgb0[2] = {D, Ed}, sgw0[3] = {D, Ed, E};
        c.in[3] = trand(HIR_F32, 2, sx), c.in[4] = tn(HIR_F32, 2, sx);
        for (i = 0; i < BS * E; i++) tset(&c.in[4], i, (i * 7 + wi) % 5 != 0); /* the mask: keeps 4 in 5 */
        c.in[5] = tfrom(dt, 5, sh, oh), c.in[6] = tfrom(HIR_F32, 4, slse, lh), c.in[7] = tfrom(dt, 3, sl0, l0);
        for (i = 0; i < BS * E; i++) gd[i] = tget(&c.in[3], i) * tget(&c.in[4], i) / (1 - p_drop);
        for (dd = 0; dd < D; dd++) {
          ref_gemm(BS, E, Ed, gd, E, 1, w1d + dd * E * Ed, Ed, 1, gx1 + dd * BS * Ed);
          ref_gemm(E, BS, Ed, gd, 1, E, cat_rows + dd * BS * Ed, Ed, 1, gw1 + dd * E * Ed);
        }
        for (i = 0; i < BS * E; i++) gb1[i % E] += gd[i];
        heads_rows(dout, gx1, D, B, H / D, S, Eh, 0); /* linear1's input gradient as attention's dout [D, B, H/D, S, Eh] */
        ref_attention_backward(&a, qh, kh, vh, dout, g3, g3 + D * BS * E, g3 + 2 * D * BS * E);
        c.out[0] = tfrom(HIR_F32, 2, sx, gd), c.out[1] = tfrom(dt, 3, sw1, gw1), c.out[2] = tfrom(dt, 1, sb1, gb1);
        for (part = 0; part < 3; part++) {
          double *gp = g3 + part * D * BS * E;
          double *rows_p = (double *)malloc(sizeof(double) * (size_t)(D * BS * Ed));
          c.out[3 + part] = tfrom(dt, 5, sh, gp);
          heads_rows(gp, rows_p, D, B, H / D, S, Eh, 1);
          for (dd = 0; dd < D; dd++) {
            ref_gemm(Ed, BS, E, rows_p + dd * BS * Ed, 1, Ed, xd, E, 1, gw0 + dd * Ed * E);
            for (j = 0; j < Ed; j++) {
              double t = 0;
              for (i = 0; i < BS; i++) t += rows_p[(dd * BS + i) * Ed + j];
              gb0[dd * Ed + j] = t;
            }
            ref_gemm(BS, Ed, E, rows_p + dd * BS * Ed, Ed, 1, w0d + dd * 3 * Ed * E + part * Ed * E, E, 1, tmp);
            for (i = 0; i < BS * E; i++) gx0[i] += tmp[i];
          }
          c.out[6 + 2 * part] = tfrom(dt, 3, sgw0, gw0), c.out[7 + 2 * part] = tfrom(dt, 2, sgb0, gb0);
          free(rows_p);
        }
        c.out[12] = tfrom(dt, 2, sx, gx0);
        free(gd), free(gx1), free(gw1), free(gb1), free(dout), free(g3), free(gw0), free(gb0), free(gx0), free(tmp);
      }
      c.tol = dt == HIR_F32 ? 5e-5 : 5e-2;
      RUN_CASE(&c, form == 0 ? "multi-head attention, f32" : form == 1 ? "multi-head attention, bf16" : "its backward, f32");
      free(xd), free(w0d), free(b0d), free(w1d), free(b1d), free(l0), free(qh), free(kh), free(vh), free(oh), free(lh);
      free(cat_rows), free(m1);
      hir_fusion_free(f);
    }
}

/* nvFuser's DistributedTransformerTest.LoopSplitMHAFwd as it writes it, on
   logical shapes: w0 [3E, E] and b0 split on their rows by D, DIDx outer;
   w1 [E, E] split on its columns; linear0 reshaped into heads [B, S, H,
   3E/H] (the split reaching H), q, k and v sliced out of each head's part,
   permuted, causal attention with the default scale, back to [B, S, E],
   times w1 transposed (a sum over the devices), plus b1, a dropout and the
   residual. */
TEST(test_attention_mha_logical, "attention/mha_logical", TEST_CPU | TEST_GPU_WORLDS) {
  int wi;
  for (wi = 0; wi < 5; wi++) {
    int D = worlds[wi], part, i;
    const int64_t B = 2, S = 3, H = 2 * D, Eh = 4, E = H * Eh;
    const double p_drop = 0.2;
    int64_t sx[3] = {B, S, E}, sw0[2] = {3 * E, E}, sb0[1] = {3 * E}, sw1[2] = {E, E}, sb1[1] = {E};
    int64_t heads[4] = {B, S, H, 3 * Eh}, back[3] = {B, S, E}, b, s, h, e;
    int perm[4] = {0, 2, 1, 3};
    ref_attention a;
    hir_sdpa_desc d;
    spmd_case c;
    hir_fusion *f = hir_fusion_create();
    hir_tv *x = hir_input_sized(f, HIR_F32, 3, sx), *w0 = hir_input_sized(f, HIR_F32, 2, sw0);
    hir_tv *b0 = hir_input_sized(f, HIR_F32, 1, sb0), *w1 = hir_input_sized(f, HIR_F32, 2, sw1);
    hir_tv *b1 = hir_input_sized(f, HIR_F32, 1, sb1), *qkv, *ops[3], *att, *y;
    double *xd, *w0d, *b0d, *w1d, *b1d, *l0, *qh, *kh, *vh, *oh, *rows, *lin;
    memset(&d, 0, sizeof d);
    d.causal = 1;
    qkv = hir_reshape(f, hir_linear(f, x, w0, b0), 4, heads);
    for (part = 0; part < 3; part++) ops[part] = hir_permute(f, hir_slice(f, qkv, 3, part * Eh, (part + 1) * Eh), perm);
    att = hir_sdpa(f, ops[0], ops[1], ops[2], &d, NULL);
    y = hir_linear(f, hir_reshape(f, hir_permute(f, att, perm), 3, back), w1, b1); /* matmul(attn, w1^T) + b1 */
    y = hir_mul(f, hir_binary_scalar(f, HIR_BINARY_MUL, y, 1 / (1 - p_drop)),
                hir_binary_scalar(f, HIR_BINARY_LT, hir_rand(f, y, HIR_F32, hir_val_const(f, 77)), 1 - p_drop));
    hir_output(f, hir_add(f, y, x));
    hir_set_mesh(x, D, iota_mesh), hir_set_mesh(w0, D, iota_mesh), hir_set_mesh(b0, D, iota_mesh);
    hir_set_mesh(w1, D, iota_mesh), hir_set_mesh(b1, D, iota_mesh);
    hir_split(w0, 0, D, 1), hir_parallelize(w0, 0, HIR_DIDX);
    /* the split reached b0 through the linear, and w1's columns through the heads and attention (nvFuser
       splits each tensor; one split reaches every axis it maps onto): their outer parts parallelized */
    hir_parallelize(b0, 0, HIR_DIDX), hir_parallelize(w1, 1, HIR_DIDX);
    CHECK(hir_fusion_error(f)[0] == 0);
    case_lowered(&c, D, f, 5, 1);
    c.in[0] = trand(HIR_F32, 3, sx), c.in[1] = trand(HIR_F32, 2, sw0), c.in[2] = trand(HIR_F32, 1, sb0);
    c.in[3] = trand(HIR_F32, 2, sw1), c.in[4] = trand(HIR_F32, 1, sb1);
    xd = tdoubles(&c.in[0]), w0d = tdoubles(&c.in[1]), b0d = tdoubles(&c.in[2]), w1d = tdoubles(&c.in[3]), b1d = tdoubles(&c.in[4]);
    l0 = (double *)malloc(sizeof(double) * (size_t)(B * S * 3 * E));
    ref_gemm(B * S, E, 3 * E, xd, E, 1, w0d, 1, E, l0);
    for (i = 0; i < B * S * 3 * E; i++) l0[i] += b0d[i % (3 * E)];
    qh = (double *)malloc(sizeof(double) * (size_t)(B * S * E)), kh = (double *)malloc(sizeof(double) * (size_t)(B * S * E));
    vh = (double *)malloc(sizeof(double) * (size_t)(B * S * E)), oh = (double *)malloc(sizeof(double) * (size_t)(B * S * E));
    for (b = 0; b < B; b++) /* [B, H, S, Eh] from linear0 [B, S, H, 3, Eh] */
      for (h = 0; h < H; h++)
        for (s = 0; s < S; s++)
          for (e = 0; e < Eh; e++) {
            int64_t at = ((b * H + h) * S + s) * Eh + e, from = ((b * S + s) * H + h) * 3 * Eh + e;
            qh[at] = l0[from], kh[at] = l0[from + Eh], vh[at] = l0[from + 2 * Eh];
          }
    memset(&a, 0, sizeof a);
    a.nb = B * H, a.L = a.S = S, a.E = a.Ev = Eh, a.scale = 0.5, a.causal = 1;
    ref_attention_forward(&a, qh, kh, vh, oh, NULL);
    rows = (double *)malloc(sizeof(double) * (size_t)(B * S * E)), lin = (double *)malloc(sizeof(double) * (size_t)(B * S * E));
    for (b = 0; b < B; b++)
      for (h = 0; h < H; h++)
        for (s = 0; s < S; s++)
          for (e = 0; e < Eh; e++) rows[(b * S + s) * E + h * Eh + e] = oh[((b * H + h) * S + s) * Eh + e];
    ref_gemm(B * S, E, E, rows, E, 1, w1d, 1, E, lin);
    c.out[0] = tn(HIR_F32, 3, sx);
    for (i = 0; i < B * S * E; i++) {
      double yv = lin[i] + b1d[i % E];
      tset(&c.out[0], i, (ref_rand(77, (uint64_t)i, 24) < 1 - p_drop ? yv / (1 - p_drop) : 0) + xd[i]);
    }
    c.tol = 5e-5;
    RUN_CASE(&c, "LoopSplitMHAFwd on logical shapes");
    free(xd), free(w0d), free(b0d), free(w1d), free(b1d), free(l0), free(qh), free(kh), free(vh), free(oh), free(rows), free(lin);
    hir_fusion_free(f);
  }
}
