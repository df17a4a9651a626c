"""Every public name is documented with an example, and the examples run (doctest)."""

from __future__ import annotations

import doctest
import inspect

import llmkernels as lk
import numpy as np
import pytest

PUBLIC = [n for n in lk.__all__ if n != "__version__"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_docstring_with_example(name):
    obj = getattr(lk, name)
    doc = inspect.getdoc(obj) or ""
    assert len(doc) > 40, f"llmkernels.{name} has no real docstring"
    assert ">>>" in doc, f"llmkernels.{name}'s docstring has no example"


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_examples_run(name, threads):
    obj = getattr(lk, name)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    previous = lk.simd_arch()
    for test in finder.find(obj, name, globs={"np": np, "lk": lk}):
        runner.run(test)
    lk.set_simd_arch(previous)
    assert runner.failures == 0, f"llmkernels.{name}: {runner.failures} docstring example(s) failed"


def test_core_functions_have_docstrings_in_stub():
    """The C++ API is typed by the generated stub (make stubs), checked in test_errors.py."""
    from pathlib import Path

    stub = (Path(lk.__file__).parent / "_core.pyi").read_text()
    assert "def rms_norm(" in stub and "class TransformerBlockImpl" in stub
