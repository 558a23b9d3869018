/* Mixture-of-experts routing: hir_host_moe_dispatch and hir_host_moe_combine
   (nvFuser's DispatchCombineTest: DispatchCombineTop1, DispatchOnlyTop1,
   CombineOnlyTop1; on the GPU suite also as CUDA graphs replayed on moved
   inputs, as DispatchCombineCudaGraphTest), on worlds 1-8 against routing
   written here: random experts, some outside [0, E) (dropped), different
   tokens on every rank. */
#include "test.h"

typedef struct moe_case {
  int R, combine_only;
  int64_t T, H, E;
} moe_case;

/* The program on each rank: x [R, T, H], topk_idx [R, T, 1], topk_weights
   [R, T, 1], their device axis DIDx; dispatch's six outputs, then combine's
   (or, combine_only: dispatch's outputs as inputs, combine's output). */
static hir_program *prog_moe(void *user, int rank) {
  const moe_case *m = (const moe_case *)user;
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  int team[8], k;
  (void)rank;
  for (k = 0; k < m->R; k++) team[k] = k;
  if (!m->combine_only) {
    int64_t sx[3] = {m->R, m->T, m->H}, si[3] = {m->R, m->T, 1};
    hir_tv *x = hir_input_sized(f, HIR_F32, 3, sx), *idx = hir_input_sized(f, HIR_I64, 3, si), *w = hir_input_sized(f, HIR_F32, 3, si);
    hir_expr *d, *c;
    hir_set_mesh(x, m->R, iota_mesh), hir_set_mesh(idx, m->R, iota_mesh), hir_set_mesh(w, m->R, iota_mesh);
    hir_parallelize(x, 0, HIR_DIDX), hir_parallelize(idx, 0, HIR_DIDX), hir_parallelize(w, 0, HIR_DIDX);
    d = hir_host_moe_dispatch(p, m->R, team, x, idx, w, m->E);
    c = hir_host_moe_combine(p, m->R, team, hir_expr_output(d, 0), hir_expr_output(d, 3), hir_expr_output(d, 4),
                             hir_expr_output(d, 5), hir_val_const(f, m->T));
    hir_scope_append(hir_program_body(p), d);
    hir_scope_append(hir_program_body(p), c);
    for (k = 0; k < 6; k++) hir_output(f, hir_expr_output(d, k));
    hir_output(f, hir_expr_output(c, 0));
  } else {
    int64_t sx[3] = {m->R, m->T * m->R, m->H}, ss[2] = {m->R, m->T * m->R}, sn[2] = {m->R, m->R};
    hir_tv *x = hir_input_sized(f, HIR_F32, 3, sx), *src = hir_input_sized(f, HIR_I64, 2, ss);
    hir_tv *to = hir_input_sized(f, HIR_I64, 2, sn), *from = hir_input_sized(f, HIR_I64, 2, sn), *t[4];
    hir_expr *c;
    t[0] = x, t[1] = src, t[2] = to, t[3] = from;
    for (k = 0; k < 4; k++) hir_set_mesh(t[k], m->R, iota_mesh), hir_parallelize(t[k], 0, HIR_DIDX);
    c = hir_host_moe_combine(p, m->R, team, x, src, to, from, hir_val_const(f, m->T));
    hir_scope_append(hir_program_body(p), c);
    hir_output(f, hir_expr_output(c, 0));
  }
  return p;
}

TEST(test_moe_dispatch_combine, "moe/dispatch_combine", TEST_CPU | TEST_GPU_WORLDS) {
  int wi, form;
  for (wi = 0; wi < 5; wi++)
    for (form = 0; form < 2; form++) {
      moe_case m;
      int64_t sx[3], si[3], sc[3], sc1[3], scs[2], sn[2], r, t, q, k, h;
      int64_t *idx, *to, *from, *rows;
      spmd_case c;
      hir_tensor want[6], xin, idxin, win;
      hir_program *p;
      m.R = worlds[wi], m.combine_only = form, m.T = 5, m.H = 3, m.E = 2 * m.R;
      p = prog_moe(&m, 0);
      CHECK(hir_program_verify(p) == HIR_OK);
      if (hir_program_error(p)[0]) printf("  %s\n", hir_program_error(p));
      hir_program_free(p);
      sx[0] = si[0] = sc[0] = sc1[0] = scs[0] = sn[0] = m.R;
      sx[1] = si[1] = m.T, sx[2] = sc[2] = m.H, si[2] = sc1[2] = 1, sc[1] = sc1[1] = scs[1] = m.T * m.R, sn[1] = m.R;
      /* the routing, written here: rank r's token t to member idx / 2, in the order of sender, expert, token */
      xin = trand(HIR_F32, 3, sx), idxin = tn(HIR_I64, 3, si), win = trand(HIR_F32, 3, si);
      idx = (int64_t *)idxin.data;
      for (k = 0; k < m.R * m.T; k++) idx[k] = (int64_t)((urand() + 1) * 0.5 * (double)(m.E + 1)) - (k % 7 == 3); /* -1 .. E */
      want[0] = tn(HIR_F32, 3, sc), want[1] = tn(HIR_I64, 3, sc1), want[2] = tn(HIR_F32, 3, sc1), want[3] = tn(HIR_I64, 2, scs);
      want[4] = tn(HIR_I64, 2, sn), want[5] = tn(HIR_I64, 2, sn);
      to = (int64_t *)want[4].data, from = (int64_t *)want[5].data, rows = (int64_t *)calloc((size_t)m.R, sizeof(int64_t));
      for (q = 0; q < m.R; q++)
        for (r = 0; r < m.R; r++) { /* what r sends q, in q's rows in sender order */
          int64_t e;
          for (e = 2 * q; e < 2 * q + 2; e++)
            for (t = 0; t < m.T; t++) {
              int64_t at = q * m.T * m.R + rows[q]++;
              if (idx[r * m.T + t] != e) {
                rows[q]--;
                continue;
              }
              for (h = 0; h < m.H; h++) tset(&want[0], at * m.H + h, tget(&xin, (r * m.T + t) * m.H + h));
              ((int64_t *)want[1].data)[at] = e;
              tset(&want[2], at, tget(&win, r * m.T + t));
              ((int64_t *)want[3].data)[at] = t;
              to[r * m.R + q]++, from[q * m.R + r]++;
            }
        }
      case_init(&c, m.R);
      c.build = prog_moe;
      c.user = &m;
      if (!form) {
        c.in[0] = xin, c.in[1] = idxin, c.in[2] = win, c.nin = 3, c.nout = 7;
        for (k = 0; k < 6; k++) c.out[k] = want[k];
        c.out[6] = tcopy(&xin); /* combined: x, dropped tokens zero */
        for (k = 0; k < m.R * m.T; k++)
          if (idx[k] < 0 || idx[k] >= m.E)
            for (h = 0; h < m.H; h++) tset(&c.out[6], k * m.H + h, 0);
      } else { /* combine alone, on the reference's dispatch */
        c.nin = 4, c.nout = 1;
        c.out[0] = tcopy(&xin);
        for (k = 0; k < m.R * m.T; k++)
          if (idx[k] < 0 || idx[k] >= m.E)
            for (h = 0; h < m.H; h++) tset(&c.out[0], k * m.H + h, 0);
        c.in[0] = want[0], c.in[1] = want[3], c.in[2] = want[4], c.in[3] = want[5];
        tfree(&want[1]), tfree(&want[2]), tfree(&xin), tfree(&idxin), tfree(&win);
      }
      c.tol = 0;
      RUN_CASE(&c, form ? "CombineOnlyTop1" : "DispatchOnlyTop1 and DispatchCombineTop1");
      free(rows);
    }
}

/* What the MoE ops refuse, each by name. */
TEST(test_moe_errors, "moe/errors", TEST_CPU) {
  hir_program *p = hir_program_create();
  hir_fusion *f = hir_program_fusion(p);
  int team[2] = {0, 1};
  hir_tv *x = hir_input(f, HIR_F32, 2), *idx = hir_input(f, HIR_I64, 2), *w = hir_input(f, HIR_F32, 2), *bad = hir_input(f, HIR_F32, 2);
  char text[4096];
  hir_expr *d = hir_host_moe_dispatch(p, 2, team, x, idx, w, 4);
  CHECK(d && hir_expr_noutputs(d) == 6 && hir_tv_dtype(hir_expr_output(d, 3)) == HIR_I64);
  hir_scope_append(hir_program_body(p), d);
  hir_program_snprint(p, text, sizeof text);
  CHECK(strstr(text, "MoeDispatch 0 (team=(0 1), num_experts=4, x=T0"));
  CHECK(!hir_host_moe_dispatch(p, 2, team, x, idx, w, 3) && strstr(hir_program_error(p), "3 experts over a team of 2"));
  hir_program_free(p);
  p = hir_program_create();
  f = hir_program_fusion(p);
  x = hir_input(f, HIR_F32, 2), idx = hir_input(f, HIR_I64, 2), w = hir_input(f, HIR_F32, 2), bad = hir_input(f, HIR_F32, 2);
  CHECK(!hir_host_moe_dispatch(p, 2, team, x, bad, w, 4) && strstr(hir_program_error(p), "topk_idx T3 must be 2 plain axes of int64"));
  hir_program_free(p);
  p = hir_program_create(); /* inside a coalescing group */
  f = hir_program_fusion(p);
  x = hir_input(f, HIR_F32, 2), idx = hir_input(f, HIR_I64, 2), w = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_expr_output((d = hir_host_moe_dispatch(p, 2, team, x, idx, w, 2)), 0));
  hir_scope_append(hir_program_body(p), hir_host_start_coalescing(p));
  hir_scope_append(hir_program_body(p), d);
  hir_scope_append(hir_program_body(p), hir_host_end_coalescing(p));
  CHECK(hir_program_verify(p) != HIR_OK && strstr(hir_program_error(p), "MoeDispatch 0 stands between StartCoalescing"));
  hir_program_free(p);
  { /* when run: combine's x must have num_tokens times the team's rows, its counts one per member */
    hir_local_world *w = hir_local_world_create(1);
    hir_eval_desc ed;
    hir_evaluator *ev = NULL;
    hir_tensor in[4], out;
    float xs[12] = {0};
    int64_t src[6] = {0}, cnt[1] = {2};
    int k, me = 0;
    hir_tv *src_tv, *to, *from;
    hir_expr *c;
    p = hir_program_create();
    f = hir_program_fusion(p);
    x = hir_input(f, HIR_F32, 2), src_tv = hir_input(f, HIR_I64, 1), to = hir_input(f, HIR_I64, 1), from = hir_input(f, HIR_I64, 1);
    c = hir_host_moe_combine(p, 1, &me, x, src_tv, to, from, hir_val_const(f, 3)); /* 3 tokens, a team of 1: x needs 3 rows */
    hir_output(f, hir_expr_output(c, 0));
    hir_scope_append(hir_program_body(p), c);
    memset(&ed, 0, sizeof ed);
    ed.backend = hir_backend_cpu_create(), ed.comm = hir_local_comm(w, 0);
    CHECK(hir_evaluator_create(p, &ed, &ev) == HIR_OK);
    memset(in, 0, sizeof in), memset(&out, 0, sizeof out);
    for (k = 0; k < 4; k++) in[k].ndims = k ? 1 : 2, in[k].dtype = k ? HIR_I64 : HIR_F32;
    in[0].data = xs, in[0].sizes[0] = 6, in[0].sizes[1] = 2, in[0].strides[0] = 2, in[0].strides[1] = 1; /* 6 rows, not 3 */
    in[1].data = src, in[1].sizes[0] = 6, in[1].strides[0] = 1;
    in[2].data = in[3].data = cnt, in[2].sizes[0] = in[3].sizes[0] = 1, in[2].strides[0] = in[3].strides[0] = 1;
    CHECK(hir_run(ev, in, 4, &out, 1) == HIR_ERR_SHAPE &&
          strstr(hir_evaluator_error(ev), "MoeCombine 0: x T0 has 6 rows; dispatch's rows are num_tokens (3) times the team's 1 members"));
    hir_evaluator_free(ev);
    hir_backend_free(ed.backend);
    hir_local_world_free(w);
    hir_program_free(p);
  }
}
