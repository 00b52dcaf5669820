"""The ``numtok`` command.

``numtok demo`` runs the arithmetic comparison (CE vs CE + λ·NTL-WAS vs CE + λ·NTL-MSE on
DeepMind's Mathematics data, a small transformer trained from scratch) in about ten minutes on two
CPU cores; ``numtok repro --preset NAME`` runs the longer presets; ``numtok list`` shows the
presets and tasks. Rerunning a command resumes its run folder.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from numtok.experiments.compat import load_mathematics_dataset
from numtok.experiments.config import ExperimentConfig
from numtok.experiments.data import TASKS
from numtok.experiments.objectives import ARMS
from numtok.experiments.presets import DEFAULT_REPRO_PRESET, PRESETS, check_preset
from numtok.experiments.report import format_table, overhead_lines
from numtok.experiments.run_folder import prepare_run_dir
from numtok.experiments.runner import run_experiment

__all__ = ["main"]

# Settings that have a flag: config field -> flag.
_FLAGS = {
    "task": "--task",
    "seeds": "--seeds",
    "arms": "--arms",
    "ntl_weight": "--ntl-weight",
    "steps": "--steps",
    "batch_size": "--batch-size",
    "train_questions": "--train-questions",
    "eval_questions": "--eval-questions",
    "device": "--device",
    "threads": "--threads",
}


def _seeds(text: str) -> tuple[int, ...]:
    """``"3"`` is three seeds (0, 1, 2); ``"0,4,7"`` names them."""
    try:
        if "," in text:
            return tuple(int(part) for part in text.split(",") if part.strip())
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seeds (3) or a comma-separated list (0,4,7), got {text!r}"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"expected at least one seed, got {text!r}; e.g. --seeds 3 or --seeds 0,1,2"
        )
    return tuple(range(count))


def _arms(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help=f"Mathematics task (one of: {', '.join(TASKS)})")
    parser.add_argument("--seeds", type=_seeds, help="number of seeds (3) or a list (0,4,7)")
    parser.add_argument(
        "--arms",
        type=_arms,
        help=f"comma-separated arms among {', '.join(ARMS)} (ce required; gls: Gaussian "
        "label smoothing)",
    )
    parser.add_argument("--ntl-weight", type=float, help="λ in CE + λ·NTL (default 0.3)")
    parser.add_argument("--steps", type=int, help="training steps per arm")
    parser.add_argument("--batch-size", type=int, help="questions per step")
    parser.add_argument("--train-questions", type=int, help="size of the generated training set")
    parser.add_argument("--eval-questions", type=int, help="held-out questions per split")
    parser.add_argument("--device", help="cpu (default), cuda, cuda:N or mps")
    parser.add_argument("--threads", type=int, help="torch threads per worker process (default 1)")
    parser.add_argument(
        "--workers",
        type=int,
        help="arms trained at once in parallel processes (default: one per CPU core; 1 on GPU)",
    )
    parser.add_argument(
        "--out", type=Path, help="run folder (default runs/<preset>-<settings hash>)"
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="generated questions cache (default ~/.cache/numtok)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numtok", description="Number Token Loss experiments on DeepMind's Mathematics data"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="CE vs CE+NTL-WAS vs CE+NTL-MSE on a + b arithmetic, ~10 min on 2 CPU cores"
    )
    _add_run_flags(demo)
    repro = commands.add_parser("repro", help="a longer preset (numtok list shows them)")
    repro.add_argument(
        "--preset", default=DEFAULT_REPRO_PRESET, help=f"default {DEFAULT_REPRO_PRESET}"
    )
    _add_run_flags(repro)
    commands.add_parser("list", help="show the presets and tasks")
    return parser


def _with_flag_hint(message: str) -> str:
    """Point at the flag that sets the setting a message is about."""
    for name, flag in _FLAGS.items():
        if message.startswith((f"{name} ", f"unknown {name}", f"each {name[:-1]}")):
            return f"{message} (set with {flag})"
    return message


def _build_config(args: argparse.Namespace, preset_name: str) -> ExperimentConfig:
    """The preset's settings with the flags given on the command line."""
    return check_preset(preset_name).config.with_overrides(
        **{name: getattr(args, name) for name in _FLAGS}
    )


def _default_workers(config: ExperimentConfig) -> int:
    if config.device != "cpu":
        return 1
    jobs = len(config.seeds) * len(config.arms)
    return max(1, min(jobs, (os.cpu_count() or 1) // config.threads))


def _list() -> None:
    print("presets (numtok repro --preset NAME; numtok demo runs 'demo'):")
    for preset in PRESETS.values():
        print(f"  {preset.name}: {preset.description}")
    print("tasks (--task NAME):")
    for spec in TASKS.values():
        print(f"  {spec.name}: {spec.description}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``numtok`` command; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(arguments)
    if args.command == "list":
        _list()
        return 0
    preset_name = "demo" if args.command == "demo" else args.preset
    # Everything that can be wrong with the command is checked before any work starts.
    try:
        config = _build_config(args, preset_name)
        workers = args.workers if args.workers is not None else _default_workers(config)
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        run_dir = args.out or Path("runs") / f"{preset_name}-{config.fingerprint()}"
        load_mathematics_dataset()
        prepare_run_dir(config, run_dir)
    except (ValueError, TypeError, ModuleNotFoundError) as error:
        parser.exit(2, f"numtok: error: {_with_flag_hint(str(error))}\n")

    try:
        results = run_experiment(
            config,
            run_dir,
            workers=workers,
            cache_dir=args.cache_dir,
            show_progress=not args.no_progress,
            command="numtok " + shlex.join(arguments),
        )
    except KeyboardInterrupt:
        print(
            f"\nnumtok: interrupted; rerun the same command to resume from {run_dir}",
            file=sys.stderr,
        )
        return 130
    print()
    print(f"{config.task}: mean ± std over {len(config.seeds)} seeds, {config.steps} steps")
    print(format_table(results))
    print()
    print(results["verdict"])
    for hit in results["verdict_hits"]:
        print(f"  - {hit}")
    for line in overhead_lines(results):
        print(line)
    print(f"wall time {results['wall_seconds'] / 60:.1f} min")
    print(f"run folder: {run_dir} (report.md, results.json, curves.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
