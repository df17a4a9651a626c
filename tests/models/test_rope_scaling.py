"""rope_inv_freq / rope_attention_factor against Hugging Face transformers' RoPE init functions.

HF computes the frequencies in float32; ours are float64, so the comparison uses rtol=1e-6
with power-of-two rotary dims (whose exponents ``arange(0, dim, 2) / dim`` are exact in
float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from _models import hf_rope_config, llama3_scaling
from llmkernels import _rope_scaling
from llmkernels._rope_scaling import rope_attention_factor, rope_inv_freq
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

RTOL = 1e-6

LLAMA31 = llama3_scaling(8192)


def hf_rope(
    params: dict[str, Any],
    *,
    head_dim: int = 128,
    theta: float = 10000.0,
    max_position_embeddings: int = 4096,
    seq_len: int | None = None,
) -> tuple[np.ndarray, float]:
    """HF's (inv_freq, attention_factor) for ``params``."""
    # transformers >= 5 takes rope_parameters (with rope_theta inside the dict); 4.x takes
    # rope_scaling and a separate rope_theta: hf_rope_config passes them the installed way
    cfg = hf_rope_config(
        params, head_dim=head_dim, theta=theta, max_position_embeddings=max_position_embeddings
    )
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default" and "default" not in ROPE_INIT_FUNCTIONS:
        inv_freq, attention_factor = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, None, seq_len=seq_len)
    return inv_freq.to(torch.float64).numpy(), float(attention_factor)


def check_against_hf(
    ours: dict[str, Any] | None,
    hf_params: dict[str, Any],
    *,
    dim: int = 128,
    theta: float = 10000.0,
    max_position_embeddings: int = 4096,
    seq_len: int | None = None,
) -> np.ndarray:
    expected, expected_af = hf_rope(
        hf_params,
        head_dim=dim,
        theta=theta,
        max_position_embeddings=max_position_embeddings,
        seq_len=seq_len,
    )
    got = rope_inv_freq(dim, theta, ours, seq_len=seq_len)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float64
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=0)
    assert rope_attention_factor(ours, seq_len=seq_len) == pytest.approx(expected_af, rel=1e-12)
    return got


DIMS = [64, 128]
THETAS = [10000.0, 500000.0]


# --------------------------------------------------------------------------------------
# against HF, type by type
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", THETAS)
def test_default(dim: int, theta: float) -> None:
    got = check_against_hf(None, {"rope_type": "default"}, dim=dim, theta=theta)
    check_against_hf({"rope_type": "default"}, {"rope_type": "default"}, dim=dim, theta=theta)
    expected = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    assert got[0] == 1.0
    assert rope_attention_factor(None) == 1.0


def test_default_small_dims() -> None:
    np.testing.assert_array_equal(rope_inv_freq(2), [1.0])
    np.testing.assert_allclose(rope_inv_freq(4, 100.0), [1.0, 0.1], rtol=1e-15)
    # with dim == 2 the only frequency is theta**0 == 1, whatever theta (and any scaling
    # that does not divide it)
    assert rope_inv_freq(2, 0.1).tolist() == [1.0]
    dyn = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
    assert rope_inv_freq(2, 10000.0, dyn, seq_len=100).tolist() == [1.0]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("factor", [2.0, 4, 0.5])
def test_linear(dim: int, theta: float, factor: float) -> None:
    params = {"rope_type": "linear", "factor": factor}
    check_against_hf(params, params, dim=dim, theta=theta)
    np.testing.assert_allclose(
        rope_inv_freq(dim, theta, params), rope_inv_freq(dim, theta) / factor, rtol=1e-15
    )


def test_legacy_type_key() -> None:
    hf_params = {"type": "linear", "factor": 4.0}
    check_against_hf({"type": "linear", "factor": 4.0}, hf_params)
    # "rope_type" wins over "type", as in HF's standardize_rope_params
    both = {"rope_type": "linear", "type": "dynamic", "factor": 4.0}
    np.testing.assert_array_equal(
        rope_inv_freq(64, scaling=both), rope_inv_freq(64, scaling={"type": "linear", "factor": 4})
    )


def test_hf_takes_legacy_rope_scaling_kwargs() -> None:
    """This transformers version still converts rope_scaling= / rope_theta= kwargs."""
    cfg = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_scaling={"type": "linear", "factor": 4.0},
        rope_theta=500000.0,
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["linear"](cfg, None)
    np.testing.assert_allclose(
        rope_inv_freq(64, 500000.0, {"type": "linear", "factor": 4.0}),
        inv_freq.double().numpy(),
        rtol=RTOL,
    )


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("seq_len", [None, 0, 1, 100, 4095, 4096, 4097, 8192, 10000, 100000])
def test_dynamic(dim: int, theta: float, seq_len: int | None) -> None:
    original = 4096
    ours = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": original}
    hf_params = {"rope_type": "dynamic", "factor": 2.0}
    got = check_against_hf(
        ours, hf_params, dim=dim, theta=theta, max_position_embeddings=original, seq_len=seq_len
    )
    unscaled = rope_inv_freq(dim, theta)
    if seq_len is None or seq_len <= original:
        # HF: seq_len = max(seq_len, max_position_embeddings) -> no change at or below it
        np.testing.assert_allclose(got, unscaled, rtol=1e-14)
    else:
        assert got[0] == 1.0
        assert np.all(got[1:] < unscaled[1:])


def test_dynamic_max_position_embeddings_key() -> None:
    """HF reads config.max_position_embeddings; the dict key of that name works too."""
    a = {"rope_type": "dynamic", "factor": 3.0, "max_position_embeddings": 2048}
    b = {"rope_type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 2048}
    check_against_hf(
        a, {"rope_type": "dynamic", "factor": 3.0}, seq_len=5000, max_position_embeddings=2048
    )
    np.testing.assert_array_equal(
        rope_inv_freq(128, scaling=a, seq_len=5000), rope_inv_freq(128, scaling=b, seq_len=5000)
    )


def test_dynamic_formula() -> None:
    dim, theta, factor, original, seq_len = 64, 10000.0, 2.0, 1024, 3000
    base = theta * (factor * seq_len / original - (factor - 1)) ** (dim / (dim - 2))
    expected = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    got = rope_inv_freq(
        dim,
        theta,
        {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": original},
        seq_len=seq_len,
    )
    np.testing.assert_allclose(got, expected, rtol=1e-14)


YARN_CASES = [
    # plain YaRN: attention factor 0.1 ln(s) + 1
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    # DeepSeek-V3 style: mscale / mscale_all_dim
    {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    # explicit attention factor, no truncation of the correction range
    {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "attention_factor": 1.5,
    },
    {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 2048,
        "truncate": False,
    },
    # factor <= 1: attention factor 1
    {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096},
]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("params", YARN_CASES)
def test_yarn(dim: int, theta: float, params: dict[str, Any]) -> None:
    max_pos = int(params["original_max_position_embeddings"] * params["factor"])
    check_against_hf(params, params, dim=dim, theta=theta, max_position_embeddings=max_pos)


def test_yarn_attention_factor_values() -> None:
    base = {"rope_type": "yarn", "original_max_position_embeddings": 4096}
    assert rope_attention_factor({**base, "factor": 4.0}) == pytest.approx(
        0.1 * math.log(4.0) + 1.0, rel=1e-15
    )
    assert rope_attention_factor({**base, "factor": 0.5}) == 1.0
    af = rope_attention_factor({**base, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707})
    assert af == pytest.approx((0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1))
    # mscale == mscale_all_dim cancels out
    assert rope_attention_factor({**base, "factor": 40.0, "mscale": 1, "mscale_all_dim": 1}) == 1
    assert rope_attention_factor({**base, "factor": 4.0, "attention_factor": 0.75}) == 0.75


def test_yarn_factor_from_max_position_embeddings() -> None:
    """HF: factor None -> max_position_embeddings / original_max_position_embeddings."""
    ours = {
        "rope_type": "yarn",
        "factor": None,
        "original_max_position_embeddings": 4096,
        "max_position_embeddings": 32768,
    }
    explicit = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
    np.testing.assert_array_equal(
        rope_inv_freq(128, scaling=ours), rope_inv_freq(128, scaling=explicit)
    )
    assert rope_attention_factor(ours) == rope_attention_factor(explicit)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", [500000.0, 10000.0])
def test_llama3(dim: int, theta: float) -> None:
    got = check_against_hf(LLAMA31, LLAMA31, dim=dim, theta=theta, max_position_embeddings=131072)
    unscaled = rope_inv_freq(dim, theta)
    wavelen = 2 * math.pi / unscaled
    high = wavelen < 8192 / 4  # high frequencies are kept
    low = wavelen > 8192 / 1  # low frequencies are divided by the factor
    np.testing.assert_array_equal(got[high], unscaled[high])
    np.testing.assert_allclose(got[low], unscaled[low] / 8.0, rtol=1e-15)
    mid = ~high & ~low
    assert np.all(got[mid] <= unscaled[mid]) and np.all(got[mid] >= unscaled[mid] / 8.0)
    assert rope_attention_factor(LLAMA31) == 1.0


def test_llama31_8b_values() -> None:
    """Llama-3.1-8B: head_dim 128, rope_theta 500000."""
    got = rope_inv_freq(128, 500000.0, LLAMA31)
    assert got.shape == (64,)
    assert got[0] == 1.0
    assert got[-1] == pytest.approx(1.0 / 500000.0 ** (126 / 128) / 8.0, rel=1e-14)


def _longrope_params(dim: int) -> dict[str, Any]:
    half = dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.01 * i for i in range(half)],
        "long_factor": [1.0 + 0.5 * i for i in range(half)],
        "original_max_position_embeddings": 4096,
    }


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("seq_len", [None, 0, 1, 4095, 4096, 4097, 131072])
@pytest.mark.parametrize("factor", [None, 32.0, 1.0])
def test_longrope(dim: int, theta: float, seq_len: int | None, factor: float | None) -> None:
    max_pos = 131072
    hf_params = _longrope_params(dim)
    ours = dict(hf_params)
    if factor is None:
        # HF: factor = config.max_position_embeddings / original_max_position_embeddings
        ours["max_position_embeddings"] = max_pos
    else:
        hf_params["factor"] = ours["factor"] = factor
    got = check_against_hf(
        ours, hf_params, dim=dim, theta=theta, max_position_embeddings=max_pos, seq_len=seq_len
    )
    unscaled = rope_inv_freq(dim, theta)
    is_long = seq_len is not None and seq_len > 4096
    ext = np.array(hf_params["long_factor" if is_long else "short_factor"])
    np.testing.assert_allclose(got, unscaled / ext, rtol=1e-14)
    expected_af = 1.0 if factor == 1.0 else math.sqrt(1 + math.log(32) / math.log(4096))
    assert rope_attention_factor(ours, seq_len=seq_len) == pytest.approx(expected_af, rel=1e-15)


def test_longrope_explicit_attention_factor() -> None:
    params = {**_longrope_params(64), "factor": 32.0, "attention_factor": 1.25}
    check_against_hf(params, params, dim=64, max_position_embeddings=131072, seq_len=9000)
    assert rope_attention_factor(params) == 1.25


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        LLAMA31,
    ],
)
def test_partial_rotary_factor(params: dict[str, Any]) -> None:
    """HF's partial_rotary_factor: rotated dim = int(head_dim * partial_rotary_factor)."""
    hf_params = {**params, "partial_rotary_factor": 0.5}
    if params["rope_type"] == "default":
        # LlamaRotaryEmbedding's default ignores partial_rotary_factor: compare with dim 64
        expected = rope_inv_freq(64, 10000.0, params)
    else:
        expected, _ = hf_rope(hf_params, head_dim=128, max_position_embeddings=131072)
    got = rope_inv_freq(128, 10000.0, hf_params)
    assert got.shape == (32,)
    np.testing.assert_allclose(got, expected, rtol=RTOL)
    np.testing.assert_allclose(got, rope_inv_freq(64, 10000.0, params), rtol=1e-15)


def test_rope_theta_key() -> None:
    params = {**LLAMA31, "rope_theta": 500000.0}
    np.testing.assert_array_equal(
        rope_inv_freq(128, scaling=params), rope_inv_freq(128, 500000.0, LLAMA31)
    )
    np.testing.assert_array_equal(
        rope_inv_freq(128, 500000.0, params), rope_inv_freq(128, 500000.0, LLAMA31)
    )
    with pytest.raises(ValueError, match=r"\[rope_inv_freq\].*theta.*rope_theta"):
        rope_inv_freq(128, 1000.0, params)


# --------------------------------------------------------------------------------------
# p-RoPE
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dim", "p", "kept"),
    [(64, 0.75, 24), (64, 0.0, 0), (64, 1.0, 32), (128, 0.25, 16), (10, 0.5, 2), (200, 0.29, 29)],
)
def test_p_rope(dim: int, p: float, kept: int) -> None:
    got = rope_inv_freq(dim, 10000.0, {"rope_type": "p-rope", "p": p})
    full = rope_inv_freq(dim, 10000.0)
    assert got.shape == (dim // 2,)
    assert got.dtype == np.float64
    assert np.count_nonzero(got == 0.0) == dim // 2 - kept
    # the highest frequencies (first entries) are kept unchanged, the lowest are zero
    np.testing.assert_array_equal(got[:kept], full[:kept])
    np.testing.assert_array_equal(got[kept:], 0.0)
    assert rope_attention_factor({"rope_type": "p-rope", "p": p}) == 1.0


def test_p_rope_matches_hf_proportional() -> None:
    """HF's 'proportional' RoPE truncates the same way (partial_rotary_factor = p)."""
    for dim, p in [(64, 0.75), (128, 0.25), (128, 0.5)]:
        expected, af = hf_rope(
            {"rope_type": "proportional", "partial_rotary_factor": p}, head_dim=dim
        )
        got = rope_inv_freq(dim, 10000.0, {"rope_type": "p-rope", "p": p})
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=0)
        assert af == 1.0


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("prf", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("factor", [None, 2.0])
def test_proportional(dim: int, prf: float, factor: float | None) -> None:
    params: dict[str, Any] = {"rope_type": "proportional", "partial_rotary_factor": prf}
    if factor is not None:
        params["factor"] = factor
    got = check_against_hf(params, params, dim=dim)
    assert got.shape == (dim // 2,)


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def _err(fn: str, *words: str) -> str:
    return r"\[" + fn + r"\]" + "".join(".*" + w for w in words)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "words"),
    [
        ((7,), {}, ValueError, ["dim", "positive even integer", "7"]),
        ((0,), {}, ValueError, ["dim"]),
        ((-4,), {}, ValueError, ["dim"]),
        ((64.0,), {}, TypeError, ["dim"]),
        ((True,), {}, TypeError, ["dim"]),
        (("64",), {}, TypeError, ["dim"]),
        ((64, 0.0), {}, ValueError, ["theta"]),
        ((64, -1.0), {}, ValueError, ["theta"]),
        ((64, float("nan")), {}, ValueError, ["theta"]),
        ((64, float("inf")), {}, ValueError, ["theta"]),
        ((64, "1e4"), {}, TypeError, ["theta"]),
        ((64, 10000.0, [("rope_type", "linear")]), {}, TypeError, ["scaling"]),
        ((64, 10000.0, {"rope_type": "ntk"}), {}, ValueError, ["rope_type", "ntk"]),
        ((64, 10000.0, {"rope_type": 3}), {}, TypeError, ["rope_type"]),
        ((64, 10000.0, {"rope_type": "linear"}), {}, ValueError, ["factor"]),
        ((64, 10000.0, {"rope_type": "linear", "factor": 0.0}), {}, ValueError, ["factor"]),
        ((64, 10000.0, {"rope_type": "linear", "factor": -2}), {}, ValueError, ["factor"]),
        ((64, 10000.0, {"rope_type": "linear", "factor": "2"}), {}, TypeError, ["factor"]),
        (
            (64, 10000.0, {"rope_type": "linear", "factor": float("nan")}),
            {},
            ValueError,
            ["factor"],
        ),
        (
            (64, 10000.0, {"rope_type": "dynamic", "factor": 2.0}),
            {},
            ValueError,
            ["original_max_position_embeddings"],
        ),
        (
            (
                64,
                10000.0,
                {"rope_type": "dynamic", "factor": 0, "original_max_position_embeddings": 4096},
            ),
            {},
            ValueError,
            ["factor"],
        ),
        (
            (64, 10000.0, {"rope_type": "yarn", "factor": 4.0}),
            {},
            ValueError,
            ["original_max_position_embeddings"],
        ),
        (
            (64, 10000.0, {"rope_type": "yarn", "original_max_position_embeddings": 4096}),
            {},
            ValueError,
            ["factor"],
        ),
        (
            (
                64,
                10000.0,
                {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 4096,
                    "truncate": "yes",
                },
            ),
            {},
            TypeError,
            ["truncate"],
        ),
        (
            (64, 10000.0, {k: v for k, v in LLAMA31.items() if k != "low_freq_factor"}),
            {},
            ValueError,
            ["low_freq_factor"],
        ),
        (
            (64, 10000.0, {k: v for k, v in LLAMA31.items() if k != "high_freq_factor"}),
            {},
            ValueError,
            ["high_freq_factor"],
        ),
        ((64, 10000.0, {**LLAMA31, "high_freq_factor": 1.0}), {}, ValueError, ["high_freq_factor"]),
        ((64, 10000.0, {**LLAMA31, "factor": -8.0}), {}, ValueError, ["factor"]),
        (
            (64, 10000.0, {k: v for k, v in _longrope_params(64).items() if k != "long_factor"}),
            {},
            ValueError,
            ["long_factor"],
        ),
        (
            (64, 10000.0, {k: v for k, v in _longrope_params(64).items() if k != "short_factor"}),
            {},
            ValueError,
            ["short_factor"],
        ),
        ((128, 10000.0, _longrope_params(64)), {}, ValueError, ["short_factor", "64"]),
        (
            (128, 10000.0, _longrope_params(64)),
            {"seq_len": 5000},
            ValueError,
            ["long_factor", "64"],
        ),
        (
            (64, 10000.0, {**_longrope_params(64), "short_factor": "abc"}),
            {},
            TypeError,
            ["short_factor"],
        ),
        (
            (64, 10000.0, {**_longrope_params(64), "long_factor": [0.0] * 32}),
            {},
            ValueError,
            ["long_factor"],
        ),
        ((64, 10000.0, {"rope_type": "p-rope"}), {}, ValueError, ["'p'"]),
        ((64, 10000.0, {"rope_type": "p-rope", "p": 1.5}), {}, ValueError, ["'p'", r"\[0, 1\]"]),
        ((64, 10000.0, {"rope_type": "p-rope", "p": -0.1}), {}, ValueError, ["'p'"]),
        ((64, 10000.0, {"rope_type": "p-rope", "p": "0.5"}), {}, TypeError, ["'p'"]),
        (
            (64, 10000.0, {"rope_type": "linear", "factor": 2, "partial_rotary_factor": 1.5}),
            {},
            ValueError,
            ["partial_rotary_factor"],
        ),
        (
            (64, 10000.0, {"rope_type": "default", "partial_rotary_factor": 0.3}),
            {},
            ValueError,
            ["partial_rotary_factor"],
        ),
        (
            (64, 10000.0, {"rope_type": "default", "rope_theta": -1.0}),
            {},
            ValueError,
            ["rope_theta"],
        ),
        ((64,), {"seq_len": -1}, ValueError, ["seq_len"]),
        ((64,), {"seq_len": 10.5}, TypeError, ["seq_len"]),
    ],
)
def test_rope_inv_freq_errors(
    args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], words: list[str]
) -> None:
    with pytest.raises(exc, match=_err("rope_inv_freq", *words)):
        rope_inv_freq(*args, **kwargs)


@pytest.mark.parametrize(
    ("scaling", "kwargs", "exc", "words"),
    [
        ("yarn", {}, TypeError, ["scaling"]),
        ({"rope_type": "nope"}, {}, ValueError, ["rope_type", "nope"]),
        ({"rope_type": "linear"}, {}, ValueError, ["factor"]),
        (
            {"rope_type": "yarn", "factor": -1.0, "original_max_position_embeddings": 8},
            {},
            ValueError,
            ["factor"],
        ),
        (
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 4096,
                "attention_factor": 0.0,
            },
            {},
            ValueError,
            ["attention_factor"],
        ),
        (
            {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            {},
            ValueError,
            ["original_max_position_embeddings"],
        ),
        (
            {
                "rope_type": "longrope",
                "short_factor": [1.0],
                "long_factor": [1.0],
                "original_max_position_embeddings": 4096,
            },
            {},
            ValueError,
            ["factor"],
        ),
        ({"rope_type": "p-rope", "p": 2}, {}, ValueError, ["'p'"]),
        (None, {"seq_len": "5"}, TypeError, ["seq_len"]),
    ],
)
def test_rope_attention_factor_errors(
    scaling: Any, kwargs: dict[str, Any], exc: type[Exception], words: list[str]
) -> None:
    with pytest.raises(exc, match=_err("rope_attention_factor", *words)):
        rope_attention_factor(scaling, **kwargs)


def test_accepts_numpy_scalars_and_returns_fresh_arrays() -> None:
    got = rope_inv_freq(
        np.int64(64), np.float32(10000.0), {"rope_type": "linear", "factor": np.float64(2.0)}
    )
    np.testing.assert_allclose(got, rope_inv_freq(64) / 2.0, rtol=1e-15)
    got[:] = 0.0  # writeable, and does not affect later calls
    assert rope_inv_freq(64)[0] == 1.0
    assert _rope_scaling.ROPE_TYPES[0] == "default"


def test_scaling_dict_not_modified() -> None:
    params = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    snapshot = dict(params)
    rope_inv_freq(64, 10000.0, params)
    rope_attention_factor(params)
    assert params == snapshot
