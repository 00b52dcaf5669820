"""The one runner of the benchmarks: a case's implementations of a loss, each checked against its
reference, timed in interleaved rounds by one clock, and its peak memory probed in a fresh
process. A bench script declares its cases and implementations and writes its rows; the rest is
here.

* **Check**: every implementation runs once (this is also the warm-up and, for a compiled one, the
  compilation) and its value and every gradient are compared with its reference's on the same
  inputs: :func:`relative_error`, ``‖value − reference‖ / ‖reference‖`` in float64, the largest
  over the value and the gradients, must not exceed the tolerance. A reference or a required
  implementation that raises stops the run; any other is left out, with its error.
* **Time**: ``rounds`` rounds, the implementations interleaved and the order rotated each round.
  One step is the training forward (autograd recording) and ``backward()`` into fresh ``.grad``;
  :class:`Clock` reads CUDA events on a GPU and ``time.perf_counter`` elsewhere (after a
  synchronisation), and the CPU time (user + system) of the step is read beside it. Medians with
  p20/p80 (:func:`bench_common.quantiles`); every ratio is of medians in the same run.
* **Peak memory**: on CPU, in a fresh process (``python benchmarks/runner.py MODULE SPEC
  THREADS`` calls ``MODULE.probe_target(SPEC)``): a small warm-up step initialises thread pools
  and caches, VmHWM is reset to VmRSS by writing ``5`` to ``/proc/self/clear_refs``, one step
  runs, and the rise of VmHWM is its peak. On CUDA, in process: ``max_memory_allocated`` over one
  step above the memory allocated before it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from bench_common import proc_status, quantiles, reset_peak_memory

Inputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One way of computing a case's loss from its inputs."""

    name: str  # unique within a case
    loss: Callable[[Inputs], torch.Tensor]
    reference: str | None = None  # the implementation whose value and gradients it must match
    timed: bool = True  # False: a reference for the check only
    required: bool = False  # a failure stops the run (the baseline; references always are)
    consumes: tuple[str, ...] = ()  # inputs it overwrites: each call gets copies, made untimed
    anchor: bool = False  # a comparison point: every row gets its ratio to this one
    fields: Mapping[str, Any] = field(default_factory=dict)  # what the script's rows say of it


@dataclass
class Samples:
    """Seconds of one implementation's timed steps."""

    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def full(self) -> list[float]:
        return [f + b for f, b in zip(self.forward, self.backward, strict=True)]

    def median_ms(self, mode: str = "full") -> float:
        return quantiles(getattr(self, mode))[1]


@dataclass
class Measured:
    """What :func:`run` measured of one case."""

    errors: dict[str, float]  # the check's relative error of each implementation that ran
    failures: dict[str, str]  # the implementations left out, and why
    peaks: dict[str, int]  # extra peak bytes of one step, where measured
    samples: dict[int, dict[str, Samples]]  # per thread count, per timed implementation
    anchors: list[str]  # the anchors that ran

    def ratios(self, threads: int, name: str, mode: str = "full") -> dict[str, float]:
        """``name``'s median over each anchor's, at ``threads``."""
        by_name = self.samples[threads]
        return {
            anchor: round(by_name[name].median_ms(mode) / by_name[anchor].median_ms(mode), 4)
            for anchor in self.anchors
            if anchor in by_name
        }


def leaves(inputs: Inputs) -> list[torch.Tensor]:
    return [tensor for tensor in inputs.values() if tensor.requires_grad]


def fresh(implementation: Implementation, inputs: Inputs) -> Inputs:
    """The inputs of one call: copies of those the implementation overwrites."""
    if not implementation.consumes:
        return inputs
    copies = {
        name: inputs[name].detach().clone().requires_grad_(inputs[name].requires_grad)
        for name in implementation.consumes
    }
    return {**inputs, **copies}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_of(inputs: Inputs) -> torch.device:
    return next(iter(inputs.values())).device


class Clock:
    """Seconds between marks: CUDA events on a CUDA device (read once, after the last mark; the
    stream is synchronised at the start), ``time.perf_counter`` elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        synchronize(device)
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds from each mark to the next (waits for the last CUDA event)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(self.marks)]
        return [b - a for a, b in itertools.pairwise(self.marks)]


def backward(loss: torch.Tensor, upstream: float) -> None:
    """``loss.backward()``, with ``upstream`` as the gradient flowing in when it is not 1."""
    if upstream == 1:
        loss.backward()
    else:
        loss.backward(torch.full_like(loss, upstream))


def step(
    implementation: Implementation, inputs: Inputs, upstream: float = 1.0
) -> tuple[float, float, float, torch.Tensor]:
    """One training step: (forward, backward) seconds, the CPU seconds of the whole step, and the
    loss. Gradients land in ``.grad`` (cleared first)."""
    for leaf in leaves(inputs):
        leaf.grad = None
    device = device_of(inputs)
    cpu_start = time.process_time()
    clock = Clock(device)
    loss = implementation.loss(inputs)
    if not clock.cuda:
        synchronize(device)
    clock.mark()
    backward(loss, upstream)
    if not clock.cuda:
        synchronize(device)
    clock.mark()
    forward_seconds, backward_seconds = clock.intervals()
    return forward_seconds, backward_seconds, time.process_time() - cpu_start, loss.detach()


@dataclass
class Residual:
    """The one error formula, ``‖value − reference‖ / ‖reference‖`` in float64 (:attr:`relative`),
    over one pair of tensors or accumulated over parts of them (:meth:`add`: chunks of rows, each
    summed over chunks of 2^22 entries, so that no full-size float64 temporary is made)."""

    difference: float = 0.0  # ‖value − reference‖² so far
    total: float = 0.0  # ‖reference‖² so far

    def add(self, value: torch.Tensor, reference: torch.Tensor) -> Residual:
        flat_value, flat_reference = value.reshape(-1), reference.reshape(-1)
        for start in range(0, flat_value.numel(), 1 << 22):
            a = flat_value[start : start + (1 << 22)].double()
            b = flat_reference[start : start + (1 << 22)].double()
            self.difference += float((a - b).square().sum())
            self.total += float(b.square().sum())
        return self

    @property
    def relative(self) -> float:
        return (self.difference / max(self.total, 1e-300)) ** 0.5


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """``‖value − reference‖ / ‖reference‖`` in float64 (:class:`Residual`); of two scalars,
    ``|value − reference| / |reference|``."""
    return Residual().add(value, reference).relative


def check(
    implementations: Sequence[Implementation],
    inputs: Inputs,
    tolerance: float,
    upstream: float = 1.0,
) -> tuple[dict[str, float], dict[str, str]]:
    """Run each implementation once, its references first, and compare its value and gradients
    with its reference's (:func:`relative_error`, the largest of them; 0 for a reference itself).
    Raises past ``tolerance`` or when a reference or a required implementation fails; returns
    the errors and, for the others that could not run here (a library, a device), the error."""
    referenced = {i.reference for i in implementations if i.reference is not None}
    first = sorted(implementations, key=lambda i: i.name not in referenced)
    results: dict[str, list[torch.Tensor]] = {}
    errors: dict[str, float] = {}
    failures: dict[str, str] = {}
    for implementation in first:
        call = fresh(implementation, inputs)
        try:
            loss = step(implementation, call, upstream)[3]
        except Exception as error:
            if implementation.required or implementation.name in referenced:
                raise
            failures[implementation.name] = f"{type(error).__name__}: {error}"[:300]
            print(f"{implementation.name} left out: {error!r}"[:500], file=sys.stderr)
            continue
        grads = [leaf.grad for leaf in leaves(call)]
        assert all(grad is not None for grad in grads), implementation.name
        outputs = [loss.float(), *grads]  # type: ignore[list-item]
        if implementation.name in referenced:
            results[implementation.name] = outputs
        if implementation.reference is None:
            errors[implementation.name] = 0.0
            continue
        expected = results[implementation.reference]
        error = max(relative_error(a, e) for a, e in zip(outputs, expected, strict=True))
        if not error <= tolerance:
            raise AssertionError(
                f"{implementation.name} is off its reference {implementation.reference} by "
                f"{error:.2e} relative (tolerance {tolerance:g})"
            )
        errors[implementation.name] = error
    for leaf in leaves(inputs):
        leaf.grad = None
    return errors, failures


def time_rounds(
    implementations: Sequence[Implementation],
    inputs: Inputs,
    rounds: int,
    warm_up: bool = False,
    upstream: float = 1.0,
) -> dict[str, Samples]:
    """With ``warm_up`` one untimed round, then ``rounds`` timed ones, the implementations
    interleaved and their order rotated each round; a step over a second is logged."""
    samples = {i.name: Samples() for i in implementations}
    for round_index in range(-1 if warm_up else 0, rounds):
        shift = round_index % len(implementations)
        for implementation in [*implementations[shift:], *implementations[:shift]]:
            call = fresh(implementation, inputs)
            forward, backward_seconds, cpu, _ = step(implementation, call, upstream)
            del call
            if round_index < 0:
                continue
            measured = samples[implementation.name]
            measured.forward.append(forward)
            measured.backward.append(backward_seconds)
            measured.cpu.append(cpu)
            if forward + backward_seconds > 1:
                print(
                    f"round {round_index + 1}/{rounds}: {implementation.name} "
                    f"{forward + backward_seconds:.1f} s (CPU {cpu:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    for leaf in leaves(inputs):
        leaf.grad = None
    return samples


def probe(
    implementation: Implementation, inputs: Inputs, warm: Inputs, upstream: float = 1.0
) -> int:
    """In this (fresh) process: the peak resident memory one step adds, after a step on the
    small ``warm`` inputs."""
    step(implementation, fresh(implementation, warm), upstream)
    del warm
    call = fresh(implementation, inputs)
    for leaf in leaves(call):
        leaf.grad = None
    baseline = reset_peak_memory()
    step(implementation, call, upstream)
    return proc_status("VmHWM") - baseline


def peak_on_cuda(implementation: Implementation, inputs: Inputs, upstream: float = 1.0) -> int:
    """In process on CUDA: ``max_memory_allocated`` over one step above what was allocated."""
    call = fresh(implementation, inputs)
    for leaf in leaves(call):
        leaf.grad = None
    device = device_of(inputs)
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    step(implementation, call, upstream)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    for leaf in leaves(call):
        leaf.grad = None
    return peak


def peak_in_fresh_process(module: str, spec: Mapping[str, Any], threads: int) -> int:
    """The peak of one step in a fresh process: ``module.probe_target(spec)`` gives (the
    implementation, its inputs, the warm-up inputs, the upstream gradient), :func:`probe`
    measures."""
    command = [sys.executable, __file__, module, json.dumps(spec), str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return int(output.strip().splitlines()[-1])


def run(
    implementations: Sequence[Implementation],
    inputs: Inputs,
    *,
    tolerance: float,
    rounds: int,
    threads: Sequence[int] = (),
    check_inputs: Inputs | None = None,
    warm: Inputs | None = None,
    peak: Callable[[Implementation], int] | None = None,
    upstream: float = 1.0,
    warm_up_each_thread_count: bool = True,
) -> Measured:
    """Check (on ``check_inputs``, by default the case's own), warm up on ``warm`` where the
    check ran elsewhere, measure each implementation's ``peak`` (None: not measured) and time
    ``rounds`` interleaved rounds at each thread count of ``threads`` (default: the current
    one), with an untimed round first after the first count when ``warm_up_each_thread_count``."""
    errors, failures = check(implementations, check_inputs or inputs, tolerance, upstream)
    ran = [i for i in implementations if i.name in errors and i.timed]
    if warm is not None:
        for implementation in ran:
            step(implementation, fresh(implementation, warm), upstream)
    peaks = {} if peak is None else {i.name: peak(i) for i in ran}
    counts = list(threads) or [torch.get_num_threads()]
    samples = {}
    for index, count in enumerate(counts):
        torch.set_num_threads(count)
        print(f"== {count} thread(s), {rounds} rounds", file=sys.stderr, flush=True)
        warm_up = index > 0 and warm_up_each_thread_count
        samples[count] = time_rounds(ran, inputs, rounds, warm_up, upstream)
    anchors = [i.name for i in ran if i.anchor]
    return Measured(errors, failures, peaks, samples, anchors)


if __name__ == "__main__":
    module_name, spec_text, thread_count = sys.argv[1:]
    torch.set_num_threads(int(thread_count))
    target = importlib.import_module(module_name).probe_target(json.loads(spec_text))
    print(probe(*target))
