"""benchmarks/gpu.sh's ``sync`` step, a GPU acceptance test (``gpu`` marker): a training step per
way of computing the loss, every host synchronisation recorded with where it came from.

Each route runs a training step (forward, the loss, backward, ``clip_grad_norm_``, AdamW) of a
small random Llama, once to warm up and once recorded: on CUDA under
``torch.cuda.set_sync_debug_mode("warn")`` (a warning per synchronising call; one raised in
backward is replayed where ``backward()`` was called, so it is not counted as numtok's: the
strict check catches it), on CPU with ``tests/_host_syncs.py`` (the reads back and the
value-dependent shapes that would synchronise a GPU, at PyTorch's dispatcher). Then, on CUDA,
numtok's loss and backward alone under ``set_sync_debug_mode("error")`` for the routes that must
not synchronise: ``impl="triton"`` and ``capturable=True``. The routes: each entry point by
default and with ``capturable=True`` (given logits, logits-free, NTL beside ``F.cross_entropy``
and from the number head, ``patch_model``), and the Triton kernels with and without
``num_items_in_batch``. Its rows and report section are written after every route
(``gpu_section``: into gpu.sh's report where it runs).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from _gpu import Section
from _host_syncs import HostSyncs

pytestmark = pytest.mark.gpu


def _site(stack: traceback.StackSummary) -> tuple[str, bool]:
    """Where a synchronising call came from: the innermost frame outside torch, the warnings
    machinery and this file (else the innermost torch frame), and whether numtok is on the
    stack."""
    package = str(Path(importlib.import_module("numtok").__file__ or "").parent) + os.sep
    numtok = any(frame.filename.startswith(package) for frame in stack)
    frames = [
        frame
        for frame in reversed(stack)
        if not frame.filename.endswith(("warnings.py", "contextlib.py"))
    ]
    outside = [
        frame
        for frame in frames
        if f"{os.sep}torch{os.sep}" not in frame.filename and frame.filename != __file__
    ]
    if not (outside or frames):
        return "(unknown)", numtok
    frame = (outside or frames)[0]
    parts = Path(frame.filename).parts
    where = "/".join(parts[-2:]) if len(parts) > 1 else frame.filename
    return f"{where}:{frame.lineno} ({frame.name})", numtok


@contextlib.contextmanager
def recorded_syncs(on_cuda: bool) -> Iterator[list[tuple[str, bool]]]:
    """``(where, in numtok)`` of every synchronising call inside: on CUDA under
    ``set_sync_debug_mode("warn")``, on CPU counted by ``tests/_host_syncs.py``."""
    import torch

    sites: list[tuple[str, bool]] = []
    if not on_cuda:
        with HostSyncs() as counted:
            yield sites
        sites += [(f"{s.where} ({s.operation})", s.in_numtok) for s in counted.sites]
        return
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous = warnings.showwarning

        def record(message: Any, *rest: Any, **kwargs: Any) -> None:
            if "synchroniz" in str(message):
                sites.append(_site(traceback.extract_stack()[:-1]))
            else:
                previous(message, *rest, **kwargs)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")


class Route(NamedTuple):
    """A way of computing the loss of a step: ``loss(model)``, the model it trains, and the
    loss alone on detached inputs for the strict check (None: not judged)."""

    model: Any
    loss: Callable[[Any], Any]
    strict: Callable[[Any], Callable[[], Any]] | None


def test_no_host_synchronisation_in_a_training_step(
    gpu_device: Any, gpu_quick: bool, gpu_section: Section
) -> None:
    import torch
    import torch.nn.functional as F

    # benchmarks/gpu_common.py: on the path where gpu.sh runs this test (-p gpu_pytest_rows)
    from gpu_common import NTL_WEIGHT, short, synchronize
    from transformers import LlamaConfig, LlamaForCausalLM

    from numtok import (
        NumberVocab,
        cross_entropy_with_ntl,
        linear_cross_entropy_with_ntl,
        linear_number_token_loss,
        number_token_loss,
    )
    from numtok.hf import patch_model

    device = gpu_device
    on_cuda = device.type == "cuda"
    # (quick: 64 positions, for the dry run's interpreter, which runs a program per row)
    vocab_size, batch, sequence = (4096, 2, 32) if gpu_quick else (32_768, 4, 512)
    vocab = NumberVocab.from_values({100 + d: str(d) for d in range(10)}, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    dtype = torch.bfloat16 if on_cuda else torch.float32

    def model_() -> Any:
        torch.manual_seed(0)
        with torch.device(device):
            return LlamaForCausalLM(config).to(dtype)

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(110, vocab_size, (batch, sequence), generator=generator)
    digits = 100 + torch.randint(10, ids.shape, generator=generator)
    ids = torch.where(torch.rand(ids.shape, generator=generator) < 0.1, digits, ids).to(device)
    count = torch.tensor(ids.numel() - ids.shape[0], device=device)  # shifted: one less a row
    flat_targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1).reshape(-1)

    def given_logits(logits: Any, **settings: Any) -> Any:
        return cross_entropy_with_ntl(logits, ids, vocab, shift=True, **settings).loss

    def beside(logits: Any, **settings: Any) -> Any:  # F.cross_entropy + number_token_loss
        ce = F.cross_entropy(logits.reshape(-1, vocab_size).float(), flat_targets)
        ntl = number_token_loss(logits, ids, vocab, shift=True, **settings)
        return ce + NTL_WEIGHT * ntl

    def logits_free(hidden: Any, weight: Any, **settings: Any) -> Any:
        return linear_cross_entropy_with_ntl(
            hidden, weight, ids, vocab, shift=True, **settings
        ).loss

    def head(hidden: Any, weight: Any, **settings: Any) -> Any:  # F.cross_entropy + number head
        ce = F.cross_entropy((hidden @ weight.T).reshape(-1, vocab_size).float(), flat_targets)
        ntl = linear_number_token_loss(hidden, weight, ids, vocab, shift=True, **settings)
        return ce + NTL_WEIGHT * ntl

    def of_logits(loss: Callable[..., Any], **settings: Any) -> Callable[[Any], Any]:
        return lambda m: loss(m(input_ids=ids).logits, **settings)

    def of_hidden(loss: Callable[..., Any], **settings: Any) -> Callable[[Any], Any]:
        return lambda m: loss(
            m.model(input_ids=ids).last_hidden_state, m.lm_head.weight, **settings
        )

    def alone(loss: Callable[..., Any], route: str, **settings: Any) -> Callable[[Any], Any]:
        """numtok's loss and its backward alone, on leaves computed before (the strict check)."""

        def prepared(m: Any) -> Callable[[], Any]:
            with torch.no_grad():
                hidden = m.model(input_ids=ids).last_hidden_state
            hidden = hidden.detach().requires_grad_()
            weight = m.lm_head.weight.detach().clone().requires_grad_()
            if route == "logits":
                logits = (hidden @ weight.T).detach().requires_grad_()
                return lambda: loss(logits, **settings).backward()
            return lambda: loss(hidden, weight, **settings).backward()

        return prepared

    model = model_()
    patched = {
        c: patch_model(model_(), vocab, ntl_weight=NTL_WEIGHT, capturable=c) for c in (False, True)
    }
    triton = {"impl": "triton", "num_items_in_batch": count}
    capturable = {"capturable": True, "num_items_in_batch": count}
    routes = {
        'logits, impl="triton"': Route(
            model, of_logits(given_logits, impl="triton"), alone(given_logits, "logits", **triton)
        ),
        'logits-free, impl="triton"': Route(
            model, of_hidden(logits_free, impl="triton"), alone(logits_free, "free", **triton)
        ),
        'logits, impl="triton", num_items_in_batch': Route(
            model, of_logits(given_logits, **triton), None
        ),
    }
    for name, loss, route in [
        ("cross_entropy_with_ntl", given_logits, "logits"),
        ("linear_cross_entropy_with_ntl", logits_free, "free"),
        ("F.cross_entropy + number_token_loss", beside, "logits"),
        ("F.cross_entropy + linear_number_token_loss", head, "free"),
    ]:
        of = of_logits if route == "logits" else of_hidden
        routes[name] = Route(model, of(loss), None)
        routes[f"{name}, capturable"] = Route(
            model, of(loss, **capturable), alone(loss, route, **capturable)
        )
    routes["patch_model (defaults)"] = Route(
        patched[False], lambda m: m(input_ids=ids, labels=ids).loss, None
    )
    routes["patch_model, capturable"] = Route(
        patched[True], lambda m: m(input_ids=ids, labels=ids, num_items_in_batch=count).loss, None
    )
    optimizers = {
        id(m): torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (model, *patched.values())
    }

    def step(m: Any, loss_of: Callable[[Any], Any]) -> Any:
        loss = loss_of(m)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        optimizers[id(m)].step()
        optimizers[id(m)].zero_grad(set_to_none=True)
        return loss

    rows, ok = [], True
    counter = 'set_sync_debug_mode("warn")' if on_cuda else "tests/_host_syncs.py (CPU)"
    lines = [
        f"A training step (forward, loss, backward, `clip_grad_norm_`, AdamW) of a random Llama "
        f"(2 layers, hidden 256, V = {vocab_size:,}, {dtype}, batch {batch} × {sequence}) on "
        f"{device}, after one warm-up step, its synchronising calls recorded by {counter} with "
        "where they come from; then, on CUDA, numtok's loss and backward alone under "
        '`"error"` for the Triton and the capturable routes.',
        "",
        "| route | loss | syncs in the step | of them in numtok | where | numtok alone under "
        '"error" | s (two steps) |',
        "|---|---|---|---|---|---|---|",
    ]
    for name, route in routes.items():
        row: dict[str, Any] = {"route": name}
        began = time.perf_counter()
        try:
            step(route.model, route.loss)  # warm-up: constants built, kernels compiled
            synchronize(device)
            with recorded_syncs(on_cuda) as sites:
                loss = step(route.model, route.loss)
            row["loss"] = float(loss.detach())
        except Exception as error:
            row["error"] = short(error, 600)
            traceback.print_exc()
            lines.append(f"| {name} | **failed**: {row['error']} | | | | | |")
            rows.append(row)
            ok = False
            gpu_section(rows, lines, finished=False)
            continue
        row["seconds"] = round(time.perf_counter() - began, 2)
        row["syncs"] = len(sites)
        row["numtok_syncs"] = sum(1 for _, in_numtok in sites if in_numtok)
        row["sites"] = dict(Counter(site for site, _ in sites))
        strict_cell = "–"
        if route.strict is not None and on_cuda:
            try:
                run = route.strict(route.model)
                synchronize(device)
                torch.cuda.set_sync_debug_mode("error")
                try:
                    run()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                row["strict"] = strict_cell = "passed"
            except Exception as error:
                row["strict"] = short(error, 600)
                site = _site(traceback.extract_tb(error.__traceback__))[0]
                strict_cell = f"**raised** at {site}: {row['strict']}"
                ok = False
        elif route.strict is not None:
            strict_cell = "(CUDA only)"
        # Judged: numtok's own syncs on the Triton routes (on CUDA; the interpreter's are its
        # own) and on the capturable ones (everywhere).
        must_not = ("capturable" in name) or ("triton" in name and on_cuda)
        if must_not and row["numtok_syncs"]:
            ok = False
        where = "; ".join(f"{site} ×{n}" for site, n in row["sites"].items()) or "–"
        lines.append(
            f"| {name} | {row['loss']:.4f} | {row['syncs']} | {row['numtok_syncs']} | {where} | "
            f"{strict_cell} | {row['seconds']:.1f} |"
        )
        rows.append(row)
        print(f"sync: {name}: {row['seconds']:.1f} s", file=sys.stderr, flush=True)
        gpu_section(rows, lines, finished=False)
    lines += [
        "",
        f"**{'passed' if ok else 'FAILED'}** (no synchronisation from numtok on the capturable "
        "routes, nor on the Triton routes on CUDA, in the step and alone; the other routes' "
        "synchronisations are listed, not judged).",
    ]
    gpu_section(rows, lines, finished=True)
    assert ok, "\n".join(lines)
