"""examples/lightning_ntl.py trains with NTL in PyTorch Lightning (the real ``lightning``
package, in the dev extra): its two LightningModules, the model patched by ``patch_model`` and
the loss computed by ``cross_entropy_with_ntl`` in ``training_step``, run as shipped."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

# Lightning 2.6 builds torch's LeafSpec, which torch 2.13 deprecates (a FutureWarning).
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lightning_ntl.py"


def _run(
    module: str, steps: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[float, float, float]]:
    monkeypatch.setattr("sys.argv", ["lightning_ntl.py", "--module", module, "--steps", str(steps)])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == [f"step {i}" for i in range(steps)]
    return [
        tuple(float(line.split(f"{name} ")[1].split()[0]) for name in ("loss", "CE", "NTL"))  # type: ignore[misc]
        for line in lines
    ]


def test_both_lightning_modules_train_with_ntl_and_agree(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    patched = _run("patched", 3, capsys, monkeypatch)
    fused = _run("fused", 3, capsys, monkeypatch)
    for history in (patched, fused):
        losses = [loss for loss, _, _ in history]
        assert losses[0] > losses[1] > losses[2]  # it trains
        for loss, ce, ntl in history:
            assert ntl > 0  # the number positions ("12", "42", ...) carry an NTL term
            assert loss == pytest.approx(ce + 0.3 * ntl, abs=2e-4)  # as logged, 4 decimals
    # The same model, data and seed: the patched forward's loss (from the hidden states) and
    # cross_entropy_with_ntl of the logits are the same loss, step after step.
    for (a, b, c), (x, y, z) in zip(patched, fused, strict=True):
        assert (a, b, c) == pytest.approx((x, y, z), abs=2e-4)
