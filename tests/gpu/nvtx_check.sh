#!/bin/sh
# build/main under the NVTX probe (loaded as Nsight Systems loads its tool):
# every host IR node must open and close a range, matmuls and sends/receives
# among them. Needs build/main and build/nvtx_probe.so; no GPU.
out=${1:-build/nvtx.txt}
rm -f "$out"
NVTX_INJECTION64_PATH="$PWD/build/nvtx_probe.so" HIR_NVTX_PROBE_OUT="$out" ./build/main > /dev/null || exit 1
head -2 "$out"
awk '/^pushes/ {p = $2} /^pops/ {q = $2} /^range MatmulOp/ {m = $3} /^range P2PCommunication/ {c = $3}
     END {exit !(p > 0 && p == q && m > 0 && c > 0)}' "$out"
