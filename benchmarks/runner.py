"""The one runner of the benchmarks: what is run is checked against its reference by one error
formula, timed in interleaved rounds by one clock, and its peak memory measured by one probe.
A bench script declares its cases (and a loss's implementations, a readout's calls, a trainer's
modes) and writes its rows; the rest is here.

* **Check**: every implementation of a loss runs once (this is also the warm-up and, for a
  compiled one, the compilation) and its value and every gradient are compared with its
  reference's on the same inputs: :func:`relative_error` (:class:`Residual`), ``‖value −
  reference‖ / ‖reference‖`` in float64, the largest over the value and the gradients, must not
  exceed the tolerance. A reference or a required implementation that raises stops the run; any
  other is left out, with its error.
* **Time**: :class:`Clock` reads CUDA events on a GPU and ``time.perf_counter`` elsewhere (after
  a synchronisation), the CPU time (user + system) beside it; ``rounds`` rounds, the order
  rotated each round (:func:`interleaved`). What is timed: a loss's training step (forward with
  autograd recording and ``backward()`` into fresh ``.grad``: :func:`run`), a call
  (:func:`time_calls`), or a Trainer's optimizer steps (:class:`StepClock`'s callbacks,
  :func:`time_trainers`). Medians with p20/p80 (:func:`bench_common.quantiles`); every ratio is of
  medians in the same run.
* **Peak memory** (:class:`Peak`): the rise of one span above what was in use at its start — on
  CPU VmHWM, reset to VmRSS by writing ``5`` to ``/proc/self/clear_refs``; on CUDA
  ``max_memory_allocated`` above ``memory_allocated``. On CPU it is measured in a fresh process
  (:func:`in_fresh_process`: ``python benchmarks/runner.py MODULE FUNCTION SPEC THREADS`` prints
  ``MODULE.FUNCTION(SPEC)`` as JSON), after a small warm-up step that initialises thread pools and
  caches (:func:`probe`; a Trainer's second step, :class:`StepClock`); on CUDA in process.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from bench_common import proc_status, quantiles, reset_peak_memory

Inputs = dict[str, torch.Tensor]
Item = TypeVar("Item")


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


def relative_error(value: torch.Tensor | float, reference: torch.Tensor | float) -> float:
    """``‖value − reference‖ / ‖reference‖`` in float64 (:class:`Residual`); of two numbers,
    ``|value − reference| / |reference|``."""
    value, reference = (torch.as_tensor(x, dtype=torch.float64) for x in (value, reference))
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


def interleaved(
    items: Sequence[Item], rounds: int, warm_up: bool = False
) -> Iterator[tuple[int, Item]]:
    """``(round, item)`` for ``rounds`` rounds of every item, the order rotated by one each round
    (so that no item always follows the same one); with ``warm_up`` an untimed round -1 first."""
    for round_index in range(-1 if warm_up else 0, rounds):
        shift = round_index % len(items)
        for item in [*items[shift:], *items[:shift]]:
            yield round_index, item


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
    for round_index, implementation in interleaved(implementations, rounds, warm_up):
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


def time_calls(
    calls: Mapping[str, Callable[[], object]], rounds: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds of each call (a readout: no autograd), ``rounds`` interleaved rounds by
    :class:`Clock`."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _, name in interleaved(list(calls), rounds):
        clock = Clock(device)
        calls[name]()
        clock.mark()
        samples[name] += clock.intervals()
    return samples


@dataclass
class Steps:
    """Seconds of a Trainer's timed optimizer steps: wall-clock (:class:`Clock`) and CPU."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


class StepClock:
    """A Trainer's callbacks (``transformers`` or TRL) that time each optimizer step by
    :class:`Clock`, from ``on_step_begin`` to ``on_step_end`` (the batch already collated), with
    its CPU time (user + system, all threads) in :attr:`steps`; with ``measure_memory`` the
    :class:`Peak` of the second step of the first ``train()`` (:attr:`step_peak`; :attr:`peak`'s
    ``process()`` gives the process's); and the first logged loss, ce and ntl."""

    def __init__(self, device: torch.device, measure_memory: bool = False) -> None:
        self.device = device
        self.steps = Steps()
        self.peak = Peak(device) if measure_memory else None
        self.step_peak: int | None = None
        self.first_log: dict[str, float] | None = None
        self._clock: Clock | None = None
        self._cpu_start = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.peak is not None and self.step_peak is None and state.global_step == 1:
            self.peak.start()  # the second step (global_step counts the steps done)
        self._clock = Clock(self.device)
        self._cpu_start = time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self._clock is not None
        self._clock.mark()
        self.steps.wall += self._clock.intervals()
        self.steps.cpu.append(time.process_time() - self._cpu_start)
        if self.peak is not None and self.step_peak is None and state.global_step == 2:
            self.step_peak = self.peak.stop()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.first_log is None and logs and "loss" in logs:
            keys = ("loss", "ce", "ntl", "mean_token_accuracy", "entropy")
            self.first_log = {key: float(logs[key]) for key in keys if key in logs}


def time_trainers(
    runs: Mapping[str, Callable[[], object]], clocks: Mapping[str, StepClock], rounds: int
) -> dict[str, Steps]:
    """``rounds`` interleaved rounds of every ``runs[name]()`` (a Trainer's ``train()`` of a few
    optimizer steps that ``clocks[name]`` times); the first step of each run is left out (AdamW
    allocates its state there)."""
    samples = {name: Steps() for name in runs}
    for round_index, name in interleaved(list(runs), rounds):
        clock = clocks[name]
        clock.steps = Steps()
        runs[name]()
        samples[name].wall += clock.steps.wall[1:]
        samples[name].cpu += clock.steps.cpu[1:]
        seconds = ", ".join(f"{s:.3f}" for s in clock.steps.wall)
        print(f"round {round_index} {name}: [{seconds}] s", file=sys.stderr, flush=True)
    return samples


class Peak:
    """The peak memory of a span above what was in use at its start (:meth:`start`,
    :meth:`stop`): on CUDA ``max_memory_allocated`` above ``memory_allocated`` (the allocator's
    peak is reset at the start); elsewhere the rise of the process's VmHWM, reset to its VmRSS at
    the start (``/proc/self/clear_refs``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.base = self.earlier = 0

    def start(self) -> None:
        synchronize(self.device)
        if self.cuda:
            self.earlier = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.base = reset_peak_memory()

    def stop(self) -> int:
        """The span's peak above its start, in bytes."""
        synchronize(self.device)
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return proc_status("VmHWM") - self.base

    def process(self) -> int:
        """The process's peak so far, in bytes: on CUDA over its whole life, elsewhere VmHWM (since
        the start, whose reset forgets the peak before it)."""
        synchronize(self.device)
        if self.cuda:
            return max(self.earlier, torch.cuda.max_memory_allocated(self.device))
        return proc_status("VmHWM")


def peak_of_step(implementation: Implementation, inputs: Inputs, upstream: float = 1.0) -> int:
    """The :class:`Peak` of one step of ``implementation`` on ``inputs``, in this process."""
    call = fresh(implementation, inputs)
    for leaf in leaves(call):
        leaf.grad = None
    peak = Peak(device_of(inputs))
    peak.start()
    step(implementation, call, upstream)
    extra = peak.stop()
    for leaf in leaves(call):
        leaf.grad = None
    return extra


def probe(
    implementation: Implementation, inputs: Inputs, warm: Inputs, upstream: float = 1.0
) -> int:
    """In a fresh process (a bench script's function that :func:`in_fresh_process` calls): the
    peak one step adds, after a step on the small ``warm`` inputs."""
    step(implementation, fresh(implementation, warm), upstream)
    del warm
    return peak_of_step(implementation, inputs, upstream)


def in_fresh_process(module: str, function: str, spec: Mapping[str, Any], threads: int) -> Any:
    """``module.function(spec)`` in a fresh process with ``threads`` torch threads, its result
    (JSON, the last line it prints) read back: the memory probes, whose peak nothing this
    process allocated before may hide."""
    command = [sys.executable, __file__, module, function, json.dumps(spec), str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{module}.{function}({spec}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    module_name, function_name, spec_text, thread_count = sys.argv[1:]
    torch.set_num_threads(int(thread_count))
    function = getattr(importlib.import_module(module_name), function_name)
    print(json.dumps(function(json.loads(spec_text))))


def case_rows(
    case_fields: dict[str, Any],
    logits_bytes: int,
    measured: Measured,
    threads: int,
    baseline: str,
    meta: dict[str, Any],
    with_memory: bool,
    moved_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """One row per variant and mode (forward, backward, full) of one case at one thread count:
    medians with p20/p80, the ratio to ``baseline``'s median in the same mode, the CPU-time
    ratio of the full step and its ratios to the anchors, the check's relative error, with
    ``with_memory`` the peak memory and, with ``moved_bytes`` (the least a step must move: one
    read and one write of the logits), the bandwidth that amounts to at the full step's median,
    ``effective_gbps``."""
    rows = []
    samples = measured.samples[threads]
    for name, timed in samples.items():
        for mode in ("forward", "backward", "full"):
            p20, median, p80 = quantiles(getattr(timed, mode))
            row = {
                **meta,
                **case_fields,
                "variant": name,
                "mode": mode,
                "rounds": len(timed.forward),
                "median_ms": round(median, 2),
                "p20_ms": round(p20, 2),
                "p80_ms": round(p80, 2),
                "baseline": baseline,
                "time_ratio": round(median / samples[baseline].median_ms(mode), 3),
                "check_relative_error": measured.errors[name],
            }
            if mode == "full":
                row["cpu_median_ms"] = round(timed.median_ms("cpu"), 2)
                row["cpu_time_ratio"] = round(
                    timed.median_ms("cpu") / samples[baseline].median_ms("cpu"), 3
                )
                row["ratios_to_anchors"] = measured.ratios(threads, name)
                if with_memory and name in measured.peaks:
                    row["peak_extra_mib"] = round(measured.peaks[name] / 2**20, 1)
                    row["peak_extra_x_logits"] = round(measured.peaks[name] / logits_bytes, 2)
                if moved_bytes is not None:
                    row["effective_gbps"] = round(moved_bytes / (median * 1e-3) / 1e9)
            rows.append(row)
    return rows
