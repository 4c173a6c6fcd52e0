#!/usr/bin/env bash
# epo train on two emulated hosts of two ranks each (EP 4 over 2 nodes x 2): the ranks of a host
# talk through Open MPI's shared-memory transport, the hosts over TCP, and the losses and grad
# norms equal, bit for bit, those of the same topology over shared memory on one host. (All hosts
# shared one host name, so the shared-memory segments of two hosts' local rank 0 were one file
# and the job crashed in mca_btl_vader at start-up.) Exits 77 (ctest: skipped) where namespaces
# cannot be made.
# Usage: two_by_two_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epotest
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
train=(train --model tiny-moe -ep 4 --max_steps 3)
EPO_CLUSTER_SLOTS=2 "$cluster" run bash -c "OMP_NUM_THREADS=1 timeout 180 mpirun -x OMP_NUM_THREADS \
  -H \"\$EPO_CLUSTER_HOSTS\" -np 4 $epo ${train[*]} logger.log_dir=$out/net" >"$out/net.txt" 2>&1 ||
  { cat "$out/net.txt"; fail "the run over 2 hosts x 2 ranks failed"; }
source "$root/scripts/mpi_env.sh"
OMP_NUM_THREADS=1 timeout 180 mpirun -np 4 "$epo" "${train[@]}" --num_nodes 2 --gpus_per_node 2 \
  logger.log_dir="$out/shm" >"$out/shm.txt" 2>&1 || { cat "$out/shm.txt"; fail "the shared-memory run failed"; }
grep -q "^  num_nodes: 2$" "$out/net.txt" || fail "the job over 2 hosts did not resolve to 2 nodes"
grep -q "^  gpus_per_node: 2$" "$out/net.txt" || fail "the job did not resolve to 2 ranks per node"
[[ $(losses "$out/net.txt" | wc -l) -eq 3 ]] || fail "expected 3 logged steps"
diff <(losses "$out/net.txt") <(losses "$out/shm.txt") || fail "losses differ between the hosts and shared memory"
echo "PASS: 3 steps over 2 emulated hosts x 2 ranks, bit-identical to shared memory"
