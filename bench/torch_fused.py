# hostir's fused ops called from PyTorch (hostir.torch) beside torch's own
# (serial: NCCL + matmul; async-TP: torch.ops.symm_mem's fused ops) on the
# shapes of bench/overlap.c, timed alike (bench/torch_async_tp.py's timed:
# ranks meet, run, synchronize; an iteration takes its slowest rank; median
# of 10 after 3 warm-up), one process per GPU. After hostir's first call
# (which makes its plan, or tunes it with --tune) each contender is timed
# three times in turns, the median of those kept: a tuning's load right
# before slows the next GEMM-bound runs (bench/NOTES.md section 39). Beside
# hostir's op, its plan's own hir_run called from Python: the C program
# without the op's layer.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#   torchrun --nproc-per-node 2 bench/torch_fused.py [--decode] [--tune] [--overhead: the last part only]
# Then the Python layer's own cost per call: host time of a call of
# hostir.torch.all_gather_matmul minus that of the hir_run it makes, at a
# small shape (medians of single calls, each on an idle GPU), through the
# C++ path and the Python path alone, beside torch's ops' host time.
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_async_tp import DECODE, SHAPES, setup, timed  # noqa: E402

import hostir.torch as ht  # noqa: E402


ROUNDS = 3


def plan_run(kept):
    """The newest plan's own run, called from Python: hir_run (hir_tuner_run
    when tuned), the C program the op runs, without the op's layer. It writes
    into `kept` (the op's outputs, kept alive): call the returned function
    only after the returned `aim` (the op's calls leave their own outputs in
    the plan, freed once dropped)."""
    from hostir import _lib
    g = next(iter(ht._groups.values()))
    plan = list(g.plans.values())[-1]
    runner, run = (plan.tuner.value, _lib.hir_tuner_run) if plan.tuner.value else (plan.ev.value, _lib.hir_run)

    def aim():
        for k, t in enumerate(kept):
            plan.outs[k].data = t.data_ptr()
    return aim, lambda: run(runner, plan.ins, plan.nin, plan.outs, plan.nout)


def host_cost(a, b, group, calls=200):
    """Microseconds of host time per call at a small AG+GEMM: hostir's op
    (through hostir._torch_fast where the package has it, and through the
    Python path alone), its hir_run, and torch's serial and fused ops."""
    kept = ht.all_gather_matmul(a, [b], 0)
    aim, direct = plan_run([kept[0]] + kept[1])
    gathered = torch.empty(a.shape[0] * dist.get_world_size(group), a.shape[1], device=a.device, dtype=a.dtype)
    fast = ht._torch_fast
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()  # B column-major, as _scaled_mm's
    s8 = torch.tensor(0.5, device=a.device)
    ways = {"op": lambda: ht.all_gather_matmul(a, [b], 0),
            "op fp8": lambda: ht.all_gather_scaled_matmul(a8, [b8], s8, [s8], 0, return_A=False),
            "op without A": lambda: ht.all_gather_matmul(a, [b], 0, return_A=False),
            "hir_run": direct,
            "torch serial": lambda: (dist.all_gather_into_tensor(gathered, a, group=group), torch.mm(gathered, b)),
            "torch fused": lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], gather_dim=0,
                                                                              group_name=group.group_name)}
    results = {}
    for second in (False, True) if fast else (False,):  # the second time: hostir's op through the Python path alone
        ht._torch_fast = None if second else fast
        for what, fn in ways.items():
            if second and not what.startswith("op"):
                continue
            if what == "hir_run":
                aim()
            times = []
            dist.barrier(group=group)
            try:
                fn()
            except Exception as e:  # torch's fused op where symmetric memory is not there: say so, keep the rest
                print(f"rank {dist.get_rank()}: {what} failed: {type(e).__name__}: {e}"[:300], flush=True)
                continue
            inside = ht._torch_fast and what.startswith("op") and hasattr(ht._torch_fast, "last_run_us")
            layer = []  # a call's host time less its own hir_run's, timed inside it (hir_run's host time varies
            for _ in range(calls):  # with what the peer does meanwhile); each call alone, its GPU work waited for after
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
                if inside:
                    layer.append(times[-1] - ht._torch_fast.last_run_us())
            results[what + (" (Python path)" if second else "")] = statistics.median(times)
            if inside:
                results[what + " layer"] = statistics.median(layer)
    ht._torch_fast = fast
    return results


def main():
    rank, D, group = setup()
    name = group.group_name
    ht.set_options(tune="--tune" in sys.argv)
    symm = torch.ops.symm_mem
    rows = []
    for kind, M, K, N in [] if "--overhead" in sys.argv else DECODE if "--decode" in sys.argv else SHAPES:
        m = M // D
        torch.manual_seed(1234 + rank)
        if kind == "ag":
            a = torch.rand(m, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
            b = torch.rand(K, N, device="cuda", dtype=torch.bfloat16) * 2 - 1
            gathered = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)

            def serial():
                dist.all_gather_into_tensor(gathered, a)
                return torch.mm(gathered, b)

            fused = lambda: symm.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=name)[1][0]
            ours = lambda: ht.all_gather_matmul(a, [b], 0)
            outs_of = lambda got: [got[0]] + got[1]
        else:
            a = torch.rand(M, K // D, device="cuda", dtype=torch.bfloat16) * 2 - 1
            b = torch.rand(K // D, N, device="cuda", dtype=torch.bfloat16) * 2 - 1

            def serial():
                out = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
                dist.reduce_scatter_tensor(out, torch.mm(a, b))
                return out

            fused = lambda: symm.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0, group_name=name)
            ours = lambda: ht.matmul_reduce_scatter(a, b, "sum", 0)
            outs_of = lambda got: [got]
        ref = serial().float()
        t0 = time.perf_counter()
        kept = ours()
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3  # the plan made (tuned with --tune) and run
        got = outs_of(kept)[-1].float()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        aim, direct = plan_run(outs_of(kept))
        times = {"serial": [], "fused": [], "ours": [], "plan": []}
        for _ in range(ROUNDS):  # in turns, so that what ran before (a tuning's load) falls on each alike
            times["serial"].append(timed(serial, group))
            if times["fused"] is not None:
                try:
                    times["fused"].append(timed(fused, group))
                except Exception as e:  # report it, do not hide the row
                    times["fused"] = None
                    print(f"rank {rank}: torch's fused op failed: {type(e).__name__}: {e}"[:300], flush=True)
            times["ours"].append(timed(ours, group))
            aim()
            times["plan"].append(timed(direct, group))
        t = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        rows.append((kind, M, K, N, t["serial"], t["fused"], t["ours"], t["plan"], err, first))
        del a, b, kept, got
        torch.cuda.empty_cache()
    small = torch.rand(256 // D, 1024, device="cuda", dtype=torch.bfloat16), torch.rand(1024, 256, device="cuda",
                                                                                       dtype=torch.bfloat16)
    cost = host_cost(*small, group)
    if rank == 0:
        print(f"hostir.torch beside PyTorch {torch.__version__}, {D} GPUs, one process each, bf16, "
              f"median of 10 (ms); hostir's plans {'tuned' if '--tune' in sys.argv else 'from its cost model'}")
        print(f"  {'shape (M, K, N)':26} {'torch serial':>12} {'async-TP':>9} {'hostir':>8} {'x serial':>9} "
              f"{'x async-TP':>10} {'its run':>8} {'x its run':>9} {'max err':>8} {'first call':>10}")
        for kind, M, K, N, ts, tf, to, tp, err, first in rows:
            label = f"{'AG+GEMM' if kind == 'ag' else 'GEMM+RS'} {M},{K},{N}"
            print(f"  {label:26} {ts:12.3f} {tf:9.3f} {to:8.3f} {to / ts:9.2f} {to / tf:10.2f} {tp:8.3f} {to / tp:9.3f} "
                  f"{err:8.1e} {first:10.1f}")
        print(f"  ({ROUNDS} rounds in turns, the median of each's medians; its run: the same plan's hir_run called from "
              f"Python alone, the C program without the op's layer)")
        nan = float("nan")
        path = "through hostir._torch_fast (C++)" if ht._torch_fast else "through the Python path (no hostir._torch_fast)"
        print(f"  host time per call at AG+GEMM 256,1024,256, us (medians of 200): hostir.torch.all_gather_matmul "
              f"{cost['op']:.1f} {path}, its hir_run {cost['hir_run']:.1f}: the Python layer "
              f"{cost['op'] - cost['hir_run']:.1f} ({cost['op without A'] - cost['hir_run']:.1f} with return_A=False)")
        if "op layer" in cost:
            print(f"  the Python layer timed inside the same calls (each call less its own hir_run): {cost['op layer']:.1f} "
                  f"({cost['op without A layer']:.1f} with return_A=False; fp8 {cost['op fp8 layer']:.1f})")
        if "op (Python path)" in cost:
            print(f"  the Python path alone: the Python layer {cost['op (Python path)'] - cost['hir_run']:.1f} "
                  f"({cost['op without A (Python path)'] - cost['hir_run']:.1f} with return_A=False)")
        print(f"  hostir.torch.all_gather_scaled_matmul, e4m3, the same shape, return_A=False: {cost.get('op fp8', nan):.1f}"
              + (f" (the Python path alone: {cost['op fp8 (Python path)']:.1f})" if "op fp8 (Python path)" in cost else ""))
        print(f"  torch's, the same shape: serial (all_gather_into_tensor + mm) {cost.get('torch serial', nan):.1f}, "
              f"fused_all_gather_matmul {cost.get('torch fused', nan):.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
