#!/bin/sh
# The overlap benchmarks on this machine's GPUs: hostir's pipelines
# (build/bench-overlap), then PyTorch async-TP on the same shapes, the same way
# timed. Multicast stays off (NVLS, symmetric-memory multicast).
set -e
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
make -s build/bench-overlap
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
./build/bench-overlap "$@"
if command -v torchrun >/dev/null; then
  ngpu=$(nvidia-smi -L | wc -l); [ "$ngpu" -gt 4 ] && ngpu=4
  torchrun --nproc-per-node "$ngpu" bench/torch_async_tp.py
fi
