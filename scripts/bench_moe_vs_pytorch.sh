#!/usr/bin/env bash
# The MoE layer (hidden 2048, expert FFN 768, 8 experts, top-2, bf16, one thread, forward +
# backward) in EPO (bench/moe_bench BM_MoeLayer) and in PyTorch (bench/peers/pytorch_moe_layer.py),
# alternating, so both see the same machine load. Prints each round and, per token count, the
# median / min / max of the speedup (PyTorch time / EPO time, wall clock, medians of the steps).
#
#   scripts/bench_moe_vs_pytorch.sh [ROUNDS] [TOKENS...]      default: 3 rounds, 2048 4096
#
# Needs build/release (scripts/build.sh release) and Debian's python3-torch
# (`scripts/setup.sh peers`). Runs each program under scripts/guarded.sh. PyTorch runs with
# glibc told to keep and reuse freed memory (MALLOC_MMAP_MAX_=0, as the peer figures in
# shared/notes were measured: no page faults in its steady state); EPO allocates its buffers once
# and does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
tokens=("$@")
((${#tokens[@]})) || tokens=(2048 4096)
bench=build/release/bench/moe_bench
[[ -x $bench ]] || { echo "missing $bench: run scripts/build.sh release" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "PyTorch missing: run scripts/setup.sh peers" >&2; exit 1; }
export OMP_NUM_THREADS=1

epo_ms() {  # median wall ms per step of BM_MoeLayer/<tokens>/0
  scripts/guarded.sh "$bench" --benchmark_filter="BM_MoeLayer/$1/0" --benchmark_format=csv \
    2>/dev/null | awk -F, '/^"BM_MoeLayer/ {print $3}'
}
torch_ms() {  # median wall ms of 5 steps after 3 warm-up steps
  MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 \
    scripts/guarded.sh /usr/bin/python3 bench/peers/pytorch_moe_layer.py "$1" 5 3 |
    awk '/^median/ {print $3}'
}

declare -A ratios
echo "# $(uptime)"
for ((r = 1; r <= rounds; ++r)); do
  for t in "${tokens[@]}"; do
    e=$(epo_ms "$t")
    p=$(torch_ms "$t")
    ratio=$(awk -v p="$p" -v e="$e" 'BEGIN {printf "%.3f", p / e}')
    ratios[$t]+="$ratio "
    echo "round $r tokens $t epo_ms $e pytorch_ms $p speedup $ratio   # load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
for t in "${tokens[@]}"; do
  echo "${ratios[$t]}" | tr ' ' '\n' | grep . | sort -g |
    awk -v t="$t" '{v[NR] = $1} END {printf "tokens %s speedup median %.3f min %.3f max %.3f (%d rounds)\n", t, v[int((NR + 1) / 2)], v[1], v[NR], NR}'
done
echo "# $(uptime)"
