"""What the ``numtok`` command runs, for either task: checks before any work, the run, and the
lines it prints at the end. (Importing this needs the ``demo`` extra.)"""

from __future__ import annotations

from pathlib import Path

from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.presets import (
    DEFAULT_REPRO_PRESET,
    DEFAULT_RJOKES_PRESET,
    PRESETS,
    check_preset,
)
from numtok_compare.runner.parallel import JobsFailedError, RayCluster
from numtok_compare.runner.run_folder import prepare_run_dir
from numtok_compare.scratch.arithmetic import run_experiment
from numtok_compare.scratch.config import ExperimentConfig, RJokesConfig, TrainingConfig
from numtok_compare.scratch.rjokes import run_rjokes
from numtok_compare.summary import summary_lines
from numtok_compare.tasks.mathematics import TASKS
from numtok_compare.tasks.rjokes import default_data_dir, find_data_dir
from numtok_compare.tasks.rjokes_download import DownloadError, fetch_rjokes

__all__ = [
    "DEFAULT_REPRO_PRESET",
    "DEFAULT_RJOKES_PRESET",
    "PRESETS",
    "TASKS",
    "DownloadError",
    "FinetuneConfig",
    "JobsFailedError",
    "RJokesConfig",
    "check_preset",
    "default_data_dir",
    "fetch_rjokes",
    "find_data_dir",
    "prepare_run_dir",
    "run_and_summarise",
]


def run_and_summarise(
    config: TrainingConfig,
    run_dir: Path,
    *,
    workers: int,
    cluster: RayCluster | None,
    data_dir: Path | None,
    cache_dir: Path | None,
    show_progress: bool,
    command: str,
) -> list[str]:
    """Run (or resume) a comparison trained from scratch and return the summary lines to
    print."""
    if isinstance(config, RJokesConfig):
        results = run_rjokes(
            config, run_dir, data_dir=data_dir, workers=workers, cluster=cluster,
            show_progress=show_progress,
            command=command,
        )  # fmt: skip
        what = "rJokes"
    else:
        assert isinstance(config, ExperimentConfig)
        results = run_experiment(
            config, run_dir, workers=workers, cluster=cluster, cache_dir=cache_dir,
            show_progress=show_progress,
            command=command,
        )  # fmt: skip
        what = config.task
    return [
        *summary_lines(results),
        f"{what} from scratch: wall time {results['wall_seconds'] / 60:.1f} min; report.md, "
        "results.json and report.png are in the run folder",
    ]
