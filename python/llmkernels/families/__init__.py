"""The model families that load, one file each: a family's transformers defaults, how its
``config.json`` maps onto a :class:`~llmkernels._config.ModelConfig`, what it refuses and the
config it writes back (:class:`~llmkernels.families.base.Family`). Adding a family is one new
file here, its line in :data:`FAMILIES`, and a test."""

from __future__ import annotations

from . import gemma, gemma2, llama, mistral, phi3, qwen2, qwen3
from .base import Family

#: model_type -> family, in the order error messages list them
FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        llama.FAMILY,
        mistral.FAMILY,
        qwen2.FAMILY,
        phi3.FAMILY,
        qwen3.FAMILY,
        gemma.FAMILY,
        gemma2.FAMILY,
    )
}

__all__ = ["FAMILIES", "Family"]
