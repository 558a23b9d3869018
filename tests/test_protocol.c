/* The call protocol of hostir_nccl's kernel collectives (its nccl_kernels
   section), as a model that runs without a GPU: ranks make one sequence of
   calls, each a kernel on a grid of CTAs (one pass, or two as the two-shot
   all-reduce) or an NCCL call; every CTA reads its call's number from its
   counter, pushes its part into every peer's slots in the half the number
   picks, and either raises its flags in the peers' pads and waits for
   theirs (flags), or waits until its slots hold bytes (landing: the data
   is its own flag); it reads its own slots, putting the sentinel back, and
   advances the counters at its end. A scheduler runs the CTAs' steps in a
   random order, and every read must find the bytes of its own call and
   every write the sentinel: a call overwriting bytes not yet read, or a
   read of another call's bytes, fails the test, as does a state where no
   step can run. Checked as the kernels do it, and, to show the check can
   fail, two ways that break it, each of which some call sequences must
   catch: counters that drift apart when grids change (each CTA advancing
   its own only), and readers that leave the bytes they read. */
#include "test.h"

enum { PM_RANKS = 4, PM_CTAS = 4, PM_UNITS = 12, PM_CALLS = 24 };
enum { PM_SOUND, PM_OWN_COUNTER_ONLY, PM_NO_CLEAR }; /* the protocol, and two ways to break it */
enum { PM_BEGIN, PM_PUSH, PM_RAISE0, PM_WAIT0, PM_READ0, PM_RAISE1, PM_WAIT1, PM_READ1, PM_END, PM_DONE };

typedef struct pm_call {
  int nccl, grid, phases, landing;
} pm_call;

typedef struct pm_state {
  int n, ncalls, broken;
  pm_call call[PM_CALLS];
  int at[PM_RANKS];                               /* the call a rank runs; ncalls once done */
  int started[PM_RANKS], entered[PM_CALLS];       /* its kernel's CTAs made; ranks inside NCCL call k */
  int step[PM_RANKS][PM_CTAS];
  unsigned seq[PM_RANKS][PM_CTAS], counter[PM_RANKS][PM_CTAS];
  unsigned flag[PM_RANKS][2][PM_CTAS][PM_RANKS];  /* [pad's owner][phase][CTA][from] */
  int slot[PM_RANKS][2][2][PM_RANKS][PM_UNITS];   /* [owner][half][region][from][unit]: the call that wrote it, -1 the sentinel */
  char why[200];
} pm_state;

static unsigned pm_next(unsigned *r) {
  *r ^= *r << 13, *r ^= *r >> 17, *r ^= *r << 5;
  return *r;
}

/* The units of a grid's CTA i: its part of the data, as hir_part cuts it. */
static void pm_part(int grid, int i, int *u0, int *u1) {
  int per = (PM_UNITS + grid - 1) / grid;
  *u0 = per * i < PM_UNITS ? per * i : PM_UNITS;
  *u1 = *u0 + per < PM_UNITS ? *u0 + per : PM_UNITS;
}

static int pm_waiting_done(const pm_state *s, int r, int i, int phase) {
  int p;
  for (p = 0; p < s->n; p++)
    if (p != r && (int)(s->flag[r][phase][i][p] - s->seq[r][i]) < 0) return 0;
  return 1;
}

/* Landing: whether every unit of CTA i's part from every peer is in rank r's region. */
static int pm_landed(const pm_state *s, int r, int i, int region) {
  int p, u, u0, u1;
  pm_part(s->call[s->at[r]].grid, i, &u0, &u1);
  for (p = 0; p < s->n; p++)
    for (u = u0; p != r && u < u1; u++)
      if (s->slot[r][s->seq[r][i] & 1][region][p][u] < 0) return 0;
  return 1;
}

/* Call k's bytes into rank p's slot from r; 0 (why said) where unread bytes lie there. */
static int pm_write(pm_state *s, int p, unsigned half, int region, int r, int u, int k) {
  int *slot = &s->slot[p][half][region][r][u];
  if (*slot >= 0) {
    snprintf(s->why, sizeof s->why, "call %d from rank %d writes over call %d's unread bytes (rank %d, half %u, region %d, unit %d)",
             k, r, *slot, p, half, region, u);
    return 0;
  }
  *slot = k;
  return 1;
}

/* Runs CTA i of rank r one step; 0 (why said) where a read finds another call's bytes or a write unread ones. */
static int pm_step(pm_state *s, int r, int i) {
  const pm_call *c = &s->call[s->at[r]];
  int k = s->at[r], u0, u1, u, p, b, st;
  unsigned seq = s->seq[r][i], half = seq & 1;
  pm_part(c->grid, i, &u0, &u1);
  switch (s->step[r][i]) {
  case PM_BEGIN: s->seq[r][i] = s->counter[r][i] + 1; break;
  case PM_PUSH:
    for (p = 0; p < s->n; p++)
      for (u = u0; p != r && u < u1; u++)
        if (!pm_write(s, p, half, 0, r, u, k)) return 0;
    break;
  case PM_RAISE0:
  case PM_RAISE1:
    for (p = 0; p < s->n; p++) s->flag[p][s->step[r][i] == PM_RAISE1][i][r] = seq;
    break;
  case PM_READ0:
  case PM_READ1:
    for (u = u0; u < u1; u++) {
      int region = s->step[r][i] == PM_READ1;
      for (p = 0; p < s->n; p++) {
        int got = s->slot[r][half][region][p][u];
        if (p == r) continue;
        if (got != k) {
          snprintf(s->why, sizeof s->why, "rank %d, call %d, CTA %d of %d, pass %d: unit %d from rank %d holds call %d's bytes", r,
                   k, i, c->grid, region, u, p, got);
          return 0;
        }
        if (s->broken != PM_NO_CLEAR) s->slot[r][half][region][p][u] = -1;
      }
      if (!region && c->phases == 2) /* the two-shot's sums, pushed as it reads */
        for (b = 0; b < s->n; b++)
          if (b != r && !pm_write(s, b, half, 1, r, u, k)) return 0;
    }
    break;
  case PM_END:
    if (s->broken == PM_OWN_COUNTER_ONLY) s->counter[r][i] = seq;
    else
      for (b = i; b < PM_CTAS; b += c->grid) s->counter[r][b] = seq;
    break;
  }
  st = s->step[r][i] + 1;
  while (c->landing && (st == PM_RAISE0 || st == PM_WAIT0 || st == PM_RAISE1 || st == PM_WAIT1)) st++;
  if ((st == PM_RAISE1 || st == PM_READ1) && c->phases == 1) st = PM_END;
  s->step[r][i] = st;
  return 1;
}

/* One random call sequence, run in one random order: 1 where every read
   found its call's bytes and every rank ended. */
static int pm_run(unsigned seed, int n, int broken, char *why, size_t cap) {
  pm_state *s = (pm_state *)calloc(1, sizeof *s);
  unsigned rnd = seed * 2654435761u + 1;
  int k, r, i, ok = 1;
  if (!s) return 0;
  s->n = n;
  s->broken = broken;
  s->ncalls = PM_CALLS;
  for (k = 0; k < s->ncalls; k++) {
    s->call[k].nccl = pm_next(&rnd) % 5 == 0;
    s->call[k].grid = 1 + (int)(pm_next(&rnd) % PM_CTAS);
    s->call[k].phases = 1 + (int)(pm_next(&rnd) % 2);
    s->call[k].landing = pm_next(&rnd) % 2 == 0;
  }
  memset(s->slot, 0xff, sizeof s->slot); /* the sentinel everywhere */
  for (;;) {
    int actions[PM_RANKS * (PM_CTAS + 1)][2], na = 0, done = 0, pick;
    for (r = 0; r < n; r++) {
      const pm_call *c = &s->call[s->at[r]];
      if (s->at[r] == s->ncalls) {
        done++;
        continue;
      }
      if (c->nccl) { /* enter, then leave once every rank has entered */
        if (!s->started[r] || s->entered[s->at[r]] == n) actions[na][0] = r, actions[na++][1] = -1;
        continue;
      }
      if (!s->started[r]) {
        actions[na][0] = r, actions[na++][1] = -1;
        continue;
      }
      for (i = 0; i < c->grid; i++) {
        int st = s->step[r][i];
        if (st == PM_DONE || (st == PM_WAIT0 && !pm_waiting_done(s, r, i, 0)) || (st == PM_WAIT1 && !pm_waiting_done(s, r, i, 1)) ||
            (c->landing && (st == PM_READ0 || st == PM_READ1) && !pm_landed(s, r, i, st == PM_READ1)))
          continue;
        actions[na][0] = r, actions[na++][1] = i;
      }
      if (na == 0 || actions[na - 1][0] != r) { /* no CTA of r can step: done if all are */
        int all = 1;
        for (i = 0; i < c->grid; i++) all &= s->step[r][i] == PM_DONE;
        if (all) actions[na][0] = r, actions[na++][1] = -1;
      }
    }
    if (done == n) break;
    if (!na) {
      snprintf(s->why, sizeof s->why, "no step can run: the ranks wait at calls %d, %d, %d, %d", s->at[0], s->at[1],
               n > 2 ? s->at[2] : -1, n > 3 ? s->at[3] : -1);
      ok = 0;
      break;
    }
    pick = (int)(pm_next(&rnd) % (unsigned)na);
    r = actions[pick][0], i = actions[pick][1];
    if (i >= 0) {
      if (!(ok = pm_step(s, r, i))) break;
    } else if (s->call[s->at[r]].nccl) {
      if (!s->started[r]) s->started[r] = 1, s->entered[s->at[r]]++;
      else s->started[r] = 0, s->at[r]++;
    } else if (!s->started[r]) { /* the kernel starts: its CTAs from the first step */
      s->started[r] = 1;
      for (i = 0; i < PM_CTAS; i++) s->step[r][i] = PM_BEGIN;
    } else { /* every CTA done: the next call */
      s->started[r] = 0;
      s->at[r]++;
    }
  }
  if (!ok) snprintf(why, cap, "seed %u, %d ranks: %s", seed, n, s->why);
  free(s);
  return ok;
}

TEST(test_kernels_protocol_model, "kernels/protocol_model", TEST_CPU) {
  unsigned seed;
  int n, caught = 0;
  char why[300];
  for (n = 2; n <= PM_RANKS; n++)
    for (seed = 1; seed <= 3000; seed++)
      if (!pm_run(seed, n, 0, why, sizeof why)) {
        fprintf(stderr, "  %s\n", why);
        CHECK(!"the kernels' protocol keeps every call's bytes");
        return;
      }
  for (seed = 1; seed <= 3000 && !caught; seed++) caught = !pm_run(seed, 2, PM_OWN_COUNTER_ONLY, why, sizeof why);
  CHECK(caught); /* counters that drift apart as grids change mix two calls' bytes: the model sees it */
  for (caught = 0, seed = 1; seed <= 3000 && !caught; seed++) caught = !pm_run(seed, 2, PM_NO_CLEAR, why, sizeof why);
  CHECK(caught); /* bytes left where they were read: a later call's reader takes them, or its writer finds them */
}
