#!/usr/bin/env bash
# A host's link cut in the middle of a run over two emulated hosts, launched with `epo launch`:
# the job ends within the deadline (comm.timeout_s 10 s for the rank to name the stuck
# collective, then epo launch's grace for mpirun, which can wait for good on the silent host's
# daemon after the abort), with a failed status and a message naming the rank, and no rank stays
# behind on either host. (Open MPI's daemon on the cut host can: it is not a rank, and on a real
# cluster it stays on the machine whose link was cut.) Exits 77 (skipped) where namespaces cannot
# be made.
# Usage: cut_link_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epocut
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
"$cluster" run bash -c "timeout 150 $epo launch --omp-threads 1 --hosts \"\$EPO_CLUSTER_HOSTS\" \
  -n 2 $epo train --model tiny-moe -ep 2 --max_steps 100000 comm.timeout_s=10 \
  logger.log_dir=$out/runs; echo \"exit status \$?\"" >"$out/run.txt" 2>&1 &
wait_for "$out/run.txt" 60 "iteration        3/" || fail "the run did not reach step 3"
"$cluster" cut 1
cut_at=$(date +%s)
wait_for "$out/run.txt" 90 "^exit status" || fail "the job did not end within 90 s of the cut"
took=$(($(date +%s) - cut_at))
grep -q "^exit status 0$" "$out/run.txt" && fail "the job ended with status 0 after a cut link"
# As docs/emulated-cluster.md promises: the stuck collective and the rank it waited for.
grep -Eq "epo: rank [01] of 2 failed: .*[a-z_]+ #[0-9]+ on group [a-z_0-9]+ .*world rank\(s\) [01]( |:)" \
  "$out/run.txt" || fail "no message naming the stuck collective and the silent rank"
((took <= 55)) || fail "the job took $took s to end after the cut (deadline 10 s + 30 s grace)"
expect_no_rank_left
echo "PASS: the job ended $took s after the cut, naming the rank, no rank left behind"
