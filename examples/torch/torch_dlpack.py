#!/usr/bin/env python3
"""hostir driven from PyTorch through DLPack, one process per GPU:

    torchrun --nproc-per-node 4 examples/torch/torch_dlpack.py

PyTorch's process group hands hostir NCCL's id (hir_nccl_comm_create_from_id):
rank 0 makes it, torch.distributed broadcasts it; hostir opens no port.

Each rank holds its rows of A and all of B as torch tensors; hostir gathers
A and multiplies (the AG+GEMM of examples/main.c) on torch's current stream,
writing into a torch tensor, then into its own buffer handed back to torch.
Checked against torch's own A @ B, in float32 and bfloat16, and a wrong dtype
must be refused, naming the input and its dtype. Builds build/libhostir_torch.so from
examples/torch/hostir_torch.c on first use (cc; CUDA from CUDA_HOME or nvcc on
PATH; dlpack.h from PyTorch)."""
import ctypes
import os
import shutil
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.utils.dlpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build():
    lib = os.path.join(ROOT, "build", "libhostir_torch.so")
    srcs = [os.path.join(ROOT, p) for p in ("examples/torch/hostir_torch.c", "hostir.h", "hostir_nccl.h")]
    if os.path.exists(lib) and all(os.path.getmtime(lib) >= os.path.getmtime(s) for s in srcs):
        return lib
    nvcc = shutil.which("nvcc")
    cuda = os.environ.get("CUDA_HOME") or (os.path.dirname(os.path.dirname(nvcc)) if nvcc else None)
    if not cuda:
        sys.exit("torch_dlpack: no CUDA (set CUDA_HOME or put nvcc on PATH)")
    dlpack_h = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "dlpack.h")
    os.makedirs(os.path.dirname(lib), exist_ok=True)
    tmp = "%s.%d" % (lib, os.getpid())  # every rank may build; the last rename wins, whole
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-DHOSTIR_CUDA", "-include", dlpack_h, "-I" + cuda + "/include",
                           "-o", tmp, srcs[0], "-L" + cuda + "/lib64", "-Wl,-rpath," + cuda + "/lib64", "-lnccl",
                           "-lcublasLt", "-lcublas", "-lcudart", "-ldl", "-lpthread", "-lm"])
    os.replace(tmp, lib)
    return lib


capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
capsule_pointer.restype, capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
DLTENSOR = b"dltensor"


def dl(t):
    """A DLManagedTensor* viewing t, and the capsule that keeps it alive."""
    capsule = torch.utils.dlpack.to_dlpack(t)
    return capsule, capsule_pointer(capsule, DLTENSOR)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(gpu)
    lib = ctypes.CDLL(build())
    lib.hx_unique_id.argtypes = [ctypes.c_char_p]
    lib.hx_create.restype = ctypes.c_void_p
    lib.hx_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]
    lib.hx_program.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.hx_error.restype, lib.hx_error.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.hx_run.argtypes = [ctypes.c_void_p] * 4
    lib.hx_output.restype, lib.hx_output.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    lib.hx_sync.argtypes = lib.hx_free.argtypes = [ctypes.c_void_p]
    M, K, N = 256 * world, 512, 384
    m = M // world
    report, ok = [], True
    dist.init_process_group("nccl", device_id=torch.device("cuda", gpu))
    nccl_id = [None]
    if rank == 0:
        buf = ctypes.create_string_buffer(128)
        if lib.hx_unique_id(buf):
            sys.exit("rank 0: ncclGetUniqueId failed")
        nccl_id[0] = buf.raw
    dist.broadcast_object_list(nccl_id, src=0)  # PyTorch's process group carries hostir's id
    h = lib.hx_create(rank, world, gpu, nccl_id[0], ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if not h or lib.hx_error(h):
        sys.exit("rank %d: %s" % (rank, lib.hx_error(h).decode()))
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        g = torch.Generator().manual_seed(1234)  # every rank draws the same A and B
        A, B = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)
        ref = (A.double() @ B.double()).cuda()
        scale = ref.abs().max().item()
        a = A[rank * m:(rank + 1) * m].reshape(1, m, K).cuda()
        b = B.cuda()
        if lib.hx_program(h, 1 if dtype == torch.bfloat16 else 0):
            sys.exit("rank %d: %s" % (rank, lib.hx_error(h).decode()))
        (ca, pa), (cb, pb) = dl(a), dl(b)
        # 1. into a torch tensor, poisoned first; read by torch on the same stream, no host sync in between
        c = torch.full((world, m, N), float("nan"), dtype=dtype, device="cuda")
        cc_, pc = dl(c)
        if lib.hx_run(h, pa, pb, pc):
            sys.exit("rank %d: %s" % (rank, lib.hx_error(h).decode()))
        err_in = ((c.reshape(M, N).double() - ref).abs().max() / scale).item()
        # 2. into hostir's buffer, handed to torch without a copy
        if lib.hx_run(h, pa, pb, None) or lib.hx_sync(h):
            sys.exit("rank %d: %s" % (rank, lib.hx_error(h).decode()))
        managed = lib.hx_output(h)
        own = torch.utils.dlpack.from_dlpack(capsule_new(managed, DLTENSOR, None))
        same_memory = own.data_ptr() == ctypes.c_void_p.from_address(managed).value  # DLTensor.data comes first
        err_own = ((own.reshape(M, N).double() - ref).abs().max() / scale).item()
        ok &= err_in < tol and err_own < tol and same_memory and own.shape == (world, m, N)
        report.append("%s: max |C - torch| / max |C| = %.1e written into torch's tensor, %.1e in hostir's own (%s)"
                      % (str(dtype)[6:], err_in, err_own, "no copy" if same_memory else "COPIED"))
        del own, managed, ca, cb, cc_  # before hostir's buffer goes with the next program
    # 3. a wrong dtype is refused by name on every rank. A refused run ends the
    # communicator (a peer that did not refuse would otherwise wait for this
    # rank), so it comes last: a program after it would need a new one.
    (ca, pa), (cb, pb), (cc_, pc) = dl(a.double()), dl(b), dl(c)
    refused = lib.hx_run(h, pa, pb, pc) != 0
    why = lib.hx_error(h).decode()
    ok &= refused and "input 0" in why and "double" in why
    report.append("a float64 A: \"%s\"" % why)
    lib.hx_free(h)
    dist.destroy_process_group()
    print("rank %d of %d (GPU %d): %s %s" % (rank, world, gpu, "ok" if ok else "FAILED", "\n    ".join([""] + report)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
