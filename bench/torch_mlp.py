"""A sequence-parallel MLP (Megatron-LM's: x and y split on the tokens T,
W1 [F, H] column-parallel, W2 [H, F] row-parallel) three ways, in one call
under torchrun (a process per GPU), bf16:

  logical   hostir, the fusion written on whole tensors and sharded by
            hir_split (examples/tp_mlp.c's)
  explicit  hostir, the same with the device axes written out ([D, t, H],
            broadcasts, a sum over the devices)
  torch     all_gather_into_tensor, F.linear, relu, F.linear,
            reduce_scatter_tensor

Each rank's y is checked against torch's. Medians of CUDA-event times over
the iterations, the slowest rank's; the ratios are over torch's.

  torchrun --nproc_per_node=2 bench/torch_mlp.py [--iters 20] [--order 0,1,2] [T H F ...]
  (PYTHONPATH holding the hostir package that pip install ./python built)
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hostir
import hostir.torch as ht


def logical_mlp(D, dtype="bfloat16"):
    f = hostir.Fusion()
    x, w1, w2 = f.input(dtype, 2), f.input(dtype, 2), f.input(dtype, 2)
    y = f.output(f.linear(f.unary("relu", f.linear(x, w1)), w2))
    for t in (x, w1, w2, y):
        t.mesh(range(D))
    x.split(0, D)
    w1.split(0, D)
    x.parallelize(0, "DIDx")
    w1.parallelize(0, "DIDx")
    w2.parallelize(1, "DIDx")
    y.parallelize(0, "DIDx")
    return f


def explicit_mlp(D, dtype="bfloat16"):
    """x [D, t, H] (DIDx 0), W1 [D, F/D, H] and W2 [D, H, F/D] (DIDx 0): the products [D, D, t, .] split on
    their axis 1, summed over it into y [D, t, H] split on axis 0."""
    f = hostir.Fusion()
    x, w1, w2 = f.input(dtype, 3), f.input(dtype, 3), f.input(dtype, 3)
    p1 = f.linear(f.broadcast(x, [False, True, False, False]), f.broadcast(w1, [True, False, False, False]))
    h = f.unary("relu", p1)
    p2 = f.linear(h, f.broadcast(w2, [True, False, False, False]))
    y = f.output(f.sum(p2, [1]))
    for t in (x, w1, w2, p1, y):
        t.mesh(range(D))
    for t in (x, w1, w2, y):
        t.parallelize(0, "DIDx")
    p1.parallelize(1, "DIDx")
    return f


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    times.sort()
    med = torch.tensor([times[len(times) // 2]], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return med.item()


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    r, D = dist.get_rank(), dist.get_world_size()
    args, iters = sys.argv[1:], 20
    order = None
    if "--iters" in args:
        i = args.index("--iters")
        iters = int(args[i + 1])
        del args[i:i + 2]
    if "--order" in args:
        i = args.index("--order")
        order = [int(k) for k in args[i + 1].split(",")]
        del args[i:i + 2]
    nums = [int(a) for a in args] or [4096, 4096, 16384, 256, 4096, 16384]
    shapes = [nums[i:i + 3] for i in range(0, len(nums), 3)]
    logical, explicit = logical_mlp(D), explicit_mlp(D)
    if r == 0:
        print("sequence-parallel MLP, bf16, %d GPUs (a process each), ms, median of %d (the slowest rank's)" % (D, iters))
        print("  %-22s %9s %9s %9s %9s %9s %9s" % ("T, H, F", "logical", "explicit", "torch", "log/exp", "log/torch",
                                                     "max err"))
    for T, H, Fd in shapes:
        t, f = T // D, Fd // D
        g = torch.Generator(device="cpu").manual_seed(5)
        X = torch.randn(T, H, generator=g) / H ** 0.5
        W1 = torch.randn(Fd, H, generator=g) / H ** 0.5
        W2 = torch.randn(H, Fd, generator=g) / Fd ** 0.5
        x = X[r * t:(r + 1) * t].to(torch.bfloat16).cuda()
        w1 = W1[r * f:(r + 1) * f].to(torch.bfloat16).cuda()
        w2 = W2[:, r * f:(r + 1) * f].contiguous().to(torch.bfloat16).cuda()
        gathered = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
        y_torch = torch.empty(t, H, dtype=torch.bfloat16, device="cuda")

        def torch_mlp():
            dist.all_gather_into_tensor(gathered, x)
            part = F.linear(torch.relu(F.linear(gathered, w1)), w2)
            dist.reduce_scatter_tensor(y_torch, part)

        xs, w1s, w2s = x[None], w1[None], w2[None]
        runs = [lambda: ht.run(logical, [x, w1, w2]), lambda: ht.run(explicit, [xs, w1s, w2s]), torch_mlp]
        ms = [0.0] * 3
        for k in (order if order else range(3)):  # --order 2,1,0: the rows timed in another order (a rested GPU first)
            ms[k] = timed(runs[k], iters)
        torch_mlp()
        err = max((ht.run(logical, [x, w1, w2])[0].float() - y_torch.float()).abs().max().item(),
                  (ht.run(explicit, [xs, w1s, w2s])[0].reshape(t, H).float() - y_torch.float()).abs().max().item())
        scale = y_torch.float().abs().max().item()
        errs = torch.tensor([err / scale], device="cuda")
        dist.all_reduce(errs, op=dist.ReduceOp.MAX)
        if r == 0:
            print("  %-22s %9.3f %9.3f %9.3f %9.2f %9.2f %9.1e%s" % ("%d, %d, %d" % (T, H, Fd), ms[0], ms[1], ms[2],
                                                                  ms[0] / ms[1], ms[0] / ms[2], errs.item(),
                                                                  "" if errs.item() < 3e-2 else "  WRONG"))
    if r == 0:
        print("  plans of rank 0 (logical, then explicit, per shape):", *ht.plan("run"), sep="\n    ")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
