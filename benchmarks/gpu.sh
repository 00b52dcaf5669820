#!/usr/bin/env bash
# GPU readiness, one prepared script (about 8 minutes at most on one GPU):
#   1. the device-sensitive tests (those taking the `device` fixture, `pytest -m device`) on CUDA:
#      the Triton kernels against the float64 reference, and a training step with
#      torch.cuda.set_sync_debug_mode("error") (no host synchronisation);
#   2. bench_loss.py --suite logits on CUDA, eager: the fused path (the Triton kernels, default and
#      in place, and the torch backend beside them) at N x V = 4096 x 32768, 2048 x 131072 and
#      8192 x 128256, float32 and bfloat16, against F.cross_entropy and, where it is installed (or
#      installs without network, --no-deps), Liger-Kernel's cross-entropy; the bandwidth of each;
#   3. bench_loss.py --suite linear: logits-free (N, H, V = 4096, 1024, 131072 and 8192, 4096,
#      128256) against the materialised path and Liger's fused linear cross-entropy;
#   4. bench_trainer_step.py --preset 1b: a Trainer step of a 1B-shaped Llama (bf16, sequence 2048,
#      batch 4) with logits_free off and on: step time and CUDA peak memory;
#   5. bench_readout.py: predict_numbers (the key/value-cached enumeration, 2 and 3 digits) on a
#      random Llama with V = 128,256 against a greedy generate() of the same prompts;
#   6. bench_kinds.py: the fused path of DEL, SMMD and DIST2 (the Triton row kernel) against
#      NTL-WAS and F.cross_entropy, N x V = 4096 x 131072, digits and 1,110 number tokens;
#   7. the fused and linear paths and Liger through torch.compile on the N=4096 cases;
# and writes benchmarks/results/<date>-<gpu name>.md (with the targets of the fused and
# logits-free paths, benchmarks/gpu_targets.py), the JSONL rows beside it. Each step has its own
# time limit; a step that runs out keeps what it measured and the summary says so.
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
tests_status=$(step 170 tests env NUMTOK_TEST_DEVICE="$DEVICE" "$PY" -m pytest -m device -q \
    -p no:cacheprovider --continue-on-collection-errors --maxfail=5)
echo "gpu.sh: fused (logits) benchmark"
eager_status=$(step 100 eager "$PY" benchmarks/bench_loss.py $QUICK --suite logits \
    --device "$DEVICE" --threads max --out "$results/$name-eager.jsonl")
echo "gpu.sh: logits-free (linear) benchmark"
linear_status=$(step 70 linear "$PY" benchmarks/bench_loss.py $QUICK --suite linear \
    --device "$DEVICE" --threads max --out "$results/$name-linear.jsonl")
echo "gpu.sh: Trainer step of a 1B-shaped Llama"
preset=1b
[[ -n "$QUICK" ]] && preset=quick
trainer_status=$(step 70 trainer "$PY" benchmarks/bench_trainer_step.py --preset "$preset" \
    --device "$DEVICE" --modes logits,logits_free --rounds 3 --steps 3 \
    --out "$results/$name-trainer-step.jsonl")
echo "gpu.sh: predict_numbers against generate()"
readout_status=$(step 45 readout "$PY" benchmarks/bench_readout.py --device "$DEVICE" \
    --digits 2,3 --rounds 3 --whole-sequence-digits 0 --out "$results/$name-readout.jsonl")
echo "gpu.sh: the number losses of numtok.kinds"
kinds_status=$(step 60 kinds "$PY" benchmarks/bench_kinds.py $QUICK --device "$DEVICE" \
    --vocab 131072 --rounds 5 --out "$results/$name-kinds")
echo "gpu.sh: torch.compile benchmark"
budget=$((470 - (SECONDS - start)))  # whatever is left of about 7.8 minutes, at least one
compile_status=$(step $((budget > 60 ? budget : 60)) compiled "$PY" benchmarks/bench_loss.py $QUICK --device "$DEVICE" \
    --threads max --compile \
    --cases "N=4096 V=32768 float32 reweigh=off,N=4096 V=32768 bfloat16 reweigh=off,linear N=4096,N=1024" \
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
    echo "## Targets (\`benchmarks/gpu_targets.py\`, eager rows)"
    echo
    "$PY" benchmarks/gpu_targets.py --rows "$results/$name-eager.jsonl" \
        "$results/$name-linear.jsonl" --trainer "$results/$name-trainer-step.jsonl"
    echo
    echo "## Device-sensitive tests on $DEVICE (\`pytest -m device\`): $tests_status"
    echo
    echo '```'
    tail -n 15 "$log/tests.out"
    echo '```'
    echo
    echo "## Fused (logits given), eager: $eager_status"
    echo
    summary "$results/$name-eager.jsonl"
    echo
    echo "## Logits-free (hidden states given), eager: $linear_status"
    echo
    summary "$results/$name-linear.jsonl"
    echo
    echo "## Trainer step (\`bench_trainer_step.py --preset $preset\`): $trainer_status"
    echo
    if [[ -s "$results/$name-trainer-step.md" ]]; then cat "$results/$name-trainer-step.md"; else echo "(no rows)"; fi
    echo
    echo "## predict_numbers against generate() (\`bench_readout.py\`, random Llama, V = 128,256): $readout_status"
    echo
    if [[ -s "$results/$name-readout.md" ]]; then cat "$results/$name-readout.md"; else echo "(no rows)"; fi
    echo
    echo "## DEL, SMMD, DIST2 in the fused path (\`bench_kinds.py\`): $kinds_status"
    echo
    if [[ -s "$results/$name-kinds.md" ]]; then cat "$results/$name-kinds.md"; else echo "(no rows)"; fi
    echo
    echo "## torch.compile (default backend): $compile_status"
    echo
    summary "$results/$name-compiled.jsonl"
    for file in tests eager linear trainer readout kinds compiled; do
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
