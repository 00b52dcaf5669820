#!/usr/bin/env bash
# GPU readiness, one prepared script (about 8 minutes at most on one GPU):
#   1. the device-sensitive tests (those taking the `device` fixture, `pytest -m device`) on CUDA;
#   2. bench_loss.py on CUDA, eager: every variant of the logits (fused) and linear suites,
#      float32 and bfloat16, against F.cross_entropy and, where it is installed (or installs
#      without network, --no-deps), Liger-Kernel's cross-entropy and fused linear cross-entropy;
#   3. the same through torch.compile, for F.cross_entropy, the fused and linear paths and
#      Liger on the N=4096 V=32,768 (reweigh off) and linear cases;
# and writes benchmarks/results/<date>-<gpu name>.md, the JSONL rows beside it. Each step has its
# own time limit; a step that runs out keeps what it measured and the summary says so.
# Without a CUDA GPU it says so and exits 0.
#
#   benchmarks/gpu.sh                      # python: $PYTHON, else .venv/bin/python, else python3
#   GPU_SH_DEVICE=cpu GPU_SH_QUICK=1 GPU_SH_RESULTS=/tmp/dry benchmarks/gpu.sh  # dry run on CPU
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEVICE=${GPU_SH_DEVICE:-cuda}
QUICK=${GPU_SH_QUICK:+--quick}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # numtok from this tree, installed or not

if [[ "$DEVICE" == cuda ]] &&
    ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu.sh: no CUDA GPU visible to torch (python: $PY); nothing to run."
    exit 0
fi

start=$SECONDS
gpu=$("$PY" -c "import torch; d = torch.device('$DEVICE'); print(torch.cuda.get_device_name(d) if d.type == 'cuda' else 'cpu')")
name=$(date -u +%Y-%m-%d)-$(echo "$gpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/-*$//')
results=${GPU_SH_RESULTS:-benchmarks/results}
mkdir -p "$results"
report=$results/$name.md
log=$(mktemp -d)
echo "gpu.sh: $gpu; report: $report; logs: $log"

# Liger-Kernel where it installs (from a local cache or index; --no-deps keeps this torch).
if [[ "$DEVICE" == cuda ]] && ! "$PY" -c 'import liger_kernel' 2>/dev/null; then
    timeout 60 "$PY" -m pip install --quiet --no-deps --retries 0 --timeout 5 liger-kernel \
        >"$log/liger.txt" 2>&1 ||
        echo "gpu.sh: Liger-Kernel did not install; its variants are skipped."
fi
liger=$("$PY" -c 'import importlib.metadata as m; print(m.version("liger-kernel"))' 2>/dev/null ||
    echo "not installed")

step() {  # step <seconds> <log name> <command...>: run with a time limit, report how it ended
    local limit=$1 file=$2
    shift 2
    timeout "$limit" "$@" >"$log/$file.out" 2>"$log/$file.err"
    local status=$?
    case $status in
        0) echo "completed" ;;
        124) echo "**stopped at its ${limit}-second limit** (rows measured until then are kept)" ;;
        *) echo "**failed with exit status $status** (see the end of its log below)" ;;
    esac
}

echo "gpu.sh: tests on $DEVICE"
tests_status=$(step 150 tests env NUMTOK_TEST_DEVICE="$DEVICE" "$PY" -m pytest -m device -q \
    -p no:cacheprovider --continue-on-collection-errors --maxfail=5)
echo "gpu.sh: eager benchmark"
eager_status=$(step 120 eager "$PY" benchmarks/bench_loss.py $QUICK --device "$DEVICE" \
    --threads max --out "$results/$name-eager.jsonl")
echo "gpu.sh: torch.compile benchmark"
budget=$((460 - (SECONDS - start)))  # whatever is left of about 7.7 minutes, at least one
compile_status=$(step $((budget > 60 ? budget : 60)) compiled "$PY" benchmarks/bench_loss.py $QUICK --device "$DEVICE" \
    --threads max --compile \
    --cases "N=4096 V=32768 float32 reweigh=off,N=4096 V=32768 bfloat16 reweigh=off,linear,N=1024" \
    --variants "F.cross_entropy,cross_entropy_with_ntl,Liger CE (no NTL),materialised + CE + number_token_loss,materialised + cross_entropy_with_ntl,linear_cross_entropy_with_ntl,Liger fused linear CE (no NTL)" \
    --out "$results/$name-compiled.jsonl")

summary() {  # summary <jsonl>: the Markdown table of whatever rows the step wrote
    if [[ -s "$1" ]]; then "$PY" benchmarks/bench_loss.py --summarize "$1"; else echo "(no rows)"; fi
}
versions=$("$PY" -c "import torch, numtok; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}), numtok {numtok.__version__}')")
{
    echo "# numtok on $gpu, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "$versions, Liger-Kernel $liger. Written by \`benchmarks/gpu.sh\` in $((SECONDS - start)) s."
    echo "Ratios (× base) are to F.cross_entropy (logits suite) or to the materialised"
    echo "\`hidden @ W.T\` + \`F.cross_entropy\` + \`number_token_loss\` (linear suite), same run;"
    echo "peak = extra memory of one step (CUDA: \`max_memory_allocated\`) / the logits' size."
    echo
    echo "## Device-sensitive tests on $DEVICE (\`pytest -m device\`): $tests_status"
    echo
    echo '```'
    tail -n 15 "$log/tests.out"
    echo '```'
    echo
    echo "## Eager: $eager_status"
    echo
    summary "$results/$name-eager.jsonl"
    echo
    echo "## torch.compile (default backend): $compile_status"
    echo
    summary "$results/$name-compiled.jsonl"
    for file in eager compiled; do
        if [[ -s "$log/$file.err" ]] && ! grep -q '^results:' "$log/$file.err"; then
            echo
            echo "### End of the $file step's log"
            echo
            echo '```'
            tail -n 20 "$log/$file.err"
            echo '```'
        fi
    done
} >"$report"
echo "gpu.sh: done in $((SECONDS - start)) s: $report"
