#!/usr/bin/env bash
# The same cut as cut_link_test.sh under a plain `mpirun` (no epo launch to stop it): Open MPI's
# mpirun waited for good on the silent host's daemon after the abort, until the failing rank's
# launcher watch (15 s) ends it. Exits 77 (skipped) where namespaces cannot be made.
# Usage: cut_link_mpirun_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epocutm
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
expect_cut_link_ends "timeout -s KILL 150 mpirun \$EPO_MPIRUN_FLAGS -H \"\$EPO_CLUSTER_HOSTS\" \
  -np 2 -x OMP_NUM_THREADS=1" 40
echo "PASS: the job ended $took s after the cut under plain mpirun, naming the rank, nothing left"
