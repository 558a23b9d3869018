# PyTorch's async tensor parallelism on the shapes of bench/overlap.c (GEMM+AR:
# matmul, then NCCL or its symmetric-memory two-shot all-reduce), timed
# the same way (ranks meet and start together, run, synchronize; an iteration
# takes its slowest rank; median of 10 after 3 warm-up), for the comparison.
# Run beside build/bench-overlap on the same machine:
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#   torchrun --nproc-per-node 4 bench/torch_async_tp.py [--decode] [ag M K N] [rs M K N] [ar M K N] ...
# Shapes given as bench-overlap takes them replace the default set.
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

SHAPES = [("ag", 32768, 32768, 1024), ("ag", 16384, 8192, 7168), ("ag", 4096, 4096, 1024),
          ("rs", 32768, 32768, 1024), ("rs", 16384, 28672, 8192), ("rs", 4096, 4096, 1024),
          ("ar", 16384, 28672, 8192), ("ar", 4096, 4096, 1024)]
DECODE = [(k, M, 8192, 4096) for k in ("ag", "rs", "ar") for M in (256, 1024, 4096)]  # --decode: bench-overlap --decode's
ITERS, WARMUP = 10, 3


def start_together(group):
    """The ranks meet, then start at one moment: 0.3 ms after the last arrival on the host's monotonic clock (at
    most 2 ms on), as bench-overlap's processes do; a rank that started early would wait inside the collective."""
    mine = torch.tensor([time.monotonic()], dtype=torch.float64, device="cuda")
    every = torch.empty(dist.get_world_size(group), dtype=torch.float64, device="cuda")
    dist.all_gather_into_tensor(every, mine, group=group)
    start = min(every.max().item() + 0.0003, time.monotonic() + 0.002)
    while time.monotonic() < start:
        pass


def timed(fn, group):
    times = []
    for it in range(WARMUP + ITERS):
        torch.cuda.synchronize()
        start_together(group)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if it >= WARMUP:
            times.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(times, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def setup():
    """One process per GPU on NCCL, torch's fused ops registered: (rank, world size, the world group)."""
    dist.init_process_group("nccl")
    rank, D = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    try:  # torch's fused ops are registered when its symmetric memory is imported
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group.group_name)
    except Exception:
        pass  # newer PyTorch enables it on first use
    return rank, D, group


def shapes_of(argv):
    """The shapes named on the command line ("ag M K N", "rs M K N"), else --decode's or the default set."""
    given = [(argv[i], int(argv[i + 1]), int(argv[i + 2]), int(argv[i + 3]))
             for i in range(len(argv) - 3) if argv[i] in ("ag", "rs", "ar")]
    return given or (DECODE if "--decode" in argv else SHAPES)


def main():
    rank, D, group = setup()
    symm = torch.ops.symm_mem
    torch.manual_seed(1234 + rank)
    for kind, M, K, N in shapes_of(sys.argv[1:]):
        m = M // D
        if kind == "ag":
            a = torch.rand(m, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
            torch.manual_seed(7)
            b = torch.rand(K, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
            gathered = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
            comm = lambda: dist.all_gather_into_tensor(gathered, a)
            gemm = lambda: torch.mm(gathered, b)

            def serial():
                dist.all_gather_into_tensor(gathered, a)
                return torch.mm(gathered, b)

            fused = lambda: symm.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=group.group_name)[1][0]
        elif kind == "rs":
            a = torch.rand(M, K // D, device="cuda", dtype=torch.bfloat16) * 2 - 1
            b = torch.rand(K // D, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
            partial = torch.mm(a, b)
            scattered = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
            comm = lambda: dist.reduce_scatter_tensor(scattered, partial)
            gemm = lambda: torch.mm(a, b)

            def serial():
                out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
                dist.reduce_scatter_tensor(out, torch.mm(a, b))
                return out

            fused = lambda: symm.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0, group_name=group.group_name)
        else:  # "ar", the row-parallel linear: every rank gets the sum; torch has no fused op, so its
            # symmetric-memory two-shot all-reduce after the matmul (written into the symmetric buffer) stands in
            import torch.distributed._symmetric_memory as symm_mem
            a = torch.rand(M, K // D, device="cuda", dtype=torch.bfloat16) * 2 - 1
            b = torch.rand(K // D, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
            partial = torch.mm(a, b)
            sym = symm_mem.empty(M, N, device="cuda", dtype=torch.bfloat16)
            symm_mem.rendezvous(sym, group=group.group_name)
            comm = lambda: dist.all_reduce(partial, group=group)
            gemm = lambda: torch.mm(a, b)

            def serial():
                out = torch.mm(a, b)
                dist.all_reduce(out, group=group)
                return out

            def fused():
                torch.mm(a, b, out=sym)
                symm.two_shot_all_reduce_(sym, "sum", group.group_name)
                return sym
        t_comm, t_gemm, t_serial = timed(comm, group), timed(gemm, group), timed(serial, group)
        ref = serial().float()
        try:
            t_fused = timed(fused, group)
            got = fused().float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            fused_note = ""
        except Exception as e:  # report it, do not hide the row
            t_fused, err, fused_note = float("nan"), float("nan"), f"  FAILED: {type(e).__name__}: {e}"[:300]
        floor = max(t_comm, t_gemm)
        if rank == 0:
            name = {"ag": "AllGather+GEMM", "rs": "GEMM+ReduceScatter", "ar": "GEMM+AllReduce"}[kind]
            print(f"PyTorch {torch.__version__} {name} M={M} K={K} N={N} bf16, {D} GPUs, median of {ITERS} (ms)")
            print(f"  {'pipeline':34} {'ms':>9} {'x floor':>8} {'E':>7} {'max err':>9}")
            print(f"  {kind.upper() + ' alone':34} {t_comm:9.3f} {t_comm / floor:8.2f}")
            print(f"  {'GEMM alone':34} {t_gemm:9.3f} {t_gemm / floor:8.2f}")
            print(f"  {'serial':34} {t_serial:9.3f} {t_serial / floor:8.2f} {0:7.2f}")
            e = (t_serial - t_fused) / min(t_comm, t_gemm)
            fused_name = "matmul, symm_mem two-shot" if kind == "ar" else "async-TP (symm_mem fused)"
            print(f"  {fused_name:34} {t_fused:9.3f} {t_fused / floor:8.2f} {e:7.2f} {err:9.1e}{fused_note}")
            print(f"  {'floor = max(comm, GEMM)':34} {floor:9.3f} {1:8.2f}\n", flush=True)
        del a, b
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
