#!/usr/bin/env bash
# Runs a command (a benchmark) in a scheduler group of its own at high priority, so that builds
# and tests running at the same time on a shared machine take less CPU from the measurement.
#
#   scripts/guarded.sh build/release/bench/moe_bench --benchmark_filter=BM_MoeLayer
#
# Linux shares CPU time fairly between sessions ("autogroups"), whatever their nice values; a
# plain `nice -n -19` only ranks processes inside one session. This starts a new session and
# gives its autogroup nice -19. Needs root (CAP_SYS_NICE); without it the command still runs,
# unguarded, with a warning. Memory bandwidth and caches stay shared: on a loaded machine guarded
# numbers are still lower than on a quiet one, so compare variants within one run.
set -euo pipefail
if (($# == 0)); then
  echo "usage: scripts/guarded.sh COMMAND [ARGS...]" >&2
  exit 2
fi
exec setsid -w bash -c '
  if ! { echo -19 > /proc/self/autogroup; } 2>/dev/null; then
    echo "guarded.sh: cannot raise the priority of this session (needs root); running unguarded" >&2
  fi
  exec "$@"' guarded "$@"
