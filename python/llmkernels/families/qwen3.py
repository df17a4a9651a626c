"""Qwen3 (``Qwen3ForCausalLM``): a LLaMA with a per-head RMSNorm of q and of k before RoPE
(``q_norm`` / ``k_norm``) and 128-wide heads by default. Sliding-window layers are refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import Family
from .qwen2 import refuse_qwen_windows

if TYPE_CHECKING:
    from .._config import ModelConfig


class Qwen3(Family):
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    hf_defaults = {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768}
    qk_norm = True

    def read_hf(self, d: Mapping[str, Any], values: dict[str, Any]) -> None:
        super().read_hf(d, values)
        refuse_qwen_windows(d)

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return cfg.o_bias == cfg.attention_bias and not cfg.mlp_bias and cfg.sliding_window is None

    def hf_extra(self, cfg: ModelConfig, scaling: dict[str, Any] | None) -> dict[str, Any]:
        return {"use_sliding_window": False}


FAMILY = Qwen3()
