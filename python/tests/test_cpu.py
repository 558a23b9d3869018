"""The package on the CPU: fusions built from Python, lowered, printed, and
run over in-process ranks on numpy arrays against numpy's own result; errors
as exceptions carrying hostir's message. Run by `make test` (through
tests/main.c) with HOSTIR_NATIVE naming the library it built, or after
`pip install ./python` with `python -m unittest discover python/tests`. The
last line is "N passed, N failed"."""
import os
import sys
import unittest

if os.environ.get("HOSTIR_NATIVE"):  # make test: the package's source beside the library it built
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    import numpy as np  # noqa: E402
except ImportError:  # said, not failed, as test_torch.py without torch
    if __name__ == "__main__":
        print("skipped: this Python has no numpy (pip install numpy)")
        sys.exit(0)
    raise unittest.SkipTest("this Python has no numpy (pip install numpy)")

import hostir  # noqa: E402


def ag_matmul(D, stream=False):
    """A [DIDx D, m, K] x B [K, N] -> C [D, m, N] on every device (nvFuser's AG_matmul_P2p with stream=True)."""
    f = hostir.Fusion()
    a, b = f.input("float32", 3), f.input("float32", 2)
    c = f.output(f.matmul(a, b))
    for t in (a, b, c):
        t.mesh(range(D))
    a.parallelize(0, "DIDx")
    if stream:
        c.parallelize(0, "Stream")
    return f


class CpuTests(unittest.TestCase):
    def test_print(self):
        text = str(ag_matmul(4).lower(device=2))
        self.assertIn("%HostIrContainer", text)
        self.assertIn("Communication", text)
        self.assertIn("Allgather", text)
        self.assertIn("DeviceMesh{0 1 2 3}", text)

    def test_runs_like_numpy_on_odd_meshes(self):
        rng = np.random.default_rng(7)
        for D, stream, schedule in ((1, False, "linear"), (3, False, "linear"), (3, True, "ring"), (4, True, "linear")):
            m, K, N = 5, 6, 7
            A = rng.standard_normal((D, m, K)).astype(np.float32)
            B = rng.standard_normal((K, N)).astype(np.float32)
            outs = hostir.run(ag_matmul(D, stream), [[A[r:r + 1], B] for r in range(D)], schedule=schedule)
            want = np.einsum("dmk,kn->dmn", A.astype(np.float64), B.astype(np.float64))
            for r in range(D):
                self.assertEqual(outs[r][0].shape, (D, m, N))
                np.testing.assert_allclose(outs[r][0], want, rtol=1e-4, atol=1e-4, err_msg="rank %d, D %d" % (r, D))

    def test_layouts(self):
        """Arrays in numpy's other layouts, passed as they are: B transposed (B.T of a [N, K] array), A with a
        repeated row (broadcast_to, stride 0) and reversed (copied: hostir takes strides >= 0)."""
        rng = np.random.default_rng(11)
        D, m, K, N = 3, 4, 5, 6
        Bt = rng.standard_normal((N, K)).astype(np.float32)
        row = rng.standard_normal((1, 1, K)).astype(np.float32)
        A = np.broadcast_to(row, (D, m, K))
        self.assertEqual(Bt.T.strides[0], 4)
        outs = hostir.run(ag_matmul(D, True), [[A[r:r + 1], Bt.T] for r in range(D)], schedule="ring")
        want = np.einsum("dmk,kn->dmn", A.astype(np.float64), Bt.T.astype(np.float64))
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], want, rtol=1e-4, atol=1e-4, err_msg="rank %d" % r)
        outs = hostir.run(ag_matmul(1), [[A[:1, ::-1], Bt.T[::-1]]])
        np.testing.assert_allclose(outs[0][0], np.einsum("dmk,kn->dmn", A[:1, ::-1].astype(np.float64),
                                                         Bt.T[::-1].astype(np.float64)), rtol=1e-4, atol=1e-4)

    def test_ops_like_numpy(self):
        """layer_norm over a split hidden axis (a local sum, then an allreduce), relu, a scalar, a permute, a cast."""
        rng = np.random.default_rng(5)
        D, rows, h = 3, 4, 5
        X = rng.standard_normal((rows, D, h)).astype(np.float32)
        f = hostir.Fusion()
        x = f.input("float32", 3)
        y = f.layer_norm(x, 2)
        z = f.output(f.cast(f.permute(f.scalar("*", f.unary("relu", y), 2.0), [2, 0, 1]), "float64"))
        x.mesh(range(D))
        x.parallelize(1, "DIDx")
        z.mesh(range(D))
        outs = hostir.run(f, [[X[:, r:r + 1]] for r in range(D)])
        x64 = X.astype(np.float64).reshape(rows, D * h)
        norm = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
        want = np.transpose(np.maximum(norm, 0).reshape(rows, D, h) * 2.0, (2, 0, 1))
        for r in range(D):
            self.assertEqual(outs[r][0].dtype, np.float64)
            np.testing.assert_allclose(outs[r][0], want, rtol=1e-5, atol=1e-5, err_msg="rank %d" % r)
        f = hostir.Fusion()  # rms_norm with a weight, the hidden axis split the same way
        x, w = f.input("float32", 3), f.input("float32", 2)
        f.output(f.rms_norm(x, 2, w))
        for t in (x, w):
            t.mesh(range(D))
            t.parallelize(t is x and 1 or 0, "DIDx")
        W = rng.standard_normal((D, h)).astype(np.float32)
        outs = hostir.run(f, [[X[:, r:r + 1], W[r:r + 1]] for r in range(D)])
        want = x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-5) * W.astype(np.float64).reshape(D * h)
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], want.reshape(rows, D, h)[:, r:r + 1], rtol=1e-5, atol=1e-5, err_msg="rank %d" % r)
        g = hostir.Fusion()  # select, slice, reshape of a split tensor: the last gathers it first
        x = g.input("float32", 3)
        outs3 = [g.output(g.select(x, 2, 1)), g.output(g.slice(x, 2, 1, 3)), g.output(g.reshape(x, [-1, h])),
                 g.output(g.slice(x, 2, -3, None, 2))]
        x.mesh(range(D))
        x.parallelize(1, "DIDx")
        Y = rng.standard_normal((rows, D, h)).astype(np.float32)
        got = hostir.run(g, [[Y[:, r:r + 1]] for r in range(D)])
        for r in range(D):
            np.testing.assert_array_equal(got[r][0], Y[:, r:r + 1, 1])
            np.testing.assert_array_equal(got[r][1], Y[:, r:r + 1, 1:3])
            np.testing.assert_array_equal(got[r][2], Y.reshape(-1, h))
            np.testing.assert_array_equal(got[r][3], Y[:, r:r + 1, -3::2])
        self.assertEqual(len(outs3), 4)
        with self.assertRaises(hostir.Error) as e:
            f.unary("softplus", x)
        self.assertIn("unknown op 'softplus'", str(e.exception))

    def test_linear_column_parallel(self):
        """linear with its weight split on N: each rank computes its columns, then they are gathered."""
        rng = np.random.default_rng(9)
        D, M, K, n = 4, 3, 8, 2
        X = rng.standard_normal((M, K)).astype(np.float32)
        W = rng.standard_normal((D, n, K)).astype(np.float32)
        B = rng.standard_normal((D, n)).astype(np.float32)
        f = hostir.Fusion()
        x, w, b = f.input("float32", 2), f.input("float32", 3), f.input("float32", 2)
        y = f.linear(x, w, b)
        z = f.output(f.set(y))
        for t in (x, w, b, y, z):
            t.mesh(range(D))
        for t in (w, b):
            t.parallelize(0, "DIDx")
        outs = hostir.run(f, [[X, W[r:r + 1], B[r:r + 1]] for r in range(D)])
        want = np.einsum("mk,dnk->dmn", X.astype(np.float64), W.astype(np.float64)) + B[:, None, :]
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], want, rtol=1e-5, atol=1e-5, err_msg="rank %d" % r)

    def test_scaled_linear_fp8(self):
        """fp8 (torch._scaled_mm's product): rows cast to e4m3 and gathered with their scales, pipelined on streams."""
        rng = np.random.default_rng(17)
        D, m, K, N = 3, 2, 16, 5
        A = (rng.integers(-16, 17, (D, m, K)) / 4).astype(np.float32)  # quarters up to 4: exact in e4m3
        W = (rng.integers(-16, 17, (N, K)) / 4).astype(np.float32)
        SA = (rng.integers(1, 9, (D, m)) / 8).astype(np.float32)
        SW = np.array([0.75], np.float32)
        f = hostir.Fusion()
        a, w, sa, sw = f.input("float32", 3), f.input("float32", 2), f.input("float32", 2), f.input_sized("float32", [1])
        a8, w8 = f.cast(a, "float8_e4m3fn"), f.cast(w, "float8_e4m3fn")
        y = f.output(f.scaled_linear(a8, w8, sa, sw, out="float32"))
        for t in (a, w, sa, sw, a8, w8, y):
            t.mesh(range(D))
        for t in (a, sa, a8):
            t.parallelize(0, "DIDx")
        y.parallelize(0, "Stream")
        self.assertIn("scaled_linear(", str(f))
        outs = hostir.run(f, [[A[r:r + 1], W, SA[r:r + 1], SW] for r in range(D)])
        want = np.einsum("dmk,nk->dmn", A.astype(np.float64), W.astype(np.float64)) * SA[:, :, None] * SW[0]
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], want, rtol=1e-6, atol=1e-6, err_msg="rank %d" % r)
        with self.assertRaises(hostir.Error) as e:
            f.scaled_linear(a8, w8, sa, sw, out="float8_e4m3fn")
        self.assertIn("give float32, float16 or bfloat16", str(e.exception))

    def test_split_axis(self):
        """A [M, K] split on M by D and sharded (each rank passes its rows), C's parts on streams: nvFuser's AG+GEMM."""
        rng = np.random.default_rng(13)
        D, m, K, N = 3, 2, 4, 5
        A = rng.standard_normal((D * m, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        f = hostir.Fusion()
        a, b = f.input("float32", 2), f.input("float32", 2)
        c = f.output(f.matmul(a, b))
        for t in (a, b, c):
            t.mesh(range(D))
        c.split(0, D)
        a.parallelize(0, "DIDx")
        c.parallelize(0, "Stream")
        outs = hostir.run(f, [[A[r * m:(r + 1) * m], B] for r in range(D)])
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
        h = hostir.Fusion()  # reordered, then split at loop position 0 (X's columns): each rank passes its columns
        X = rng.standard_normal((2, D * 2)).astype(np.float32)
        x = h.input("float32", 2)
        y = h.output(h.unary("neg", x))
        for t in (x, y):
            t.mesh(range(D))
        x.reorder({1: 0}).split(0, D).parallelize(0, "DIDx")
        self.assertIn("T0_g_float[ideviceIdx.x", str(h))
        outs = hostir.run(h, [[np.ascontiguousarray(X[:, r * 2:(r + 1) * 2])] for r in range(D)])
        for r in range(D):
            np.testing.assert_array_equal(outs[r][0], -X)
        h = hostir.Fusion()  # an output laid out column-major (its loop order [c, a]): run's arrays are still X's shape
        x = h.input("float32", 2)
        y = h.output(h.unary("neg", x))
        y.reorder({1: 0}).allocation_loop()
        outs = hostir.run(h, [[X]])
        np.testing.assert_array_equal(outs[0][0], -X)
        g = hostir.Fusion()  # a fixed-size input refuses another size
        g.output(g.unary("neg", g.input_sized("float32", [2, 3])))
        with self.assertRaises(hostir.Error) as e:
            hostir.run(g, [[np.zeros((2, 4), np.float32)]])
        self.assertIn("fixed when the fusion was built", str(e.exception))

    def test_mesh_2d(self):
        """Tensor x data parallel on a 2 x 3 mesh: x [R, C, K] split DIDy on R and DIDx on C, summed over C (an
        allreduce along each row); each row gets its own R slice."""
        rng = np.random.default_rng(17)
        R, C, K = 2, 3, 4
        X = rng.standard_normal((R, C, K)).astype(np.float32)
        f = hostir.Fusion()
        x = f.input("float32", 3)
        y = f.output(f.sum(x, [1]))
        for t in (x, y):
            t.mesh(range(R * C), rows=R)
        x.parallelize(0, "DIDy").parallelize(1, "DIDx")
        y.parallelize(0, "DIDy")
        self.assertIn("DeviceMesh{{0 1 2}{3 4 5}}", str(f.lower(device=4)))
        outs = hostir.run(f, [[X[d // C:d // C + 1, d % C:d % C + 1]] for d in range(R * C)])
        for d in range(R * C):
            np.testing.assert_allclose(outs[d][0], X[d // C:d // C + 1].sum(axis=1), rtol=1e-5, atol=1e-5)
        with self.assertRaises(hostir.Error) as e:
            x.mesh(range(5), rows=2)
        self.assertIn("5 devices do not fill 2 rows", str(e.exception))

    def test_scalar_input(self):
        """An integer input scales a split tensor; a new value is a new plan."""
        rng = np.random.default_rng(17)
        D = 2
        X = rng.standard_normal((D, 3)).astype(np.float32)
        f = hostir.Fusion()
        x = f.input("float32", 2)
        s = f.input_scalar()
        f.output(f.scale("*", x, s))
        x.mesh(range(D))
        x.parallelize(0, "DIDx")
        for value in (3, -2):
            outs = hostir.run(f, [[X[r:r + 1], value] for r in range(D)])
            for r in range(D):
                np.testing.assert_allclose(outs[r][0], X[r:r + 1] * value, rtol=1e-6)

    def test_random(self):
        """rand over a split tensor: the whole tensor's numbers (Philox-4x32-10, written here apart), a dropout mask."""
        def philox(seed, index):
            x, k = [index & 0xffffffff, index >> 32, 0, 0], [seed & 0xffffffff, seed >> 32]
            for _ in range(10):
                a, b = 0xD2511F53 * x[0], 0xCD9E8D57 * x[2]
                x = [(b >> 32) ^ x[1] ^ k[0], b & 0xffffffff, (a >> 32) ^ x[3] ^ k[1], a & 0xffffffff]
                k = [(k[0] + 0x9E3779B9) & 0xffffffff, (k[1] + 0xBB67AE85) & 0xffffffff]
            return (x[0] >> 8) / float(1 << 24)
        D, seed = 3, (1 << 40) + 17
        X = np.random.default_rng(5).standard_normal((D, 2, 4)).astype(np.float32)
        f = hostir.Fusion()
        x = f.input("float32", 3)
        s = f.input_scalar()
        f.output(f.rand(x, seed=s))
        f.output(f.mul(x, f.scalar("<", f.rand(x, seed=s), 0.5)))
        x.mesh(range(D))
        x.parallelize(0, "DIDx")
        outs = hostir.run(f, [[X[r:r + 1], seed] for r in range(D)])
        U = np.array([philox(seed, i) for i in range(X.size)], dtype=np.float32).reshape(X.shape)
        for r in range(D):
            np.testing.assert_array_equal(outs[r][0], U[r:r + 1])
            np.testing.assert_array_equal(outs[r][1], np.where(U[r:r + 1] < 0.5, X[r:r + 1], 0))

    def test_attention(self):
        """sdpa with the heads on 2 ranks, causal, and its logsumexp; max and iota: numpy's numbers."""
        rng = np.random.default_rng(9)
        D, L, E = 2, 5, 4
        Q, K, V = (rng.standard_normal((D, L, E)).astype(np.float32) for _ in range(3))
        f = hostir.Fusion()
        q, k, v = (f.input_sized("float32", [D, L, E]) for _ in range(3))
        out, lse = f.sdpa(q, k, v, causal=True, logsumexp=True)
        f.output(out)
        f.output(lse)
        f.output(f.max(q, [2]))
        f.output(f.iota(q, 1))
        for t in (q, k, v):
            t.mesh(range(D))
            t.parallelize(0, "DIDx")
        outs = hostir.run(f, [[Q[r:r + 1], K[r:r + 1], V[r:r + 1]] for r in range(D)])
        S = np.einsum("hle,hse->hls", Q.astype(np.float64), K.astype(np.float64)) / np.sqrt(E)
        S = np.where(np.tril(np.ones((L, L), dtype=bool)), S, -np.inf)
        M = S.max(axis=2, keepdims=True)
        P = np.exp(S - M)
        W = P / P.sum(axis=2, keepdims=True)
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], (W @ V.astype(np.float64))[r:r + 1], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(outs[r][1], (M[..., 0] + np.log(P.sum(axis=2)))[r:r + 1], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(outs[r][2], Q[r:r + 1].max(axis=2))
            np.testing.assert_array_equal(outs[r][3], np.broadcast_to(np.arange(L, dtype=np.float32)[:, None], (1, L, E)))

    def test_int64(self):
        """int64 beyond 2^53: a sum over the ranks (an Allreduce) and a wrapping product, exact."""
        rng = np.random.default_rng(4)
        D = 3
        X = rng.integers(-(1 << 62), 1 << 62, size=(D, 4), dtype=np.int64)
        f = hostir.Fusion()
        x = f.input("int64", 2)
        f.output(f.sum(x, [0]))
        f.output(f.mul(x, x))
        x.mesh(range(D))
        x.parallelize(0, "DIDx")
        outs = hostir.run(f, [[X[r:r + 1]] for r in range(D)])
        with np.errstate(over="ignore"):
            for r in range(D):
                self.assertEqual(outs[r][0].dtype, np.int64)
                np.testing.assert_array_equal(outs[r][0], X.sum(axis=0))
                np.testing.assert_array_equal(outs[r][1], X[r:r + 1] * X[r:r + 1])

    def test_swizzle_and_merge(self):
        """An allgather into a swizzled Stream axis (a ring from the own chunk), 3 ranks; a Stream on a merge refused."""
        D = 3
        X = np.random.default_rng(2).standard_normal((D * 2, 4)).astype(np.float32)
        f = hostir.Fusion()
        x = f.input("float32", 2)
        y = f.set(x)
        f.output(y)
        x.mesh(range(D)).split(0, D)
        y.mesh(range(D))
        x.parallelize(0, "DIDx")
        y.swizzle1d(0).parallelize(0, "Stream")
        outs = hostir.run(f, [[X[2 * r:2 * r + 2]] for r in range(D)])
        for r in range(D):
            np.testing.assert_array_equal(outs[r][0], X)
        g = hostir.Fusion()
        a = g.input("float32", 2)
        g.output(g.set(a))
        a.merge(0)
        with self.assertRaises(hostir.Error) as e:
            a.parallelize(0, "Stream")
        self.assertIn("is a merge of axes (hir_merge)", str(e.exception))

    def test_tuned(self):
        """tune=True: the schedules measured on 3 ranks, one chosen by all, the numbers numpy's."""
        rng = np.random.default_rng(11)
        D, m, K, N = 3, 4, 8, 6
        A = rng.standard_normal((D, m, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        plans = []
        outs = hostir.run(ag_matmul(D, stream=True), [[A[r:r + 1], B] for r in range(D)], tune=True, plans=plans)
        want = np.einsum("dmk,kn->dmn", A.astype(np.float64), B.astype(np.float64))
        chosen = [p.split(" ms: ")[1].split(" (the slowest")[0].rsplit(", ", 1)[0] for p in plans]
        for r in range(D):
            np.testing.assert_allclose(outs[r][0], want, rtol=1e-4, atol=1e-4)
            self.assertTrue(plans[r].startswith("tuned on 3 ranks"), plans[r])
        self.assertEqual(len(set(chosen)), 1, chosen)

    def test_sum_scattered(self):
        """sum(P [DIDx D, D, m], axis 0) scattered: rank j holds row j of the sum (a ReduceScatter)."""
        D, m = 3, 4
        f = hostir.Fusion()
        p = f.input("float64", 3)
        s = f.output(f.sum(p, [0]))
        p.mesh(range(D))
        s.mesh(range(D))
        p.parallelize(0, "DIDx")
        s.parallelize(1, "DIDx")
        P = np.random.default_rng(3).standard_normal((D, D, m))
        outs = hostir.run(f, [[P[r:r + 1]] for r in range(D)])
        for r in range(D):
            np.testing.assert_allclose(outs[r][0].reshape(-1), P[:, r, :].sum(axis=0), rtol=1e-12)

    def test_fused_op_fusions(self):
        """hostir.torch's programs: the gathered A and two products in one
        P2P pipeline (every received chunk feeds both B's), and the matmul
        reduce-scatter, on 1-4 ranks with both schedules, against numpy."""
        rng = np.random.default_rng(3)
        for D in (1, 2, 3, 4):
            text = str(hostir.ag_matmul_fusion(D, nb=2).lower(device=D - 1, schedule="ring"))
            self.assertEqual(text.count("FOR StreamIdx"), 2, text)  # the streams' fork, then one pipeline
            self.assertEqual(text.count("= matmul("), 2)
            text = str(hostir.ag_matmul_fusion(D, nb=2).lower(device=D - 1, schedule="gather"))
            self.assertEqual(text.count("\n     = matmul("), 2 * (D > 1), text)  # whole, after the exchange's loop
            text = str(hostir.ag_matmul_fusion(D, nb=2).lower(device=D - 1, schedule="split"))
            self.assertEqual(text.count("\n     = matmul("), 2 * (D > 1), text)  # each GEMM's second half, after the loop
            self.assertEqual(text.count("\n       = matmul("), 2, text)        # and its first half in it
            text = str(hostir.ag_matmul_fusion(D, nb=2).lower(device=D - 1, schedule="collective", parts=3))
            self.assertEqual(text.count("type=Allgather"), D > 1, text)  # one allgather of a part a pipeline step
            self.assertNotIn("P2PCommunication", text)
            f = hostir.Fusion()  # the same with A's rows split by D (each split axis has an extent of its own)
            a, b1, b2 = f.input("float32", 2), f.input("float32", 2), f.input("float32", 2)
            g = f.output(f.set(a))
            cs = [f.output(f.matmul(g, b)) for b in (b1, b2)]
            for t in [a, g, b1, b2] + cs:
                t.mesh(range(D))
            a.split(0, D)
            a.parallelize(0, "DIDx")
            for t in [g] + cs:
                t.parallelize(0, "Stream")
            self.assertEqual(str(f.lower(device=0, schedule="ring")).count("FOR StreamIdx"), 2)
            for schedule in ("linear", "ring", "collective", "gather", "split"):  # collective: 3 parts, an allgather (reduce-scatter) each
                m, K = 3, 8
                n1, n2 = (6, 8) if schedule == "split" else (5, 7)  # split: N cut in 2
                A = rng.standard_normal((D * m, K)).astype(np.float32)
                B1, B2 = rng.standard_normal((K, n1)).astype(np.float32), rng.standard_normal((K, n2)).astype(np.float32)
                outs = hostir.run(hostir.ag_matmul_fusion(D, nb=2), [[A[r * m:(r + 1) * m][None], B1, B2] for r in range(D)],
                                  schedule=schedule, streams=2, parts=3 if schedule == "collective" else 0)
                for gathered, c1, c2 in outs:
                    np.testing.assert_allclose(gathered.reshape(D * m, K), A)
                    np.testing.assert_allclose(c1.reshape(D * m, n1), A @ B1, rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(c2.reshape(D * m, n2), A @ B2, rtol=1e-5, atol=1e-5)
                M, k = 2 * D, 4
                A = rng.standard_normal((M, k * D)).astype(np.float32)
                B = rng.standard_normal((k * D, 5)).astype(np.float32)
                outs = hostir.run(hostir.matmul_rs_fusion(D),
                                  [[A[:, r * k:(r + 1) * k].reshape(1, D, M // D, k), B[None, r * k:(r + 1) * k]] for r in range(D)],
                                  schedule=schedule, streams=2, parts=2 if schedule == "collective" else 0)
                for r in range(D):
                    np.testing.assert_allclose(outs[r][0].reshape(M // D, 5), (A @ B)[r * M // D:(r + 1) * M // D],
                                               rtol=1e-5, atol=1e-5)
            outs = hostir.run(hostir.matmul_ar_fusion(D), [[A[:, r * k:(r + 1) * k], B[r * k:(r + 1) * k]] for r in range(D)])
            for r in range(D):  # on logical shapes: each rank's part of K, the sum whole on every rank
                np.testing.assert_allclose(outs[r][0], A @ B, rtol=1e-5, atol=1e-5)

    def test_errors_name_the_culprit(self):
        with self.assertRaises(hostir.Error) as e:  # a wrong dtype at run time, by name
            hostir.run(ag_matmul(2), [[np.zeros((1, 2, 3), np.float64), np.zeros((3, 4), np.float32)]] * 2)
        self.assertIn("input 0", str(e.exception))
        self.assertIn("double", str(e.exception))
        f = hostir.Fusion()
        a = f.input("float32", 2)
        with self.assertRaises(hostir.Error) as e:  # the builder's own refusal, as an exception
            a.parallelize(5, "DIDx")
        self.assertIn("axis 5", str(e.exception))
        with self.assertRaises(hostir.Error) as e:
            f.input("int8", 1)
        self.assertIn("float32", str(e.exception))
        with self.assertRaises(hostir.Error) as e:
            ag_matmul(2).lower(schedule="spiral")
        self.assertIn("'linear', 'ring', 'collective', 'gather' or 'split'", str(e.exception))

    def test_python_failures_reach_the_caller(self):
        """A rank's Python exception is raised by run() and ends the other ranks' waits at once."""
        import time
        f = ag_matmul(2)
        with self.assertRaises(hostir.Error) as e:
            hostir.run(f, [None, None])
        self.assertIn("inputs[0] is NoneType", str(e.exception))
        rng = np.random.default_rng(3)
        a = rng.standard_normal((1, 2, 3)).astype(np.float32)
        b = rng.standard_normal((3, 4)).astype(np.float32)
        t0 = time.monotonic()
        with self.assertRaises(hostir.Error) as e:  # rank 1 passes a 9-D array
            hostir.run(f, [[a, b], [np.zeros((1,) * 9, np.float32), b]], timeout_ms=20000)
        self.assertIn("9 axes", str(e.exception))
        self.assertLess(time.monotonic() - t0, 10)  # rank 0 was told, it did not wait out 20 s

        class Bad:
            def __array__(self, *args, **kwargs):
                raise KeyError("not an array")
        with self.assertRaises(KeyError):  # not hostir's: raised as it is
            hostir.run(f, [[a, b], [Bad(), b]], timeout_ms=20000)
        self.assertLess(time.monotonic() - t0, 20)

    def test_integers_checked_before_c(self):
        f = hostir.Fusion()
        with self.assertRaises(hostir.Error) as e:
            f.input("float32", 2 ** 40)
        self.assertIn("does not fit a 32-bit C integer", str(e.exception))
        with self.assertRaises(hostir.Error):
            ag_matmul(2).lower(device=2 ** 40)
        a = f.input("float32", 2)
        with self.assertRaises(hostir.Error):
            f.select(a, 0, 2 ** 70)
        with self.assertRaises(hostir.Error):
            f.reshape(a, [2 ** 64, 1])
        with self.assertRaises(hostir.Error):
            a.mesh([0, 2 ** 33])
        g = hostir.Fusion()  # a scalar input of 2**70 is refused, not run as 0
        x = g.input("float32", 1)
        s = g.input_scalar()
        g.output(g.scale("*", x, s))
        with self.assertRaises(hostir.Error) as e:
            hostir.run(g, [[np.ones(3, np.float32), 2 ** 70]])
        self.assertIn("64-bit", str(e.exception))
        out = hostir.run(g, [[np.arange(3, dtype=np.float32), 3]])
        np.testing.assert_allclose(out[0][0], np.arange(3) * 3)

    def test_freed_fusion_refused(self):
        f = hostir.Fusion()
        a = f.input("float32", 2)
        f.__del__()
        with self.assertRaises(hostir.Error) as e:
            a.mesh([0])
        self.assertIn("fusion was freed", str(e.exception))
        with self.assertRaises(hostir.Error):
            f.set(a)
        with self.assertRaises(hostir.Error):
            str(f)

    def test_version_agrees(self):
        header = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hostir.h")).read()
        self.assertIn('#define HOSTIR_VERSION "%s"' % hostir.__version__, header)


if __name__ == "__main__":
    result = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.loadTestsFromTestCase(CpuTests))
    failed = len(result.failures) + len(result.errors)
    print("%d passed, %d failed" % (result.testsRun - failed, failed))
    sys.exit(1 if failed else 0)
