#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds, and runs it. For now the job
# is `epo validate` on the shipped example configurations (a later issue makes it the benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/mpi_env.sh
scripts/build.sh release
for example in examples/qwen3-30b-a3b-ep-overlap.yaml examples/tiny-moe-cpu.yaml; do
  echo "== epo validate $example"
  build/release/bin/epo validate "$example"
done
