"""Mistral (``MistralForCausalLM``): a LLaMA whose every layer may attend over a sliding window
of keys (``sliding_window``, null for full attention), without biases."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Family

if TYPE_CHECKING:
    from .._config import ModelConfig


class Mistral(Family):
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    hf_defaults = {
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    }
    sliding_window = True

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return not cfg.attention_bias and not cfg.o_bias and not cfg.mlp_bias


FAMILY = Mistral()
