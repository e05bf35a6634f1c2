#!/usr/bin/env bash
# The README's test command RUNS times in a row, with one core kept busy by a CPU hog
# (LOAD=1, the default) or quiet (LOAD=0): no verdict of the suite may depend on load.
# Each run's outcome line goes to stdout and to under-load.log; the hog is stopped by its
# PID however the runs end. Usage: [LOAD=0|1] bash .ci/under-load.sh [RUNS] [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
hog=""
if [ "${LOAD:-1}" = 1 ]; then
    # One busy core for at most 4 hours: a bounded loop, killed below in any case.
    python3 -c 'import time
end = time.monotonic() + 4 * 3600
while time.monotonic() < end:
    pass' &
    hog=$!
fi
trap '[ -z "$hog" ] || kill "$hog" 2>/dev/null || true' EXIT
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    set +e
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@" > "under-load.run$i.out" 2>&1
    rc=$?
    set -e
    line="run $i/$runs load=${LOAD:-1} rc=$rc $(( $(date +%s) - start )) s: $(tail -n 1 "under-load.run$i.out")"
    echo "$line" | tee -a under-load.log
done
