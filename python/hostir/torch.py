"""hostir's fused ops for PyTorch, with the meaning and argument order of
torch's symmetric-memory ops, so one can be swapped for the other:

    from hostir.torch import all_gather_matmul, matmul_reduce_scatter
    a, (c,) = all_gather_matmul(a_shard, [b], gather_dim=0)    # group=None: the default group
    c_shard = matmul_reduce_scatter(a, b, "sum", scatter_dim=0)

all_gather_matmul(a_shard, bs, gather_dim, group=None, return_A=True)
    All of a_shard's ranks' shards, gathered along gather_dim, times each
    B of bs: (the gathered A, or None; [A @ B for B in bs]), as torch's
    fused_all_gather_matmul. One pipeline: each received chunk of A feeds
    every B.
matmul_reduce_scatter(a, b, reduce_op, scatter_dim, group=None)
    a @ b summed ("sum") or averaged ("avg") over the group's ranks, rank r
    keeping part r along scatter_dim, as torch's fused_matmul_reduce_scatter.

Both are torch.library ops (torch.ops.hostir.*), with fake kernels,
so they run under torch.compile and inside CUDA graphs, and autograd: the
backward of one is the other, both through hostir. They run on CUDA tensors
of an NCCL process group (one process per GPU: torchrun, mpirun, srun). The
group hands hostir NCCL's id, once (torch.distributed broadcasts it; hostir
opens no port of its own); send/recv between GPUs of one host run on their
copy engines. On CPU tensors they run a group of one rank (or no process
group) or of threads (torch's threaded process group), which is what tests
without GPUs can check.

A plan is lowered per input shape (hostir's cost model chooses pipeline or
serial; set_options(tune=True) measures the candidates on the ranks
instead) and kept. A CUDA graph captures a shape that has already run
(torch.cuda.graph's warm-up runs do that); inside a capture, send/recv run
on NCCL (hostir captures its copy-engine send/recv in its own graph mode,
not yet tried inside torch's captures). Errors raise
hostir.Error with hostir's message.
"""
import atexit
import ctypes
import threading
import torch
import torch.distributed as dist

from . import (Error, _HirTensor, _lib, _status, ag_matmul_fusion, ag_scaled_fusion, ar_rms_norm_fusion, matmul_ar_fusion,
               matmul_rs_fusion, scaled_rs_fusion)

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm", "all_gather_scaled_matmul",
           "scaled_matmul_reduce_scatter", "run", "set_options", "plan", "shutdown"]

_DTYPES_OF = {0: torch.float32, 1: torch.float64, 2: torch.float16, 3: torch.bfloat16,  # by hir_dtype
              4: torch.float8_e4m3fn, 5: torch.float8_e5m2}  # fp8: run() and the scaled op only
_CODES = {v: k for k, v in _DTYPES_OF.items()}
_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
          torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
_options = {"tune": False, "plan": "auto", "streams": 0, "timeout_ms": 60000, "cache": 16}
_lock = threading.RLock()
_NOT_WARM = ("hostir.torch: a CUDA graph is being captured and this op has not run yet with these shapes; run it once "
             "before capturing (torch.cuda.graph's warm-up runs, torch.compile's warm-up)")
_groups = {}  # (group name, device type, index[, rank: a thread's]) -> _Group
# A CUDA call seen before (its operands' shapes, strides, dtypes, devices, its
# group and arguments) -> (its plan, its outputs' shapes, dtype, device): the
# call skips the checks and lookups that passed then. Emptied (_forget)
# whenever a plan is freed, the options change or a group's capture state.
_fast = {}
try:  # the same in C++, where the package was built against torch: a few microseconds a call
    from . import _torch_fast
    _torch_fast.setup(Error, *[ctypes.cast(getattr(_lib.raw, name), ctypes.c_void_p).value for name in (
        "hir_run", "hir_tuner_run", "hir_evaluator_error", "hir_tuner_error", "hir_status_str",
        "hir_backend_cuda_set_stream", "hx_stream_capturing")])
except (ImportError, AttributeError):  # not built, built for another torch, or a package without CUDA
    _torch_fast = None


def _forget(plan=None):
    """Forgets the calls seen that run `plan` (None: every call)."""
    for key in [key for key, hit in _fast.items() if plan is None or hit[0] is plan]:
        del _fast[key]
    if _torch_fast is not None:
        _torch_fast.forget(None if plan is None else plan.tuner.value or plan.ev.value)


def set_options(tune=None, plan=None, streams=None, timeout_ms=None, cache=None):
    """tune: measure the candidate schedules on the ranks at each new shape
    (hir_tuner) instead of taking plan's; plan: "auto" (hostir's cost model
    chooses pipeline or serial), "pipeline" (the P2P ring, always) or
    "serial"; streams: the evaluator's streams (0: hostir's default);
    timeout_ms: how long a rank waits for the others before failing; cache:
    plans kept per group (a plan a CUDA graph captured is never dropped: the
    graph uses its buffers). Applies to plans made after the call; set them
    alike on every rank."""
    if plan not in (None, "auto", "pipeline", "serial"):
        _fail("hostir.torch.set_options: plan %r; give 'auto', 'pipeline' or 'serial'" % (plan,))
    for key, value in (("tune", tune), ("plan", plan), ("streams", streams), ("timeout_ms", timeout_ms), ("cache", cache)):
        if value is not None:
            _options[key] = value
    _forget()


def _fail(message):
    raise Error("invalid argument", message)


def _group_of(group_name):
    if not group_name:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name)


def _group_size(group_name):
    if not group_name or not dist.is_initialized():
        return 1
    return dist.get_world_size(_group_of(group_name))


def _group_name(group):
    if group is None:
        if not dist.is_initialized():
            return ""
        group = dist.group.WORLD
    return group.group_name


def _view(shape, strides, dtype):
    t = _HirTensor()
    t.dtype, t.ndims = _CODES[dtype], len(shape)
    for k, (n, s) in enumerate(zip(shape, strides)):
        t.sizes[k], t.strides[k] = n, s
    return t


class _Plan:
    """One evaluator (or tuner) for one op and one set of input shapes; its
    hir_tensor arrays made once, the data pointers set per call."""

    def __init__(self, group, fusion, ins, outs):
        self.group, self.fusion = group, fusion
        self.ins = (_HirTensor * len(ins))(*ins)
        self.outs = (_HirTensor * len(outs))(*outs)
        self.nin, self.nout = len(ins), len(outs)
        self.ev, self.tuner, self.prog, self.warm, self.captured = ctypes.c_void_p(), ctypes.c_void_p(), None, False, False
        g = group
        if _options["tune"]:
            code = _lib.hx_tuner_create(fusion._h, g.rank, g.backend, g.comm, _options["timeout_ms"], 0, 0,
                                        ctypes.byref(self.tuner))
            if code:
                raise Error(_status(code), _lib.hir_tuner_error(self.tuner.value).decode() if self.tuner.value
                            else "out of memory")
            return
        out = ctypes.c_void_p()
        mode = _options["plan"]
        code = _lib.hx_lower(fusion._h, g.rank, mode == "pipeline", 0, 0, mode == "serial", mode == "auto", g.comm, self.ins,
                             self.nin, ctypes.byref(out))
        from . import Program
        self.prog = Program(out.value)
        if code:
            raise Error(_status(code), _lib.hir_program_error(out.value).decode() if out.value else "out of memory")
        code = _lib.hx_evaluator_create(out.value, g.backend, g.comm, _options["streams"], _options["timeout_ms"], 0,
                                        ctypes.byref(self.ev))
        if code:
            raise Error(_status(code), _lib.hir_evaluator_error(self.ev.value).decode() if self.ev.value
                        else "out of memory")

    def run(self, ins, outs):
        """ins and outs: tensors (outs None: the evaluator's buffers, read
        back from self.outs after the run)."""
        for k, t in enumerate(ins):
            if t is not None:  # None: a scalar input, given by value in its view, or an input not on this rank
                self.ins[k].data = t.data_ptr()
        for k, t in enumerate(outs):
            self.outs[k].data = t.data_ptr() if t is not None else None
        g = self.group
        if g.cuda:
            capturing = torch._C._cuda_isCurrentStreamCapturing()
            if capturing and not self.warm:  # made, but its first run failed: it would allocate now
                _fail(_NOT_WARM)
            # hostir's work goes on torch's current stream (cheap when it is the backend's already)
            _lib.hir_backend_cuda_set_stream(g.backend, torch._C._cuda_getCurrentRawStream(g.device))
            if capturing != g.capturing:
                g.set_capturing(capturing)
            self.captured |= capturing
        if self.tuner.value:
            code = _lib.hir_tuner_run(self.tuner.value, self.ins, self.nin, self.outs, self.nout)
            if code == 0 and not g.cuda:
                code = _lib.hir_tuner_sync(self.tuner.value)
            if code:
                raise Error(_status(code), _lib.hir_tuner_error(self.tuner.value).decode())
        else:
            code = _lib.hir_run(self.ev.value, self.ins, self.nin, self.outs, self.nout)
            if code == 0 and not g.cuda:  # on the GPU the run is ordered on torch's stream like any kernel
                code = _lib.hir_evaluator_sync(self.ev.value)
            if code:
                raise Error(_status(code), _lib.hir_evaluator_error(self.ev.value).decode())
        self.warm = True

    def plan(self):
        if self.tuner.value:
            prog = _lib.hir_tuner_program(self.tuner.value)
            return _lib.hir_program_plan(prog).decode() if prog else ""
        return self.prog.plan if self.prog else ""

    def free(self):
        if self.ev.value:
            _lib.hir_evaluator_free(self.ev.value)
            self.ev.value = None
        if self.tuner.value:
            _lib.hir_tuner_free(self.tuner.value)
            self.tuner.value = None


class _Group:
    """hostir's communicator and backend for one process group on one device,
    and the plans made on them."""

    def __init__(self, group_name, device):
        self.cuda = device.type == "cuda"
        self.size, self.rank = _group_size(group_name), 0
        self.comm = self.world = self.backend = None
        self.capturing, self.copy_engine, self.device = False, False, device.index
        self.plans, self.fusions = {}, {}
        if group_name and dist.is_initialized():
            self.rank = dist.get_rank(_group_of(group_name))
        if not self.cuda:
            if self.size > 1 and dist.get_backend(_group_of(group_name)) != "threaded":
                _fail("hostir.torch: CPU tensors on a group of %d processes; hostir runs CPU tensors on a group of one "
                      "rank, or of threads (torch's threaded process group): use CUDA tensors with an NCCL group"
                      % self.size)
            self.world = _shared_world(group_name, self.size)  # the ranks' threads share hostir's local world
            self.comm = _lib.hir_local_comm(self.world.handle, self.rank)
            return
        if not _lib.hx_has_cuda():
            _fail("hostir.torch: CUDA tensors, but this hostir package was built without CUDA and NCCL; reinstall it "
                  "where nvcc and nccl.h are found (pip install ./python)")
        idx = self.device = device.index if device.index is not None else torch.cuda.current_device()
        self.backend = _lib.hir_backend_cuda_create(idx)
        if not self.backend:
            _fail("hostir.torch: GPU %d cannot be used by hostir's CUDA backend" % idx)
        size = _lib.hx_nccl_id_bytes()
        nccl_id = ctypes.create_string_buffer(size)
        held = [None]
        if self.rank == 0:
            if _lib.hx_nccl_unique_id(nccl_id):
                _fail("hostir.torch: ncclGetUniqueId failed on the group's rank 0")
            held[0] = nccl_id.raw
        pg = _group_of(group_name) if group_name else None
        if self.size > 1:  # the group carries NCCL's id: no port of hostir's own
            dist.broadcast_object_list(held, src=dist.get_global_rank(pg, 0), group=pg)
        comm = ctypes.c_void_p()
        code = _lib.hx_nccl_comm_from_id(self.rank, self.size, idx, held[0], _options["timeout_ms"], ctypes.byref(comm))
        self.comm = comm.value
        if code:
            message = _lib.hx_comm_error(self.comm).decode()
            self.free()
            raise Error(_status(code), message)
        self.copy_engine = bool(_lib.hx_comm_copy_engine(self.comm))

    def set_capturing(self, capturing):
        """Inside a CUDA graph capture send/recv run on NCCL (the copy
        engines' captured path is not yet tried under torch's capture
        modes). Every rank captures the same ops, so every rank switches
        alike."""
        if self.copy_engine:
            code = _lib.hir_nccl_comm_set_copy_engine(self.comm, 0 if capturing else 1)
            if code:
                raise Error(_status(code), _lib.hx_comm_error(self.comm).decode())
        self.capturing = capturing
        _forget()  # calls remembered outside a capture would keep this state

    def plan_for(self, key, make_fusion, make_views):
        key += (_options["tune"], _options["plan"], _options["streams"])
        entry = self.plans.get(key)
        if entry is None:
            if self.cuda:  # a plan is lowered for the copy engines' state outside a capture, and never inside one
                if torch._C._cuda_isCurrentStreamCapturing():  # (its evaluator allocates: the capture would fail)
                    _fail(_NOT_WARM)
                if self.capturing:
                    self.set_capturing(False)
            ins, outs = make_views()
            fusion = self.fusions.get(key[:3]) if key[0] != "fusion" else make_fusion()  # a caller's fusion: not kept
            if fusion is None:
                fusion = self.fusions[key[:3]] = make_fusion()
            entry = _Plan(self, fusion, ins, outs)
            if len(self.plans) >= _options["cache"]:  # the oldest plan goes, unless a graph holds its buffers
                oldest = next((k for k, e in self.plans.items() if not e.captured), None)
                if oldest is not None:
                    _forget(self.plans[oldest])
                    self.plans.pop(oldest).free()
            self.plans[key] = entry
        return entry

    def free(self):
        _forget()
        for entry in self.plans.values():
            entry.free()
        self.plans = {}
        if self.world:
            self.world.release()
        elif self.comm:
            _lib.hir_nccl_comm_free(self.comm)
        if self.backend:
            _lib.hir_backend_free(self.backend)
        self.comm = self.world = self.backend = None


def shutdown():
    """Frees hostir's plans, communicators and backends (each process's
    own; the next op makes them again). Call it, if at all, once torch's
    CUDA graphs that captured hostir's ops are gone: NCCL frees a
    communicator only after the graphs that captured it."""
    with _lock:
        for g in _groups.values():
            g.free()
        _groups.clear()


@atexit.register
def _at_exit():
    """At exit the CPU groups go (plans, the threads' local worlds); what
    lives on the GPUs is left to the process's end: torch's graphs that
    captured hostir's ops (torch.compile's cudagraph trees keep theirs to
    the end) would hold an NCCL communicator's free forever."""
    with _lock:
        for key in [key for key, g in _groups.items() if not g.cuda]:
            _groups.pop(key).free()


class _World:
    """hostir's local world shared by the threads of a threaded group (one
    rank each), freed when the last rank lets go."""

    def __init__(self, name, size):
        self.name, self.handle, self.users = name, _lib.hir_local_world_create(size), 0
        if not self.handle:
            raise MemoryError("hostir: out of memory")
        _lib.hir_local_world_set_timeout(self.handle, _options["timeout_ms"])

    def release(self):
        with _lock:
            self.users -= 1
            if self.users == 0:
                _worlds.pop(self.name, None)
                _lib.hir_local_world_free(self.handle)


_worlds = {}


def _shared_world(group_name, size):
    with _lock:
        w = _worlds.get(group_name)
        if w is None:
            w = _worlds[group_name] = _World(group_name, size)
        w.users += 1
        return w


def _group_key(group_name, device):
    key = (group_name, device.type, device.index)
    if device.type == "cpu" and group_name and dist.is_initialized():  # a threaded group: a rank a thread
        key += (dist.get_rank(_group_of(group_name)),)
    return key


def _group_state(group_name, device):
    key = _group_key(group_name, device)
    g = _groups.get(key)
    if g is None:
        with _lock:
            g = _groups.get(key)
            if g is None:
                g = _groups[key] = _Group(group_name, device)
    return g


def _check(what, t, dtype, device):
    if t.dtype != dtype:
        _fail("hostir.torch.%s: %s is %s, the other operands %s; pass one dtype" % (what[0], what[1], t.dtype, dtype))
    if _CODES.get(t.dtype, 4) > 3:
        _fail("hostir.torch.%s: %s is %s; hostir takes float32, float64, float16 and bfloat16" % (what[0], what[1], t.dtype))
    if t.device != device:
        _fail("hostir.torch.%s: %s is on %s, the other operands on %s" % (what[0], what[1], t.device, device))


def _rows(t, dim, what):
    """t with axis `dim` moved first and the others but the last flattened
    into it: [rows, last] (a view where torch can make one, else a copy)."""
    if t.dim() < 2:
        _fail("hostir.torch.%s: %s has %d dimensions; it needs at least 2" % (what[0], what[1], t.dim()))
    if not -t.dim() <= dim < t.dim():
        _fail("hostir.torch.%s: %s_dim %d is not a dimension of %s, which has %d" % (what[0], what[2], dim, what[1], t.dim()))
    d = dim % t.dim()
    if d == t.dim() - 1:
        _fail("hostir.torch.%s: %s_dim %d is %s's last (contracted) dimension; give one of the others"
              % (what[0], what[2], dim, what[1]))
    if t.dim() == 2:  # rows already: no view to make or undo
        return t, 0, None
    moved = t.movedim(d, 0)
    return moved.reshape(-1, t.shape[-1]), d, list(moved.shape[:-1])


def _restore(t2, rows_shape, last, d):
    return t2.reshape(rows_shape + [last]).movedim(0, d)


# The ops, defined through torch.library's Library: its dispatch costs a
# few microseconds less a call than torch.library.custom_op's wrappers.
_ops = torch.library.Library("hostir", "DEF")
_ops.define("all_gather_matmul(Tensor a_shard, Tensor[] bs, int gather_dim, str group_name) -> Tensor[]")
_ops.define("matmul_reduce_scatter(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group_name) -> Tensor")


def _remember(kind, args, plan, outs, divide_by=0):
    """A call of the op `kind` (0 all_gather_matmul, 1 matmul_reduce_scatter,
    2 all_gather_scaled_matmul, 3 scaled_matmul_reduce_scatter, 4 run) that the Python path just ran with the
    wrapper's arguments `args`, making `outs` (None: left in hostir's
    buffer), for the C++ path to run the next like it (never one made in a
    capture)."""
    if _torch_fast is not None and not plan.group.capturing:
        _torch_fast.remember(kind, *args, plan.tuner.value or plan.ev.value, bool(plan.tuner.value),
                             ctypes.addressof(plan.ins), ctypes.addressof(plan.outs), plan.nin, plan.nout,
                             plan.group.backend, [tuple(t.shape) if t is not None else None for t in outs],
                             [t.dtype if t is not None else torch.float32 for t in outs], divide_by)


def _all_gather_matmul(a_shard, bs, gather_dim, group_name, return_A=True, direct=None):
    """[the gathered A (None unless return_A: it stays in hostir's buffer), A @ B for B in bs];
    direct: (the wrapper's group argument,) when the wrapper called it."""
    fast = None
    if a_shard.is_cuda:
        fast = (a_shard.shape, a_shard.stride(), a_shard.dtype, a_shard.device, gather_dim, group_name, return_A) + tuple(
            x for b in bs for x in (b.shape, b.stride(), b.dtype, b.device))
        hit = _fast.get(fast)
        if hit is not None:
            plan, shapes, dt, device = hit
            outs = [torch.empty(shape, dtype=dt, device=device) if shape else None for shape in shapes]
            plan.run([a_shard] + bs, outs)
            return outs
    what = ("all_gather_matmul", "a_shard", "gather")
    if not bs:
        _fail("hostir.torch.all_gather_matmul: bs is empty; give at least one B")
    for i, b in enumerate(bs):
        _check((what[0], "bs[%d]" % i), b, a_shard.dtype, a_shard.device)
        if b.dim() != 2 or b.shape[0] != a_shard.shape[-1]:
            _fail("hostir.torch.all_gather_matmul: bs[%d] is %s; it must be [K, N] with K = a_shard's last size %d"
                  % (i, list(b.shape), a_shard.shape[-1]))
    _check(what[:2], a_shard, a_shard.dtype, a_shard.device)
    a2, d, rows_shape = _rows(a_shard, gather_dim, what)
    g = _group_state(group_name, a_shard.device)
    D, (m, K), dt = g.size, a2.shape, a_shard.dtype
    key = ("ag", dt, len(bs), a2.shape, a2.stride(), tuple((b.shape, b.stride()) for b in bs))

    def views():
        ins = [_view((1, m, K), (m * a2.stride(0), a2.stride(0), a2.stride(1)), dt)]
        outs = [_view((D, m, K), (m * K, K, 1), dt)] + [_view((D, m, b.shape[1]), (m * b.shape[1], b.shape[1], 1), dt)
                                                        for b in bs]
        return ins + [_view(tuple(b.shape), b.stride(), dt) for b in bs], outs

    plan = g.plan_for(key, lambda: ag_matmul_fusion(D, _NAMES[dt], len(bs), True), views)
    outs = [torch.empty((D * m, K), dtype=dt, device=a_shard.device) if return_A else None]
    outs += [torch.empty((D * m, b.shape[1]), dtype=dt, device=a_shard.device) for b in bs]
    plan.run([a2] + bs, outs)
    if rows_shape is None:  # a 2-D shard gathered along its rows: as they are
        if fast is not None:
            _fast[fast] = (plan, [tuple(t.shape) if t is not None else None for t in outs], dt, a_shard.device)
            if direct is not None:
                _remember(0, (a_shard, bs, gather_dim, direct[0], return_A), plan, outs)
        return outs
    rows_shape = [D * rows_shape[0]] + rows_shape[1:]
    return [_restore(t, rows_shape, t.shape[-1], d) if t is not None else None for t in outs]


@torch.library.register_fake("hostir::all_gather_matmul")
def _(a_shard, bs, gather_dim, group_name):
    shape = list(a_shard.shape)
    shape[gather_dim % a_shard.dim()] *= _group_size(group_name)
    return [a_shard.new_empty(shape)] + [a_shard.new_empty(shape[:-1] + [b.shape[-1]]) for b in bs]


def _matmul_reduce_scatter(a, b, reduce_op, scatter_dim, group_name, direct=None):
    fast = None
    if a.is_cuda:
        fast = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, reduce_op, scatter_dim,
                group_name)
        hit = _fast.get(fast)
        if hit is not None:
            plan, shape, dt, device, D = hit
            c = torch.empty(shape, dtype=dt, device=device)
            plan.run([a, b], [c])
            return c.div_(D) if reduce_op == "avg" else c
    what = ("matmul_reduce_scatter", "a", "scatter")
    if reduce_op not in ("sum", "avg"):
        _fail("hostir.torch.matmul_reduce_scatter: reduce_op %r; give 'sum' or 'avg'" % (reduce_op,))
    _check(what[:2], a, a.dtype, a.device)
    _check((what[0], "b"), b, a.dtype, a.device)
    if b.dim() != 2 or b.shape[0] != a.shape[-1]:
        _fail("hostir.torch.matmul_reduce_scatter: b is %s; it must be [K, N] with K = a's last size %d"
              % (list(b.shape), a.shape[-1]))
    a2, d, rows_shape = _rows(a, scatter_dim, what)
    g = _group_state(group_name, a.device)
    D, (rows, K), N, dt = g.size, a2.shape, b.shape[1], a.dtype
    scattered = a2.shape[0] if rows_shape is None else rows_shape[0]
    if scattered % D:
        _fail("hostir.torch.matmul_reduce_scatter: a's scatter_dim %d has size %d, which the group's %d ranks do not "
              "divide; pad it to a multiple of %d" % (scatter_dim, scattered, D, D))
    m = rows // D
    key = ("rs", dt, 1, a2.shape, a2.stride(), b.shape, b.stride())

    def views():
        return ([_view((1, D, m, K), (rows * a2.stride(0), m * a2.stride(0), a2.stride(0), a2.stride(1)), dt),
                 _view((1, K, N), (K * b.stride(0), b.stride(0), b.stride(1)), dt)], [_view((1, m, N), (m * N, N, 1), dt)])

    plan = g.plan_for(key, lambda: matmul_rs_fusion(D, _NAMES[dt]), views)
    c = torch.empty((m, N), dtype=dt, device=a.device)
    plan.run([a2, b], [c])
    if fast is not None and rows_shape is None:
        _fast[fast] = (plan, (m, N), dt, a.device, D)
        if direct is not None:
            _remember(1, (a, b, reduce_op, scatter_dim, direct[0]), plan, [c], D if reduce_op == "avg" else 0)
    if reduce_op == "avg":
        c.div_(D)
    return c if rows_shape is None else _restore(c, [rows_shape[0] // D] + rows_shape[1:], N, d)


@torch.library.register_fake("hostir::matmul_reduce_scatter")
def _(a, b, reduce_op, scatter_dim, group_name):
    shape = list(a.shape)
    shape[scatter_dim % a.dim()] //= _group_size(group_name)
    return a.new_empty(shape[:-1] + [b.shape[-1]])


def _flat(t):
    return t.reshape(-1, t.shape[-1])


def _ag_setup(ctx, inputs, output):
    a_shard, bs, gather_dim, group_name = inputs
    ctx.save_for_backward(output[0], *bs)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _ag_backward(ctx, grads):
    """C_i = AG(A) B_i: dA = RS(sum_i dC_i B_i^T) (+ RS(d gathered A)), one
    matmul reduce-scatter over the dC_i side by side; dB_i = AG(A)^T dC_i."""
    gathered, *bs = ctx.saved_tensors
    d_gathered, dcs = grads[0], grads[1:]
    used = [i for i, g in enumerate(dcs) if g is not None]
    da = None
    if used:
        dc = torch.cat([dcs[i] for i in used], -1) if len(used) > 1 else dcs[used[0]]
        bt = (torch.cat([bs[i] for i in used], 1) if len(used) > 1 else bs[used[0]]).t()
        da = torch.ops.hostir.matmul_reduce_scatter(dc, bt, "sum", ctx.gather_dim, ctx.group_name)
    if d_gathered is not None:
        rs = _reduce_scatter(d_gathered, ctx.gather_dim, ctx.group_name)
        da = rs if da is None else da + rs
    dbs = [None if dcs[i] is None else _flat(gathered).t() @ _flat(dcs[i]) for i in range(len(bs))]
    return da, dbs, None, None


def _reduce_scatter(t, dim, group_name):
    size = _group_size(group_name)
    if size == 1:
        return t
    moved = t.movedim(dim, 0).contiguous()
    out = moved.new_empty([moved.shape[0] // size] + list(moved.shape[1:]))
    dist.reduce_scatter_tensor(out, moved, group=_group_of(group_name))
    return out.movedim(0, dim)


def _rs_setup(ctx, inputs, output):
    a, b, reduce_op, scatter_dim, group_name = inputs
    ctx.save_for_backward(a, b)
    ctx.reduce_op, ctx.scatter_dim, ctx.group_name = reduce_op, scatter_dim, group_name


def _rs_backward(ctx, dc):
    """C = RS(A B): d(A B) = AG(dC) on every rank, so dA = AG(dC) B^T (one
    all-gather matmul, which also hands back AG(dC)) and dB = A^T AG(dC)."""
    a, b = ctx.saved_tensors
    if ctx.reduce_op == "avg":
        dc = dc / _group_size(ctx.group_name)
    gathered, da = torch.ops.hostir.all_gather_matmul(dc, [b.t()], ctx.scatter_dim, ctx.group_name)
    return da, _flat(a).t() @ _flat(gathered), None, None, None


for _key in ("CPU", "CUDA"):
    _ops.impl("all_gather_matmul", _all_gather_matmul, _key)
    _ops.impl("matmul_reduce_scatter", _matmul_reduce_scatter, _key)
torch.library.register_autograd("hostir::all_gather_matmul", _ag_backward, setup_context=_ag_setup)
torch.library.register_autograd("hostir::matmul_reduce_scatter", _rs_backward, setup_context=_rs_setup)


def _direct(*tensors):
    """Whether a call can skip torch's dispatcher (tens of microseconds of
    host time): plain tensors, no gradient to record, nothing tracing."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True


def all_gather_matmul(a_shard, bs, gather_dim, group=None, return_A=True):
    """torch's fused_all_gather_matmul through hostir: (the gathered A or
    None, [A @ B for B in bs])."""
    if _torch_fast is not None and not torch.compiler.is_compiling():
        done = _torch_fast.call(0, a_shard, bs, gather_dim, group, return_A)
        if done is not None:
            return done
    bs = list(bs)
    if _direct(a_shard, *bs):
        outs = _all_gather_matmul(a_shard, bs, gather_dim, _group_name(group), return_A, (group,))
    else:
        outs = torch.ops.hostir.all_gather_matmul(a_shard, bs, gather_dim, _group_name(group))
    return (outs[0] if return_A else None), list(outs[1:])


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _all_gather_scaled_matmul(a_shard, bs, a_scale, b_scales, gather_dim, group_name, out_codes, direct=None):
    """[the gathered A, the scaled products]; out_codes: the outputs' hir_dtype codes (a schema's ScalarType
    reaches fake kernels as an int); direct: (the wrapper's group, return_A, out_dtypes) when it called."""
    what = ("all_gather_scaled_matmul", "a_shard", "gather")
    out_dtypes = [_DTYPES_OF[c] for c in out_codes]
    if not bs or len(b_scales) != len(bs) or len(out_dtypes) != len(bs):
        _fail("hostir.torch.all_gather_scaled_matmul: %d B's, %d b_scales and %d out_dtypes; give one of each per B"
              % (len(bs), len(b_scales), len(out_dtypes)))
    for i, (b, o) in enumerate(zip(bs, out_dtypes)):
        if b.dtype not in _FP8 or b.dim() != 2 or b.shape[0] != a_shard.shape[-1] or b.device != a_shard.device:
            _fail("hostir.torch.all_gather_scaled_matmul: bs[%d] is %s %s on %s; it must be fp8 [K, N] with K = a_shard's last "
                  "size %d, on %s" % (i, b.dtype, list(b.shape), b.device, a_shard.shape[-1], a_shard.device))
        if o not in (torch.float32, torch.float16, torch.bfloat16):
            _fail("hostir.torch.all_gather_scaled_matmul: out_dtypes[%d] is %s; give float32, float16 or bfloat16" % (i, o))
    if a_shard.dtype not in _FP8 or (a_shard.dtype == torch.float8_e5m2 and any(b.dtype == torch.float8_e5m2 for b in bs)):
        _fail("hostir.torch.all_gather_scaled_matmul: a_shard is %s; A and each B must be float8_e4m3fn or float8_e5m2, "
              "not both e5m2" % (a_shard.dtype,))
    a2, d, rows_shape = _rows(a_shard, gather_dim, what)
    g = _group_state(group_name, a_shard.device)
    D, (m, K) = g.size, a2.shape
    row_a = a_scale.numel() != 1
    if row_a and (rows_shape is not None or a_scale.numel() != m):
        _fail("hostir.torch.all_gather_scaled_matmul: a_scale has %d values; give one, or one per row of a 2-D a_shard (%d)"
              % (a_scale.numel(), m))
    for i, s in enumerate([a_scale] + list(b_scales)):
        if s.device != a_shard.device:
            _fail("hostir.torch.all_gather_scaled_matmul: %s is on %s, a_shard on %s"
                  % ("a_scale" if i == 0 else "b_scales[%d]" % (i - 1), s.device, a_shard.device))
    row_bs = [s.numel() != 1 for s in b_scales]
    for i, (b, s, r) in enumerate(zip(bs, b_scales, row_bs)):
        if r and s.numel() != b.shape[1]:
            _fail("hostir.torch.all_gather_scaled_matmul: b_scales[%d] has %d values; give one, or one per column (%d)"
                  % (i, s.numel(), b.shape[1]))
    scales = [a_scale.reshape(-1).float()] + [s.reshape(-1).float() for s in b_scales]
    key = ("ag8", (a_shard.dtype,) + tuple(b.dtype for b in bs) + tuple(out_dtypes), (row_a,) + tuple(row_bs),
           a2.shape, a2.stride(), tuple((b.shape, b.stride()) for b in bs))

    def views():
        ins = [_view((1, m, K), (m * a2.stride(0), a2.stride(0), a2.stride(1)), a_shard.dtype)]
        ins += [_view((b.shape[1], K), (b.stride(1), b.stride(0)), b.dtype) for b in bs]  # the weight: B transposed
        ins += [_view((1, m) if row_a else (1,), (m, 1) if row_a else (1,), torch.float32)]
        ins += [_view((b.shape[1],) if r else (1,), (1,), torch.float32) for b, r in zip(bs, row_bs)]
        outs = [_view((D, m, K), (m * K, K, 1), a_shard.dtype)]
        outs += [_view((D, m, b.shape[1]), (m * b.shape[1], b.shape[1], 1), o) for b, o in zip(bs, out_dtypes)]
        return ins, outs

    plan = g.plan_for(key, lambda: ag_scaled_fusion(D, _NAMES[a_shard.dtype], [_NAMES[b.dtype] for b in bs],
                                                    [_NAMES[o] for o in out_dtypes], row_a, row_bs), views)
    outs = [torch.empty((D * m, K), dtype=a_shard.dtype, device=a_shard.device)]
    outs += [torch.empty((D * m, b.shape[1]), dtype=o, device=a_shard.device) for b, o in zip(bs, out_dtypes)]
    plan.run([a2] + [b.t() for b in bs] + scales, outs)
    if rows_shape is None and a_shard.is_cuda and direct is not None:
        _remember(2, (a_shard, bs, a_scale, b_scales, gather_dim, direct[0], direct[1], direct[2]), plan, outs)
    if rows_shape is not None:
        rows_shape = [D * rows_shape[0]] + rows_shape[1:]
        outs = [_restore(t, rows_shape, t.shape[-1], d) for t in outs]
    return outs


_ops.define("all_gather_scaled_matmul(Tensor a_shard, Tensor[] bs, Tensor a_scale, Tensor[] b_scales, int gather_dim, "
            "str group_name, int[] out_codes) -> Tensor[]")
for _key in ("CPU", "CUDA"):
    _ops.impl("all_gather_scaled_matmul", _all_gather_scaled_matmul, _key)


@torch.library.register_fake("hostir::all_gather_scaled_matmul")
def _(a_shard, bs, a_scale, b_scales, gather_dim, group_name, out_codes):
    shape = list(a_shard.shape)
    shape[gather_dim % a_shard.dim()] *= _group_size(group_name)
    return [a_shard.new_empty(shape)] + [a_shard.new_empty(shape[:-1] + [b.shape[-1]], dtype=_DTYPES_OF[c])
                                         for b, c in zip(bs, out_codes)]


def all_gather_scaled_matmul(a_shard, bs, a_scale, b_scales, gather_dim, group=None, biases=None, result_scales=None,
                             out_dtypes=None, use_fast_accum=None, return_A=True):
    """torch's fused_all_gather_scaled_matmul through hostir (its argument
    order): the fp8 A gathered along gather_dim, times each fp8 B [K, N]
    (column-major, as torch._scaled_mm takes it), scaled by a_scale (one
    value, or one per row of a 2-D A: [m, 1]) and b_scales[i] (one value,
    or [1, N]); out_dtypes float32, float16 or bfloat16 (default bfloat16).
    Returns (the gathered A or None, [products]). biases and result_scales
    are not taken; products accumulate in f32 whatever use_fast_accum. A
    torch.library op (torch.ops.hostir.all_gather_scaled_matmul): it runs
    under torch.compile and in CUDA graphs; no autograd."""
    taken = biases is None and result_scales is None and not torch.compiler.is_compiling()
    if taken and _torch_fast is not None:
        done = _torch_fast.call(2, a_shard, bs, a_scale, b_scales, gather_dim, group, return_A, out_dtypes)
        if done is not None:
            return done
    dtypes_arg = out_dtypes
    bs, b_scales = list(bs), list(b_scales)
    if any(x is not None for x in (biases or [])) or any(x is not None for x in (result_scales or [])):
        _fail("hostir.torch.all_gather_scaled_matmul: biases and result_scales are not supported; pass None")
    out_dtypes = [o or torch.bfloat16 for o in out_dtypes] if out_dtypes is not None else [torch.bfloat16] * len(bs)
    for i, o in enumerate(out_dtypes):
        if o not in (torch.float32, torch.float16, torch.bfloat16):
            _fail("hostir.torch.all_gather_scaled_matmul: out_dtypes[%d] is %s; give float32, float16 or bfloat16" % (i, o))
    codes = [_CODES[o] for o in out_dtypes]
    if _direct(a_shard, a_scale, *bs, *b_scales):
        outs = _all_gather_scaled_matmul(a_shard, bs, a_scale, b_scales, gather_dim, _group_name(group), codes,
                                         (group, return_A, dtypes_arg) if taken else None)
    else:
        outs = torch.ops.hostir.all_gather_scaled_matmul(a_shard, bs, a_scale, b_scales, gather_dim, _group_name(group), codes)
    return (outs[0] if return_A else None), list(outs[1:])


def _scaled_matmul_reduce_scatter(a, b, a_scale, b_scale, reduce_op, scatter_dim, group_name, out_code, direct=None):
    """direct: (the wrapper's group, out_dtype) when it called."""
    what = ("scaled_matmul_reduce_scatter", "a", "scatter")
    out_dtype = _DTYPES_OF[out_code]
    if reduce_op not in ("sum", "avg"):
        _fail("hostir.torch.scaled_matmul_reduce_scatter: reduce_op %r; give 'sum' or 'avg'" % (reduce_op,))
    if a.dtype not in _FP8 or b.dtype not in _FP8 or a.dtype == b.dtype == torch.float8_e5m2:
        _fail("hostir.torch.scaled_matmul_reduce_scatter: a is %s and b %s; each must be float8_e4m3fn or float8_e5m2, not "
              "both e5m2" % (a.dtype, b.dtype))
    if b.dim() != 2 or b.shape[0] != a.shape[-1] or b.device != a.device:
        _fail("hostir.torch.scaled_matmul_reduce_scatter: b is %s on %s; it must be [K, N] with K = a's last size %d, on %s"
              % (list(b.shape), b.device, a.shape[-1], a.device))
    a2, d, rows_shape = _rows(a, scatter_dim, what)
    g = _group_state(group_name, a.device)
    D, (rows, k), N = g.size, a2.shape, b.shape[1]
    scattered = a2.shape[0] if rows_shape is None else rows_shape[0]
    if scattered % D:
        _fail("hostir.torch.scaled_matmul_reduce_scatter: a's scatter_dim %d has size %d, which the group's %d ranks do not "
              "divide; pad it to a multiple of %d" % (scatter_dim, scattered, D, D))
    row_a, row_b, m = a_scale.numel() != 1, b_scale.numel() != 1, rows // D
    if row_a and (rows_shape is not None or a_scale.numel() != rows):
        _fail("hostir.torch.scaled_matmul_reduce_scatter: a_scale has %d values; give one, or one per row of a 2-D a (%d)"
              % (a_scale.numel(), rows))
    if row_b and b_scale.numel() != N:
        _fail("hostir.torch.scaled_matmul_reduce_scatter: b_scale has %d values; give one, or one per column (%d)"
              % (b_scale.numel(), N))
    for name, t in (("a_scale", a_scale), ("b_scale", b_scale)):
        if t.device != a.device:
            _fail("hostir.torch.scaled_matmul_reduce_scatter: %s is on %s, a on %s" % (name, t.device, a.device))
    w = b.t()  # the weight [N, k]: a column-major B is its rows
    key = ("rs8", (a.dtype, b.dtype, out_dtype), (row_a, row_b), a2.shape, a2.stride(), w.shape, w.stride())

    def views():
        ins = [_view((1, D, m, k), (rows * a2.stride(0), m * a2.stride(0), a2.stride(0), a2.stride(1)), a.dtype),
               _view((1, N, k), (N * w.stride(0), w.stride(0), w.stride(1)), b.dtype),
               _view((1, D, m) if row_a else (1,), (rows, m, 1) if row_a else (1,), torch.float32),
               _view((1, N) if row_b else (1,), (N, 1) if row_b else (1,), torch.float32)]
        return ins, [_view((1, m, N), (m * N, N, 1), out_dtype)]

    plan = g.plan_for(key, lambda: scaled_rs_fusion(D, _NAMES[a.dtype], _NAMES[b.dtype], _NAMES[out_dtype], row_a, row_b),
                      views)
    c = torch.empty((m, N), dtype=out_dtype, device=a.device)
    plan.run([a2, w, a_scale.reshape(-1).float(), b_scale.reshape(-1).float()], [c])
    if rows_shape is None and a.is_cuda and direct is not None:
        _remember(3, (a, b, a_scale, b_scale, reduce_op, scatter_dim, direct[0], direct[1]), plan, [c],
                  D if reduce_op == "avg" else 0)
    if reduce_op == "avg":
        c.div_(D)
    return c if rows_shape is None else _restore(c, [rows_shape[0] // D] + rows_shape[1:], N, d)


_ops.define("scaled_matmul_reduce_scatter(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, str reduce_op, int scatter_dim, "
            "str group_name, int out_code) -> Tensor")
for _key in ("CPU", "CUDA"):
    _ops.impl("scaled_matmul_reduce_scatter", _scaled_matmul_reduce_scatter, _key)


@torch.library.register_fake("hostir::scaled_matmul_reduce_scatter")
def _(a, b, a_scale, b_scale, reduce_op, scatter_dim, group_name, out_code):
    shape = list(a.shape)
    shape[scatter_dim % a.dim()] //= _group_size(group_name)
    return a.new_empty(shape[:-1] + [b.shape[-1]], dtype=_DTYPES_OF[out_code])


def scaled_matmul_reduce_scatter(a, b, a_scale, b_scale, reduce_op, scatter_dim, group=None, out_dtype=None):
    """torch's fused_scaled_matmul_reduce_scatter through hostir: rank r's
    part along scatter_dim of the ranks' (a * a_scale) @ (b * b_scale)
    summed ("sum") or averaged ("avg"). a is fp8 [..., k] (this rank's part
    of K), b fp8 [k, N] column-major (as torch._scaled_mm takes it);
    a_scale one value or one per row of a 2-D a ([rows, 1]), b_scale one
    value or one per column ([1, N]), each this rank's own (its part of K
    quantized apart). The partial products are out_dtype (float32, float16
    or bfloat16; default bfloat16), reduced in it, as torch's op does. A
    torch.library op (torch.ops.hostir.scaled_matmul_reduce_scatter): it
    runs under torch.compile and in CUDA graphs; no autograd."""
    if _torch_fast is not None and not torch.compiler.is_compiling():
        done = _torch_fast.call(3, a, b, a_scale, b_scale, reduce_op, scatter_dim, group, out_dtype)
        if done is not None:
            return done
    dtype_arg, out_dtype = out_dtype, out_dtype or torch.bfloat16
    if out_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        _fail("hostir.torch.scaled_matmul_reduce_scatter: out_dtype is %s; give float32, float16 or bfloat16" % (out_dtype,))
    args = (a, b, a_scale, b_scale, reduce_op, scatter_dim, _group_name(group), _CODES[out_dtype])
    if _direct(a, b, a_scale, b_scale):
        return _scaled_matmul_reduce_scatter(*args, direct=(group, dtype_arg))
    return torch.ops.hostir.scaled_matmul_reduce_scatter(*args)


def matmul_reduce_scatter(a, b, reduce_op, scatter_dim, group=None):
    """torch's fused_matmul_reduce_scatter through hostir: rank r's part of
    the ranks' a @ b summed (or averaged) along scatter_dim."""
    if _torch_fast is not None and not torch.compiler.is_compiling():
        done = _torch_fast.call(1, a, b, reduce_op, scatter_dim, group)
        if done is not None:
            return done
    if _direct(a, b):
        return _matmul_reduce_scatter(a, b, reduce_op, scatter_dim, _group_name(group), (group,))
    return torch.ops.hostir.matmul_reduce_scatter(a, b, reduce_op, scatter_dim, _group_name(group))


def _matmul_all_reduce(a, b, reduce_op, group_name):
    """The ranks' a @ b summed (or averaged), whole on every rank."""
    what = ("matmul_all_reduce", "a")
    if reduce_op not in ("sum", "avg"):
        _fail("hostir.torch.matmul_all_reduce: reduce_op %r; give 'sum' or 'avg'" % (reduce_op,))
    _check(what, a, a.dtype, a.device)
    _check((what[0], "b"), b, a.dtype, a.device)
    if a.dim() < 1 or b.dim() != 2 or b.shape[0] != a.shape[-1]:
        _fail("hostir.torch.matmul_all_reduce: a is %s and b %s; b must be [k, N] with k = a's last size (each rank's part of "
              "K)" % (list(a.shape), list(b.shape)))
    a2 = a.reshape(-1, a.shape[-1])
    g = _group_state(group_name, a.device)
    D, (rows, k), N, dt = g.size, a2.shape, b.shape[1], a.dtype
    key = ("ar", dt, 1, a2.shape, a2.stride(), b.shape, b.stride())

    def views():
        return [_view((rows, k), a2.stride(), dt), _view((k, N), b.stride(), dt)], [_view((rows, N), (N, 1), dt)]

    plan = g.plan_for(key, lambda: matmul_ar_fusion(D, _NAMES[dt]), views)
    c = torch.empty((rows, N), dtype=dt, device=a.device)
    plan.run([a2, b], [c])
    if reduce_op == "avg":
        c.div_(D)
    return c.reshape(list(a.shape[:-1]) + [N])


_ops.define("matmul_all_reduce(Tensor a, Tensor b, str reduce_op, str group_name) -> Tensor")
for _key in ("CPU", "CUDA"):
    _ops.impl("matmul_all_reduce", _matmul_all_reduce, _key)


@torch.library.register_fake("hostir::matmul_all_reduce")
def _(a, b, reduce_op, group_name):
    return a.new_empty(list(a.shape[:-1]) + [b.shape[-1]])


def _ar_setup(ctx, inputs, output):
    a, b, reduce_op, group_name = inputs
    ctx.save_for_backward(a, b)
    ctx.reduce_op, ctx.group_name = reduce_op, group_name


def _ar_backward(ctx, dc):
    """C = sum over ranks of A_r B_r, the same on every rank, so is its
    gradient: dA_r = dC B_r^T and dB_r = A_r^T dC, nothing exchanged."""
    a, b = ctx.saved_tensors
    if ctx.reduce_op == "avg":
        dc = dc / _group_size(ctx.group_name)
    return dc @ b.t(), _flat(a).t() @ _flat(dc), None, None


torch.library.register_autograd("hostir::matmul_all_reduce", _ar_backward, setup_context=_ar_setup)


def matmul_all_reduce(a, b, reduce_op="sum", group=None):
    """The row-parallel linear's GEMM and all-reduce through hostir (one
    program: the all-reduce on hostir's kernel collectives or NCCL, as the
    communicator measured them): each rank passes a [..., k] and b [k, N],
    its part of K, and gets the ranks' a @ b summed ("sum") or averaged
    ("avg"), [..., N], whole on every rank. A torch.library op
    (torch.ops.hostir.matmul_all_reduce) with autograd: it runs under
    torch.compile and in CUDA graphs."""
    if _direct(a, b):
        return _matmul_all_reduce(a, b, reduce_op, _group_name(group))
    return torch.ops.hostir.matmul_all_reduce(a, b, reduce_op, _group_name(group))


def _all_reduce_rms_norm(x, residual, weight, eps, group_name):
    """The ranks' x summed, plus residual, then RMSNorm'd: (h, out)."""
    what = ("all_reduce_rms_norm", "x")
    _check(what, x, x.dtype, x.device)
    _check((what[0], "residual"), residual, x.dtype, x.device)
    if weight is not None:
        _check((what[0], "weight"), weight, x.dtype, x.device)
    if x.dim() < 1 or residual.shape != x.shape or (weight is not None and list(weight.shape) != [x.shape[-1]]):
        _fail("hostir.torch.all_reduce_rms_norm: x is %s, residual %s and weight %s; residual must be x's shape and weight [%d]"
              % (list(x.shape), list(residual.shape), list(weight.shape) if weight is not None else None, x.shape[-1]))
    if not eps >= 0:
        _fail("hostir.torch.all_reduce_rms_norm: eps is %r; give a number >= 0" % (eps,))
    x2, r2 = x.reshape(1, -1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
    g = _group_state(group_name, x.device)
    D, (_, rows, N), dt = g.size, x2.shape, x.dtype
    key = ("arn", dt, (weight is not None, float(eps)), x2.shape, x2.stride(), r2.stride(),
           weight.stride() if weight is not None else None)

    def views():
        ins = [_view((1, rows, N), x2.stride(), dt), _view((rows, N), r2.stride(), dt)]
        if weight is not None:
            ins.append(_view((N,), weight.stride(), dt))
        return ins, [_view((rows, N), (N, 1), dt), _view((rows, N), (N, 1), dt)]

    plan = g.plan_for(key, lambda: ar_rms_norm_fusion(D, _NAMES[dt], weight is not None, float(eps)), views)
    h, out = torch.empty((rows, N), dtype=dt, device=x.device), torch.empty((rows, N), dtype=dt, device=x.device)
    plan.run([x2, r2] + ([weight] if weight is not None else []), [h, out])
    return h.reshape(x.shape), out.reshape(x.shape)


_ops.define("all_reduce_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, str group_name) -> (Tensor, Tensor)")
for _key in ("CPU", "CUDA"):
    _ops.impl("all_reduce_rms_norm", _all_reduce_rms_norm, _key)


@torch.library.register_fake("hostir::all_reduce_rms_norm")
def _(x, residual, weight, eps, group_name):
    return x.new_empty(x.shape), x.new_empty(x.shape)


def all_reduce_rms_norm(x, residual, weight=None, eps=1e-6, group=None):
    """A decode step's all-reduce, residual add and RMSNorm through hostir:
    each rank passes its partial sums x [..., N], the residual (x's shape,
    the same on every rank) and the norm's weight [N] (or None), and gets
    h = (the ranks' x summed) + residual and out = h / sqrt(mean(h^2) + eps)
    * weight, both whole on every rank. One kernel where hostir's kernel
    collectives take the all-reduce (the sum rounded to x's dtype before the
    add, h before the norm); the three apart elsewhere, with the same
    numbers. A torch.library op (torch.ops.hostir.all_reduce_rms_norm),
    forward only: it runs under torch.compile and in CUDA graphs."""
    if _direct(x, residual):
        return _all_reduce_rms_norm(x, residual, weight, eps, _group_name(group))
    return torch.ops.hostir.all_reduce_rms_norm(x, residual, weight, eps, _group_name(group))


class _Borrowed:
    """A CUDA buffer of hostir's as torch sees one (__cuda_array_interface__)."""
    _TYPES = {0: "<f4", 1: "<f8", 2: "<f2", 3: "<i2", 4: "|u1", 5: "|u1"}  # bfloat16 and fp8 travel as integers, viewed back

    def __init__(self, view):
        self.__cuda_array_interface__ = {"shape": tuple(view.sizes[k] for k in range(view.ndims)),
                                         "typestr": self._TYPES[view.dtype], "data": (view.data, False), "version": 3,
                                         "strides": None}


def _taken(x, what):
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__dlpack__"):  # numpy, CuPy, JAX ...: a view, no copy
        return torch.from_dlpack(x)
    _fail("hostir.torch.run: %s is %s; pass a tensor, an array with __dlpack__, an int (a scalar input) or None"
          % (what, type(x).__name__))


def run(fusion, inputs, group=None):
    """Runs a fusion built from Python (hostir.Fusion) on this rank's
    tensors: torch tensors or any array with __dlpack__ (taken as a view),
    ints for its scalar inputs, None for an input that does not live on this
    rank; every rank of the group calls it (the fusion's device ids are the
    group's ranks). Returns this rank's outputs as torch tensors (None where
    one does not live here). Lowered for this rank per input shapes, kept;
    from the second call of a plan on, the outputs are made here and the run
    writes them in place (the first call copies them out of hostir's
    buffers, whose shapes it learns). Where the package has
    hostir._torch_fast, a call like one run that way before (the same
    fusion, group, tensors' shapes, strides, dtypes and devices, and scalar
    values) runs in C++."""
    if _torch_fast is not None and not torch.compiler.is_compiling():
        done = _torch_fast.call(4, fusion, inputs, group)
        if done is not None:
            return done
    name = _group_name(group)
    if len(inputs) != len(fusion.inputs):
        _fail("hostir.torch.run: %d inputs; the fusion takes %d" % (len(inputs), len(fusion.inputs)))
    tensors = [None if x is None or isinstance(x, int) else _taken(x, "input %d" % k) for k, x in enumerate(inputs)]
    device = next((t.device for t in tensors if t is not None), torch.device("cpu"))
    for k, t in enumerate(tensors):
        if t is None:
            continue
        if t.dtype not in _CODES:
            _fail("hostir.torch.run: input %d is %s; hostir takes float32, float64, float16, bfloat16, float8_e4m3fn and "
                  "float8_e5m2" % (k, t.dtype))
        if t.device != device:
            _fail("hostir.torch.run: input %d is on %s, input 0 on %s" % (k, t.device, device))
        want = getattr(fusion.inputs[k], "dtype", None)
        if want is not None and want != _NAMES[t.dtype]:  # refused here: a refused run would end the group's hostir world
            _fail("hostir.torch.run: input %d is %s; the fusion's input %d is %s" % (k, t.dtype, k, want))
    g = _group_state(name, device)
    key = ("fusion", id(fusion), 0, tuple(x if t is None else (t.shape, t.stride(), t.dtype) for x, t in zip(inputs, tensors)))

    def views():
        made = []
        for x, t in zip(inputs, tensors):
            v = _HirTensor() if t is None else _view(tuple(t.shape), t.stride(), t.dtype)
            if isinstance(x, int):
                v.sizes[0] = x  # a scalar input, by value
            made.append(v)
        return made, [_HirTensor() for _ in fusion.outputs]

    plan = g.plan_for(key, lambda: fusion, views)
    made = getattr(plan, "made_outputs", None)
    if made is not None:
        outs = [torch.empty(shape, dtype=dtype, device=device) if shape is not None else None for shape, dtype in made]
        plan.run(tensors, outs)
        if all(x is t or isinstance(x, int) for x, t in zip(inputs, tensors)) and all(shape != () for shape, _ in made):
            _remember(4, (fusion, inputs, group), plan, outs)  # torch tensors alone (an array's view is made per call)
        return outs
    plan.run(tensors, [None] * plan.nout)
    plan.made_outputs = [((tuple(o.sizes[k] for k in range(o.ndims)), _DTYPES_OF[o.dtype]) if o.data else (None, None))
                         for o in plan.outs[:plan.nout]]
    outs = []
    for o in plan.outs[:plan.nout]:
        if not o.data:
            outs.append(None)
            continue
        if g.cuda:
            t = torch.as_tensor(_Borrowed(o), device=device)
            t = (t.view(_DTYPES_OF[o.dtype]) if o.dtype >= 3 else t).clone()  # the buffer is the evaluator's, reused next run
        else:
            count = 1
            for k in range(o.ndims):
                count *= o.sizes[k]
            dtype = _DTYPES_OF[o.dtype]
            raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(o.data)
            t = torch.frombuffer(raw, dtype=dtype, count=count).reshape([o.sizes[k] for k in range(o.ndims)]).clone()
        outs.append(t)
    return outs


def plan(op="all_gather_matmul", group=None, device=None):
    """What hostir chose for the op's plans on this rank (hir_program_plan
    of each, newest last), for logs and for tests."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    g = _groups.get(_group_key(_group_name(group), device))
    tag = {"all_gather_matmul": "ag", "matmul_reduce_scatter": "rs", "matmul_all_reduce": "ar"}.get(op, "fusion")
    return [entry.plan() for key, entry in (g.plans.items() if g else []) if key[0] == tag]
