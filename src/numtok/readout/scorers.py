"""Hugging Face causal LMs as :class:`~numtok.readout.distribution.NextTokenScorer`\\ s, for
:func:`numtok.readout.decoding.predict_numbers`.

:class:`CachedScorer` (the default) encodes each prompt once and keeps its key/value cache; each
level of the digit tree is then one batched forward of one new token per live prefix, attending
to the prompt's cache and to the prefix's own few cached tokens (kept once each, in a node
store, and selected by a 4D attention mask). The work is the tree's node count, one token each,
instead of the whole prompt again for every node.

:class:`WholeSequenceScorer` re-scores every sequence (prompt + continuation) from its first
token, right-padded: slow, but it needs nothing of the model beyond ``input_ids`` and
``attention_mask``; it serves models whose cache the cached scorer cannot rebuild
(:class:`CacheUnsupportedError` says why).

Both are exact: no padding ever moves a real token's position, so absolute and rotary positions
alike are those of the sequence scored alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "CACHE_BUDGET_BYTES",
    "SEGMENT_ROWS",
    "CacheUnsupportedError",
    "CachedScorer",
    "WholeSequenceScorer",
    "cache_argument",
    "returned_cache",
    "shared_prefix_length",
]

#: With ``batch_size=None``, the cached scorer puts as many prefixes into one forward as keep
#: that forward's key/value cache (the prompt's, repeated per segment, the nodes its tokens
#: follow, the new tokens) and its logits under this many bytes.
CACHE_BUDGET_BYTES = 2**30

#: Most new tokens of one prompt in one row of a cached scorer's forward (a segment): they share
#: one copy of the prompt's keys and values.
SEGMENT_ROWS = 64

#: Sequences per forward of the whole-sequence scorer when ``batch_size`` is None.
WHOLE_SEQUENCE_BATCH = 8

# One layer's cached keys and values, each (rows, heads, positions, head_dim).
KeysValues = list[tuple[torch.Tensor, torch.Tensor]]


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """The number S of leading tokens all ``rows`` share, at most the shortest row's length less
    one: every row keeps one token of its own, whose state predicts what follows it."""
    limit = min(len(row) for row in rows) - 1
    first = rows[0]
    length = 0
    while length < limit and all(row[length] == first[length] for row in rows):
        length += 1
    return length


class CacheUnsupportedError(Exception):
    """The model's key/value cache is not one the cached scorer can rebuild; the message says
    what was found."""


class WholeSequenceScorer:
    """Every sequence (prompt + continuation) scored whole, right-padded, ``batch_size`` at a
    time; the logits at its last token are kept."""

    def __init__(
        self, model: Any, prompts: list[list[int]], *, pad_id: int, batch_size: int | None
    ) -> None:
        self.model = model
        self.prompts = prompts
        self.sequences = prompts
        self.pad_id = pad_id
        self.batch_size = batch_size or WHOLE_SEQUENCE_BATCH
        self.device = next(model.parameters()).device

    def start(self) -> torch.Tensor:
        self.sequences = self.prompts
        return self._score()

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.sequences = [
            [*self.sequences[parent], token]
            for parent, token in zip(parents.tolist(), tokens.tolist(), strict=True)
        ]
        return self._score()

    def _score(self) -> torch.Tensor:
        rows = []
        for start in range(0, len(self.sequences), self.batch_size):
            chunk = self.sequences[start : start + self.batch_size]
            lengths = torch.tensor([len(s) for s in chunk])
            input_ids = torch.full((len(chunk), int(lengths.max())), self.pad_id)
            for row, sequence in enumerate(chunk):
                input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention_mask = torch.arange(input_ids.shape[1]) < lengths[:, None]
            output = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.long().to(self.device),
            )
            logits = output.logits if hasattr(output, "logits") else output[0]  # (B, T, V)
            last = logits[torch.arange(len(chunk)), (lengths - 1).to(logits.device)]  # (B, V)
            rows.append(last.float() if last.dtype != torch.float64 else last)
        return torch.cat(rows)


def _forward_parameters(model: Any) -> Any:
    """The parameters of the forward that reads the scorer's keywords: the model's own, or under
    PEFT (whose ``forward`` takes ``**kwargs`` and passes them on) the wrapped causal LM's."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError) as error:
        raise CacheUnsupportedError(
            f"the model's forward has no readable signature ({error})"
        ) from None
    takes_anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    get_base_model = getattr(model, "get_base_model", None)
    if takes_anything and callable(get_base_model) and get_base_model() is not model:
        return _forward_parameters(get_base_model())
    return parameters


def cache_argument(model: Any) -> str:
    """The forward's name for the key/value cache: ``cache`` (transformers from 5.x) or
    ``past_key_values``; the forward must also take ``attention_mask`` and ``position_ids``."""
    parameters = _forward_parameters(model)
    takes_anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if not takes_anything and not {"attention_mask", "position_ids"} <= set(parameters):
        raise CacheUnsupportedError(
            "the model's forward does not take attention_mask and position_ids"
        )
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    # A wrapper that hands everything on (``forward(*args, **kwargs)``): the name every
    # transformers version accepts.
    if takes_anything:
        return "past_key_values"
    raise CacheUnsupportedError("the model's forward takes neither `cache` nor `past_key_values`")


#: The attention implementations that apply a 4D attention mask as given.
MASKED_ATTENTION = ("sdpa", "eager")


def _check_attention_reads_masks(model: Any) -> None:
    """Refuse a model whose attention would ignore the cached scorer's 4D mask (flash and flex
    attention, kernels): its tree tokens would attend to each other's keys. A module without a
    transformers config is taken at its word."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if isinstance(implementation, str) and implementation not in MASKED_ATTENTION:
        raise CacheUnsupportedError(
            f"its attention ({implementation}) does not apply a 4D attention mask; load the "
            "model with attn_implementation='sdpa' for the cached readout"
        )


def returned_cache(output: Any) -> Any:
    """The key/value cache a forward returned: ``output.cache`` (transformers from 5.x), else
    ``output.past_key_values``; None when it returned none."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def _keys_values(cache: Any) -> KeysValues:
    """Each layer's (keys, values) of a transformers ``DynamicCache`` of full-attention layers
    (``layers[i].keys``). Caches from before transformers 4.56, which has no cache layers, are
    refused: 4.46's models return a tuple, and with 4.48's ``DynamicCache`` (``key_cache[i]``)
    the tree's extensions read wrong logits, so the exact whole-sequence path serves those."""
    if type(cache).__name__ != "DynamicCache":
        raise CacheUnsupportedError(
            f"the model returned a {type(cache).__name__}, not a DynamicCache"
            if cache is not None
            else "the model returned no key/value cache"
        )
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise CacheUnsupportedError(
            "its DynamicCache has no cache layers (transformers before 4.56, whose caches "
            "the cached readout reads wrong logits from)"
        )
    kinds = {type(layer).__name__ for layer in layers}
    if kinds != {"DynamicLayer"}:
        raise CacheUnsupportedError(
            f"its cache has layers of kind {sorted(kinds)} (a sliding window or a hybrid "
            "model), not full attention only"
        )
    pairs = [(layer.keys, layer.values) for layer in layers]
    if not pairs or any(
        not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape != v.shape for k, v in pairs
    ):
        raise CacheUnsupportedError(
            "its cache does not hold (batch, heads, positions, dim) tensors"
        )
    return pairs


class CachedScorer:
    """The digit tree on top of the prompts' key/value cache.

    ``start()`` runs the prompts right-padded to the longest, L, ``batch_size`` at a time (8 by
    default), and keeps their cache: per layer keys and values (P, H, L, d), and which of the L
    positions are real, (P, L). The S leading tokens a chunk's prompts share
    (:func:`shared_prefix_length`) run once, for one row, and their keys and values are repeated
    for the chunk: a causal decoder's states there depend on those tokens alone. Right padding
    keeps every real token at its own position and out of reach of the pads (attention is
    causal), as if each prompt ran alone.

    The tree's tokens are cached once each: every scored token of the tree is a *node* whose
    keys and values, (H, d) per layer, sit in a node store, and every prefix at depth k is its
    prompt and its *path*, the k nodes it spells. ``extend`` scores the new tokens of a level in
    *segments*: up to :data:`SEGMENT_ROWS` new tokens of one prompt in one row of a forward.
    A segment's cache is its prompt's L positions followed by the A nodes its tokens' parents
    pass through (their union, a few per token), and its q new tokens come after it, each at
    position ``L_p + k`` (``position_ids``). A 4D attention mask lets new token j see its
    prompt's real tokens, the nodes on its own parent's path, and itself: exactly the keys it
    sees in its sequence scored alone. Attention is a softmax-weighted sum over the keys a token
    may see, whatever their order in the cache, and the cached keys already hold their own
    rotary or absolute positions, so the logits are those of the sequence scored alone. A
    prompt's cache is thus copied once per segment rather than once per prefix: the copies,
    not the arithmetic, were most of a level's time on CPU.

    ``start()`` runs the prompts once: a later call returns the same logits and starts a new tree
    on the kept cache, so that a greedy decode (:func:`numtok.readout.decoding.greedy_tokens`) and
    the number tree share one prompt pass.

    Raises :class:`CacheUnsupportedError` from ``start()`` when the model's cache is not a
    ``DynamicCache`` of full-attention layers (sliding-window and hybrid models, state-space
    models, custom caches), or when its attention ignores a 4D mask (flash and flex attention:
    load the model with ``attn_implementation="sdpa"``).
    """

    def __init__(
        self,
        model: Any,
        prompts: list[list[int]],
        *,
        pad_id: int,
        batch_size: int | None,
        budget_bytes: int = CACHE_BUDGET_BYTES,
    ) -> None:
        self.model = model
        self.prompts = prompts
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.budget_bytes = budget_bytes
        self.device = next(model.parameters()).device
        self.cache_argument = ""
        self.cache_type: Any = None
        self.prompt_cache: KeysValues = []  # per layer (P, H, L, d)
        self.prompt_mask = torch.zeros(0, 0, dtype=torch.long)  # (P, L): 1 at real tokens
        self.prompt_lengths = torch.zeros(0, dtype=torch.long)  # (P,)
        self.row_prompt = torch.zeros(0, dtype=torch.long)  # (M,): the prompt of each prefix
        self.paths = torch.zeros(0, 0, dtype=torch.long)  # (M, k): each prefix's node ids
        self.nodes: KeysValues = []  # per layer (N, H, d): every scored tree token's
        self.depth = 0
        self.first_logits: torch.Tensor | None = None  # (P, V), start()'s

    def _forward(self, cache: Any = None, **tensors: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The model's logits (B, T, V), at least float32, and the cache it returns."""
        arguments: dict[str, Any] = {k: v.to(self.device) for k, v in tensors.items()}
        if cache is not None:
            arguments[self.cache_argument] = cache
        output = self.model(**arguments, use_cache=True)
        logits: torch.Tensor = output.logits if hasattr(output, "logits") else output[0]
        return (logits if logits.dtype == torch.float64 else logits.float()), returned_cache(output)

    def start(self) -> torch.Tensor:
        if self.first_logits is None:
            self.first_logits = self._run_prompts()
        self.row_prompt = torch.arange(len(self.prompts))
        self.paths = torch.zeros(len(self.prompts), 0, dtype=torch.long)
        self.nodes = [(k.new_zeros(0, k.shape[1], k.shape[3]),) * 2 for k, _ in self.prompt_cache]
        self.depth = 0
        return self.first_logits

    def _run_prompts(self) -> torch.Tensor:
        """Each prompt's next-token logits (P, V); keeps the prompts' cache."""
        self.cache_argument = cache_argument(self.model)
        _check_attention_reads_masks(self.model)
        self.prompt_lengths = torch.tensor([len(prompt) for prompt in self.prompts])
        longest = int(self.prompt_lengths.max())
        self.prompt_mask = (torch.arange(longest) < self.prompt_lengths[:, None]).long()
        input_ids = torch.full((len(self.prompts), longest), self.pad_id)
        for row, prompt in enumerate(self.prompts):
            input_ids[row, : len(prompt)] = torch.tensor(prompt)
        step = self.batch_size or WHOLE_SEQUENCE_BATCH
        # transformers' causal LMs compute the output layer only at the positions asked for:
        # here each prompt's last one (a long prompt's (L, V) logits would be most of the memory).
        keeps_positions = "logits_to_keep" in _forward_parameters(self.model)
        rows, caches = [], []
        for begin in range(0, len(self.prompts), step):
            chunk = slice(begin, begin + step)
            shared = shared_prefix_length(self.prompts[chunk])
            rows_of_chunk = len(self.prompts[chunk])
            prefix = None
            if shared:
                _, prefix = self._forward(
                    input_ids=input_ids[begin : begin + 1, :shared],
                    **({"logits_to_keep": torch.tensor([shared - 1])} if keeps_positions else {}),
                )
                _keys_values(prefix)  # one this scorer reads (transformers 4.46: a tuple)
                prefix.batch_repeat_interleave(rows_of_chunk)
            last = self.prompt_lengths[chunk] - 1 - shared  # within the chunk's own tokens
            kept, column = (
                torch.unique(last, return_inverse=True) if keeps_positions else (last, last)
            )
            logits, cache = self._forward(
                input_ids=input_ids[chunk, shared:],
                attention_mask=self.prompt_mask[chunk],
                position_ids=torch.arange(shared, longest).expand(rows_of_chunk, -1),
                cache=prefix,
                **({"logits_to_keep": kept} if keeps_positions else {}),
            )
            pairs = _keys_values(cache)
            if pairs[0][0].shape[2] != longest:
                raise CacheUnsupportedError(
                    f"its cache holds {pairs[0][0].shape[2]} positions for prompts of "
                    f"{longest} tokens"
                )
            self.cache_type = type(cache)
            column = column.to(logits.device)
            rows.append(logits[torch.arange(len(column), device=logits.device), column])  # (B, V)
            caches.append(pairs)
        self.prompt_cache = [
            (torch.cat([c[layer][0] for c in caches]), torch.cat([c[layer][1] for c in caches]))
            for layer in range(len(caches[0]))
        ]
        return torch.cat(rows)

    def _segments(self, prompt_of_row: torch.Tensor) -> list[torch.Tensor]:
        """The rows of a level as segments, longest first: each prompt's rows, in their order,
        split into pieces of near-equal length, at most :data:`SEGMENT_ROWS` (``batch_size``,
        if smaller)."""
        longest = min(SEGMENT_ROWS, self.batch_size or SEGMENT_ROWS)
        order = torch.argsort(prompt_of_row, stable=True)
        counts = torch.bincount(prompt_of_row, minlength=len(self.prompts)).tolist()
        segments: list[torch.Tensor] = []
        for rows in torch.split(order, counts):
            if len(rows):
                segments.extend(torch.tensor_split(rows, -(-len(rows) // longest)))
        return sorted(segments, key=len, reverse=True)

    def _segments_per_forward(self, width: int, vocab_size: int) -> int:
        """How many segments of ``width`` tokens one forward takes: with ``batch_size``, at most
        that many tokens; otherwise as many as keep the forward's cache (the prompt's positions,
        at most ``depth`` ancestors per token, the new tokens) and its logits under the
        budget."""
        if self.batch_size is not None:
            return max(1, self.batch_size // width)
        # Keys and values of every layer, for one cached position of one segment.
        position_bytes = sum(2 * k.shape[1] * k.shape[2] * k.element_size() for k, _ in self.nodes)
        positions = self.prompt_mask.shape[1] + (self.depth + 1) * width
        segment_bytes = position_bytes * positions + width * vocab_size * 4
        return max(1, self.budget_bytes // segment_bytes)

    def _segment_batch(
        self, chosen: list[torch.Tensor], prompt_of_row: torch.Tensor, path_of_row: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward's B segments laid out as rows of ``width`` (the longest's length) slots:
        ``slots`` (B, width), each slot's row of the level (a short segment's spare slots repeat
        its first row); ``real`` (B, width), which slots are not spare; ``prompts`` (B,);
        ``seen`` (B, A), the nodes on the segment's paths (padded with node 0); and the
        additive attention ``mask`` (B, 1, width, L + A + width): 0 where new token j may
        attend (its prompt's real tokens, the nodes on its parent's path, itself), the dtype's
        lowest value elsewhere."""
        width = len(chosen[0])
        slots = torch.stack([torch.cat((s, s[:1].expand(width - len(s)))) for s in chosen])
        real = torch.arange(width) < torch.tensor([len(s) for s in chosen])[:, None]
        prompts = prompt_of_row[slots[:, 0]]
        paths = path_of_row[slots]  # (B, width, k)
        ancestors = [torch.unique(paths[b][real[b]]) for b in range(len(chosen))]
        seen = torch.zeros(len(chosen), max(map(len, ancestors)), dtype=torch.long)
        seen_real = torch.zeros(seen.shape, dtype=torch.bool)
        for b, nodes in enumerate(ancestors):
            seen[b, : len(nodes)], seen_real[b, : len(nodes)] = nodes, True
        on_path = (paths[..., None] == seen[:, None, None, :]).any(dim=2) & seen_real[:, None]
        allowed = torch.cat(
            (
                self.prompt_mask[prompts].bool()[:, None, :].expand(-1, width, -1),
                on_path,
                torch.eye(width, dtype=torch.bool).expand(len(chosen), -1, -1),
            ),
            dim=2,
        )
        dtype = self.nodes[0][0].dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )
        return slots, real, prompts, seen, mask[:, None]

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if self.first_logits is None:
            raise RuntimeError("CachedScorer.extend() needs start() first")
        prompt_of_row = self.row_prompt[parents]  # (R,)
        path_of_row = self.paths[parents]  # (R, k): the nodes each new token follows
        rows, vocab_size = len(parents), self.first_logits.shape[1]
        logits = self.first_logits.new_empty(rows, vocab_size)
        grown_nodes = [
            (k.new_empty(rows, *k.shape[1:]), v.new_empty(rows, *v.shape[1:]))
            for k, v in self.nodes
        ]
        segments = self._segments(prompt_of_row)
        begin = 0
        while begin < len(segments):
            chosen = segments[
                begin : begin + self._segments_per_forward(len(segments[begin]), vocab_size)
            ]
            begin += len(chosen)
            slots, real, prompts, seen, mask = self._segment_batch(
                chosen, prompt_of_row, path_of_row
            )
            on_device, seen_on_device = prompts.to(self.device), seen.to(self.device)
            cache = self.cache_type(
                [
                    (
                        torch.cat((k[on_device], nk[seen_on_device].transpose(1, 2)), dim=2),
                        torch.cat((v[on_device], nv[seen_on_device].transpose(1, 2)), dim=2),
                    )
                    for (k, v), (nk, nv) in zip(self.prompt_cache, self.nodes, strict=True)
                ]
            )
            forward_logits, grown = self._forward(
                input_ids=tokens[slots],
                attention_mask=mask,
                position_ids=(self.prompt_lengths[prompts] + self.depth)[:, None].expand_as(slots),
                cache=cache,
            )
            kept, kept_on_device = slots[real], real.to(forward_logits.device)
            logits[kept.to(logits.device)] = forward_logits[kept_on_device]
            # The new tokens' keys and values, copied out (a view would keep the forward's whole
            # cache alive).
            start = self.prompt_mask.shape[1] + seen.shape[1]
            for (k, v), (new_k, new_v) in zip(_keys_values(grown), grown_nodes, strict=True):
                new_k[kept.to(new_k.device)] = k[:, :, start:].transpose(1, 2)[kept_on_device]
                new_v[kept.to(new_v.device)] = v[:, :, start:].transpose(1, 2)[kept_on_device]
        first_new = self.nodes[0][0].shape[0]
        self.nodes = [
            (torch.cat((k, new_k)), torch.cat((v, new_v)))
            for (k, v), (new_k, new_v) in zip(self.nodes, grown_nodes, strict=True)
        ]
        self.paths = torch.cat((path_of_row, torch.arange(first_new, first_new + rows)[:, None]), 1)
        self.row_prompt = prompt_of_row
        self.depth += 1
        return logits
