"""Bad input: every invalid call raises ValueError/TypeError whose message names the function
and the argument, and leaves a given `out` untouched."""

from __future__ import annotations

import llmkernels as lk
import numpy as np
import pytest

X = np.ones((4, 8), np.float32)
W = np.ones(8, np.float32)
SENTINEL = 7.25


def fresh_out(shape=(4, 8), dtype=np.float32) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


def readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# (id, call taking `out` (may ignore it), exception type, regex the message must match)
CASES = [
    # rms_norm
    (
        "rms_weight_shape",
        lambda o: lk.rms_norm(X, np.ones(7, np.float32), out=o),
        ValueError,
        r"^\[rms_norm\] weight must have shape \(8,\), got \(7,\)",
    ),
    (
        "rms_weight_2d",
        lambda o: lk.rms_norm(X, np.ones((1, 8)), out=o),
        ValueError,
        r"^\[rms_norm\] weight must have shape",
    ),
    (
        "rms_out_shape",
        lambda o: lk.rms_norm(X, W, out=np.zeros((4, 9), np.float32)),
        ValueError,
        r"^\[rms_norm\] out must have shape \(4, 8\)",
    ),
    (
        "rms_out_dtype",
        lambda o: lk.rms_norm(X, W, out=np.zeros((4, 8))),
        TypeError,
        r"^\[rms_norm\] out must have dtype float32",
    ),
    (
        "rms_out_fortran",
        lambda o: lk.rms_norm(X, W, out=np.zeros((4, 8), np.float32, order="F")),
        ValueError,
        r"^\[rms_norm\] out must be C-contiguous",
    ),
    (
        "rms_out_readonly",
        lambda o: lk.rms_norm(X, W, out=readonly(fresh_out())),
        ValueError,
        r"^\[rms_norm\] out must be writeable",
    ),
    (
        "rms_out_list",
        lambda o: lk.rms_norm(X, W, out=[[0.0] * 8] * 4),
        TypeError,
        r"^\[rms_norm\] out must be a numpy.ndarray",
    ),
    (
        "rms_complex",
        lambda o: lk.rms_norm(X.astype(np.complex64), out=o),
        TypeError,
        r"^\[rms_norm\] x has unsupported dtype complex64",
    ),
    (
        "rms_object",
        lambda o: lk.rms_norm(np.array([[1, "a"]], dtype=object), out=o),
        TypeError,
        r"^\[rms_norm\] x has unsupported dtype object",
    ),
    (
        "rms_string",
        lambda o: lk.rms_norm(np.array([["a", "b"]]), out=o),
        TypeError,
        r"^\[rms_norm\] x has unsupported dtype <U1",
    ),
    (
        "rms_weight_complex",
        lambda o: lk.rms_norm(X, W.astype(complex), out=o),
        TypeError,
        r"^\[rms_norm\] weight has unsupported dtype",
    ),
    (
        "rms_negative_eps",
        lambda o: lk.rms_norm(X, W, eps=-1e-6, out=o),
        ValueError,
        r"^\[rms_norm\] eps must be a finite number >= 0",
    ),
    (
        "rms_nan_eps",
        lambda o: lk.rms_norm(X, W, eps=float("nan"), out=o),
        ValueError,
        r"^\[rms_norm\] eps",
    ),
    (
        "rms_str_eps",
        lambda o: lk.rms_norm(X, W, eps="1e-6", out=o),
        TypeError,
        r"^\[rms_norm\] eps must be a real number",
    ),
    (
        "rms_0d",
        lambda o: lk.rms_norm(np.float32(1.0)),
        ValueError,
        r"^\[rms_norm\] x must have at least 1 dimension",
    ),
    (
        "rms_ragged",
        lambda o: lk.rms_norm([[1.0, 2.0], [3.0]]),
        TypeError,
        r"^\[rms_norm\] x could not be converted",
    ),
    # layer_norm
    (
        "ln_bias_shape",
        lambda o: lk.layer_norm(X, W, np.ones(9, np.float32), out=o),
        ValueError,
        r"^\[layer_norm\] bias must have shape \(8,\), got \(9,\)",
    ),
    (
        "ln_weight_shape",
        lambda o: lk.layer_norm(X, np.ones(3), out=o),
        ValueError,
        r"^\[layer_norm\] weight must have shape \(8,\)",
    ),
    (
        "ln_negative_eps",
        lambda o: lk.layer_norm(X, eps=-1.0, out=o),
        ValueError,
        r"^\[layer_norm\] eps",
    ),
    (
        "ln_out_readonly",
        lambda o: lk.layer_norm(X, out=readonly(fresh_out())),
        ValueError,
        r"^\[layer_norm\] out must be writeable",
    ),
    # silu / swiglu
    ("silu_complex", lambda o: lk.silu(X + 1j, out=o), TypeError, r"^\[silu\] x has unsupported"),
    (
        "silu_out_dtype",
        lambda o: lk.silu(X, out=np.zeros((4, 8), np.float64)),
        TypeError,
        r"^\[silu\] out must have dtype float32",
    ),
    (
        "silu_out_shape",
        lambda o: lk.silu(X, out=np.zeros((8, 4), np.float32)),
        ValueError,
        r"^\[silu\] out must have shape",
    ),
    (
        "swiglu_shape",
        lambda o: lk.swiglu(X, np.ones((4, 7), np.float32), out=o),
        ValueError,
        r"^\[swiglu\] up must have the shape of gate",
    ),
    (
        "swiglu_up_object",
        lambda o: lk.swiglu(X, X.astype(object), out=o),
        TypeError,
        r"^\[swiglu\] up has unsupported dtype object",
    ),
    (
        "swiglu_out_noncontig",
        lambda o: lk.swiglu(X, X, out=np.zeros((4, 16), np.float32)[:, ::2]),
        ValueError,
        r"^\[swiglu\] out must be C-contiguous",
    ),
    # swiglu_ffn
    (
        "ffn_w_gate",
        lambda o: lk.swiglu_ffn(X, np.ones((7, 3)), np.ones((7, 3))),
        ValueError,
        r"^\[swiglu_ffn\] w_gate must have shape \(8, hidden\), got \(7, 3\)",
    ),
    (
        "ffn_w_up",
        lambda o: lk.swiglu_ffn(X, np.ones((8, 3)), np.ones((8, 4))),
        ValueError,
        r"^\[swiglu_ffn\] w_up must have shape \(8, 3\)",
    ),
    (
        "ffn_w_down",
        lambda o: lk.swiglu_ffn(X, np.ones((8, 3)), np.ones((8, 3)), np.ones((4, 2))),
        ValueError,
        r"^\[swiglu_ffn\] w_down must have shape \(3, out\)",
    ),
    (
        "ffn_b_gate",
        lambda o: lk.swiglu_ffn(X, np.ones((8, 3)), np.ones((8, 3)), b_gate=np.ones(2)),
        ValueError,
        r"^\[swiglu_ffn\] b_gate must have shape \(3,\)",
    ),
    (
        "ffn_b_down_alone",
        lambda o: lk.swiglu_ffn(X, np.ones((8, 3)), np.ones((8, 3)), b_down=np.ones(2)),
        ValueError,
        r"^\[swiglu_ffn\] b_down was given but w_down is None",
    ),
    (
        "ffn_complex",
        lambda o: lk.swiglu_ffn(X, np.ones((8, 3)) * 1j, np.ones((8, 3))),
        TypeError,
        r"^\[swiglu_ffn\] w_gate has unsupported dtype",
    ),
    # rope
    (
        "rope_odd_rotary",
        lambda o: lk.rope(X, rotary_dim=5, out=o),
        ValueError,
        r"^\[rope\] rotary_dim must be even, got 5",
    ),
    (
        "rope_odd_d",
        lambda o: lk.rope(np.ones((4, 7), np.float32)),
        ValueError,
        r"^\[rope\] rotary_dim \(default D=7\) must be even",
    ),
    (
        "rope_rotary_too_big",
        lambda o: lk.rope(X, rotary_dim=10, out=o),
        ValueError,
        r"^\[rope\] rotary_dim must be in \[0, D=8\], got 10",
    ),
    (
        "rope_rotary_float",
        lambda o: lk.rope(X, rotary_dim=4.0, out=o),
        TypeError,
        r"^\[rope\] rotary_dim must be an int",
    ),
    (
        "rope_positions_shape",
        lambda o: lk.rope(X, np.arange(5), out=o),
        ValueError,
        r"^\[rope\] positions must have shape \(T,\) or be broadcastable to "
        r"x.shape\[:-1\] = \(4,\)",
    ),
    (
        "rope_positions_float",
        lambda o: lk.rope(X, np.arange(4.0), out=o),
        TypeError,
        r"^\[rope\] positions must be an integer array, got dtype float64",
    ),
    (
        "rope_positions_2d_bad",
        lambda o: lk.rope(np.ones((2, 3, 4, 8)), np.zeros((2, 4), int)),
        ValueError,
        r"^\[rope\] positions must have shape.*per-batch positions .* are \(B, 1, T\)",
    ),
    (
        "rope_inv_freq_shape",
        lambda o: lk.rope(X, inv_freq=np.ones(3), out=o),
        ValueError,
        r"^\[rope\] inv_freq must have shape \(rotary_dim/2,\) = \(4,\), got \(3,\)",
    ),
    (
        "rope_inv_freq_nan",
        lambda o: lk.rope(X, inv_freq=[np.nan] * 4, out=o),
        ValueError,
        r"^\[rope\] inv_freq must be finite",
    ),
    (
        "rope_theta",
        lambda o: lk.rope(X, theta=0.0, out=o),
        ValueError,
        r"^\[rope\] theta must be > 0",
    ),
    (
        "rope_attention_factor",
        lambda o: lk.rope(X, attention_factor=float("inf"), out=o),
        ValueError,
        r"^\[rope\] attention_factor must be finite",
    ),
    (
        "rope_1d",
        lambda o: lk.rope(np.ones(8)),
        ValueError,
        r"^\[rope\] x must have shape \(\.\.\., T, D\)",
    ),
    (
        "rope_complex",
        lambda o: lk.rope(X.astype(np.complex128), out=o),
        TypeError,
        r"^\[rope\] x has unsupported dtype complex128",
    ),
    (
        "rope_out_dtype",
        lambda o: lk.rope(X, out=np.zeros((4, 8))),
        TypeError,
        r"^\[rope\] out must have dtype float32",
    ),
    (
        "rope_interleaved_str",
        lambda o: lk.rope(X, interleaved="yes", out=o),
        TypeError,
        r"^\[rope\] interleaved must be a bool",
    ),
    # runtime
    ("threads_zero", lambda o: lk.set_num_threads(0), ValueError, r"^\[set_num_threads\] n"),
    ("arch_bogus", lambda o: lk.set_simd_arch("neon"), ValueError, r"^\[set_simd_arch\] arch"),
]


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_raises_and_leaves_out_untouched(call, exc, pattern):
    out = fresh_out()
    with pytest.raises(exc, match=pattern):
        call(out)
    assert np.all(out == SENTINEL), "out was written by a call that raised"


def test_core_rejects_bad_operands_directly():
    """_core itself never reaches a kernel with bad operands (no crash if called directly)."""
    from llmkernels import _core

    x = np.ones((4, 8), np.float32)
    with pytest.raises(TypeError, match=r"\[rms_norm\] out has dtype"):
        _core.rms_norm(x, None, 1e-6, np.ones((4, 8)))
    with pytest.raises(ValueError, match=r"\[rms_norm\] x must be C-contiguous"):
        _core.rms_norm(np.ones((8, 4), np.float32).T, None, 1e-6, np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match=r"\[rope\] table_row entry out of range"):
        c, s = _core.rope_tables(np.arange(2), np.ones(4), 1.0, np.dtype(np.float32))
        _core.rope(x, np.array([0, 1, 2, 3]), c, s, 8, False, np.empty_like(x))
    with pytest.raises(ValueError, match=r"\[swiglu_ffn\] w_gate"):
        _core.swiglu_ffn(
            x, np.ones((3, 3), np.float32), np.ones((3, 3), np.float32), None, None, None, None
        )


def test_core_stub_is_current():
    """python/llmkernels/_core.pyi is generated (make stubs): it lists every _core function."""
    from pathlib import Path

    from llmkernels import _core

    stub = (Path(lk.__file__).parent / "_core.pyi").read_text()
    for name in dir(_core):
        obj = getattr(_core, name)
        if name.startswith("__") or not callable(obj):
            continue
        entry = f"class {name}" if isinstance(obj, type) else f"def {name}("
        assert entry in stub, f"_core.{name} missing from _core.pyi: run `make stubs`"
        if isinstance(obj, type):  # and its public methods
            for meth in vars(obj):
                if not meth.startswith("_") and callable(getattr(obj, meth)):
                    assert f"def {meth}(" in stub, f"_core.{name}.{meth} missing from _core.pyi"


# --- modules: Python converts (and holds the cache's lock); the C++ entry checks, once --------

CFG = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64, "vocab_size": 50}


def _model() -> lk.Transformer:
    return lk.Transformer(CFG, seed=0)


def _full_cache(model: lk.Transformer) -> lk.ModelCache:
    cache = model.new_cache(1, 4)
    model(np.arange(4)[None], cache=cache)
    return cache


def _block_call(cache_len: int, t: int) -> None:
    block = _model().blocks[0]
    cache = block.attention.new_cache(1, cache_len)
    block(np.ones((1, t, 32), np.float32), cache=cache)


MODULE_CASES = [
    (
        "ids_range",
        lambda m: m(np.array([[1, 50]])),
        r"^\[Transformer\] ids must be in \[0, vocab_size=50\), got 50$",
    ),
    (
        "ids_negative",
        lambda m: m(np.array([-1, 2])),
        r"^\[Transformer\] ids must be in \[0, vocab_size=50\), got -1$",
    ),
    (
        "decode_ids_range",
        lambda m: m.decode([3, 70], [m.new_cache(1, 8), m.new_cache(1, 8)]),
        r"^\[Transformer\.decode\] ids must be in \[0, vocab_size=50\), got 70$",
    ),
    (
        "model_cache_full",
        lambda m: m(np.array([[1]]), cache=_full_cache(m)),
        r"^\[Transformer\] KV cache is full: 4 cached \+ 1 new tokens > max_seq_len 4$",
    ),
    (
        "decode_cache_full",
        lambda m: m.decode([1], [_full_cache(m)]),
        r"^\[Transformer\.decode\] KV cache is full: 4 cached \+ 1 new tokens > max_seq_len 4$",
    ),
    (
        "block_cache_full",
        lambda m: _block_call(2, 3),
        r"^\[TransformerBlock\] KV cache is full: 0 cached \+ 3 new tokens > max_seq_len 2$",
    ),
    (
        "group_value",
        lambda m: lk.MultiHeadAttention(64, 4, dtype="int8", group_size=48),
        r"^\[MultiHeadAttention\] group_size must be 32, 64 or 128, got 48$",
    ),
    (
        "group_divides",
        lambda m: lk.FeedForward(48, 96, dtype="int4"),
        r"^\[FeedForward\] group_size=32 does not divide dim=48: every projection's input ",
    ),
    (
        "group_names_the_entry",  # the block's layers are built inside Transformer(...)
        lambda m: lk.Transformer(dict(CFG, dim=64, hidden_dim=96), dtype="int8", group_size=64),
        r"^\[Transformer\] group_size=64 does not divide hidden_dim=96",
    ),
    (
        "group_quantize",
        lambda m: lk.FeedForward(64, 96).quantize(8, 64),
        r"^\[FeedForward\.quantize\] group_size=64 does not divide hidden_dim=96",
    ),
    (
        "group_core_entry",  # the C++ entry checks on its own too
        lambda m: lk._core.FeedForwardImpl(48, 96, False, False, "int8", 32),
        r"^\[FeedForward\] group_size=32 does not divide dim=48",
    ),
    (
        "model_cache_batch",
        lambda m: m(np.ones((2, 3), np.int64), cache=m.new_cache(3, 8)),
        r"^\[Transformer\] cache holds 3 sequences, the input has 2$",
    ),
]


@pytest.mark.parametrize(
    "call,pattern", [c[1:] for c in MODULE_CASES], ids=[c[0] for c in MODULE_CASES]
)
def test_module_errors(call, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        call(_model())


def test_refused_module_call_changes_nothing() -> None:
    """A call the C++ entry refuses leaves the cache and a dynamic RoPE schedule as they were:
    the next call gives what it gives without the refused one."""
    cfg = dict(
        CFG,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4},
    )
    model, twin = lk.Transformer(cfg, seed=0), lk.Transformer(cfg, seed=0)
    cache, twin_cache = model.new_cache(1, 6), twin.new_cache(1, 6)
    ids = np.arange(5)[None]
    model(ids, cache=cache)
    twin(ids, cache=twin_cache)
    with pytest.raises(ValueError, match="KV cache is full"):  # positions 5-7: would grow
        model(np.array([[1, 2, 3]]), cache=cache)
    with pytest.raises(ValueError, match="ids must be in"):
        model(np.array([[1, 99]]), cache=cache)
    assert cache.length == 5 and cache.next_positions.tolist() == [5]
    np.testing.assert_array_equal(
        model(ids[:, :1], cache=cache), twin(ids[:, :1], cache=twin_cache)
    )
