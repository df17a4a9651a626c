"""Interop: every function takes array-likes — lists, buffers, objects with ``__array__`` such
as torch CPU tensors — without the caller converting, and returns NumPy arrays equal to what
the same call on NumPy arrays returns."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch


class ArrayWrapper:
    """A minimal foreign array: only ``__array__`` (NumPy 2 passes ``dtype`` and ``copy``)."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self._data if dtype is None else self._data.astype(dtype)
        return arr.copy() if copy else arr


class DLPackOnly:
    """A foreign array exposing only the DLPack protocol."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._t = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    return {
        "x": r(3, 8), "w": 1 + 0.1 * r(8), "b": 0.1 * r(8), "g": r(3, 8), "u": r(3, 8),
        "wg": r(8, 16) / 4, "wu": r(8, 16) / 4, "wd": r(16, 8) / 4,
        "xr": r(2, 4, 5, 8), "q": r(1, 4, 5, 8), "k": r(1, 2, 5, 8), "v": r(1, 2, 5, 8),
    }  # fmt: skip


# Every public function: a call taking a dict of inputs (already converted by the test).
CALLS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "rms_norm": lambda a: lk.rms_norm(a["x"], a["w"]),
    "layer_norm": lambda a: lk.layer_norm(a["x"], a["w"], a["b"]),
    "silu": lambda a: lk.silu(a["x"]),
    "swiglu": lambda a: lk.swiglu(a["g"], a["u"]),
    "swiglu_ffn": lambda a: lk.swiglu_ffn(a["x"], a["wg"], a["wu"], a["wd"], b_down=a["b"]),
    "rope": lambda a: lk.rope(a["xr"]),
    "attention": lambda a: lk.attention(a["q"], a["k"], a["v"], causal=True),
    "attention_weights": lambda a: lk.attention(a["q"], a["k"], a["v"], return_weights=True)[1],
}

CONVERTERS: dict[str, Callable[[np.ndarray], Any]] = {
    "torch": torch.from_numpy,
    # a transposed (non-contiguous) view holding the same values
    "torch_strided": lambda a: (
        torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, -1, -2))).mT
        if a.ndim >= 2
        else torch.from_numpy(a)
    ),
    "__array__": ArrayWrapper,
    "list": lambda a: a.tolist(),
}


@pytest.mark.parametrize("convert", list(CONVERTERS), ids=list(CONVERTERS))
@pytest.mark.parametrize("name", list(CALLS), ids=list(CALLS))
def test_foreign_inputs_match_numpy(name: str, convert: str) -> None:
    inputs = _inputs()
    expected = CALLS[name](inputs)
    got = CALLS[name]({k: CONVERTERS[convert](v) for k, v in inputs.items()})
    assert type(got) is np.ndarray
    if convert == "list":  # Python floats are float64: the float64 path
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    else:
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)


def test_torch_tensor_readme_example() -> None:
    t = torch.randn(4, 8)
    y = lk.rms_norm(t)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (4, 8)
    np.testing.assert_array_equal(y, lk.rms_norm(t.numpy()))
    # the tensor is read, not modified
    assert torch.equal(t, torch.from_numpy(t.numpy().copy()))


def test_torch_dtypes_follow_numpy_rules() -> None:
    assert lk.silu(torch.randn(5, dtype=torch.float64)).dtype == np.float64
    assert lk.silu(torch.arange(5)).dtype == np.float64  # integers compute in float64
    assert lk.swiglu(torch.randn(5), torch.randn(5, dtype=torch.float64)).dtype == np.float64
    # float16 computes in float32 and returns float16
    assert lk.silu(torch.randn(5).half()).dtype == np.float16


def test_torch_strided_views() -> None:
    base = torch.randn(8, 6)
    view = base.T  # (6, 8), not contiguous
    assert not view.is_contiguous()
    expected = lk.rms_norm(np.ascontiguousarray(view.numpy()))
    np.testing.assert_array_equal(lk.rms_norm(view), expected)
    np.testing.assert_array_equal(lk.silu(base[:, ::2]), lk.silu(base.numpy()[:, ::2].copy()))


def test_torch_mask_positions_and_frequencies() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 4, 8), dtype=np.float32) for _ in range(3))
    mask = np.array([True, True, False, True])
    np.testing.assert_array_equal(
        lk.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                     mask=torch.from_numpy(mask)),
        lk.attention(q, k, v, mask=mask),
    )  # fmt: skip
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    np.testing.assert_array_equal(
        lk.rope(torch.from_numpy(x), torch.arange(3, 8)), lk.rope(x, np.arange(3, 8))
    )
    inv = lk.rope_inv_freq(8, 500.0)
    np.testing.assert_array_equal(
        lk.rope(x, inv_freq=torch.from_numpy(inv)), lk.rope(x, inv_freq=inv)
    )


def test_other_array_likes() -> None:
    np.testing.assert_array_equal(lk.silu(array.array("f", [1.0, -2.0])),
                                  lk.silu(np.array([1.0, -2.0], np.float32)))  # fmt: skip
    buf = memoryview(np.arange(4, dtype=np.float32))
    assert lk.silu(buf).dtype == np.float32
    assert lk.rms_norm((1, 2, 3)).dtype == np.float64
    assert lk.silu(2.0).shape == ()


def test_modules_take_torch_tensors() -> None:
    block = lk.TransformerBlock.from_config({"dim": 32, "n_heads": 4, "hidden_dim": 64}, seed=0)
    x = torch.randn(1, 3, 32)
    y = block(x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, block(x.numpy()))
    # a torch state dict loads without converting (the values are copied in)
    state = {k: torch.from_numpy(v.copy()) for k, v in block.state_dict().items()}
    block.load_state_dict(state)
    np.testing.assert_array_equal(block(x), y)


def test_torch_tensor_that_requires_grad_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match=r"^\[rms_norm\] x "):
        lk.rms_norm(torch.randn(2, 4, requires_grad=True))


def test_out_must_be_numpy() -> None:
    with pytest.raises(TypeError, match=r"^\[rms_norm\] out must be a numpy.ndarray"):
        lk.rms_norm(torch.randn(2, 4), out=torch.empty(2, 4))


def test_dlpack_only_objects() -> None:
    t = torch.randn(3, 4)
    np.testing.assert_array_equal(lk.silu(DLPackOnly(t)), lk.silu(t.numpy()))
