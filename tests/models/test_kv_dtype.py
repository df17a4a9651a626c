"""KV caches stored in bfloat16 / float16.

Contract: keys and values are rounded to nearest even as they are written (``ml_dtypes`` /
NumPy ``astype``), and attention reads them widened to float32 inside the kernel. So:

    attention(q, K16, V16) == attention_f32(q, float32(K16), float32(V16))

up to float32 accumulation order (the kernel runs the float32 arithmetic on the widened
values; on this build the two are bitwise equal for every case here, the tests allow rtol 1e-5).
Reference formula (float64, for one case below):

    s = (q @ k.T) * scale; s[masked] = -inf; p = softmax(s); out = p @ v
"""

from __future__ import annotations

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
from llmkernels import _core

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
KV = {"bfloat16": BF16, "float16": F16}


def _rounded(a: np.ndarray, name: str) -> np.ndarray:
    """float32 array rounded to the cache dtype (ml_dtypes / NumPy: nearest even)."""
    return a.astype(KV[name])


def _ref_attention(q, k, v, causal, window, key_mask, scale):
    """The float64 formula (bottom-right causal, transformers' window), GQA by head groups."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    i = np.arange(tq)[:, None] + tk - tq
    j = np.arange(tk)[None, :]
    allowed = np.ones((tq, tk), bool)
    if causal:
        allowed &= j <= i
    if window:
        allowed &= (i - j) < window
    allowed = allowed[None, None] & key_mask[:, None, None, :]
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    p = np.divide(p, den, out=np.zeros_like(p), where=den > 0)
    return p @ v


def _qkv(rng, b, hq, hkv, tq, tk, d, dv=None):
    dv = d if dv is None else dv
    q = rng.standard_normal((b, hq, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, tk, dv)).astype(np.float32)
    return q, k, v


def _kernel_vs_f32(q, k, v, name, causal=False, window=0, key_mask=None, scale=0.0):
    """(16-bit kernel output, float32 attention over the widened K/V)."""
    k16, v16 = _rounded(k, name), _rounded(v, name)
    got = _core._attention_kv16(
        q,
        np.ascontiguousarray(k16.view(np.uint16)),
        np.ascontiguousarray(v16.view(np.uint16)),
        name,
        causal=causal,
        window=window,
        scale=scale,
        key_mask=None if key_mask is None else key_mask.astype(np.uint8),
    )
    mask = None if key_mask is None else key_mask[:, None, None, :]
    want = lk.attention(
        q,
        k16.astype(np.float32),
        v16.astype(np.float32),
        causal=causal,
        window=window or None,
        mask=mask,
        scale=scale or None,
    )
    return got, want


# --- the kernel: every SIMD path, decode and chunks, tails, GQA, key splits ----------------------

SHAPES = [
    # (B, Hq, Hkv, Tq, Tk, D): decode rows (Tq = 1, a GQA group of 1-8 rows), chunks, tails
    (1, 1, 1, 1, 1, 8),
    (1, 4, 1, 1, 7, 64),
    (2, 8, 2, 1, 33, 16),
    (1, 4, 4, 1, 1025, 32),  # key splits (Tk > 1024), merged in order
    (1, 8, 1, 1, 1100, 64),  # a GQA group of 8 decode rows, key splits
    (1, 2, 1, 1, 31, 7),  # D not a multiple of any vector width: the tile path
    (1, 4, 2, 7, 40, 33),
    (2, 4, 2, 31, 31, 16),
    (1, 2, 1, 65, 100, 64),  # 2 row tiles
    (1, 6, 2, 3, 70, 24),  # 9 rows: past the decode-like tile size
]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_equals_f32_over_rounded_kv(isa, name, shape, causal):
    b, hq, hkv, tq, tk, d = shape
    rng = np.random.default_rng(sum(shape))
    q, k, v = _qkv(rng, b, hq, hkv, tq, tk, d)
    got, want = _kernel_vs_f32(q, k, v, name, causal=causal)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_kernel_window_mask_and_value_width(isa, name):
    rng = np.random.default_rng(5)
    for tq, tk, d, dv, window in [(1, 90, 16, 16, 7), (9, 77, 8, 8, 5), (20, 20, 12, 20, 3)]:
        q, k, v = _qkv(rng, 2, 4, 2, tq, tk, d, dv)
        key_mask = rng.random((2, tk)) > 0.2
        got, want = _kernel_vs_f32(q, k, v, name, causal=True, window=window, key_mask=key_mask)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        ref = _ref_attention(
            q, _rounded(k, name), _rounded(v, name), True, window, key_mask, d**-0.5
        )
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_kernel_exact_path_reads_16_bit(isa, name):
    # a scale outside float32's normal range runs every row the exact (float64) way, and a NaN
    # key sends its rows there too: both read the 16-bit K/V widened
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, 1, 4, 2, 3, 40, 16)
    got, want = _kernel_vs_f32(q, k, v, name, scale=1e-50)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    k[0, 1, 5, 3] = np.nan
    got, want = _kernel_vs_f32(q, k, v, name)
    assert np.isnan(got[0, 2:]).all() and np.isfinite(got[0, :2]).all()
    np.testing.assert_allclose(got[0, :2], want[0, :2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_kernel_bitwise_across_threads(name, threads):
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 1, 8, 2, 1, 1500, 64)
    outs = []
    for n in (1, 2):
        lk.set_num_threads(n)
        outs.append(_kernel_vs_f32(q, k, v, name)[0])
    assert np.array_equal(outs[0], outs[1])


# --- the cache: rounding, dtype of keys()/values(), nbytes ------------------------------------


def _identity_attention(d: int = 8) -> lk.MultiHeadAttention:
    """One KV head of width d whose k and v projections are the identity: at position 0 (RoPE
    is then the identity too) the cached keys and values are the input itself (but -0.0, which
    the projection's sum makes +0.0)."""
    attn = lk.MultiHeadAttention(d, 1, 1, seed=0)
    sd = attn.state_dict()
    eye = np.eye(d, dtype=np.float32)
    sd["k_proj.weight"][...] = eye
    sd["v_proj.weight"][...] = eye
    return attn


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_writes_round_to_nearest_even_like_ml_dtypes(name):
    d = 8
    attn = _identity_attention(d)
    eps = 2.0**-8 if name == "bfloat16" else 2.0**-11  # half an ulp of 1.0 in the dtype
    special = [
        1 + eps, 1 + 3 * eps, -(1 + eps), 1 + eps * 1.0001, 2 - eps / 2,  # ties and near-ties
        65504.0, 65519.0, 65520.0, 7e4, -1e5, 3.3e38,  # float16's largest, its overflow, bf16's
        1e-5, 6e-8, 2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-25, 1e-9, 0.0,  # subnormals
        2e-38, -3e-38,
    ]  # fmt: skip
    rng = np.random.default_rng(8)
    vals = np.concatenate(
        [np.array(special, np.float32), (rng.standard_normal(61) * 10.0 ** rng.integers(-8, 6, 61))]
    ).astype(np.float32)
    vals = np.resize(vals, (len(vals) + d - 1) // d * d).reshape(1, -1, d)
    t = vals.shape[1]
    cache = attn.new_cache(1, t, dtype=name)
    with np.errstate(over="ignore"):  # float16 overflow rounds to inf, as in the cache
        want = _rounded(vals, name)
    attn(vals, positions=np.zeros((1, t), np.int64), cache=cache)
    keys, values = cache.keys(), cache.values()
    assert keys.dtype == KV[name] and values.dtype == KV[name]
    assert keys.shape == (1, 1, t, d)
    assert np.array_equal(keys[0, 0].view(np.uint16), want[0].view(np.uint16))
    assert np.array_equal(values[0, 0].view(np.uint16), want[0].view(np.uint16))


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_cache_holds_the_rounded_float32_keys(name):
    attn = lk.MultiHeadAttention(32, 4, 2, seed=0)
    x = np.random.default_rng(9).standard_normal((2, 11, 32)).astype(np.float32)
    c32, c16 = attn.new_cache(2, 16), attn.new_cache(2, 16, dtype=name)
    attn(x, cache=c32)
    attn(x, cache=c16)
    assert c16.dtype == name and c32.dtype == "float32"
    for got, full in ((c16.keys(), c32.keys()), (c16.values(), c32.values())):
        assert got.dtype == KV[name]
        assert np.array_equal(got.view(np.uint16), _rounded(full, name).view(np.uint16))


@pytest.mark.parametrize("dtype", [None, "float32", "bfloat16", "float16"])
def test_nbytes_and_dtype(dtype):
    model = lk.Transformer(
        {"dim": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64,
         "vocab_size": 50},
        seed=0,
    )  # fmt: skip
    cache = model.new_cache(2, 20, dtype=dtype)
    item = 4 if dtype in (None, "float32") else 2
    per_layer = 2 * 2 * 20 * 2 * 8 * item  # K and V of (B, Hkv, slots, head_dim)
    assert cache.nbytes == 3 * per_layer
    assert all(c.nbytes == per_layer for c in cache.layers)
    assert cache.dtype == (dtype or "float32")
    if dtype in ("bfloat16", "float16"):
        assert f"dtype={dtype}" in repr(cache.layers[0])


@pytest.mark.parametrize(
    "spec, name",
    [
        (np.float16, "float16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        ("bf16", "bfloat16"),
        ("half", "float16"),
        (np.dtype(np.float32), "float32"),
    ],
)
def test_dtype_spellings(spec, name):
    attn = lk.MultiHeadAttention(16, 2, seed=0)
    assert attn.new_cache(1, 4, dtype=spec).dtype == name


def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    attn = lk.MultiHeadAttention(16, 2, seed=0)
    assert attn.new_cache(1, 4, dtype=torch.bfloat16).dtype == "bfloat16"
    assert attn.new_cache(1, 4, dtype=torch.float16).dtype == "float16"


# --- through the modules: chunks, decode, rolling caches, generation --------------------------


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_module_attends_over_the_rounded_cache(isa, name):
    # MultiHeadAttention with a 16-bit cache == float32 attention (the functional op) over the
    # cache's rounded keys and values, for a prefill chunk and a decode step. Reference:
    # q = rope(x Wq^T), out = attention(q, float32(K16), float32(V16), causal) Wo^T
    attn = lk.MultiHeadAttention(32, 4, 2, seed=0)  # head_dim 8, GQA groups of 2
    sd = attn.state_dict()
    x = np.random.default_rng(14).standard_normal((1, 12, 32)).astype(np.float32)
    cache = attn.new_cache(1, 12, dtype=name)
    got = [attn(x[:, :9], cache=cache), attn(x[:, 9:10], cache=cache)]
    k = cache.keys().astype(np.float32)[:, :, :10]
    v = cache.values().astype(np.float32)[:, :, :10]
    for out, t0, t1 in ((got[0], 0, 9), (got[1], 9, 10)):
        q = (x[:, t0:t1] @ sd["q_proj.weight"].T).reshape(1, t1 - t0, 4, 8).transpose(0, 2, 1, 3)
        q = lk.rope(q, positions=np.arange(t0, t1))
        a = lk.attention(q, k[:, :, :t1], v[:, :, :t1], causal=True)
        want = a.transpose(0, 2, 1, 3).reshape(1, t1 - t0, 32) @ sd["o_proj.weight"].T
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_decode_equals_prefill_with_16_bit_cache(name):
    # the same rounded K/V whichever way the tokens arrive: outputs agree up to summation order
    block = lk.TransformerBlock.from_config(
        {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 64}, seed=1
    )
    x = np.random.default_rng(10).standard_normal((2, 19, 32)).astype(np.float32)
    full = block(x, cache=block.new_cache(2, 19, dtype=name))
    cache = block.new_cache(2, 19, dtype=name)
    outs, t0 = [], 0
    for c in [5, 1, 1, 7, 1, 4]:
        outs.append(block(x[:, t0 : t0 + c], cache=cache))
        t0 += c
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("window", [1, 3, 6])
def test_rolling_cache(name, window):
    # a rolling cache (window slots) equals a plain cache of the same dtype on the same layer,
    # for chunks that wrap the ring, and keeps the last `window` rounded keys
    attn = lk.MultiHeadAttention(32, 4, 2, window=window, seed=0)
    x = np.random.default_rng(11).standard_normal((2, 23, 32)).astype(np.float32)
    plain = lk.KVCache(2, 32, attn.n_kv_heads, attn.head_dim, dtype=name)
    want = attn(x, cache=plain)
    rolling = attn.new_cache(2, 32, dtype=name)
    assert rolling._impl.slots == window and rolling.dtype == name
    outs, t0 = [], 0
    for c in [3, 1, 7, 2, 1, 9]:
        outs.append(attn(x[:, t0 : t0 + c], cache=rolling))
        t0 += c
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-5, atol=1e-5)
    assert rolling.keys().dtype == KV[name]
    assert np.array_equal(
        rolling.keys().view(np.uint16), plain.keys()[:, :, -window:].view(np.uint16)
    )
    assert np.array_equal(
        rolling.values().view(np.uint16), plain.values()[:, :, -window:].view(np.uint16)
    )


def _small_model() -> lk.Transformer:
    return lk.Transformer(
        {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128,
         "vocab_size": 97, "max_seq_len": 256},
        seed=3,
    )  # fmt: skip


def _decode_logits(model, ids, steps, kv_dtype):
    cache = model.new_cache(1, ids.shape[1] + steps, dtype=kv_dtype)
    logits = [model(ids, cache=cache, last_only=True)[:, -1]]
    for _ in range(steps - 1):
        nxt = logits[-1].argmax(-1)
        logits.append(model(nxt[:, None], cache=cache, last_only=True)[:, -1])
    return np.stack(logits, 1)


# Measured on this model (prompt 40 + 24 decode steps, 2 layers; logits' std 0.159): max
# |logit difference| vs a float32 cache 2.8e-4 = 1.8e-3 std for bfloat16 (8-bit significand:
# relative rounding <= 2^-9) and 5.6e-5 = 3.5e-4 std for float16 (2^-12). Asserted with ~10x
# margin, relative to the logits' std: 2e-2 (bf16), 4e-3 (f16). The smallest top-2 logit gap
# of the greedy run is 3.9e-3, 14x the bf16 error: the greedy tokens are the same.
KV_LOGIT_TOL = {"bfloat16": 2e-2, "float16": 4e-3}


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_generate_logits_close_to_float32_cache(name):
    model = _small_model()
    ids = np.random.default_rng(12).integers(0, 97, (1, 40))
    ref = _decode_logits(model, ids, 24, None)
    got = _decode_logits(model, ids, 24, name)
    scale = ref.std()
    assert np.abs(got - ref).max() <= KV_LOGIT_TOL[name] * scale
    # greedy decoding: the same tokens on this model (its top-2 margins are far above the error)
    g32 = model.generate(ids, 24)
    g16 = model.generate(ids, 24, kv_dtype=name)
    assert np.array_equal(g32, g16)


def test_generate_bitwise_across_threads(threads):
    model = _small_model()
    ids = np.random.default_rng(13).integers(0, 97, (2, 30))
    outs = []
    for n in (1, 2):
        lk.set_num_threads(n)
        outs.append(_decode_logits(model, ids[:1], 12, "bfloat16"))
        outs.append(model.generate(ids, 8, kv_dtype="bfloat16"))
    assert np.array_equal(outs[0], outs[2]) and np.array_equal(outs[1], outs[3])


# --- bad dtypes -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["int8", "float64", np.int32, "bfloat", 3, object()])
def test_bad_dtype(bad):
    attn = lk.MultiHeadAttention(16, 2, seed=0)
    with pytest.raises(ValueError, match=r"^\[new_cache\] dtype must be"):
        attn.new_cache(1, 4, dtype=bad)
    model = _small_model()
    with pytest.raises(ValueError, match=r"^\[new_cache\] dtype must be"):
        model.new_cache(1, 4, dtype=bad)
    with pytest.raises(ValueError, match=r"^\[generate\] kv_dtype must be"):
        model.generate(np.zeros((1, 3), np.int64), 2, kv_dtype=bad)
    with pytest.raises(ValueError, match=r"^\[KVCache\] dtype must be"):
        lk.KVCache(1, 4, 1, 8, dtype=bad)


def test_text_generation_kv_dtype(tmp_path):
    from llmkernels.text import write_tiny_model

    model, tok = lk.load(write_tiny_model(str(tmp_path)))
    text = lk.generate(model, tok, "Hello", max_tokens=6, kv_dtype="bfloat16")
    assert isinstance(text, str)
    pieces = lk.stream_generate(model, tok, "Hello", max_tokens=6, kv_dtype="float16")
    assert isinstance("".join(p.text for p in pieces), str)
    assert len(lk.generate(model, tok, ["Hello", "Hi"], max_tokens=3, kv_dtype="bf16")) == 2
    chat = lk.ChatSession(model, tok, kv_dtype="float16")
    "".join(r.text for r in chat.send("Hi", max_tokens=3))
    assert chat.kv_dtype == "float16" and chat._cache.dtype == "float16"
    for fn, call in [
        ("generate", lambda: lk.generate(model, tok, "Hello", 2, kv_dtype="int8")),
        ("stream_generate", lambda: lk.stream_generate(model, tok, "Hello", 2, kv_dtype="int8")),
        ("ChatSession", lambda: lk.ChatSession(model, tok, kv_dtype="int8")),
    ]:
        with pytest.raises(ValueError, match=rf"^\[{fn}\] kv_dtype must be"):
            call()


def test_bench_kv_dtype_quick(tmp_path):
    """benchmarks/bench_kv_dtype.py --quick runs (outputs checked inside; no figure asserted)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "kv.md"
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_kv_dtype.py"), "--quick",
         "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=root, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and "ms" in r]
    assert len(rows) == 2
