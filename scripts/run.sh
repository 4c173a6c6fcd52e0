#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds, and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/mpi_env.sh
scripts/build.sh release
build/release/bin/epo --version
