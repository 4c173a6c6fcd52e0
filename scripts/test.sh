#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs dependencies, builds the optimized and the
# sanitizer (ASan + UBSan) builds, and runs every test in both. This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/mpi_env.sh

scripts/build.sh release
ctest --preset release -j2

scripts/build.sh asan
ctest --preset asan -j2
echo "test.sh: all tests passed"
