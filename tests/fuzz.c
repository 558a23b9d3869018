/* The fuzzer (libFuzzer: make fuzz; CI runs it briefly): its input is a small
   program of byte codes that drives the fusion builder (with any arguments,
   valid or not), the stream options, hir_lower for every rank of a world of
   1 to 4, the verifier, the printer, the schedule verifier and, where every
   rank lowered, a run on the local world with random data. A finding is a
   crash or sanitizer report, HIR_ERR_INTERNAL from any call, a run that
   times out (a deadlock), or ranks that judge one fusion differently; the
   same bytes are then loaded as a file of saved plans (after a valid
   header), which must load or be refused leaving nothing. The
   seed corpus is tests/fuzz_corpus/. Build without libFuzzer
   (-DHIR_FUZZ_MAIN) to replay files: build/fuzz-replay FILE... */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz {
  const uint8_t *d;
  size_t n, at;
} fz;

static int fz_take(fz *z, int range) { /* a byte's worth, in [0, range); 0 once the input is spent */
  if (range <= 1 || z->at >= z->n) return 0;
  return z->d[z->at++] % range;
}

static char fz_fusion[1 << 16]; /* the fusion of the input at hand, printed */

static void fz_finding(const char *what, const char *detail) {
  fprintf(stderr, "fuzz finding: %s: %s\n%s", what, detail, fz_fusion);
  abort();
}

typedef struct fz_run {
  hir_fusion *f;
  hir_local_world *w;
  hir_lower_desc ld;
  int world, nin;
  int64_t sizes[8][HIR_MAX_DIMS];
  int layout[8];                   /* 0 row-major, 1 axes reversed in memory, 2 the first axis expanded (stride 0) */
  hir_status status[4];
  char error[4][512];
} fz_run;

static hir_status fz_rank(int rank, void *user) {
  fz_run *x = (fz_run *)user;
  hir_lower_desc ld = x->ld;
  hir_eval_desc ed;
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  hir_tensor in[8], out[4];
  int i, k, nout;
  memset(&ed, 0, sizeof ed);
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  ld.my_device = rank;
  ed.comm = hir_local_comm(x->w, rank);
  ed.timeout_ms = 2000;
  if (hir_lower(x->f, &ld, &p) == HIR_OK) {
    nout = hir_program_noutputs(p);
    for (i = 0; i < x->nin; i++) { /* this rank's part: size 1 on a DIDx axis, shape-only where it lives elsewhere */
      const hir_tv *tv = hir_program_input(p, i);
      int n, nd = 0, here = 0;
      const int *mesh = hir_tv_mesh(tv, &n);
      int64_t numel = 1;
      here = !n || hir_team_index(mesh, n, rank) >= 0;
      in[i].dtype = hir_tv_dtype(tv);
      if (tv->scalar) { /* a scalar input, by value */
        in[i].sizes[0] = x->sizes[i][0];
        continue;
      }
      if (hir_tv_logical_ndims(tv)) { /* split axes: the user's tensor holds the logical ones, whole */
        for (k = 0; k < hir_tv_logical_ndims(tv); k++) numel *= (in[i].sizes[nd++] = x->sizes[i][k]);
      } else {
        for (k = 0; k < hir_tv_ndims(tv); k++) {
          if (hir_tv_iter_type(tv, k) == HIR_REDUCTION) continue;
          in[i].sizes[nd] = hir_tv_ptype(tv, k) == HIR_DIDX && n > 1 ? 1 : hir_tv_iter_type(tv, k) == HIR_BROADCAST ? 1 : x->sizes[i][k];
          numel *= in[i].sizes[nd++];
        }
      }
      in[i].ndims = nd;
      if (x->layout[i] == 1) /* a dense buffer either way */
        for (k = 0, numel = 1; k < nd; k++) in[i].strides[k] = numel, numel *= in[i].sizes[k];
      if (x->layout[i] == 2 && nd > 1) {
        int64_t s = 1;
        for (k = nd - 1; k > 0; k--) in[i].strides[k] = s, s *= in[i].sizes[k];
        in[i].strides[0] = 0;
      }
      if (here && (in[i].data = calloc((size_t)(numel ? numel : 1), 8)) != NULL)
        for (k = 0; k < numel; k++) ((float *)in[i].data)[k] = (float)((k * 7 + rank) % 13) - 6;
    }
    if ((x->status[rank] = hir_evaluator_create(p, &ed, &ev)) == HIR_OK) {
      x->status[rank] = hir_run(ev, in, x->nin, out, nout < 4 ? nout : 4);
      if (x->status[rank] == HIR_OK) x->status[rank] = hir_evaluator_sync(ev);
    }
    snprintf(x->error[rank], sizeof x->error[rank], "%s", hir_evaluator_error(ev));
    for (i = 0; i < x->nin; i++) free(in[i].data);
  }
  hir_evaluator_free(ev);
  hir_program_free(p);
  return x->status[rank];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz z = {data, size, 0};
  fz_run x;
  hir_tv *tvs[16];
  hir_program *progs[4];
  hir_status st[4];
  int ntv = 0, i, k, lowered = 0;
  static char text[1 << 16], first[512];
  memset(&x, 0, sizeof x);
  x.world = 1 + fz_take(&z, 4);
  x.f = hir_fusion_create();
  for (k = 0; k < 12 && z.at < z.n; k++) { /* the fusion: each op from a byte, its operands from the next ones */
    hir_tv *a = ntv ? tvs[fz_take(&z, ntv)] : NULL, *b = ntv ? tvs[fz_take(&z, ntv)] : NULL, *t = NULL;
    int axes[2] = {fz_take(&z, 5) - 1, fz_take(&z, 5) - 1}, flags[4] = {0}, mesh[4], n, j;
    switch (fz_take(&z, 12)) {
    case 0:
    case 1: {
      int nd = 1 + fz_take(&z, 3), idx = x.nin, sized = fz_take(&z, 4) == 0;
      int64_t fixed[3];
      hir_dtype dt = fz_take(&z, 4) == 3 ? HIR_F64 : HIR_F32;
      for (j = 0; j < nd; j++) fixed[j] = fz_take(&z, 5); /* 0 to 4: empty tensors too */
      t = sized ? hir_input_sized(x.f, dt, nd, fixed) : hir_input(x.f, dt, nd);
      if (t && idx < 8) {
        for (j = 0; j < nd; j++) x.sizes[idx][j] = fixed[j];
        x.layout[idx] = fz_take(&z, 3);
        x.nin++;
      }
      break;
    }
    case 2: t = hir_set(x.f, a); break;
    case 3: t = fz_take(&z, 3) == 0 ? hir_add(x.f, a, b) : fz_take(&z, 2) ? hir_sub(x.f, a, b) : hir_mul(x.f, a, b); break;
    case 4: t = hir_sum(x.f, a, 1 + fz_take(&z, 2), axes); break;
    case 5:
      n = 1 + fz_take(&z, 4);
      for (j = 0; j < n; j++) flags[j] = fz_take(&z, 2);
      t = hir_broadcast(x.f, a, n, flags);
      break;
    case 6: t = hir_matmul(x.f, a, b); break;
    case 7: { /* a mesh: some devices of the world, maybe out of order, maybe outside it; maybe 2-D (rows x n / rows) */
      int rows = fz_take(&z, 3);
      n = 1 + fz_take(&z, 4);
      for (j = 0; j < n; j++) mesh[j] = fz_take(&z, x.world + 1);
      if (rows) hir_set_mesh_2d(a, rows, n / rows, mesh);
      else hir_set_mesh(a, n, mesh);
      break;
    }
    case 8: hir_parallelize(a, fz_take(&z, 5) - 1, (hir_ptype)fz_take(&z, HIR_PTYPE_COUNT + 1)); break;
    case 9: hir_output(x.f, a); break;
    case 10: { /* elementwise, casts, scalars, permutes, composites: any arguments */
      int perm[HIR_MAX_DIMS] = {fz_take(&z, 4) - 1, fz_take(&z, 4) - 1, fz_take(&z, 4) - 1};
      int64_t sizes[3] = {fz_take(&z, 5) - 1, fz_take(&z, 5) - 1, fz_take(&z, 5) - 1};
      switch (fz_take(&z, 17)) {
      case 0: t = hir_unary(x.f, (hir_unary_op)fz_take(&z, HIR_UNARY_COUNT + 1), a); break;
      case 1: t = hir_cast(x.f, a, (hir_dtype)fz_take(&z, HIR_DTYPE_COUNT + 1)); break;
      case 2: t = hir_binary_scalar(x.f, (hir_binary_op)fz_take(&z, HIR_BINARY_COUNT + 1), a, fz_take(&z, 9) - 4); break;
      case 3: t = hir_permute(x.f, a, perm); break;
      case 4: t = hir_div(x.f, a, b); break;
      case 5: t = hir_mean(x.f, a, 1 + fz_take(&z, 2), axes); break;
      case 6:
        t = fz_take(&z, 2) ? hir_layer_norm(x.f, a, fz_take(&z, 3), fz_take(&z, 2) ? b : NULL, NULL, 1e-5)
                           : hir_rms_norm(x.f, a, fz_take(&z, 3), fz_take(&z, 2) ? b : NULL, 1e-5);
        break;
      case 7: t = hir_select(x.f, a, axes[0], fz_take(&z, 4)); break;
      case 8: /* hir_slice's bounds, or Python's (signed, the end, a step) */
        t = fz_take(&z, 2) ? hir_slice(x.f, a, axes[0], fz_take(&z, 3), fz_take(&z, 5) - 1)
                           : hir_slice_step(x.f, a, axes[0], fz_take(&z, 7) - 3, fz_take(&z, 8) ? fz_take(&z, 7) - 3 : HIR_END,
                                            fz_take(&z, 4));
        break;
      case 9: hir_split(a, axes[0], fz_take(&z, 5), fz_take(&z, 2)); break;
      case 10: /* times a scalar input */
        t = hir_binary_val(x.f, (hir_binary_op)fz_take(&z, HIR_BINARY_COUNT), a, hir_input_scalar(x.f));
        if (x.nin < 8) x.sizes[x.nin++][0] = 1 + fz_take(&z, 3); /* its value */
        break;
      case 11: /* fp8: a and b cast, any two tensors as the scales, any output dtype */
        if (ntv)
          t = hir_scaled_linear(x.f, hir_cast(x.f, a, fz_take(&z, 2) ? HIR_F8E4M3 : HIR_F8E5M2), hir_cast(x.f, b, HIR_F8E4M3),
                                tvs[fz_take(&z, ntv)], tvs[fz_take(&z, ntv)], (hir_dtype)fz_take(&z, HIR_DTYPE_COUNT + 1));
        break;
      case 12: /* a loop order, maybe laid out so, a merge or a swizzle: any positions */
        switch (fz_take(&z, 3)) {
        case 0: hir_merge(a, axes[0]); break;
        case 1: hir_swizzle1d(a, axes[0], (hir_ptype)fz_take(&z, HIR_PTYPE_COUNT + 1)); break;
        default: hir_reorder(a, fz_take(&z, 3), perm, axes); break;
        }
        if (fz_take(&z, 2)) hir_set_allocation_loop(a);
        break;
      case 13: /* random numbers like a, any dtype, a constant seed */
        t = hir_rand(x.f, a, (hir_dtype)fz_take(&z, HIR_DTYPE_COUNT + 1), hir_val_const(x.f, fz_take(&z, 1000)));
        break;
      case 14: /* a max, or indices along any axis in any dtype */
        t = fz_take(&z, 2) ? hir_max(x.f, a, 1 + fz_take(&z, 2), axes)
                           : hir_iota(x.f, a, fz_take(&z, 7) - 3, (hir_dtype)fz_take(&z, HIR_DTYPE_COUNT + 1));
        break;
      case 15: { /* attention of any three tensors, any desc */
        hir_sdpa_desc d;
        hir_tv *lse = NULL;
        memset(&d, 0, sizeof d);
        d.scale = fz_take(&z, 3) * 0.5, d.causal = fz_take(&z, 2), d.dropout = fz_take(&z, 3) * 0.25;
        d.seed = fz_take(&z, 2) ? hir_val_const(x.f, 3) : NULL;
        t = hir_sdpa(x.f, a, b, ntv ? tvs[fz_take(&z, ntv)] : a, &d, fz_take(&z, 2) ? &lse : NULL);
        if (lse && ntv < 15) tvs[ntv++] = lse;
        break;
      }
      default: t = hir_reshape(x.f, a, 1 + fz_take(&z, 3), sizes); break;
      }
      break;
    }
    default: break;
    }
    if (t && ntv < 16) tvs[ntv++] = t;
    if (hir_fusion_status(x.f) != HIR_OK) break; /* a sticky error: the builders said no */
  }
  if (hir_fusion_status(x.f) == HIR_ERR_INTERNAL) fz_finding("builder", hir_fusion_error(x.f));
  hir_fusion_snprint(x.f, fz_fusion, sizeof fz_fusion);
  x.ld.stream.schedule = fz_take(&z, 2) ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
  x.ld.stream.bounded_buffers = fz_take(&z, 2);
  x.ld.stream.parts = fz_take(&z, 4);
  if (fz_take(&z, 4) > 1) x.ld.stream.schedule = HIR_SCHEDULE_COLLECTIVE;
  x.ld.stream.gather_first = fz_take(&z, 2);
  x.ld.stream.experimental.column_parts = fz_take(&z, 4);
  x.ld.skip_stream_lowering = fz_take(&z, 8) == 0;
  x.ld.skip_deallocations = fz_take(&z, 8) == 0;
  for (i = 0; i < x.world; i++) { /* every rank's lowering: one verdict */
    x.ld.my_device = i;
    st[i] = hir_lower(x.f, &x.ld, &progs[i]);
    if (st[i] == HIR_ERR_INTERNAL) fz_finding("hir_lower", hir_program_error(progs[i]));
    if (i == 0) snprintf(first, sizeof first, "%s", hir_program_error(progs[0]));
    else if (st[i] != st[0] || strcmp(first, hir_program_error(progs[i])))
      fz_finding("ranks judge the fusion differently", hir_program_error(progs[i]));
    if (st[i] == HIR_OK) {
      lowered++;
      hir_program_snprint(progs[i], text, sizeof text);
      if (hir_program_verify(progs[i]) != HIR_OK) fz_finding("hir_program_verify of a lowered program", hir_program_error(progs[i]));
    }
  }
  if (lowered == x.world) {
    char msg[512];
    hir_status s = hir_verify_schedule(progs, x.world, 2, msg, sizeof msg);
    if (s == HIR_ERR_INTERNAL) fz_finding("hir_verify_schedule", msg);
    if (s == HIR_OK) { /* run it */
      x.w = hir_local_world_create(x.world);
      hir_local_world_set_timeout(x.w, 2000);
      hir_spmd(x.world, fz_rank, &x);
      for (i = 0; i < x.world; i++)
        if (x.status[i] == HIR_ERR_INTERNAL || x.status[i] == HIR_ERR_TIMEOUT) fz_finding("a run", x.error[i]);
      hir_local_world_free(x.w);
    }
  }
  for (i = 0; i < x.world; i++) hir_program_free(progs[i]);
  { /* the input's bytes as saved plans after a valid header: loaded whole, or refused leaving nothing */
    hir_tune_desc d;
    hir_tuner *t = NULL;
    memset(&d, 0, sizeof d);
    if (hir_tuner_create(x.f, &d, &t) == HIR_OK) {
      size_t head = (size_t)snprintf(text, sizeof text, "hostir tuning plans 1\nversion %s\nmachine %s\nfusion %016llx\n",
                                     HOSTIR_VERSION, t->machine, (unsigned long long)t->fusion_hash);
      hir_status ls;
      if (head + size < sizeof text) {
        memcpy(text + head, data, size);
        text[head + size] = 0;
        ls = hir__tuner_load_text(t, text, head + size);
        if (ls != HIR_OK && ls != HIR_ERR_INVALID && ls != HIR_ERR_NOMEM) fz_finding("hir_tuner_load", hir_tuner_error(t));
        if (ls != HIR_OK && t->n != 0) fz_finding("a refused plans file left plans behind", hir_tuner_error(t));
      }
    }
    hir_tuner_free(t);
  }
  hir_fusion_free(x.f);
  return 0;
}

#ifdef HIR_FUZZ_MAIN
int main(int argc, char **argv) { /* replays inputs without libFuzzer */
  int i;
  for (i = 1; i < argc; i++) {
    FILE *fp = fopen(argv[i], "rb");
    static uint8_t buf[1 << 16];
    size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
    if (fp) fclose(fp);
    LLVMFuzzerTestOneInput(buf, n);
    printf("%s: ok\n", argv[i]);
  }
  return 0;
}
#endif
