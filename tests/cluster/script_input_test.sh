#!/usr/bin/env bash
# scripts/emulated-cluster.sh on bad input: a zero rate is refused before anything is built (tc
# printed its usage and left a half-built cluster that `status` called fine); a failed build
# leaves nothing behind; a host that does not exist ends the command with the script's message
# and status 1 (it printed the message, then ran `ip` with an empty name and exited 255).
set -uo pipefail
root=$1
epo=$2
export EPO_CLUSTER_NAME=epoin
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
"$cluster" down >/dev/null 2>&1
trap '"$cluster" down >/dev/null 2>&1' EXIT

expect() {  # STATUS PATTERN CMD...: the command's status and a line of its output
  local status=$1 pattern=$2
  shift 2
  local text code
  text=$("$@" 2>&1)
  code=$?
  [[ $code -eq $status ]] || fail "'$*' exited $code, not $status: $text"
  grep -q -- "$pattern" <<<"$text" || fail "'$*' did not say '$pattern': $text"
}

for rate in 0mbit 0bit 0.0gbit; do
  expect 1 "RATE = '$rate': give a tc rate above zero" "$cluster" up 2 "$rate"
  [[ ! -d /run/$name-cluster ]] || fail "up 2 $rate left /run/$name-cluster"
  ip netns list | grep -q "^$name-" && fail "up 2 $rate left namespaces: $(ip netns list)"
  expect 1 "no cluster is up" "$cluster" status
done

# A build that fails half-way (tc refuses a rate the pattern lets through) removes what it built.
expect 1 "up failed; removing what it built" "$cluster" up 2 99999999999999999999gbit
[[ ! -d /run/$name-cluster ]] || fail "a failed up left /run/$name-cluster"
ip netns list | grep -q "^$name-" && fail "a failed up left namespaces: $(ip netns list)"

"$cluster" up 2 500mbit >/dev/null || fail "could not build the cluster"
num_hosts=2
for verb in cut restore kill; do
  expect 1 "no host '5' (hosts 0..1)" "$cluster" "$verb" 5
done
expect 1 "impair: rate '0mbit': give a rate above zero" "$cluster" impair 1 rate 0mbit
echo "PASS: bad rates and hosts refused, failed builds removed"
