#!/usr/bin/env bash
# The GPU check: every CUDA/NCCL path of ringtrain, in order, each under a timeout, with a
# report. For the day a GPU machine is at hand (issue 15); on a machine without a GPU it
# writes a report that says so and exits 0.
#
# Usage:
#   scripts/gpu_check.sh [OUT]            # report in OUT (default gpu-check-report)
#   make gpu-check [PYTHON=...] [GPU_CHECK_OUT=...]
#
# It installs nothing and downloads nothing: it runs the Python given in PYTHON (default
# python3) with this checkout's src/ on PYTHONPATH, so a machine's preinstalled torch
# (a CUDA build) is what gets checked, e.g.
#   PYTHON=/opt/conda/bin/python scripts/gpu_check.sh
#   make gpu-check PYTHON=.venv/bin/python      # or the venv `make install` made
# That Python needs torch and numpy; the test steps also need pytest and pytest-timeout,
# the demo steps scikit-learn (its digits set ships inside the package). A step whose
# module is missing fails and its log says which.
#
# Environment: PYTHON, STEP_TIMEOUT (seconds, default 600), BENCH_TIMEOUT (default 1800),
# BENCH_ARGS (default "--preset gpu").
#
# Output, in OUT: report.md (machine, each step's result, time, expected outcome, and the
# benchmark table), summary.tsv (step, result, seconds), logs/STEP.log, work/ (the
# examples' checkpoints), bench/ (results.csv/json, throughput.png, table.txt).
# Exit status: 0 when no step failed (skipped steps included), 1 otherwise.

set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=${1:-gpu-check-report}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-1800}
BENCH_ARGS=${BENCH_ARGS:---preset gpu}

mkdir -p "$OUT/logs" "$OUT/work" "$OUT/bench"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT/summary.tsv"
REPORT="$OUT/report.md"
: > "$SUMMARY"
STEPS_MD=""
FAILED=0

# How many GPUs this Python's torch sees. Asked in a process of its own, so nothing
# here holds a CUDA context (the fork step needs a parent that never touched CUDA).
if ! GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>"$OUT/logs/probe.log"); then
    echo "gpu-check: $PYTHON cannot import torch (see $OUT/logs/probe.log)" >&2
    echo "HINT: give the Python that has the machine's torch: PYTHON=/path/to/python scripts/gpu_check.sh" >&2
    exit 1
fi
MACHINE=$("$PYTHON" - <<'EOF' 2>/dev/null
import platform, torch
names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
print(f"{platform.node()}; torch {torch.__version__} (CUDA {torch.version.cuda}); GPUs: {', '.join(names) or 'none'}")
EOF
)

# step NAME MIN_GPUS TIMEOUT "EXPECTED" COMMAND...: run COMMAND (in OUT/work) unless the
# machine has fewer than MIN_GPUS GPUs; record PASS / FAIL / SKIPPED with its time.
step() {
    local name=$1 need=$2 limit=$3 expected=$4
    shift 4
    local result seconds=0 note=""
    if [ "$GPUS" -lt "$need" ]; then
        result=SKIPPED
        if [ "$GPUS" -eq 0 ]; then note="no GPU"; else note="needs $need GPUs, this machine has $GPUS"; fi
        echo "$note: skipped" > "$OUT/logs/$name.log"
    else
        echo "gpu-check: $name ..." >&2
        local start=$SECONDS
        (cd "$OUT/work" && timeout --kill-after=30 "$limit" "$@") > "$OUT/logs/$name.log" 2>&1
        local rc=$?
        seconds=$((SECONDS - start))
        if [ $rc -eq 0 ]; then
            result=PASS
        else
            result=FAIL
            FAILED=1
            if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note="timed out after ${limit}s"; else note="exit $rc"; fi
        fi
    fi
    echo "gpu-check: $name: $result${note:+ ($note)}" >&2
    printf '%s\t%s\t%s\n' "$name" "$result" "$seconds" >> "$SUMMARY"
    STEPS_MD+="| $name | $result${note:+ ($note)} | ${seconds}s | $expected | logs/$name.log |"$'\n'
}

RUN=("$PYTHON" -m ringtrain run)
EX="$REPO/examples"

step env 0 120 "prints torch, CUDA, NCCL and the GPUs" \
    "$PYTHON" -m ringtrain env
step gpu-tests 1 "$STEP_TIMEOUT" "every test marked gpu passes (pytest -m gpu)" \
    "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider "$REPO/tests"
step save-load-step 1 300 "checkpoint holds CPU tensors; resumes on the GPU (RNG, Adam steps on CPU) and steps" \
    "$PYTHON" "$REPO/scripts/gpu_check_steps.py" save-load-step "$OUT/work/save-load"
step fork-launch 1 300 "rt.launch(start_method='fork') ranks use CUDA; the parent never initializes it" \
    "$PYTHON" "$REPO/scripts/gpu_check_steps.py" fork-launch "$(( GPUS >= 2 ? 2 : 1 ))"
# make demo's own command (DEMO_DEVICE=cpu: two processes would share the one GPU, which ringtrain refuses).
step demo-one-gpu 1 "$STEP_TIMEOUT" "make demo's job (2 processes, --device cpu) on a one-GPU machine ends with exit 0" \
    env CUDA_VISIBLE_DEVICES=0 "${RUN[@]}" --nproc-per-node 2 "$EX/digits.py" --epochs 8 --out "$OUT/work/digits" \
    --device cpu
step digits-gpu 1 "$STEP_TIMEOUT" "the demo's job in one process on cuda:0 (--device auto) ends with exit 0" \
    env CUDA_VISIBLE_DEVICES=0 "${RUN[@]}" --nproc-per-node 1 "$EX/digits.py" --epochs 8 --out "$OUT/work/digits-gpu" \
    --device auto
step ddp-example 2 "$STEP_TIMEOUT" "examples/02_ddp.py on 2 GPUs over NCCL trains and evaluates" \
    "${RUN[@]}" --nproc-per-node 2 "$EX/02_ddp.py" --epochs 2
step syncbn-nccl 2 "$STEP_TIMEOUT" "examples/03 (SyncBatchNorm, bf16, accumulate 4) on 2 GPUs over NCCL" \
    "${RUN[@]}" --nproc-per-node 2 "$EX/03_accumulate_amp_syncbn.py" --epochs 2 --precision bf16-mixed
step dataparallel 2 "$STEP_TIMEOUT" "strategy='dp' over the GPUs equals one device; refuses SyncBatchNorm" \
    "$PYTHON" -m pytest -q -p no:cacheprovider "$REPO/tests/strategies/test_dp.py" -m gpu
step horovod-adasum 2 "$STEP_TIMEOUT" "2-rank Horovod-style job with Adasum over NCCL finishes (no deadlock)" \
    "${RUN[@]}" --horovod -np 2 "$EX/horovod_style.py" --epochs 2 --use-adasum
step fsdp-one-gpu 1 "$STEP_TIMEOUT" "examples/fsdp.py (meta-device ViT, FSDP, bf16) in one process on cuda:0; a sharded checkpoint" \
    "$PYTHON" "$EX/fsdp.py" --epochs 2 --precision bf16-mixed --checkpoint "$OUT/work/fsdp1"
step fsdp-nccl 2 "$STEP_TIMEOUT" "examples/fsdp.py on 2 GPUs over NCCL (each holds half); a sharded checkpoint" \
    "${RUN[@]}" --nproc-per-node 2 "$EX/fsdp.py" --epochs 2 --precision bf16-mixed --checkpoint "$OUT/work/fsdp2"
step fsdp-consolidate 2 300 "ringtrain consolidate of fsdp-nccl's checkpoint into one plain file (no GPU, no group)" \
    "$PYTHON" -m ringtrain consolidate "$OUT/work/fsdp2" "$OUT/work/fsdp2.pt"
step bench-fsdp 1 "$BENCH_TIMEOUT" "ringtrain bench --workload mlp --modes ddp,fsdp: samples/s and peak memory per rank, sharded vs replicated" \
    "$PYTHON" -m ringtrain bench --workload mlp --modes ddp,fsdp --nprocs "$(( GPUS >= 2 ? 2 : 1 ))" --precision 32,bf16-mixed \
    --out "$OUT/bench-fsdp" --no-progress
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
step bench 1 "$BENCH_TIMEOUT" "ringtrain bench $BENCH_ARGS: images/s and MFU table (H100 target: >= 25,000 images/s)" \
    bash -c "\"\$@\" > '$OUT/bench/table.txt'" bench "$PYTHON" -m ringtrain bench $BENCH_ARGS --out "$OUT/bench"

{
    echo "# ringtrain GPU check"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- python: $PYTHON"
    echo "- machine: ${MACHINE:-unknown}"
    echo "- GPUs visible: $GPUS"
    echo "- commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if [ "$GPUS" -eq 0 ]; then
        echo
        echo "**no GPU: skipped** — torch in $PYTHON sees no CUDA GPU, so every GPU step was skipped."
    fi
    echo
    echo "| step | result | time | expected | log |"
    echo "|---|---|---|---|---|"
    printf '%s' "$STEPS_MD"
    echo
    echo "## Benchmark"
    echo
    if [ -s "$OUT/bench/table.txt" ]; then
        echo '```'
        cat "$OUT/bench/table.txt"
        echo '```'
    else
        echo "no benchmark table (see logs/bench.log)"
    fi
} > "$REPORT"

echo "gpu-check: report in $REPORT" >&2
exit $FAILED
