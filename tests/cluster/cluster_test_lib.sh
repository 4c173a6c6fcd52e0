# Shared by the emulated-cluster tests (sourced): the skip probe, failure reporting and the
# checks every fault test makes. Before sourcing, set EPO_CLUSTER_NAME (the test's own cluster),
# root (the project) and epo (the binary).
cluster="$root/scripts/emulated-cluster.sh"
name=$EPO_CLUSTER_NAME

# Exits 77 (ctest: skipped), saying why, where an emulated cluster cannot run: no root, no
# iproute2, no network namespaces, or namespaces that processes cannot enter (a chroot can create
# one but not exec into it: `ip netns exec` remounts /, which is no mount point there).
skip_unless_namespaces() {
  if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "SKIP: an emulated cluster needs root and iproute2"
    exit 77
  fi
  if ! ip netns add "$name-probe" 2>/dev/null; then
    echo "SKIP: this machine does not allow network namespaces"
    exit 77
  fi
  if ! ip netns exec "$name-probe" true 2>/dev/null; then
    ip netns del "$name-probe"
    echo "SKIP: processes cannot enter a network namespace here (ip netns exec fails: a chroot?)"
    exit 77
  fi
  # Each emulated host also takes its own host name (a UTS namespace, util-linux's unshare).
  if ! ip netns exec "$name-probe" unshare --uts true 2>/dev/null; then
    ip netns del "$name-probe"
    echo "SKIP: a host name namespace cannot be made here (unshare --uts fails)"
    exit 77
  fi
  ip netns del "$name-probe"
}

# A fresh cluster of `$1` hosts at rate `$2`, removed with the test's temporary folder on exit.
start_cluster() {
  "$cluster" down >/dev/null 2>&1
  out=$(mktemp -d)
  trap '"$cluster" down >/dev/null 2>&1; rm -rf "$out"' EXIT
  "$cluster" up "$1" "$2" >/dev/null || fail "could not build the cluster"
  num_hosts=$1
}

fail() {
  echo "FAIL: $*"
  [[ -f ${out:-}/run.txt ]] && cat "$out/run.txt"
  for ((h = 0; h < ${num_hosts:-0}; ++h)); do
    for p in $(ip netns pids "$name-h$h" 2>/dev/null); do
      echo "left on host $h: $(tr "\0" " " <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
    done
  done
  exit 1
}

# Waits (at most $2 s) until the file $1 matches the pattern $3.
wait_for() {
  local file=$1 limit=$2 pattern=$3
  for ((i = 0; i < limit * 10; ++i)); do
    grep -q -- "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# epo processes still running on the emulated hosts.
ranks_left() {
  for ((h = 0; h < num_hosts; ++h)); do
    for p in $(ip netns pids "$name-h$h" 2>/dev/null); do
      tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$epo " && echo "$p"
    done
  done | wc -l
}

# Fails unless every epo process on the hosts is gone within 30 s.
expect_no_rank_left() {
  local left=0
  for ((i = 0; i < 300; ++i)); do
    left=$(ranks_left)
    ((left == 0)) && return 0
    sleep 0.1
  done
  fail "$left rank(s) stayed behind on the emulated hosts"
}

# The lines that must be identical between two runs of the same training.
losses() { grep -o "lm loss: .*grad norm: [^|]*" "$1"; }

# tiny-moe trains 3 steps over the cluster's 2 hosts with `$1` ranks each (EP = all ranks), then
# the same topology over shared memory on this host; fails unless the job resolved to 2 nodes of
# `$1` and the losses and grad norms are bit-identical.
train_matches_shared_memory() {
  local slots=$1 np=$(( 2 * $1 )) tag="net$1"
  local train=(train --model tiny-moe -ep "$np" --max_steps 3)
  EPO_CLUSTER_SLOTS=$slots "$cluster" run bash -c "OMP_NUM_THREADS=1 timeout 180 mpirun \
    -x OMP_NUM_THREADS -H \"\$EPO_CLUSTER_HOSTS\" -np $np $epo ${train[*]} \
    logger.log_dir=$out/$tag" >"$out/$tag.txt" 2>&1 ||
    { cat "$out/$tag.txt"; fail "the run over 2 hosts x $slots failed"; }
  (source "$root/scripts/mpi_env.sh"
   OMP_NUM_THREADS=1 timeout 180 mpirun -np "$np" "$epo" "${train[@]}" --num_nodes 2 \
     --gpus_per_node "$slots" logger.log_dir="$out/shm$slots") >"$out/shm$slots.txt" 2>&1 ||
    { cat "$out/shm$slots.txt"; fail "the shared-memory run of 2 x $slots failed"; }
  grep -q "^  num_nodes: 2$" "$out/$tag.txt" || fail "2 hosts x $slots did not resolve to 2 nodes"
  grep -q "^  gpus_per_node: $slots$" "$out/$tag.txt" ||
    fail "2 hosts x $slots did not resolve to $slots ranks per node"
  [[ $(losses "$out/$tag.txt" | wc -l) -eq 3 ]] || fail "2 hosts x $slots: expected 3 logged steps"
  diff <(losses "$out/$tag.txt") <(losses "$out/shm$slots.txt") ||
    fail "2 hosts x $slots: losses differ between the hosts and shared memory"
}

# Runs tiny-moe over the cluster's 2 hosts through the launcher line `$1` (run on host 0; the
# epo command follows it), cuts host 1's link after step 3, and fails unless the job ends within
# `$2` s of the cut with a failed status, a message naming the stuck collective and the rank it
# waited for (as docs/emulated-cluster.md promises), no segmentation fault, and neither an epo
# process nor Open MPI's daemon left on either host (within 30 s). Sets `took`.
expect_cut_link_ends() {
  local launch=$1 deadline=$2
  "$cluster" run bash -c "$launch $epo train --model tiny-moe -ep 2 --num_nodes 2 \
    --gpus_per_node 1 --max_steps 100000 comm.timeout_s=10 logger.log_dir=$out/runs; \
    echo \"exit status \$?\"" >"$out/run.txt" 2>&1 &
  wait_for "$out/run.txt" 60 "iteration        3/" || fail "the run did not reach step 3"
  "$cluster" cut 1
  local cut_at
  cut_at=$(date +%s)
  wait_for "$out/run.txt" 90 "^exit status" || fail "the job did not end within 90 s of the cut"
  took=$(($(date +%s) - cut_at))
  grep -q "^exit status 0$" "$out/run.txt" && fail "the job ended with status 0 after a cut link"
  grep -Eq "epo: rank [01] of 2 failed: .*[a-z_]+ #[0-9]+ on group [a-z_0-9]+ .*world rank\(s\) [01]( |:)" \
    "$out/run.txt" || fail "no message naming the stuck collective and the silent rank"
  grep -q "Segmentation fault" "$out/run.txt" && fail "a segmentation fault was reported"
  ((took <= deadline)) || fail "the job took $took s to end after the cut (deadline $deadline s)"
  expect_no_rank_left
  local daemons
  for ((i = 0; i < 300; ++i)); do
    daemons=0
    for ((h = 0; h < num_hosts; ++h)); do
      for p in $(ip netns pids "$name-h$h" 2>/dev/null); do
        grep -q "^orted$" "/proc/$p/comm" 2>/dev/null && daemons=$((daemons + 1))
      done
    done
    ((daemons == 0)) && return 0
    sleep 0.1
  done
  fail "$daemons Open MPI daemon(s) stayed on the emulated hosts"
}
