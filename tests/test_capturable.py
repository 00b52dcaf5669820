"""``capturable=True``: every entry point computes the same values and gradients without reading
anything back from the device (counted on CPU by tests/_host_syncs.py; on CUDA with
``torch.cuda.set_sync_debug_mode("error")`` and a CUDA graph, in benchmarks/gpu.sh), and compiles
into one graph with ``torch.compile(backend="inductor", fullgraph=True)``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

import numtok.losses.fused
from _host_syncs import HostSyncs
from numtok import (
    CrossEntropyWithNTL,
    LinearCrossEntropyWithNTL,
    LinearNumberTokenLoss,
    NumberTokenLoss,
    cross_entropy_with_ntl,
    linear_cross_entropy_with_ntl,
    linear_number_token_loss,
    number_token_loss,
)

from cases import make_labels, make_vocab

VOCAB = make_vocab("chunks")
HIDDEN_SIZE = 6


class Inputs(NamedTuple):
    logits: torch.Tensor  # (3, 5, V), a leaf
    hidden: torch.Tensor  # (3, 5, H), a leaf
    weight: torch.Tensor  # (V, H), a leaf
    bias: torch.Tensor  # (V,), a leaf
    lse: torch.Tensor  # (3, 5), the log-sum-exp of hidden @ weight.T + bias, a leaf
    labels: torch.Tensor  # (3, 5)
    weights: torch.Tensor  # (3, 5), loss weights

    def leaves(self) -> list[torch.Tensor]:
        return [self.logits, self.hidden, self.weight, self.bias, self.lse]


def make_inputs(device: torch.device, dtype: torch.dtype = torch.float64) -> Inputs:
    generator = torch.Generator().manual_seed(3)
    shape = (3, 5)
    logits = 2 * torch.randn(*shape, VOCAB.vocab_size, generator=generator, dtype=dtype)
    hidden = torch.randn(*shape, HIDDEN_SIZE, generator=generator, dtype=dtype)
    weight = torch.randn(VOCAB.vocab_size, HIDDEN_SIZE, generator=generator, dtype=dtype)
    bias = torch.randn(VOCAB.vocab_size, generator=generator, dtype=dtype)
    lse = torch.logsumexp(hidden @ weight.T + bias, dim=-1)
    labels = make_labels("chunks", shape, generator)
    weights = torch.rand(shape, generator=generator, dtype=dtype)
    leaves = [t.to(device).requires_grad_() for t in (logits, hidden, weight, bias, lse)]
    return Inputs(*leaves, labels.to(device), weights.to(device))


#: The entry points, each a function or a module of given logits or hidden states.
ENTRIES = [
    "number_token_loss",
    "NumberTokenLoss",
    "cross_entropy_with_ntl",
    "CrossEntropyWithNTL",
    "linear_cross_entropy_with_ntl",
    "LinearCrossEntropyWithNTL",
    "linear_number_token_loss",
    "LinearNumberTokenLoss",
]
#: The modules among them, and their call on the inputs.
MODULES: dict[str, tuple[type[torch.nn.Module], Callable[..., Any]]] = {
    "NumberTokenLoss": (NumberTokenLoss, lambda m, x, **g: m(x.logits, x.labels, **g)),
    "CrossEntropyWithNTL": (CrossEntropyWithNTL, lambda m, x, **g: m(x.logits, x.labels, **g).loss),
    "LinearCrossEntropyWithNTL": (
        LinearCrossEntropyWithNTL,
        lambda m, x, **g: m(x.hidden, x.weight, x.labels, bias=x.bias, **g).loss,
    ),
    "LinearNumberTokenLoss": (
        LinearNumberTokenLoss,
        lambda m, x, **g: m(x.hidden, x.weight, x.labels, bias=x.bias, lse=x.lse, **g),
    ),
}
_FORWARD = ("loss_weights", "num_items_in_batch")  # what a module's forward takes


@functools.cache
def _module(module_type: type[torch.nn.Module], device: torch.device, **settings: Any) -> Any:
    """The module of ``settings``, built once per device: its tables are copied to the device
    when it is built, which a step under ``set_sync_debug_mode`` or in a CUDA graph must not do."""
    return module_type(VOCAB, **settings).to(device)


def loss_function(entry: str, device: torch.device, **s: Any) -> Callable[[Inputs], torch.Tensor]:
    """``entry``'s loss of the inputs with the settings ``s`` (a scalar, or per position for
    "none"; CE + NTL's ``.loss``); a module is built here, so that a compiled loss is its call."""
    given = {k: v for k, v in s.items() if k in _FORWARD}
    if entry in MODULES:
        kind, call = MODULES[entry]
        built = {k: v for k, v in s.items() if k not in _FORWARD}
        if entry == "LinearCrossEntropyWithNTL":
            built["chunk_size"] = 4
        module = _module(kind, device, **built)
        return lambda x: call(module, x, **given)
    return {
        "number_token_loss": lambda x: number_token_loss(x.logits, x.labels, VOCAB, **s),
        "cross_entropy_with_ntl": lambda x: (
            cross_entropy_with_ntl(x.logits, x.labels, VOCAB, **s).loss
        ),
        "linear_cross_entropy_with_ntl": lambda x: (
            linear_cross_entropy_with_ntl(
                x.hidden, x.weight, x.labels, VOCAB, bias=x.bias, chunk_size=4, **s
            ).loss
        ),
        "linear_number_token_loss": lambda x: linear_number_token_loss(
            x.hidden, x.weight, x.labels, VOCAB, bias=x.bias, lse=x.lse, **s
        ),
    }[entry]


@pytest.fixture
def beside_cross_entropy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``impl="auto"`` takes the route it takes off the CPU (CUDA's default): F.cross_entropy with
    NTL beside it, read from the logits' number columns."""
    monkeypatch.setattr(
        numtok.losses.fused, "unfused_by_default", lambda impl, device: impl == "auto"
    )


def _settings(inputs: Inputs, name: str) -> dict[str, Any]:
    weights = inputs.weights
    count = torch.tensor(11, device=inputs.labels.device)
    return {
        "defaults": {},
        "reweigh, shift, weights": {"reweigh": True, "shift": True, "loss_weights": weights},
        "sum, num_items int": {"reduction": "sum", "num_items_in_batch": 7, "kind": "mae"},
        "none, mse": {"reduction": "none", "kind": "mse", "loss_weights": weights},
        "dist2, num_items tensor": {"kind": "dist2", "shift": True, "num_items_in_batch": count},
        "smmd, weights": {"kind": "smmd", "loss_weights": weights},
    }[name]


#: (entry point, route): each entry point on the route its device takes, and the two of CE + NTL
#: from given logits also on CUDA's default route, F.cross_entropy with NTL beside.
ROUTES = [(entry, "default") for entry in ENTRIES] + [
    ("cross_entropy_with_ntl", "beside F.cross_entropy"),
    ("CrossEntropyWithNTL", "beside F.cross_entropy"),
]

SETTINGS = [
    "defaults",
    "reweigh, shift, weights",
    "sum, num_items int",
    "none, mse",
    "dist2, num_items tensor",
    "smmd, weights",
]


def _value_and_gradients(
    entry: str, inputs: Inputs, **settings: Any
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = loss_function(entry, inputs.labels.device, **settings)(inputs)
    return _gradients(loss, inputs)


def _gradients(loss: torch.Tensor, inputs: Inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and its gradients for a fixed upstream gradient (zeros where unused)."""
    upstream = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=loss.device)
    gradients = torch.autograd.grad(
        loss, inputs.leaves(), upstream.reshape(loss.shape), allow_unused=True
    )
    zeros = [torch.zeros_like(t) for t in inputs.leaves()]
    return loss.detach(), [z if g is None else g for g, z in zip(gradients, zeros, strict=True)]


def _on_route(route: str, request: pytest.FixtureRequest) -> None:
    """Takes ``route`` for the test."""
    if route != "default":
        request.getfixturevalue("beside_cross_entropy")


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize(("entry", "route"), ROUTES)
def test_the_same_values_and_gradients(
    entry: str, route: str, setting: str, device: torch.device, request: pytest.FixtureRequest
) -> None:
    """capturable=True gives the values and gradients (float64, to 1e-12) of the default
    path, for every entry point and a spread of settings, on the route the device takes and on
    the one CUDA takes by default (F.cross_entropy with NTL beside it)."""
    _on_route(route, request)
    inputs = make_inputs(device)
    settings = _settings(inputs, setting)
    expected = _value_and_gradients(entry, inputs, **settings)
    got = _value_and_gradients(entry, inputs, capturable=True, **settings)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("entry", "route"), ROUTES)
def test_no_host_synchronisation(entry: str, route: str, request: pytest.FixtureRequest) -> None:
    """One training step of each entry point (forward and backward, loss weights, reweigh,
    shift) reads nothing back from the device with capturable=True: no ``.item()``/``bool()``,
    ``nonzero`` or mask indexing (the default path has them: the label and weight checks, the
    gather of the number positions). Counted on CPU tensors at the dispatcher
    (tests/_host_syncs.py); on CUDA ``benchmarks/gpu.sh`` counts with
    ``set_sync_debug_mode``."""
    _on_route(route, request)
    inputs = make_inputs(torch.device("cpu"), torch.float32)
    settings = {"reweigh": True, "shift": True, "loss_weights": inputs.weights}
    counts = {}
    for capturable in (False, True):
        _value_and_gradients(entry, inputs, capturable=capturable, **settings)  # warm-up
        with HostSyncs() as syncs:
            _value_and_gradients(entry, inputs, capturable=capturable, **settings)
        counts[capturable] = syncs.sites
    assert counts[False], "the default path was expected to synchronise (its checks do)"
    assert counts[True] == [], counts[True]


@pytest.mark.parametrize("entry", ["number_token_loss", "cross_entropy_with_ntl"])
def test_masked_logits_at_the_masked_rows_reach_no_gradient(
    entry: str, request: pytest.FixtureRequest
) -> None:
    """Rows that a capturable loss computes and masks out must not leak a non-finite value into
    the gradient: text rows whose number logits are all -inf (and, with reweigh, whose every
    logit but one is), beside the default path's values."""
    request.getfixturevalue("beside_cross_entropy")
    inputs = make_inputs(torch.device("cpu"))
    logits = inputs.logits.detach().clone()
    text = ~torch.isin(inputs.labels, VOCAB.ids) & (inputs.labels != -100)
    logits[text] = -torch.inf
    logits[text, inputs.labels[text]] = 0.0  # the label's logit alone is finite
    inputs = inputs._replace(logits=logits.requires_grad_())
    settings = {"reweigh": True, "loss_weights": inputs.weights}
    value, gradients = _value_and_gradients(entry, inputs, capturable=True, **settings)
    assert bool(value.isfinite().all()) and all(bool(g.isfinite().all()) for g in gradients)
    torch.testing.assert_close(
        (value, gradients), _value_and_gradients(entry, inputs, **settings), rtol=1e-12, atol=0
    )


def test_bad_values_are_asserted_on_the_device() -> None:
    """Label ids out of range and negative loss weights fail a device-side assert instead of a
    check that reads back (on CPU ``torch._assert_async`` raises at once, a RuntimeError with
    the message; on a GPU a device-side assert surfaces at the next synchronisation)."""
    inputs = make_inputs(torch.device("cpu"))
    cpu = torch.device("cpu")
    for entry in ENTRIES:
        bad = inputs._replace(labels=inputs.labels.clone().fill_(VOCAB.vocab_size))
        with pytest.raises(RuntimeError, match=r"labels must be token ids in \[0, 59\)"):
            loss_function(entry, cpu, capturable=True)(bad)
        with pytest.raises(RuntimeError, match="loss_weights must be >= 0"):
            loss_function(entry, cpu, capturable=True, loss_weights=-inputs.weights)(inputs)


def test_num_items_on_another_device_and_the_number_level_are_refused() -> None:
    """A capturable loss takes ``num_items_in_batch`` as an int or a tensor on the labels'
    device (a CPU tensor beside GPU labels would be copied, or kept in a CUDA graph with its
    captured value; the meta device stands for the other one here), and ``kind="number"`` has
    no capturable path (it reads the count of whole numbers back)."""
    inputs = make_inputs(torch.device("cpu"))
    elsewhere = torch.tensor(5, device="meta")
    cpu = torch.device("cpu")
    for entry in ENTRIES:
        with pytest.raises(ValueError, match=r"on the labels' device \(cpu\) with capturable=Tr"):
            loss_function(entry, cpu, capturable=True, num_items_in_batch=elsewhere)(inputs)
    message = "capturable=True is not available with kind='number'"
    for entry in ("number_token_loss", "NumberTokenLoss", "linear_number_token_loss"):
        with pytest.raises(ValueError, match=message):
            loss_function(entry, cpu, capturable=True, kind="number")(inputs)
    with pytest.raises(TypeError, match="capturable must be a bool, got 1"):
        number_token_loss(inputs.logits, inputs.labels, VOCAB, capturable=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------ torch.compile, inductor


@pytest.mark.slow  # inductor compiles C++ for forward and backward: 10-30 s an entry point
@pytest.mark.parametrize(("entry", "route"), ROUTES)
def test_one_graph_under_torch_compile_with_inductor(
    entry: str, route: str, request: pytest.FixtureRequest
) -> None:
    """``torch.compile(backend="inductor", fullgraph=True)`` compiles each entry point's
    capturable loss into one graph, forward and backward, with the eager values and gradients
    (float32, on CPU). The default path cannot be one graph where it gathers the number
    positions (``nonzero``, a shape that depends on the labels): fullgraph raises there."""
    _on_route(route, request)
    inputs = make_inputs(torch.device("cpu"), torch.float32)
    settings = {"reweigh": True, "shift": True, "loss_weights": inputs.weights}
    cpu = torch.device("cpu")
    torch._dynamo.reset()
    loss = loss_function(entry, cpu, capturable=True, **settings)
    got = _gradients(torch.compile(loss, backend="inductor", fullgraph=True)(inputs), inputs)
    expected = _value_and_gradients(entry, inputs, **settings)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    gathers = route != "default" or entry in (
        "number_token_loss",
        "NumberTokenLoss",
        "linear_number_token_loss",
        "LinearNumberTokenLoss",
    )
    if gathers:
        torch._dynamo.reset()
        default = torch.compile(loss_function(entry, cpu, **settings), fullgraph=True)
        # (a graph break, or a guard on the count of number positions that cannot be met)
        with pytest.raises((torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)):
            default(inputs)


# ------------------------------------------------------------------ CUDA (benchmarks/gpu.sh)


def _cuda_only(device: torch.device) -> None:
    if device.type != "cuda":
        pytest.skip("set_sync_debug_mode and CUDA graphs exist on CUDA only; gpu.sh runs this")


@pytest.mark.parametrize(("entry", "route"), [r for r in ROUTES if r[1] == "default"])
def test_no_synchronisation_on_cuda(entry: str, route: str, device: torch.device) -> None:
    """On CUDA (whose default for given logits is F.cross_entropy with NTL beside it), a
    capturable loss's forward and backward run under ``set_sync_debug_mode("error")``, after a
    first call (the vocabulary's tables, cuBLAS's float32 output tried once)."""
    _cuda_only(device)
    inputs = make_inputs(device, torch.bfloat16)
    settings = {"reweigh": True, "shift": True, "loss_weights": inputs.weights.float()}
    settings["num_items_in_batch"] = torch.tensor(9, device=device)
    _value_and_gradients(entry, inputs, capturable=True, **settings)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _value_and_gradients(entry, inputs, capturable=True, **settings)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("entry", "route"), [r for r in ROUTES if r[1] == "default"])
def test_a_cuda_graph_replays_the_step(entry: str, route: str, device: torch.device) -> None:
    """A capturable loss's forward and backward captured in a CUDA graph and replayed on new
    labels give the eager values and gradients of those labels."""
    _cuda_only(device)
    inputs = make_inputs(device, torch.float32)
    settings = {"reweigh": True, "shift": True}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graph asks
        for _ in range(2):
            _value_and_gradients(entry, inputs, capturable=True, **settings)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _value_and_gradients(entry, inputs, capturable=True, **settings)
    new_labels = make_labels("chunks", (3, 5), torch.Generator().manual_seed(8)).to(device)
    inputs.labels.copy_(new_labels)
    graph.replay()
    expected = _value_and_gradients(entry, inputs, **settings)
    torch.testing.assert_close(captured, expected, rtol=1e-5, atol=1e-6)
