"""One optimizer step of TRL's ``SFTTrainer`` (TRL >= 1.16: forward, backward, gradient clipping,
AdamW) on a random 4-layer Llama with a SmolLM2-sized vocabulary (V = 49,152), TRL alone and
with CE + 0.3·NTL attached in each of numtok's three ways: step time, peak memory and how often
the model runs per micro-batch.

    python benchmarks/bench_trl_step.py --threads 2          # V = 49,152, batch 8 x 256 tokens
    python benchmarks/bench_trl_step.py --quick              # tiny shapes, 1 round: a dry run
    python benchmarks/bench_trl_step.py --loss-on all        # loss on every token, not only the
                                                             # completion
    python benchmarks/bench_trl_step.py --device cuda        # bf16 autocast, synchronised clock

Modes (the first is the base of the ratios):

* ``trl``: ``SFTTrainer`` alone: its fused LM head (``model(..., fused_lm_head=True)``, per-token
  log-probabilities in tiles, no logits), cross-entropy only, no NTL;
* ``compute_loss_func``: ``SFTTrainer(..., compute_loss_func=loss_fn)`` and
  ``loss_fn.attach(trainer)`` (``NTLossForTrainer`` defaults): the model's full logits for the
  loss, then TRL's second forward under ``no_grad`` for its metrics (the older route);
* ``attach-trl``: ``NTLossForTrainer(tok, cross_entropy="model").attach(trainer)``: TRL's head
  computes the cross-entropy, numtok's number head NTL from the final hidden states;
* ``attach-numtok``: ``NTLossForTrainer(tok, cross_entropy="numtok").attach(trainer)``: numtok's
  logits-free pass computes CE + NTL and hands TRL its head's fields (what ``"auto"`` takes on
  CPU).

Method: the model is a Llama with 4 layers, hidden 256, MLP 768, 4 heads, 2 KV heads, untied
output layer, float32 weights (12.6M parameters in the embeddings, as many in the output layer,
2.4M in the layers); the tokenizer a WordLevel one built in process with 49,152 tokens, the
digits "0".."9" among them (the only number tokens). The data are pre-tokenized
prompt/completion pairs, 8 a batch, of 64 + 192 = 256 random token ids of which 10 % are digits
(no padding: every sequence has 256 tokens); ``--loss-on completion`` (default) is TRL's
``completion_only_loss=True`` (loss on the 192 completion tokens, the prompt's labels -100),
``--loss-on all`` puts it on every token. SFTConfig as TRL sets it except ``bf16=False`` on
CPU (TRL turns it on by default; on CUDA it stays on: bf16 autocast over float32 weights),
``optim="adamw_torch"``, learning rate 1e-4 constant, batch 8, no accumulation, logging every step
(outside the timed span); ``gradient_checkpointing`` TRL's default (on),
``--no-gradient-checkpointing`` turns it off.

Time: ``--rounds`` rounds, each running ``trainer.train()`` for ``--steps`` optimizer steps in
every mode, the order rotated each round; a step is timed from ``on_step_begin`` to
``on_step_end`` (the batch is already collated; on CUDA with a synchronisation at both ends), the
first step of every ``train()`` call (AdamW allocates its state there) is left out. Medians with
p20/p80, as multiples of ``trl``'s median and of ``compute_loss_func``'s; beside them the median
CPU time of the same steps (user + system of the process, ``time.process_time``) and its ratios:
on a shared machine other jobs stretch wall-clock time more than CPU time, so where the two
ratios agree the noise did not decide the result. Memory: each mode in a
fresh process, two steps; on CPU at the start of the second step VmHWM is reset to the current
VmRSS (writing "5" to /proc/self/clear_refs) and its rise during the step is the step's peak
(everything the step allocates above the model, its gradients' buffers and AdamW's state), the
process's VmHWM is reported too; on CUDA ``max_memory_allocated`` over the second step, above
what was allocated at its start, and over the process. Forwards: a forward hook on the decoder
(``model.model``) counts its calls in training mode (``forwards``) and those of them that record
gradients (``grad forwards``), a hook on the output layer the calls that build the full (B, T, V)
logits, each over the timed runs' micro-batches. Check: the first step's logged ``loss``, ``ce``
and ``ntl`` of every mode (same weights, same batch): the three numtok modes agree and their
``ce`` is ``trl``'s ``loss``. Targets (the issue's, on CPU): ``attach-numtok`` no worse than
``compute_loss_func`` in step time, step peak and process peak; ``attach-trl`` ≤ 1.05× ``trl``'s
step time. Results go to
``benchmarks/results/<date>T<time>-trl-step[-all]-cpu-t<threads>.{jsonl,md}``. The clock, the
interleaving, the memory probe and the relative differences are benchmarks/runner.py's
(``StepClock``, ``time_trainers``, ``in_fresh_process``, ``relative_error``); this script
declares the presets and the modes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_common import provenance, quantiles
from runner import StepClock, Steps, in_fresh_process, relative_error, time_trainers

RESULTS = Path(__file__).resolve().parent / "results"
NUMBER_FRACTION = 0.10
NTL_WEIGHT = 0.3
#: How each mode gets its loss; the first is the base of the ratios.
MODES = {
    "trl": "SFTTrainer alone (its fused LM head, CE only)",
    "compute_loss_func": "SFTTrainer(compute_loss_func=loss_fn) + loss_fn.attach(trainer)",
    "attach-trl": 'NTLossForTrainer(tok, cross_entropy="model").attach(trainer)',
    "attach-numtok": 'NTLossForTrainer(tok, cross_entropy="numtok").attach(trainer)',
}
#: The ratio of the second mode's step time (and peaks) to the first's that the issue allows.
TARGETS = [
    ("attach-numtok", "compute_loss_func", "time", 1.0),
    ("attach-numtok", "compute_loss_func", "step_peak", 1.0),
    ("attach-numtok", "compute_loss_func", "process_peak", 1.0),
    ("attach-trl", "trl", "time", 1.05),
]
SPECIALS = ["<pad>", "<unk>", "<eos>"]
DIGITS = [str(d) for d in range(10)]

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "vocab_size": 2048,
        "hidden": 32,
        "intermediate": 64,
        "layers": 2,
        "batch": 2,
        "prompt": 16,
        "sequence": 64,
    },
    "default": {
        "vocab_size": 49_152,
        "hidden": 256,
        "intermediate": 768,
        "layers": 4,
        "batch": 8,
        "prompt": 64,
        "sequence": 256,
    },
}


def _letters(index: int) -> str:
    """0 -> "a", 25 -> "z", 26 -> "ba", ...: token texts without digits."""
    text = ""
    while True:
        index, rest = divmod(index, 26)
        text = chr(ord("a") + rest) + text
        if index == 0:
            return text


def build_tokenizer(vocab_size: int) -> Any:
    """A WordLevel tokenizer of ``vocab_size`` tokens: the specials, the ten digits (ids 3..12),
    then words of letters."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{_letters(i)}" for i in range(vocab_size - len(SPECIALS) - len(DIGITS))]
    vocab = [*SPECIALS, *DIGITS, *words]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )


def build_model(size: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=size["vocab_size"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(1024, size["sequence"]),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def build_dataset(size: dict[str, Any], examples: int, loss_on: str) -> Any:
    """Pre-tokenized prompt/completion rows: ``input_ids`` (and, for a completion-only loss,
    TRL's ``completion_mask``), 10 % of the ids digits, the rest words."""
    import datasets  # type: ignore[import-untyped]

    first_digit, first_word = len(SPECIALS), len(SPECIALS) + len(DIGITS)
    generator = torch.Generator().manual_seed(0)
    shape = (examples, size["sequence"])
    ids = torch.randint(first_word, size["vocab_size"], shape, generator=generator)
    digits = first_digit + torch.randint(10, shape, generator=generator)
    ids = torch.where(torch.rand(shape, generator=generator) < NUMBER_FRACTION, digits, ids)
    mask = [0] * size["prompt"] + [1] * (size["sequence"] - size["prompt"])
    rows = [
        {"input_ids": row, **({"completion_mask": mask} if loss_on == "completion" else {})}
        for row in ids.tolist()
    ]
    return datasets.Dataset.from_list(rows)


class ForwardCounter:
    """Calls of the decoder in training mode (all, and those recording gradients) and of the
    output layer returning the full (B, T, V) logits."""

    def __init__(self, model: Any) -> None:
        self.forwards = self.grad_forwards = self.logits_built = 0
        self.counting = False
        model.model.register_forward_hook(self._decoder)
        model.lm_head.register_forward_hook(self._head)

    def _decoder(self, module: Any, args: Any, output: Any) -> None:
        if self.counting and module.training:
            self.forwards += 1
            self.grad_forwards += torch.is_grad_enabled()

    def _head(self, module: Any, args: Any, output: torch.Tensor) -> None:
        if self.counting and module.training and output.shape[-1] == module.out_features:
            self.logits_built += output.dim() == 3 and output.shape[1] > 1


def build_trainer(
    mode: str,
    size: dict[str, Any],
    steps: int,
    clock: StepClock,
    loss_on: str,
    checkpointing: bool,
) -> tuple[Any, ForwardCounter]:
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    from numtok.hf import NTLossForTrainer

    class Callback(TrainerCallback):
        on_step_begin = clock.on_step_begin
        on_step_end = clock.on_step_end
        on_log = clock.on_log

    on_cpu = clock.device.type == "cpu"
    tokenizer = build_tokenizer(size["vocab_size"])
    model = build_model(size, tokenizer)
    counter = ForwardCounter(model)
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_step_"),
        per_device_train_batch_size=size["batch"],
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=on_cpu,
        bf16=not on_cpu,
        gradient_checkpointing=checkpointing,
        max_length=size["sequence"],
        completion_only_loss=loss_on == "completion",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    loss_fn = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=build_dataset(size, size["batch"] * steps, loss_on),
            processing_class=tokenizer,
            callbacks=[Callback()],
            compute_loss_func=loss_fn if mode == "compute_loss_func" else None,
        )
    trainer.remove_callback(PrinterCallback)  # the logs printed every step
    if mode == "compute_loss_func":
        loss_fn.attach(trainer)
    elif mode.startswith("attach-"):
        cross_entropy = {"attach-trl": "model", "attach-numtok": "numtok"}[mode]
        NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, cross_entropy=cross_entropy).attach(
            trainer
        )
    return trainer, counter


def time_modes(
    size: dict[str, Any],
    rounds: int,
    steps: int,
    device: torch.device,
    modes: list[str],
    loss_on: str,
    checkpointing: bool,
) -> tuple[dict[str, Steps], dict[str, StepClock], dict[str, dict[str, float]]]:
    """Per-step wall-clock and CPU seconds of every mode (the first step of each train() call
    left out), the clocks (with the first logged terms) and the forwards per micro-batch."""
    clocks = {mode: StepClock(device) for mode in modes}
    built = {
        mode: build_trainer(mode, size, steps, clocks[mode], loss_on, checkpointing)
        for mode in modes
    }

    def counted(trainer: Any, counter: ForwardCounter) -> Callable[[], None]:
        def train() -> None:
            counter.counting = True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.train()
            counter.counting = False

        return train

    runs = {mode: counted(*built[mode]) for mode in modes}
    samples = time_trainers(runs, clocks, rounds)
    micro_batches = rounds * steps  # no gradient accumulation: one micro-batch a step
    forwards = {
        mode: {
            "forwards_per_micro_batch": counter.forwards / micro_batches,
            "grad_forwards_per_micro_batch": counter.grad_forwards / micro_batches,
            "logits_built_per_micro_batch": counter.logits_built / micro_batches,
        }
        for mode, (_, counter) in built.items()
    }
    return samples, clocks, forwards


def probe_peak(spec: dict[str, Any]) -> dict[str, int]:
    """In a fresh process (runner.in_fresh_process): two steps of ``spec["mode"]``; the second
    step's peak rise and the process's peak."""
    warnings.filterwarnings("ignore")
    device = torch.device(spec["device"])
    clock = StepClock(device, measure_memory=True)
    trainer, _ = build_trainer(
        spec["mode"], PRESETS[spec["preset"]], 2, clock, spec["loss_on"], spec["checkpointing"]
    )
    trainer.train()
    assert clock.peak is not None and clock.step_peak is not None
    return {"step_peak_bytes": clock.step_peak, "process_peak_bytes": clock.peak.process()}


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | step ms median (p20-p80) | × trl | × compute_loss_func | CPU × trl / × clf "
        "| step peak MiB | × trl | × compute_loss_func | process peak MiB | × compute_loss_func "
        "| forwards (grad) / micro-batch | logits built / micro-batch | first loss / ce / ntl |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        log = row.get("first_log") or {}
        terms = " / ".join(f"{log[key]:.4f}" for key in ("loss", "ce", "ntl") if key in log)
        lines.append(
            f"| {row['mode']} | {row['median_ms']:.0f} ({row['p20_ms']:.0f}-{row['p80_ms']:.0f}) "
            f"| {_ratio(row.get('time_ratio_trl'))} | {_ratio(row.get('time_ratio_clf'))} "
            f"| {_ratio(row.get('cpu_time_ratio_trl'))} / {_ratio(row.get('cpu_time_ratio_clf'))} "
            f"| {row.get('step_peak_mib', '')} | {_ratio(row.get('step_peak_ratio_trl'))} "
            f"| {_ratio(row.get('step_peak_ratio_clf'))} | {row.get('process_peak_mib', '')} "
            f"| {_ratio(row.get('process_peak_ratio_clf'))} "
            f"| {row['forwards_per_micro_batch']:g} ({row['grad_forwards_per_micro_batch']:g}) "
            f"| {row['logits_built_per_micro_batch']:g} | {terms} |"
        )
    return "\n".join(lines)


def check_targets(rows: list[dict[str, Any]]) -> list[str]:
    """One line per target: the measured ratio and PASS/FAIL (or why it was not measured)."""
    by_mode = {row["mode"]: row for row in rows}
    fields = {"time": "median_ms", "step_peak": "step_peak_mib", "process_peak": "process_peak_mib"}
    lines = []
    for mode, base, what, limit in TARGETS:
        name = f"{mode} {what} ≤ {limit:g}× {base}"
        field = fields[what]
        if mode not in by_mode or base not in by_mode or field not in by_mode[mode]:
            lines.append(f"{name}: not measured")
            continue
        ratio = by_mode[mode][field] / by_mode[base][field]
        line = f"{name}: {ratio:.3f}× {'PASS' if ratio <= limit else 'FAIL'}"
        if what == "time":
            cpu_ratio = by_mode[mode]["cpu_median_ms"] / by_mode[base]["cpu_median_ms"]
            line += f" (CPU time {cpu_ratio:.3f}×)"
        lines.append(line)
    return lines


def check_first_step(rows: list[dict[str, Any]]) -> list[str]:
    """The first logged terms: the numtok modes agree, their ce is trl's loss."""
    logs = {row["mode"]: row.get("first_log") or {} for row in rows}
    numtok = [mode for mode in logs if mode != "trl" and "ntl" in logs[mode]]
    lines = []
    if len(numtok) > 1:
        reference = logs[numtok[0]]
        worst = max(
            relative_error(logs[mode][key], reference[key])
            for mode in numtok
            for key in ("loss", "ce", "ntl")
        )
        lines.append(f"first step, loss/ce/ntl across {', '.join(numtok)}: rel. diff ≤ {worst:.1e}")
    if "trl" in logs and numtok and "loss" in logs["trl"]:
        difference = relative_error(logs[numtok[0]]["ce"], logs["trl"]["loss"])
        lines.append(f"first step, {numtok[0]} ce vs trl loss: rel. diff {difference:.1e}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 1 round, 3 steps")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per mode")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per train() call")
    parser.add_argument(
        "--loss-on",
        choices=["completion", "all"],
        default="completion",
        help="completion-only loss (TRL's completion_only_loss, default) or every token",
    )
    parser.add_argument(
        "--no-gradient-checkpointing",
        dest="gradient_checkpointing",
        action="store_false",
        help="turn off TRL's default gradient checkpointing",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    parser.add_argument("--out", type=Path, help="JSONL file (default: results/...; none --quick)")
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=list(MODES),
        help=f"comma-separated, among {', '.join(MODES)} (default all)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    preset = "quick" if args.quick else "default"
    size = PRESETS[preset]
    device = torch.device(args.device)
    rounds, steps = (1, 3) if args.quick else (args.rounds, args.steps)
    modes = args.modes
    if unknown := set(modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}; choose among {list(MODES)}")

    import transformers
    import trl

    meta = {
        **provenance(device, compiled=False),
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "threads": args.threads,
        "preset": preset,
        **size,
        "loss_on": args.loss_on,
        "gradient_checkpointing": args.gradient_checkpointing,
        "bf16": device.type == "cuda",
        "ntl_weight": NTL_WEIGHT,
        "number_fraction": NUMBER_FRACTION,
        "rounds": rounds,
        "steps_per_train_call": steps,
    }
    started = time.perf_counter()
    samples, clocks, forwards = time_modes(
        size, rounds, steps, device, modes, args.loss_on, args.gradient_checkpointing
    )
    spec = {"preset": preset, "device": args.device, "loss_on": args.loss_on}
    spec["checkpointing"] = args.gradient_checkpointing
    memory = {
        mode: in_fresh_process("bench_trl_step", "probe_peak", spec | {"mode": mode}, args.threads)
        for mode in ([] if args.no_memory else modes)
    }
    medians = {mode: quantiles(samples[mode].wall)[1] for mode in modes}
    cpu_medians = {mode: quantiles(samples[mode].cpu)[1] for mode in modes}
    rows = []
    for mode in modes:
        p20, median, p80 = quantiles(samples[mode].wall)
        row: dict[str, Any] = {
            **meta,
            "mode": mode,
            "how": MODES[mode],
            "steps_timed": len(samples[mode].wall),
            "median_ms": round(median, 1),
            "p20_ms": round(p20, 1),
            "p80_ms": round(p80, 1),
            "cpu_median_ms": round(cpu_medians[mode], 1),
            **forwards[mode],
            "first_log": clocks[mode].first_log,
        }
        for base, suffix in (("trl", "trl"), ("compute_loss_func", "clf")):
            if base in medians:
                row[f"time_ratio_{suffix}"] = round(median / medians[base], 3)
                row[f"cpu_time_ratio_{suffix}"] = round(cpu_medians[mode] / cpu_medians[base], 3)
        if mode in memory:
            for kind in ("step_peak", "process_peak"):
                row[f"{kind}_mib"] = round(memory[mode][f"{kind}_bytes"] / 2**20, 1)
                for base, suffix in (("trl", "trl"), ("compute_loss_func", "clf")):
                    if base in memory:
                        row[f"{kind}_ratio_{suffix}"] = round(
                            memory[mode][f"{kind}_bytes"] / memory[base][f"{kind}_bytes"], 3
                        )
        rows.append(row)
    targets = check_targets(rows)
    checks = check_first_step(rows)
    for row in rows:
        row["targets"] = targets
    elapsed = time.perf_counter() - started
    table = summary(rows)
    scope = "(CPU targets)" if device.type == "cpu" else "(the issue's targets are CPU ones)"
    text = "\n".join(
        [
            table,
            "",
            f"Targets {scope}:",
            *[f"- {line}" for line in targets],
            "",
            *[f"- {line}" for line in checks],
            f"- {rounds} rounds × {steps} steps per train() call ({steps - 1} timed), "
            f"loss on {args.loss_on} tokens, gradient checkpointing "
            f"{'on' if args.gradient_checkpointing else 'off'}, {elapsed / 60:.1f} min",
        ]
    )
    print(text)
    out = args.out
    if out is None and preset != "quick":
        stamp = meta["date"][:16].replace(":", "")
        where = f"{device.type}-t{args.threads}" if device.type == "cpu" else device.type
        name = "trl-step" + ("-all" if args.loss_on == "all" else "")
        name += "" if args.gradient_checkpointing else "-nockpt"
        name += "" if modes == list(MODES) else "-" + "+".join(modes)
        out = RESULTS / f"{stamp}-{name}-{where}.jsonl"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
        out.with_suffix(".md").write_text(text + "\n")
        print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
