"""Qwen2 (``Qwen2ForCausalLM``): a LLaMA with biases on the q/k/v projections only. Its
sliding-window layers (``use_sliding_window``) are refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import Family, config_error

if TYPE_CHECKING:
    from .._config import ModelConfig


class Qwen2(Family):
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    hf_defaults = {"num_key_value_heads": 32, "max_position_embeddings": 32768}

    def read_hf(self, d: Mapping[str, Any], values: dict[str, Any]) -> None:
        super().read_hf(d, values)
        values.update(attention_bias=True, o_bias=False)
        refuse_qwen_windows(d)

    def biases_and_window_fit(self, cfg: ModelConfig) -> bool:
        return (
            cfg.attention_bias
            and not cfg.o_bias
            and not cfg.mlp_bias
            and cfg.sliding_window is None
        )

    def hf_extra(self, cfg: ModelConfig, scaling: dict[str, Any] | None) -> dict[str, Any]:
        return {"use_sliding_window": False}


def refuse_qwen_windows(d: Mapping[str, Any]) -> None:
    """Qwen's sliding window applies to some layers only: not supported."""
    if d.get("use_sliding_window"):
        raise config_error(
            "use_sliding_window",
            "Qwen sliding-window layers are not supported (only use_sliding_window=false)",
        )


FAMILY = Qwen2()
