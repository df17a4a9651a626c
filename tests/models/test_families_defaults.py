"""Config keys a checkpoint leaves out, or spells the way older transformers saved them, read as
transformers 5 reads them: each family's own defaults (Gemma ties its head and uses the tanh
GELU, Gemma 2 caps and scales its scores, Mistral slides over 4096 keys, ...), Phi-3's
top-level ``original_max_position_embeddings``, ``partial_rotary_factor`` ignored by the plain
RoPE of the LLaMA-like families, a tied config whose file holds a different head, and
``generation_config.json`` nulls. Each against transformers' eager model on the same files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
import transformers
from llmkernels._config import ConfigError, ModelConfig
from llmkernels._safetensors import CheckpointError
from safetensors.numpy import load_file, save_file

TINY = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CLASSES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "phi3": "Phi3",
    "gemma": "Gemma",
    "gemma2": "Gemma2",
}


def checkpoint(
    tmp_path: Path, family: str, extra: dict[str, Any], edit: Any = None
) -> tuple[Path, torch.nn.Module]:
    """A random-weight model saved by transformers, its config.json then edited by ``edit``
    (keys dropped or rewritten), and transformers' eager model loaded back from the files."""
    name = CLASSES[family]
    config_cls = getattr(transformers, f"{name}Config")
    model_cls = getattr(transformers, f"{name}ForCausalLM")
    kwargs = {**TINY, **extra}
    if family in ("qwen2", "mistral", "phi3"):
        kwargs.pop("head_dim")
    torch.manual_seed(0)
    d = tmp_path / family
    model_cls(config_cls(**kwargs)).save_pretrained(d, safe_serialization=True)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    hf = model_cls.from_pretrained(d, attn_implementation="eager").eval()
    return d, hf


def assert_matches(d: Path, hf: torch.nn.Module, length: int = 40) -> None:
    ids = np.random.default_rng(3).integers(3, TINY["vocab_size"], (1, length))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    got = lk.Transformer.from_pretrained(d, progress=False)(ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def drop(*keys: str) -> Any:
    def edit(cfg: dict[str, Any]) -> None:
        for k in keys:
            cfg.pop(k, None)

    return edit


GEMMA2 = {"sliding_window": 6, "query_pre_attn_scalar": 24}
# (family, config of the saved model, keys dropped from its config.json)
MISSING = {
    "gemma_tie": ("gemma", {}, ("tie_word_embeddings",)),
    "gemma_act": ("gemma", {}, ("hidden_act",)),
    "gemma_kv_heads": (
        "gemma",
        {"num_attention_heads": 16, "num_key_value_heads": 16},
        ("num_key_value_heads",),
    ),
    "gemma2_tie": ("gemma2", GEMMA2, ("tie_word_embeddings",)),
    "gemma2_act": ("gemma2", GEMMA2, ("hidden_activation", "hidden_act")),
    "gemma2_scalar": ("gemma2", GEMMA2, ("query_pre_attn_scalar",)),
    "gemma2_caps": (
        "gemma2",
        {**GEMMA2, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        ("attn_logit_softcapping", "final_logit_softcapping"),
    ),
    "mistral_window": ("mistral", {"sliding_window": 4096}, ("sliding_window",)),
    "phi3_eps": ("phi3", {"rms_norm_eps": 1e-5}, ("rms_norm_eps",)),
    "qwen3_head_dim": ("qwen3", {"head_dim": 128}, ("head_dim",)),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_a_missing_key_takes_the_familys_default(tmp_path: Path, case: str) -> None:
    family, extra, keys = MISSING[case]
    d, hf = checkpoint(tmp_path, family, extra, drop(*keys))
    assert_matches(d, hf)


def test_gemma2_defaults_are_transformers(tmp_path: Path) -> None:
    """A Gemma 2 config.json naming only the sizes: tied head, tanh GELU, scores scaled by
    256 ** -0.5 and capped at 50, logits at 30, even layers sliding over 4096 keys."""
    d, _ = checkpoint(tmp_path, "gemma2", GEMMA2)
    keep = {*TINY, "model_type", "architectures"}
    cfg = {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k in keep}
    c = ModelConfig.from_dict(cfg)
    assert c.tie_embeddings and c.activation == "gelu_tanh"
    assert (c.attn_scale, c.attn_softcap, c.final_softcap) == (256**-0.5, 50.0, 30.0)
    assert c.sliding_window == 4096 and c.layer_types == ("sliding_attention", "full_attention")


def test_gemma1_reads_hidden_act_only(tmp_path: Path) -> None:
    """transformers' Gemma (1) builds its MLP from hidden_act; a hidden_activation beside it is
    not read (Gemma 2 reads hidden_activation only)."""

    def edit(cfg: dict[str, Any]) -> None:
        cfg.update(hidden_act="silu", hidden_activation="gelu_pytorch_tanh")

    d, hf = checkpoint(tmp_path, "gemma", {"hidden_act": "silu"}, edit)
    assert ModelConfig.from_dict(json.loads((d / "config.json").read_text())).activation == "silu"
    assert_matches(d, hf)


@pytest.mark.parametrize("value", ["relu", 5, None, "gelu"])
def test_gemma2_activation_is_checked(value: Any) -> None:
    base = {**TINY, "model_type": "gemma2", "hidden_activation": value}
    # "gelu" is the exact GELU for Gemma 2 (only Gemma 1 maps it to the tanh one); null has no
    # activation (transformers fails building the MLP)
    with pytest.raises(ConfigError, match=r"hidden_activation: only 'silu'"):
        ModelConfig.from_dict(base)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, "must be > 0"),
        (-4, "must be > 0"),
        ("256", "must be a real number"),
        (True, "must be a real number"),
        ([1], "must be a real number"),
        (10**400, "must be finite"),
        (float("nan"), "must be finite"),
    ],
)
def test_query_pre_attn_scalar_is_checked(value: Any, match: str) -> None:
    cfg = {**TINY, "model_type": "gemma2", "query_pre_attn_scalar": value}
    with pytest.raises(ConfigError, match=rf"\[config\] query_pre_attn_scalar: {match}"):
        ModelConfig.from_dict(cfg)


@pytest.mark.parametrize("value", [["llama"], {"a": 1}, 3])
def test_model_type_of_the_wrong_type(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"\[config\] model_type: .* is not supported"):
        ModelConfig.from_dict({**TINY, "model_type": value})


def test_norm_eps_must_be_below_one() -> None:
    with pytest.raises(ConfigError, match=r"\[config\] rms_norm_eps: must be < 1"):
        ModelConfig.from_dict({**TINY, "rms_norm_eps": 1e308})


def test_gemma2_null_window_with_sliding_layers_is_refused() -> None:
    cfg = {**TINY, "model_type": "gemma2", "sliding_window": None}
    with pytest.raises(ConfigError, match=r"sliding_window: is null but layer_types"):
        ModelConfig.from_dict(cfg)
    full = ModelConfig.from_dict({**cfg, "layer_types": ["full_attention"] * 2})
    assert full.layer_window(0) is None and full.layer_window(1) is None
    # and the HF dict of such a model reads back as itself
    assert ModelConfig.from_dict(full.to_hf_dict()) == full


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.05 * i for i in range(4)],
    "long_factor": [1.0 + 0.3 * i for i in range(4)],
}


@pytest.mark.parametrize("where", ["top_level_only", "both_differ"])
def test_phi3_top_level_original_max_position_embeddings(tmp_path: Path, where: str) -> None:
    """Phi-3-128k's 4.x configs keep original_max_position_embeddings at the top level, beside
    a rope_scaling of factors only; transformers uses that value (over one in the dict). A
    prompt past it (40 > 8) takes the long factors and the attention factor of 64 / 8."""

    def edit(cfg: dict[str, Any]) -> None:
        rope = dict(LONGROPE)
        if where == "both_differ":
            rope["original_max_position_embeddings"] = 32
        cfg.pop("rope_parameters", None)
        cfg.update(rope_scaling=rope, original_max_position_embeddings=8, rope_theta=10000.0)

    d, hf = checkpoint(tmp_path, "phi3", {"rope_parameters": {**LONGROPE, "rope_theta": 1e4}}, edit)
    c = ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    assert c.rope_scaling is not None and c.rope_scaling["original_max_position_embeddings"] == 8
    assert_matches(d, hf)
    # and an HF dict written by llmkernels says the same to transformers
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    ],
)
def test_llama_top_level_original_max_position_embeddings(tmp_path: Path, rope: dict) -> None:
    def edit(cfg: dict[str, Any]) -> None:
        cfg.update(original_max_position_embeddings=16)

    extra = {"rope_parameters": {**rope, "rope_theta": 1e4, "original_max_position_embeddings": 32}}
    d, hf = checkpoint(tmp_path, "llama", extra, edit)
    assert_matches(d, hf)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"])
def test_partial_rotary_factor_as_transformers(tmp_path: Path, family: str) -> None:
    """transformers' plain RoPE of the LLaMA-like families rotates every feature whatever
    partial_rotary_factor says; Phi-3's rotates the first half."""

    def edit(cfg: dict[str, Any]) -> None:
        cfg["partial_rotary_factor"] = 0.5
        if isinstance(cfg.get("rope_parameters"), dict):
            cfg["rope_parameters"]["partial_rotary_factor"] = 0.5

    d, hf = checkpoint(
        tmp_path, family, {"sliding_window": None} if family == "mistral" else {}, edit
    )
    assert_matches(d, hf)


def test_tied_config_with_a_different_saved_head(tmp_path: Path) -> None:
    """tie_word_embeddings true, but the file's lm_head.weight differs from the embedding:
    transformers keeps both (untied, with a warning); so do we."""
    d, _ = checkpoint(tmp_path, "llama", {"tie_word_embeddings": True})
    tensors = load_file(d / "model.safetensors")
    emb = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = (
        np.random.default_rng(5).standard_normal(emb.shape).astype(np.float32)
    )
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    hf = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    assert np.array_equal(hf.lm_head.weight.detach().numpy(), tensors["lm_head.weight"])
    with pytest.warns(UserWarning, match="differs from model.embed_tokens.weight"):
        ours = lk.Transformer.from_pretrained(d, progress=False)
    assert not ours.config.tie_embeddings
    ids = np.arange(3, 30)[None]
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours(ids), want, rtol=1e-4, atol=2e-4)
    # an identical saved head is tied, silently (the usual transformers save)
    tensors["lm_head.weight"] = emb.copy()
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    assert lk.Transformer.from_pretrained(d, progress=False).config.tie_embeddings


def test_a_huge_layer_number_in_a_key_is_an_unexpected_key(tmp_path: Path) -> None:
    d, _ = checkpoint(tmp_path, "llama", {})
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers." + "9" * 5000 + ".mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"\[from_pretrained\]"):
        lk.Transformer.from_pretrained(d, progress=False)


def test_gemma2_save_pretrained_loads_in_transformers(tmp_path: Path) -> None:
    """query_pre_attn_scalar is written as an int (transformers' Gemma2Config takes no float)."""
    d, hf = checkpoint(tmp_path, "gemma2", GEMMA2)
    ours = lk.Transformer.from_pretrained(d, progress=False)
    out = tmp_path / "saved"
    ours.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["query_pre_attn_scalar"] == 24
    again = transformers.Gemma2ForCausalLM.from_pretrained(out, attn_implementation="eager")
    ids = np.arange(3, 40)[None]
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
        got = again.eval()(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_generate_checks_ids_for_zero_new_tokens() -> None:
    model = lk.Transformer(
        {"dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32, "vocab_size": 50}, seed=0
    )
    for n in (0, 1):
        with pytest.raises(ValueError, match=r"\[generate\] ids must be in \[0, vocab_size=50\)"):
            model.generate([5000, -3], n, progress=False)
