"""Weights stored in bfloat16 / float16.

What "right" means here: a model whose projection and embedding matrices are stored in 16 bits
computes exactly what the float32 model built from the same *rounded* weights computes (the
kernels convert in registers and accumulate in float32): logits within rtol 1e-4 (bit for bit
up to 511 tokens, where both use the same kernel shapes), and greedy tokens equal to
transformers' model loaded in float32 from those rounded weights. A bf16 checkpoint saved by
transformers loads as bf16 (no widening: the model's bytes are the file's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import llmkernels as lk
import ml_dtypes
import numpy as np
import pytest
import torch
from _models import TWO_LAYERS, hf_greedy, hf_llama_config
from transformers import LlamaForCausalLM

# the exact 16-bit path (the float32 model of the rounded weights), whatever the CPU
pytestmark = pytest.mark.usefixtures("exact_bf16")

LOW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
CFG = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "hidden_dim": 96,
    "vocab_size": 120,
    "max_seq_len": 1024,
}
MATRICES = ("proj.weight", "embed_tokens.weight", "lm_head.weight")


def is_matrix(key: str) -> bool:
    return key.endswith(MATRICES)


def f32_twin(model: lk.Transformer) -> lk.Transformer:
    """The float32 model of the same (rounded) weights."""
    twin = lk.Transformer(model.config, seed=1)
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_state_dict_reports_the_storage_dtype(dtype: str) -> None:
    model = lk.Transformer(CFG, seed=0, dtype=dtype)
    assert model.dtype == dtype
    sd = model.state_dict()
    for key, arr in sd.items():
        want = np.dtype(LOW.get(dtype, np.float32)) if is_matrix(key) else np.dtype(np.float32)
        assert arr.dtype == want, key
    # views of the C++ storage, not copies: a write is seen by the model
    emb = sd["model.embed_tokens.weight"]
    before = model(np.array([[3]]))
    emb[3] = emb[3] * 2
    assert not np.array_equal(model(np.array([[3]])), before)
    ffn = lk.FeedForward(8, 16, dtype=dtype, seed=0)
    attn = lk.MultiHeadAttention(16, 2, dtype=dtype, seed=0)
    assert ffn.dtype == attn.dtype == dtype
    assert ffn.state_dict()["down_proj.weight"].dtype == np.dtype(LOW.get(dtype, np.float32))
    assert attn.state_dict()["q_proj.weight"].dtype == np.dtype(LOW.get(dtype, np.float32))
    # 16-bit storage is half the bytes of the matrices
    assert model.nbytes < lk.Transformer(CFG, seed=0).nbytes or dtype == "float32"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seq", [1, 5, 40, 530])
def test_logits_equal_the_float32_model_of_the_rounded_weights(
    isa: str, dtype: str, seq: int
) -> None:
    model = lk.Transformer(CFG, seed=0, dtype=dtype)
    twin = f32_twin(model)
    ids = np.random.default_rng(seq).integers(0, CFG["vocab_size"], (2, seq))
    got, want = model(ids), twin(ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if seq < 512:  # the same kernel shapes as float32: bit for bit
        np.testing.assert_array_equal(got, want)
    # decode steps through a KV cache (the GEMV path)
    cache, tcache = model.new_cache(2, 64), twin.new_cache(2, 64)
    steps = np.random.default_rng(0).integers(0, CFG["vocab_size"], (2, 3))
    for step in range(3):
        x = steps[:, step : step + 1]
        np.testing.assert_array_equal(model(x, cache=cache), twin(x, cache=tcache))


@pytest.mark.parametrize(
    "path",
    ["bf16_simde", "amx_emu"]
    + (["avx512bf16"] if lk._core.cpu_has_avx512_bf16 else [])
    + (["amx"] if lk._core.cpu_has_amx else []),
)
def test_bf16_dot_prefill_is_close_to_the_float32_model(path: str) -> None:
    """Where the CPU has AVX512_BF16 or AMX a bf16 model's prefill rounds its activations to
    bfloat16 (vdpbf16ps / tdpbf16ps, tests/ops/test_gemm_bf16.py): no longer the float32 model
    of the rounded weights bit for bit, but close to it in distribution. Decode (the GEMV)
    stays exact."""
    model = lk.Transformer(CFG, seed=0, dtype="bfloat16")
    twin = f32_twin(model)
    ids = np.random.default_rng(3).integers(0, CFG["vocab_size"], (2, 40))
    want = twin(ids)
    lk._core._set_bf16_dot(path)
    try:
        got = model(ids)
    finally:
        lk._core._set_bf16_dot("none")
    assert not np.array_equal(got, want)  # the dot path ran

    def log_softmax(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64) - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lp, lq = log_softmax(want), log_softmax(got)
    kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    top1 = float((want.argmax(-1) == got.argmax(-1)).mean())
    assert kl <= 1e-4 and top1 >= 0.95, (kl, top1)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bitwise_across_thread_counts(dtype: str, threads: None) -> None:
    model = lk.Transformer(CFG, seed=0, dtype=dtype)
    ids = np.random.default_rng(0).integers(0, CFG["vocab_size"], (1, 600))
    lk.set_num_threads(1)
    want = model(ids)
    for t in (2, 3):
        lk.set_num_threads(t)
        np.testing.assert_array_equal(model(ids), want)


def hf_float32(directory: Path) -> LlamaForCausalLM:
    hf = LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
    return hf.eval()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_greedy_tokens_equal_transformers_on_the_same_weights(dtype: str, tmp_path: Path) -> None:
    # transformers computes a bf16 model in bf16; its float32 model of the same rounded weights
    # is the reference (our kernels widen the weights and accumulate in float32)
    model = lk.Transformer(CFG, seed=3, dtype=dtype)
    model.save_pretrained(tmp_path, dtype="float32")
    hf = hf_float32(tmp_path)
    for key, value in hf.state_dict().items():  # the rounded weights, exactly
        ours = model.state_dict()[key].astype(np.float32)
        np.testing.assert_array_equal(value.numpy(), ours, err_msg=key)
    prompt = np.random.default_rng(1).integers(0, CFG["vocab_size"], (2, 7))
    want = hf_greedy(hf, prompt, 32)
    got = model.generate(prompt, 32, progress=False)
    np.testing.assert_array_equal(got, want)
    with torch.no_grad():
        ref = hf(torch.from_numpy(prompt)).logits.numpy()
    np.testing.assert_allclose(model(prompt), ref, rtol=1e-4, atol=2e-5)


def hf_checkpoint(directory: Path, dtype: torch.dtype, tie: bool = False) -> LlamaForCausalLM:
    cfg = hf_llama_config(**TWO_LAYERS, vocab_size=120, tie_word_embeddings=tie)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).to(dtype).eval()
    hf.save_pretrained(directory)
    return hf


def file_tensor_bytes(directory: Path) -> int:
    total = 0
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            with open(directory / name, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            total += sum(
                v["data_offsets"][1] - v["data_offsets"][0]
                for k, v in header.items()
                if k != "__metadata__"
            )
    return total


@pytest.mark.parametrize(
    ("torch_dtype", "name"), [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")]
)
@pytest.mark.parametrize("tie", [False, True])
def test_checkpoint_saved_by_transformers_keeps_its_dtype(
    tmp_path: Path, torch_dtype: torch.dtype, name: str, tie: bool
) -> None:
    hf = hf_checkpoint(tmp_path, torch_dtype, tie)
    model = lk.Transformer.from_pretrained(tmp_path)
    assert model.dtype == name
    sd = model.state_dict()
    for key, value in hf.state_dict().items():
        if is_matrix(key):
            assert sd[key].dtype == np.dtype(LOW[name]), key
            # the checkpoint's bits, not a round trip through float32
            np.testing.assert_array_equal(
                sd[key].view(np.uint16), value.view(torch.int16).numpy().view(np.uint16)
            )
        else:
            assert sd[key].dtype == np.float32
            np.testing.assert_array_equal(sd[key], value.float().numpy())
    # memory: the model's bytes are the file's (norms are float32 here, 16-bit there)
    norms = sum(v.nbytes for k, v in sd.items() if not is_matrix(k))
    assert model.nbytes - norms // 2 == file_tensor_bytes(tmp_path)
    # logits: the float32 transformers model of the same weights
    ids = np.random.default_rng(0).integers(0, 120, (1, 9))
    with torch.no_grad():
        ref = hf.float()(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(model(ids), ref, rtol=1e-4, atol=2e-5)
    # dtype= converts while loading
    f32 = lk.Transformer.from_pretrained(tmp_path, dtype="float32")
    assert f32.dtype == "float32" and f32.state_dict()["lm_head.weight"].dtype == np.float32
    np.testing.assert_allclose(f32(ids), model(ids), rtol=1e-4, atol=1e-6)
    other = "float16" if name == "bfloat16" else "bfloat16"
    conv = lk.Transformer.from_pretrained(tmp_path, dtype=other)
    assert conv.dtype == other
    np.testing.assert_array_equal(
        conv.state_dict()["lm_head.weight"],
        sd["lm_head.weight"].astype(np.float32).astype(LOW[other]),
    )


def test_float32_checkpoint_stays_float32(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, torch.float32)
    assert lk.Transformer.from_pretrained(tmp_path).dtype == "float32"
    assert lk.Transformer.from_pretrained(tmp_path, dtype="bf16").dtype == "bfloat16"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_save_pretrained_round_trip(tmp_path: Path, dtype: str) -> None:
    model = lk.Transformer({**CFG, "tie_embeddings": True}, seed=5, dtype=dtype)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["torch_dtype"] == dtype
    back = lk.Transformer.from_pretrained(tmp_path)
    assert back.dtype == dtype
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[key], value, err_msg=key)
    # transformers loads it in the same dtype, the same bits
    hf = LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype="auto")
    assert str(hf.dtype) == f"torch.{dtype}"
    hsd = hf.state_dict()
    for key in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"):
        np.testing.assert_array_equal(hsd[key].float().numpy(), model.state_dict()[key])


def test_to_converts_in_place() -> None:
    model = lk.Transformer(CFG, seed=0)
    ids = np.array([[1, 2, 3, 4]])
    want = model(ids)
    assert model.to("bfloat16") is model and model.dtype == "bfloat16"
    rounded = {k: v.astype(np.float32) for k, v in model.state_dict().items()}
    np.testing.assert_allclose(model(ids), want, rtol=0.1, atol=0.02)  # bf16 rounding only
    np.testing.assert_array_equal(model(ids), f32_twin(model)(ids))
    model.to(np.float32)
    assert model.dtype == "float32"
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, rounded[k])


def test_load_state_dict_keeps_torch_bf16_bits() -> None:
    model = lk.Transformer(CFG, seed=0, dtype="bfloat16")
    g = torch.Generator().manual_seed(0)
    w = torch.randn((120, 64), generator=g).to(torch.bfloat16)
    model.load_state_dict({"model.embed_tokens.weight": w}, strict=False)
    got = model.state_dict()["model.embed_tokens.weight"]
    np.testing.assert_array_equal(got.view(np.uint16), w.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("bad", ["int3", "float64", np.int8, 3])
def test_bad_dtype(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^\[Transformer\] dtype must be None, 'float32'"):
        lk.Transformer(CFG, dtype=bad)
    with pytest.raises(ValueError, match=r"^\[FeedForward\] dtype must be"):
        lk.FeedForward(8, 16, dtype=bad)
    with pytest.raises(ValueError, match=r"^\[from_pretrained\] dtype must be"):
        lk.Transformer.from_pretrained(tmp_path, dtype=bad)
    with pytest.raises(ValueError, match=r"^\[Transformer.to\] dtype must be"):
        lk.Transformer(CFG, seed=0).to(bad)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_inspection_path_reads_16_bit_weights(dtype: str) -> None:
    # llmkernels.inspect runs the layers in NumPy from the state dict: widened there
    model = lk.Transformer(CFG, seed=0, dtype=dtype)
    ids = np.array([[5, 6, 7, 8, 9]])
    logits, weights = model(ids, return_attention=True)
    np.testing.assert_allclose(logits, model(ids), rtol=1e-4, atol=1e-5)
    assert len(weights) == CFG["n_layers"] and block_dtype(model) == dtype


def block_dtype(model: lk.Transformer) -> str:
    return model.blocks[0].dtype
