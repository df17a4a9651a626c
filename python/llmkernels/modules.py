"""The module classes, under their first import path (``llmkernels.modules``); they live in
:mod:`llmkernels.nn`."""

from .nn import *  # noqa: F403
from .nn import __all__ as __all__
