"""The model families that load, one file each: a family's transformers defaults, how its
``config.json`` maps onto a :class:`~llmkernels._config.ModelConfig`, what it refuses and the
config it writes back (:class:`~llmkernels.families.base.Family`). Every module of this package
but ``base`` is a family and defines ``FAMILY``: adding a family is one new file here, and a
test."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Family


def _discover() -> dict[str, Family]:
    """model_type -> family, for every module of this package, in the order error messages list
    them: LLaMA (what every other family varies) first, then by module name."""
    families = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "llama", m.name)):
        if info.name != "base":
            family = importlib.import_module(f"{__name__}.{info.name}").FAMILY
            families[family.model_type] = family
    return families


#: model_type -> family
FAMILIES: dict[str, Family] = _discover()

__all__ = ["FAMILIES", "Family"]
