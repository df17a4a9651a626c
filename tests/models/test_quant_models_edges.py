"""Quantized models at their edges (found by an adversarial review): a failed
``load_state_dict`` of a tied, quantized model changes nothing; a model whose blocks were
quantized on their own is refused by ``save_pretrained`` (it wrote a checkpoint nothing could
load); a state dict giving one matrix twice (float and quantized) is refused."""

from __future__ import annotations

from pathlib import Path

import llmkernels as lk
import numpy as np
import pytest

CFG = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128,
       "vocab_size": 96, "max_seq_len": 64}  # fmt: skip


@pytest.mark.parametrize("bad", [np.inf, np.nan, 2e7])
def test_tied_quantized_load_that_fails_changes_nothing(bad: float) -> None:
    m = lk.Transformer({**CFG, "tie_embeddings": True}, seed=0, dtype="int8")
    before = {k: v.copy() for k, v in m.state_dict().items()}
    e = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    e[5, 5] = bad  # non-finite, or finite but needing an int8 scale beyond float16
    with pytest.raises(ValueError, match=r"^\[Transformer.load_state_dict\] lm_head \(the tied"):
        m.load_state_dict({"model.embed_tokens.weight": e}, strict=False)
    after = m.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_save_pretrained_refuses_a_partly_quantized_model(tmp_path: Path) -> None:
    m = lk.Transformer(CFG, seed=0)
    m.blocks[1].feed_forward.quantize(4)
    with pytest.raises(ValueError, match=r"^\[save_pretrained\] the model mixes quantized"):
        m.save_pretrained(tmp_path / "a")
    # once the whole model is quantized it saves and loads back
    m.quantize(4)
    m.save_pretrained(tmp_path / "c")
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(lk.Transformer.from_pretrained(tmp_path / "c")(ids), m(ids))


def test_a_matrix_given_twice_is_refused() -> None:
    ffn = lk.FeedForward(64, 128, seed=0).quantize(8)
    sd = dict(ffn.state_dict())
    sd["up_proj.weight"] = np.zeros((128, 64), np.float32)
    with pytest.raises(KeyError, match=r"up_proj.weight and up_proj.qweight"):
        ffn.load_state_dict(sd)


# ------------------------------------------------------------------------------------------
# edges found by an adversarial pass (session 12)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 9, 17])
@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_quantized_linear_of_an_empty_inner_dimension(m, activations):
    """k = 0: an empty sum, the bias (was a floating-point exception or uninitialised memory
    in the kernel, a NumPy reshape error in the wrapper)."""
    x = np.ones((m, 0), np.float32)
    bias = np.array([1.0, 2.0, 3.0], np.float32)
    for bits, codes in ((8, np.zeros((3, 0), np.int8)), (4, np.zeros((3, 0), np.uint8))):
        scales = np.zeros((3, 0), np.float16)
        y = lk.quantized_linear(x, codes, scales, bits, 32, bias=bias, activations=activations)
        np.testing.assert_array_equal(y, np.broadcast_to(bias, (m, 3)))
        y = lk.quantized_linear(x, codes, scales, bits, 32, activations=activations)
        np.testing.assert_array_equal(y, np.zeros((m, 3), np.float32))


def test_quantize_takes_bfloat16(rng):
    """A bf16 model's state_dict holds ml_dtypes.bfloat16 arrays: quantize and
    quantized_linear widen them (exactly) as float16 ones."""
    import ml_dtypes

    w = rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    q, s = lk.quantize(w, 8, 32)
    q32, s32 = lk.quantize(w.astype(np.float32), 8, 32)
    np.testing.assert_array_equal(q, q32)
    np.testing.assert_array_equal(s, s32)
    x = rng.standard_normal((3, 64)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        lk.quantized_linear(x, q, s, 8, 32), lk.quantized_linear(x.astype(np.float32), q, s, 8, 32)
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_quantize_takes_torch_low_precision_tensors(rng, dtype):
    """torch bf16 tensors were refused ("Got unsupported ScalarType BFloat16") though the
    functional ops take them: widened exactly, as their NumPy twins."""
    import torch

    w = torch.from_numpy(rng.standard_normal((8, 64)).astype(np.float32)).to(getattr(torch, dtype))
    w32 = w.float().numpy()
    q, s = lk.quantize(w, 8, 32)
    q32, s32 = lk.quantize(w32, 8, 32)
    np.testing.assert_array_equal(q, q32)
    np.testing.assert_array_equal(s, s32)
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).to(getattr(torch, dtype))
    bias = torch.ones(8, dtype=getattr(torch, dtype))
    np.testing.assert_array_equal(
        lk.quantized_linear(x, q, s, 8, 32, bias),
        lk.quantized_linear(x.float().numpy(), q32, s32, 8, 32, np.ones(8, np.float32)),
    )
    with pytest.raises(TypeError, match=r"^\[quantize\] w could not be converted .*requires grad"):
        lk.quantize(w.clone().requires_grad_(True), 8, 32)


@pytest.mark.parametrize("target", ["float32", "bfloat16", "float16"])
def test_to_a_float_dtype_of_a_model_with_one_module_quantized(target):
    """One FFN quantized on its own: to(float) dequantizes it too (was a bare KeyError, or a
    silent no-op for float32 that left it int8)."""
    cfg = {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128, "vocab_size": 96}
    model = lk.Transformer(cfg, seed=0)
    model.blocks[0].feed_forward.quantize(8)
    want = model([[1, 2, 3, 4]])
    model.to(target)
    assert model.dtype == target and model.blocks[0].feed_forward.dtype == target
    assert not any(k.endswith(".qweight") for k in model.state_dict())
    # (the int8 module's few-token products run on int8 activations: within 5e-2)
    np.testing.assert_allclose(model([[1, 2, 3, 4]]), want, rtol=5e-2, atol=5e-2)


def test_save_pretrained_keeps_the_checkpoints_token_ids(tmp_path):
    """bos / eos / pad ids of the loaded checkpoint are written back (transformers builds the
    padding row from pad_token_id: Phi-3's default, 32000, is past a small vocabulary)."""
    import json

    import torch
    import transformers

    cfg = transformers.Phi3Config(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=[2, 3],
    )
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    ours = lk.Transformer.from_pretrained(tmp_path / "hf", progress=False)
    ours.to("bfloat16").save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (saved["pad_token_id"], saved["bos_token_id"], saved["eos_token_id"]) == (0, 1, [2, 3])
    transformers.Phi3ForCausalLM.from_pretrained(tmp_path / "ours")  # loads
    # a model made from a config: no ids known, and no out-of-range padding row written
    fresh = lk.Transformer(ours.config, seed=0)
    fresh.save_pretrained(tmp_path / "fresh")
    transformers.Phi3ForCausalLM.from_pretrained(tmp_path / "fresh")


# ------------------------------------------------------------------------------------------
# edges found by an adversarial pass (session 13)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_tied_quantized_checkpoint_with_a_different_head_loads_untied(tmp_path, bits):
    """tie_word_embeddings true, but lm_head.qweight is not the quantized embedding: kept,
    untied, with a warning (as a float checkpoint's different lm_head.weight); it loaded tied,
    and to("float32") then rebuilt the head from the embedding."""
    from safetensors.numpy import load_file, save_file

    model = lk.Transformer({**CFG, "tie_embeddings": True}, seed=0).quantize(bits)
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    head = np.random.default_rng(7).standard_normal((96, 64)).astype(np.float32)
    tensors["lm_head.qweight"], tensors["lm_head.scales"] = lk.quantize(head, bits, 32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"lm_head.qweight / lm_head.scales are not the "
                                         r"quantized model.embed_tokens.weight"):  # fmt: skip
        back = lk.Transformer.from_pretrained(tmp_path)
    assert not back.config.tie_embeddings
    sd = back.state_dict()
    np.testing.assert_array_equal(sd["lm_head.qweight"], tensors["lm_head.qweight"])
    back.to("float32")
    np.testing.assert_array_equal(
        back.state_dict()["lm_head.weight"],
        lk.dequantize(tensors["lm_head.qweight"], tensors["lm_head.scales"], bits, 32),
    )
    # the head save_pretrained writes for a tied model: tied, silently
    model.save_pretrained(tmp_path / "same")
    assert lk.Transformer.from_pretrained(tmp_path / "same").config.tie_embeddings


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("format", "int4-q4_0", "'int4-q4_0'"),
        ("scale_dtype", "bfloat16", "'bfloat16'"),
        ("symmetric", False, "False"),
        ("symmetric", 1, "1"),
    ],
)
def test_quantization_config_keys_are_checked(tmp_path, key, value, shown):
    """format / scale_dtype / symmetric of quantization_config were never read: an int8 file
    saying "format": "int4-q4_0" loaded. Refused by name unless as save_pretrained writes them."""
    import json

    lk.Transformer(CFG, seed=0).quantize(8).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    cfg["quantization_config"][key] = value
    path.write_text(json.dumps(cfg))
    match = rf"^\[from_pretrained\] .*config\.json: quantization_config: {key} must be .* got "
    with pytest.raises(ValueError, match=match + rf"{shown}$"):
        lk.Transformer.from_pretrained(tmp_path)
    del cfg["quantization_config"][key]  # absent: what it is written as
    path.write_text(json.dumps(cfg))
    assert lk.Transformer.from_pretrained(tmp_path).dtype == "int8"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scales_are_refused_at_load(tmp_path, bad):
    """A NaN / Inf scale in a quantized checkpoint loaded (NaN logits): refused, the tensor
    named; load_state_dict refuses it too and changes nothing."""
    from safetensors.numpy import load_file, save_file

    model = lk.Transformer(CFG, seed=0).quantize(4)
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    key = "model.layers.1.mlp.up_proj.scales"
    tensors[key][5, 1] = bad
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"^\[from_pretrained\] .*model\.safetensors: tensor "
                                         rf"{key} holds -?(nan|inf) at row 5, group 1: "
                                         r"quantization scales must be finite"):  # fmt: skip
        lk.Transformer.from_pretrained(tmp_path)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"^\[Transformer\.load_state_dict\] {key} holds"):
        model.load_state_dict(tensors, strict=False)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("bits", [8, 4])
def test_the_path_of_a_call_depends_on_its_token_count(rng, bits):
    """docs/quantization.md, "Which path a call takes": up to 16 tokens int8 activations (each
    token as if alone, bitwise), from 17 the GEMM on float32 activations -- so one token's
    result depends on how many share the call (the batch / prompt length of a quantized model)
    -- except on CPUs with VNNI, where every token count takes int8 activations, each token as
    if alone."""
    from llmkernels.quant import INT8_ACTIVATION_TOKENS, int8_activations_used
    from llmkernels.reference import quantized_linear as ref_quantized_linear

    w = rng.standard_normal((48, 128)).astype(np.float32)
    q, s = lk.quantize(w, bits, 32)
    x = rng.standard_normal((INT8_ACTIVATION_TOKENS + 1, 128)).astype(np.float32)
    n = INT8_ACTIVATION_TOKENS
    alone = np.concatenate([lk.quantized_linear(x[i : i + 1], q, s, bits, 32) for i in range(n)])
    np.testing.assert_array_equal(lk.quantized_linear(x[:n], q, s, bits, 32), alone)
    big = lk.quantized_linear(x, q, s, bits, 32)  # 17 tokens
    if int8_activations_used(n + 1):  # int8 activations: each token as if alone
        tail = lk.quantized_linear(x[n:], q, s, bits, 32)
        np.testing.assert_array_equal(big, np.concatenate([alone, tail]))
        return
    float_acts = lk.quantized_linear(x, q, s, bits, 32, activations="float32")
    np.testing.assert_array_equal(big, float_acts)
    assert not np.array_equal(big[:n], alone)
    for got, acts in ((alone, "int8"), (big[:n], "float32")):
        want = ref_quantized_linear(x[:n], q, s, bits, 32, activations=acts)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
