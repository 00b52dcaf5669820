"""One Hugging Face Trainer step (forward, backward, gradient clipping, AdamW step) of a tiny
random Llama with a Llama-3-sized vocabulary: CE + 0.3·NTL through ``NTLossForTrainer`` with the
logits (``logits`` mode, the base of the ratios) and without them (``logits_free``), through the
patched model (``patched``: ``patch_model`` with numtok's logits-free pass, no
``compute_loss_func``; on a GPU its default would be the model's own loss instead), and the same
model unpatched (``unpatched``: its own cross-entropy, no NTL): time and peak memory.

    python benchmarks/bench_trainer_step.py            # V = 128,256, sequence 512, batch 4
    python benchmarks/bench_trainer_step.py --quick    # V = 8,192, sequence 128: a smoke run
    python benchmarks/bench_trainer_step.py --preset 1b --device cuda   # a 1B-shaped Llama
    python benchmarks/bench_trainer_step.py --modes unpatched,patched    # ratios to unpatched

``--preset 1b`` (a GPU's): Llama-3.2-1B's shape, random weights in bfloat16 (hidden 2048, MLP
8192, 16 layers, 32 heads, 8 KV heads, tied embeddings, V = 128,256: 1.24B parameters),
sequences of 2048, batch 4 (8,192 tokens a step); AdamW on the bfloat16 parameters. On CUDA
the loss runs the default backend (``impl="auto"``: PyTorch's cross-entropy beside the number
head from the logits, the chunked torch pass logits-free), the step is timed with a
synchronisation at both ends and its memory is ``max_memory_allocated`` during the second step
over what was allocated at its start, in process; the model is built on the GPU.

Method: the model is a 2-layer Llama (hidden 256, MLP 512, 4 heads, 2 KV heads, untied output
layer, float32, 66M parameters of which 2 x 32.8M are the embeddings and the output layer), the
batch 4 sequences of 512 random token ids of which 10% are the digits "0".."9" (ids 100..109);
labels are the inputs (the loss shifts them). Time: ``--rounds`` rounds, each running
``trainer.train()`` for ``--steps`` optimizer steps in every mode, the order rotated each
round; a step is timed from ``on_step_begin`` to ``on_step_end`` (the batch is already
collated), the first step of every ``train()`` call (AdamW allocates its state there) is left
out. Medians with p20/p80. Memory: each mode in a fresh process, two steps; at the start of the
second step VmHWM is reset to the current VmRSS (writing "5" to /proc/self/clear_refs) and its
rise during the step is the step's peak memory (everything the step allocates above the model,
its gradients' buffers and AdamW's state); the process's VmHWM over both steps is reported too.
The clock, the interleaving and the memory probe are benchmarks/runner.py's (``StepClock``,
``time_trainers``, ``in_fresh_process``); this script declares the presets and the modes.
Results go to ``benchmarks/results/<date>T<time>-trainer-step-cpu-t<threads>.{jsonl,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from bench_common import provenance, quantiles
from runner import StepClock, in_fresh_process, time_trainers

from numtok import NumberVocab
from numtok.hf import NTLossForTrainer, patch_model

RESULTS = Path(__file__).resolve().parent / "results"
FIRST_DIGIT_ID = 100
NUMBER_FRACTION = 0.10
NTL_WEIGHT = 0.3
#: How each mode gets its loss: NTLossForTrainer attached (with or without the logits), the model
#: patched (patch_model, logits-free, no compute_loss_func), or the model's own cross-entropy.
MODES = {
    "logits": "NTLossForTrainer(logits_free=False).attach",
    "logits_free": "NTLossForTrainer(logits_free=True).attach",
    "patched": "patch_model(model, cross_entropy='numtok'), no compute_loss_func",
    "unpatched": "the model's own cross-entropy, no NTL",
}


PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"vocab_size": 8192, "sequence": 128, "batch": 4, "hidden": 64, "layers": 2},
    "default": {"vocab_size": 128_256, "sequence": 512, "batch": 4, "hidden": 256, "layers": 2},
    "1b": {
        "vocab_size": 128_256,
        "sequence": 2048,
        "batch": 4,
        "hidden": 2048,
        "intermediate": 8192,
        "layers": 16,
        "heads": 32,
        "kv_heads": 8,
        "tied": True,
        "dtype": "bfloat16",
    },
}


def build_model(size: dict[str, Any], device: torch.device | None = None) -> Any:
    """The random Llama of ``size``; on a CUDA ``device`` its weights are created (and drawn)
    there, not on the host (a 1B-shaped model takes seconds of host sampling)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=size["vocab_size"],
        hidden_size=size["hidden"],
        intermediate_size=size.get("intermediate", 2 * size["hidden"]),
        num_hidden_layers=size["layers"],
        num_attention_heads=size.get("heads", 4),
        num_key_value_heads=size.get("kv_heads", 2),
        max_position_embeddings=max(1024, size["sequence"]),
        tie_word_embeddings=size.get("tied", False),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    on_gpu = device is not None and device.type == "cuda"
    with torch.device(device) if on_gpu else contextlib.nullcontext():
        model = LlamaForCausalLM(config)
    return model.to(getattr(torch, size.get("dtype", "float32")))


def build_dataset(size: dict[str, Any], examples: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    shape = (examples, size["sequence"])
    ids = torch.randint(FIRST_DIGIT_ID + 10, size["vocab_size"], shape, generator=generator)
    digits = FIRST_DIGIT_ID + torch.randint(10, shape, generator=generator)
    ids = torch.where(torch.rand(shape, generator=generator) < NUMBER_FRACTION, digits, ids)
    return [{"input_ids": row, "labels": row} for row in ids]


def build_trainer(
    mode: str, size: dict[str, Any], steps: int, clock: StepClock, **arguments: Any
) -> Any:
    """The Trainer of ``mode``; ``arguments`` override its TrainingArguments (``deepspeed=``,
    ``ddp_backend=``: bench_zero3_memory.py)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Callback(TrainerCallback):
        on_step_begin = clock.on_step_begin
        on_step_end = clock.on_step_end
        on_log = clock.on_log

    settings: dict[str, Any] = {
        "output_dir": tempfile.mkdtemp(prefix="bench_trainer_step_"),
        "per_device_train_batch_size": size["batch"],
        "max_steps": steps,
        "learning_rate": 1e-4,
        "optim": "adamw_torch",
        "logging_steps": 10_000,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": clock.device.type == "cpu",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    args = TrainingArguments(**settings | arguments)
    trainer = Trainer(
        model=build_model(size, clock.device),
        args=args,
        train_dataset=build_dataset(size, size["batch"] * steps),
        callbacks=[Callback()],
    )
    vocab = NumberVocab.from_values(
        {FIRST_DIGIT_ID + d: str(d) for d in range(10)}, vocab_size=size["vocab_size"]
    )
    if mode in ("logits", "logits_free"):
        NTLossForTrainer(vocab, ntl_weight=NTL_WEIGHT, logits_free=mode == "logits_free").attach(
            trainer
        )
    elif mode == "patched":
        patch_model(trainer.model, vocab, ntl_weight=NTL_WEIGHT, cross_entropy="numtok")
    return trainer


def time_modes(
    size: dict[str, Any], rounds: int, steps: int, device: torch.device, modes: list[str]
) -> tuple[dict[str, list[float]], dict[str, dict[str, int]]]:
    """Per-step seconds of every mode, the first step of each train() call left out; on CUDA
    also each mode's memory (:func:`probe_peak`'s fields) from its first round."""
    on_gpu = device.type == "cuda"
    clocks = {mode: StepClock(device, measure_memory=on_gpu) for mode in modes}
    trainers = {mode: build_trainer(mode, size, steps, clocks[mode]) for mode in modes}
    samples = time_trainers(
        {mode: trainer.train for mode, trainer in trainers.items()}, clocks, rounds
    )
    memory = {mode: peaks(clock) for mode, clock in clocks.items() if on_gpu}
    return {mode: steps.wall for mode, steps in samples.items()}, memory


def peaks(clock: StepClock) -> dict[str, int]:
    """The second step's peak rise and the process's peak."""
    assert clock.peak is not None and clock.step_peak is not None
    return {"step_peak_bytes": clock.step_peak, "process_peak_bytes": clock.peak.process()}


def probe_peak(spec: dict[str, Any]) -> dict[str, int]:
    """In a fresh process (runner.in_fresh_process): two steps of ``spec["mode"]`` at
    ``spec["preset"]``, on CPU; :func:`peaks`."""
    warnings.filterwarnings("ignore")
    clock = StepClock(torch.device("cpu"), measure_memory=True)
    build_trainer(spec["mode"], PRESETS[spec["preset"]], 2, clock).train()
    return peaks(clock)


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | step ms median (p20-p80) | time × base | step peak MiB | peak × base "
        "| process peak MiB |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['median_ms']:.0f} ({row['p20_ms']:.0f}-{row['p80_ms']:.0f}) "
            f"| {row['time_ratio']:.3f} | {row.get('step_peak_mib', '')} "
            f"| {row.get('step_peak_ratio', '')} | {row.get('process_peak_mib', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes: --preset quick")
    parser.add_argument("--preset", choices=list(PRESETS), default="default", help="the shapes")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per mode")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per train() call")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    parser.add_argument("--out", type=Path, help="JSONL file (default: results/...; none --quick)")
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=list(MODES),
        help=f"comma-separated, among {', '.join(MODES)} (default all; the first is the base)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    preset = "quick" if args.quick else args.preset
    size = PRESETS[preset]
    device = torch.device(args.device)
    import transformers

    meta = {
        **provenance(device, compiled=False),
        "transformers": transformers.__version__,
        "threads": args.threads,
        "preset": preset,
    }
    modes = args.modes
    if unknown := set(modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}; choose among {list(MODES)}")
    samples, memory = time_modes(size, args.rounds, args.steps, device, modes)
    if not (args.no_memory or memory):
        memory = {
            mode: in_fresh_process(
                "bench_trainer_step", "probe_peak", {"preset": preset, "mode": mode}, args.threads
            )
            for mode in modes
        }
    base = modes[0]
    baseline = quantiles(samples[base])[1]
    rows = []
    for mode in modes:
        p20, median, p80 = quantiles(samples[mode])
        row: dict[str, Any] = {
            **meta,
            **size,
            "ntl_weight": NTL_WEIGHT,
            "number_fraction": NUMBER_FRACTION,
            "mode": mode,
            "steps_timed": len(samples[mode]),
            "median_ms": round(median, 1),
            "p20_ms": round(p20, 1),
            "p80_ms": round(p80, 1),
            "base": base,
            "time_ratio": round(median / baseline, 3),
        }
        if mode in memory:
            row["step_peak_mib"] = round(memory[mode]["step_peak_bytes"] / 2**20, 1)
            row["process_peak_mib"] = round(memory[mode]["process_peak_bytes"] / 2**20, 1)
            row["step_peak_ratio"] = round(
                memory[mode]["step_peak_bytes"] / memory[base]["step_peak_bytes"], 3
            )
        rows.append(row)
    table = summary(rows)
    print(table)
    out = args.out
    if out is None and preset != "quick":
        stamp = meta["date"][:16].replace(":", "")
        where = f"{device.type}-t{args.threads}" if device.type == "cpu" else device.type
        out = RESULTS / f"{stamp}-trainer-step-{preset}-{where}.jsonl"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
        out.with_suffix(".md").write_text(table + "\n")
        print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
