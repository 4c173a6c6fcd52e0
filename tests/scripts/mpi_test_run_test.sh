#!/usr/bin/env bash
# scripts/mpi_test_run.sh against fake launchers: it reruns a job once only when every rank passed
# and Open MPI then reported a rank exiting improperly; any other failure is returned as it is.
set -uo pipefail
# The suite's own rerun record (scripts/test.sh) is not this test's: its fake reruns stay out.
unset EPO_MPI_RERUN_LOG
runner=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# A fake launcher: prints the lines of its Nth call from $dir/outN and exits with $dir/rcN.
cat > "$dir/launcher" <<'FAKE'
#!/usr/bin/env bash
d=$(dirname "$0")
n=$(( $(cat "$d/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/calls"
cat "$d/out$n" 2>/dev/null
exit "$(cat "$d/rc$n" 2>/dev/null || echo 0)"
FAKE
chmod +x "$dir/launcher"

passed='[  PASSED  ] 3 tests.
[mpi_main] all 4 ranks passed'
race='mpiexec has exited due to process rank 0 with PID 0 on
node vm exiting improperly. There are three reasons this could occur:'

# expect NAME STATUS CALLS: the runner's exit status and how many times it launched the job.
expect() {
    local name=$1 want_rc=$2 want_calls=$3
    "$runner" "$dir/launcher" -n 4 ./test > "$dir/log" 2>&1
    local rc=$? calls
    calls=$(cat "$dir/calls")
    if [[ $rc -ne $want_rc || $calls -ne $want_calls ]]; then
        echo "FAIL $name: exit $rc after $calls launch(es), wanted $want_rc after $want_calls"
        cat "$dir/log"
        failures=$((failures + 1))
    else
        echo "ok   $name"
    fi
    rm -f "$dir"/calls "$dir"/out* "$dir"/rc*
}

printf '%s\n' "$passed" > "$dir/out1"
expect "a passing job runs once" 0 1

printf '%s\n%s\n' "$passed" "$race" > "$dir/out1"; echo 1 > "$dir/rc1"
printf '%s\n' "$passed" > "$dir/out2"
expect "the teardown race after every rank passed is rerun once" 0 2

printf '%s\n%s\n' "$passed" "$race" > "$dir/out1"; echo 1 > "$dir/rc1"
printf '%s\n%s\n' "$passed" "$race" > "$dir/out2"; echo 1 > "$dir/rc2"
expect "a second failure is the job's" 1 2

# "exiting improperly" alone is not the race: a rank that really died says so too (PID not 0).
printf '%s\n%s\n' "$passed" 'mpiexec has exited due to process rank 2 with PID 4711 on
node vm exiting improperly. There are three reasons this could occur:' > "$dir/out1"
echo 1 > "$dir/rc1"
expect "a rank that exited improperly with its PID is not rerun" 1 1

# A rerun is recorded for the suite's summary.
export EPO_MPI_RERUN_LOG=$dir/reruns
printf '%s\n%s\n' "$passed" "$race" > "$dir/out1"; echo 1 > "$dir/rc1"
printf '%s\n' "$passed" > "$dir/out2"
expect "a rerun is recorded in EPO_MPI_RERUN_LOG" 0 2
if ! grep -q "rerun after Open MPI's teardown race: $dir/launcher -n 4 ./test" "$dir/reruns"; then
    echo "FAIL the rerun was not recorded: $(cat "$dir/reruns" 2>/dev/null)"
    failures=$((failures + 1))
fi
unset EPO_MPI_RERUN_LOG

printf '[  FAILED  ] Suite.Case\n%s\n' "$race" > "$dir/out1"; echo 1 > "$dir/rc1"
expect "a failing test is not rerun" 1 1

printf '%s\nWARNING: ThreadSanitizer: data race\n%s\n' "$passed" "$race" > "$dir/out1"
echo 66 > "$dir/rc1"
expect "a sanitizer report is not rerun" 66 1

printf '%s\n' "$race" > "$dir/out1"; echo 1 > "$dir/rc1"
expect "without every rank's pass it is not rerun" 1 1

printf '%s\nmpiexec noticed that process rank 1 exited on signal 11\n' "$passed" > "$dir/out1"
echo 139 > "$dir/rc1"
expect "a crash after the pass is not rerun" 139 1

exit $((failures > 0))
