"""The Number Token Loss in Axolotl, from its YAML config::

    plugins:
      - numtok.integrations.axolotl.NumtokPlugin
    ntl_weight: 0.3        # λ of CE + λ·NTL (0: cross-entropy alone, the same run otherwise)
    ntl_kind: was          # was | mse | mae | huber | del | smmd | dist2

The keys are fields of :class:`NumtokArgs`, which the plugin hands Axolotl (``get_input_args``),
so Axolotl validates them with the rest of the config. In ``post_trainer_create`` the plugin
puts NTL on the trainer Axolotl built (an ``AxolotlTrainer``, a ``transformers.Trainer``):

- With Axolotl's own cross-entropy: :meth:`NTLossForTrainer(...).attach(trainer)
  <numtok.hf.NTLossForTrainer.attach>`. numtok computes CE + λ·NTL from the logits (or, with
  ``ntl_logits_free: true``, from the final hidden states and the output layer, no logits),
  exact over gradient accumulation and processes, with ``ce`` and ``ntl`` in the logs.
- With ``liger_fused_linear_cross_entropy: true`` (Axolotl's Liger plugin) or
  ``cut_cross_entropy: true`` (its CCE plugin): the model's forward, which those plugins replace,
  keeps computing the cross-entropy without logits, and :func:`numtok.hf.patch_model` with
  ``cross_entropy="model"`` adds λ·NTL from the number head on the final hidden states
  (:func:`numtok.linear_number_token_loss`: the output layer's number rows at the number-labelled
  positions only). Each micro-batch's CE and NTL (its own means) are logged as ``ce`` and
  ``ntl``, through Axolotl's ``store_metrics``. Under gradient accumulation NTL's mean is then per
  micro-batch, like the cross-entropy Axolotl computes there.

Refused, at validation (a config error naming the key): ``rl`` (DPO, KTO, ORPO, GRPO, ...: their
losses are not a token-level cross-entropy NTL adds to; for GRPO :func:`numtok.hf.number_reward`
is a reward on numeric answers), ``reward_model`` and ``process_reward_model``, ``orpo_alpha``,
``use_eaft`` (EAFT sets the trainer's ``compute_loss_func`` to its own loss, which numtok's would
replace), and ``ntl_reweigh`` / ``ntl_logits_free`` beside Liger's or CCE's loss (which hands out
no log-sum-exp and builds no logits already). Anything else :meth:`~numtok.hf.NTLossForTrainer.
attach` or :func:`~numtok.hf.patch_model` refuses (another ``compute_loss_func``, a model whose
logits are not its output layer's product, ...) raises from ``post_trainer_create`` with their
message.

Axolotl's ``PluginManager`` catches an ``ImportError`` raised while it loads a plugin, logs it and
trains on without the plugin (and drops the ``ntl_*`` keys with the other unknown keys). So an
``ImportError`` while this module loads (Axolotl's plugin base, or numtok's Hugging Face routes)
is raised again as a ``RuntimeError``, which stops the run. What no module of numtok can make
loud is a numtok that is not installed where Axolotl runs, or whose package fails to import:
Axolotl then logs ``Failed to load plugin: numtok.integrations.axolotl.NumtokPlugin`` and the
training logs have no ``ntl``.

Importing this module imports ``axolotl`` (tested with Axolotl 0.19.0).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

try:
    from axolotl.integrations.base import BasePlugin
    from pydantic import BaseModel, Field, model_validator
except ImportError as error:  # Axolotl would log an ImportError and train without NTL
    raise RuntimeError(
        f"numtok.integrations.axolotl.NumtokPlugin could not import Axolotl's plugin base "
        f"({type(error).__name__}: {error}); this is raised as a RuntimeError because Axolotl "
        "would only log an ImportError and train without NTL. Install Axolotl beside numtok "
        "(0.19.0 is tested)"
    ) from error

try:
    from numtok.hf import NTLossForTrainer, last_loss_terms, patch_model
    from numtok.hf._head import causal_lm_of
    from numtok.hf._zero3 import full_shape
except ImportError as error:
    raise RuntimeError(
        f"numtok is installed but its Hugging Face routes do not import "
        f"({type(error).__name__}: {error}); raised as a RuntimeError because Axolotl would only "
        "log an ImportError and train without NTL"
    ) from error

__all__ = ["NumtokArgs", "NumtokPlugin", "refusal"]

NTLKind = Literal["was", "mse", "mae", "huber", "del", "smmd", "dist2"]
Impl = Literal["auto", "torch", "triton"]

#: Config keys that choose a trainer whose loss NTL does not add to, with why.
_REFUSED = {
    "rl": (
        "trains with the loss of a preference or reinforcement-learning method on whole "
        "sequences, which NTL, a term on each number token's probabilities beside "
        "cross-entropy, does not add to: NumtokPlugin is for supervised fine-tuning (for GRPO, "
        "numtok.hf.number_reward is a reward on numeric answers)"
    ),
    "reward_model": "trains a reward model (a score per sequence, no token cross-entropy)",
    "process_reward_model": "trains a process reward model (a label per step, no cross-entropy "
    "over the vocabulary)",
    "orpo_alpha": "computes ORPO's loss in AxolotlTrainer.orpo_compute_loss, which never reads "
    "a compute_loss_func or the model's loss",
    "use_eaft": "sets the trainer's compute_loss_func to EAFT's entropy-weighted cross-entropy, "
    "and numtok's loss would replace it: the two losses do not compose, keep one",
}


def _models_own_loss(cfg: Mapping[str, Any]) -> str | None:
    """The kernel that computes the model's loss inside its forward, without logits, if any."""
    if cfg.get("liger_fused_linear_cross_entropy"):
        return "Liger's fused linear cross-entropy (liger_fused_linear_cross_entropy)"
    if cfg.get("cut_cross_entropy"):
        return "Cut Cross-Entropy (cut_cross_entropy)"
    return None


def refusal(cfg: Mapping[str, Any]) -> str | None:
    """Why NumtokPlugin cannot train the run an Axolotl config describes, or None."""
    for key, why in _REFUSED.items():
        value = cfg.get(key)
        if value:
            return f"NumtokPlugin cannot add NTL here: {key}: {value} {why}"
    own = _models_own_loss(cfg)
    if own is not None and cfg.get("ntl_reweigh"):
        return (
            f"ntl_reweigh: true needs every number position's full log-sum-exp, which {own} "
            "does not hand out: drop ntl_reweigh, or the Liger/CCE setting"
        )
    if own is not None and cfg.get("ntl_logits_free"):
        return (
            f"ntl_logits_free is numtok's cross-entropy without logits; with {own} the model's "
            "own loss builds none already and NTL comes from the number head: drop "
            "ntl_logits_free"
        )
    return None


class NumtokArgs(BaseModel):
    """The YAML keys of :class:`NumtokPlugin` (Axolotl merges them into its config schema)."""

    ntl_weight: float = Field(
        default=0.3,
        ge=0,
        allow_inf_nan=False,
        json_schema_extra={"description": "λ of CE + λ·NTL (the paper's 0.3)"},
    )
    ntl_kind: NTLKind = Field(
        default="was",
        json_schema_extra={"description": "NTL's kind, as numtok.cross_entropy_with_ntl's kind"},
    )
    ntl_reweigh: bool = Field(
        default=False,
        json_schema_extra={"description": "weigh NTL by the number tokens' probability mass"},
    )
    ntl_squash_factor: float | None = Field(
        default=None,
        gt=1,
        allow_inf_nan=False,
        json_schema_extra={"description": "the farthest wrong number costs this x the nearest"},
    )
    ntl_logits_free: bool = Field(
        default=False,
        json_schema_extra={
            "description": "numtok's CE + NTL from the hidden states, no logits in training"
        },
    )
    ntl_impl: Impl = Field(
        default="auto",
        json_schema_extra={"description": "numtok's backend: auto, torch or triton"},
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_ntl_does_not_compose_with(cls, data: Any) -> Any:
        # Axolotl validates the whole config with a class that inherits from this one, so the
        # raw config reaches this validator with every key (rl, use_eaft, liger_*, ...).
        if isinstance(data, Mapping):
            problem = refusal(data)
            if problem is not None:
                raise ValueError(problem)
            # Axolotl drops keys it does not know without a word: a misspelt ntl_ key would.
            unknown = sorted(
                key for key in data if key.startswith("ntl_") and key not in cls.model_fields
            )
            if unknown:
                raise ValueError(
                    f"unknown NumtokPlugin key(s) {unknown}; its keys are {list(cls.model_fields)}"
                )
        return data


def _settings(cfg: Mapping[str, Any]) -> NumtokArgs:
    """The plugin's keys of a config (validated again: a config built in Python may not have
    passed through Axolotl's validation)."""
    given = {key: cfg.get(key) for key in NumtokArgs.model_fields if cfg.get(key) is not None}
    return NumtokArgs.model_validate(given)


def _store_the_terms(trainer: Any, causal_lm: Any) -> None:
    """Log each training micro-batch's CE and NTL through ``AxolotlTrainer.store_metrics``
    (averaged by Axolotl over the micro-batches since the last log)."""
    store_metrics = getattr(trainer, "store_metrics", None)
    if not callable(store_metrics):
        return
    compute_loss = trainer.compute_loss

    @functools.wraps(compute_loss)
    def compute_loss_storing_the_terms(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        result = compute_loss(model, inputs, *args, **kwargs)
        terms = last_loss_terms(causal_lm)
        if model.training and terms is not None:
            store_metrics({"ce": terms.ce.item(), "ntl": terms.ntl.item()}, train_eval="train")
        return result

    trainer.compute_loss = compute_loss_storing_the_terms


class NumtokPlugin(BasePlugin):  # type: ignore[misc]
    """Axolotl plugin: CE + ``ntl_weight`` · NTL in supervised fine-tuning (see the module
    docstring). ``route`` says, after ``post_trainer_create``, which route it took:
    ``"attach"`` (numtok's cross-entropy) or ``"model"`` (the model's own, Liger's or CCE's)."""

    def __init__(self) -> None:
        super().__init__()
        self.route: str | None = None

    def get_input_args(self) -> str:
        return f"{__name__}.NumtokArgs"

    def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
        problem = refusal(cfg)
        if problem is not None:
            raise ValueError(problem)
        args = _settings(cfg)
        tokenizer = getattr(trainer, "processing_class", None)
        if tokenizer is None:
            raise ValueError(
                f"NumtokPlugin reads the tokenizer from the trainer (processing_class), and this "
                f"{type(trainer).__name__} has none"
            )
        loss_settings: dict[str, Any] = {
            "ntl_weight": args.ntl_weight,
            "kind": args.ntl_kind,
            "squash_factor": args.ntl_squash_factor,
            "impl": args.ntl_impl,
        }
        if _models_own_loss(cfg) is None:
            # The full size, also of a weight that deepspeed.zero.Init partitioned (shape (0,)).
            rows = full_shape(trainer.model.get_output_embeddings().weight)[0]
            NTLossForTrainer(
                tokenizer,
                vocab_size=rows,
                reweigh=args.ntl_reweigh,
                logits_free=args.ntl_logits_free,
                **loss_settings,
            ).attach(trainer)
            self.route = "attach"
        else:
            causal_lm = causal_lm_of(trainer.model)
            patch_model(causal_lm, tokenizer, cross_entropy="model", **loss_settings)
            _store_the_terms(trainer, causal_lm)
            self.route = "model"
