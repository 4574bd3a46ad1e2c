#!/usr/bin/env bash
# The suite under load: CI's `.ci/run` on a fresh clone of a commit (its own venv, from nothing),
# RUNS times in a row, each beside HOGS busy loops (`sh -c 'while :; do :; done'`), stopping at the
# first failure. Prints one line per run (commit, exit status, seconds, load average range) and keeps
# each run's log, load samples and clone under OUT.
#
#   scripts/suite_under_load.sh [COMMIT]        (default: HEAD)
#   RUNS=3 HOGS=2 OUT=/tmp/suite-under-load CMD=.ci/run scripts/suite_under_load.sh
#
# `make test-load` runs it for HEAD. Each run takes 45 minutes on a 2-core machine (docs/benchmarks.md,
# "The suite under load"). Exit status: 0 if every run passed, else the failing run's.
set -uo pipefail

RUNS=${RUNS:-3}
HOGS=${HOGS:-2}
OUT=${OUT:-/tmp/suite-under-load}
CMD=${CMD:-.ci/run}
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse --verify -q "${1:-HEAD}^{commit}") || {
    echo "suite_under_load: '${1:-HEAD}' is not a commit of $repo" >&2
    echo "HINT: give a commit or branch name that \`git rev-parse\` knows, or none for HEAD." >&2
    exit 2
}
mkdir -p "$OUT"

pids=()
stop_background() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; pids=(); }
trap 'stop_background' EXIT
trap 'stop_background; exit 130' INT TERM

status=0
for i in $(seq 1 "$RUNS"); do
    clone="$OUT/run$i"
    rm -rf "$clone"
    git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$commit" || { status=2; break; }
    for _ in $(seq 1 "$HOGS"); do sh -c 'while :; do :; done' & pids+=($!); done
    (while :; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1 /proc/loadavg)"; sleep 30; done) > "$OUT/load$i.txt" &
    pids+=($!)
    start=$(date +%s)
    (cd "$clone" && PYTEST_ADDOPTS="${PYTEST_ADDOPTS:---durations=40}" $CMD) > "$OUT/run$i.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    stop_background
    load=$(awk '{print $2}' "$OUT/load$i.txt" | sort -n | sed -n '1p;$p' | paste -sd-)
    summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$OUT/run$i.log" | tail -1)
    echo "run $i/$RUNS at ${commit:0:7}: exit $rc, ${secs} s, load average ${load:-?} with $HOGS hogs; ${summary:-no pytest summary}"
    if [ "$rc" -ne 0 ]; then status=$rc; echo "  the log: $OUT/run$i.log"; break; fi
done
exit "$status"
