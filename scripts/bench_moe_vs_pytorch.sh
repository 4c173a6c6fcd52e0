#!/usr/bin/env bash
# The MoE layer (hidden 2048, expert FFN 768, 8 experts, top-2, bf16, one thread, forward +
# backward) in EPO (bench/moe_bench BM_MoeLayer) and in PyTorch (bench/peers/pytorch_moe_layer.py),
# alternating, so both see the same machine load. Prints each round and, per token count, the
# median / min / max of the speedup (PyTorch time / EPO time, wall clock, medians of the steps).
#
# Each round also gives the time both spend inside oneDNN's matrix products per step (EPO: the
# benchmark's ms_gemm counter; PyTorch: the sum of ONEDNN_VERBOSE's execution times over its
# timed steps) and `bound` = PyTorch time / EPO GEMM time: the speedup EPO would reach if
# everything outside its products took no time at all. Both run the same oneDNN kernels, so the
# products bound the speedup: where `bound` is below a target, no work outside the GEMMs reaches it.
#
#   scripts/bench_moe_vs_pytorch.sh [ROUNDS] [TOKENS...]      default: 3 rounds, 2048 4096
#
# Needs build/release (scripts/build.sh release) and Debian's python3-torch
# (`scripts/setup.sh peers`). Runs each program under scripts/guarded.sh. PyTorch runs with
# glibc told to keep and reuse freed memory (MALLOC_MMAP_MAX_=0, as the PyTorch figures in
# docs/numerics.md "Measured" were measured: no page faults in its steady state); EPO sets the
# same itself.
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

steps=5 warmup=3
epo_run() {  # "<median wall ms per step> <ms inside GEMMs per step>" of BM_MoeLayer/<tokens>/0
  # The median of the steps (ms_median), the statistic the peer prints, not Google Benchmark's mean.
  scripts/guarded.sh "$bench" --benchmark_filter="BM_MoeLayer/$1/0" --benchmark_format=csv \
    2>/dev/null | awk -F, '/^name,/ {for (i = 1; i <= NF; ++i) {if ($i == "\"ms_gemm\"") g = i
                                                                 if ($i == "\"ms_median\"") m = i}}
                           /^"BM_MoeLayer/ {printf "%s %.1f\n", $m, $g}'
}
torch_run() {  # "<median wall ms of the timed steps> <ms inside oneDNN GEMMs per timed step>"
  # Every step issues the same products, so the last `steps` steps' executions are the last
  # steps / (warmup + steps) of them.
  MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 ONEDNN_VERBOSE=1 \
    scripts/guarded.sh /usr/bin/python3 bench/peers/pytorch_moe_layer.py "$1" $steps $warmup |
    awk -F, -v steps=$steps -v all=$((steps + warmup)) '
      /^onednn_verbose,exec,cpu,matmul/ {t[++n] = $NF}
      /^median/ {split($0, w, " "); median = w[3]}
      END {s = 0; for (i = n - int(n * steps / all) + 1; i <= n; ++i) s += t[i]
           printf "%s %.1f\n", median, s / steps}'
}

declare -A ratios bounds
echo "# $(uptime)"
for ((r = 1; r <= rounds; ++r)); do
  for t in "${tokens[@]}"; do
    read -r e eg < <(epo_run "$t")
    read -r p pg < <(torch_run "$t")
    ratio=$(awk -v p="$p" -v e="$e" 'BEGIN {printf "%.3f", p / e}')
    bound=$(awk -v p="$p" -v g="$eg" 'BEGIN {printf "%.3f", p / g}')
    ratios[$t]+="$ratio "
    bounds[$t]+="$bound "
    echo "round $r tokens $t epo_ms $e (gemm $eg) pytorch_ms $p (gemm $pg) speedup $ratio" \
      "bound $bound   # load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
summary() {  # <label> <values...>: median / min / max
  local label=$1
  shift
  printf '%s\n' "$@" | grep . | sort -g |
    awk -v l="$label" '{v[NR] = $1} END {printf "%s median %.3f min %.3f max %.3f", l, v[int((NR + 1) / 2)], v[1], v[NR]}'
}
for t in "${tokens[@]}"; do
  read -ra rs <<<"${ratios[$t]}"
  read -ra bs <<<"${bounds[$t]}"
  echo "tokens $t $(summary speedup "${rs[@]}"), $(summary bound "${bs[@]}") (${#rs[@]} rounds)"
done
echo "# $(uptime)"
