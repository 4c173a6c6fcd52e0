#!/usr/bin/env bash
# epo train across two emulated hosts (scripts/emulated-cluster.sh: network namespaces, 1 Gbit/s
# shaped links, Open MPI over TCP), with 1 and with 2 ranks per host: the job finds its topology
# from the hosts (2 nodes x 1, 2 nodes x 2) and its losses and grad norms equal, bit for bit,
# those of the same run over shared memory on one host with the same topology stated (with 2
# ranks per host all hosts shared one host name, and the job crashed in mca_btl_vader at
# start-up); and each host's ranks run under that host's name and on its
# own cores (every host's Open MPI daemon sees the whole machine and, left alone, bound each
# host's first rank to core 0: both hosts' ranks on one core). Exits 77 (ctest: skipped) where
# namespaces cannot be made.
# Usage: two_hosts_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epotest
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
# Each rank on its host's name and cores.
"$cluster" run bash -c 'mpirun -H "$EPO_CLUSTER_HOSTS" -np 2 \
  bash -c "echo \$(hostname) \$(taskset -cp \$\$ | sed \"s/.*: //\")"' >"$out/hosts.txt" 2>&1 ||
  { cat "$out/hosts.txt"; fail "could not read the ranks' host names and cores"; }
[[ $(sort "$out/hosts.txt" | awk '{print $1}' | tr '\n' ' ') == "$name-h0 $name-h1 " ]] ||
  { cat "$out/hosts.txt"; fail "the ranks do not run under their hosts' names"; }
if (($(nproc) >= 2)); then
  [[ $(awk '{print $2}' "$out/hosts.txt" | sort -u | wc -l) -eq 2 ]] ||
    { cat "$out/hosts.txt"; fail "the two hosts' ranks share cores (want one core set per host)"; }
fi
# 1 rank per host, then 2 (whose ranks also talk through shared memory on their host).
train_matches_shared_memory 1
train_matches_shared_memory 2
echo "PASS: 3 steps over 2 emulated hosts x 1 and x 2, bit-identical to shared memory"
