#!/usr/bin/env bash
# make test-gpu: the GPU suite in one process (a thread per GPU; its pipelines
# also as CUDA graphs), the copy engines between 2 processes on GPU 0, eager
# and captured (and one of them dying mid-exchange, and mid-replay), then with one process per GPU under torchrun
# and mpirun (2 GPUs, and all when more) on the copy engines, two "hosts" by
# NCCL_HOSTID, the caller's NCCL id and communicator, a dead peer (also during
# a graph replay, and behind a run it skipped when the ranks meet over a new shape), processes that call exit() with a live or aborted world, a failing rank (the data path on blocking twins, the default), then on the nonblocking
# communicators (HOSTIR_NCCL_BLOCKING=0) where ranks fail, the bootstrap's own tests, hostir.torch (the package
# pip-installed, its ops under torchrun against torch's), then the examples:
# built with nvcc, run on the GPUs, NVTX ranges as a tool sees them, launch_processes under torchrun and mpirun, and
# hostir driven from PyTorch through DLPack. Under torchrun --standalone the
# bootstrap port is set (HOSTIR_PORT) below the ephemeral range: the port after
# torchrun's random one can be taken by a connection. The last line is "N passed,
# N failed" over these stages. A test that hangs ends its stage within
# HOSTIR_TEST_HANG_S (default 120) seconds without progress, its threads' stacks printed; under mpirun 90, so
# that this comes before the 120 s timeout of the dead-peer and failing-rank stages.
# TEST_GPU_STAGES=FIRST-LAST (numbers as printed, "== [n] ...") runs only those stages, so that a machine
# whose whole suite takes longer than one sitting (4 or 8 GPUs) runs it in parts; the counts are the parts' own.
# TEST_GPU_PARTS=N makes the one-process stage N stages, each with every Nth test (numbered stages shift by N - 1).
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bin=${TEST_GPU_BIN:-build/test-gpu}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then # the GPUs this run may use: two runs can share a host
  visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  [ "$visible" -lt "$ngpu" ] && ngpu=$visible
fi
passed=0 failed=0 number=0
range=${TEST_GPU_STAGES:-1-99}
stage() { # name, command...
  local name=$1 t0=$SECONDS; shift
  number=$((number + 1))
  [ "$number" -ge "${range%-*}" ] && [ "$number" -le "${range#*-}" ] || return 0
  echo "== [$number] $name"
  if timeout 900 "$@"; then passed=$((passed + 1)); echo "== $name: ok ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); echo "== $name: FAILED ($((SECONDS - t0)) s)"; fi
}
parts=${TEST_GPU_PARTS:-1}
for part in $(seq "$parts"); do
  stage "one process, $ngpu GPUs$([ "$parts" -gt 1 ] && echo ", part $part of $parts")" env HOSTIR_TEST_PART="$part/$parts" "$bin"
done
stage "copy engines between 2 processes on GPU 0 (CUDA IPC, no NCCL world)" "$bin" --ce-pair
stage "a peer process gone during a copy-engine exchange" "$bin" --ce-pair --dead-peer
stage "a peer process gone during a CUDA graph replay on the copy engines" "$bin" --ce-pair --dead-peer-replay
sizes="2"; [ "$ngpu" -gt 2 ] && sizes="2 $ngpu"
for n in $sizes; do
  [ "$n" -le "$ngpu" ] || continue
  if command -v torchrun >/dev/null; then
    stage "torchrun, $n processes (send/recv on the copy engines)" env HOSTIR_PORT=$((29610 + n)) HOSTIR_TEST_COPY_ENGINE=1 \
      torchrun --standalone --nproc_per_node="$n" --no-python "$bin" --processes
  fi
  if command -v mpirun >/dev/null; then
    stage "mpirun, $n processes (send/recv on the copy engines)" mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 --oversubscribe -np "$n" \
      -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29600 + n)) -x HOSTIR_TEST_COPY_ENGINE=1 "$bin" --processes
  fi
done
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  stage "2 processes on two hosts by NCCL_HOSTID (send/recv on NCCL)" mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 -x NCCL_NVLS_ENABLE \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29640 -x HOSTIR_TEST_COPY_ENGINE=0 \
    sh -c 'NCCL_HOSTID=hostir-test-host-$OMPI_COMM_WORLD_RANK exec "$0" --processes' "$bin"
fi
if [ "$ngpu" -ge 2 ] && command -v torchrun >/dev/null; then
  stage "2 processes from the caller's NCCL id (hir_nccl_comm_create_from_id)" env HOSTIR_TEST_COPY_ENGINE=1 torchrun --standalone --nproc_per_node=2 --no-python "$bin" --processes --from-id
  stage "2 processes on the caller's NCCL communicator (hir_nccl_comm_from_nccl)" env HOSTIR_TEST_COPY_ENGINE=1 torchrun --standalone --nproc_per_node=2 --no-python "$bin" --processes --lent-nccl
fi
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  stage "a dead peer (2 processes, rank 1 exits after joining)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 \
    -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29650 "$bin" --processes --dead-peer
  stage "a dead peer behind a run it skipped, then a new shape: the ranks meet behind stuck work (2 processes)" timeout 120 \
    mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29652 \
    "$bin" --processes --dead-peer-reshape
fi
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  stage "a dead peer during a CUDA graph replay (2 processes, NCCL)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 \
    -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29655 "$bin" --processes --dead-peer-replay
  stage "processes that call exit() with a live world (2 processes, a captured allgather, nothing freed)" timeout 120 \
    mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29657 "$bin" --processes --exit-live
  stage "a dead peer, then exit() with the aborted world alive (2 processes)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 \
    -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29658 "$bin" --processes --dead-peer-exit
fi
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  n=$((ngpu < 4 ? ngpu : 4))
  stage "a failing rank ($n processes, the last with a wrong M, then a wrong K; every rank back within 1 s)" timeout 120 mpirun \
    --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np "$n" -x NCCL_NVLS_ENABLE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29690 "$bin" --processes --failing-rank
fi
if [ "$ngpu" -ge 2 ]; then # the data path on the nonblocking communicators (the opt-out), where a rank fails above all
  stage "nonblocking data path (HOSTIR_NCCL_BLOCKING=0), one process: the NCCL worlds' eval/ tests" \
    env HOSTIR_NCCL_BLOCKING=0 "$bin" eval/
  stage "nonblocking data path, one process: gpu/ (a refused graph replay, the copy engines, a failing rank)" \
    env HOSTIR_NCCL_BLOCKING=0 "$bin" gpu/
fi
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  stage "nonblocking data path: a dead peer (2 processes)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 -x NCCL_NVLS_ENABLE \
    -x HOSTIR_NCCL_BLOCKING=0 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29660 "$bin" --processes --dead-peer
  stage "nonblocking data path: a dead peer behind a run it skipped, then a new shape (2 processes)" timeout 120 mpirun \
    --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np 2 -x NCCL_NVLS_ENABLE -x HOSTIR_NCCL_BLOCKING=0 -x MASTER_ADDR=127.0.0.1 \
    -x MASTER_PORT=29662 "$bin" --processes --dead-peer-reshape
  stage "nonblocking data path: a dead peer during a CUDA graph replay (2 processes)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 \
    -np 2 -x NCCL_NVLS_ENABLE -x HOSTIR_NCCL_BLOCKING=0 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29665 "$bin" --processes \
    --dead-peer-replay
  stage "nonblocking data path: a failing rank ($n processes)" timeout 120 mpirun --allow-run-as-root -x HOSTIR_TEST_HANG_S=90 -np "$n" \
    -x NCCL_NVLS_ENABLE -x HOSTIR_NCCL_BLOCKING=0 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29695 "$bin" --processes \
    --failing-rank
fi
stage "the bootstrap without GPUs (make test-bootstrap)" make -s test-bootstrap
if command -v nvcc >/dev/null; then
  stage "examples built with nvcc" make -s examples-nvcc
fi
stage "the examples on the GPUs (make run, make run-examples)" make -s run run-examples
stage "NVTX ranges seen by an injected tool (build/main)" tests/gpu/nvtx_check.sh
if [ "$ngpu" -ge 2 ] && command -v torchrun >/dev/null; then
  stage "examples/launch_processes under torchrun, $ngpu processes" \
    env HOSTIR_PORT=29670 torchrun --standalone --nproc_per_node="$ngpu" --no-python build/launch_processes
fi
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  stage "examples/launch_processes under mpirun, 2 processes" mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29660 build/launch_processes
fi
if command -v torchrun >/dev/null && python3 -c "import torch" 2>/dev/null; then
  n=$((ngpu < 2 ? ngpu : 2))
  stage "hostir.torch: pip install ./python (no network: --no-build-isolation), then python/tests/test_torch.py under torchrun, $n processes, and on CPU tensors as 3 threads" \
    sh -c "rm -rf build/pyhostir && python3 -m pip install -q --no-build-isolation --no-deps --target build/pyhostir ./python &&
           PYTHONPATH=build/pyhostir HOSTIR_TEST_TORCH_FAST=1 timeout 300 torchrun --standalone --nproc_per_node=$n python/tests/test_torch.py &&
           PYTHONPATH=build/pyhostir timeout 120 python3 python/tests/test_torch.py --threads 3"
fi
if [ "$ngpu" -ge 2 ] && command -v torchrun >/dev/null && python3 -c "import torch" 2>/dev/null; then
  stage "examples/torch/torch_dlpack.py: hostir from PyTorch through DLPack, $ngpu processes" \
    torchrun --standalone --nproc_per_node="$ngpu" examples/torch/torch_dlpack.py
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
