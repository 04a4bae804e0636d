#!/usr/bin/env bash
# The test command on a GPU machine without Jupyter (the device image has no nbval): the unit tests spread over
# WORKERS processes (a first run is mostly Triton compiling, which is CPU work), then every notebook through
# tools/notebooks_on_device.py, one process each, side by side. Prints the wall time of each part.
#   bash tools/test_on_device.sh            (from the repository root; WORKERS=8 by default)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
logs=$(mktemp -d)
start=$(date +%s)
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests -n "${WORKERS:-8}" --durations=10
tests_status=$?
tests_done=$(date +%s)
pids=()
for nb in notebooks/*.ipynb; do
    # Eight notebooks side by side on 16 cores: torch's default of one CPU thread per core each made small CPU
    # tensor ops crawl (a 1 s cell of chapter 02 took 42 s), so each notebook gets two.
    OMP_NUM_THREADS=${NOTEBOOK_THREADS:-2} python3 tools/notebooks_on_device.py "$nb" > "$logs/$(basename "$nb").log" 2>&1 &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
cat "$logs"/*.log
end=$(date +%s)
echo "unit tests: $((tests_done - start)) s (pytest exit $tests_status); notebooks side by side: $((end - tests_done)) s" \
     "($failed failed); in all $((end - start)) s"
[ "$tests_status" -eq 0 ] && [ "$failed" -eq 0 ]
