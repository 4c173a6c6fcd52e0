#!/usr/bin/env bash
# epo train across two emulated hosts (scripts/emulated-cluster.sh: network namespaces, 1 Gbit/s
# shaped links, Open MPI over TCP): the job finds its topology from the hosts (2 nodes x 1) and
# its losses and grad norms equal, bit for bit, those of the same run over shared memory on one
# host with the same topology stated; and each host's ranks run under that host's name and on its
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
train=(train --model tiny-moe -ep 2 --max_steps 3)
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
"$cluster" run bash -c "OMP_NUM_THREADS=1 timeout 120 mpirun -x OMP_NUM_THREADS \
  -H \"\$EPO_CLUSTER_HOSTS\" -np 2 $epo ${train[*]} logger.log_dir=$out/net" >"$out/net.txt" 2>&1 ||
  { cat "$out/net.txt"; fail "the run over the emulated hosts failed"; }
source "$root/scripts/mpi_env.sh"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 "$epo" "${train[@]}" --num_nodes 2 --gpus_per_node 1 \
  logger.log_dir="$out/shm" >"$out/shm.txt" 2>&1 || { cat "$out/shm.txt"; fail "the shared-memory run failed"; }
grep -q "^  num_nodes: 2$" "$out/net.txt" || fail "the job over two hosts did not resolve to 2 nodes"
[[ $(losses "$out/net.txt" | wc -l) -eq 3 ]] || fail "expected 3 logged steps"
diff <(losses "$out/net.txt") <(losses "$out/shm.txt") || fail "losses differ between TCP and shared memory"
echo "PASS: 3 steps over two emulated hosts, bit-identical to shared memory"
