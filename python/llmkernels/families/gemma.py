"""Gemma (``GemmaForCausalLM``): a LLaMA with a tanh-GELU feed-forward (GeGLU), norms that scale
by ``1 + weight``, embeddings scaled by ``sqrt(dim)`` and a head tied to the embedding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Family

if TYPE_CHECKING:
    from .._config import ModelConfig


class Gemma(Family):
    model_type = "gemma"
    architecture = "GemmaForCausalLM"
    hf_defaults = {
        "num_key_value_heads": 16,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_act": "gelu_pytorch_tanh",
    }
    # GemmaConfig maps its legacy "gelu" to the tanh GELU, and so do we
    gelu_names = ("gelu_pytorch_tanh", "gelu_python_tanh", "gelu")
    unit_offset = True

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return cfg.o_bias == cfg.attention_bias and not cfg.mlp_bias and cfg.sliding_window is None


FAMILY = Gemma()
