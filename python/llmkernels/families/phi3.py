"""Phi-3 (``Phi3ForCausalLM``): a LLaMA that stores q/k/v as one ``qkv_proj`` and gate/up as
one ``gate_up_proj`` (loaded as they are), with a sliding window, LongRoPE scaling and a plain
RoPE that honours ``partial_rotary_factor``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Family

if TYPE_CHECKING:
    from .._config import ModelConfig


class Phi3(Family):
    model_type = "phi3"
    architecture = "Phi3ForCausalLM"
    hf_defaults = {
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
    }
    sliding_window = True
    fused_projections = True
    partial_rotary_in_plain_rope = True
    default_pad_token_id = 32000  # Phi3Config's, past a small vocabulary

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return not cfg.attention_bias and not cfg.o_bias and not cfg.mlp_bias

    def hf_extra(self, cfg: ModelConfig, scaling: dict[str, Any] | None) -> dict[str, Any]:
        extra = super().hf_extra(cfg, scaling)
        if scaling is not None:
            # Phi3Config's top-level key (default 4096) overrides the one in the RoPE dict
            extra["original_max_position_embeddings"] = scaling.get(
                "original_max_position_embeddings", cfg.max_seq_len
            )
        return extra


FAMILY = Phi3()
