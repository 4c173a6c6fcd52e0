#!/usr/bin/env bash
# Heavy packet loss and a slow, delayed link on one emulated host from step 2 on (5% of packets
# dropped each way, the rate cut to 50 Mbit/s, and 20 ms each way where the kernel has netem) slow
# a run down but change nothing else: it finishes with status 0 and its losses and grad norms
# equal, bit for bit, those of the same run over shared memory. The test checks that the steps it
# judges ran under the impairment: at least 3 steps are logged after the impairment is in place,
# and they are slower than the steps before it. Exits 77 (skipped) where namespaces cannot be
# made.
# Usage: loss_delay_test.sh PROJECT_ROOT EPO_BINARY
set -u
root=$1
epo=$2
export EPO_CLUSTER_NAME=epoloss
source "$root/tests/cluster/cluster_test_lib.sh"
skip_unless_namespaces
start_cluster 2 1gbit
steps=12
train=(train --model tiny-moe -ep 2 --max_steps $steps comm.timeout_s=60)
"$cluster" run bash -c "timeout 240 $epo launch --omp-threads 1 --hosts \"\$EPO_CLUSTER_HOSTS\" \
  -n 2 $epo ${train[*]} logger.log_dir=$out/net; echo \"exit status \$?\"" >"$out/run.txt" 2>&1 &
impairment=(rate 50mbit loss 5%)
"$cluster" impair 0 delay 1ms >/dev/null 2>&1 && impairment+=(delay 20ms)  # netem present?
"$cluster" impair 0
wait_for "$out/run.txt" 60 "iteration        2/" || fail "the run did not reach step 2"
"$cluster" impair 1 "${impairment[@]}" || fail "could not impair host 1's link"
before=$(grep -c "iteration  *[0-9]*/" "$out/run.txt")  # steps logged before the impairment
wait_for "$out/run.txt" 240 "^exit status" || fail "the run did not end within 240 s"
grep -q "^exit status 0$" "$out/run.txt" || fail "the run failed under loss and delay"
source "$root/scripts/mpi_env.sh"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 "$epo" "${train[@]}" --num_nodes 2 --gpus_per_node 1 \
  logger.log_dir="$out/shm" >"$out/shm.txt" 2>&1 || { cat "$out/shm.txt"; fail "the shared-memory run failed"; }
[[ $(losses "$out/run.txt" | wc -l) -eq $steps ]] || fail "expected $steps logged steps"
((before <= steps - 3)) || fail "only $((steps - before)) step(s) ran under the impairment"
# Median step time (ms) of steps 2..before (step 1 includes start-up) and of those after.
median_ms() { sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }
step_ms() { grep -o "elapsed time per iteration (ms): [0-9.]*" "$out/run.txt" | awk '{ print $NF }'; }
fast=$(step_ms | sed -n "2,${before}p" | median_ms)
slow=$(step_ms | sed -n "$((before + 2)),\$p" | median_ms)
awk -v f="$fast" -v s="$slow" 'BEGIN { exit !(s > f) }' ||
  fail "the steps after the impairment (median $slow ms) were not slower than before ($fast ms)"
diff <(losses "$out/run.txt") <(losses "$out/shm.txt") ||
  fail "losses differ between the impaired link and shared memory"
echo "PASS: $((steps - before)) of $steps steps with host 1's link at ${impairment[*]} (median" \
  "$slow ms against $fast ms before), bit-identical to shared memory"
