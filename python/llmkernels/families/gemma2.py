"""Gemma 2 (``Gemma2ForCausalLM``): Gemma with sandwich norms (a norm before and after each of
attention and feed-forward), soft-capped attention scores and logits, scores scaled by
``query_pre_attn_scalar ** -0.5``, and sliding-window layers alternating with full ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import Family, check_real, config_error, is_int

if TYPE_CHECKING:
    from .._config import ModelConfig


class Gemma2(Family):
    model_type = "gemma2"
    architecture = "Gemma2ForCausalLM"
    hf_defaults = {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }
    act_key = "hidden_activation"  # what Gemma2Config reads
    gelu_names = ("gelu_pytorch_tanh", "gelu_python_tanh")
    unit_offset = True
    norm_position = "sandwich"
    per_layer_attention = True
    sliding_window = True

    def read_hf(self, d: Mapping[str, Any], values: dict[str, Any]) -> None:
        super().read_hf(d, values)
        scalar = d.get("query_pre_attn_scalar")
        if scalar is not None:  # scores scaled by query_pre_attn_scalar ** -0.5
            scalar = check_real("query_pre_attn_scalar", scalar, positive=True)
        values.update(
            norm_position="sandwich",
            layer_types=d.get("layer_types"),
            attn_softcap=d.get("attn_logit_softcapping"),
            final_softcap=d.get("final_logit_softcapping"),
            attn_scale=None if scalar is None else scalar**-0.5,
        )
        if d.get("sliding_window") is None and "sliding_attention" in (
            values["layer_types"] or ("sliding_attention",)  # transformers' default alternates
        ):
            raise config_error(
                "sliding_window",
                "is null but layer_types has sliding_attention layers (absent layer_types: "
                "transformers' default, every other layer) -- a window size is needed",
            )
        if values["layer_types"] is None and d.get("sliding_window") is not None:
            # transformers' default: even layers (0, 2, ...) slide, odd ones attend fully
            n_layers = d["num_hidden_layers"]
            if is_int(n_layers) and 0 < n_layers <= 1 << 16:
                values["layer_types"] = [
                    "sliding_attention" if (i + 1) % 2 else "full_attention"
                    for i in range(n_layers)
                ]

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return cfg.o_bias == cfg.attention_bias and not cfg.mlp_bias

    def hf_extra(self, cfg: ModelConfig, scaling: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "sliding_window": cfg.sliding_window,
            "layer_types": ["full_attention"] * cfg.n_layers
            if cfg.sliding_window is None
            else list(cfg.layer_types or ["sliding_attention"] * cfg.n_layers),
            "attn_logit_softcapping": cfg.attn_softcap,
            "final_logit_softcapping": cfg.final_softcap,
            "query_pre_attn_scalar": scale_scalar(cfg.head_dim, cfg.attn_scale),
            "hidden_activation": "gelu_pytorch_tanh",
        }


def scale_scalar(head_dim: int, attn_scale: float | None) -> int | float:
    """query_pre_attn_scalar for a score scale: an int when it is one (transformers'
    Gemma2Config accepts only ints; 24 ** -0.5 squared back is 24.000000000000004)."""
    if attn_scale is None:
        return head_dim
    value = attn_scale**-2
    near = round(value)
    return int(near) if near > 0 and near**-0.5 == attn_scale else value


FAMILY = Gemma2()
