"""hostir.torch against torch's own serial result, forward and backward, eager,
compiled (torch.compile, fullgraph) and captured in a CUDA graph:

    torchrun --nproc-per-node 2 python/tests/test_torch.py     # GPUs, NCCL (make test-gpu)
    python python/tests/test_torch.py                          # CPU tensors, one rank
    python python/tests/test_torch.py --threads 3              # CPU tensors, 3 ranks as threads
                                                               # (torch's threaded process group)

Every rank draws the same global tensors (one seed) and takes its part, so
each checks its own results against the whole problem computed by torch;
outputs are poisoned (NaN) before each hostir run where they are given. The
last line is "N passed, N failed" (rank 0's, after every rank's are summed).
"""
import os
import sys
import threading
import traceback
import unittest

try:
    import torch
    import torch.distributed as dist
except ImportError:  # said, not failed: `python -m unittest discover python/tests` runs the CPU tests without torch
    if __name__ == "__main__":
        print("skipped: this Python has no torch (pip install torch)")
        sys.exit(0)
    raise unittest.SkipTest("this Python has no torch (pip install torch)")

if os.environ.get("HOSTIR_NATIVE"):  # the package's source beside a library built by make
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hostir  # noqa: E402
import hostir.torch as ht  # noqa: E402

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float64: 1e-10}


def close(got, ref, dtype, what):
    ref = ref.double().to(got.device)
    err = ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if not err <= TOL[dtype]:  # NaN fails too
        raise AssertionError("%s: max |hostir - torch| / max |torch| = %.2e (tolerance %.0e)" % (what, err, TOL[dtype]))


def case(fn):
    def run():
        try:
            fn()
            W.results.append((fn.__name__, None))
        except Exception:
            W.results.append((fn.__name__, traceback.format_exc(limit=4)))
    run.__name__, run.body = fn.__name__, fn
    return run


W = threading.local()  # this rank's: rank, size, dev, results (a rank a process, or a rank a thread)




def draw(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def ag_problem(dtype, lead, gather_dim):
    """Global A (gathered along gather_dim), every rank's B's (column
    parallel: rank r has its own), each rank's loss weights G."""
    shape = list(lead)
    A = draw(*shape, dtype=dtype, seed=1)
    Bs = [[draw(shape[-1], n, dtype=dtype, seed=10 + 7 * r + n) for n in (5, 3)] for r in range(W.size)]
    Gs = [[draw(*(shape[:-1] + [n]), dtype=dtype, seed=100 + 7 * r + n) for n in (5, 3)] for r in range(W.size)]
    part = A.shape[gather_dim] // W.size
    a_shard = A.narrow(gather_dim, W.rank * part, part)
    return A, Bs, Gs, a_shard


@case
def ag_forward_backward():
    for dtype in (torch.float32, torch.bfloat16):
        for lead, gather_dim in (([4 * W.size, 16], 0), ([3, 2 * W.size, 16], 1), ([2 * W.size, 3, 16], 0)):
            A, Bs, Gs, a_shard = ag_problem(dtype, lead, gather_dim)
            a = a_shard.to(W.dev).requires_grad_()
            bs = [b.to(W.dev).requires_grad_() for b in Bs[W.rank]]
            gathered, cs = ht.all_gather_matmul(a, bs, gather_dim)
            what = "AG %s %s gather_dim %d" % (dtype, lead, gather_dim)
            close(gathered, A, dtype, what + " gathered A")
            for c, b in zip(cs, Bs[W.rank]):
                close(c, A.double() @ b.double(), dtype, what + " C")
            sum((c.float() * g.to(W.dev).float()).sum() for c, g in zip(cs, Gs[W.rank])).backward()
            # d a_shard: the rows of sum over ranks r, i of G_ri B_ri^T; d B_i: A^T G_i
            da = sum(g.double() @ b.double().T for r in range(W.size) for g, b in zip(Gs[r], Bs[r]))
            part = A.shape[gather_dim] // W.size
            close(a.grad, da.narrow(gather_dim, W.rank * part, part), dtype, what + " d a_shard")
            for b, g in zip(bs, Gs[W.rank]):
                close(b.grad, A.double().reshape(-1, A.shape[-1]).T @ g.double().reshape(-1, g.shape[-1]), dtype,
                      what + " d B")
            with torch.no_grad():  # without the gathered A (hostir keeps it), twice: its buffer reused
                for _ in range(2):
                    none, cs = ht.all_gather_matmul(a, bs, gather_dim, return_A=False)
                    if none is not None:
                        raise AssertionError(what + ": return_A=False gave the gathered A")
                    for c, b in zip(cs, Bs[W.rank]):
                        close(c, A.double() @ b.double(), dtype, what + " C without A")


def rs_problem(dtype, lead, scatter_dim):
    shape = list(lead)
    K, N = shape[-1], 6
    A, B = draw(*shape, dtype=dtype, seed=2), draw(K, N, dtype=dtype, seed=3)
    G = draw(*(shape[:-1] + [N]), dtype=dtype, seed=4)
    k = K // W.size
    return A, B, G, A[..., W.rank * k:(W.rank + 1) * k], B[W.rank * k:(W.rank + 1) * k]


@case
def rs_forward_backward():
    for dtype in (torch.float32, torch.bfloat16):
        for lead, scatter_dim, op in (([4 * W.size, 8 * W.size], 0, "sum"), ([3, 2 * W.size, 8 * W.size], 1, "avg"), ([2 * W.size, 3, 8 * W.size], 0, "sum")):
            A, B, G, a_part, b_part = rs_problem(dtype, lead, scatter_dim)
            a, b = a_part.to(W.dev).requires_grad_(), b_part.to(W.dev).requires_grad_()
            c = ht.matmul_reduce_scatter(a, b, op, scatter_dim)
            full = A.double() @ B.double() / (W.size if op == "avg" else 1)
            part = full.shape[scatter_dim] // W.size
            what = "RS %s %s scatter_dim %d %s" % (dtype, lead, scatter_dim, op)
            close(c, full.narrow(scatter_dim, W.rank * part, part), dtype, what)
            (c.float() * G.narrow(scatter_dim, W.rank * part, part).to(W.dev).float()).sum().backward()
            scale = 1.0 / W.size if op == "avg" else 1.0
            k = B.shape[0] // W.size
            close(a.grad, scale * G.double() @ B.double()[W.rank * k:(W.rank + 1) * k].T, dtype, what + " d a")
            close(b.grad, scale * a_part.double().reshape(-1, a.shape[-1]).T @ G.double().reshape(-1, G.shape[-1]),
                  dtype, what + " d b")


@case
def ar_forward_backward():
    """hostir.torch.matmul_all_reduce: each rank's part of K, the sum (or average) whole on every rank."""
    for dtype in (torch.float32, torch.bfloat16):
        for lead, op in (([4, 8 * W.size], "sum"), ([2, 3, 8 * W.size], "avg")):
            A, B, G, a_part, b_part = rs_problem(dtype, lead, 0)
            a, b = a_part.to(W.dev).requires_grad_(), b_part.to(W.dev).requires_grad_()
            c = ht.matmul_all_reduce(a, b, op)
            scale = 1.0 / W.size if op == "avg" else 1.0
            what = "AR %s %s %s" % (dtype, lead, op)
            close(c, scale * (A.double() @ B.double()), dtype, what)
            (c.float() * G.to(W.dev).float()).sum().backward()
            k = B.shape[0] // W.size
            close(a.grad, scale * G.double() @ B.double()[W.rank * k:(W.rank + 1) * k].T, dtype, what + " d a")
            close(b.grad, scale * a_part.double().reshape(-1, a.shape[-1]).T @ G.double().reshape(-1, G.shape[-1]),
                  dtype, what + " d b")


@case
def ar_rms_norm():
    """hostir.torch.all_reduce_rms_norm: each rank's partial sums, the residual added, RMSNorm'd, whole on every rank."""
    for dtype in (torch.float32, torch.bfloat16):
        for lead, weighted in (([5], True), ([2, 3], False)):
            N = 64
            X = draw(W.size, *(lead + [N]), dtype=dtype, seed=20)
            R, G = draw(*(lead + [N]), dtype=dtype, seed=21), draw(N, dtype=dtype, seed=22)
            x, r = X[W.rank].to(W.dev), R.to(W.dev)
            h, out = ht.all_reduce_rms_norm(x, r, G.to(W.dev) if weighted else None, 1e-6)
            s = X.double().sum(0) + R.double()
            want = s / (s.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (G.double() if weighted else 1)
            what = "all_reduce_rms_norm %s %s weighted %s" % (dtype, lead, weighted)
            close(h, s, dtype, what + " h")
            close(out, want, dtype, what + " out")
            if not torch.equal(x, X[W.rank].to(W.dev)):
                raise AssertionError(what + ": x was written")
    if W.dev.type == "cuda":  # captured in a CUDA graph, replayed on new partial sums
        R, G = draw(4, 64, seed=31), draw(64, seed=32)
        sx, r, g = draw(W.size, 4, 64, seed=30)[W.rank].to(W.dev).clone(), R.to(W.dev), G.to(W.dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
            for _ in range(2):
                ht.all_reduce_rms_norm(sx, r, g)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h, out = ht.all_reduce_rms_norm(sx, r, g)
        for step in range(3):
            X = draw(W.size, 4, 64, seed=40 + step)
            sx.copy_(X[W.rank])
            h.fill_(float("nan"))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            s = X.double().sum(0) + R.double()
            close(h, s, torch.float32, "all_reduce_rms_norm replay %d h" % step)
            close(out, s / (s.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * G.double(), torch.float32,
                  "all_reduce_rms_norm replay %d out" % step)


@case
def pipelines():
    """The same with every plan the P2P ring pipeline (hostir's cost model
    picks serial at these sizes), its programs checked to exchange by P2P."""
    if dist.is_initialized():
        dist.barrier()  # options are the process's: threads change them together
    ht.set_options(plan="pipeline")
    try:
        ag_forward_backward.body()
        rs_forward_backward.body()
        texts = [str(e.prog) for g in list(ht._groups.values()) for k, e in g.plans.items() if "pipeline" in k and e.prog]
        if W.size > 1 and not any("P2PCommunication" in t for t in texts):
            raise AssertionError("plan='pipeline' made no P2P pipeline")
    finally:
        if dist.is_initialized():
            dist.barrier()
        ht.set_options(plan="auto")


@case
def compiled():
    if dist.is_initialized() and dist.get_backend() == "threaded":
        return  # torch.compile is not thread-safe: ranks as threads cannot compile at once (processes test it)
    A, Bs, Gs, a_shard = ag_problem(torch.float32, [4 * W.size, 16], 0)
    b = Bs[W.rank][0].to(W.dev)
    fn = torch.compile(lambda x, w: ht.all_gather_matmul(torch.relu(x), [w], 0)[1][0] * 2, fullgraph=True)
    close(fn(a_shard.to(W.dev), b), 2 * torch.relu(A.double()) @ Bs[W.rank][0].double(), torch.float32, "compiled AG")
    A, B, G, a_part, b_part = rs_problem(torch.float32, [4 * W.size, 8 * W.size], 0)
    fn = torch.compile(lambda x, w: ht.matmul_reduce_scatter(x, w, "sum", 0) + 1, fullgraph=True)
    m = A.shape[0] // W.size
    close(fn(a_part.to(W.dev), b_part.to(W.dev)), (A.double() @ B.double())[W.rank * m:(W.rank + 1) * m] + 1, torch.float32,
          "compiled RS")
    if W.dev.type == "cuda":  # torch.compile's CUDA graphs (cudagraph trees: warm-up runs, then a recording, then replays)
        A, Bs, Gs, a_shard = ag_problem(torch.float32, [4 * W.size, 16], 0)
        fn = torch.compile(lambda x, w: ht.all_gather_matmul(x, [w], 0)[1][0] + 1, mode="reduce-overhead", fullgraph=True)
        x = a_shard.to(W.dev)
        for step in range(4):
            got = fn(x, b).clone()
            close(got, A.double() @ Bs[W.rank][0].double() + 1, torch.float32, "compiled AG, reduce-overhead, call %d" % step)


@case
def cuda_graph():
    if W.dev.type != "cuda":
        return
    for kind in ("ag", "rs"):
        if kind == "ag":
            A, Bs, Gs, x = ag_problem(torch.float32, [8 * W.size, 32], 0)
            w = Bs[W.rank][0]
            run = lambda a, b: ht.all_gather_matmul(a, [b], 0)[1][0]
            ref = lambda a_full: a_full.double() @ w.double()
        else:
            A, B, G, x, w = rs_problem(torch.float32, [8 * W.size, 8 * W.size], 0)
            run = lambda a, b: ht.matmul_reduce_scatter(a, b, "sum", 0)
            m = A.shape[0] // W.size
            ref = lambda a_full: (a_full.double() @ B.double())[W.rank * m:(W.rank + 1) * m]
        sa, sb = x.to(W.dev).clone(), w.to(W.dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
            for _ in range(2):
                run(sa, sb)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run(sa, sb)
        for step in range(3):  # new values in the captured input, replayed
            new = draw(*A.shape, seed=50 + step) if kind == "ag" else draw(*A.shape, seed=50 + step)
            if kind == "ag":
                part = A.shape[0] // W.size
                sa.copy_(new[W.rank * part:(W.rank + 1) * part])
            else:
                k = A.shape[-1] // W.size
                sa.copy_(new[:, W.rank * k:(W.rank + 1) * k])
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            close(out, ref(new), torch.float32, "%s replay %d" % (kind, step))
        eager = run(sa, sb)  # eager again after the capture: the copy engines back where they were
        close(eager, ref(new), torch.float32, "%s eager after the graph" % kind)


@case
def seen_before():
    """Calls seen before, which run in C++ where the package has
    hostir._torch_fast (the GPU suite builds it and says so:
    HOSTIR_TEST_TORCH_FAST=1): new random inputs at new addresses every
    call, every other one on a side stream, with and without the gathered
    A, "sum" and "avg"; each against the whole problem, and the calls the
    C++ path took counted (each shape's second call)."""
    if W.dev.type != "cuda":
        return
    fast = ht._torch_fast
    if os.environ.get("HOSTIR_TEST_TORCH_FAST") == "1" and fast is None:
        raise AssertionError("hostir._torch_fast is not built or did not load")
    before = fast.taken() if fast else 0
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    M, K, N = 4 * W.size, 8 * W.size, 7  # shapes no other case uses: each one's first call is the Python path's
    m, k = M // W.size, K // W.size
    for dtype in (torch.float32, torch.bfloat16):
        for step in range(4):
            A, B = draw(M, K, dtype=dtype, seed=200 + step), draw(K, N, dtype=dtype, seed=300 + step)
            with torch.cuda.stream(side if step % 2 else torch.cuda.current_stream()):
                gathered, (c,) = ht.all_gather_matmul(A[W.rank * m:(W.rank + 1) * m].to(W.dev), [B.to(W.dev)], 0,
                                                      return_A=step < 2)
                op = "sum" if step < 2 else "avg"
                part = ht.matmul_reduce_scatter(A[:, W.rank * k:(W.rank + 1) * k].to(W.dev),
                                                B[W.rank * k:(W.rank + 1) * k].to(W.dev), op, 0)
            torch.cuda.synchronize()
            what = "seen before, %s step %d" % (dtype, step)
            full = A.double() @ B.double()
            close(c, full, dtype, what + ": AG C")
            if (gathered is None) != (step >= 2):
                raise AssertionError(what + ": return_A=%s gave %s" % (step < 2, "no A" if gathered is None else "an A"))
            if gathered is not None:
                close(gathered, A, dtype, what + ": AG gathered A")
            close(part, full[W.rank * m:(W.rank + 1) * m] / (W.size if op == "avg" else 1), dtype, what + ": RS " + op)
    if fast and fast.taken() - before != 8:  # 2 dtypes x (AG, RS) x (return_A or "avg" changed: a new call) x 1 seen
        raise AssertionError("the C++ path took %d calls; 8 were seen before" % (fast.taken() - before))


@case
def general_fusion():
    """A fusion built from Python, run by hostir.torch.run on this rank's
    tensors (B as a numpy array through DLPack on the CPU), a scalar input
    by value: relu(s * allgather(A) x B)."""
    f = hostir.Fusion()
    a, b, s = f.input("float32", 3), f.input("float32", 2), f.input_scalar()
    c = f.output(f.unary("relu", f.scale("*", f.matmul(a, b), s)))
    for t in (a, b, c):
        t.mesh(range(W.size))
    a.parallelize(0, "DIDx")
    A, B = draw(W.size, 4, 8, seed=5), draw(8, 5, seed=6)
    before = ht._torch_fast.taken() if ht._torch_fast else 0
    for scale in (3, -2):  # a new scalar value: a new plan
        ins = [A[W.rank:W.rank + 1].to(W.dev), B.to(W.dev) if W.dev.type == "cuda" else B.numpy(), scale]
        out, = ht.run(f, ins)  # copied out of hostir's buffer
        again, = ht.run(f, [ins[0] * 2] + ins[1:])  # written in place into an output made here
        close(out, torch.relu(scale * (A.double() @ B.double())), torch.float32, "run(fusion) scale %d" % scale)
        close(again, torch.relu(2 * scale * (A.double() @ B.double())), torch.float32, "run(fusion) again, scale %d" % scale)
        third, = ht.run(f, [ins[0] * 3] + ins[1:])  # seen before: in C++ where the package has it (CUDA tensors)
        close(third, torch.relu(3 * scale * (A.double() @ B.double())), torch.float32, "run(fusion) a third time, scale %d" % scale)
    if ht._torch_fast and W.dev.type == "cuda" and ht._torch_fast.taken() - before != 2:
        raise AssertionError("run(fusion): the C++ path took %d calls; 2 were seen before" % (ht._torch_fast.taken() - before))
    try:
        ht.run(f, [A[W.rank:W.rank + 1].to(W.dev), B.double().to(W.dev), 3])
    except hostir.Error as e:
        if "input 1" not in str(e):
            raise AssertionError("a float64 B refused, but the message does not name input 1: %s" % e)
    else:
        raise AssertionError("a float64 B was not refused")


@case
def fp8_fusion():
    """fp8 through hostir.torch.run: e4m3 rows (torch.float8_e4m3fn) and
    their per-row scales gathered into hir_scaled_linear, pipelined on
    streams, against the product of the fp8 values in float64."""
    D, m, K, N = W.size, 2, 32, 16  # K and N multiples of 16, as GPUs' fp8 GEMMs take them
    f = hostir.Fusion()
    a, w = f.input("float8_e4m3fn", 3), f.input("float8_e4m3fn", 2)
    sa, sw = f.input("float32", 2), f.input_sized("float32", [1])
    y = f.output(f.scaled_linear(a, w, sa, sw, out="float32"))
    for t in (a, w, sa, sw, y):
        t.mesh(range(D))
    a.parallelize(0, "DIDx")
    sa.parallelize(0, "DIDx")
    y.parallelize(0, "Stream")
    gen = torch.Generator().manual_seed(11)
    A = (torch.randint(-16, 17, (D, m, K), generator=gen) / 4).to(torch.float8_e4m3fn)  # quarters up to 4: exact
    Wt = (torch.randint(-16, 17, (N, K), generator=gen) / 4).to(torch.float8_e4m3fn)
    SA, SW = torch.randint(1, 9, (D, m), generator=gen) / 8, torch.tensor([0.75])
    out, = ht.run(f, [A[W.rank:W.rank + 1].to(W.dev), Wt.to(W.dev), SA[W.rank:W.rank + 1].to(W.dev), SW.to(W.dev)])
    want = (A.double() @ Wt.double().T) * SA.double()[:, :, None] * 0.75
    close(out, want, torch.float32, "run(fusion) fp8")


@case
def fp8_fused():
    """hostir.torch.all_gather_scaled_matmul, torch's fused_all_gather_scaled_matmul's
    swap-in: e4m3 rows gathered with their scales, two column-major fp8 B's
    (per-N and one scale), bf16 and float32 out; against float64."""
    D, m, K, N = W.size, 2, 32, 16
    gen = torch.Generator().manual_seed(21)
    A = (torch.randint(-16, 17, (D * m, K), generator=gen) / 4).to(torch.float8_e4m3fn)
    B1 = (torch.randint(-16, 17, (N, K), generator=gen) / 4).to(torch.float8_e4m3fn).t()  # [K, N], column-major
    B2 = (torch.randint(-16, 17, (2 * N, K), generator=gen) / 4).to(torch.float8_e5m2).t()
    SA, S1, S2 = torch.randint(1, 9, (D * m, 1), generator=gen) / 8, torch.randint(1, 9, (1, N), generator=gen) / 8, torch.tensor(0.5)
    rows = slice(W.rank * m, (W.rank + 1) * m)
    dev = lambda t: t.to(W.dev)  # noqa: E731
    ga, (c1, c2) = ht.all_gather_scaled_matmul(dev(A[rows]), [dev(B1), dev(B2)], dev(SA[rows]), [dev(S1), dev(S2)], 0,
                                               out_dtypes=[torch.bfloat16, torch.float32])
    Ad = A.double()
    close(ga.double(), Ad, torch.float32, "fp8 fused: the gathered A")
    close(c1, (Ad @ B1.double()) * SA.double() * S1.double(), torch.bfloat16, "fp8 fused: per-row scales, bf16")
    close(c2, (Ad @ B2.double()) * SA.double() * 0.5, torch.float32, "fp8 fused: one scale, float32")
    if not (dist.is_initialized() and dist.get_backend() == "threaded"):  # compiled (processes: see compiled())
        b1, sa, s1 = dev(B1), dev(SA[rows]), dev(S1)
        fn = torch.compile(lambda x: ht.all_gather_scaled_matmul(x, [b1], sa, [s1], 0, return_A=False)[1][0] * 2, fullgraph=True)
        close(fn(dev(A[rows])), 2 * (Ad @ B1.double()) * SA.double() * S1.double(), torch.bfloat16, "fp8 fused, compiled")
    if W.dev.type == "cuda":  # captured in a CUDA graph after a warm-up, replayed with new rows
        xa, b1, sa, s1 = dev(A[rows]), dev(B1), dev(SA[rows]), dev(S1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ht.all_gather_scaled_matmul(xa, [b1], sa, [s1], 0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ht.all_gather_scaled_matmul(xa, [b1], sa, [s1], 0)[1][0]
        A2 = (torch.randint(-16, 17, (D * m, K), generator=gen) / 4).to(torch.float8_e4m3fn)
        xa.copy_(dev(A2[rows]))
        graph.replay()
        torch.cuda.synchronize()
        close(out, (A2.double() @ B1.double()) * SA.double() * S1.double(), torch.bfloat16, "fp8 fused, graph replay")
    if W.dev.type == "cuda":  # a call seen before (rows of new values at new addresses): the C++ path where built
        before = ht._torch_fast.taken() if ht._torch_fast else 0
        for step in range(2):
            A3 = (torch.randint(-16, 17, (D * 2 * m, K), generator=gen) / 4).to(torch.float8_e4m3fn)  # 2m rows: a new shape
            SA3 = torch.randint(1, 9, (D * 2 * m, 1), generator=gen) / 8
            rows3 = slice(W.rank * 2 * m, (W.rank + 1) * 2 * m)
            none, (c,) = ht.all_gather_scaled_matmul(dev(A3[rows3]), [dev(B1)], dev(SA3[rows3]), [dev(S1)], 0,
                                                      out_dtypes=[torch.float32], return_A=False)
            if none is not None:
                raise AssertionError("fp8 fused, return_A=False, gave the gathered A")
            close(c, (A3.double() @ B1.double()) * SA3.double() * S1.double(), torch.float32, "fp8 fused, call %d" % step)
        if ht._torch_fast and ht._torch_fast.taken() - before != 1:
            raise AssertionError("fp8 fused: the C++ path took %d calls; 1 was seen before" % (ht._torch_fast.taken() - before))
    try:
        ht.all_gather_scaled_matmul(dev(A[rows]), [dev(B1)], dev(SA[rows]), [dev(S1)], 0, biases=[dev(S1)])
    except hostir.Error as e:
        if "biases" not in str(e):
            raise AssertionError("biases refused, but the message does not say so: %s" % e)
    else:
        raise AssertionError("biases were not refused")


@case
def fp8_rs():
    """hostir.torch.scaled_matmul_reduce_scatter, torch's fused_scaled_matmul_reduce_scatter's
    swap-in: each rank's e4m3 columns of A (its part of K) with its own
    per-row scales, its rows of a column-major B with its own per-column
    scales (and one value each), "sum" and "avg", bf16 and float32 out;
    against the sum in float64. Then captured in a CUDA graph and replayed
    with new A."""
    D, m, k, N = W.size, 2, 32, 16  # k and N multiples of 16, as GPUs' fp8 GEMMs take them
    gen = torch.Generator().manual_seed(31)
    A = (torch.randint(-16, 17, (D * m, D * k), generator=gen) / 4).to(torch.float8_e4m3fn)  # quarters up to 4: exact
    B = (torch.randint(-16, 17, (N, D * k), generator=gen) / 4).to(torch.float8_e4m3fn).t()  # [K, N], column-major
    SA = torch.randint(1, 9, (D, D * m, 1), generator=gen) / 8  # rank r's per-row scales of its part of K
    SB = torch.randint(1, 9, (D, 1, N), generator=gen) / 8
    cols, rows = slice(W.rank * k, (W.rank + 1) * k), slice(W.rank * m, (W.rank + 1) * m)
    dev = lambda t: t.to(W.dev)  # noqa: E731
    parts = [A.double()[:, r * k:(r + 1) * k] @ B.double()[r * k:(r + 1) * k] for r in range(D)]
    for rowwise, op, out_dtype in ((True, "sum", torch.bfloat16), (False, "avg", torch.float32)):
        sa, sb = (dev(SA[W.rank]), dev(SB[W.rank])) if rowwise else (dev(torch.tensor(0.5)), dev(torch.tensor(0.25)))
        want = sum(p * (SA[r].double() * SB[r].double() if rowwise else 0.125) for r, p in enumerate(parts))
        want = want / (D if op == "avg" else 1)
        got = ht.scaled_matmul_reduce_scatter(dev(A[:, cols]), dev(B[cols]), sa, sb, op, 0, out_dtype=out_dtype)
        if got.dtype != out_dtype:
            raise AssertionError("fp8 RS: %s out, asked for %s" % (got.dtype, out_dtype))
        close(got, want[rows], torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float32,
              "fp8 RS, %s scales, %s, %s" % ("per-row" if rowwise else "one-value", op, out_dtype))
    if W.dev.type == "cuda":
        xa, xb, sa, sb = dev(A[:, cols]).contiguous(), dev(B[cols]), dev(SA[W.rank]), dev(SB[W.rank])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ht.scaled_matmul_reduce_scatter(xa, xb, sa, sb, "sum", 0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ht.scaled_matmul_reduce_scatter(xa, xb, sa, sb, "sum", 0)
        A2 = (torch.randint(-16, 17, (D * m, D * k), generator=gen) / 4).to(torch.float8_e4m3fn)
        xa.copy_(dev(A2[:, cols]))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = sum((A2.double()[:, r * k:(r + 1) * k] @ B.double()[r * k:(r + 1) * k]) * SA[r].double() * SB[r].double()
                   for r in range(D))
        close(out, want[rows], torch.bfloat16, "fp8 RS, graph replay")
    if W.dev.type == "cuda":  # a call seen before (new values at new addresses): the C++ path where built
        before = ht._torch_fast.taken() if ht._torch_fast else 0
        for step in range(2):
            A4 = (torch.randint(-16, 17, (2 * D * m, D * k), generator=gen) / 4).to(torch.float8_e4m3fn)  # a new shape
            SA4 = torch.randint(1, 9, (D, 2 * D * m, 1), generator=gen) / 8
            got = ht.scaled_matmul_reduce_scatter(dev(A4[:, cols]), dev(B[cols]), dev(SA4[W.rank]), dev(SB[W.rank]), "avg", 0,
                                                  out_dtype=torch.float32)
            want = sum((A4.double()[:, r * k:(r + 1) * k] @ B.double()[r * k:(r + 1) * k]) * SA4[r].double() * SB[r].double()
                       for r in range(D)) / D
            close(got, want[W.rank * 2 * m:(W.rank + 1) * 2 * m], torch.float32, "fp8 RS, call %d" % step)
        if ht._torch_fast and ht._torch_fast.taken() - before != 1:
            raise AssertionError("fp8 RS: the C++ path took %d calls; 1 was seen before" % (ht._torch_fast.taken() - before))
    try:
        ht.scaled_matmul_reduce_scatter(dev(A[:, cols]), dev(B[cols]), dev(torch.ones(3)), dev(SB[W.rank]), "sum", 0)
    except hostir.Error as e:
        if "a_scale has 3 values" not in str(e):
            raise AssertionError("a wrong a_scale refused, but the message does not say so: %s" % e)
    else:
        raise AssertionError("an a_scale of 3 values was not refused")


@case
def shutdown_and_again():
    """shutdown frees every group's plans and communicators; the next op
    makes them again (one CPU rank: a shutdown is the process's, and torch's
    graphs on the GPU may still hold a communicator)."""
    if W.size != 1 or W.dev.type != "cpu":
        return
    a, b = draw(4, 8, seed=8), draw(8, 3, seed=9)
    ht.all_gather_matmul(a, [b], 0)
    ht.shutdown()
    if ht._groups:
        raise AssertionError("shutdown left %d groups" % len(ht._groups))
    close(ht.all_gather_matmul(a, [b], 0)[1][0], a.double() @ b.double(), torch.float32, "after shutdown")


@case
def refusals():
    a = draw(4 * W.size, 16).to(W.dev)
    for args, expect in (((a, [draw(16, 4, dtype=torch.float64).to(W.dev)], 0), "bs[0] is torch.float64"),
                         ((a, [draw(8, 4).to(W.dev)], 0), "bs[0] is [8, 4]"),
                         ((a, [draw(16, 4).to(W.dev)], 1), "last (contracted) dimension")):
        try:
            ht.all_gather_matmul(*args)
        except hostir.Error as e:
            if expect not in str(e):
                raise AssertionError("refused, but the message %r does not name %r" % (str(e), expect))
        else:
            raise AssertionError("not refused: expected %r" % expect)
    if W.size > 1:
        try:
            ht.matmul_reduce_scatter(draw(W.size + 1, 8).to(W.dev), draw(8, 4).to(W.dev), "sum", 0)
        except hostir.Error as e:
            if "do not divide" not in str(e):
                raise
        else:
            raise AssertionError("a scatter_dim the ranks do not divide was not refused")


def rank_main(rank, size, dev):
    W.rank, W.size, W.dev, W.results = rank, size, dev, []
    for test in (ag_forward_backward, rs_forward_backward, ar_forward_backward, ar_rms_norm, pipelines, compiled, cuda_graph, seen_before,
                 general_fusion, fp8_fusion, fp8_fused, fp8_rs, shutdown_and_again, refusals):
        test()
    for name, err in W.results:
        print("rank%d: %s %s" % (rank, "FAIL" if err else "ok  ", name))
        if err:
            print(err)
    if rank == 0:
        print("hostir.torch plans of rank 0:", *ht.plan("all_gather_matmul")[-1:], *ht.plan("matmul_reduce_scatter")[-1:],
              sep="\n  ")
    failed = sum(1 for _, err in W.results if err)
    counts = torch.tensor([len(W.results) - failed, failed]).to(dev)
    if dist.is_initialized():
        dist.all_reduce(counts)
        if dist.get_backend() != "threaded":  # the threaded group ends with its threads
            dist.destroy_process_group()
    return counts.tolist()


def main():
    if "WORLD_SIZE" in os.environ:  # torchrun: a rank a process, a GPU each
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        rank = dist.get_rank()
        counts = rank_main(rank, dist.get_world_size(), torch.device("cuda", local))
    elif "--threads" in sys.argv:  # CPU tensors, a rank a thread (torch's threaded process group)
        from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg
        size, rank, totals = int(sys.argv[sys.argv.index("--threads") + 1]), 0, {}
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # a world a thread, as torch's own tests set it
        _install_threaded_pg()
        store = dist.HashStore()

        def thread(r):
            dist.init_process_group("threaded", rank=r, world_size=size, store=store)
            totals[r] = rank_main(r, size, torch.device("cpu"))

        threads = [threading.Thread(target=thread, args=(r,)) for r in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts = totals.get(0, [0, 1])
    else:  # CPU tensors, one rank
        rank, counts = 0, rank_main(0, 1, torch.device("cpu"))
    if rank == 0:
        print("%d passed, %d failed" % tuple(counts))
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(main())
