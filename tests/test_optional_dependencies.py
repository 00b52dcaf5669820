"""numtok with torch alone: the core imports and computes without any optional dependency, and the
Hugging Face entry point names the extra to install instead of failing deep inside."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The modules the extras of pyproject.toml (hf, demo) and the dev tools bring, except torch's own
# dependencies (sympy): hidden, they cannot be imported, as in an environment of torch alone.
OPTIONAL = [
    "transformers",
    "accelerate",
    "tokenizers",
    "datasets",
    "trl",
    "numpy",
    "matplotlib",
    "mathematics_dataset",
    "absl",
    "tqdm",
    "triton",
    "deepspeed",
]


def _run_without_optional_modules(code: str) -> subprocess.CompletedProcess[str]:
    hide = f"import sys\nfor name in {OPTIONAL!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", hide + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_core_works_with_torch_alone() -> None:
    result = _run_without_optional_modules(
        """
        import torch
        import numtok
        from numtok import NumberVocab, cross_entropy_with_ntl, find_number_spans
        from numtok import number_level_loss, number_token_loss, parse_number

        vocab = NumberVocab.from_values(
            {i: str(i) for i in range(10)}, vocab_size=12, decimal_point_ids=[10]
        )
        logits = torch.randn(2, 4, 12, requires_grad=True)
        labels = torch.tensor([[1, 10, 5, 11], [7, 7, 11, 3]])
        loss = number_token_loss(logits, labels, vocab) + number_level_loss(logits, labels, vocab)
        loss = loss + cross_entropy_with_ntl(logits, labels, vocab).loss
        loss.backward()
        assert find_number_spans(labels, vocab).values.tolist() == [1.5, 77.0, 3.0]
        assert parse_number("x = -1,234.5") == -1234.5
        print("core ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "core ok" in result.stdout


def test_the_hf_adapter_names_the_extra_to_install() -> None:
    result = _run_without_optional_modules(
        """
        from numtok import NumberVocab
        from numtok.hf import NTLossForTrainer

        vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
        try:
            NTLossForTrainer(vocab)
        except ModuleNotFoundError as error:
            print(error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "NTLossForTrainer (the Hugging Face Trainer adapter) needs transformers and accelerate, "
        "which numtok's 'hf' extra installs: pip install \".[hf]\" in a checkout of numtok"
    )


def test_importing_numtok_imports_no_optional_dependency() -> None:
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import numtok\n"
        f"print(sorted((set(sys.modules) - before) & set({OPTIONAL!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # whatever torch itself imports is not numtok's doing


def test_importing_numtok_without_numpy_prints_nothing() -> None:
    """torch without numpy warns "Failed to initialize NumPy: No module named 'numpy'" while it
    imports; ``import numtok`` (which imports torch) used to print that on a core install."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.modules['numpy'] = None\nimport numtok\n"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.slow  # a fresh interpreter that imports transformers and trains: about 10 s
def test_the_hugging_face_routes_train_without_deepspeed() -> None:
    """The ZeRO-3 gathering (numtok.hf._zero3) imports deepspeed only for a ZeRO-3 parameter."""
    code = f"""
        import sys
        sys.modules["deepspeed"] = None  # not installed
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from _hf_tiny import build_dataset, build_model, build_tokenizer, collate
        from numtok.hf import patch_model

        tokenizer = build_tokenizer()
        for cross_entropy in ("numtok", "model"):
            model = patch_model(build_model(tokenizer), tokenizer, cross_entropy=cross_entropy)
            model(**collate(build_dataset(tokenizer))).loss.backward()
        print("trained")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained"


@pytest.mark.parametrize("command", ["demo", "list"])
def test_the_command_names_itself_and_the_extra_to_install(command: str) -> None:
    """Each command names itself (numtok list named "numtok demo / numtok compare --preset")."""
    result = _run_without_optional_modules(
        f"""
        from numtok.cli import main

        main([{command!r}])
        """
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"numtok: error: numtok {command} needs numpy, matplotlib, tqdm, mathematics_dataset and "
        "absl, which numtok-compare's 'demo' extra installs: pip install \"./compare[demo]\" in a "
        "checkout of numtok"
    ]


def test_compare_names_the_extra_of_its_plot_before_it_trains(tmp_path: Path) -> None:
    """Without matplotlib, numtok compare stops before loading a model or training (it used to
    train the whole run and end in a ModuleNotFoundError while writing the plot)."""
    data = tmp_path / "task.jsonl"
    data.write_text('{"prompt": "1+1", "answer": 2}\n' * 3)
    code = f"""
        import sys
        sys.modules["matplotlib"] = None
        from numtok.cli import main

        main(["compare", "--data", {str(data)!r}, "--out", {str(tmp_path / "run")!r}])
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "numtok: error: numtok compare (the report and its plot) needs matplotlib, which "
        "numtok-compare's 'demo' extra installs: pip install \"./compare[demo]\" in a checkout "
        "of numtok"
    )
    assert not (tmp_path / "run").exists()


def test_without_the_harness_its_commands_say_in_one_line_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """numtok alone (no numtok-compare, so no entry point of the group numtok.commands): the
    harness's commands exit with status 2 and one line naming the install command; the help
    still lists them."""
    import numtok.cli as cli

    monkeypatch.setattr(cli, "entry_points", lambda **_: ())
    for command in ("compare", "demo", "repro", "list", "model"):
        assert cli.main([command, "--preset", "demo"]) == 2
        assert capsys.readouterr().err == (
            f"numtok: error: numtok {command} is a command of the experiment harness, which is "
            'not installed: pip install . "./compare[demo,pretrained]" in a checkout of numtok '
            "(the experiment harness, numtok-compare, beside the library)\n"
        )
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "{vocab,compare,demo,repro,list,model}" in capsys.readouterr().out


def test_a_harness_that_cannot_be_imported_is_one_line_naming_the_install() -> None:
    """Its entry points left behind, its package gone: one line, where it was a traceback."""
    code = (
        "import sys\nsys.modules['numtok_compare'] = None\n"
        "from numtok.cli import main\nsys.exit(main(['list']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "numtok: error: numtok list is a command of the experiment harness, which cannot be "
        "imported (No module named 'numtok_compare"
    ), line
    assert line.endswith(
        ': pip install . "./compare[demo,pretrained]" in a checkout of numtok (the experiment '
        "harness, numtok-compare, beside the library)"
    ), line


def test_the_harness_installs_its_commands_as_entry_points() -> None:
    from importlib.metadata import entry_points

    from numtok.cli import COMMANDS_GROUP, HARNESS_COMMANDS
    from numtok_compare.cli import _parser, main

    installed = {entry.name: entry.load() for entry in entry_points(group=COMMANDS_GROUP)}
    assert installed == dict.fromkeys(HARNESS_COMMANDS, main)
    (commands,) = (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == set(HARNESS_COMMANDS)


def test_the_local_executor_imports_no_ray_and_ray_is_named_where_missing(tmp_path: Path) -> None:
    """A comparison on the local executor never imports Ray (numtok-compare's ``ray`` extra);
    ``--executor ray`` without Ray stops in one line naming the extra, before any work."""
    code = f"""
        import sys
        from numtok.cli import main

        status = main(["compare", "--preset", "smoke", "--workers", "1", "--steps", "2",
                       "--train-examples", "20", "--eval-examples", "2", "--seeds", "2",
                       "--no-progress", "--cache-dir", {str(tmp_path / "cache")!r},
                       "--out", {str(tmp_path / "run")!r}])
        assert status == 0 and "ray" not in sys.modules, sorted(sys.modules)
        sys.modules["ray"] = None
        main(["compare", "--preset", "smollm2-arithmetic", "--executor", "ray", "--dry-run"])
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "numtok: error: --executor ray needs ray, which numtok-compare's 'ray' extra installs: "
        'pip install "./compare[ray]" in a checkout of numtok'
    )
