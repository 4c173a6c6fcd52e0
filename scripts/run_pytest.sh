#!/usr/bin/env bash
# Runs the Python module's tests with Debian's pytest: run_pytest.sh MODULE_DIR TESTS_DIR.
# pytest's exit status 5 means it collected no test at all, which must fail the run rather than
# pass it silently (a renamed file or a broken import would otherwise look green).
set -u
module_dir=$1
tests_dir=$2
PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 -m pytest -q "$tests_dir"
status=$?
if [[ $status -eq 5 ]]; then
  echo "run_pytest: pytest collected no tests in $tests_dir" >&2
  exit 1
fi
exit $status
