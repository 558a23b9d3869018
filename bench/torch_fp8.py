# The fp8 AG+GEMM and GEMM+RS: hostir's hir_scaled_linear pipeline,
# built from Python and run by hostir.torch.run (serial, pipelined), and
# hostir.torch.all_gather_scaled_matmul (the swap-in op, its automatic
# plan), beside PyTorch's serial
# (all_gather of the e4m3 rows and their scales, then torch._scaled_mm) and
# its async-TP fp8 op (torch.ops.symm_mem.fused_all_gather_scaled_matmul),
# on the AG shapes of bench/overlap.c, timed alike (bench/torch_async_tp.py's
# timed: ranks meet, run, synchronize; the slowest rank; median of 10 after 3
# warm-up). e4m3 rows and weight [N, K], per-row scales of both, bf16 output.
# Then the RS shapes: hostir.torch.scaled_matmul_reduce_scatter (serial,
# pipeline, automatic) beside torch's serial (torch._scaled_mm, then
# reduce_scatter_tensor of the bf16 partials) and
# torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter; each rank's part of
# K with its own per-row and per-column scales.
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#   torchrun --nproc-per-node 2 bench/torch_fp8.py [--scalar: one scale each]
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_async_tp import SHAPES, setup, timed  # noqa: E402

import hostir  # noqa: E402
import hostir.torch as ht  # noqa: E402


def ag_fusion(D, rowwise, pipeline):
    """y [D, m, N] = scaled_linear(gathered a [D(DIDx), m, K], w [N, K]), its scales gathered alike."""
    f = hostir.Fusion()
    a, w = f.input("float8_e4m3fn", 3), f.input("float8_e4m3fn", 2)
    sa = f.input("float32", 2) if rowwise else f.input_sized("float32", [1])
    sw = f.input("float32", 1) if rowwise else f.input_sized("float32", [1])
    y = f.output(f.scaled_linear(a, w, sa, sw, out="bfloat16"))
    for t in (a, w, sa, sw, y):
        t.mesh(range(D))
    a.parallelize(0, "DIDx")
    if rowwise:
        sa.parallelize(0, "DIDx")
    if pipeline:
        y.parallelize(0, "Stream")
    return f


def measure(rank, group, serial, variants):
    """[serial's time, (time, max error against serial) of each (fn, hostir's plan option) in variants]."""
    ref = serial().float()
    results = [timed(serial, group)]
    for fn, plan in variants:
        try:
            if plan:  # hostir's plan is made at the first call, by this option
                ht.set_options(plan=plan)
            got = fn().float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            results.append((timed(fn, group), err))
        except Exception as e:  # report it, do not hide the row
            results.append((float("nan"), float("nan")))
            print(f"rank {rank}: {type(e).__name__}: {e}"[:300], flush=True)
    ht.set_options(plan="auto")
    return results


def rs_row(rank, D, group, rowwise, M, K, N):
    """The GEMM+RS row: [torch serial, (async-TP, err), (hostir serial, err), (pipeline, err), (automatic, err)]."""
    k = K // D
    torch.manual_seed(1234 + rank)  # each rank its part of K, quantized apart: its own scales
    a = (torch.rand(M, k, device="cuda") * 8 - 4).to(torch.float8_e4m3fn)
    b = (torch.rand(N, k, device="cuda") * 8 - 4).to(torch.float8_e4m3fn).t()  # [k, N], column-major
    sa = torch.rand(M, 1, device="cuda") + 0.5 if rowwise else torch.tensor(1.25, device="cuda")
    sb = torch.rand(1, N, device="cuda") + 0.5 if rowwise else torch.tensor(0.75, device="cuda")
    name = group.group_name

    def serial():
        part = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        out = torch.empty(M // D, N, device="cuda", dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, part, group=group)
        return out

    def fused():
        return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(a, b, sa, sb, "sum", 0, 0, name, [M, N],
                                                                     out_dtype=torch.bfloat16)

    def op():
        return ht.scaled_matmul_reduce_scatter(a, b, sa, sb, "sum", 0)

    results = measure(rank, group, serial, ((fused, None), (op, "serial"), (op, "pipeline"), (op, "auto")))
    del a, b
    torch.cuda.empty_cache()
    return results


def main():
    rank, D, group = setup()
    name = group.group_name
    rowwise = "--scalar" not in sys.argv
    rows = []
    for kind, M, K, N in SHAPES:
        if kind != "ag":
            rows.append(("rs", M, K, N, rs_row(rank, D, group, rowwise, M, K, N)))
            continue
        m = M // D
        torch.manual_seed(1234 + rank)
        a = (torch.rand(m, K, device="cuda") * 8 - 4).to(torch.float8_e4m3fn)
        torch.manual_seed(7)  # the weight and its scales: one on every rank
        w = (torch.rand(N, K, device="cuda") * 8 - 4).to(torch.float8_e4m3fn)
        sw = torch.rand(N, device="cuda") + 0.5 if rowwise else torch.tensor([0.75], device="cuda")
        torch.manual_seed(99 + rank)
        sa = torch.rand(m, device="cuda") + 0.5 if rowwise else torch.tensor([1.25], device="cuda")
        ga, gsa = torch.empty(M, K, device="cuda", dtype=torch.uint8), torch.empty(M if rowwise else D, device="cuda")

        def serial():
            dist.all_gather_into_tensor(ga, a.view(torch.uint8))
            dist.all_gather_into_tensor(gsa, sa)
            scale_a = gsa[:, None] if rowwise else sa
            scale_b = sw[None, :] if rowwise else sw
            return torch._scaled_mm(ga.view(torch.float8_e4m3fn), w.t(), scale_a=scale_a, scale_b=scale_b,
                                    out_dtype=torch.bfloat16)

        def fused():
            return torch.ops.symm_mem.fused_all_gather_scaled_matmul(
                a, [w.t()], sa[:, None] if rowwise else sa, [sw[None, :] if rowwise else sw], 0, name, [None], [None],
                [torch.bfloat16], [False])[1][0]

        fusions = {plan: ag_fusion(D, rowwise, plan == "pipeline") for plan in ("serial", "pipeline")}
        ins = [a[None], w, sa[None] if rowwise else sa, sw]

        def ours(plan):
            return lambda: ht.run(fusions[plan], ins)[0].reshape(M, N)

        def op():
            return ht.all_gather_scaled_matmul(a, [w.t()], sa[:, None] if rowwise else sa, [sw[None, :] if rowwise else sw],
                                               0, return_A=False)[1][0]

        results = measure(rank, group, serial, ((fused, None), (ours("serial"), "serial"), (ours("pipeline"), "pipeline"),
                                                (op, "auto")))
        rows.append(("ag", M, K, N, results))
        del a, w, ga
        torch.cuda.empty_cache()
    if rank == 0:
        print(f"fp8 AG+GEMM and GEMM+RS (e4m3, {'per-row' if rowwise else 'per-tensor'} scales, bf16 out), {D} GPUs, one process "
              f"each, PyTorch {torch.__version__}; median of 10 (ms), max error vs serial (relative to its largest)")
        print(f"  {'shape (M, K, N)':22} {'torch serial':>12} {'async-TP fp8':>13} {'hostir serial':>14} "
              f"{'hostir pipeline':>16} {'hostir op':>10} {'best x serial':>14} {'best x async-TP':>16}")
        for kind, M, K, N, (ts, (tf, ef), (hs, es), (hp, ep), (ho, eo)) in rows:
            best = min(hs, hp, ho)
            print(f"  {('AG ' if kind == 'ag' else 'RS ') + f'{M},{K},{N}':22} {ts:12.3f} {tf:13.3f} {hs:14.3f} {hp:16.3f} {ho:10.3f} {best / ts:14.2f} "
                  f"{best / tf:16.2f}   errors: async-TP {ef:.1e}, hostir {es:.1e} / {ep:.1e} / {eo:.1e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
