#!/usr/bin/env bash
# A host's link cut in the middle of a run over two emulated hosts, launched with `epo launch`:
# the job ends within the deadline (comm.timeout_s 10 s for the rank to name the stuck
# collective, then epo launch's grace for mpirun, which can wait for good on the silent host's
# daemon after the abort), with a failed status and a message naming the rank, and no rank stays
# behind on either host. (Open MPI's daemon on the cut host can: it is not a rank, and on a real
# cluster it stays on the machine whose link was cut.) Exits 77 (skipped) where namespaces cannot be made.
# Usage: cut_link_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epocut
cluster="$root/scripts/emulated-cluster.sh"
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! ip netns add epocut-probe 2>/dev/null; then
  echo "SKIP: an emulated cluster needs root, iproute2 and network namespaces"
  exit 77
fi
if ! ip netns exec epocut-probe true 2>/dev/null; then  # a chroot: ip netns exec remounts /
  ip netns del epocut-probe
  echo "SKIP: processes cannot enter a network namespace here (ip netns exec fails: a chroot?)"
  exit 77
fi
ip netns del epocut-probe
fail() {
  echo "FAIL: $*"
  cat "$out/run.txt"
  for h in 0 1; do for p in $(ip netns pids epocut-h$h); do echo "left on host $h: $(tr "\0" " " < /proc/$p/cmdline | cut -c1-120)"; done; done
  exit 1
}
"$cluster" down >/dev/null 2>&1
out=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$out"' EXIT
"$cluster" up 2 1gbit >/dev/null || fail "could not build the cluster"
"$cluster" run bash -c "timeout 150 $epo launch --omp-threads 1 --hosts \"\$EPO_CLUSTER_HOSTS\" \
  -n 2 $epo train --model tiny-moe -ep 2 --max_steps 100000 comm.timeout_s=10 \
  logger.log_dir=$out/runs; echo \"exit status \$?\"" >"$out/run.txt" 2>&1 &
for ((i = 0; i < 600; ++i)); do  # until the run has logged step 3 (at most 60 s)
  grep -q "iteration        3/" "$out/run.txt" && break
  sleep 0.1
done
grep -q "iteration        3/" "$out/run.txt" || fail "the run did not reach step 3"
"$cluster" cut 1
cut_at=$(date +%s)
for ((i = 0; i < 900; ++i)); do  # at most 90 s
  grep -q "^exit status" "$out/run.txt" && break
  sleep 0.1
done
took=$(($(date +%s) - cut_at))
grep -q "^exit status" "$out/run.txt" || fail "the job did not end within 90 s of the cut"
grep -q "^exit status 0$" "$out/run.txt" && fail "the job ended with status 0 after a cut link"
grep -Eq "epo: rank [0-9]+ of 2 failed" "$out/run.txt" || fail "no message naming the failed rank"
((took <= 55)) || fail "the job took $took s to end after the cut (deadline 10 s + 30 s grace)"
ranks_left() {  # epo processes still running on the emulated hosts
  for h in 0 1; do
    for p in $(ip netns pids epocut-h$h); do
      tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$epo " && echo "$p"
    done
  done | wc -l
}
for ((i = 0; i < 300; ++i)); do  # at most 30 s
  left=$(ranks_left)
  ((left == 0)) && break
  sleep 0.1
done
((left == 0)) || fail "$left rank(s) stayed behind on the emulated hosts"
echo "PASS: the job ended $took s after the cut, naming the rank, no rank left behind"
