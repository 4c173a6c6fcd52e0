#!/usr/bin/env bash
# A host's link cut in the middle of a run over two emulated hosts, launched with a plain
# `mpirun` (no epo launch to stop it): the job ends within comm.timeout_s (10 s, for a rank to
# name the stuck collective and the silent rank) plus the failing rank's launcher watch (15 s:
# Open MPI's mpirun waited for good on the silent host's daemon after the abort), with a failed
# status, the rank's message naming the silent rank, no segmentation-fault backtrace, and no epo
# process or Open MPI daemon left on either host. Exits 77 (skipped) where namespaces cannot be
# made.
# Usage: cut_link_mpirun_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epocutm
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
"$cluster" run bash -c "timeout -s KILL 150 mpirun \$EPO_MPIRUN_FLAGS -H \"\$EPO_CLUSTER_HOSTS\" \
  -np 2 -x OMP_NUM_THREADS=1 $epo train --model tiny-moe -ep 2 --num_nodes 2 --gpus_per_node 1 \
  --max_steps 100000 comm.timeout_s=10 logger.log_dir=$out/runs; echo \"exit status \$?\"" \
  >"$out/run.txt" 2>&1 &
wait_for "$out/run.txt" 60 "iteration        3/" || fail "the run did not reach step 3"
"$cluster" cut 1
cut_at=$(date +%s)
wait_for "$out/run.txt" 90 "^exit status" || fail "the job did not end within 90 s of the cut"
took=$(($(date +%s) - cut_at))
grep -q "^exit status 0$" "$out/run.txt" && fail "the job ended with status 0 after a cut link"
grep -Eq "epo: rank [0-9]+ of 2 failed: .*(world rank\(s\) [01] |world rank\(s\) [01]:)" \
  "$out/run.txt" || fail "no message naming the failed rank and the silent one"
grep -q "Segmentation fault" "$out/run.txt" && fail "a segmentation fault was reported"
((took <= 40)) || fail "the job took $took s to end after the cut (deadline 10 s + 15 s watch)"
expect_no_rank_left
for ((h = 0; h < 2; ++h)); do
  for p in $(ip netns pids "$name-h$h" 2>/dev/null); do
    grep -q "^orted$" "/proc/$p/comm" 2>/dev/null && sleep 20 && [[ -e /proc/$p ]] &&
      fail "Open MPI's daemon stayed on host $h"
  done
done
echo "PASS: the job ended $took s after the cut under plain mpirun, naming the rank, nothing left"
