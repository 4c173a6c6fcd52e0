#!/usr/bin/env bash
# Soak of a cut link (outside CI, minutes per try): over two emulated hosts, trains tiny-moe in
# several layouts, cuts host 1's link at a random moment of a step, and checks that the job ends
# within comm.timeout_s + 30 s with a failed status, a message naming the failed rank, no
# segmentation fault, and no epo process left on either host. Under both launchers: plain
# `mpirun` and `epo launch`.
#   scripts/cut_link_soak.sh [TRIES_PER_CASE] [EPO_BINARY]     (root; iproute2)
#   EPO_SOAK_CASES="name ..."   only these cases (default: all five below); with a cluster name of
#   its own (EPO_CLUSTER_NAME, default eposoak), a second soak can run beside the first.
#   EPO_SOAK_LAUNCHERS="mpirun epo_launch"   the launchers to try (default: both).
# Prints one line per try and a count per case; exits 1 if any try failed. A try whose job has not
# reached its third step within 5 minutes (a loaded machine) is not cut: it is reported, run again
# (5 at most in a row) and counted apart.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
tries=${1:-20}
epo=${2:-$root/build/release/bin/epo}
export EPO_CLUSTER_NAME=${EPO_CLUSTER_NAME:-eposoak}
cluster="$root/scripts/emulated-cluster.sh"
timeout_s=10
base="--model tiny-moe --num_nodes 2 --gpus_per_node 1 --max_steps 100000 comm.timeout_s=$timeout_s"
# Where the cut lands: the layout decides what is in flight at a random moment of a step.
declare -A cases=(
  [alltoall_overlap]="-ep 2 --moe_a2a_overlap true"
  [dp_reduction]="-ep 1 model.num_moe_experts=4"
  [pipeline_transfer]="-pp 2 -ep 1 model.num_layers=4"
  [flex_dispatch]="-ep 2 --moe_flex_dispatcher_backend deepep --moe_a2a_overlap true"
  [param_gather]="-ep 2 ddp.use_distributed_optimizer=true ddp.overlap_param_gather=true"
)
failed=0
not_started=0
retries=0
out=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$out"' EXIT
selected=${EPO_SOAK_CASES:-${!cases[*]}}
for name in $selected; do
  [[ -n ${cases[$name]:-} ]] || { echo "EPO_SOAK_CASES: no case '$name' (cases: ${!cases[*]})"; exit 1; }
done
for name in $selected; do
  for launcher in ${EPO_SOAK_LAUNCHERS:-mpirun epo_launch}; do
    ok=0
    for ((t = 1; t <= tries; ++t)); do
      "$cluster" down >/dev/null 2>&1
      "$cluster" up 2 1gbit >/dev/null || { echo "cannot build the cluster"; exit 1; }
      args="$base ${cases[$name]} logger.log_dir=$out/runs"
      if [[ $launcher == mpirun ]]; then
        cmd="timeout -s KILL 200 mpirun \$EPO_MPIRUN_FLAGS -H \"\$EPO_CLUSTER_HOSTS\" -np 2 -x OMP_NUM_THREADS=1 $epo train $args"
      else
        cmd="timeout -s KILL 200 $epo launch --omp-threads 1 --hosts \"\$EPO_CLUSTER_HOSTS\" -n 2 $epo train $args"
      fi
      # Emptied here, not by the background job's redirection: that may run after the wait below
      # has already read the previous try's "iteration 3/" and cut the link during start-up.
      : >"$out/run.txt"
      "$cluster" run bash -c "$cmd; echo \"exit status \$?\"" >>"$out/run.txt" 2>&1 &
      # The cut must land in a step: a job still starting (slow on a loaded machine) would fail
      # at start-up instead, which says nothing about a cut link. Up to 5 minutes.
      started=0
      for ((i = 0; i < 3000; ++i)); do
        grep -q "iteration        3/" "$out/run.txt" && { started=1; break; }
        grep -q "^exit status" "$out/run.txt" && break
        sleep 0.1
      done
      if ((started == 0)); then
        "$cluster" down >/dev/null 2>&1
        wait
        not_started=$((not_started + 1))
        cp "$out/run.txt" "/tmp/soak-$name-$launcher-$t.txt"
        echo "$name $launcher try $t: NOT STARTED (no third step; log /tmp/soak-$name-$launcher-$t.txt)"
        ((t--))  # the try does not count; at most 5 such in a row
        ((++retries <= 5)) || { echo "$name $launcher: the job does not start; stopping"; exit 1; }
        continue
      fi
      retries=0
      sleep "0.$((RANDOM % 10))$((RANDOM % 10))"  # a random moment of a step
      "$cluster" cut 1
      at=$(date +%s)
      for ((i = 0; i < 1200; ++i)); do grep -q "^exit status" "$out/run.txt" && break; sleep 0.1; done
      took=$(($(date +%s) - at))
      sleep 3
      left=0
      for h in 0 1; do
        for p in $(ip netns pids "$EPO_CLUSTER_NAME-h$h" 2>/dev/null); do
          tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$epo " && left=$((left + 1))
        done
      done
      why=""
      grep -q "^exit status" "$out/run.txt" || why+=" no-end"
      grep -q "^exit status 0$" "$out/run.txt" && why+=" status-0"
      grep -Eq "epo: rank [0-9]+ of 2 failed" "$out/run.txt" || why+=" no-rank-named"
      grep -q "Segmentation fault" "$out/run.txt" && why+=" segfault"
      ((took <= timeout_s + 30)) || why+=" slow"
      ((left == 0)) || why+=" left=$left"
      wait
      if [[ -z $why ]]; then ok=$((ok + 1)); else failed=1; cp "$out/run.txt" "/tmp/soak-$name-$launcher-$t.txt"; fi
      echo "$name $launcher try $t: ended ${took}s after the cut$([[ -n $why ]] && echo " FAILED:$why (log /tmp/soak-$name-$launcher-$t.txt)")"
    done
    echo "== $name under $launcher: $ok of $tries tries passed"
  done
done
((not_started == 0)) || echo "$not_started tries did not reach a step before the cut and were run again"
exit $failed
