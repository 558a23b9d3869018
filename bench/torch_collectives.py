# PyTorch's collectives beside build/bench-collectives, timed its way: bf16
# sums, microseconds per call, eager (20 calls between two CUDA events) and
# in a CUDA graph of 20 calls, the slowest rank's, median of 20. NCCL
# (dist.all_reduce, reduce_scatter_tensor, all_gather_into_tensor) and
# symmetric memory without multicast: one-shot and two-shot all-reduce, and
# its reduce-scatter and all-gather where this PyTorch has them. Their
# inputs live in symmetric memory already (no staging copy). Writes lines
# "kind bytes mode name us" for bench-collectives --torch FILE:
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#   torchrun --nproc-per-node 2 bench/torch_collectives.py OUT [--sizes 8K,1M,...]
import os
import statistics
import sys

import torch
import torch.distributed as dist

SIZES = "8K,32K,128K,512K,1M,2M,4M,8M,16M,64M,256M"
CALLS, ITERS = 20, 20


def parse_sizes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s) for s in text.split(",")]


def slowest_median(times, group):
    t = torch.tensor(times, device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def timed(fn, graph, group):
    """Microseconds a call: CALLS calls eager, or one graph of CALLS calls, timed by events ITERS times."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for _ in range(CALLS):
                    fn()
        torch.cuda.current_stream().wait_stream(s)
        run = g.replay
        run()
        torch.cuda.synchronize()
    times = []
    for _ in range(ITERS):
        dist.barrier(group)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        if graph:
            run()
        else:
            for _ in range(CALLS):
                fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / CALLS)
    return slowest_median(times, group)


def main():
    out_path = sys.argv[1]
    sizes = parse_sizes(sys.argv[sys.argv.index("--sizes") + 1] if "--sizes" in sys.argv else SIZES)
    dist.init_process_group("nccl")
    rank, D = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    import torch.distributed._symmetric_memory as symm_mem
    ops = torch.ops.symm_mem
    name = group.group_name
    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        n -= n % D
        x = torch.rand(n, device="cuda", dtype=torch.bfloat16) * 2 - 1
        y = torch.empty_like(x)
        part = torch.empty(n // D, device="cuda", dtype=torch.bfloat16)
        sym = symm_mem.empty(n, device="cuda", dtype=torch.bfloat16)
        sym.copy_(x)
        symm_mem.rendezvous(sym, group=name)
        cands = [("ar", "nccl", lambda: dist.all_reduce(y, group=group)),
                 ("ar", "symm one-shot", lambda: ops.one_shot_all_reduce_out(sym, "sum", name, y)),
                 ("ar", "symm two-shot", lambda: ops.two_shot_all_reduce_out(sym, "sum", name, y)),
                 ("rs", "nccl", lambda: dist.reduce_scatter_tensor(part, x, group=group)),
                 ("ag", "nccl", lambda: dist.all_gather_into_tensor(y, part, group=group))]
        if hasattr(ops, "reduce_scatter_out"):
            cands.append(("rs", "symm", lambda: ops.reduce_scatter_out(sym, name, False, part)))
        for kind, who, fn in cands:
            for mode in ("eager", "graph"):
                try:
                    us = timed(fn, mode == "graph", group)
                except Exception as e:  # an op this PyTorch lacks, or one that refuses the size
                    if rank == 0:
                        print(f"torch {kind} {who} {mode} {nbytes}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                    continue
                rows.append(f"{kind} {nbytes} {mode} {who.replace(' ', '_')} {us:.2f}")
        del sym
    if rank == 0:
        with open(out_path, "w") as f:
            f.write("\n".join(rows) + "\n")
        print(f"torch_collectives: {len(rows)} rows to {out_path} ({D} ranks, torch {torch.__version__})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
