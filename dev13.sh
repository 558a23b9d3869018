#!/bin/bash
# session 20: hostir.torch's fused-op table, each contender in turns, with its plan's own hir_run beside it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
touch build/* 2>/dev/null
nvidia-smi -L | head -1
python3 -m pip install -q --no-build-isolation --no-deps --target build/pyhostir ./python > $OUT/pip.log 2>&1 || tail -5 $OUT/pip.log
PYTHONPATH=build/pyhostir timeout 200 torchrun --standalone --nproc-per-node 2 bench/torch_fused.py --tune 2>&1 | grep -v 'NCCL\|Warning\|warn\|\*\*\*\|OMP\|func(\|enable_symm' | tee $OUT/fused.log | tail -16
