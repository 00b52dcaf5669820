"""What the ``numtok`` command runs, for either task: checks before any work, the run, and the
lines it prints at the end. (Importing this needs the ``demo`` extra.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from numtok_compare.extras import require_extra
from numtok_compare.finetune.comparison import run_finetune
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.presets import (
    DEFAULT_REPRO_PRESET,
    DEFAULT_RJOKES_PRESET,
    PRESETS,
    check_preset,
)
from numtok_compare.runner.run_folder import prepare_run_dir
from numtok_compare.scratch.arithmetic import run_experiment
from numtok_compare.scratch.config import ExperimentConfig, RJokesConfig, TrainingConfig
from numtok_compare.scratch.rjokes import run_rjokes
from numtok_compare.summary import summary_lines
from numtok_compare.tasks.mathematics import TASKS
from numtok_compare.tasks.mathematics_compat import load_mathematics_dataset
from numtok_compare.tasks.rjokes import default_data_dir, find_data_dir
from numtok_compare.tasks.rjokes_download import DownloadError, fetch_rjokes

__all__ = [
    "DEFAULT_REPRO_PRESET",
    "DEFAULT_RJOKES_PRESET",
    "PRESETS",
    "TASKS",
    "DownloadError",
    "FinetuneConfig",
    "RJokesConfig",
    "check_prerequisites",
    "check_preset",
    "default_data_dir",
    "fetch_rjokes",
    "find_data_dir",
    "prepare_run_dir",
    "reads_rjokes",
    "run_and_summarise",
]


def reads_rjokes(config: TrainingConfig | FinetuneConfig) -> bool:
    """Whether the run reads the rJokes files."""
    if isinstance(config, FinetuneConfig):
        return config.task == "rjokes"
    return isinstance(config, RJokesConfig)


def check_prerequisites(config: TrainingConfig | FinetuneConfig, data_dir: Path | None) -> None:
    """What a run needs besides its settings: the rJokes files, the Mathematics generator, or
    (fine-tuning) transformers and, for LoRA, peft."""
    if reads_rjokes(config):
        find_data_dir(data_dir)
    if isinstance(config, FinetuneConfig):
        require_extra("pretrained", "the fine-tuning presets")
        if config.task.startswith("diamonds"):
            require_extra("tabular", "the diamonds task")
        if config.adaptation == "lora" and importlib.util.find_spec("peft") is None:
            raise ModuleNotFoundError(
                "the LoRA fine-tuning presets need peft: pip install peft", name="peft"
            )
    elif not isinstance(config, RJokesConfig):
        load_mathematics_dataset()


def run_and_summarise(
    config: TrainingConfig,
    run_dir: Path,
    *,
    workers: int,
    data_dir: Path | None,
    cache_dir: Path | None,
    show_progress: bool,
    command: str,
) -> list[str]:
    """Run (or resume) the comparison and return the summary lines to print."""
    if isinstance(config, FinetuneConfig):
        results = run_finetune(
            config, run_dir, data_dir=data_dir, show_progress=show_progress, command=command,
        )  # fmt: skip
        return [
            *summary_lines(results),
            f"{config.task} on {config.model}: {results['minutes']:.1f} min of training and "
            "scoring; report.md, results.json and report.png are in the run folder",
        ]
    if isinstance(config, RJokesConfig):
        results = run_rjokes(
            config,
            run_dir,
            data_dir=data_dir,
            workers=workers,
            show_progress=show_progress,
            command=command,
        )
        return [
            *summary_lines(results),
            f"rJokes from scratch: wall time {results['wall_seconds'] / 60:.1f} min; report.md, "
            "results.json and report.png are in the run folder",
        ]
    assert isinstance(config, ExperimentConfig)
    results = run_experiment(
        config,
        run_dir,
        workers=workers,
        cache_dir=cache_dir,
        show_progress=show_progress,
        command=command,
    )
    return [
        *summary_lines(results),
        f"{config.task} from scratch: wall time {results['wall_seconds'] / 60:.1f} min; "
        "report.md, results.json and report.png are in the run folder",
    ]
