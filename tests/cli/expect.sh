#!/usr/bin/env bash
# Runs one command-line test: expect.sh STATUS [PATTERN...] -- COMMAND [ARGS...]
# Passes when COMMAND exits with STATUS, every PATTERN (an extended regular expression, matched
# line by line) occurs in its combined stdout+stderr, and nothing in it looks like a crash.
set -u
expected=$1
shift
patterns=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  patterns+=("$1")
  shift
done
shift
output=$("$@" 2>&1)
status=$?
fail() {
  printf 'FAIL: %s\n  exit status: %s (expected %s)\n--- output ---\n%s\n' \
    "$1" "$status" "$expected" "$output"
  exit 1
}
[[ $status -eq $expected ]] || fail "wrong exit status"
for pattern in "${patterns[@]}"; do
  grep -Eq -- "$pattern" <<<"$output" || fail "output does not match /$pattern/"
done
if grep -Eq 'terminate called|Segmentation fault|Aborted|AddressSanitizer|runtime error:|internal error' <<<"$output"; then
  fail "the output shows a crash or an internal error"
fi
exit 0
