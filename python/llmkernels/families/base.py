"""What a model family is to llmkernels (:class:`Family`), and the config errors and checks the
families share with :mod:`llmkernels._config`.

A family is one Hugging Face ``model_type``. The C++ block is the same for all of them; a family
says which of its features the architecture uses, how its ``config.json`` maps onto a
:class:`~llmkernels._config.ModelConfig` (the keys it leaves out take the defaults of its
transformers config class), what it refuses, and the config it writes back. A plain LLaMA is
the base class; each family file overrides what differs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from .._config import ModelConfig


class ConfigError(ValueError):
    """An invalid model configuration; the message reads ``"[config] <key>: <problem>"``."""


def config_error(key: str, problem: str) -> ConfigError:
    return ConfigError(f"[config] {key}: {problem}")


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_real(key: str, value: object, *, positive: bool) -> float:
    if not is_real(value):
        raise config_error(key, f"must be a real number, got {type(value).__name__} {value!r:.60}")
    try:
        value = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int like 10**400 has no float
        raise config_error(
            key, f"must be finite, got an integer of {len(str(value))} digits"
        ) from None
    if not math.isfinite(value):
        raise config_error(key, f"must be finite, got {value!r}")
    if value < 0.0 or (positive and value == 0.0):
        raise config_error(key, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


class Family:
    """A plain LLaMA (``LlamaForCausalLM``); each family file subclasses it."""

    model_type: ClassVar[str] = "llama"
    #: the class transformers saves in ``architectures``
    architecture: ClassVar[str] = "LlamaForCausalLM"
    #: transformers' defaults (its config class, 5.x) for the keys a config.json may leave out,
    #: where they differ from LlamaConfig's (which the canonical defaults follow)
    hf_defaults: ClassVar[Mapping[str, Any]] = {}
    #: the key of the activation in its config, and the tanh-GELU names it accepts (GeGLU)
    act_key: ClassVar[str] = "hidden_act"
    gelu_names: ClassVar[tuple[str, ...]] = ()
    #: the features its architecture fixes (checked when writing its config back)
    qk_norm: ClassVar[bool] = False  # per-head RMSNorm of q and k before RoPE
    unit_offset: ClassVar[bool] = False  # (1 + weight) norms and sqrt(dim)-scaled embeddings
    norm_position: ClassVar[str] = "pre"
    per_layer_attention: ClassVar[bool] = False  # layer types, score scale, soft-capping
    sliding_window: ClassVar[bool] = False  # its config's sliding_window applies to every layer
    #: q/k/v stored as one qkv_proj and gate/up as one gate_up_proj (so the block stores them)
    fused_projections: ClassVar[bool] = False
    #: its plain RoPE rotates only partial_rotary_factor of the features (others: all of them)
    partial_rotary_in_plain_rope: ClassVar[bool] = False
    #: the pad_token_id its config class defaults to when config.json has none (None: no default)
    default_pad_token_id: ClassVar[int | None] = None

    def read_hf(self, d: Mapping[str, Any], values: dict[str, Any]) -> None:
        """Set the family's canonical ``values`` from its HF config ``d`` (its defaults filled
        in); raise :class:`ConfigError` for what it cannot load."""
        if self.qk_norm:
            values["qk_norm"] = True
        if self.unit_offset:
            values.update(norm_unit_offset=True, embed_scale=True)
        if self.sliding_window:
            values["sliding_window"] = d.get("sliding_window")  # null: full attention

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        """Whether its HF config can say ``cfg``'s biases and sliding window."""
        return cfg.o_bias == cfg.attention_bias and cfg.sliding_window is None

    def can_write(self, cfg: ModelConfig) -> bool:
        """Whether its HF config can describe ``cfg``."""
        ok = self.biases_and_window_fit(cfg) and cfg.qk_norm == self.qk_norm
        ok &= (cfg.activation == "gelu_tanh") == bool(self.gelu_names)
        ok &= cfg.norm_unit_offset == self.unit_offset and cfg.embed_scale == self.unit_offset
        ok &= (cfg.norm_position == "sandwich") == (self.norm_position == "sandwich")
        if not self.per_layer_attention:
            ok &= cfg.layer_types is None and cfg.attn_scale is None
            ok &= cfg.attn_softcap is None and cfg.final_softcap is None
        return ok

    def hf_extra(self, cfg: ModelConfig, scaling: dict[str, Any] | None) -> dict[str, Any]:
        """The keys of its HF config beyond LlamaConfig's."""
        return {"sliding_window": cfg.sliding_window} if self.sliding_window else {}
