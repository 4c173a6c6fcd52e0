#!/usr/bin/env bash
# A host's link cut in the middle of a run over two emulated hosts, launched with `epo launch`:
# the job ends within 40 s of the cut (comm.timeout_s 10 s for a rank to name the stuck collective
# and the silent rank, then the failing rank's launcher watch, 15 s, or epo launch's own 30 s
# grace), failed, with that message, and nothing left on either host
# (cluster_test_lib.sh expect_cut_link_ends). Exits 77 (skipped) where namespaces cannot be made.
# Usage: cut_link_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epocut
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
expect_cut_link_ends "timeout 150 $epo launch --omp-threads 1 --hosts \"\$EPO_CLUSTER_HOSTS\" -n 2" 40
echo "PASS: the job ended $took s after the cut under epo launch, naming the rank, nothing left"
