"""The row passes of cross-entropy + NTL, private backends side by side behind one dispatch.

* :mod:`numtok.ops.kernels.torch_rows`: chunked PyTorch passes shaped for a CPU cache (any device);
  the default on CPU.
* :mod:`numtok.ops.kernels.triton_rows` (the kernels) and :mod:`numtok.ops.kernels.triton_loss`
  (their launches, autograd and ``torch.compile`` custom ops): one Triton program per row at the
  GPU's memory bandwidth; ``impl="triton"`` (opt-in until a committed run shows them correct and
  faster on a GPU).
* :mod:`numtok.ops.kernels.gradient_in_forward`: the autograd node both use when the logits'
  gradient is written during the forward pass.
* :mod:`numtok.ops.kernels.dispatch`: ``impl="auto" | "torch" | "triton"`` and ``$NUMTOK_IMPL``.

Only the Triton modules import ``triton``, and only when the Triton backend is chosen.
"""
