/* The row-parallel linear's all-reduce inside a GEMM of hostir's own:
   whether such a GEMM keeps cuBLAS's pace at decode shapes, and what its
   epilogue costs. At 256 tokens a pipeline of whole cuBLAS calls cannot
   reach 1.3x the floor (bench/NOTES.md, "A collective fed part by part");
   this asks whether the output can leave for the peers tile by tile from
   the GEMM's own epilogue. One NVRTC kernel (wgmma, TMA, a persistent grid,
   warpgroup 0 loading and the others multiplying) in several tile shapes,
   B layouts, k splits and clusters:
     plain   C = A B, bf16 in and out, f32 sums
     fused   every tile's bf16 partial stored into every peer's slot for this
             rank as it is made (bf16's negative zero the "not landed yet"
             sentinel, as in hostir's kernel collectives); after its last
             tile each rank sums its tiles' slots in rank order: a one-shot
             all-reduce whose pushes overlap the tiles still to come

     build/bench-gemm_ar [--shapes M,K,N:M,K,N...] [--ag-shapes M,K,N:...] [--iters 30] [--reps 20]

   First every kernel is checked on random data: against cuBLAS (norm-
   relative error, the output poisoned first), and the fused kernel with two
   ranks (on two GPUs where two can map each other's memory, else as two
   workspaces on one GPU, each grid half its SMs so that both are resident),
   six calls in turn, both ranks bit for bit the rank-order sum of their
   plain outputs. Then every shape is timed: cuBLAS, and each kernel plain,
   fused with one rank (its own slot: the epilogue's local cost) and, on two
   GPUs, fused with two ranks (the slower rank's time); us a call in CUDA
   graphs of `reps` calls over 4 input sets (more than the L2 holds), median
   of `iters`. Waits are bounded (1 s for the peers and the split sums, 2 s
   for a shared-memory stage). B is [K, N] as hostir's matmul takes it, or
   [N, K] as nn.Linear keeps it. Last, AG+GEMM with the gather in the GEMM's
   k-loop, two ranks emulated on GPU 0 (ag_case; --ag-shapes, default
   256,8192,4096:1024,8192,4096): checked bit for bit with the copies held
   back 2 ms, then timed beside the GEMM on the whole A and the copies then
   the GEMM. Without CUDA or a 9.0 GPU it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#define HOSTIR_IMPLEMENTATION
#include "../hostir.h"
#include "bench.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef HOSTIR_CUDA
int main(void) {
  (void)now_ms;
  (void)cmp_double;
  printf("bench-gemm_ar: built without CUDA; nothing to measure\n");
  return 0;
}
#else
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

static const char *const gemm_head[] = {
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "struct __align__(64) tensor_map { u64 opaque[16]; };\n"
    "/* RB row blocks of 64 per tile, each multiplied by KS warpgroups that take\n"
    "   alternate k-blocks (KS 2: their sums added through shared memory) */\n"
    "enum { RB = BM / 64, NWG = RB * KS, THREADS = 128 * (NWG + 1), BK = 64, A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2,\n"
    "       STAGE_BYTES = A_BYTES + B_BYTES, RED_BYTES = KS > 1 ? BM * BN * 4 : 0,\n"
    "       REGS = NWG == 1 ? 240 : NWG == 2 ? 232 : 112, CH = BN / 4 < 16 ? BN / 4 : 16, KEEP = BN <= 128 /* the last tile's own partial kept in registers */ };\n"
    "enum : u32 { SENTINEL = 0x80008000u };\n"
    "struct gemm_args {\n"
    "  int M, N, K;\n"
    "  u16 *c;            /* [M, N] row-major: the output (the sum, with peers) */\n"
    "  u16 *slot[8];      /* fused: each rank's slots, [2 halves][ranks][M x N] bf16; slot[me] this rank's */\n"
    "  int ranks, me;     /* ranks 0: a plain GEMM */\n"
    "  u32 *calls;        /* this rank's per-CTA call counters */\n"
    "  u32 *error;        /* 1: a wait passed its deadline */\n"
    "  u64 timeout_ns;\n"
    "  float *partial;    /* SK > 1: [tiles][SK - 1][BM x BN] f32, the later k-ranges' sums */\n"
    "  u32 *arrived;      /* SK > 1: [tiles], how many of them are in; the tile's first CTA sets it back to 0 */\n"
    "  const u32 *landed; /* the gather in the k-loop: chunks of each rank's rows landed, counted over every call; NULL: none */\n"
    "  int rows, chunk_k, chunks; /* rows a rank (rank me's from map_own, the others' from map_a: [chunks][ranks x rows][chunk_k],\n"
    "                                each chunk whole, as it lands); a chunk: chunk_k of k; chunks a call */\n"
    "};\n"
    "__device__ __forceinline__ u32 smem(const void *p) { return (u32)__cvta_generic_to_shared(p); }\n"
    "__device__ __forceinline__ u64 now_ns(void) { u64 t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); return t; }\n"
    "__device__ __forceinline__ void bar_init(u64 *b, u32 n) { asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" ::\"r\"(smem(b)), \"r\"(n)); }\n"
    "__device__ __forceinline__ void bar_expect(u64 *b, u32 bytes) {\n"
    "  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" ::\"r\"(smem(b)), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void bar_arrive(u64 *b) { asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" ::\"r\"(smem(b)) : \"memory\"); }\n"
    "__device__ __forceinline__ bool bar_try(u64 *b, u32 parity) {\n"
    "  u32 ok;\n"
    "  asm volatile(\"{\\n .reg .pred p;\\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n selp.u32 %0, 1, 0, p;\\n}\"\n"
    "               : \"=r\"(ok) : \"r\"(smem(b)), \"r\"(parity) : \"memory\");\n"
    "  return ok;\n"
    "}\n"
    "/* bounded: a stage that never fills (a wrong byte count) ends the kernel with an error, not a hung GPU */\n"
    "__device__ __forceinline__ void bar_wait(u64 *b, u32 parity) {\n"
    "  if (bar_try(b, parity)) return;\n"
    "  u64 t0 = now_ns();\n"
    "  while (!bar_try(b, parity))\n"
    "    if (now_ns() - t0 > 2000000000ull) asm volatile(\"trap;\");\n"
    "}\n"
    "__device__ __forceinline__ void tma_2d(void *dst, const tensor_map *m, u64 *b, int x, int y) {\n"
    "  asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\"\n"
    "               ::\"r\"(smem(dst)), \"l\"((u64)m), \"r\"(smem(b)), \"r\"(x), \"r\"(y) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void tma_3d(void *dst, const tensor_map *m, u64 *b, int x, int y, int z) {\n"
    "  asm volatile(\"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\"\n"
    ,
    "               ::\"r\"(smem(dst)), \"l\"((u64)m), \"r\"(smem(b)), \"r\"(x), \"r\"(y), \"r\"(z) : \"memory\");\n"
    "}\n"
    "/* the same box into every CTA of the cluster, at the same offsets, each CTA's barrier told */\n"
    "__device__ __forceinline__ void tma_2d_all(void *dst, const tensor_map *m, u64 *b, int x, int y) {\n"
    "  asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster\"\n"
    "               \" [%0], [%1, {%3, %4}], [%2], %5;\"\n"
    "               ::\"r\"(smem(dst)), \"l\"((u64)m), \"r\"(smem(b)), \"r\"(x), \"r\"(y), \"h\"((unsigned short)((1 << CM) - 1)) : \"memory\");\n"
    "}\n"
    "/* an arrival on CTA cta's barrier at b's offset */\n"
    "__device__ __forceinline__ void bar_arrive_at(u64 *b, u32 cta) {\n"
    "  asm volatile(\"{\\n .reg .b32 r;\\n mapa.shared::cluster.u32 r, %0, %1;\\n mbarrier.arrive.shared::cluster.b64 _, [r];\\n}\"\n"
    "               ::\"r\"(smem(b)), \"r\"(cta) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cluster_sync(void) {\n"
    "  asm volatile(\"barrier.cluster.arrive.release.aligned;\\n barrier.cluster.wait.acquire.aligned;\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ u32 cluster_rank(void) { u32 r; asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r)); return r; }\n"
    "/* A wgmma operand in shared memory, 128-byte swizzle: lbo, sbo in bytes */\n"
    "__device__ __forceinline__ u64 desc(u32 addr, u32 lbo, u32 sbo) {\n"
    "  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) | ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);\n"
    "}\n"
};
static const char *const gemm_body[] = {
    "__device__ __forceinline__ u32 pack2(float lo, float hi) { u32 w; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(w) : \"f\"(hi), \"f\"(lo)); return w; }\n"
    "__device__ __forceinline__ u32 unneg(u32 w) {\n"
    "  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;\n"
    "  if ((w >> 16) == 0x8000u) w &= 0xffffu;\n"
    "  return w;\n"
    "}\n"
    "__device__ __forceinline__ u32 ld_volatile(const u32 *p) { u32 v; asm volatile(\"ld.volatile.global.u32 %0, [%1];\" : \"=r\"(v) : \"l\"(p) : \"memory\"); return v; }\n"
    "__device__ __forceinline__ float lo_f(u32 w) { return __uint_as_float(w << 16); }\n"
    "__device__ __forceinline__ float hi_f(u32 w) { return __uint_as_float(w & 0xffff0000u); }\n"
    "\n"
    "/* a stage consumed: every CTA of the cluster may load into it again (thread t < CM tells CTA t) */\n"
    "__device__ __forceinline__ void release(u64 *b, int t) {\n"
    "  if (CM == 1 && t == 0) bar_arrive(b);\n"
    "  else if (CM > 1 && t < CM) bar_arrive_at(b, (u32)t);\n"
    "}\n"
    "\n"
    "/* Split k: the tile's later k-ranges store their f32 sums and count\n"
    "   themselves in; its first waits for them (bounded) and adds them to its\n"
    "   own in k order. 0: a wait passed its deadline. */\n"
    "__device__ __forceinline__ bool split_sum(const gemm_args &a, float *d, int tile, int kr, int g, int t) {\n"
    "  float *mine = a.partial + ((u64)tile * (SK - 1) + (kr ? kr - 1 : 0)) * BM * BN + (u64)g * (BN / 2) * 128;\n"
    "  const int everyone = NWG * 128;\n"
    "  if (kr) {\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < BN / 2; i++) __stcg(mine + i * 128 + t, d[i]);\n"
    "    asm volatile(\"bar.sync 4, %0;\" ::\"n\"(everyone));\n"
    "    if (g == 0 && t == 0) {\n"
    "      __threadfence();\n"
    "      atomicAdd(&a.arrived[tile], 1u);\n"
    "    }\n"
    "    return true;\n"
    "  }\n"
    "  __shared__ int late;\n"
    "  if (g == 0 && t == 0) {\n"
    "    u64 start = now_ns();\n"
    "    u32 spins = 0, n;\n"
    "    late = 0;\n"
    "    do {\n"
    "      asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" : \"=r\"(n) : \"l\"(&a.arrived[tile]) : \"memory\");\n"
    "      if ((int)n < SK - 1 && (++spins & 63) == 0 && now_ns() - start > a.timeout_ns) { *(volatile u32 *)a.error = 1; late = 1; break; }\n"
    "    } while ((int)n < SK - 1);\n"
    "    a.arrived[tile] = 0;\n"
    "  }\n"
    "  asm volatile(\"bar.sync 4, %0;\" ::\"n\"(everyone));\n"
    "  if (late) return false;\n"
    "  for (int r = 0; r < SK - 1; r++) {\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < BN / 2; i++) d[i] += __ldcg(mine + (u64)r * BM * BN + i * 128 + t);\n"
    "  }\n"
    "  return true;\n"
    "}\n"
    "\n"
    "/* Until *landed reaches want (bounded: a chunk that never lands ends the kernel with an error); then the async proxy\n"
    "   (TMA) reads what the copy engine wrote. What it read back: the caller skips the load while that covers its want. */\n"
    "__device__ __forceinline__ u32 wait_landed(const u32 *landed, u32 want, const gemm_args &a) {\n"
    "  u32 n, spins = 0;\n"
    "  u64 start = 0;\n"
    "  for (;;) {\n"
    "    asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" : \"=r\"(n) : \"l\"(landed) : \"memory\");\n"
    "    if ((int)(n - want) >= 0) break;\n"
    "    if (!start) start = now_ns();\n"
    "    else if ((++spins & 63) == 0 && now_ns() - start > a.timeout_ns) { *(volatile u32 *)a.error = 1; asm volatile(\"trap;\"); }\n"
    "  }\n"
    "  asm volatile(\"fence.proxy.async;\" ::: \"memory\");\n"
    "  return n;\n"
    "}\n"
    "/* One chunk landed: after the copies before it on its stream. */\n"
    "extern \"C\" __global__ void gemm_landed(u32 *landed) {\n"
    "  __threadfence();\n"
    "  atomicAdd(landed, 1u);\n"
    "}\n"
    "/* Holds its stream for ns nanoseconds: copies held back, so that a GEMM that did not wait would read the poison. */\n"
    "extern \"C\" __global__ void gemm_hold(u64 ns) {\n"
    "  u64 start = now_ns();\n"
    "  while (now_ns() - start < ns) __nanosleep(1000);\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void gemm_fill(u32 *p, u64 words) {\n"
    ,
    "  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) p[i] = SENTINEL;\n"
    "}\n"
    "\n"
    "/* C = A B (A [M, K] row-major; B [K, N] row-major, or BT: [N, K]), bf16 in\n"
    "   and out, f32 sums. A persistent grid; warpgroup 0's first thread loads\n"
    "   tiles by TMA into STAGES shared-memory stages, the other warpgroups\n"
    "   multiply by wgmma. A cluster of CM CTAs holds CM tiles of one column\n"
    "   block: each CTA loads 1/CM of the B tile into all of them (TMA\n"
    "   multicast), so B crosses from L2 once per cluster. SK CTAs in a row\n"
    "   split a tile's k-blocks (split_sum). Fused (ranks > 0): every tile's\n"
    "   bf16 partial goes to every peer's slot for this rank as it is made;\n"
    "   after the last tile each rank sums its tiles' slots in rank order (its\n"
    "   own partial from its registers for its last tile, from its own slot for\n"
    "   earlier ones). Gathered (landed): the rows of other ranks are loaded\n"
    "   once their chunk of k has landed (wait_landed). */\n"
    "extern \"C\" __global__ void __launch_bounds__(THREADS, 1)\n"
    "gemm_ar(const __grid_constant__ tensor_map map_a, const __grid_constant__ tensor_map map_b, const __grid_constant__ tensor_map map_own,\n"
    "        const __grid_constant__ gemm_args a) {\n"
    "  extern __shared__ unsigned char raw[];\n"
    "  unsigned char *base = raw + ((1024 - (smem(raw) & 1023)) & 1023);\n"
    "  float *red = (float *)(base + STAGES * STAGE_BYTES);\n"
    "  u64 *full = (u64 *)(base + STAGES * STAGE_BYTES + RED_BYTES), *empty = full + STAGES;\n"
    "  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;\n"
    "  const int tiles_m = a.M / BM, tiles = tiles_m * (a.N / BN), nk = a.K / BK / SK, kb0 = (int)(blockIdx.x % SK) * nk;\n"
    "  const int first = blockIdx.x / SK, stride = gridDim.x / SK; /* SK > 1: SK CTAs in a row split a tile's k-blocks */\n"
    "  if (threadIdx.x == 0) {\n"
    "    for (int s = 0; s < STAGES; s++) bar_init(&full[s], 1), bar_init(&empty[s], RB * CM);\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n"
    "  }\n"
    "  if (CM > 1) cluster_sync(); /* the peers' barriers exist before anything lands in them */\n"
    "  else __syncthreads();\n"
    "  if (wg == 0) {\n"
    "    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\");\n"
    "    if (t == 0) {\n"
    "      int s = 0, cr = (int)cluster_rank();\n"
    "      u32 phase = 0, call = a.landed ? a.calls[blockIdx.x] : 0, seen[8] = {0, 0, 0, 0, 0, 0, 0, 0};\n"
    "      (void)cr;\n"
    "      for (int tile = first; tile < tiles; tile += stride) {\n"
    "        int m0 = tile % tiles_m * BM, n0 = tile / tiles_m * BN, from = a.landed ? m0 / a.rows : -1;\n"
    "        for (int kb = 0; kb < nk; kb++) {\n"
    "          unsigned char *sa = base + s * STAGE_BYTES, *sb = sa + A_BYTES;\n"
    "          bar_wait(&empty[s], phase ^ 1);\n"
    "          bar_expect(&full[s], STAGE_BYTES);\n"
    "          if (from >= 0 && from != a.me) { /* another rank's rows: once their chunk of k has landed (read again only past it) */\n"
    "            u32 want = call * a.chunks + (kb0 + kb) * BK / a.chunk_k + 1;\n"
    "            if ((int)(seen[from & 7] - want) < 0) seen[from & 7] = wait_landed(&a.landed[from], want, a);\n"
    "          }\n"
    "          if (from == a.me) tma_2d(sa, &map_own, &full[s], (kb0 + kb) * BK, m0 - a.me * a.rows);\n"
    "          else if (from >= 0) tma_3d(sa, &map_a, &full[s], (kb0 + kb) * BK % a.chunk_k, m0, (kb0 + kb) * BK / a.chunk_k);\n"
    "          else tma_2d(sa, &map_a, &full[s], (kb0 + kb) * BK, m0);\n"
    "#if CM == 1 && BT\n"
    "          tma_2d(sb, &map_b, &full[s], (kb0 + kb) * BK, n0);\n"
    "#elif CM == 1\n"
    "          for (int j = 0; j < BN / 64; j++) tma_2d(sb + j * BK * 128, &map_b, &full[s], n0 + 64 * j, (kb0 + kb) * BK);\n"
    ,
    "#elif BT /* this CTA's rows of the tile: BN / CM of its n */\n"
    "          tma_2d_all(sb + cr * (BN / CM) * 128, &map_b, &full[s], (kb0 + kb) * BK, n0 + cr * (BN / CM));\n"
    "#else /* BK / CM of each box's k rows */\n"
    "          for (int j = 0; j < BN / 64; j++)\n"
    "            tma_2d_all(sb + j * BK * 128 + cr * (BK / CM) * 128, &map_b, &full[s], n0 + 64 * j, (kb0 + kb) * BK + cr * (BK / CM));\n"
    "#endif\n"
    "          if (++s == STAGES) s = 0, phase ^= 1;\n"
    "        }\n"
    "      }\n"
    "      if (a.landed) a.calls[blockIdx.x] = call + 1;\n"
    "      /* every stage's last use, in every CTA of the cluster, is over before this CTA's shared memory goes */\n"
    "      for (int i = 0; CM > 1 && i < STAGES; i++) {\n"
    "        bar_wait(&empty[s], phase ^ 1);\n"
    "        if (++s == STAGES) s = 0, phase ^= 1;\n"
    "      }\n"
    "    }\n"
    "    return;\n"
    "  }\n"
    "  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 %0;\" ::\"n\"((int)REGS));\n"
    "  const int g = wg - 1, rb = g % RB, kp = g / RB;\n"
    "  const int w = t / 32, l = t % 32, row_in = 64 * rb + 16 * w + l / 4, col_in = 2 * (l % 4);\n"
    "  int s = 0, half = 0;\n"
    "  u32 phase = 0, own[KEEP ? BN / 4 : 1];\n"
    "  float d[BN / 2];\n"
    "  if (a.ranks) half = a.calls[blockIdx.x] & 1;\n"
    "  for (int tile = first; tile < tiles; tile += stride) {\n"
    "    int m0 = tile % tiles_m * BM, n0 = tile / tiles_m * BN, prev = -1;\n"
    "    for (int kb = 0; kb < nk; kb++) {\n"
    "      if (kb % KS == kp) {\n"
    "        u32 sa = smem(base + s * STAGE_BYTES) + rb * 64 * 128, sb = smem(base + s * STAGE_BYTES + A_BYTES);\n"
    "        bar_wait(&full[s], phase);\n"
    "        asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n"
    "#pragma unroll\n"
    "        for (int kk = 0; kk < BK / 16; kk++) {\n"
    "#if BT\n"
    "          u64 db = desc(sb + kk * 32, 16, 1024);\n"
    "#else\n"
    "          u64 db = desc(sb + kk * 16 * 128, BK * 128, 1024);\n"
    "#endif\n"
    "          wgmma(d, desc(sa + kk * 32, 16, 1024), db, kb >= KS || kk);\n"
    "        }\n"
    "        asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
    "        asm volatile(\"wgmma.wait_group.sync.aligned 1;\" ::: \"memory\"); /* the previous k-block's are done: its stage is free */\n"
    "        if (prev >= 0) release(&empty[prev], t);\n"
    "        prev = s;\n"
    "      }\n"
    "      if (++s == STAGES) s = 0, phase ^= 1;\n"
    "    }\n"
    "    asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n"
    "    if (prev >= 0) release(&empty[prev], t);\n"
    "    if (KS > 1) { /* the odd k-blocks' sums into the even's, through shared memory */\n"
    "      float *r = red + rb * 64 * BN;\n"
    "      if (kp) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < BN / 2; i++) r[i * 128 + t] = d[i];\n"
    "      }\n"
    "      asm volatile(\"bar.sync %0, 256;\" ::\"r\"(2 + rb));\n"
    "      if (!kp) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < BN / 2; i++) d[i] += r[i * 128 + t];\n"
    "      }\n"
    "      asm volatile(\"bar.sync %0, 256;\" ::\"r\"(2 + rb));\n"
    "      if (kp) continue;\n"
    "    }\n"
    "    u16 *c = a.c + (u64)(m0 + row_in) * a.N + n0 + col_in;\n"
    "    if (SK > 1 && !split_sum(a, d, tile, kb0 / nk, g, t)) goto out;\n"
    "    if (SK > 1 && kb0) continue;\n"
    "    if (!a.ranks) {\n"
    "#pragma unroll\n"
    "      for (int j = 0; j < BN / 8; j++) {\n"
    "        *(u32 *)(c + 8 * j) = pack2(d[4 * j], d[4 * j + 1]);\n"
    "        *(u32 *)(c + 8 * a.N + 8 * j) = pack2(d[4 * j + 2], d[4 * j + 3]);\n"
    "      }\n"
    "      continue;\n"
    "    }\n"
    "    const bool keep = KEEP && tile + stride >= tiles; /* the last tile's own partial stays in registers */\n"
    "    u64 at = (u64)(m0 + row_in) * a.N + n0 + col_in, mine = ((u64)half * a.ranks + a.me) * a.M * a.N + at;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < BN / 8; j++) {\n"
    "      u32 top = unneg(pack2(d[4 * j], d[4 * j + 1])), bottom = unneg(pack2(d[4 * j + 2], d[4 * j + 3]));\n"
    ,
    "      if (KEEP) own[KEEP ? 2 * j : 0] = top, own[KEEP ? 2 * j + 1 : 0] = bottom;\n"
    "      for (int r = 0; r < a.ranks; r++)\n"
    "        if (r != a.me || !keep) *(u32 *)(a.slot[r] + mine + 8 * j) = top, *(u32 *)(a.slot[r] + mine + 8 * a.N + 8 * j) = bottom;\n"
    "    }\n"
    "  }\n"
    "  if (!a.ranks || kp || kb0) return;\n"
    "  /* the sums: every tile this CTA made, from every rank's slot here, in rank order */\n"
    "  u64 start;\n"
    "  start = now_ns();\n"
    "  for (int tile = first; tile < tiles; tile += stride) {\n"
    "    int m0 = tile % tiles_m * BM, n0 = tile / tiles_m * BN;\n"
    "    u64 at = (u64)(m0 + row_in) * a.N + n0 + col_in;\n"
    "    for (int c0 = 0; c0 < BN / 4; c0 += CH) { /* CH words at a time: sums, loads and own partials in registers */\n"
    "      float sum[CH][2];\n"
    "      u32 v[CH];\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < CH; i++) sum[i][0] = sum[i][1] = 0;\n"
    "      for (int r = 0; r < a.ranks; r++) {\n"
    "        u32 *p = (u32 *)(a.slot[a.me] + ((u64)half * a.ranks + r) * a.M * a.N + at);\n"
    "        if (KEEP && r == a.me && tile + stride >= tiles) {\n"
    "#pragma unroll\n"
    "          for (int i = 0; i < CH; i++) v[i] = own[KEEP ? c0 + i : 0];\n"
    "        } else {\n"
    "          u32 spins = 0;\n"
    "          bool all;\n"
    "#pragma unroll\n"
    "          for (int i = 0; i < CH; i++) v[i] = ld_volatile(p + ((c0 + i) & 1) * 4 * a.N + ((c0 + i) >> 1) * 4);\n"
    "          do { /* every word loaded at once, then the missing ones again */\n"
    "            all = true;\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < CH; i++)\n"
    "              if (r != a.me && unneg(v[i]) != v[i]) all = false, v[i] = ld_volatile(p + ((c0 + i) & 1) * 4 * a.N + ((c0 + i) >> 1) * 4);\n"
    "            if (!all && (++spins & 63) == 0 && now_ns() - start > a.timeout_ns) { *(volatile u32 *)a.error = 1; goto out; }\n"
    "          } while (!all);\n"
    "          if (r != a.me) {\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < CH; i++) p[((c0 + i) & 1) * 4 * a.N + ((c0 + i) >> 1) * 4] = SENTINEL;\n"
    "          }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < CH; i++) sum[i][0] += lo_f(v[i]), sum[i][1] += hi_f(v[i]);\n"
    "      }\n"
    "#pragma unroll\n"
    "      for (int i = 0; i < CH; i++) *(u32 *)(a.c + at + ((c0 + i) & 1) * 8 * a.N + ((c0 + i) >> 1) * 8) = pack2(sum[i][0], sum[i][1]);\n"
    "    }\n"
    "  }\n"
    "out: /* every summing thread meets here, also after a deadline passed */\n"
    "  if (!a.ranks || kp || kb0) return;\n"
    "  asm volatile(\"bar.sync 1, %0;\" ::\"n\"((int)RB * 128));\n"
    "  if (threadIdx.x == 128) a.calls[blockIdx.x]++;\n"
    "}\n"
};

enum { SETS = 4, MAXSHAPES = 8, MAXRANKS = 8 };
typedef struct gemm_args { /* the kernel's, field for field */
  int M, N, K;
  uint16_t *c;
  uint16_t *slot[MAXRANKS];
  int ranks, me;
  unsigned *calls, *error;
  unsigned long long timeout_ns;
  float *partial;
  unsigned *arrived;
  const unsigned *landed;
  int rows, chunk_k, chunks;
} gemm_args;
/* A tile of bm x bn; ks warpgroups alternate a row block's k-blocks; a
   cluster of cm CTAs (tiles of one column block) shares each B tile */
typedef struct config { int bm, bn, ks, stages, bt, cm, sk; } config; /* sk: CTAs a tile's k-blocks are split among */
typedef struct kernel {
  config cfg;
  void *library;
  cudaKernel_t fn, fill, landed, hold;
  size_t smem;
  char error[300];
} kernel;
typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                              const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static encode_fn encode;
static int sms, devices = 1;           /* devices: 2 where two GPUs can map each other's memory */
static cudaStream_t rank_stream[2];   /* the ranks' streams, on their GPUs */
static unsigned *error_word; /* managed: the kernels' deadline flag */

static char *kernel_source(const config *c) {
  size_t cap = 64 << 10, at = 0, i;
  char *s = (char *)malloc(cap);
  int n = c->bn / 2, r;
  if (!s) return NULL;
  at += (size_t)snprintf(s + at, cap - at, "#define BM %d\n#define BN %d\n#define KS %d\n#define STAGES %d\n#define BT %d\n#define CM %d\n"
                         "#define SK %d\n", c->bm, c->bn, c->ks, c->stages, c->bt, c->cm, c->sk);
  for (i = 0; i < sizeof gemm_head / sizeof *gemm_head; i++) at += (size_t)snprintf(s + at, cap - at, "%s", gemm_head[i]);
  at += (size_t)snprintf(s + at, cap - at, "__device__ __forceinline__ void wgmma(float *d, u64 da, u64 db, int scale) {\n"
                         "  asm volatile(\"{\\n .reg .pred p;\\n setp.ne.b32 p, %%%d, 0;\\n\"\n"
                         "    \" wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16 {", n + 2, c->bn);
  for (r = 0; r < n; r++) at += (size_t)snprintf(s + at, cap - at, "%s%%%d", r ? ", " : "", r);
  at += (size_t)snprintf(s + at, cap - at, "}, %%%d, %%%d, p, 1, 1, 0, %d;\\n}\"\n    : ", n, n + 1, c->bt ? 0 : 1);
  for (r = 0; r < n; r++) at += (size_t)snprintf(s + at, cap - at, "%s\"+f\"(d[%d])", r ? ", " : "", r);
  at += (size_t)snprintf(s + at, cap - at, "\n    : \"l\"(da), \"l\"(db), \"r\"(scale));\n}\n");
  for (i = 0; i < sizeof gemm_body / sizeof *gemm_body; i++) at += (size_t)snprintf(s + at, cap - at, "%s", gemm_body[i]);
  return s;
}

static int kernel_load(kernel *k, const config *c) {
  char *src = kernel_source(c), name[64];
  memset(k, 0, sizeof *k);
  k->cfg = *c;
  k->smem = (size_t)c->stages * (size_t)(c->bm + c->bn) * 128 + (c->ks > 1 ? (size_t)c->bm * c->bn * 4 : 0) + 1024 + 16 * (size_t)c->stages;
  snprintf(name, sizeof name, "gemm %dx%d/%d%s", c->bm, c->bn, c->ks, c->bt ? " B^T" : "");
  if (!src) return snprintf(k->error, sizeof k->error, "out of memory"), 0;
  if (c->stages % c->ks) return free(src), snprintf(k->error, sizeof k->error, "stages must be a multiple of ks"), 0;
  if (hir_cuda_library_load(0, src, name, &k->library, k->error, sizeof k->error) != HIR_OK) return free(src), 0;
  free(src);
  if (cudaLibraryGetKernel(&k->fn, (cudaLibrary_t)k->library, "gemm_ar") != cudaSuccess ||
      cudaLibraryGetKernel(&k->fill, (cudaLibrary_t)k->library, "gemm_fill") != cudaSuccess ||
      cudaLibraryGetKernel(&k->landed, (cudaLibrary_t)k->library, "gemm_landed") != cudaSuccess ||
      cudaLibraryGetKernel(&k->hold, (cudaLibrary_t)k->library, "gemm_hold") != cudaSuccess ||
      cudaKernelSetAttributeForDevice(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k->smem, 0) != cudaSuccess ||
      (devices > 1 && cudaKernelSetAttributeForDevice(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k->smem, 1) != cudaSuccess))
    return snprintf(k->error, sizeof k->error, "%s: %s", name, cudaGetErrorString(cudaGetLastError())), 0;
  return 1;
}

/* A 2-D tensor map of a row-major [rows, cols] bf16 matrix, boxes of box_rows x 64 columns, 128-byte swizzle. */
static int make_map(CUtensorMap *m, const void *p, int rows, int cols, int box_rows) {
  cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
  CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return snprintf(failure, sizeof failure, "cuTensorMapEncodeTiled: %d", (int)r), 0;
  return 1;
}

typedef struct operands { /* one input set: A [M, K], B [K, N] and its transpose [N, K] */
  uint16_t *a, *b, *bt;
  int M, K, N;
  uint16_t *own; /* the gather in the k-loop: this rank's rows of A, [rows, K]; A then holds every rank's rows */
  int rows, chunk_k; /* chunk-major, [K / chunk_k][M][chunk_k]: each chunk whole as it lands */
} operands;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint16_t *random_bf16(size_t n, float scale) {
  uint16_t *h = (uint16_t *)malloc(n * 2), *d = NULL;
  size_t i;
  if (!h) return NULL;
  for (i = 0; i < n; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = hir_float_to_bf16(((float)(rng >> 40) / 16777216.0f - 0.5f) * scale);
  }
  if (cudaMalloc((void **)&d, n * 2) != cudaSuccess || cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess) d = NULL;
  free(h);
  return d;
}

static int operands_make(operands *o, int M, int K, int N) {
  uint16_t *h, *ht;
  size_t j, k;
  memset(o, 0, sizeof *o);
  if (!(o->a = random_bf16((size_t)M * K, 1.0f)) || !(o->b = random_bf16((size_t)K * N, 0.05f)) ||
      !cuda_ok(cudaMalloc((void **)&o->bt, (size_t)K * N * 2), "cudaMalloc"))
    return snprintf(failure, sizeof failure, "operands of %d x %d x %d", M, K, N), 0;
  h = (uint16_t *)malloc((size_t)K * N * 2), ht = (uint16_t *)malloc((size_t)K * N * 2);
  if (!h || !ht) return free(h), free(ht), snprintf(failure, sizeof failure, "out of memory"), 0;
  cudaMemcpy(h, o->b, (size_t)K * N * 2, cudaMemcpyDeviceToHost);
  for (j = 0; j < (size_t)K; j++)
    for (k = 0; k < (size_t)N; k++) ht[k * K + j] = h[j * N + k];
  cudaMemcpy(o->bt, ht, (size_t)K * N * 2, cudaMemcpyHostToDevice);
  free(h), free(ht);
  o->M = M, o->K = K, o->N = N;
  /* a copy from pageable memory can return once staged, and the streams here do not wait for the legacy one */
  return cuda_ok(cudaDeviceSynchronize(), "the operands' copies");
}

static void operands_free(operands *o) { cudaFree(o->a), cudaFree(o->b), cudaFree(o->bt); }

static int gemm_launch(const kernel *k, const operands *o, const gemm_args *a, int grid, cudaStream_t s) {
  const config *c = &k->cfg;
  CUtensorMap map_a, map_b, map_own; /* B's boxes: BN / CM rows of B^T, or 64 / CM rows of K of B */
  void *argv[4];
  cudaLaunchConfig_t lc;
  cudaLaunchAttribute cluster;
  if (o->own) { /* A chunk-major: a 3-D map, boxes of bm rows of 64 of one chunk */
    cuuint64_t dim[3] = {(cuuint64_t)o->chunk_k, (cuuint64_t)o->M, (cuuint64_t)(o->K / o->chunk_k)};
    cuuint64_t stride[2] = {(cuuint64_t)o->chunk_k * 2, (cuuint64_t)o->M * o->chunk_k * 2};
    cuuint32_t box[3] = {64, (cuuint32_t)c->bm, 1}, es[3] = {1, 1, 1};
    CUresult r = encode(&map_a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, o->a, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return snprintf(failure, sizeof failure, "cuTensorMapEncodeTiled (3-D): %d", (int)r), 0;
  }
  if ((!o->own && !make_map(&map_a, o->a, o->M, o->K, c->bm)) ||
      !(c->bt ? make_map(&map_b, o->bt, o->N, o->K, c->bn / c->cm) : make_map(&map_b, o->b, o->K, o->N, 64 / c->cm)))
    return 0;
  map_own = map_a;
  if (o->own && !make_map(&map_own, o->own, o->rows, o->K, c->bm)) return 0;
  argv[0] = &map_a, argv[1] = &map_b, argv[2] = &map_own, argv[3] = (void *)a;
  memset(&lc, 0, sizeof lc);
  lc.gridDim.x = (unsigned)grid, lc.gridDim.y = lc.gridDim.z = 1;
  lc.blockDim.x = (unsigned)(128 * (c->bm / 64 * c->ks + 1)), lc.blockDim.y = lc.blockDim.z = 1;
  lc.dynamicSmemBytes = k->smem, lc.stream = s;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = (unsigned)c->cm, cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  lc.attrs = &cluster, lc.numAttrs = c->cm > 1;
  return cuda_ok(cudaLaunchKernelExC(&lc, (const void *)k->fn, argv), "launching the GEMM");
}

/* Split k's buffers in a: the later k-ranges' f32 sums and a count a tile (zeroed); 0: out of memory. */
static int split_alloc(const kernel *k, int M, int N, gemm_args *a) {
  size_t tiles = (size_t)(M / k->cfg.bm) * (size_t)(N / k->cfg.bn);
  a->partial = NULL, a->arrived = NULL;
  if (k->cfg.sk < 2) return 1;
  return cuda_ok(cudaMalloc((void **)&a->partial, (size_t)M * N * (size_t)(k->cfg.sk - 1) * 4), "cudaMalloc") &&
         cuda_ok(cudaMalloc((void **)&a->arrived, tiles * 4), "cudaMalloc") && cuda_ok(cudaMemset(a->arrived, 0, tiles * 4), "cudaMemset");
}
static void split_free(gemm_args *a) { cudaFree(a->partial), cudaFree(a->arrived), a->partial = NULL, a->arrived = NULL; }

static int tiles_of(const kernel *k, int M, int N) { return (M / k->cfg.bm) * (N / k->cfg.bn) * k->cfg.sk; }
static int grid_of(const kernel *k, int M, int N, int cap) { /* whole clusters */
  int t = tiles_of(k, M, N);
  return (t < cap ? t : cap) / (k->cfg.cm * k->cfg.sk) * (k->cfg.cm * k->cfg.sk);
}

/* cuBLAS: C [M, N] = A [M, K] B [K, N], row-major (column-major C^T = B^T A^T) */
static int blas_gemm(cublasHandle_t h, const operands *o, uint16_t *c, int M, int K, int N) {
  float one = 1, zero = 0;
  return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, o->b, CUDA_R_16BF, N, o->a, CUDA_R_16BF, K, &zero, c, CUDA_R_16BF,
                      N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}

static float bf(uint16_t h) {
  uint32_t w = (uint32_t)h << 16;
  float f;
  memcpy(&f, &w, 4);
  return f;
}

/* ||got - want|| / ||want||, how many of got are the poison (0xffff: a NaN), how many differ */
static double rel_error(const uint16_t *got, const uint16_t *want, size_t n, size_t *unwritten, size_t *differ) {
  double num = 0, den = 0;
  size_t i;
  *unwritten = *differ = 0;
  for (i = 0; i < n; i++) {
    double d = (double)bf(got[i]) - bf(want[i]);
    if (got[i] == 0xffff) ++*unwritten;
    *differ += got[i] != want[i];
    num += d * d, den += (double)bf(want[i]) * bf(want[i]);
  }
  return den > 0 ? sqrt(num / den) : 1;
}

typedef struct shape { int M, K, N; } shape;

/* Times `reps` calls of fn per graph, over the input sets in turn: us a call, median of iters. */
typedef int (*call_fn)(void *ctx, int set, cudaStream_t s);
static double time_calls(call_fn fn, void *ctx, cudaStream_t s, int reps, int iters) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaEvent_t e0, e1;
  double *t = (double *)malloc((size_t)iters * sizeof *t), median = -1;
  int i, ok = 1;
  if (!t) return -1;
  if (!cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture")) return free(t), -1;
  for (i = 0; i < reps && ok; i++) ok = fn(ctx, i % SETS, s);
  if (!cuda_ok(cudaStreamEndCapture(s, &graph), "capture") || !ok) return free(t), -1;
  if (!cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) return cudaGraphDestroy(graph), free(t), -1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  for (i = -3; i < iters && ok; i++) {
    float ms = 0;
    cudaEventRecord(e0, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    ok = cuda_ok(cudaEventSynchronize(e1), "a timed graph") && !*error_word;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 0) t[i] = ms * 1e3 / reps;
  }
  if (ok) {
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    median = t[iters / 2];
  } else if (*error_word) {
    snprintf(failure, sizeof failure, "a wait passed its deadline");
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  free(t);
  return median;
}

typedef struct run_ctx {
  const kernel *k;
  operands *sets;
  cublasHandle_t blas;
  uint16_t *c;
  gemm_args args;
  int grid, M, K, N;
} run_ctx;
static int call_blas(void *x, int set, cudaStream_t s) {
  run_ctx *r = (run_ctx *)x;
  (void)s;
  return blas_gemm(r->blas, &r->sets[set], r->c, r->M, r->K, r->N);
}
static int call_blas_one(void *x, int set, cudaStream_t s) {
  (void)set;
  return call_blas(x, 0, s);
}
static int call_ours(void *x, int set, cudaStream_t s) {
  run_ctx *r = (run_ctx *)x;
  return gemm_launch(r->k, &r->sets[set], &r->args, r->grid, s);
}

static int fill_slots(const kernel *k, uint16_t *p, size_t elems, cudaStream_t s) {
  unsigned long long words = elems / 2;
  void *argv[2];
  dim3 g = {264, 1, 1}, b = {256, 1, 1};
  argv[0] = &p, argv[1] = &words;
  return cuda_ok(cudaLaunchKernel((const void *)k->fill, g, b, argv, 0, s), "the sentinel fill");
}

/* Two ranks: on two GPUs where there are two (peers mapped), else both on
   this one, each with half the SMs (both grids resident, as the waits
   need). Six fused calls in turn, both ranks' C bit for bit the rank-order
   sum of the two ranks' plain outputs (the same tiles, the same sums);
   then, on two GPUs and iters > 0, the fused call timed: each rank a
   graph of `reps` calls, the slower rank's time a call, median of `iters`
   (us, or -1). */
static int fused_pair(const kernel *k, const shape *sh, int reps, int iters, double *us) {
  int M = sh->M, K = sh->K, N = sh->N, r, call, grid;
  size_t n = (size_t)M * N, i, bad = 0;
  operands o[2];
  uint16_t *c[2] = {NULL, NULL}, *slot[2] = {NULL, NULL}, *q[2], *want = (uint16_t *)malloc(n * 2), *got = (uint16_t *)malloc(n * 2);
  unsigned *calls[2] = {NULL, NULL};
  gemm_args a[2];
  cudaGraphExec_t exec[2] = {NULL, NULL};
  int ok = want && got, dev[2];
  dev[0] = 0, dev[1] = devices > 1;
  grid = grid_of(k, M, N, devices > 1 ? sms : sms / 2);
  *us = -1;
  memset(a, 0, sizeof a);
  q[0] = (uint16_t *)malloc(n * 2), q[1] = (uint16_t *)malloc(n * 2);
  for (r = 0; r < 2 && ok; r++) {
    cudaSetDevice(dev[r]);
    ok = operands_make(&o[r], M, K, N) && cuda_ok(cudaMalloc((void **)&c[r], n * 2), "cudaMalloc") &&
         cuda_ok(cudaMalloc((void **)&slot[r], 2 * 2 * n * 2), "cudaMalloc") &&
         cuda_ok(cudaMalloc((void **)&calls[r], 1024 * 4), "cudaMalloc") && cuda_ok(cudaMemset(calls[r], 0, 1024 * 4), "cudaMemset") &&
         fill_slots(k, slot[r], 4 * n, rank_stream[r]);
    a[r].M = M, a[r].N = N, a[r].K = K, a[r].c = c[r], a[r].error = error_word, a[r].timeout_ns = 1000000000ull;
    if (ok) ok = split_alloc(k, M, N, &a[r]);
    if (ok) ok = gemm_launch(k, &o[r], &a[r], grid, rank_stream[r]) && cuda_ok(cudaStreamSynchronize(rank_stream[r]), "plain GEMM") &&
                 cuda_ok(cudaMemcpy(q[r], c[r], n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  for (i = 0; ok && i < n; i++) { /* 0 + q0 + q1 in f32, negative zeros made positive, rounded once */
    float s = 0;
    for (r = 0; r < 2; r++) s += bf(q[r][i] == 0x8000 ? 0 : q[r][i]);
    want[i] = hir_float_to_bf16(s);
  }
  for (r = 0; r < 2 && ok; r++) {
    a[r].ranks = 2, a[r].me = r, a[r].calls = calls[r];
    a[r].slot[0] = slot[0], a[r].slot[1] = slot[1];
  }
  for (call = 0; ok && call < 6; call++) {
    for (r = 0; r < 2 && ok; r++)
      cudaSetDevice(dev[r]), ok = cuda_ok(cudaMemsetAsync(c[r], 0xff, n * 2, rank_stream[r]), "poison") &&
                                  cuda_ok(cudaStreamSynchronize(rank_stream[r]), "poison");
    for (r = 0; r < 2 && ok; r++) cudaSetDevice(dev[r]), ok = gemm_launch(k, &o[r], &a[r], grid, rank_stream[r]);
    for (r = 0; r < 2 && ok; r++) cudaSetDevice(dev[r]), ok = cuda_ok(cudaStreamSynchronize(rank_stream[r]), "fused GEMM");
    if (ok && *error_word) ok = 0, snprintf(failure, sizeof failure, "fused call %d: a wait passed its deadline", call);
    for (r = 0; r < 2 && ok; r++) {
      cudaSetDevice(dev[r]);
      ok = cuda_ok(cudaMemcpy(got, c[r], n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (i = 0, bad = 0; ok && i < n; i++) bad += got[i] != want[i] && !((got[i] | want[i]) == 0x8000);
      if (ok && bad) {
        for (i = 0; i < n && got[i] == want[i]; i++) {}
        snprintf(failure, sizeof failure, "fused call %d, rank %d: %zu of %zu differ (first at row %zu col %zu: %04x, want %04x)", call,
                 r, bad, n, i / N, i % N, got[i], want[i]);
        ok = 0;
      }
    }
  }
  for (r = 0; r < 2 && ok && devices > 1 && iters > 0; r++) { /* timed: a graph of reps calls a rank */
    cudaGraph_t graph;
    cudaSetDevice(dev[r]);
    ok = cuda_ok(cudaStreamBeginCapture(rank_stream[r], cudaStreamCaptureModeThreadLocal), "capture");
    for (call = 0; ok && call < reps; call++) ok = gemm_launch(k, &o[r], &a[r], grid, rank_stream[r]);
    if (!cuda_ok(cudaStreamEndCapture(rank_stream[r], &graph), "capture") || !ok) ok = 0;
    else ok = cuda_ok(cudaGraphInstantiate(&exec[r], graph, 0), "instantiate"), cudaGraphDestroy(graph);
  }
  if (ok && devices > 1 && iters > 0) {
    double *t = (double *)malloc((size_t)iters * sizeof *t);
    cudaEvent_t e[2][2];
    for (r = 0; r < 2; r++) cudaSetDevice(dev[r]), cudaEventCreate(&e[r][0]), cudaEventCreate(&e[r][1]);
    for (call = -3; ok && t && call < iters; call++) {
      double worst = 0;
      for (r = 0; r < 2; r++)
        cudaSetDevice(dev[r]), cudaEventRecord(e[r][0], rank_stream[r]), cudaGraphLaunch(exec[r], rank_stream[r]),
            cudaEventRecord(e[r][1], rank_stream[r]);
      for (r = 0; r < 2 && ok; r++) {
        float ms = 0;
        cudaSetDevice(dev[r]);
        ok = cuda_ok(cudaEventSynchronize(e[r][1]), "a timed graph") && !*error_word;
        cudaEventElapsedTime(&ms, e[r][0], e[r][1]);
        if (ms > worst) worst = ms;
      }
      if (call >= 0) t[call] = worst * 1e3 / reps;
    }
    if (ok && t) qsort(t, (size_t)iters, sizeof *t, cmp_double), *us = t[iters / 2];
    else if (*error_word) snprintf(failure, sizeof failure, "a timed fused call's wait passed its deadline");
    for (r = 0; r < 2; r++) cudaSetDevice(dev[r]), cudaEventDestroy(e[r][0]), cudaEventDestroy(e[r][1]);
    free(t);
  }
  for (r = 0; r < 2; r++) {
    cudaSetDevice(dev[r]);
    if (exec[r]) cudaGraphExecDestroy(exec[r]);
    if (c[r]) operands_free(&o[r]);
    cudaFree(c[r]), cudaFree(slot[r]), cudaFree(calls[r]), free(q[r]), split_free(&a[r]);
  }
  cudaSetDevice(0);
  free(want), free(got);
  return ok;
}

/* AG+GEMM with the gather in the GEMM's k-loop, two ranks emulated on GPU 0:
   rank 0's GEMM over A = [its rows; rank 1's rows], rank 1's rows copied
   from its buffer in `chunks` chunks of k (copy engine, each chunk one
   contiguous block in both buffers, chunk-major; a landed count after each)
   on a second stream while the GEMM runs, its loading warp waiting for each
   chunk before its TMA loads of those rows. The GEMM leaves two SMs free: a
   count is a kernel of one thread, which a GEMM holding every SM while it
   waits would never let run. Checked bit for bit against the same kernel on
   the whole A (the gathered buffer poisoned, the copies held back 2 ms);
   then timed (us[0..3]): that GEMM on the whole A, the copies then the GEMM
   (serial), the gather in the k-loop, and cuBLAS on the whole A (the decode
   tables' floor). */
typedef struct ag_ctx {
  const kernel *k;
  operands *whole, *split;
  uint16_t *sender; /* rank 1's rows, chunk-major [chunks][rows][chunk_k] */
  gemm_args plain, ag;
  unsigned *landed; /* [2]: chunks of each rank's rows landed; rank 1's are the ones copied */
  cudaStream_t copy;
  cudaEvent_t fork, join;
  int grid, chunks, variant; /* 0 floor, 1 serial, 2 in the k-loop */
  unsigned long long hold_ns; /* > 0: the copies held back this long (the check) */
} ag_ctx;
static int ag_call(void *x, int set, cudaStream_t s) {
  ag_ctx *g = (ag_ctx *)x;
  const operands *o = g->split;
  int j, rows = o->rows, ck = o->K / g->chunks, ok = 1;
  cudaStream_t cs = g->variant == 2 ? g->copy : s;
  unsigned *peer = g->landed + 1;
  void *argv[1];
  dim3 one = {1, 1, 1};
  (void)set;
  if (g->variant == 0) return gemm_launch(g->k, g->whole, &g->plain, g->grid, s);
  argv[0] = &peer;
  if (g->variant == 2) ok = cuda_ok(cudaEventRecord(g->fork, s), "fork") && cuda_ok(cudaStreamWaitEvent(g->copy, g->fork, 0), "fork");
  if (ok && g->hold_ns) {
    void *hold_argv[1];
    hold_argv[0] = &g->hold_ns;
    ok = cuda_ok(cudaLaunchKernel((const void *)g->k->hold, one, one, hold_argv, 0, cs), "the hold");
  }
  for (j = 0; ok && j < g->chunks; j++) /* the peer's rows [rows, 2 rows), k in [j ck, (j + 1) ck) */
    ok = cuda_ok(cudaMemcpyAsync(o->a + ((size_t)j * o->M + rows) * ck, g->sender + (size_t)j * rows * ck, (size_t)rows * ck * 2,
                                 cudaMemcpyDeviceToDevice, cs), "a chunk's copy") &&
         cuda_ok(cudaLaunchKernel((const void *)g->k->landed, one, one, argv, 0, cs), "a chunk's count");
  if (ok && g->variant == 2) ok = cuda_ok(cudaEventRecord(g->join, g->copy), "join");
  ok = ok && gemm_launch(g->k, o, &g->ag, g->grid, s);
  if (ok && g->variant == 2) ok = cuda_ok(cudaStreamWaitEvent(s, g->join, 0), "join");
  return ok;
}
static int ag_case(const kernel *k, const shape *sh, int chunks, cudaStream_t st[2], cublasHandle_t blas, int reps, int iters,
                   double us[4]) {
  int M = sh->M, K = sh->K, N = sh->N, v, ok;
  size_t n = (size_t)M * N, i, bad = 0;
  operands whole, split;
  ag_ctx g;
  uint16_t *want = (uint16_t *)malloc(n * 2), *got = (uint16_t *)malloc(n * 2);
  memset(&g, 0, sizeof g);
  us[0] = us[1] = us[2] = us[3] = -1;
  ok = want && got && operands_make(&whole, M, K, N);
  if (!ok) return free(want), free(got), 0;
  split = whole;
  split.own = whole.a, split.rows = M / 2, split.chunk_k = K / chunks;
  ok = cuda_ok(cudaMalloc((void **)&split.a, (size_t)M * K * 2), "cudaMalloc") &&
       cuda_ok(cudaMalloc((void **)&g.sender, (size_t)(M / 2) * K * 2), "cudaMalloc") &&
       cuda_ok(cudaMalloc((void **)&g.plain.c, n * 2), "cudaMalloc") && cuda_ok(cudaMalloc((void **)&g.landed, 8), "cudaMalloc") &&
       cuda_ok(cudaMemset(g.landed, 0, 8), "cudaMemset") && cuda_ok(cudaMalloc((void **)&g.ag.calls, 4096), "cudaMalloc") &&
       cuda_ok(cudaMemset(g.ag.calls, 0, 4096), "cudaMemset") &&
       cuda_ok(cudaEventCreateWithFlags(&g.fork, cudaEventDisableTiming), "event") &&
       cuda_ok(cudaEventCreateWithFlags(&g.join, cudaEventDisableTiming), "event");
  g.k = k, g.whole = &whole, g.split = &split, g.copy = st[1], g.chunks = chunks, g.grid = grid_of(k, M, N, sms - 2);
  for (v = 0; ok && v < chunks; v++) /* the sender's rows, chunk-major */
    ok = cuda_ok(cudaMemcpy2D(g.sender + (size_t)v * (M / 2) * (K / chunks), (size_t)(K / chunks) * 2,
                              whole.a + (size_t)(M / 2) * K + (size_t)v * (K / chunks), (size_t)K * 2, (size_t)(K / chunks) * 2,
                              (size_t)(M / 2), cudaMemcpyDeviceToDevice), "the sender's rows");
  ok = ok && cuda_ok(cudaDeviceSynchronize(), "the sender's rows");
  g.plain.M = M, g.plain.N = N, g.plain.K = K, g.plain.error = error_word, g.plain.timeout_ns = 1000000000ull;
  g.ag = (gemm_args){.M = M, .N = N, .K = K, .c = g.plain.c, .calls = g.ag.calls, .error = error_word, .timeout_ns = 1000000000ull,
                     .landed = g.landed, .rows = M / 2, .chunk_k = K / chunks, .chunks = chunks};
  ok = ok && split_alloc(k, M, N, &g.plain) && split_alloc(k, M, N, &g.ag);
  for (v = 0; ok && v < 3; v++) { /* each variant once, checked: the floor's output is the reference */
    g.variant = v;
    g.hold_ns = v == 2 ? 2000000 : 0; /* 2 ms: a tile that did not wait for its chunk reads the poison */
    ok = cuda_ok(cudaMemsetAsync(g.plain.c, 0xff, n * 2, st[0]), "poison") &&
         cuda_ok(cudaMemsetAsync(split.a, 0xff, (size_t)M * K * 2, st[0]), "poison") && ag_call(&g, 0, st[0]) &&
         cuda_ok(cudaStreamSynchronize(st[0]), "an AG+GEMM call") &&
         cuda_ok(cudaMemcpy(v ? got : want, g.plain.c, n * 2, cudaMemcpyDeviceToHost), "copy");
    if (ok && *error_word) ok = 0, snprintf(failure, sizeof failure, "a chunk never landed");
    for (i = 0, bad = 0; ok && v && i < n; i++) bad += got[i] != want[i];
    if (ok && bad)
      ok = 0, snprintf(failure, sizeof failure, "AG+GEMM variant %d: %zu of %zu differ from the GEMM on the whole A", v, bad, n);
  }
  g.hold_ns = 0;
  for (v = 0; ok && v < 3; v++) {
    g.variant = v;
    if ((us[v] = time_calls(ag_call, &g, st[0], reps, iters)) < 0)
      ok = 0, snprintf(failure + strlen(failure), sizeof failure - strlen(failure), " (timing variant %d)", v);
  }
  if (ok) {
    run_ctx x;
    memset(&x, 0, sizeof x);
    x.sets = &whole, x.blas = blas, x.c = g.plain.c, x.M = M, x.K = K, x.N = N; /* one input set, as the rows above */
    us[3] = time_calls(call_blas_one, &x, st[0], reps, iters);
  }
  split_free(&g.plain), split_free(&g.ag);
  operands_free(&whole);
  cudaFree(split.a), cudaFree(g.sender), cudaFree(g.plain.c), cudaFree(g.landed), cudaFree(g.ag.calls);
  if (g.fork) cudaEventDestroy(g.fork);
  if (g.join) cudaEventDestroy(g.join);
  free(want), free(got);
  return ok;
}

static int parse_shapes(const char *s, shape *out) {
  int n = 0;
  while (*s && n < MAXSHAPES) {
    char *end;
    out[n].M = (int)strtol(s, &end, 10);
    if (*end != ',') return 0;
    out[n].K = (int)strtol(end + 1, &end, 10);
    if (*end != ',') return 0;
    out[n].N = (int)strtol(end + 1, &end, 10);
    if (out[n].M <= 0 || out[n].K <= 0 || out[n].N <= 0) return 0;
    n++;
    if (*end == ':') end++;
    else if (*end) return 0;
    s = end;
  }
  return n;
}

static const char *tile_name(const config *c) {
  static char buf[4][48];
  static int k;
  char *b = buf[k++ & 3];
  snprintf(b, 48, "%dx%d%s%s%s", c->bm, c->bn, c->ks > 1 ? " k/2" : "", c->cm == 4 ? " B/4" : c->cm == 2 ? " B/2" : "",
           c->sk == 4 ? " k split 4" : c->sk == 2 ? " k split 2" : "");
  return b;
}
static int fits(const kernel *k, const shape *sh) {
  return !(sh->M % k->cfg.bm) && !(sh->N % k->cfg.bn) && !(sh->K % (64 * k->cfg.sk)) && sh->K / 64 / k->cfg.sk >= k->cfg.ks &&
         !(sh->M / k->cfg.bm % k->cfg.cm);
}

int main(int argc, char **argv) {
  static const config configs[] = {{64, 128, 1, 8, 0, 1, 1},  {64, 128, 1, 8, 0, 2, 1},  {128, 128, 1, 6, 0, 1, 2},
                                   {128, 128, 1, 6, 0, 1, 4}, {128, 256, 1, 4, 0, 1, 1}, {128, 256, 1, 4, 0, 1, 2},
                                   {128, 256, 1, 4, 0, 1, 4}, {128, 128, 1, 6, 1, 1, 2}, {128, 256, 1, 4, 1, 1, 4}};
  enum { NCONFIGS = sizeof configs / sizeof *configs };
  shape shapes[MAXSHAPES] = {{256, 4096, 4096}, {1024, 4096, 4096}, {256, 2048, 4096}, {1024, 2048, 4096}, {4096, 4096, 4096}};
  shape ag_shapes[MAXSHAPES] = {{256, 8192, 4096}, {1024, 8192, 4096}};
  int nshapes = 5, n_ag = 2, iters = 30, reps = 20, i, j, major = 0;
  kernel kernels[NCONFIGS];
  int loaded[NCONFIGS];
  cudaStream_t st[2];
  cublasHandle_t blas;
  void *blas_ws = NULL;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
      if (!(nshapes = parse_shapes(argv[++i], shapes))) return fprintf(stderr, "bench-gemm_ar: --shapes M,K,N[:M,K,N...]\n"), 2;
    } else if (!strcmp(argv[i], "--ag-shapes") && i + 1 < argc) {
      if (!(n_ag = parse_shapes(argv[++i], ag_shapes))) return fprintf(stderr, "bench-gemm_ar: --ag-shapes M,K,N[:M,K,N...]\n"), 2;
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: build/bench-gemm_ar [--shapes M,K,N:...] [--ag-shapes M,K,N:...] [--iters 30] [--reps 20]\n");
      return 2;
    }
  }
  if (iters < 1 || reps < 1) return fprintf(stderr, "bench-gemm_ar: --iters and --reps take 1 or more\n"), 2;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) return printf("bench-gemm_ar: no GPU; nothing to measure\n"), 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (major != 9) return printf("bench-gemm_ar: the kernel is wgmma's (compute capability 9.0); this GPU is %d.x\n", major), 0;
  if (devices > 1) { /* two ranks on two GPUs, each storing into the other's memory */
    int other = 0, can = 0;
    cudaDeviceGetAttribute(&other, cudaDevAttrComputeCapabilityMajor, 1);
    cudaDeviceCanAccessPeer(&can, 0, 1);
    devices = other == 9 && can ? 2 : 1;
    for (i = 0; i < devices; i++)
      if (cudaSetDevice(i) != cudaSuccess ||
          (cudaDeviceEnablePeerAccess(1 - i, 0) != cudaSuccess && cudaGetLastError() != cudaErrorPeerAccessAlreadyEnabled))
        devices = 1;
    cudaSetDevice(0);
  }
  {
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return printf("bench-gemm_ar: no cuTensorMapEncodeTiled\n"), 1;
    memcpy(&encode, &fn, sizeof fn);
  }
  if (!cuda_ok(cudaMallocManaged((void **)&error_word, 4, cudaMemAttachGlobal), "cudaMallocManaged") ||
      !cuda_ok(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking), "stream") ||
      !cuda_ok(cudaSetDevice(devices - 1), "cudaSetDevice") || !cuda_ok(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking), "stream") ||
      !cuda_ok(cudaSetDevice(0), "cudaSetDevice") || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
      !cuda_ok(cudaMalloc(&blas_ws, 32u << 20), "cudaMalloc"))
    return printf("bench-gemm_ar: %s\n", failure), 1;
  *error_word = 0;
  rank_stream[0] = st[0], rank_stream[1] = st[1];
  cublasSetStream(blas, st[0]);
  cublasSetWorkspace(blas, blas_ws, 32u << 20);
  for (i = 0; i < NCONFIGS; i++) {
    loaded[i] = kernel_load(&kernels[i], &configs[i]);
    if (!loaded[i]) printf("%s: %s\n", tile_name(&configs[i]), kernels[i].error);
    if (loaded[i] && configs[i].cm > 1) { /* how many clusters the GPU holds at once */
      cudaLaunchConfig_t lc;
      cudaLaunchAttribute cluster;
      int most = -1;
      memset(&lc, 0, sizeof lc);
      lc.gridDim.x = 128, lc.gridDim.y = lc.gridDim.z = 1;
      lc.blockDim.x = (unsigned)(128 * (configs[i].bm / 64 * configs[i].ks + 1)), lc.blockDim.y = lc.blockDim.z = 1;
      lc.dynamicSmemBytes = kernels[i].smem;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = (unsigned)configs[i].cm, cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
      lc.attrs = &cluster, lc.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&most, (const void *)kernels[i].fn, &lc) != cudaSuccess) cudaGetLastError();
      printf("%s: %d clusters of %d at once\n", tile_name(&configs[i]), most, configs[i].cm);
    }
  }
  /* correctness on random data: every tile shape against cuBLAS, then the fused protocol */
  for (j = 0; j < 2; j++) {
    shape sh = j ? shapes[0] : (shape){384, 1024, 768};
    size_t n = (size_t)sh.M * sh.N, unwritten, differ;
    operands o;
    uint16_t *c = NULL, *ref = NULL, *want = (uint16_t *)malloc(n * 2), *got = (uint16_t *)malloc(n * 2);
    if (!want || !got || !operands_make(&o, sh.M, sh.K, sh.N) || !cuda_ok(cudaMalloc((void **)&c, n * 2), "cudaMalloc") ||
        !cuda_ok(cudaMalloc((void **)&ref, n * 2), "cudaMalloc"))
      return printf("bench-gemm_ar: %s\n", failure), 1;
    if (!blas_gemm(blas, &o, ref, sh.M, sh.K, sh.N) || !cuda_ok(cudaMemcpy(want, ref, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy"))
      return printf("bench-gemm_ar: cuBLAS failed\n"), 1;
    for (i = 0; i < NCONFIGS; i++) {
      gemm_args a;
      double e;
      if (!loaded[i] || !fits(&kernels[i], &sh)) continue;
      memset(&a, 0, sizeof a);
      a.M = sh.M, a.N = sh.N, a.K = sh.K, a.c = c, a.error = error_word, a.timeout_ns = 1000000000ull;
      cudaMemset(c, 0xff, n * 2);
      if (!split_alloc(&kernels[i], sh.M, sh.N, &a) || !gemm_launch(&kernels[i], &o, &a, grid_of(&kernels[i], sh.M, sh.N, sms), st[0]) ||
          !cuda_ok(cudaStreamSynchronize(st[0]), "the GEMM") || !cuda_ok(cudaMemcpy(got, c, n * 2, cudaMemcpyDeviceToHost), "copy"))
        return printf("bench-gemm_ar: %s: %s\n", tile_name(&kernels[i].cfg), failure), 1;
      split_free(&a);
      if (*error_word) return printf("bench-gemm_ar: %s: a split's wait passed its deadline\n", tile_name(&kernels[i].cfg)), 1;
      e = rel_error(got, want, n, &unwritten, &differ);
      printf("check %dx%dx%d  tile %s%s: error %.2e, %zu of %zu differ from cuBLAS's, %zu unwritten%s\n", sh.M, sh.K, sh.N,
             tile_name(&kernels[i].cfg), kernels[i].cfg.bt ? " B^T" : "", e, differ, n, unwritten,
             e < 5e-3 && !unwritten ? "" : "  WRONG");
      if (!(e < 5e-3 && !unwritten)) loaded[i] = 0;
    }
    operands_free(&o);
    cudaFree(c), cudaFree(ref), free(want), free(got);
  }
  for (i = 0; i < NCONFIGS; i++) {
    if (!loaded[i] || !fits(&kernels[i], &shapes[0])) continue;
    double unused;
    if (fused_pair(&kernels[i], &shapes[0], reps, 0, &unused))
      printf("fused, 2 ranks on %s, %dx%dx%d tile %s%s: 6 calls bit for bit\n", devices > 1 ? "two GPUs" : "one GPU", shapes[0].M,
             shapes[0].K, shapes[0].N, tile_name(&kernels[i].cfg), kernels[i].cfg.bt ? " B^T" : "");
    else
      printf("fused, 2 ranks, tile %s%s: WRONG: %s\n", tile_name(&kernels[i].cfg), kernels[i].cfg.bt ? " B^T" : "", failure),
          loaded[i] = 0, *error_word = 0;
  }
  /* times */
  printf("\n| M, K, N | cuBLAS us | tile | B | ours us | x cuBLAS | fused, 1 rank us | x cuBLAS | fused, 2 GPUs us | x cuBLAS |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n");
  for (j = 0; j < nshapes; j++) {
    shape sh = shapes[j];
    operands sets[SETS];
    run_ctx x;
    size_t n = (size_t)sh.M * sh.N;
    uint16_t *slot = NULL;
    unsigned *calls = NULL;
    double blas_us;
    memset(&x, 0, sizeof x);
    for (i = 0; i < SETS; i++)
      if (!operands_make(&sets[i], sh.M, sh.K, sh.N)) return printf("bench-gemm_ar: %s\n", failure), 1;
    if (!cuda_ok(cudaMalloc((void **)&x.c, n * 2), "cudaMalloc") || !cuda_ok(cudaMalloc((void **)&slot, 2 * n * 2), "cudaMalloc") ||
        !cuda_ok(cudaMalloc((void **)&calls, 4096), "cudaMalloc") || !cuda_ok(cudaMemset(calls, 0, 4096), "cudaMemset"))
      return printf("bench-gemm_ar: %s\n", failure), 1;
    x.sets = sets, x.blas = blas, x.M = sh.M, x.K = sh.K, x.N = sh.N;
    blas_us = time_calls(call_blas, &x, st[0], reps, iters);
    for (i = 0; i < NCONFIGS; i++) {
      double plain, fused, pair = -1;
      if (!loaded[i] || !fits(&kernels[i], &sh)) continue;
      x.k = &kernels[i];
      x.grid = grid_of(&kernels[i], sh.M, sh.N, sms);
      memset(&x.args, 0, sizeof x.args);
      x.args.M = sh.M, x.args.N = sh.N, x.args.K = sh.K, x.args.c = x.c, x.args.error = error_word;
      x.args.timeout_ns = 1000000000ull;
      if (!split_alloc(&kernels[i], sh.M, sh.N, &x.args)) return printf("bench-gemm_ar: %s\n", failure), 1;
      plain = time_calls(call_ours, &x, st[0], reps, iters);
      x.args.ranks = 1, x.args.me = 0, x.args.slot[0] = slot, x.args.calls = calls;
      fused = time_calls(call_ours, &x, st[0], reps, iters);
      split_free(&x.args);
      if (devices > 1 && !fused_pair(&kernels[i], &sh, reps, iters, &pair)) printf("  (fused on two GPUs: %s)\n", failure), *error_word = 0;
      printf("| %d, %d, %d | %.1f | %s | %s | %.1f | %.2f | %.1f | %.2f |", sh.M, sh.K, sh.N, blas_us, tile_name(&kernels[i].cfg),
             kernels[i].cfg.bt ? "[N, K]" : "[K, N]", plain, plain / blas_us, fused, fused / blas_us);
      if (pair > 0) printf(" %.1f | %.2f |\n", pair, pair / blas_us);
      else printf(" - | - |\n");
      if (plain < 0 || fused < 0) printf("  (%s)\n", failure), *error_word = 0;
    }
    for (i = 0; i < SETS; i++) operands_free(&sets[i]);
    cudaFree(x.c), cudaFree(slot), cudaFree(calls);
  }
  printf("\nAG+GEMM, the gather in the k-loop (two ranks emulated on GPU 0: the peer's M/2 rows copied in 8 chunks of k):\n"
         "| M, K, N | cuBLAS, whole A us | tile | GEMM, whole A us | copies, then GEMM us | in the k-loop us | x GEMM | x cuBLAS |\n"
         "|---|---|---|---|---|---|---|---|\n");
  for (j = 0; j < n_ag; j++)
    for (i = 0; i < NCONFIGS; i++) {
      double us[4];
      shape sh = ag_shapes[j];
      if (!loaded[i] || !fits(&kernels[i], &sh) || sh.M % 2 || (sh.M / 2) % kernels[i].cfg.bm || sh.K % (8 * 64) || kernels[i].cfg.cm > 1)
        continue;
      if (!ag_case(&kernels[i], &sh, 8, st, blas, reps, iters, us)) printf("  (%s: %s)\n", tile_name(&kernels[i].cfg), failure), *error_word = 0;
      else
        printf("| %d, %d, %d | %.1f | %s%s | %.1f | %.1f | %.1f | %.2f | %.2f |\n", sh.M, sh.K, sh.N, us[3], tile_name(&kernels[i].cfg),
               kernels[i].cfg.bt ? " B^T" : "", us[0], us[1], us[2], us[2] / us[0], us[2] / us[3]);
    }
  return 0;
}
#endif
