"""Looking inside a model (``llmkernels.inspect``): ``model(ids, return_attention=True)`` /
``return_stats=True``, the head classes, and the plots of ``llmkernels.plot`` that draw them.

References kept beside the tests:

* the traced forward must give ``model(ids)``'s logits (same weights, same kernels, float32:
  within the logits tolerance of test_modules.py, ``rtol=2e-5, atol=2e-5 * max|logit|``);
* the weights of layer ``l`` are ``softmax(q k^T / sqrt(head_dim) + causal + padding)`` with
  ``q, k = rope(x_l W_q^T), rope(x_l W_k^T)`` of that layer's normed input ``x_l`` — computed
  here with ``llmkernels.reference`` in float64 from the model's state dict (block tolerance
  ``rtol=1e-4, atol=1e-5``);
* the stats are ``sqrt(mean(h**2, axis=-1))`` of the float64 reference forward's hidden states
  around each norm.
"""

from __future__ import annotations

import doctest
import io
from collections.abc import Iterator, Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")

import llmkernels as lk  # noqa: E402
import llmkernels.inspect as li  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _models import llama3_scaling  # noqa: E402
from llmkernels import plot  # noqa: E402
from llmkernels import reference as ref  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402

BLOCK_TOL = {"rtol": 1e-4, "atol": 1e-5}
LOGIT_RTOL = 2e-5  # atol = LOGIT_RTOL * max |logit|, as test_modules.py
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

LLAMA3 = llama3_scaling(4)  # short, so the test positions cross the bands
# name -> extra config: every block variant the trace re-implements
CONFIGS: dict[str, dict[str, Any]] = {
    "pre_rms_gqa": {},
    "post_rms": {"norm_position": "post"},
    "pre_layer_bias": {"norm": "layer", "attention_bias": True, "mlp_bias": True},
    "post_layer_mqa": {"norm": "layer", "norm_position": "post", "n_kv_heads": 1},
    "mha_tied": {"n_kv_heads": 4, "tie_embeddings": True},
    "llama3": {"rope_theta": 500000.0, "rope_scaling": LLAMA3},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_seq_len": 4},
    "yarn": {
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
    },
    # the families' features (a window shorter than the 70-token prompt, q/k norms, fused
    # q/k/v, GeGLU and (1 + w) norms, sandwich norms with capped and rescaled scores)
    "mistral_window": {"model_type": "mistral", "sliding_window": 5},
    "qk_norm": {"qk_norm": True},  # (Qwen3's; a ModelConfig field of any family)
    "phi3_fused": {"model_type": "phi3", "sliding_window": 6},
    "gemma": {
        "model_type": "gemma",
        "activation": "gelu_tanh",
        "norm_unit_offset": True,
        "embed_scale": True,
        "tie_embeddings": True,
    },
    "gemma2": {
        "model_type": "gemma2",
        "activation": "gelu_tanh",
        "norm_unit_offset": True,
        "embed_scale": True,
        "norm_position": "sandwich",
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "attn_softcap": 2.0,
        "final_softcap": 3.0,
        "attn_scale": 0.2,
    },
    # (no partial_rotary_factor: the C++ attention module rotates head_dim / 2 pairs whatever
    # the length of its frequencies)
}


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def config(**extra: Any) -> dict[str, Any]:
    # dim != n_heads * head_dim, odd hidden size: the shapes test_modules.py uses
    cfg = {
        "dim": 48,
        "n_layers": 3,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "hidden_dim": 70,
        "vocab_size": 97,
        "norm_eps": 1e-5,
    }
    cfg.update(extra)
    return cfg


def make_model(cfg: Mapping[str, Any], seed: int = 0) -> lk.Transformer:
    """O(1)-output weights (HF's std-0.02 init makes every layer nearly the identity and every
    head uniform)."""
    model = lk.Transformer(cfg, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for key, arr in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_embeddings:
            continue  # a view of the embedding
        if arr.ndim == 1:
            arr[...] = (0.2 if key.endswith("bias") else 1.0) + 0.2 * rng.standard_normal(arr.shape)
        elif "embed_tokens" in key:
            arr[...] = rng.standard_normal(arr.shape)
        else:
            arr[...] = rng.standard_normal(arr.shape) / np.sqrt(arr.shape[1])
    return model


def assert_logits_close(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape and got.dtype == np.float32
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=LOGIT_RTOL, atol=LOGIT_RTOL * scale)


IDS = np.array([[5, 17, 3, 88, 41, 9, 60, 2, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
# left padding: row 0 has 9 real tokens, row 1 has 5
MASK = np.array([[1] * 9, [0, 0, 0, 0, 1, 1, 1, 1, 1]], dtype=bool)


# --------------------------------------------------------------------------------------
# float64 reference of what the trace sees
# --------------------------------------------------------------------------------------


def ref_trace(
    model: lk.Transformer, ids: np.ndarray, mask: np.ndarray | None
) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray]]:
    """(logits, weights per layer, per-token RMS series) in float64 with llmkernels.reference,
    from the model's state dict: the block formulas of reference.transformer_block."""
    c = model.config
    cfg = c.to_dict() | {"rope_scaling": c.rope_scaling_dict()}
    sd = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    b, t = ids.shape
    key_mask = np.ones((b, t), bool) if mask is None else mask
    pos = np.maximum(np.cumsum(key_mask, axis=1) - 1, 0)  # HF's positions for left padding
    x = sd["model.embed_tokens.weight"][ids]

    def rms(h: np.ndarray) -> np.ndarray:
        return np.where(key_mask, np.sqrt(np.mean(h * h, axis=-1)), np.nan)

    def norm(h: np.ndarray, name: str) -> np.ndarray:
        if c.norm == "rms":
            return ref.rms_norm(h, sd[name + ".weight"], c.norm_eps)
        return ref.layer_norm(h, sd[name + ".weight"], sd[name + ".bias"], c.norm_eps)

    def linear(h: np.ndarray, name: str) -> np.ndarray:
        y = h @ sd[name + ".weight"].T
        return y + sd[name + ".bias"] if name + ".bias" in sd else y

    def attn_weights(h: np.ndarray, prefix: str) -> np.ndarray:
        q = linear(h, prefix + "q_proj").reshape(b, t, c.n_heads, c.head_dim).transpose(0, 2, 1, 3)
        k = linear(h, prefix + "k_proj")
        k = k.reshape(b, t, c.n_kv_heads, c.head_dim).transpose(0, 2, 1, 3)
        scaling = c.rope_scaling_dict()
        inv_freq = lk.rope_inv_freq(c.head_dim, c.rope_theta, scaling, seq_len=int(pos.max()) + 1)
        factor = lk.rope_attention_factor(scaling) if scaling else 1.0
        kw = {"inv_freq": inv_freq, "rotary_dim": 2 * len(inv_freq), "attention_factor": factor}
        q = ref.rope(q, pos[:, None, :], **kw)
        k = ref.rope(k, pos[:, None, :], **kw)
        _, w = ref.attention(
            q, k, k, causal=True, mask=key_mask[:, None, None, :], return_weights=True
        )
        return w

    series: dict[str, list[np.ndarray]] = {name: [] for name in li.STAT_NAMES}
    series["embedding"] = [rms(x)]
    weights = []
    for i in range(c.n_layers):
        prefix = f"model.layers.{i}."
        layer = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
        y = ref.transformer_block(x, layer, cfg, positions=pos, mask=key_mask)
        if c.norm_position == "pre":
            n1 = norm(x, prefix + "input_layernorm")
            weights.append(attn_weights(n1, prefix + "self_attn."))
            h = x + ref._self_attention(n1, layer, cfg, pos, key_mask, None)[0]
            seen = (x, n1, h, norm(h, prefix + "post_attention_layernorm"), y)
        else:
            weights.append(attn_weights(x, prefix + "self_attn."))
            s1 = x + ref._self_attention(x, layer, cfg, pos, key_mask, None)[0]
            h = norm(s1, prefix + "input_layernorm")
            s2 = h + ref._feed_forward(h, layer, cfg)
            seen = (s1, h, s2, y, y)
        for name, value in zip(li.STAT_NAMES, seen, strict=True):
            series[name].append(rms(value))
        x = y
    final = norm(x, "model.norm")
    logits = ref.transformer_forward(ids, sd, cfg, positions=pos, mask=key_mask)
    out = {k: np.stack(v) for k, v in series.items()}
    out["embedding"] = out["embedding"][0]
    out["final_norm_in"], out["final_norm_out"] = rms(x), rms(final)
    return logits, weights, out


# --------------------------------------------------------------------------------------
# the traced forward
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_traced_logits_equal_model_logits(name: str, isa: str) -> None:
    model = make_model(config(**CONFIGS[name]))
    long_ids = np.random.default_rng(1).integers(0, 97, size=(1, 70))  # past a 64-key tile
    cases = ((IDS, None), (IDS, MASK), (IDS[1, :1], None), (IDS[:, ::2], None), (long_ids, None))
    for ids, mask in cases:  # T = 9, padded, T = 1, non-contiguous T = 5, T = 70
        expected = model(ids, mask=mask)
        logits, weights = model(ids, mask=mask, return_attention=True)
        assert_logits_close(logits, expected)
        assert len(weights) == model.config.n_layers
        b, t = np.atleast_2d(ids).shape
        for w in weights:
            assert w.shape == (b, model.config.n_heads, t, t) and w.dtype == np.float32
    logits, stats = model(IDS, return_stats=True, last_only=True)
    assert_logits_close(logits, model(IDS, last_only=True))
    assert isinstance(stats, li.ResidualStats)
    tr = li.trace(model, IDS, mask=MASK)
    assert_logits_close(tr.logits, model(IDS, mask=MASK))
    assert len(tr.attention) == model.config.n_layers and tr.stats.n_layers == 3


def test_trace_with_explicit_positions() -> None:
    """Positions far from 0 (llama3's frequency bands) and per-sequence (B, T) positions."""
    model = make_model(config(rope_theta=500000.0, rope_scaling=LLAMA3))
    for positions in (np.arange(9) + 100, np.stack([np.arange(9), np.arange(9) * 3 + 7])):
        logits, weights = model(IDS, positions=positions, return_attention=True)
        assert_logits_close(logits, model(IDS, positions=positions))
        assert weights[0].shape == (2, 4, 9, 9)


@pytest.mark.parametrize("name", ["pre_rms_gqa", "post_layer_mqa", "dynamic", "yarn"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "leftpad"])
def test_weights_rows_sum_to_one_and_equal_reference(name: str, masked: bool) -> None:
    model = make_model(config(**CONFIGS[name]))
    mask = MASK if masked else None
    _, weights = model(IDS, mask=mask, return_attention=True)
    expected_logits, expected, _ = ref_trace(model, IDS, mask)
    real = np.ones(IDS.shape, bool) if mask is None else mask
    for got, want in zip(weights, expected, strict=True):
        sums = got.astype(np.float64).sum(axis=-1)  # (B, H, T)
        np.testing.assert_allclose(sums[real[:, None, :].repeat(4, 1)], 1.0, rtol=1e-5)
        assert np.all(got[~real[:, None, :].repeat(4, 1)] == 0)  # padded query rows
        assert np.all(np.triu(got, k=1) == 0)  # causal
        np.testing.assert_allclose(got, want, **BLOCK_TOL)
    got_logits = model(IDS, mask=mask)
    np.testing.assert_allclose(got_logits[real], expected_logits[real], **BLOCK_TOL)


def test_attention_weights_helper_is_the_trace() -> None:
    model = make_model(config())
    a = li.attention_weights(model, IDS)
    b = model(IDS, return_attention=True)[1]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------------------
# residual-stream statistics
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pre_rms_gqa", "post_rms", "pre_layer_bias", "post_layer_mqa"])
def test_stats_match_numpy(name: str) -> None:
    model = make_model(config(**CONFIGS[name]))
    stats = li.residual_stats(model, IDS, mask=MASK)
    _, _, expected = ref_trace(model, IDS, MASK)
    assert stats.norm_position == model.config.norm_position
    for key, want in expected.items():
        got = getattr(stats, key)
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # padded tokens
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=key)
    for key in li.STAT_NAMES:
        per_layer = np.array([np.mean(v[MASK]) for v in expected[key]])
        np.testing.assert_allclose(stats.per_layer(key), per_layer, rtol=1e-4)
    residual = [np.mean(expected["embedding"][MASK])] + [
        np.mean(v[MASK]) for v in expected["block_out"]
    ]
    np.testing.assert_allclose(stats.residual(), residual, rtol=1e-4)
    if model.config.norm_position == "pre":
        # pre-norm: the stream entering block l + 1 is what block l put out
        np.testing.assert_array_equal(stats.attn_norm_in[1:], stats.block_out[:-1])
    else:
        np.testing.assert_array_equal(stats.ffn_norm_out, stats.block_out)


def test_stats_pre_norm_grows_post_norm_stays_normalised() -> None:
    """The LLaMA notes' comparison (section 3.1.1): with the same weights, the pre-norm residual
    stream is never normalised (its RMS drifts with depth), the post-norm one is the norm's output
    (RMS 1 for unit norm weights)."""
    cfg = config(n_layers=4, norm_eps=1e-10)  # RMS of a normed row: 1 up to eps / mean(x**2)
    pre = lk.Transformer(cfg, seed=3)
    post = lk.Transformer(cfg | {"norm_position": "post"}, seed=3)
    s_pre = li.residual_stats(pre, IDS)
    s_post = li.residual_stats(post, IDS)
    np.testing.assert_allclose(s_post.residual()[1:], 1.0, rtol=1e-3)
    assert np.all(s_pre.residual() < 0.5)  # the std-0.02 embedding, plus small updates
    np.testing.assert_allclose(s_pre.per_layer("attn_norm_out"), 1.0, rtol=1e-3)


def test_per_layer_rejects_unknown_name() -> None:
    stats = li.residual_stats(make_model(config()), IDS)
    with pytest.raises(ValueError, match=r"^\[ResidualStats.per_layer\] name"):
        stats.per_layer("nope")


# --------------------------------------------------------------------------------------
# head classes on synthetic weights
# --------------------------------------------------------------------------------------


def causal_rows(t: int, pattern: str, rng: np.random.Generator, noise: float = 0.1) -> np.ndarray:
    """A (t, t) causal attention matrix of one pattern, mixed with ``noise`` of random rows."""
    w = np.zeros((t, t))
    for i in range(t):
        if pattern == "first":
            w[i, 0] = 1
        elif pattern == "self":
            w[i, i] = 1
        elif pattern == "previous":
            w[i, max(i - 1, 0)] = 1
        elif pattern == "local":  # spread over the token and the 3 before it, none on itself
            lo = max(i - 3, 0)
            w[i, lo:i] = 1 if i else 0
            w[i, i] = 0 if i else 1
        elif pattern == "uniform":
            w[i, : i + 1] = 1
        elif pattern == "mixed":  # half on the first token, half on the previous two
            w[i, 0] = 0.45
            w[i, max(i - 2, 0) : i + 1] += 0.55 / len(range(max(i - 2, 0), i + 1))
    w /= w.sum(axis=1, keepdims=True)
    r = np.tril(rng.random((t, t)))
    r /= r.sum(axis=1, keepdims=True)
    return (1 - noise) * w + noise * r


PATTERNS = ["first", "self", "previous", "local", "uniform", "mixed"]


@pytest.mark.parametrize("t", [6, 12, 33])
def test_classify_heads_recognises_each_pattern(t: int) -> None:
    rng = np.random.default_rng(t)
    noise = {"uniform": 0.0}  # noise makes uniform rows less uniform than the 0.9 entropy cut
    one_layer = np.stack([causal_rows(t, p, rng, noise.get(p, 0.1)) for p in PATTERNS])
    assert li.classify_heads(one_layer) == PATTERNS
    assert li.classify_heads(one_layer[None]) == PATTERNS  # (B, H, T, T)
    # a list of layers: per layer, per head
    layers = [one_layer, one_layer[::-1]]
    assert li.classify_heads(layers) == [PATTERNS, PATTERNS[::-1]]
    assert set(PATTERNS) <= set(li.HEAD_CLASSES)


def test_classify_heads_thresholds() -> None:
    """Each single-token class starts just above its documented threshold: rows put ``share``
    on the pattern's key and spread the rest over the other keys they see."""
    t = 10
    for pattern, threshold in (
        ("self", li.SELF_THRESHOLD),
        ("first", li.FIRST_THRESHOLD),
        ("previous", li.PREVIOUS_THRESHOLD),
    ):
        for share, is_it in ((threshold + 0.01, True), (threshold - 0.01, False)):
            w = np.zeros((t, t))
            w[0, 0] = 1  # one key: ignored by every measure
            for i in range(1, t):
                key = {"self": i, "first": 0, "previous": i - 1}[pattern]
                w[i, : i + 1] = (1 - share) / i
                w[i, key] = share
            score = li.head_scores(w[None])[pattern][0]
            np.testing.assert_allclose(score, share)
            got = li.classify_heads(w[None])[0]
            assert (got == pattern) == is_it, (pattern, share, got)
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    np.testing.assert_allclose(li.head_scores(uniform[None])["uniform"], 1.0)
    assert li.UNIFORM_THRESHOLD == 0.9 and li.LOCAL_THRESHOLD == 0.7 and li.LOCAL_WINDOW == 4
    # local: mass on the last 4 keys, measured on rows that see more than 4 keys (the rest of
    # the row on the first key, so that it is far from uniform)
    for share, is_local in ((0.72, True), (0.68, False)):
        w = np.zeros((t, t))
        for i in range(t):
            w[i, : i + 1] = 1.0 / (i + 1)
            if i >= 4:
                w[i, : i + 1] = 0
                w[i, 0] = 1 - share
                w[i, i - 3 : i + 1] = share / 4
        np.testing.assert_allclose(li.head_scores(w[None])["local"][0], share)
        assert (li.classify_heads(w[None])[0] == "local") == is_local


def test_classify_heads_left_padding_and_kv_cache_alignment() -> None:
    """With a mask, "first" means the first real token; with Tq < Tk the queries are the last
    Tq positions (bottom-right, as after a KV cache)."""
    t, pad = 10, 3
    w = np.zeros((2, t, t))
    for i in range(pad, t):
        w[0, i, pad] = 1  # the first real token
        w[1, i, i - 1 if i > pad else i] = 1  # the previous real token
    mask = np.arange(t) >= pad
    assert li.classify_heads(w[None], mask=mask[None]) == ["first", "previous"]
    assert li.classify_heads(w[None, :, -4:, :], mask=mask[None]) == ["first", "previous"]
    scores = li.head_scores([w, w], mask=mask)
    assert scores["first"].shape == (2, 2)


def test_classify_real_model_heads_are_known_labels() -> None:
    model = make_model(config())
    _, weights = model(IDS, mask=MASK, return_attention=True)
    labels = li.classify_heads(weights, mask=MASK)
    assert len(labels) == 3 and all(len(row) == 4 for row in labels)
    assert {x for row in labels for x in row} <= set(li.HEAD_CLASSES)


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        (np.ones((4, 4)), {}, ValueError, r"^\[head_scores\] weights must be"),
        (np.ones((1, 5, 4)), {}, ValueError, r"^\[head_scores\] weights must be"),
        (np.full((1, 3, 3), np.nan), {}, ValueError, r"^\[head_scores\] weights must be finite"),
        (-np.ones((1, 3, 3)), {}, ValueError, r"^\[head_scores\] weights must be finite"),
        ([], {}, ValueError, r"^\[head_scores\] weights is an empty list"),
        (np.ones((1, 3, 3)), {"mask": np.ones(4)}, TypeError, r"^\[head_scores\] mask must be"),
        (np.ones((1, 3, 3)), {"mask": np.ones(4, bool)}, ValueError, r"^\[head_scores\] mask"),
    ],
)
def test_classify_heads_errors(weights: Any, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        li.classify_heads(weights, **kwargs)


# --------------------------------------------------------------------------------------
# errors of the hook
# --------------------------------------------------------------------------------------


def test_hook_errors() -> None:
    model = make_model(config())
    with pytest.raises(ValueError, match=r"^\[Transformer\] return_attention/return_stats"):
        model(IDS, cache=model.new_cache(2, 16), return_attention=True)
    with pytest.raises(TypeError, match=r"^\[Transformer\] return_stats must be a bool"):
        model(IDS, return_stats="yes")
    with pytest.raises(ValueError, match=r"^\[Transformer\] ids must be in"):
        model([[1, 500]], return_attention=True)
    for fn in (li.trace, li.attention_weights, li.residual_stats):
        with pytest.raises(TypeError, match=rf"^\[{fn.__name__}\] model must be"):
            fn(lk.TransformerBlock.from_config({"dim": 16, "n_heads": 2, "hidden_dim": 8}), IDS)
    # the plain call is unchanged
    assert isinstance(model(IDS), np.ndarray)


def test_module_doctests() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(li, "llmkernels.inspect", globs={"np": np, "lk": lk})
    assert sum(len(t.examples) for t in tests) >= 5
    for test in tests:
        runner.run(test)
    assert runner.failures == 0


# --------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    return buf.getvalue()


def _image_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_images())]


def test_attention_grid_layers_heads_tokens_labels() -> None:
    model = make_model(config())
    _, weights = model(IDS, mask=MASK, return_attention=True)
    tokens = [f"t{i}" for i in IDS[0]]
    labels = li.classify_heads(weights, mask=MASK)
    fig = plot.attention_grid(weights, tokens, labels=labels, title="heads")
    images = _image_axes(fig)
    assert len(images) == 3 * 4
    assert [ax.get_title() for ax in images[:5]] == [
        f"L0 H0: {labels[0][0]}",
        f"L0 H1: {labels[0][1]}",
        f"L0 H2: {labels[0][2]}",
        f"L0 H3: {labels[0][3]}",
        f"L1 H0: {labels[1][0]}",
    ]
    bottom_left = images[8]
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == tokens
    assert [t.get_text() for t in bottom_left.get_yticklabels()] == tokens
    assert bottom_left.get_xlabel() == "key" and bottom_left.get_ylabel() == "query"
    np.testing.assert_allclose(images[0].get_images()[0].get_array(), weights[0][0, 0])
    (cbar,) = [ax for ax in fig.axes if ax not in images]
    assert cbar.get_ylabel() == "attention weight"
    assert fig._suptitle.get_text() == "heads"
    assert _png(fig).startswith(PNG_MAGIC)

    fig = plot.attention_grid(weights, batch=1, layers=[2], heads=[0, -1])
    images = _image_axes(fig)
    assert [ax.get_title() for ax in images] == ["L2 H0", "L2 H3"]
    np.testing.assert_allclose(images[1].get_images()[0].get_array(), weights[2][1, 3])
    fig = plot.attention_grid([w[0] for w in weights])  # (H, T, T) per layer
    assert len(_image_axes(fig)) == 12


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        (np.ones((2, 1, 3, 3)), {}, TypeError, "one .* array per layer"),
        ([np.ones((3, 3))], {}, ValueError, "must be"),
        ([np.ones((1, 2, 3, 3)), np.ones((1, 2, 4, 4))], {}, ValueError, "same shape"),
        ([np.ones((1, 2, 3, 3))], {"batch": 1}, ValueError, "batch 1 out of range"),
        ([np.ones((1, 2, 3, 3))], {"layers": [1]}, ValueError, "layers 1 out of range"),
        ([np.ones((1, 2, 3, 3))], {"heads": []}, ValueError, "heads must name"),
        ([np.ones((1, 2, 3, 3))], {"tokens": ["a"]}, ValueError, "one label per key"),
        ([np.ones((1, 2, 3, 3))], {"labels": [["a"]]}, ValueError, "labels must be"),
    ],
)
def test_attention_grid_errors(weights: Any, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=r"^\[attention_grid\] .*" + match):
        plot.attention_grid(weights, **kwargs)


def test_residual_rms_pre_vs_post() -> None:
    cfg = config()
    s_pre = li.residual_stats(lk.Transformer(cfg, seed=1), IDS, mask=MASK)
    s_post = li.residual_stats(lk.Transformer(cfg | {"norm_position": "post"}, seed=1), IDS)
    fig = plot.residual_rms({"pre-norm": s_pre, "post-norm": s_post})
    axes = [ax for ax in fig.axes if ax.lines]
    assert [ax.get_title() for ax in axes] == ["pre-norm", "post-norm"]
    ax = axes[0]
    assert ax.get_xlabel() == "layer" and ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in ax.lines}
    np.testing.assert_allclose(
        lines["attention norm: input"].get_ydata(), s_pre.per_layer("attn_norm_in")
    )
    np.testing.assert_allclose(lines["block output"].get_ydata(), s_pre.per_layer("block_out"))
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "FFN norm: output" in legend and "final norm: input" in legend
    assert _png(fig).startswith(PNG_MAGIC)

    fig = plot.residual_rms(s_post, log=False, title=None)
    (ax,) = [ax for ax in fig.axes if ax.lines]
    assert ax.get_title() == "post-norm blocks" and ax.get_yscale() == "linear"


@pytest.mark.parametrize("stats", [{}, [1], {"a": 1}])
def test_residual_rms_errors(stats: Any) -> None:
    with pytest.raises(TypeError, match=r"^\[residual_rms\] stats"):
        plot.residual_rms(stats)


def test_attention_grid_tick_labels_are_literal() -> None:
    """Tokens are shown as they are: a newline as ``\\n``, ``$`` not starting mathtext."""
    w = [np.tril(np.ones((1, 1, 4, 4))) / np.arange(1, 5)[:, None]]
    tokens = ["$x", "\n", "y$", "\t"]
    fig = plot.attention_grid(w, tokens)
    (ax,) = _image_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == [r"\$x", "\\n", r"y\$", "\\t"]
    fig.canvas.draw()  # two unescaped "$" would raise a mathtext error here


def test_tokenizer_output_and_weight_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(config())
    logits, weights = model({"input_ids": IDS, "attention_mask": MASK}, return_attention=True)
    assert_logits_close(logits, model(IDS, mask=MASK))
    np.testing.assert_array_equal(weights[0], model(IDS, mask=MASK, return_attention=True)[1][0])
    # 3 layers x 2 x 4 heads x 9 x 9 float32 = 7776 bytes
    monkeypatch.setattr(li, "MAX_WEIGHT_BYTES", 7775)
    with pytest.raises(ValueError, match=r"^\[Transformer\] return_attention would hold"):
        model(IDS, return_attention=True)
    logits, stats = model(IDS, return_stats=True)  # stats alone keep no weights
    assert_logits_close(logits, model(IDS))


def test_stats_with_a_fully_padded_batch() -> None:
    model = make_model(config())
    stats = li.residual_stats(model, IDS[:, :3], mask=np.zeros((2, 3), bool))
    assert np.all(np.isnan(stats.per_layer("block_out")))  # no real token: NaN, no warning
    assert np.isnan(stats.residual()).all()
