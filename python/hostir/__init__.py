"""hostir from Python: build a fusion, lower it, print its host program, and
run it on numpy arrays over N in-process ranks (the local world).

    import numpy as np, hostir
    f = hostir.Fusion()
    a = f.input("float32", 3)             # A [D, m, K], its axis 0 split across devices
    b = f.input("float32", 2)             # B [K, N], on every device
    c = f.output(f.matmul(a, b))          # C [D, m, N]: the rows gathered, then multiplied
    for t in (a, b, c):
        t.mesh(range(4))
    a.parallelize(0, "DIDx")
    print(f.lower(device=0))              # the host program of device 0, in nvFuser's format
    outs = hostir.run(f, [[a_shard[r], B] for r in range(4)])   # per rank: [C]

Every error raises hostir.Error carrying hostir's message (which names the
culprit and how to fix it). The C library comes from the repository's
headers: `pip install ./python` builds it (with CUDA and NCCL where found).
"""
import ctypes
import importlib.util
import os
import threading

import numpy as np

__version__ = "0.23"  # hostir.h's HOSTIR_VERSION: CI checks they agree
__all__ = ["Error", "Fusion", "Tensor", "Program", "run", "ag_matmul_fusion", "matmul_rs_fusion", "matmul_ar_fusion",
           "ar_rms_norm_fusion"]

_MAX_DIMS = 8


class _SdpaDesc(ctypes.Structure):  # hir_sdpa_desc
    _fields_ = [("scale", ctypes.c_double), ("causal", ctypes.c_int), ("dropout", ctypes.c_double),
                ("seed", ctypes.c_void_p)]


class _HirTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndims", ctypes.c_int),
                ("sizes", ctypes.c_int64 * _MAX_DIMS), ("strides", ctypes.c_int64 * _MAX_DIMS)]


def _integer(v, ctype):
    """v as the C integer type `ctype`, or Error: ctypes would cut it to fit without a word."""
    bits = 8 * ctypes.sizeof(ctype)
    if not isinstance(v, (int, np.integer)):
        raise Error("invalid argument", "%r is not an integer" % (v,))
    if not -(1 << (bits - 1)) <= int(v) < (1 << (bits - 1)):
        raise Error("invalid argument", "%d does not fit a %d-bit C integer (%d to %d)"
                    % (v, bits, -(1 << (bits - 1)), (1 << (bits - 1)) - 1))
    return int(v)


class _CheckedInt(ctypes.c_int):
    @classmethod
    def from_param(cls, v):
        return ctypes.c_int(_integer(v, ctypes.c_int))


class _CheckedInt64(ctypes.c_int64):
    @classmethod
    def from_param(cls, v):
        return ctypes.c_int64(_integer(v, ctypes.c_int64))


def _array(ctype, values):
    values = [_integer(v, ctype) for v in values]
    return (ctype * max(1, len(values)))(*values)


class _Checked:
    """The C library's functions, each refusing an argument ctypes would cut (hostir.Error naming the function)."""

    def __init__(self, lib, names):
        self.raw = lib  # the library itself, for callers that take its function pointers (hostir.torch's C++)
        for name in names:
            setattr(self, name, self._wrap(getattr(lib, name), name))

    @staticmethod
    def _wrap(fn, name):
        def call(*args):
            try:
                return fn(*args)
            except ctypes.ArgumentError as e:
                raise Error("invalid argument", "%s: %s" % (name, e)) from None
        return call


def _load():
    path = os.environ.get("HOSTIR_NATIVE")
    if not path:
        spec = importlib.util.find_spec("hostir._native")
        path = spec.origin if spec else None
    if not path:
        raise ImportError("hostir: its C library is not built; run `pip install ./python` in hostir's repository "
                          "(or set HOSTIR_NATIVE to a built library)")
    lib = ctypes.CDLL(path)
    p, i, c = ctypes.c_void_p, _CheckedInt, ctypes.c_char_p
    sigs = {
        "hir_status_str": (c, [i]),
        "hir_fusion_create": (p, []), "hir_fusion_free": (None, [p]), "hir_fusion_error": (c, [p]),
        "hir_input": (p, [p, i, i]), "hir_output": (i, [p, p]), "hir_set": (p, [p, p]),
        "hir_add": (p, [p, p, p]), "hir_sub": (p, [p, p, p]), "hir_mul": (p, [p, p, p]), "hir_matmul": (p, [p, p, p]),
        "hir_sum": (p, [p, p, i, ctypes.POINTER(ctypes.c_int)]), "hir_broadcast": (p, [p, p, i, ctypes.POINTER(ctypes.c_int)]),
        "hir_div": (p, [p, p, p]), "hir_unary": (p, [p, i, p]), "hir_cast": (p, [p, p, i]),
        "hir_binary_scalar": (p, [p, i, p, ctypes.c_double]), "hir_scalar_binary": (p, [p, i, ctypes.c_double, p]),
        "hir_permute": (p, [p, p, ctypes.POINTER(ctypes.c_int)]), "hir_mean": (p, [p, p, i, ctypes.POINTER(ctypes.c_int)]),
        "hir_layer_norm": (p, [p, p, i, p, p, ctypes.c_double]), "hir_rms_norm": (p, [p, p, i, p, ctypes.c_double]), "hir_linear": (p, [p, p, p, p]),
        "hir_scaled_linear": (p, [p, p, p, p, p, i]),
        "hir_select": (p, [p, p, i, _CheckedInt64]), "hir_slice_step": (p, [p, p, i, _CheckedInt64, _CheckedInt64, _CheckedInt64]),
        "hir_reshape": (p, [p, p, i, ctypes.POINTER(ctypes.c_int64)]),
        "hir_set_mesh": (i, [p, i, ctypes.POINTER(ctypes.c_int)]), "hir_parallelize": (i, [p, i, i]),
        "hir_set_mesh_2d": (i, [p, i, i, ctypes.POINTER(ctypes.c_int)]),
        "hir_split": (i, [p, i, _CheckedInt64, i]), "hir_input_sized": (p, [p, i, i, ctypes.POINTER(ctypes.c_int64)]),
        "hir_reorder": (i, [p, i, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]), "hir_set_allocation_loop": (i, [p]),
        "hir_merge": (i, [p, i]), "hir_swizzle1d": (i, [p, i, i]),
        "hir_input_scalar": (p, [p]), "hir_binary_val": (p, [p, i, p, p]),
        "hir_val_const": (p, [p, _CheckedInt64]), "hir_lt": (p, [p, p, p]),
        "hir_rand": (p, [p, p, i, p]), "hir_max": (p, [p, p, i, ctypes.POINTER(ctypes.c_int)]),
        "hir_iota": (p, [p, p, i, i]), "hir_sdpa": (p, [p, p, p, p, ctypes.POINTER(_SdpaDesc), ctypes.POINTER(p)]), "hir_uniform": (p, [p, p, i, ctypes.c_double, ctypes.c_double, p]),
        "hir_fusion_snprint": (ctypes.c_size_t, [p, c, ctypes.c_size_t]),
        "hx_lower": (i, [p, i, i, i, i, i, i, p, p, i, ctypes.POINTER(p)]), "hir_program_error": (c, [p]),
        "hir_program_free": (None, [p]), "hir_program_plan": (c, [p]),
        "hir_program_snprint": (ctypes.c_size_t, [p, c, ctypes.c_size_t]),
        "hx_evaluator_create": (i, [p, p, p, i, i, i, ctypes.POINTER(p)]), "hir_evaluator_error": (c, [p]),
        "hir_evaluator_free": (None, [p]), "hir_evaluator_sync": (i, [p]),
        "hir_run": (i, [p, ctypes.POINTER(_HirTensor), i, ctypes.POINTER(_HirTensor), i]),
        "hir_local_world_create": (p, [i]), "hir_local_world_set_timeout": (None, [p, i]),
        "hir_local_comm": (p, [p, i]), "hir_local_world_free": (None, [p]),
        "hx_tensor_bytes": (i, []), "hx_has_cuda": (i, []), "hx_version": (c, []), "hir_dtype_name": (c, [i]),
        "hx_tuner_create": (i, [p, i, p, p, i, i, i, ctypes.POINTER(p)]), "hir_tuner_error": (c, [p]),
        "hir_tuner_run": (i, [p, ctypes.POINTER(_HirTensor), i, ctypes.POINTER(_HirTensor), i]),
        "hir_tuner_sync": (i, [p]), "hir_tuner_program": (p, [p]), "hir_tuner_free": (None, [p]),
        "hx_comm_error": (c, [p]), "hx_comm_copy_engine": (i, [p]), "hir_backend_free": (None, [p]),
        "hx_comm_abort": (None, [p, c]),
    }
    if lib.hx_has_cuda():  # the CUDA backend and NCCL, for hostir.torch
        sigs.update({
            "hir_backend_cuda_create": (p, [i]), "hir_backend_cuda_set_stream": (None, [p, p]),
            "hx_nccl_unique_id": (i, [c]), "hx_nccl_id_bytes": (i, []),
            "hx_nccl_comm_from_id": (i, [i, i, i, c, i, ctypes.POINTER(p)]),
            "hir_nccl_comm_set_copy_engine": (i, [p, i]), "hir_nccl_comm_free": (None, [p]),
        })
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int if res is i else res, args  # results as plain ints
    if lib.hx_tensor_bytes() != ctypes.sizeof(_HirTensor):
        raise ImportError("hostir: the C library's hir_tensor is %d bytes, this module's %d: rebuild the package"
                          % (lib.hx_tensor_bytes(), ctypes.sizeof(_HirTensor)))
    if lib.hx_version().decode() != __version__:
        raise ImportError("hostir: the C library is hostir %s, this module %s: rebuild the package"
                          % (lib.hx_version().decode(), __version__))
    return _Checked(lib, sigs)


_lib = _load()
_DTYPES = {"float32": 0, "float64": 1, "float16": 2, "int64": 6}  # hir_dtype; bfloat16 has no numpy type
_BUILD_DTYPES = dict(_DTYPES, bfloat16=3, float8_e4m3fn=4, float8_e5m2=5)  # the builder takes these (hostir.torch runs bf16)
_NUMPY = {0: np.float32, 1: np.float64, 2: np.float16, 6: np.int64}
_PTYPES = {"Serial": 0, "DIDx": 1, "Stream": 2, "DIDy": 3}
_BINARY = {"+": 0, "-": 1, "*": 2, "/": 3, "<": 4}  # hir_binary_op
_UNARY = {name: k for k, name in enumerate(  # hir_unary_op, in HIR_UNARY_OP_LIST's order
    "neg abs relu sin cos exp log tanh sqrt rsqrt reciprocal sigmoid silu gelu gelu_tanh".split())}
_STATUS_INVALID = 1
_END = (1 << 63) - 1  # HIR_END


class Error(Exception):
    """A hostir call failed: `status` is its hir_status name, the message hostir's."""

    def __init__(self, status, message):
        self.status = status
        super().__init__("%s: %s" % (status, message))


def _status(code):
    return _lib.hir_status_str(code).decode()


def _text(snprint, handle):
    n = snprint(handle, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    snprint(handle, buf, n + 1)
    return buf.value.decode()


class Scalar:
    """A scalar input of a fusion (its handle)."""

    def __init__(self, handle):
        self._h = handle


class Tensor:
    """A tensor of a fusion (its handle); axes are split with parallelize."""

    def __init__(self, fusion, handle):
        self.fusion, self.__h = fusion, handle

    @property
    def _h(self):  # refused once its fusion is freed: the handle points into the fusion's memory
        if not self.fusion._h:
            raise Error("invalid argument", "this tensor's fusion was freed; build the tensor again in a live fusion")
        return self.__h

    def mesh(self, devices, rows=None):
        """The devices the tensor lives on; with rows, a 2-D mesh of that many rows (row-major): DIDx splits
        along a row, DIDy down a column."""
        devices = list(devices)
        arr = _array(ctypes.c_int, devices)
        if rows is None:
            self.fusion._check(_lib.hir_set_mesh(self._h, len(devices), arr))
        else:
            if rows < 1 or len(devices) % rows:
                raise Error("invalid argument", "mesh: %d devices do not fill %d rows evenly" % (len(devices), rows))
            self.fusion._check(_lib.hir_set_mesh_2d(self._h, rows, len(devices) // rows, arr))
        return self

    def split(self, axis, factor, outer=True):
        """nvFuser's split: the axis becomes [factor, rest] (outer) or [rest, factor]; the user's arrays keep the
        logical axes (a DIDx-split axis holds this device's part)."""
        self.fusion._check(_lib.hir_split(self._h, axis, factor, int(bool(outer))))
        return self

    def reorder(self, moves):
        """nvFuser's reorder of the loop order: moves maps old loop positions to new ones ({1: 0} brings axis 1 to
        the front); later split and parallelize calls count axes in the new order."""
        n = len(moves)
        src = _array(ctypes.c_int, list(moves.keys()))
        dst = _array(ctypes.c_int, list(moves.values()))
        self.fusion._check(_lib.hir_reorder(self._h, n, src, dst))
        return self

    def merge(self, axis):
        """nvFuser's merge of loop axes axis and axis + 1 into one (later axes number one less); no parallel type
        goes on a merge unless one of its axes has one element."""
        self.fusion._check(_lib.hir_merge(self._h, axis))
        return self

    def swizzle1d(self, axis, by="DIDx"):
        """nvFuser's swizzle1d: this Stream axis's loop starts at the device's own chunk (a P2P allgather into it
        is a ring in that order)."""
        if by not in _PTYPES:
            raise Error("invalid argument", "swizzle1d: the type is %r; give DIDx" % (by,))
        self.fusion._check(_lib.hir_swizzle1d(self._h, axis, _PTYPES[by]))
        return self

    def allocation_loop(self):
        """nvFuser's setAllocationDomain(loop domain): the arrays of this tensor laid out in its loop order (an output
        run hands back comes so; run copies it into a numpy array of the logical shape)."""
        self.fusion._check(_lib.hir_set_allocation_loop(self._h))
        return self

    def parallelize(self, axis, ptype):
        if ptype not in _PTYPES:
            raise Error("invalid argument", "parallelize: the type is %r; give one of %s" % (ptype, ", ".join(_PTYPES)))
        self.fusion._check(_lib.hir_parallelize(self._h, axis, _PTYPES[ptype]))
        return self


class Fusion:
    """What to compute, over which devices: hostir's builder, call for call."""

    def __init__(self):
        self._h = _lib.hir_fusion_create()
        if not self._h:
            raise MemoryError("hostir: out of memory")
        self.inputs, self.outputs = [], []

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.hir_fusion_free(self._h)
            self._h = None

    def _check(self, status=0):
        err = _lib.hir_fusion_error(self._of()).decode()
        if err or status:
            raise Error(_status(status or _STATUS_INVALID), err or "failed")

    def _of(self):
        """The handle, refused once freed."""
        if not self._h:
            raise Error("invalid argument", "this fusion was freed; build a new one")
        return self._h

    def _tv(self, handle):
        if not handle:
            self._check()
            raise Error("invalid argument", "the builder returned nothing")
        return Tensor(self, handle)

    def input(self, dtype, ndims):
        if dtype not in _BUILD_DTYPES:
            raise Error("invalid argument", "input: dtype %r; give one of %s" % (dtype, ", ".join(_BUILD_DTYPES)))
        t = self._tv(_lib.hir_input(self._of(), _BUILD_DTYPES[dtype], ndims))
        t.dtype = dtype
        self.inputs.append(t)
        return t

    def input_scalar(self):
        """A scalar (integer or Bool) input, given to run as a Python int; use it with scale()."""
        handle = _lib.hir_input_scalar(self._of())
        if not handle:
            self._check()
        s = Scalar(handle)
        self.inputs.append(s)  # its place among the inputs
        return s

    def scale(self, op, a, s):
        """a op s, s a Scalar input (an integer known when run), op one of + - * /."""
        if op not in _BINARY:
            raise Error("invalid argument", "scale: unknown op %r; give one of + - * /" % (op,))
        return self._tv(_lib.hir_binary_val(self._of(), _BINARY[op], a._h, s._h))

    def input_sized(self, dtype, sizes):
        """An input of fixed sizes (nvFuser's concrete tensor), checked when run."""
        if dtype not in _DTYPES:
            raise Error("invalid argument", "input_sized: dtype %r; give one of %s" % (dtype, ", ".join(_DTYPES)))
        sizes = list(sizes)
        t = self._tv(_lib.hir_input_sized(self._of(), _DTYPES[dtype], len(sizes), _array(ctypes.c_int64, sizes)))
        t.dtype = dtype
        self.inputs.append(t)
        return t

    def output(self, t):
        self._check(_lib.hir_output(self._of(), t._h))
        self.outputs.append(t)
        return t

    def set(self, a):
        return self._tv(_lib.hir_set(self._of(), a._h))

    def add(self, a, b):
        return self._tv(_lib.hir_add(self._of(), a._h, b._h))

    def sub(self, a, b):
        return self._tv(_lib.hir_sub(self._of(), a._h, b._h))

    def mul(self, a, b):
        return self._tv(_lib.hir_mul(self._of(), a._h, b._h))

    def matmul(self, a, b):
        return self._tv(_lib.hir_matmul(self._of(), a._h, b._h))

    def sum(self, a, axes):
        axes = list(axes)
        return self._tv(_lib.hir_sum(self._of(), a._h, len(axes), _array(ctypes.c_int, axes)))

    def max(self, a, axes):
        """The largest element over axes (-inf over an empty one, NaN where one is NaN)."""
        axes = list(axes)
        return self._tv(_lib.hir_max(self._of(), a._h, len(axes), _array(ctypes.c_int, axes)))

    def iota(self, like, axis, dtype="float32"):
        """Each element's index along logical axis `axis` of `like`, shaped and sharded as like."""
        if dtype not in _BUILD_DTYPES:
            raise Error("invalid argument", "iota: dtype %r; give one of %s" % (dtype, ", ".join(_BUILD_DTYPES)))
        return self._tv(_lib.hir_iota(self._of(), like._h, axis, _BUILD_DTYPES[dtype]))

    def sdpa(self, q, k, v, scale=0.0, causal=False, dropout=0.0, seed=0, logsumexp=False):
        """torch's scaled_dot_product_attention of q [..., L, E], k [..., S, E], v [..., S, Ev]
        (scale 0: 1/sqrt(E)); with logsumexp, (out, the softmax rows' logsumexp [..., L] in float32)."""
        desc = _SdpaDesc(float(scale), 1 if causal else 0, float(dropout), self._seed(seed) if dropout else None)
        lse = ctypes.c_void_p()
        out = self._tv(_lib.hir_sdpa(self._of(), q._h, k._h, v._h, ctypes.byref(desc),
                                     ctypes.byref(lse) if logsumexp else None))
        return (out, self._tv(lse.value)) if logsumexp else out

    def broadcast(self, a, is_broadcast):
        flags = [1 if x else 0 for x in is_broadcast]
        return self._tv(_lib.hir_broadcast(self._of(), a._h, len(flags), _array(ctypes.c_int, flags)))

    def div(self, a, b):
        return self._tv(_lib.hir_div(self._of(), a._h, b._h))

    def lt(self, a, b):
        """1 where a < b, else 0, in a's dtype (a dropout's mask)."""
        return self._tv(_lib.hir_lt(self._of(), a._h, b._h))

    def _seed(self, seed):
        if isinstance(seed, Scalar):
            return seed._h
        handle = _lib.hir_val_const(self._of(), seed)
        if not handle:
            self._check()
        return handle

    def rand(self, like, dtype="float32", seed=0):
        """Uniform numbers in [0, 1) shaped and sharded like `like`: element i of the whole tensor is
        Philox-4x32-10's number i for `seed` (an int, or a Scalar input for a new draw each run)."""
        if dtype not in _BUILD_DTYPES:
            raise Error("invalid argument", "rand: dtype %r; give one of %s" % (dtype, ", ".join(_BUILD_DTYPES)))
        return self._tv(_lib.hir_rand(self._of(), like._h, _BUILD_DTYPES[dtype], self._seed(seed)))

    def uniform(self, like, low, high, dtype="float32", seed=0):
        """low + (high - low) * rand(like, dtype, seed)."""
        if dtype not in _BUILD_DTYPES:
            raise Error("invalid argument", "uniform: dtype %r; give one of %s" % (dtype, ", ".join(_BUILD_DTYPES)))
        return self._tv(_lib.hir_uniform(self._of(), like._h, _BUILD_DTYPES[dtype], float(low), float(high), self._seed(seed)))

    def unary(self, op, a):
        """op: one of neg abs relu sin cos exp log tanh sqrt rsqrt reciprocal sigmoid silu gelu gelu_tanh."""
        if op not in _UNARY:
            raise Error("invalid argument", "unary: unknown op %r; give one of %s" % (op, " ".join(_UNARY)))
        return self._tv(_lib.hir_unary(self._of(), _UNARY[op], a._h))

    def cast(self, a, dtype):
        if dtype not in _BUILD_DTYPES:
            raise Error("invalid argument", "cast: dtype %r; give one of %s" % (dtype, ", ".join(_BUILD_DTYPES)))
        return self._tv(_lib.hir_cast(self._of(), a._h, _BUILD_DTYPES[dtype]))

    def scalar(self, op, a, s, scalar_first=False):
        """a op s (scalar_first: s op a), op one of + - * / < (1 where it holds, else 0)."""
        if op not in _BINARY:
            raise Error("invalid argument", "scalar: unknown op %r; give one of + - * / <" % (op,))
        if scalar_first:
            return self._tv(_lib.hir_scalar_binary(self._of(), _BINARY[op], float(s), a._h))
        return self._tv(_lib.hir_binary_scalar(self._of(), _BINARY[op], a._h, float(s)))

    def permute(self, a, perm):
        perm = list(perm)
        return self._tv(_lib.hir_permute(self._of(), a._h, _array(ctypes.c_int, perm)))

    def select(self, a, axis, index):
        return self._tv(_lib.hir_select(self._of(), a._h, axis, index))

    def slice(self, a, axis, start, stop=None, step=1):
        """a[..., start:stop:step, ...] along `axis`, as Python slices: negative bounds count
        from the end, stop None is the end; the range must lie in the axis (checked at run)."""
        return self._tv(_lib.hir_slice_step(self._of(), a._h, axis, start, _END if stop is None else stop, step))

    def reshape(self, a, sizes):
        """sizes: a size per axis, 0 to keep the input's axis there, -1 for the one inferred."""
        sizes = list(sizes)
        return self._tv(_lib.hir_reshape(self._of(), a._h, len(sizes), _array(ctypes.c_int64, sizes)))

    def mean(self, a, axes):
        axes = list(axes)
        return self._tv(_lib.hir_mean(self._of(), a._h, len(axes), _array(ctypes.c_int, axes)))

    def linear(self, a, weight, bias=None):
        """torch.nn.functional.linear: a [..., K] x weight [N, K] transposed, plus bias [N]."""
        return self._tv(_lib.hir_linear(self._of(), a._h, weight._h, bias._h if bias else None))

    def scaled_linear(self, a, weight, a_scale, w_scale, out="bfloat16"):
        """torch._scaled_mm's fp8 linear: (a * a_scale) x (weight * w_scale) transposed, in `out`."""
        if out not in ("float32", "float16", "bfloat16"):
            raise Error("invalid argument", "scaled_linear: out %r; give float32, float16 or bfloat16" % (out,))
        return self._tv(_lib.hir_scaled_linear(self._of(), a._h, weight._h, a_scale._h, w_scale._h, _BUILD_DTYPES[out]))

    def layer_norm(self, a, naxes, weight=None, bias=None, eps=1e-5):
        return self._tv(_lib.hir_layer_norm(self._of(), a._h, naxes, weight._h if weight else None,
                                            bias._h if bias else None, eps))

    def rms_norm(self, a, naxes, weight=None, eps=1e-5):
        """a / sqrt(mean(a^2) + eps) * weight over the last naxes axes (torch.nn.functional.rms_norm)."""
        return self._tv(_lib.hir_rms_norm(self._of(), a._h, naxes, weight._h if weight else None, eps))

    def __str__(self):
        return _text(_lib.hir_fusion_snprint, self._of())

    def lower(self, device=0, schedule="linear", parts=0, bounded=False, serial=False):
        """The host program of one device (hir_lower). schedule "collective":
        P2P pipelines as collective pipelines of `parts` parts; "gather": each
        P2P allgather a ring of its own, the ops reading what it gathers run
        once, whole, after it (stream.gather_first: a decode-size GEMM reads
        its weight once); "split": a ring whose GEMMs on the gathered chunks
        compute the first half of their columns in it and the second half
        after it, every row at once (stream.experimental.column_parts = 2)."""
        schedules = ("linear", "ring", "collective", "gather", "split")
        if schedule not in schedules:
            raise Error("invalid argument",
                        "lower: schedule %r; give 'linear', 'ring', 'collective', 'gather' or 'split'" % (schedule,))
        out = ctypes.c_void_p()
        code = _lib.hx_lower(self._of(), device, schedules.index(schedule), parts, int(bounded), int(serial), 0, None, None, 0,
                             ctypes.byref(out))
        prog = Program(out.value)
        if code:
            msg = _lib.hir_program_error(out.value).decode() if out.value else "out of memory"
            raise Error(_status(code), msg)
        return prog


class Program:
    """A lowered host program (hir_program): print it, read its plan."""

    def __init__(self, handle):
        self._h = handle

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.hir_program_free(self._h)
            self._h = None

    def __str__(self):
        return _text(_lib.hir_program_snprint, self._h)

    @property
    def plan(self):
        return _lib.hir_program_plan(self._h).decode()


def ag_matmul_fusion(world, dtype="float32", nb=1, gathered=True):
    """The all-gather matmul of `world` devices in one pipeline: A [D (DIDx),
    m, K] (each device passes its rows as [1, m, K]) gathered, and multiplied
    by each B_i [K, N_i]. Outputs: the gathered A [D, m, K] when `gathered`,
    then C_i [D, m, N_i], chunk by chunk on streams (nvFuser's
    AG_matmul_P2p): each received chunk of A feeds every B_i."""
    f = Fusion()
    a = f.input(dtype, 3)
    bs = [f.input(dtype, 2) for _ in range(nb)]
    g = f.set(a) if gathered else a
    cs = [f.matmul(g, b) for b in bs]
    if gathered:
        f.output(g)
    for t in [a, g] + bs + [f.output(c) for c in cs]:
        t.mesh(range(world))
    a.parallelize(0, "DIDx")
    for t in ([g] if gathered else []) + cs:
        t.parallelize(0, "Stream")
    return f


def ag_scaled_fusion(world, a_dtype, w_dtypes, out_dtypes, rowwise_a, rowwise_ws, gathered=True):
    """The fp8 all-gather linear of `world` devices in one pipeline: A [D
    (DIDx), m, K] and its scale (one value, or [D (DIDx), m] when
    `rowwise_a`) gathered, each weight W_i [N_i, K] with its scale (one value,
    or [N_i]): C_i [D, m, N_i] = scaled_linear, chunk by chunk on streams.
    Inputs: A, the W_i, A's scale, the W_i's scales; outputs: the gathered A
    when `gathered`, then the C_i."""
    f = Fusion()
    a = f.input(a_dtype, 3)
    ws = [f.input(dt, 2) for dt in w_dtypes]
    sa = f.input("float32", 2) if rowwise_a else f.input_sized("float32", [1])
    sws = [f.input("float32", 1) if r else f.input_sized("float32", [1]) for r in rowwise_ws]
    g = f.set(a) if gathered else a
    cs = [f.scaled_linear(g, w, sa, sw, out=o) for w, sw, o in zip(ws, sws, out_dtypes)]
    if gathered:
        f.output(g)
    for t in [a, g, sa] + ws + sws + [f.output(c) for c in cs]:
        t.mesh(range(world))
    a.parallelize(0, "DIDx")
    if rowwise_a:
        sa.parallelize(0, "DIDx")
    for t in ([g] if gathered else []) + cs:
        t.parallelize(0, "Stream")
    return f


def scaled_rs_fusion(world, a_dtype, w_dtype, out_dtype, rowwise_a, rowwise_w):
    """The fp8 matmul reduce-scatter of `world` devices in one pipeline:
    each device's A [1 (DIDx), D, m, k] (its part of K) and weight [1
    (DIDx), N, k], scaled by A's scale (one value, or [1 (DIDx), D, m] when
    `rowwise_a`) and the weight's (one value, or [1 (DIDx), N]), the
    partial products in `out_dtype` (as torch's fused op and Transformer
    Engine reduce them) chunk by chunk on streams, summed over the devices,
    device j receiving rows j: C [D (DIDx), m, N]."""
    f = Fusion()
    a, w = f.input(a_dtype, 4), f.input(w_dtype, 3)
    sa = f.input("float32", 3) if rowwise_a else f.input_sized("float32", [1])
    sw = f.input("float32", 2) if rowwise_w else f.input_sized("float32", [1])
    p = f.scaled_linear(a, f.broadcast(w, [False, True, False, False]), sa,
                        f.broadcast(sw, [False, True, False]) if rowwise_w else sw, out=out_dtype)
    c = f.output(f.sum(p, [0]))
    for t in (a, w, sa, sw, c):
        t.mesh(range(world))
    for t in (a, w) + ((sa,) if rowwise_a else ()) + ((sw,) if rowwise_w else ()):
        t.parallelize(0, "DIDx")
    p.parallelize(1, "Stream")
    c.parallelize(1, "DIDx")
    return f


def matmul_rs_fusion(world, dtype="float32"):
    """The matmul reduce-scatter of `world` devices in one pipeline: each
    device's A [1 (DIDx), D, m, k] x B [1 (DIDx), k, N], summed over the
    devices, device j receiving rows j: C [D (DIDx), m, N] (passed as
    [1, m, N]); the products chunk by chunk on streams, each sent as it is
    done (the P2P reduce-scatter)."""
    f = Fusion()
    a, b = f.input(dtype, 4), f.input(dtype, 3)
    p = f.matmul(a, f.broadcast(b, [False, True, False, False]))
    c = f.output(f.sum(p, [0]))
    for t in (a, b, c):
        t.mesh(range(world))
    a.parallelize(0, "DIDx")
    b.parallelize(0, "DIDx")
    p.parallelize(1, "Stream")
    c.parallelize(1, "DIDx")
    return f


def matmul_ar_fusion(world, dtype="float32"):
    """The GEMM and all-reduce of a row-parallel linear, on logical shapes:
    C = A [M, K] x B [K, N] with K split by the `world` devices (each holds
    A [M, K/D] and B [K/D, N], DIDx on K's outer part), C [M, N] whole on
    every device: the local products summed by an all-reduce."""
    f = Fusion()
    a, b = f.input(dtype, 2), f.input(dtype, 2)
    c = f.output(f.matmul(a, b))
    for t in (a, b, c):
        t.mesh(range(world))
    a.split(1, world)
    a.parallelize(1, "DIDx")
    b.parallelize(0, "DIDx")
    return f


def ar_rms_norm_fusion(world, dtype="float32", weighted=True, eps=1e-6):
    """A decode step's all-reduce, residual add and RMSNorm: each device's
    partial sums X [M, N] (X [D, M, N], DIDx on D) summed, h = that +
    residual, out = rms_norm(h) * weight (weighted), h and out whole on
    every device. The evaluator runs the three as one call of the
    communicator where it offers one (the plan says so)."""
    f = Fusion()
    x, r = f.input(dtype, 3), f.input(dtype, 2)
    w = f.input(dtype, 1) if weighted else None
    y = f.sum(x, [0])
    h = f.output(f.add(y, r))
    f.output(f.rms_norm(h, 1, w, eps))
    for t in (x, r, w, y):
        if t is not None:
            t.mesh(range(world))
    x.parallelize(0, "DIDx")
    return f


def _as_tensor(x):
    if x is None:
        return _HirTensor(), None
    if isinstance(x, (int, bool, np.integer, np.bool_)):  # a scalar input: by value
        t = _HirTensor()
        t.sizes[0] = _integer(int(x), ctypes.c_int64)
        return t, None
    arr = np.asarray(x)
    if arr.dtype.name not in _DTYPES:
        raise Error("invalid argument", "run: an input is %s; hostir takes %s" % (arr.dtype.name, ", ".join(_DTYPES)))
    if arr.ndim > _MAX_DIMS:
        raise Error("invalid argument", "run: an input has %d axes; hostir takes at most %d" % (arr.ndim, _MAX_DIMS))
    if any(s < 0 or s % arr.itemsize for s in arr.strides) or (arr.size > 1 and not any(arr.strides)):
        arr = np.ascontiguousarray(arr)  # hostir takes element strides >= 0 (a transpose, say); all 0 would mean dense
    t = _HirTensor()
    t.data, t.dtype, t.ndims = arr.ctypes.data, _DTYPES[arr.dtype.name], arr.ndim
    for k, n in enumerate(arr.shape):
        t.sizes[k] = n
        t.strides[k] = arr.strides[k] // arr.itemsize
    return t, arr


def run(fusion, inputs, world=None, streams=0, schedule="linear", parts=0, timeout_ms=60000, tune=False, plans=None):
    """Runs the fusion on `world` in-process ranks (threads; default: one per
    entry of `inputs`): inputs[r] holds rank r's arrays, in the fusion's input
    order (None where an input does not live on r). Returns each rank's
    outputs as numpy arrays (None where one does not live there). A failure
    on any rank - hostir's, or a Python exception of a rank's thread - is
    raised here, the cause first, and ends the other ranks' waits at once
    (as a failing C rank does). tune=True measures the
    schedules on the ranks first (hir_tuner; streams, schedule and parts are
    then its choice); a list passed as `plans` receives each rank's plan."""
    n = _integer(world or len(inputs), ctypes.c_int)
    if len(inputs) != n:
        raise Error("invalid argument", "run: %d ranks but inputs for %d" % (n, len(inputs)))
    for r, given in enumerate(inputs):
        if not isinstance(given, (list, tuple)):
            raise Error("invalid argument", "run: inputs[%d] is %s; give a list of rank %d's arrays (None for an input "
                        "that does not live there)" % (r, type(given).__name__, r))
    _integer(streams, ctypes.c_int), _integer(timeout_ms, ctypes.c_int), _integer(parts, ctypes.c_int)
    w = _lib.hir_local_world_create(n)
    if not w:
        raise MemoryError("hostir: out of memory")
    _lib.hir_local_world_set_timeout(w, timeout_ms)
    results, errors = [None] * n, [None] * n
    if plans is not None:
        plans[:] = [None] * n

    def rank(r):
        ev, tuner, prog = ctypes.c_void_p(), ctypes.c_void_p(), None
        try:
            if tune:
                code = _lib.hx_tuner_create(fusion._h, r, None, _lib.hir_local_comm(w, r), timeout_ms, 3, 0,
                                            ctypes.byref(tuner))
                if code:
                    raise Error(_status(code), _lib.hir_tuner_error(tuner.value).decode() if tuner.value else "out of memory")
            else:
                prog = fusion.lower(device=r, schedule=schedule, parts=parts)
                code = _lib.hx_evaluator_create(prog._h, None, _lib.hir_local_comm(w, r), streams, timeout_ms, 0,
                                                ctypes.byref(ev))
                if code:
                    raise Error(_status(code), _lib.hir_evaluator_error(ev.value).decode() if ev.value else "out of memory")
            if len(inputs[r]) != len(fusion.inputs):
                raise Error("invalid argument", "run: rank %d gives %d inputs; the fusion takes %d"
                            % (r, len(inputs[r]), len(fusion.inputs)))
            held = [_as_tensor(x) for x in inputs[r]]  # kept alive through the run
            ins = (_HirTensor * max(1, len(held)))(*[h[0] for h in held])
            outs = (_HirTensor * max(1, len(fusion.outputs)))()
            if tune:
                code = _lib.hir_tuner_run(tuner.value, ins, len(held), outs, len(fusion.outputs))
                code = code or _lib.hir_tuner_sync(tuner.value)
                if code:
                    raise Error(_status(code), _lib.hir_tuner_error(tuner.value).decode())
                if plans is not None:
                    plans[r] = _lib.hir_program_plan(_lib.hir_tuner_program(tuner.value)).decode()
            else:
                code = _lib.hir_run(ev.value, ins, len(held), outs, len(fusion.outputs))
                code = code or _lib.hir_evaluator_sync(ev.value)
                if code:
                    raise Error(_status(code), _lib.hir_evaluator_error(ev.value).decode())
                if plans is not None:
                    plans[r] = prog.plan
            got = []
            for o in outs[:len(fusion.outputs)]:
                if not o.data:
                    got.append(None)
                    continue
                shape = tuple(o.sizes[k] for k in range(o.ndims))
                steps = tuple(o.strides[k] for k in range(o.ndims))  # a layout asked for (allocation_loop) is strided
                span = 1 + sum((n - 1) * s for n, s in zip(shape, steps)) if all(shape) else 1
                if o.dtype not in _NUMPY:
                    raise Error("unsupported", "run: output %d is %s, which numpy has no type for; cast it to float32 in "
                                "the fusion" % (len(got), _lib.hir_dtype_name(o.dtype).decode()))
                ctype = {0: ctypes.c_float, 1: ctypes.c_double, 2: ctypes.c_uint16, 6: ctypes.c_int64}[o.dtype]
                raw = np.ctypeslib.as_array((ctype * span).from_address(o.data)).view(_NUMPY[o.dtype])
                arr = np.lib.stride_tricks.as_strided(raw, shape, tuple(s * raw.itemsize for s in steps))
                got.append(np.array(arr))  # copied: the evaluator's buffer lives until it goes
            results[r] = got
        except BaseException as e:  # noqa: B036 - every failure of a rank is the caller's, and the others must hear of it
            errors[r] = e
            _lib.hx_comm_abort(_lib.hir_local_comm(w, r),
                               ("rank %d failed: %s" % (r, e if isinstance(e, Error) else "%s: %s" % (type(e).__name__, e)))
                               .encode(errors="replace")[:400])
        finally:
            if ev.value:
                _lib.hir_evaluator_free(ev.value)
            if tuner.value:
                _lib.hir_tuner_free(tuner.value)  # after the outputs were copied out of its buffers

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _lib.hir_local_world_free(w)
    failed = [e for e in errors if e is not None]
    if failed:  # the first rank's own failure (a Python exception is one), else the first message
        raise min(failed, key=lambda e: isinstance(e, Error) and ("world was aborted" in str(e) or "failed while" in str(e)))
    return results
