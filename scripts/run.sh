#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds, checks the shipped example
# configurations, then runs the benchmark harness on its embedded default (a proxy of
# qwen3-30b-a3b on 2 ranks as 2 nodes, baseline vs overlap; 2 min 50 s measured on an idle 2-core
# VM) and judges the run directory it wrote with epo check-run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/mpi_env.sh
scripts/build.sh release
for example in examples/qwen3-30b-a3b-ep-overlap.yaml examples/tiny-moe-cpu.yaml; do
  echo "== epo validate $example"
  build/release/bin/epo validate "$example"
done
out="runs/bench-$(date +%Y%m%d-%H%M%S)"
echo "== epo bench --compare --out $out"
build/release/bin/epo bench --compare --out "$out"
echo "== epo check-run $out"
build/release/bin/epo check-run "$out"
