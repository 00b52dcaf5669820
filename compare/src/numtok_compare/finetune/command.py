"""``numtok compare``: does a number loss help on *your* task? Fine-tune your model on your JSON
Lines (or a built-in preset) with CE and each number loss, paired seeds, λ chosen on
validation, the learnability gate per comparison, the test split scored once, and a report with
one interval per difference, the crossed seed × item analysis
(:mod:`numtok_compare.finetune.comparison`).

Every check runs before any training: the settings, the data (one line per error: file, line,
field), the model, a run folder that holds other settings, and a pre-registration the run does
not match.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from numtok.readout import MAX_DIGITS

if TYPE_CHECKING:  # the command line builds its parser without the harness's dependencies
    from numtok_compare.config import RunConfig
    from numtok_compare.finetune.config import FinetuneConfig
    from numtok_compare.runner.parallel import RayCluster

__all__ = [
    "COMPARE_DEFAULTS",
    "add_compare_arguments",
    "compare_config",
    "config_from_flags",
    "distribution_bound",
    "preflight_warnings",
    "ray_cluster",
    "run_compare",
    "run_reanalyse",
]

#: ``numtok compare --data``'s settings where no flag is given: the SmolLM2 arithmetic preset's
#: budget (LoRA rank 16 on q and v, 60 steps of 16 examples, learning rate 1e-3), CE against
#: CE + 0.3·NTL-WAS and the model before fine-tuning, 3 seeds; the distribution readouts drawn,
#: 64 numbers per example on validation and on the test splits as many as the comparisons of
#: the expected readout need, within the training's time (``--readout-samples auto``,
#: :mod:`~numtok_compare.finetune.draws`), unless ``--readout-tolerance`` asks for the
#: enumeration (the cost does not grow with the answers' length or spread, and the draws' noise
#: is in every interval: docs/compare.md).
COMPARE_DEFAULTS: dict[str, Any] = {
    "task": "jsonl",
    "arms": ("base", "ce", "was"),
    "adaptation": "lora",
    "steps": 60,
    "batch_size": 16,
    "learning_rate": 1e-3,
    "warmup_steps": 6,
    "readout_samples": 64,
    "choose_test_samples": True,
}
#: The largest answer the distribution readouts read by default (``--max-value auto``): every
#: number the readout can read (``numtok.readout.MAX_DIGITS`` digits); the draws per example
#: (or the tolerance), not a cap on the answers, bound what it costs.
AUTO_MAX_VALUE = 10**MAX_DIGITS - 1


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected λ values separated by commas (0.3,1,3), got {text!r}"
        ) from None


def add_compare_arguments(
    parser: argparse.ArgumentParser,
    seeds: Any,
    arms: Any,
    arm_weights: Any,
    *,
    source_required: bool = True,
) -> None:
    """The flags of ``numtok compare`` (``seeds``, ``arms``, ``arm_weights``: the command line's
    parsers of those values; ``source_required``: one of ``--data`` and ``--preset`` must be
    given)."""
    source = parser.add_mutually_exclusive_group(required=source_required)
    source.add_argument(
        "--data", type=Path,
        help="your task: a .jsonl file (one {\"prompt\": ..., \"answer\": number, \"split\": "
        "train|validation|test} per line; split optional) or a folder of them",
    )  # fmt: skip
    source.add_argument("--preset", help="a built-in comparison instead (numtok list)")
    source.add_argument(
        "--reanalyse", type=Path, metavar="RUN",
        help="rebuild a finished fine-tuning run's report from its rows with this version's "
        "analysis: its run folder or results file (writes into --out, default the run folder)",
    )  # fmt: skip
    parser.add_argument(
        "--model", help="a local causal LM folder (default smollm2: SmolLM2-135M-Instruct, built "
        "by numtok model smollm2 on first use)"
    )  # fmt: skip
    parser.add_argument(
        "--arms", type=arms,
        help="comma-separated, ce required: base (before fine-tuning), ce, was, mse, number, "
        "del, smmd, dist2, ntil (CE + λ·that loss), gls (Gaussian label smoothing), head (a "
        "regression head); default base,ce,was",
    )  # fmt: skip
    parser.add_argument("--seeds", type=seeds, help="number of seeds (3) or a list (3,4,5)")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--ntl-weight", type=float, help="λ of every number loss (default 0.3)")
    weights.add_argument("--arm-weights", type=arm_weights, help="λ per arm, e.g. was=3,del=1")
    weights.add_argument(
        "--choose-on-validation", type=_floats, metavar="GRID",
        help="train every number loss at each λ of GRID (e.g. 0.3,1,3) and keep, per arm, the "
        "λ with the best mean validation --metric over the seeds (ties: the smaller)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, help="training steps per arm (default 60 with --data)")
    parser.add_argument("--batch-size", type=int, help="examples per step (default 16)")
    parser.add_argument("--learning-rate", type=float, help="default 1e-3 (LoRA)")
    parser.add_argument("--head-learning-rate", type=float, help="the head arm's own rate")
    parser.add_argument(
        "--training-args", type=Path, metavar="FILE",
        help="a JSON or YAML mapping of transformers TrainingArguments fields every arm's "
        "Trainer takes (lr_scheduler_type, warmup_ratio, gradient_accumulation_steps, bf16, "
        "deepspeed, fsdp, report_to, ...); --steps, --batch-size and --learning-rate override "
        "its max_steps, per_device_train_batch_size and learning_rate",
    )  # fmt: skip
    parser.add_argument("--adaptation", choices=("lora", "full"), help="default lora")
    parser.add_argument("--lora-rank", type=int, help="default 16")
    parser.add_argument(
        "--metric", help="the endpoint: λ's choice, the gate and the primary endpoint "
        "(exact_accuracy, mae, rmse, log_mae [default], within_1_percent)"
    )  # fmt: skip
    parser.add_argument(
        "--readout", help="greedy (default), expected, median, mode (need --max-value), head"
    )
    parser.add_argument(
        "--target-effect", type=float,
        help="plan for an effect of this size in --metric (MSE for rmse): the report gives the "
        "seeds and items whose MDE reaches it, from the run's variance components (with "
        "--validation-only, before the test split is scored; with --reanalyse, afterwards)",
    )  # fmt: skip
    parser.add_argument(
        "--margin", type=float,
        help="also test equivalence within ±M of --metric (MSE for rmse) for the primary "
        "comparisons against --margin-against, two one-sided tests at 5 %% (pre-registrable)",
    )  # fmt: skip
    parser.add_argument(
        "--margin-against", choices=("ce", "head"),
        help="with --margin: the arm whose comparisons it tests (default: the regression head "
        "where --arms has one, else ce)",
    )  # fmt: skip
    parser.add_argument(
        "--max-value", default="auto",
        help="the expected/median readouts enumerate the numbers 0..N: an int, 'none', or "
        f"'auto' (default: the largest training answer when every training answer is an "
        f"integer from 0 to {AUTO_MAX_VALUE:,}, else none: greedy answers only)",
    )  # fmt: skip
    parser.add_argument(
        "--readout-tolerance", type=float,
        help="the probability the expected/median/mode readouts may leave unexplored per example, "
        "a share of its number mass (default 0.001; 0: exact; larger: faster, the mean within "
        "about that share of the range 0..max-value)",
    )  # fmt: skip
    parser.add_argument(
        "--readout-samples",
        help="the expected/median/mode readouts from N numbers drawn per example (the mean "
        "unbiased, with its standard error; the cost does not grow with the answers' spread); "
        f"'auto': {COMPARE_DEFAULTS['readout_samples']} on validation, and on the test splits "
        "as many as the expected readout's comparisons need for the draws to be a tenth of "
        "their variance, within the training's time; or 'none': enumerated, with "
        "--readout-tolerance (default with --data: auto, or none when --readout-tolerance is "
        "given; a preset: its own)",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, help="tokens generated per answer (8)")
    parser.add_argument("--device", help="cpu (default), cuda, cuda:N or mps")
    parser.add_argument("--threads", type=int, help="torch threads (default 2)")
    parser.add_argument("--data-dir", type=Path, help="--preset *rjokes*: the rJokes folder")
    parser.add_argument(
        "--out", type=Path, help="run folder (default runs/<preset or compare>-<settings hash>)"
    )
    parser.add_argument(
        "--preregister", type=Path, metavar="FILE",
        help="pre-registration: if FILE does not exist, write the hypothesis, primary endpoint, "
        "arms, λ, seeds and splits there and stop (commit it, then run the same command again); "
        "if it exists, run only if this run is the one it names",
    )  # fmt: skip
    parser.add_argument("--hypothesis", help="with --preregister: what the run tests")
    parser.add_argument(
        "--primary",
        help="with --preregister: the arm of the primary endpoints (ARM − CE, and "
        "ARM − head where a regression head runs)",
    )
    parser.add_argument(
        "--deviation",
        metavar="TEXT",
        help="with a --preregister FILE that exists: run even where this run differs from it "
        "(settings, data, model, code, or a file not committed), stating why; the report prints "
        "the differences and TEXT",
    )
    parser.add_argument(
        "--validation-only", action="store_true",
        help="train and score the validation split only, for choosing settings (steps, learning "
        "rate, λ) without seeing the test split; the same command without it then scores the "
        "test splits from the same folder",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress lines")
    parser.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="ray: run the jobs (every seed, arm and λ) as Ray tasks, each with --threads CPUs "
        "and, on --device cuda, one GPU; a worker lost in training is retried from its last "
        "checkpoint (needs numtok-compare's ray extra; docs/compare.md, On a Ray cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--ray-address",
        help="with --executor ray: the running cluster to join (default: RAY_ADDRESS, else a "
        "Ray started on this machine); --out must be on storage every node sees",
    )
    parser.add_argument(
        "--job-processes", type=int, metavar="N",
        help="with --executor ray: train each job on N processes (torchrun inside its Ray task; "
        "N GPUs on --device cuda), for an arm too big for one GPU (default 1)",
    )  # fmt: skip


def ray_cluster(args: argparse.Namespace, config: RunConfig) -> RayCluster | None:
    """The Ray cluster ``--executor ray`` runs the jobs on (None: the local executor), each job
    on ``--job-processes`` processes of ``config.threads`` CPUs and, on a CUDA device, one GPU
    each; a ValueError for ``--ray-address`` or ``--job-processes`` without it, a
    ModuleNotFoundError naming the extra where Ray is missing."""
    processes = getattr(args, "job_processes", None)
    if getattr(args, "executor", "local") != "ray":
        given = [
            flag
            for flag, value in (
                ("--ray-address", getattr(args, "ray_address", None)),
                ("--job-processes", processes),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{given[0]} applies to --executor ray only")
        return None
    if processes is not None and processes < 1:
        raise ValueError(f"--job-processes must be at least 1, got {processes}")
    from numtok_compare.extras import require_extra
    from numtok_compare.runner.parallel import RayCluster

    if getattr(args, "workers", None) is not None:
        raise ValueError(
            "--workers does not apply to --executor ray (Ray runs as many jobs at once as the "
            "cluster has CPUs and GPUs for)"
        )
    require_extra("ray", "--executor ray")
    gpus = 1.0 if config.device.startswith("cuda") else 0.0
    return RayCluster(
        args.ray_address, cpus=float(config.threads), gpus=gpus, processes=processes or 1
    )


def distribution_bound(data: Path) -> tuple[int | None, int]:
    """``(max_value, max_digits)`` of ``--max-value auto``: the largest training answer when
    every training answer is an integer from 0 to :data:`AUTO_MAX_VALUE`, else no
    distribution readouts."""
    from numtok_compare.tasks.jsonl import read_user_data

    train = read_user_data(data).splits["train"]
    values = [record.value for record in train]
    if all(v.is_integer() and 0 <= v <= AUTO_MAX_VALUE for v in values) and all(
        "." not in record.answer for record in train
    ):
        largest = int(max(values))
        return largest, len(str(largest))
    return None, 2


def _max_value(text: str, data: Path | None) -> dict[str, Any]:
    if text == "auto":
        if data is None:
            return {}
        value, digits = distribution_bound(data)
        return {"max_value": value, "max_digits": digits}
    if text == "none":
        return {"max_value": None}
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--max-value must be an int, 'auto' or 'none', got {text!r}") from None
    return {"max_value": value, "max_digits": max(1, len(str(value)))}


def _readout_samples(args: argparse.Namespace) -> dict[str, Any]:
    """``readout_samples`` and ``choose_test_samples`` from ``--readout-samples`` (an int,
    'auto' or 'none'); none where only ``--readout-tolerance`` is given (the user asks for the
    enumeration); nothing otherwise."""
    text = getattr(args, "readout_samples", None)
    if text is None and args.readout_tolerance is None:
        return {}
    if text == "auto":
        return {key: COMPARE_DEFAULTS[key] for key in ("readout_samples", "choose_test_samples")}
    if text in (None, "none"):
        return {"readout_samples": None, "choose_test_samples": False}
    try:
        return {"readout_samples": int(text), "choose_test_samples": False}
    except ValueError:
        raise ValueError(
            f"--readout-samples must be an int, 'auto' or 'none', got {text!r}"
        ) from None


def config_from_flags(
    args: argparse.Namespace, base: RunConfig | None, where: str, **settings: Any
) -> Any:
    """The settings of a comparison's command line, in this order: a preset's (``base``; None:
    ``--data`` with :data:`COMPARE_DEFAULTS`), ``--training-args``' file, every flag of
    :data:`~numtok_compare.config.FLAGS` given (``--task`` aside: it chooses the preset), then
    ``settings``, and the sizes of ``--train-examples`` and ``--eval-examples`` (checked first:
    a size the task does not have is the error a command line gives first). A flag whose
    setting ``base`` lacks is a ValueError naming it and ``where`` (what the run is)."""
    from numtok_compare.config import FLAGS
    from numtok_compare.finetune.config import FinetuneConfig

    known = {f.name for f in fields(type(base) if base is not None else FinetuneConfig)}
    given: dict[str, Any] = {}
    if base is None:
        given = {**COMPARE_DEFAULTS, "data": str(args.data), "model": "smollm2"}
    if getattr(args, "training_args", None) is not None:
        from numtok_compare.training_args import read_training_args

        given |= read_training_args(args.training_args)
    for name, flag in FLAGS.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if value is None or name == "task":
            continue
        if name not in known:
            raise ValueError(f"{flag} does not apply to {where}")
        given[name] = value
    given |= settings
    sizes = {"train_examples": args.train_examples, "eval_examples": args.eval_examples}
    if base is None:
        return FinetuneConfig(**given).with_sizes(**sizes)
    return base.with_sizes(**sizes).with_overrides(**given)


def compare_config(args: argparse.Namespace, base: FinetuneConfig | None) -> FinetuneConfig:
    """The settings of ``numtok compare`` fine-tuning: :func:`config_from_flags` with
    ``--max-value``."""
    where = f"the fine-tuning preset {args.preset!r}"
    config: FinetuneConfig = config_from_flags(
        args, base, where, **_max_value(args.max_value, args.data), **_readout_samples(args)
    )
    return config


def _log_lines(quiet: bool) -> Callable[[str], None]:
    if quiet:
        return lambda _line: None
    return lambda line: print(line, flush=True)


def _check_paths(args: argparse.Namespace) -> None:
    """The flags that name paths, checked before anything slow (importing the harness, loading
    or building the model): a ValueError naming the flag."""
    from numtok_compare.runner.run_folder import why_not_creatable

    if args.model is not None and args.model != "smollm2":
        model = Path(args.model)
        if not model.exists():
            raise ValueError(
                f"--model {model}: the folder does not exist (give a local folder of a saved "
                "causal LM, or leave --model out for SmolLM2-135M-Instruct)"
            )
        if not model.is_dir():
            raise ValueError(f"--model {model} is a file, not a model folder (save_pretrained's)")
    if args.out is not None:
        why = why_not_creatable(args.out)
        if why is not None:
            raise ValueError(f"--out {args.out} cannot be the run folder: {why}")
    if args.deviation is not None and (args.preregister is None or not args.preregister.exists()):
        raise ValueError(
            "--deviation states why a run differs from its pre-registration: give it with the "
            "--preregister FILE the run is held to (an existing file)"
        )
    if args.preregister is not None:
        if args.preregister.is_dir():
            raise ValueError(f"--preregister {args.preregister} is a folder, not a file")
        if args.preregister.exists():
            _check_preregistration_file(args.preregister)
        else:
            why = why_not_creatable(args.preregister.parent)
            if why is not None:
                raise ValueError(f"--preregister {args.preregister} cannot be written: {why}")


def _check_preregistration_file(path: Path) -> None:
    """An existing ``--preregister`` file: readable, and a JSON object (as
    :func:`~numtok_compare.finetune.preregistration.write_preregistration` writes it)."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(
            f"--preregister {path}: cannot read the file ({error.strerror or error})"
        ) from None
    except ValueError as error:  # not JSON, or not UTF-8
        raise ValueError(
            f"--preregister {path} is not a pre-registration that numtok compare wrote (not "
            f"JSON: {error}); give a new file to write one"
        ) from None
    if not isinstance(stored, dict):
        raise ValueError(
            f"--preregister {path} is not a pre-registration that numtok compare wrote (a JSON "
            f"{type(stored).__name__}, not an object); give a new file to write one"
        )


def run_compare(
    args: argparse.Namespace,
    base: FinetuneConfig | None,
    fail: Callable[[str], NoReturn],
    command: str | None = None,
) -> int:
    """``numtok compare``: ``fail(message)`` exits with status 2 and one error line; ``command``:
    the command line, for the report. The flags
    and the data are checked first, in seconds; the data against the model's tokenizer and
    context (a prompt too long) once the model is found or built."""
    from numtok_compare.tasks.jsonl import DataError, read_user_data

    try:
        _check_positive_flags(args)
        _check_paths(args)
        if args.data is not None:
            read_user_data(args.data)  # the data's own errors before the model is loaded
        config = compare_config(args, base)
        cluster = ray_cluster(args, config)
    except (ValueError, TypeError, DataError, ModuleNotFoundError) as error:
        fail(str(error))
    registering = args.preregister is not None and not args.preregister.exists()
    if (args.hypothesis or args.primary) and not registering:
        fail("--hypothesis and --primary write a new pre-registration: give --preregister FILE "
             "with a file that does not exist yet")  # fmt: skip
    if args.dry_run:
        print(f"{args.preset or 'compare'}: {config.plan()}")
        print("a dry run: the settings and flags are checked; the model and the data are read "
              "when the run starts, and nothing is trained or written (--estimate instead of "
              "--dry-run reads them and prints the time the run will take)")  # fmt: skip
        return 0
    from numtok_compare.comparison import work_left
    from numtok_compare.finetune.comparison import (
        FinetuneComparison,
        check_registered,
        estimate_minutes,
        prepare,
        preregistration_of,
        run_finetune,
    )
    from numtok_compare.finetune.preregistration import write_preregistration
    from numtok_compare.runner.parallel import JobsFailedError
    from numtok_compare.runner.run_folder import is_main_process, prepare_run_dir
    from numtok_compare.summary import summary_lines

    try:
        prepared = prepare(config, args.data_dir)
        if registering:
            if not (args.hypothesis and args.primary):
                raise ValueError(
                    "--preregister FILE (new) needs --hypothesis TEXT and --primary ARM"
                )
            record = preregistration_of(
                config, prepared, hypothesis=args.hypothesis, primary_arm=args.primary
            )
            write_preregistration(args.preregister, record)
            print(f"pre-registration written to {args.preregister}: commit it, then run the same "
                  "command again (without --hypothesis and --primary) to train")  # fmt: skip
            return 0
        if args.preregister is not None:
            check_registered(config, prepared, args.preregister, deviation=args.deviation)
        run_dir = args.out or Path("runs") / f"compare-{config.fingerprint()}"
        if not args.estimate:
            prepare_run_dir(config, run_dir)
    except (ValueError, TypeError, ModuleNotFoundError, DataError) as error:
        fail(str(error))
    work = work_left(FinetuneComparison(config, prepared, args.validation_only), run_dir)
    print(config.plan(), file=sys.stderr)
    for warning in preflight_warnings(config, run_dir, args.target_effect):
        print(f"warning: {warning}", file=sys.stderr)
    if work.steps + work.items:
        minutes, step_seconds, example_seconds = estimate_minutes(config, prepared, work)
        print(
            f"estimate: {minutes:.1f} min ({work.steps * step_seconds / 60:.1f} training the "
            f"{work.steps:,} steps left, {work.items * example_seconds / 60:.1f} scoring the "
            f"{work.items:,} examples left; a probe: {step_seconds:.2f} s a CE step, "
            f"{example_seconds:.2f} s an example)" + _chosen_draws_estimate(
                config, minutes, work.steps * step_seconds / 60),
            file=sys.stderr,
        )  # fmt: skip
    if args.estimate:
        print(f"an estimate only: nothing trained or written ({run_dir} is the run folder)")
        return 0
    # A progress bar, or (--no-progress, e.g. into a log file) a line every ten steps.
    try:
        results = run_finetune(
            config, run_dir, data_dir=args.data_dir, preregistered=args.preregister,
            deviation=args.deviation, prepared=prepared, validation_only=args.validation_only,
            cluster=cluster, show_progress=not args.no_progress and is_main_process(),
            log=_log_lines(not args.no_progress or not is_main_process()),
            command=command, target_effect=args.target_effect,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(f"\nnumtok: interrupted; rerun the same command to resume from {run_dir}",
              file=sys.stderr)  # fmt: skip
        return 130
    except JobsFailedError as error:
        print(f"numtok: error: {error}", file=sys.stderr)
        return 1
    if is_main_process():  # under torchrun, one process reports the run all of them trained
        print("\n".join(summary_lines(results)))
        print(f"{results['minutes']:.1f} min; report.md, results.json and report.png in {run_dir}")
    return 0


def _chosen_draws_estimate(config: FinetuneConfig, minutes: float, training: float) -> str:
    """Where the test splits' draws are chosen on validation, the estimate's upper end: they may
    take the test's scoring up to what keeps the run's scoring within its training, so the run
    up to twice its training (:mod:`~numtok_compare.finetune.draws`)."""
    if not config.choose_test_samples or config.max_value is None:
        return ""
    return (
        f"; up to {max(minutes, 2 * training):.1f} min where the test splits draw more, chosen on "
        "validation within the training's time"
    )


def preflight_warnings(
    config: FinetuneConfig, run_dir: Path, target_effect: float | None
) -> list[str]:
    """What the run cannot show, said before it trains: one seed gives no interval (the
    crossed analysis estimates the seed component from the seeds' spread), two give it one
    degree of freedom; with
    ``target_effect`` and an earlier report in ``run_dir`` (a ``--validation-only`` run, say),
    each primary comparison whose MDE at this run's design is above it, with the seeds and
    items that would reach it."""
    from scipy import stats

    from numtok_compare.design import Design
    from numtok_compare.planning import planning

    warnings = []
    if len(config.seeds) < 2:
        warnings.append(
            f"one seed ({config.seeds[0]}): the seed × item analysis needs at least two seeds "
            "for an interval, so this run gives no verdict on any comparison (--seeds 0,1,2)"
        )
    elif len(config.seeds) == 2:
        warnings.append(
            "two seeds: the seed × item analysis estimates the seed component from one degree "
            "of freedom, so wherever the seeds differ the interval is very wide (t at 95 % is "
            f"{float(stats.t.ppf(0.975, 1)):.1f} on one degree of freedom) and the gate and the "
            "comparisons rarely give a verdict; four or more seeds are safer"
        )
    stored = run_dir / "results.json"
    if target_effect is None or not stored.exists():
        return warnings
    results = json.loads(stored.read_text())
    if not {"design", "comparisons", "references"} <= results.keys():
        return warnings
    items = {split: len(truth) for split, truth in results["references"].items()}
    plan = planning(
        Design.from_dict(results["design"]), results["comparisons"], items, target_effect
    )
    for entry in plan["arms"]:
        if entry["arm"] not in plan["mde_above"]:
            continue
        seeds, count = entry["seeds_needed"], entry["items_needed"]
        seeds_range, items_range = (
            "–".join("any number" if n is None else f"{n:,}" for n in entry[f"{kind}_needed_range"])
            for kind in ("seeds", "items")
        )
        warnings.append(
            f"{entry['arm']} − CE: the MDE of this design is {entry['mde']:.4f} {plan['metric']} "
            f"(from {stored}'s {plan['split']} components), above --target-effect "
            f"{target_effect:g}; it needs "
            f"{'more seeds than any number' if seeds is None else f'{seeds} seeds'} at "
            f"{entry['items']:,} items, or "
            f"{'more items than any number' if count is None else f'{count:,} items'} at "
            f"{plan['seeds']} seeds (at the components' 95 % limits {seeds_range} seeds, "
            f"{items_range} items)"
        )
    return warnings


def _check_positive_flags(args: argparse.Namespace) -> None:
    """``--target-effect`` and ``--margin``, where given, are finite and positive: the error
    names the flag, before any training."""
    for flag in ("--target-effect", "--margin"):
        value = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a positive number, got {value:g}")


def run_reanalyse(
    args: argparse.Namespace, arguments: Sequence[str], fail: Callable[[str], NoReturn]
) -> int:
    """``numtok compare --reanalyse RUN [--out DIR] [--target-effect E]``: the report rebuilt
    from RUN's rows; any other flag is an error (the rows hold the run's settings)."""
    from numtok_compare.finetune.rows import upgrade_rows
    from numtok_compare.report import reanalyse
    from numtok_compare.summary import summary_lines

    others = [a.split("=")[0] for a in arguments[1:] if a.startswith("--")]
    others = [flag for flag in others if flag not in ("--reanalyse", "--out", "--target-effect")]
    if others:
        fail(f"{others[0]} does not apply to --reanalyse (the rows hold the run's settings; "
             "only --out and --target-effect apply)")  # fmt: skip
    source: Path = args.reanalyse
    try:
        _check_positive_flags(args)
    except ValueError as error:
        fail(str(error))
    if not source.exists():
        fail(f"--reanalyse {source}: no such run folder or file")
    out = args.out or (source if source.is_dir() else None)
    if out is None:
        fail(f"--reanalyse {source} is a file: give --out DIR, the folder to write the report in")
    try:
        results = reanalyse(source, out, upgrade=upgrade_rows, target_effect=args.target_effect)
    except ValueError as error:
        fail(str(error))
    print("\n".join(summary_lines(results)))
    print(f"report.md, results.json and report.png in {out} (reanalysed from {source})")
    return 0
