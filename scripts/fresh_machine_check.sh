#!/usr/bin/env bash
# CI's fresh-machine step: installs, builds and smoke-runs the committed project inside a freshly
# bootstrapped Debian 12 (../shared/tools/fresh-check, a chroot with nothing installed by hand),
# so an install step that the CI machine happens not to need (a package it already holds) still
# fails CI. It runs when what a fresh machine needs could have changed since the last fresh pass
# on this machine, or when this machine never passed one; a pass leaves a stamp keyed on a hash of
# these install inputs:
#   - scripts/setup.sh, scripts/build.sh, scripts/mpi_env.sh, CMakePresets.json and cmake/, whole;
#   - of every CMakeLists.txt, the lines that find an outside package (find_*,
#     pkg_check_modules, FetchContent) and the imported targets it links (Pkg::target), so adding
#     a test or a source file does not trigger it but a new dependency does;
#   - the set of system headers the sources include (#include <...>), so a new header-only
#     library does too.
# About 6-8 minutes on an idle 2-core machine when it runs (most of it building the epo binary),
# under a second when it skips.
#
# Usage: scripts/fresh_machine_check.sh [--force]
#   EPO_FRESH_STAMP_DIR   where pass stamps live (default /var/cache/epo-ci)
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t inputs < <(git ls-files scripts/setup.sh scripts/build.sh scripts/mpi_env.sh \
  CMakePresets.json cmake)
mapfile -t lists < <(git ls-files ':(glob)**/CMakeLists.txt')
mapfile -t sources < <(git ls-files ':(glob)**/*.cpp' ':(glob)**/*.h' ':(glob)**/*.cu')
hash=$({
  for f in "${inputs[@]}"; do printf '%s\n' "$f"; sha256sum <"$f"; done
  for f in "${lists[@]}"; do
    printf '%s\n' "$f"
    grep -E '(find_(package|library|path|program|file)|pkg_check_modules|FetchContent)' "$f" || true
  done
  grep -ohE '[A-Za-z0-9_]+::[A-Za-z0-9_]+' "${lists[@]}" | sort -u
  grep -ohE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<[^>]+>' "${sources[@]}" | tr -d ' \t' | sort -u
} | sha256sum | cut -c1-16)
stamp_dir=${EPO_FRESH_STAMP_DIR:-/var/cache/epo-ci}
stamp="$stamp_dir/fresh-machine-$hash"
if [[ "${1:-}" != --force && -f "$stamp" ]]; then
  echo "fresh-machine check: skipped, install inputs unchanged (hash $hash) since the pass of $(cat "$stamp")"
  exit 0
fi

tool=../shared/tools/fresh-check
if [[ ! -x "$tool" ]]; then
  echo "fresh-machine check: skipped, $tool is not here (it comes with the CI machine's shared/)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "fresh-machine check: skipped, a chroot needs root"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

echo "fresh-machine check: install inputs changed (hash $hash): setup, release build and a smoke run on a fresh Debian 12"
start=$(date +%s)
# Every step must pass (no pipe hides a failure): the train log goes to a file, its last line is
# shown. Configuring finds every package the build needs (tests and benchmarks included); the
# build is the epo binary only, which is what a user runs (CI builds everything right after).
smoke='set -euo pipefail
./scripts/setup.sh
{ cmake --preset release && cmake --build --preset release --target epo_cli; } >/tmp/fresh-build.log 2>&1 ||
  { tail -40 /tmp/fresh-build.log; exit 1; }
build/release/bin/epo validate examples/tiny-moe-cpu.yaml >/dev/null
source scripts/mpi_env.sh
OMP_NUM_THREADS=1 mpirun -np 2 build/release/bin/epo train --model tiny-moe -ep 2 --max_steps 4 \
  --moe_a2a_overlap true logger.log_dir=/tmp/fresh-runs >/tmp/fresh-train.log 2>&1 ||
  { tail -20 /tmp/fresh-train.log; exit 1; }
grep "iteration        4/" /tmp/fresh-train.log | cut -c1-160'
"$tool" . "$smoke"
mkdir -p "$stamp_dir"
date -u '+%Y-%m-%d %H:%M UTC'" ($(git rev-parse --short HEAD), $(($(date +%s) - start)) s)" >"$stamp"
echo "fresh-machine check: passed in $(($(date +%s) - start)) s"
