#!/usr/bin/env bash
# numtok on one GPU in at most 8 minutes, set-up included (a GPU machine allows 600 s a command).
# The steps, in this order, each under its own time limit in seconds (the fixed ones add up to
# 450 of the 480-second budget; the benchmarks after them get what is left). Every step
# writes its rows after each case (call, run, route, test), so one stopped at its limit keeps
# what it measured:
#
#   setup      30  gpu_checks.py setup: the wheels of benchmarks/wheels/ (`make gpu-wheels`:
#                  Liger-Kernel 0.8.5, and TRL with what it needs beyond a CUDA image) installed
#                  with --no-index --no-deps into a site folder on PYTHONPATH; the versions, the
#                  GPU, the imports' time, `pip show` of what the TRL step imports
#   launch     80  (a) tests/test_gpu_launch.py (pytest -m gpu): every kernel variant of the
#                  calls that the JIT-faithful compile test records, compiled by Triton's JIT for
#                  this GPU and launched, each call's loss against impl="torch"
#   large      40  (b) tests/test_gpu_values.py (pytest -m gpu), the large test: value and
#                  gradient against the float64 reference at 16,384 x 152,064 bfloat16 logits
#                  (row offsets past 2^31)
#   sanitizer  55  (b) tests/test_gpu_values.py, the small test: four calls, under
#                  compute-sanitizer (memcheck) where it exists
#   sync       40  (c) tests/test_gpu_sync.py (pytest -m gpu): a training step per route
#                  (each entry point by default
#                  and with capturable=True, the Triton kernels), every synchronisation recorded;
#                  numtok's loss and backward under torch.cuda.set_sync_debug_mode("error")
#   tests     130  (c) pytest -m device on the GPU (-n 8 where pytest-xdist is installed;
#                  every test runs, no --maxfail; each result written as it comes:
#                  gpu_pytest_rows.py); sized from the variants the device tests compile
#   loss       90  (d) bench_loss.py --gpu-cases, CUDA events: numtok, Liger,
#                  F.cross_entropy at V = 32,768 and 128,256, bfloat16 and float32, 5 % and 50 %
#                  ignored labels, an upstream gradient of 0.37; the bandwidth against the device's
#                  own copy
#   then, while the budget lasts (each under the smaller of its limit and the time left; none
#   started with less than 15 s left): kinds 45 (bench_kinds.py), trainer 60
#   (bench_trainer_step.py --preset 1b), readout 55 (bench_readout.py), head 70
#   (bench_number_head.py), trl 55 (bench_trl_step.py).
#
# After every step it writes, under $OUT (default benchmarks/results/), <date>-<gpu>.md (the report
# so far: a table of the steps, the targets of benchmarks/gpu_targets.py, each step's section),
# <date>-<gpu>.jsonl (each step's status and rows, every row with its step) and
# <date>-<gpu>-log.txt (the end of each step's output): a run cut short keeps every step that
# finished. Exit status 0 when every step completed, 1 otherwise; 0 without a CUDA GPU (it says
# so and runs nothing). The dry run on CPU (GPU_SH_DEVICE=cpu) also records the Triton variants
# each step launches and estimates each step's time on the GPU (gpu_budget.py): it fails when
# an estimate exceeds its step's limit.
#
# On a GPU machine without network: `make gpu-wheels` here, then run `benchmarks/gpu.sh` there
# with benchmarks/wheels carried into the working tree. Environment:
#   OUT             the folder of the report (default benchmarks/results)
#   PYTHON          the interpreter (default .venv/bin/python where it exists, else python3)
#   GPU_SH_DEVICE   cuda (default), or cpu: the dry run (the kernels in Triton's interpreter)
#   GPU_SH_QUICK    non-empty: small shapes and a subset of the tests (the dry run)
#   GPU_SH_BUDGET   seconds (default 480); GPU_SH_STEPS: the steps to run (comma-separated names)
#   GPU_SH_SLACK    the factor of each limit and the budget (default 1; 3 in the dry run)
#   GPU_SH_WHEELS   the wheels' folder (default benchmarks/wheels); GPU_SH_WORKERS: xdist's -n (8)
#
#   benchmarks/gpu.sh                                                  # on the GPU machine
#   GPU_SH_DEVICE=cpu GPU_SH_QUICK=1 OUT=/tmp/gpu-dry benchmarks/gpu.sh  # the dry run on CPU
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEVICE=${GPU_SH_DEVICE:-cuda}
QUICK=${GPU_SH_QUICK:+--quick}
BUDGET=${GPU_SH_BUDGET:-480}
ONLY=${GPU_SH_STEPS:-}
WHEELS=${GPU_SH_WHEELS:-benchmarks/wheels}
RESULTS=${OUT:-benchmarks/results}
MIN_STEP=15 # no step is started with less time left
# The dry run runs every step under SLACK times its limit (and budget), so that each one finishes
# on CPU and its counts are whole: its estimates on the GPU are judged against the limits.
if [[ "$DEVICE" == cpu ]]; then SLACK=${GPU_SH_SLACK:-3}; else SLACK=${GPU_SH_SLACK:-1}; fi
RESERVE=3   # kept for the last report
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-sh.XXXXXX")
mkdir -p "$WORK/site" "$RESULTS"
# The wheels; numtok from here; the benchmarks' modules (gpu_pytest_rows, gpu_variants) by name.
export PYTHONPATH="$WORK/site:$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [[ "$DEVICE" == cuda ]]; then
    if ! gpu=$("$PY" -c 'import sys, torch
if not torch.cuda.is_available(): sys.exit(1)
print(torch.cuda.get_device_name(0))' 2>/dev/null); then
        echo "gpu.sh: no CUDA GPU visible to torch (python: $PY); nothing to run."
        exit 0
    fi
    THREADS=max
else
    gpu="$DEVICE dry run"
    THREADS=1 # the dry run: light on a shared machine
fi
name=$(date -u +%Y-%m-%d)-$(echo "$gpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/-*$//')
base=$RESULTS/$name
deadline=$((start + BUDGET * SLACK - RESERVE))
echo "gpu.sh: $gpu, python $PY; budget $BUDGET s; report $base.md; work folder $WORK"

report() { # the report so far, from $WORK: $base.md, .jsonl, -log.txt
    "$PY" benchmarks/gpu_checks.py report --work "$WORK" --out "$base" --budget "$BUDGET" \
        --elapsed $((SECONDS - start)) "$@" >/dev/null 2>"$WORK/report.err" && return
    echo "gpu.sh: the report failed: $base-report-error.txt" >&2
    cp "$WORK/report.err" "$base-report-error.txt"
}

record() { # record NAME TITLE STATUS SECONDS LIMIT NOTE COMMAND...: one line of steps.jsonl
    "$PY" -c 'import json, shlex, sys
a = sys.argv[1:]
print(json.dumps({"step": a[0], "title": a[1], "status": a[2],
                  "seconds": int(a[3]) if a[3] else None, "limit": int(a[4]), "note": a[5],
                  "command": shlex.join(a[6:])}))' "$@" >>"$WORK/steps.jsonl"
}

failures=0
step() { # step NAME LIMIT TITLE COMMAND...: COMMAND under min(LIMIT, the time left), then report
    local name=$1 limit=$2 title=$3
    shift 3
    # The dry run records the Triton variants each step launches (gpu_budget.py's estimates).
    [[ "$DEVICE" == cpu ]] && export GPU_SH_VARIANTS="$WORK/$name.variants"
    [[ -n "$ONLY" && ",$ONLY," != *",$name,"* ]] && return 0
    local left=$((deadline - SECONDS)) note="" status seconds="" run=$((limit * SLACK))
    if ((left < MIN_STEP)); then
        status=skipped
        note="Not started: ${left} s of the budget were left."
        failures=$((failures + 1))
    else
        if ((run > left)); then
            note="Its limit was cut from $run s to the $left s left of the budget."
            run=$left
            ((SLACK == 1)) && limit=$left
        fi
        ((SLACK > 1)) && note="${note:+$note }The dry run: $SLACK times the step's limit."
        echo "gpu.sh: [$((SECONDS - start)) s] $title (at most $run s)"
        local began=$SECONDS
        timeout -k 5 "$run" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
        local rc=$?
        seconds=$((SECONDS - began))
        case $rc in
            0) status=completed ;;
            124 | 137) status="**stopped at its limit** (what it wrote until then is kept)" ;;
            *) status="**failed** (exit status $rc)" ;;
        esac
        [[ $rc == 0 ]] || failures=$((failures + 1))
        echo "gpu.sh: [$((SECONDS - start)) s] $name: $status"
    fi
    record "$name" "$title" "$status" "$seconds" "$limit" "$note" "$@"
    report
}

on_cpu=()
if [[ "$DEVICE" == cpu ]]; then
    on_cpu=(--no-memory) # the dry run: no memory subprocesses
    # Every process of the dry run records the Triton variants it launches (gpu_variants.py).
    cat >"$WORK/site/sitecustomize.py" <<EOF
import os
if os.environ.get("GPU_SH_VARIANTS"):
    import gpu_variants
    gpu_variants.record_on_import(os.environ["GPU_SH_VARIANTS"])
EOF
fi

# The GPU acceptance tests (the gpu marker): pytest with gpu.sh's plugin, which writes each
# test's rows and report section into $GPU_SH_SECTION.
gpu_env=(NUMTOK_TEST_DEVICE="$DEVICE" NUMTOK_GPU_QUICK="${QUICK:+1}"
    NUMTOK_GPU_DRY_RUN="$([[ "$DEVICE" == cpu ]] && echo 1)")
gpu_tests=("$PY" -m pytest -q -rfE -p no:cacheprovider -p gpu_pytest_rows -m gpu)

# Set-up, then (a) every variant compiles and launches.
step setup 30 "Set-up (\`gpu_checks.py setup\`)" \
    "$PY" benchmarks/gpu_checks.py setup --device "$DEVICE" --wheels "$WHEELS" \
    --site "$WORK/site" --out "$WORK/setup"
step launch 80 "(a) Every kernel variant compiles and launches (\`tests/test_gpu_launch.py\`)" \
    env GPU_SH_SECTION="$WORK/launch" "${gpu_env[@]}" "${gpu_tests[@]}" tests/test_gpu_launch.py

# (b) Values and gradients against float64, large; a small case under compute-sanitizer.
values=tests/test_gpu_values.py
step large 40 "(b) Values and gradients against float64, the large bfloat16 case (\`$values\`)" \
    env GPU_SH_SECTION="$WORK/large" "${gpu_env[@]}" "${gpu_tests[@]}" \
    "$values::test_large_logits_against_float64"
sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
    ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /opt/nvidia/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
small=(env GPU_SH_SECTION="$WORK/sanitizer" "${gpu_env[@]}")
if [[ "$DEVICE" == cuda && -n "$sanitizer" ]]; then # pytest under the sanitizer, whose verdict
    small+=(PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool memcheck --error-exitcode 3
        --print-limit 20 --target-processes application-only) # is its exit status
    title="(b) Four small calls of the Triton paths under compute-sanitizer"
else
    why=$([[ "$DEVICE" == cuda ]] && echo "no compute-sanitizer on this machine" || echo "on CPU")
    title="(b) Four small calls of the Triton paths, without compute-sanitizer ($why)"
fi
step sanitizer 55 "$title (\`$values\`)" \
    "${small[@]}" "${gpu_tests[@]}" "$values::test_small_triton_calls_against_torch"

# (c) No host synchronisation in a training step; the device-marked tests.
step sync 40 "(c) A training step's host synchronisations, route by route (\`tests/test_gpu_sync.py\`)" \
    env GPU_SH_SECTION="$WORK/sync" "${gpu_env[@]}" "${gpu_tests[@]}" tests/test_gpu_sync.py
tests=(-m device -q -rfE -p no:cacheprovider -p gpu_pytest_rows --continue-on-collection-errors)
"$PY" -c 'import xdist' 2>/dev/null && tests+=(-n "${GPU_SH_WORKERS:-8}")
"$PY" -c 'import pytest_timeout' 2>/dev/null && tests+=(--timeout 60)
[[ -n "$QUICK" ]] && tests+=(tests/test_capturable.py tests/test_fused_triton.py -k "not test_matches_reference and not bit_for_bit")
step tests 130 "(c) The device-marked tests on $DEVICE (\`pytest -m device\`)" \
    env NUMTOK_TEST_DEVICE="$DEVICE" GPU_SH_TEST_ROWS="$WORK/tests.jsonl" "$PY" -m pytest "${tests[@]}"

# (d) Timings, CUDA events; then the other benchmarks while the budget lasts.
loss=(--gpu-cases --device "$DEVICE" --threads "$THREADS" --out "$WORK/loss.jsonl")
[[ "$DEVICE" == cpu ]] && loss+=(--rounds 2 --linear-rounds 1)
step loss 90 "(d) numtok, Liger and F.cross_entropy, timed (\`bench_loss.py --gpu-cases\`)" \
    "$PY" benchmarks/bench_loss.py $QUICK "${on_cpu[@]}" "${loss[@]}"
step kinds 45 "DEL, SMMD and DIST2 in the fused path (\`bench_kinds.py\`)" \
    "$PY" benchmarks/bench_kinds.py $QUICK --device "$DEVICE" --vocab 131072 --rounds 5 \
    --threads "${THREADS/max/$(nproc)}" --out "$WORK/kinds"
if [[ -n "$QUICK" ]]; then trainer=(--preset quick --rounds 1 --steps 2); else
    trainer=(--preset 1b --rounds 3 --steps 3); fi
step trainer 60 "A Trainer step, logits and logits-free (\`bench_trainer_step.py\`)" \
    "$PY" benchmarks/bench_trainer_step.py "${trainer[@]}" "${on_cpu[@]}" --device "$DEVICE" \
    --modes logits,logits_free --out "$WORK/trainer.jsonl"
# The dry run times the GPU run's variants (2 digits: generate, fast, fast + greedy, 16 prefixes,
# exact), one round instead of three, so that its rows count the GPU run's.
if [[ -n "$QUICK" ]]; then readout=(--rounds 1); else readout=(--rounds 3); fi
step readout 55 "predict_numbers against generate() (\`bench_readout.py\`)" \
    "$PY" benchmarks/bench_readout.py "${readout[@]}" --digits 2 --fast-digits 2 --exact-digits 2 \
    --device "$DEVICE" --threads "${THREADS/max/$(nproc)}" --out "$WORK/readout.jsonl"
step head 70 "The number head beside each cross-entropy (\`bench_number_head.py\`)" \
    "$PY" benchmarks/bench_number_head.py $QUICK "${on_cpu[@]}" --device "$DEVICE" --rounds 3 \
    --threads "${THREADS/max/$(nproc)}" --out "$WORK/head"
step trl 55 "A TRL SFTTrainer step (\`bench_trl_step.py\`, no memory subprocesses)" \
    "$PY" benchmarks/bench_trl_step.py $QUICK --no-memory --device "$DEVICE" --rounds 2 \
    --steps 3 --threads "${THREADS/max/$(nproc)}" --out "$WORK/trl.jsonl"

report --finished
if [[ "$DEVICE" == cpu ]]; then # the dry run: would every step fit its limit on the GPU?
    if ! "$PY" benchmarks/gpu_checks.py estimate --work "$WORK"; then
        echo "gpu.sh: a step's estimate on the GPU exceeds its limit (above; $base.md)"
        failures=$((failures + 1))
    fi
fi
echo "gpu.sh: done in $((SECONDS - start)) s, $failures step(s) not completed: $base.md"
((failures == 0))
