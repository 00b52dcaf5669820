"""Compile recorded Triton launches as Triton's JIT compiles them on a GPU, without one.

Input (stdin): JSON ``{"targets": [90, 80], "launches": [...], "ttir": bool}``, each launch as
``test_fused_triton.py``'s recorder writes it: the name of a kernel of
:mod:`numtok.ops.kernels.triton_rows`, its positional arguments (a tensor as its dtype and
``data_ptr``, a Python scalar as itself) and its keyword arguments (the constexprs, ``tl``
dtypes as ``{"tl": name}``, and ``num_warps``).

For each CUDA compute capability in ``targets`` and each launch, this does what
``JITFunction.run`` does before it launches (triton/runtime/jit.py, Triton 3.9): the binder that
``create_function_from_signature`` builds from the kernel's parameters runs on the launch's
arguments (``native_specialize_impl``: an int equal to 1 becomes a constexpr, ints and pointers
divisible by 16 get ``tt.divisibility``, ints of 2^31 or more are i64), ``compute_cache_key``
names the variant (launches with the same key share one binary, as in the JIT's cache),
``_pack_args`` turns it into the signature, constexprs and attributes, and ``triton.compile``
builds it for ``GPUTarget("cuda", capability, 32)`` with the options the JIT passes, through
ptxas to a cubin. A tensor enters the binder as a stand-in with its dtype and ``data_ptr`` (all
the binder reads of it; PyTorch aligns CPU allocations to 64 bytes and CUDA ones to 512, so a
fresh tensor is divisible by 16 on both, and a view keeps its offset).

Output (stdout): JSON ``{"variants": [...]}``, one entry per distinct variant and capability:
the kernel, the capability, the integer arguments the JIT turned into constants
(``"constants"``), the arguments it marked divisible by 16 (``"divisible"``), and either
``"error"`` (the compiler's message) or, with ``"ttir": true``, the variant's Triton IR.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import compute_cache_key, create_function_from_signature

from numtok.ops.kernels import triton_rows


class _TensorStandIn:
    """What the JIT's binder reads of a tensor argument: its dtype and address."""

    def __init__(self, dtype: torch.dtype, data_ptr: int) -> None:
        self.dtype = dtype
        self._data_ptr = data_ptr

    def data_ptr(self) -> int:
        return self._data_ptr


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        return _TensorStandIn(getattr(torch, value["tensor"]), value["data_ptr"])
    if isinstance(value, dict) and "tl" in value:
        return tl.dtype(value["tl"])
    return value


def _with_jit_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The launch's keyword arguments with the options ``JITFunction.run`` adds to them."""
    return {
        **kwargs,
        "debug": kwargs.get("debug", False) or knobs.runtime.debug,
        "instrumentation_mode": knobs.compilation.instrumentation_mode,
        "fpsan_homomorphic_casts": knobs.compilation.fpsan_homomorphic_casts,
    }


class _Variant(NamedTuple):
    """One binary the JIT would build: a launch, specialised for one capability."""

    kernel: str
    capability: int
    launch: dict[str, Any]


def _specialised(variant: _Variant) -> tuple[Any, str, tuple[Any, ...]]:
    """``(kernel, the JIT's cache key, _pack_args's (options, signature, constexprs, attrs))``
    of the variant, as ``JITFunction.run`` computes them."""
    kernel = getattr(triton_rows, variant.kernel)
    backend = make_backend(GPUTarget("cuda", variant.capability, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = [_decode(a) for a in variant.launch["args"]]
    kwargs = _with_jit_options({k: _decode(v) for k, v in variant.launch["kwargs"].items()})
    bound, specialization, options = binder(*args, **kwargs)
    key = compute_cache_key({}, specialization, options)
    return kernel, key, kernel._pack_args(backend, kwargs, bound, specialization, options)


def _compiled(variant: _Variant, with_ttir: bool) -> dict[str, Any]:
    kernel, _, (options, signature, constexprs, attrs) = _specialised(variant)
    report: dict[str, Any] = {
        "kernel": variant.kernel,
        "capability": variant.capability,
        "constants": {
            kernel.arg_names[path[0]]: value
            for path, value in constexprs.items()
            if kernel.arg_names[path[0]] not in variant.launch["kwargs"]
        },
        "divisible": sorted(kernel.arg_names[path[0]] for path, attr in attrs.items() if attr),
    }
    try:
        binary = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs),
            target=GPUTarget("cuda", variant.capability, 32),
            options=options.__dict__,
        )
        if not binary.asm["cubin"]:
            raise RuntimeError("ptxas wrote no cubin")
    except Exception as error:  # each compiler failure is a finding: reported, not raised
        report["error"] = f"{type(error).__name__}: {error}".strip()
    else:
        if with_ttir:
            report["ttir"] = binary.asm["ttir"]
    return report


def compile_launches(
    launches: list[dict[str, Any]], capabilities: list[int], with_ttir: bool
) -> list[dict[str, Any]]:
    """The report of each distinct variant (in the order of their first launch), compiled in
    as many processes as there are CPUs."""
    variants: dict[tuple[int, str, str], _Variant] = {}
    for capability in capabilities:
        for launch in launches:
            variant = _Variant(launch["kernel"], capability, launch)
            variants.setdefault((capability, variant.kernel, _specialised(variant)[1]), variant)
    workers = max(1, min(len(variants), os.cpu_count() or 1))
    # Forked workers start with triton and numtok imported (spawned ones take seconds to).
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        jobs = [pool.submit(_compiled, v, with_ttir) for v in variants.values()]
        return [job.result() for job in jobs]


if __name__ == "__main__":
    request = json.load(sys.stdin)
    variants = compile_launches(request["launches"], request["targets"], request.get("ttir", False))
    json.dump({"variants": variants}, sys.stdout)
