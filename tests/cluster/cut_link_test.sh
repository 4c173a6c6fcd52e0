#!/usr/bin/env bash
# A host's link cut in the middle of a run over two emulated hosts: the job ends within the
# deadline (comm.timeout_s 10 s, and Open MPI giving up on the silent host's daemon, which
# scripts/mpi_env.sh bounds at ~25 s), with a failed status and a message naming the rank, and
# no process stays behind on either host. Exits 77 (skipped) where namespaces cannot be made.
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
ip netns del epocut-probe
fail() {
  echo "FAIL: $*"
  cat "$out/run.txt"
  exit 1
}
"$cluster" down >/dev/null 2>&1
out=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$out"' EXIT
"$cluster" up 2 1gbit >/dev/null || fail "could not build the cluster"
"$cluster" run bash -c "OMP_NUM_THREADS=1 timeout 150 mpirun -x OMP_NUM_THREADS \
  -H \"\$EPO_CLUSTER_HOSTS\" -np 2 $epo train --model tiny-moe -ep 2 --max_steps 100000 \
  comm.timeout_s=10 logger.log_dir=$out/runs; echo \"exit status \$?\"" >"$out/run.txt" 2>&1 &
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
((took <= 45)) || fail "the job took $took s to end after the cut (deadline 10 s + ~25 s)"
for ((i = 0; i < 300; ++i)); do  # processes left on either host (at most 30 s)
  left=$(for h in 0 1; do ip netns pids epocut-h$h; done | wc -l)
  ((left == 0)) && break
  sleep 0.1
done
((left == 0)) || fail "$left process(es) stayed behind on the emulated hosts"
echo "PASS: the job ended $took s after the cut, naming the rank, nothing left behind"
