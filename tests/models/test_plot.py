"""``llmkernels.plot``: attention heatmaps (Agg backend) and the clear error without
matplotlib. The benchmark plots (``benchmarks/plot_results.py``) are tested in
``tests/bench/test_bench.py``."""

from __future__ import annotations

import importlib
import io
import sys
from collections.abc import Iterator
from typing import Any

import matplotlib

matplotlib.use("Agg")

import llmkernels as lk  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from llmkernels import plot  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _image_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_images())]


def _colorbar_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax not in _image_axes(fig)]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# attention_heatmap
# --------------------------------------------------------------------------------------


@pytest.fixture
def weights() -> np.ndarray:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 6, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, 6, 8), dtype=np.float32)
    _, w = lk.attention(q, k, k, causal=True, return_weights=True)
    return w  # (1, 4, 6, 6)


def test_heatmap_one_panel_per_head(weights: np.ndarray) -> None:
    fig = plot.attention_heatmap(weights)
    images = _image_axes(fig)
    assert len(images) == 4
    assert [ax.get_title() for ax in images] == [f"head {h}" for h in range(4)]
    for ax in images:
        assert ax.get_xlabel() == "key position"
        assert ax.get_ylabel() == "query position"
        np.testing.assert_array_equal(ax.get_images()[0].get_array().shape, (6, 6))
    (cbar,) = _colorbar_axes(fig)
    assert cbar.get_ylabel() == "attention weight"
    lo, hi = images[0].get_images()[0].get_clim()
    assert lo == 0.0 and hi == pytest.approx(float(weights.max()))
    assert _png(fig).startswith(PNG_MAGIC)


def test_heatmap_accepts_2d_3d_4d_and_array_likes(weights: np.ndarray) -> None:
    assert len(_image_axes(plot.attention_heatmap(weights[0, 0]))) == 1
    assert len(_image_axes(plot.attention_heatmap(weights[0]))) == 4
    assert len(_image_axes(plot.attention_heatmap(weights[0].tolist()))) == 4


def test_heatmap_heads_subset_and_layout(weights: np.ndarray) -> None:
    fig = plot.attention_heatmap(weights, heads=[1, 3], title="two heads")
    assert [ax.get_title() for ax in _image_axes(fig)] == ["head 1", "head 3"]
    assert fig.get_suptitle() == "two heads"
    fig = plot.attention_heatmap(weights, heads=2)
    assert [ax.get_title() for ax in _image_axes(fig)] == ["head 2"]
    fig = plot.attention_heatmap(np.ones((6, 3, 3)) / 3, ncols=4)  # 2 rows, 2 empty slots removed
    assert len(_image_axes(fig)) == 6 and len(fig.axes) == 7


def test_heatmap_token_labels(weights: np.ndarray) -> None:
    tokens = ["<s>", "the", "cat", "sat", "on", "mat"]
    fig = plot.attention_heatmap(weights, tokens=tokens)
    ax = _image_axes(fig)[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    # decode-style weights (Tq < Tk): queries are the last Tq tokens (bottom-right alignment)
    fig = plot.attention_heatmap(weights[0, :, -2:], tokens=tokens)
    ax = _image_axes(fig)[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["on", "mat"]
    fig = plot.attention_heatmap(weights[0, :, -2:], tokens=(["a", "b"], tokens))
    assert [t.get_text() for t in _image_axes(fig)[0].get_yticklabels()] == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weights": np.ones((2, 1, 3, 3))}, ValueError, "batch of 2"),
        ({"weights": np.ones(3)}, ValueError, "must be"),
        ({"weights": np.ones((2, 3, 3)), "heads": [2]}, ValueError, "out of range"),
        ({"weights": np.ones((2, 3, 3)), "heads": []}, ValueError, "at least one"),
        ({"weights": np.ones((2, 3, 3)), "heads": [0.5]}, TypeError, "ints"),
        ({"weights": np.ones((3, 3)), "tokens": ["a", "b"]}, ValueError, "one label per key"),
    ],
)
def test_heatmap_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"\[attention_heatmap\].*" + match):
        plot.attention_heatmap(**kwargs)


# --------------------------------------------------------------------------------------
# without matplotlib (benchmark plots: tests/bench/test_bench.py)
# --------------------------------------------------------------------------------------


def test_missing_matplotlib_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.delitem(sys.modules, "llmkernels.plot")
    with pytest.raises(ImportError, match=r"pip install llmkernels\[notebook\]"):
        importlib.import_module("llmkernels.plot")
