#!/usr/bin/env bash
# Fails when a C++ file of the project is not formatted as .clang-format says (clang-format's own
# check, no changes made). Run by ctest (test `clang_format`); fix with:
#   git ls-files '*.cpp' '*.h' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h')
else
  mapfile -t files < <(find src apps tests bench -name '*.cpp' -o -name '*.h')
fi
bad=$(clang-format --dry-run -Werror "${files[@]}" 2>&1 | grep -oE '^[^:]+\.(cpp|h)(:[0-9]+)' | sort -u -t: -k1,1) || true
if [[ -n "$bad" ]]; then
  echo "check_format: not clang-formatted (first line off per file):"
  echo "$bad"
  echo "fix: clang-format -i FILE (the repository's .clang-format)"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
