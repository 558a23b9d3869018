"""Builds hostir._native from the repository's headers (../hostir.h,
../hostir_nccl.h; never a copy): `pip install ./python` from hostir's
repository. With CUDA found (CUDA_HOME, else the directory above nvcc on
PATH) and NCCL's header beside it or in the system's, the library has the
CUDA backend and NCCL; else it is the CPU build. Where this Python also
imports torch built with CUDA, hostir._torch_fast is built against it:
hostir.torch's calls seen before, in C++ (about a minute more; optional:
without it, or with HOSTIR_TORCH_FAST=0 while building, the Python path runs
them). pip's build isolation hides the environment's packages from this
script, so torch is asked for by a child of this interpreter without pip's
path."""
import json
import os
import shutil
import subprocess
import sys

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


def torch_for_build():
    """[include dirs, library dirs, C++ ABI] of the CUDA torch this Python imports, or None."""
    probe = ("import json, torch\nfrom torch.utils import cpp_extension as e\n"
             "print(json.dumps([e.include_paths(), e.library_paths(), int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.version.cuda]))")
    unisolated = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    for env in (os.environ, unisolated):
        try:
            found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
            include, lib, abi, cuda_version = json.loads(found.stdout.strip().splitlines()[-1])
        except Exception:  # no torch there
            continue
        return [include, lib, abi] if cuda_version else None
    return None


torch_build = torch_for_build() if macros and os.environ.get("HOSTIR_TORCH_FAST") != "0" else None
if torch_build:
    torch_include, torch_lib, abi = torch_build
    extensions.append(Extension(
        "hostir._torch_fast", ["hostir/_torch_fast.cpp"], language="c++", optional=True, depends=headers,
        include_dirs=[root, os.path.join(cuda, "include")] + torch_include,
        library_dirs=torch_lib, runtime_library_dirs=torch_lib, libraries=["c10", "c10_cuda", "torch", "torch_cpu", "torch_python"],
        extra_compile_args=["-std=c++17", "-O2", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]))

setup(packages=["hostir"], ext_modules=extensions)
