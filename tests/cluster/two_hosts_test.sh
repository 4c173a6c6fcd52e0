#!/usr/bin/env bash
# epo train across two emulated hosts (scripts/emulated-cluster.sh: network namespaces, 1 Gbit/s
# shaped links, Open MPI over TCP): the job finds its topology from the hosts (2 nodes x 1) and
# its losses and grad norms equal, bit for bit, those of the same run over shared memory on one
# host with the same topology stated. Exits 77 (ctest: skipped) where namespaces cannot be made.
# Usage: two_hosts_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epotest
cluster="$root/scripts/emulated-cluster.sh"
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "SKIP: an emulated cluster needs root and iproute2"
  exit 77
fi
# Creating a namespace and running in it (a chroot can do the first but not the second: `ip netns
# exec` remounts /, which is no mount point there).
if ! ip netns add epotest-probe 2>/dev/null; then
  echo "SKIP: this machine does not allow network namespaces"
  exit 77
fi
if ! ip netns exec epotest-probe true 2>/dev/null; then
  ip netns del epotest-probe
  echo "SKIP: processes cannot enter a network namespace here (ip netns exec fails: a chroot?)"
  exit 77
fi
ip netns del epotest-probe
fail() {
  echo "FAIL: $*"
  exit 1
}
"$cluster" down >/dev/null 2>&1
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$out"' EXIT
out=$(mktemp -d)
"$cluster" up 2 1gbit || fail "could not build the cluster"
train=(train --model tiny-moe -ep 2 --max_steps 3)
"$cluster" run bash -c "OMP_NUM_THREADS=1 timeout 120 mpirun -x OMP_NUM_THREADS \
  -H \"\$EPO_CLUSTER_HOSTS\" -np 2 $epo ${train[*]} logger.log_dir=$out/net" >"$out/net.txt" 2>&1 ||
  { cat "$out/net.txt"; fail "the run over the emulated hosts failed"; }
source "$root/scripts/mpi_env.sh"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 "$epo" "${train[@]}" --num_nodes 2 --gpus_per_node 1 \
  logger.log_dir="$out/shm" >"$out/shm.txt" 2>&1 || { cat "$out/shm.txt"; fail "the shared-memory run failed"; }
grep -q "^  num_nodes: 2$" "$out/net.txt" || fail "the job over two hosts did not resolve to 2 nodes"
losses() { grep -o "lm loss: .*grad norm: [^|]*" "$1"; }
[[ $(losses "$out/net.txt" | wc -l) -eq 3 ]] || fail "expected 3 logged steps"
diff <(losses "$out/net.txt") <(losses "$out/shm.txt") || fail "losses differ between TCP and shared memory"
echo "PASS: 3 steps over two emulated hosts, bit-identical to shared memory"
