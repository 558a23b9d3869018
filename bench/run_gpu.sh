#!/bin/sh
# The overlap benchmarks on this machine's GPUs, in both launch modes, then
# PyTorch async-TP on the same shapes, the same way timed, in the same call:
# hostir's pipelines with a thread per GPU (build/bench-overlap), then with a
# process per GPU under torchrun (--processes); then the decode-size shapes
# the same way, eager and as CUDA graphs (--decode --graph). Multicast stays off (NVLS,
# symmetric-memory multicast). Arguments go to both runs of bench-overlap.
# RUN_GPU_SETS="large decode collectives" (the default) picks the tables:
# "decode" alone runs the decode-size ones, for a machine where all outlast
# one sitting; "collectives" runs bench/torch_collectives.py, then
# build/bench-collectives in both modes with PyTorch's columns beside, and
# its all-reduce with the residual add and RMSNorm (--rms) in both modes,
# then build/bench-gemm_ar (a GEMM with the all-reduce in its epilogue, on
# the first two GPUs) at the decode shapes.
# A stage that fails (bench-overlap ends a run whose row hangs, --hang-s)
# says so, and the next stage runs.
set -e
sets=${RUN_GPU_SETS:-large decode collectives}
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
make -s build/bench-overlap build/bench-collectives build/bench-gemm_ar
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
ngpu=$(nvidia-smi -L | wc -l); [ "$ngpu" -gt 8 ] && ngpu=8 # bench-overlap's most
case " $sets " in *" large "*)
echo "== one process, a thread per GPU"
./build/bench-overlap "$@" || echo "(exit status $?: the next stage runs all the same)"
if command -v torchrun >/dev/null; then
  echo "== a process per GPU (torchrun --nproc-per-node $ngpu)"
  torchrun --standalone --nproc-per-node "$ngpu" --no-python ./build/bench-overlap --processes "$@" || echo "(exit status $?: the next stage runs all the same)"
  echo "== PyTorch async-TP (torchrun --nproc-per-node $ngpu)"
  torchrun --standalone --nproc-per-node "$ngpu" bench/torch_async_tp.py
fi;; esac
case " $sets " in *" collectives "*)
torch_file=$(mktemp)
if command -v torchrun >/dev/null; then
  echo "== PyTorch's collectives (torchrun --nproc-per-node $ngpu)"
  torchrun --standalone --nproc-per-node "$ngpu" bench/torch_collectives.py "$torch_file" || echo "(exit status $?)"
fi
echo "== collectives: one process, a thread per GPU"
./build/bench-collectives --torch "$torch_file" || echo "(exit status $?: the next stage runs all the same)"
if command -v torchrun >/dev/null; then
  echo "== collectives: a process per GPU"
  torchrun --standalone --nproc-per-node "$ngpu" --no-python ./build/bench-collectives --processes --torch "$torch_file" || echo "(exit status $?)"
fi
echo "== the all-reduce with the residual add and RMSNorm: threads, then a process per GPU"
./build/bench-collectives --rms 8192 || echo "(exit status $?)"
if command -v torchrun >/dev/null; then
  torchrun --standalone --nproc-per-node "$ngpu" --no-python ./build/bench-collectives --processes --rms 8192 || echo "(exit status $?)"
fi
echo "== the all-reduce in a GEMM's epilogue (one process, two GPUs)"
./build/bench-gemm_ar --shapes 256,4096,4096:1024,4096,4096 || echo "(exit status $?)"
rm -f "$torch_file";; esac
case " $sets " in *" decode "*) ;; *) exit 0;; esac
echo "== decode-size shapes, eager and CUDA graphs: one process, a thread per GPU"
./build/bench-overlap --decode --graph "$@" || echo "(exit status $?: the next stage runs all the same)"
if command -v torchrun >/dev/null; then
  echo "== decode-size shapes, eager and CUDA graphs: a process per GPU"
  torchrun --standalone --nproc-per-node "$ngpu" --no-python ./build/bench-overlap --processes --decode --graph "$@" || echo "(exit status $?: the next stage runs all the same)"
  echo "== decode-size shapes: PyTorch"
  torchrun --standalone --nproc-per-node "$ngpu" bench/torch_async_tp.py --decode
fi
