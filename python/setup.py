"""Builds hostir._native from the repository's headers (../hostir.h,
../hostir_nccl.h; never a copy): `pip install ./python` from hostir's
repository. With CUDA found (CUDA_HOME, else the directory above nvcc on
PATH) and NCCL's header beside it or in the system's, the library has the
CUDA backend and NCCL; else it is the CPU build. Where torch (built with
CUDA) is importable while building as well (pip install
--no-build-isolation ./python), hostir._torch_fast is built too: hostir.torch's
calls seen before, in C++ (optional: if it does not build, the Python path
runs them)."""
import os
import shutil

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
if not os.path.exists(os.path.join(root, "hostir.h")):
    raise SystemExit("hostir: build the package from hostir's repository (pip install ./python): its headers are there")

nvcc = shutil.which("nvcc")
cuda = os.environ.get("CUDA_HOME") or (os.path.dirname(os.path.dirname(nvcc)) if nvcc else "")
nccl_h = [d for d in (os.path.join(cuda, "include") if cuda else "", "/usr/include", "/usr/local/include")
          if d and os.path.exists(os.path.join(d, "nccl.h"))]
macros, libs, include_dirs, library_dirs = [], [], [root], []
if cuda and os.path.exists(os.path.join(cuda, "include", "cuda_runtime.h")) and nccl_h:
    macros = [("HOSTIR_PY_NCCL", None)]
    include_dirs += [os.path.join(cuda, "include")] + nccl_h
    library_dirs = [os.path.join(cuda, "lib64")]
    libs = ["nccl", "cublasLt", "cublas", "cudart", "dl"]

headers = [os.path.join(root, "hostir.h"), os.path.join(root, "hostir_nccl.h")]
extensions = [Extension("hostir._native", ["hostir/_native.c"], include_dirs=include_dirs, define_macros=macros,
                        libraries=libs + ["m", "pthread"], library_dirs=library_dirs, runtime_library_dirs=library_dirs,
                        depends=headers)]
try:
    import torch
    from torch.utils import cpp_extension
except Exception:  # not importable here (pip's build isolation, or no torch): the Python path alone
    torch = None
if torch is not None and torch.version.cuda and macros:
    torch_lib = cpp_extension.library_paths()
    extensions.append(Extension(
        "hostir._torch_fast", ["hostir/_torch_fast.cpp"], language="c++", optional=True, depends=headers,
        include_dirs=[root, os.path.join(cuda, "include")] + cpp_extension.include_paths(),
        library_dirs=torch_lib, runtime_library_dirs=torch_lib, libraries=["c10", "c10_cuda", "torch", "torch_cpu", "torch_python"],
        extra_compile_args=["-std=c++17", "-O2", "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]))

setup(packages=["hostir"], ext_modules=extensions)
