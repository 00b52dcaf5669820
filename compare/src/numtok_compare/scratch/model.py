"""A small decoder-only transformer in plain PyTorch: pre-norm blocks, rotary position
embeddings (RoPE), tied input/output embeddings, and a key/value cache for greedy decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KeyValueCache", "ModelConfig", "Transformer"]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the transformer; ``d_model`` must be a multiple of ``2 * n_heads`` (RoPE rotates
    pairs of channels within each head)."""

    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    rope_base: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % (2 * self.n_heads):
            raise ValueError(
                f"d_model must be a multiple of 2 * n_heads (RoPE rotates channel pairs per "
                f"head): d_model={self.d_model}, n_heads={self.n_heads}"
            )


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE: rotate channel pair ``(x_i, x_{i+D/2})`` by angle ``position · base^(-2i/D)``.

    x (B, H, T, D), positions (B, T) integer. Attention scores between rotated queries and keys
    then depend on positions only through their difference.
    """
    half = x.shape[-1] // 2
    inverse_frequency = base ** (
        -torch.arange(half, device=x.device, dtype=torch.float32) / half
    )  # (D/2,)
    angles = positions[:, None, :, None].to(torch.float32) * inverse_frequency  # (B, 1, T, D/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class KeyValueCache:
    """Keys and values of all previous positions, per layer: (B, H, S, D) each."""

    def __init__(self, n_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def extend(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        previous_keys, previous_values = self.keys[layer], self.values[layer]
        if previous_keys is not None and previous_values is not None:
            keys = torch.cat((previous_keys, keys), dim=2)
            values = torch.cat((previous_values, values), dim=2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def select(self, rows: torch.Tensor) -> KeyValueCache:
        """A cache of the sequences ``rows`` (M,) of this one, in that order (rows may repeat)."""
        selected = KeyValueCache(len(self.keys))
        selected.keys = [None if k is None else k.index_select(0, rows) for k in self.keys]
        selected.values = [None if v is None else v.index_select(0, rows) for v in self.values]
        return selected


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.rope_base = config.rope_base
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor | None,
        cache: KeyValueCache | None,
        layer: int,
    ) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)  # (B, T, C) each
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, positions, self.rope_base), rotate(k, positions, self.rope_base)
        if cache is not None:
            k, v = cache.extend(layer, k, v)  # (B, H, S, D) with S >= T
        if allowed is None and k.shape[2] == length:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            if allowed is None:
                # Causal with the new queries at the end of the cached keys: query t may see keys
                # up to S - T + t (SDPA's is_causal would align them to the start instead).
                offset = k.shape[2] - length
                allowed = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(
                    offset
                )
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        output: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, length, width))
        return output  # (B, T, C)


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = _Attention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model)
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor | None,
        cache: KeyValueCache | None,
        layer: int,
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), positions, allowed, cache, layer)
        output: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return output


class Transformer(nn.Module):
    """Decoder-only transformer; ``forward(tokens) -> logits``.

    Training calls ``model(tokens)`` with tokens (B, T): causal attention, positions 0..T-1, and
    right padding is harmless because no real position attends to a later one. Decoding passes a
    :class:`KeyValueCache` and the ``positions`` (B, T) of the new tokens; without ``allowed`` the
    new tokens attend causally to all cached keys, and a boolean ``allowed`` mask (B, 1, T, S)
    over the cached and new keys can mask padding instead.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.apply(self._initialise)
        # GPT-2's scaled initialisation of the projections that write into the residual stream.
        for name, parameter in self.named_parameters():
            if name.endswith(("attention.out.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, std=0.02 / (2 * config.n_layers) ** 0.5)

    @staticmethod
    def _initialise(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def features(
        self,
        tokens: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
        cache: KeyValueCache | None = None,
    ) -> torch.Tensor:
        """tokens (B, T) -> the final (normalised) hidden states (B, T, C)."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.embedding(tokens)  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, positions, allowed, cache, layer)
        normalised: torch.Tensor = self.final_norm(x)
        return normalised

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., C) -> logits (..., V); the output layer is the embedding matrix."""
        return F.linear(features, self.embedding.weight)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
        cache: KeyValueCache | None = None,
    ) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V)."""
        hidden = self.features(tokens, positions=positions, allowed=allowed, cache=cache)
        return self.logits(hidden)  # (B, T, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
