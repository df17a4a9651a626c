"""Hostile model directories, round two.

Policy under test (see llmkernels/_files.py):

* every file is opened first (``O_NONBLOCK``), then ``fstat``-ed, and read through that
  descriptor: a FIFO, device or directory in the place of a file is refused and never waited on,
  even when it is swapped in between the loader's directory checks and its ``open``;
* symlinks are followed (HF's cache stores snapshots as links to ``../../blobs``); what they
  resolve to must be a regular file;
* names inside the files (shard names in an index) must be plain ``*.safetensors`` names in the
  directory: no ``..``, no absolute paths, no separators;
* a config is checked against the tensors the files hold before anything is allocated.

Cases that could hang run in a subprocess with a timeout, so a regression fails instead of
hanging the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import llmkernels as lk
import numpy as np
import pytest
import torch
from llmkernels import nn
from llmkernels._safetensors import CheckpointError
from llmkernels.text import write_tiny_model

TIMEOUT = 120
CKPT = r"^\[from_pretrained\] "


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_tiny_model(tmp_path_factory.mktemp("tiny"), seed=1))


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Width 8: a config with 2**24 such layers stays under the 2**36 parameter limit, so only
    the check against the files can refuse it."""
    return Path(write_tiny_model(tmp_path_factory.mktemp("narrow"), dim=8))


def clone(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def run_py(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a hang fails the test after TIMEOUT seconds."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the loader hung (> {TIMEOUT} s)")


# ------------------------------------------------------------------------------------------
# FIFOs, devices, directories in the place of files (item 4)
# ------------------------------------------------------------------------------------------

FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("kind", ["fifo", "directory", "/dev/zero", "symlink to fifo"])
def test_non_regular_file_is_refused_without_blocking(
    tmp_path: Path, tiny: Path, name: str, kind: str
) -> None:
    d = clone(tiny, tmp_path / "m")
    target = d / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "/dev/zero":
        target.symlink_to("/dev/zero")
    else:
        os.mkfifo(tmp_path / "pipe")
        target.symlink_to(tmp_path / "pipe")
    p = run_py(
        f"""
        import llmkernels as lk
        try:
            lk.load({str(d)!r})
        except (ValueError, OSError) as exc:
            print("ERROR", exc)
        else:
            print("LOADED")
        """
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ERROR ["), p.stdout
    assert "not a regular file" in p.stdout and name in p.stdout


def test_file_swapped_for_a_fifo_before_open(tmp_path: Path, tiny: Path) -> None:
    """The race of item 4: the directory checks see a regular file, then it becomes a FIFO
    just before the loader opens it (simulated by a wrapper around os.open)."""
    d = clone(tiny, tmp_path / "m")
    p = run_py(
        f"""
        import os
        import llmkernels as lk
        from llmkernels import _files
        real_open = os.open
        def swapping_open(path, flags, *args):
            if str(path).endswith("model.safetensors") and os.path.isfile(path):
                os.unlink(path)
                os.mkfifo(path)
            return real_open(path, flags, *args)
        _files.os.open = swapping_open
        try:
            lk.Transformer.from_pretrained({str(d)!r})
        except ValueError as exc:
            print("ERROR", exc)
        """
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ERROR [from_pretrained]") and "not a regular file" in p.stdout


# ------------------------------------------------------------------------------------------
# symlinks
# ------------------------------------------------------------------------------------------


def test_hf_cache_layout_with_symlinks_loads(tmp_path: Path, tiny: Path) -> None:
    """snapshots/<rev>/<file> -> ../../blobs/<hash>, as huggingface_hub stores a download."""
    root = tmp_path / "models--org--tiny"
    blobs, snap = root / "blobs", root / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(tiny.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    model, tok = lk.load(snap)
    ref, ref_tok = lk.load(tiny)
    assert lk.generate(model, tok, "abc", 8) == lk.generate(ref, ref_tok, "abc", 8)
    # a symlinked snapshot directory works too
    (tmp_path / "link").symlink_to(snap)
    lk.load(tmp_path / "link")


def test_symlink_loop_and_dangling_symlink(tmp_path: Path, tiny: Path) -> None:
    d = clone(tiny, tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to(d / "model.safetensors")
    with pytest.raises(CheckpointError, match=CKPT + ".*model.safetensors: cannot open"):
        lk.Transformer.from_pretrained(d)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to(d / "nowhere.safetensors")
    with pytest.raises(ValueError, match=CKPT + ".*model.safetensors"):
        lk.Transformer.from_pretrained(d)


# ------------------------------------------------------------------------------------------
# path escapes in shard indexes
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> Path:
    """The tiny model split in two shards with an index."""
    from llmkernels._safetensors import load_file, save_file

    d = tmp_path_factory.mktemp("sharded")
    for f in tiny.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, d / f.name)
    tensors = load_file(tiny / "model.safetensors")
    names = list(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file(d / shard, {k: tensors[k] for k in part})
        weight_map.update(dict.fromkeys(part, shard))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


ESCAPES = [
    "../model-00001-of-00002.safetensors",
    "/etc/passwd.safetensors",
    "..\\x.safetensors",
    "sub/../model-00001-of-00002.safetensors",
    "./model-00001-of-00002.safetensors",
    "model-00001-of-00002.safetensors\x00.txt",
    "",
    "..",
]


@pytest.mark.parametrize("shard", ESCAPES)
def test_shard_names_escaping_the_directory_are_refused(
    tmp_path: Path, sharded: Path, shard: str
) -> None:
    d = clone(sharded, tmp_path / "m")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = shard
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    # an escape target that exists, so only the name check can refuse it
    shutil.copy(
        d / "model-00001-of-00002.safetensors", tmp_path / "model-00001-of-00002.safetensors"
    )
    with pytest.raises(CheckpointError, match=CKPT + ".*index.json: .*not a plain"):
        lk.Transformer.from_pretrained(d)


def test_sharded_directory_loads_and_symlinked_shards_are_followed(
    tmp_path: Path, sharded: Path, tiny: Path
) -> None:
    a = lk.Transformer.from_pretrained(sharded)
    b = lk.Transformer.from_pretrained(tiny)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])
    d = clone(sharded, tmp_path / "m")
    outside = tmp_path / "elsewhere.bin"
    shutil.move(d / "model-00002-of-00002.safetensors", outside)
    (d / "model-00002-of-00002.safetensors").symlink_to(outside)
    lk.Transformer.from_pretrained(d)  # a plain name that is a symlink: followed


# ------------------------------------------------------------------------------------------
# absurd configs (item 15)
# ------------------------------------------------------------------------------------------

ABSURD = {
    # (the tiny model's width keeps the implied parameters under the config's 2**36 limit)
    "num_hidden_layers": (2**24, r"missing 150994926 tensor\(s\).*num_hidden_layers=16777216"),
    "intermediate_size": (2**24, r"gate_proj\.weight has shape \(16, 8\), expected"),
    "vocab_size": (2**20, r"embed_tokens\.weight has shape \(263, 8\), expected \(1048576, 8\)"),
    "num_attention_heads": (2, r"_proj\.weight has shape"),
}


@pytest.mark.parametrize("key", list(ABSURD))
def test_absurd_config_refused_before_allocating(tmp_path: Path, narrow: Path, key: str) -> None:
    d = clone(narrow, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    value, message = ABSURD[key]
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=message):
            lk.Transformer.from_pretrained(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # headers only: no key list per layer, no weights


@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="RLIMIT_AS cannot be used under AddressSanitizer (its shadow memory reserves "
    "terabytes of address space); this runs in make test",
)
def test_139_byte_config_with_2_24_layers(tmp_path: Path, narrow: Path) -> None:
    """The reported case: a minimal config.json beside real weights, in a subprocess whose
    memory is limited (it used to run for minutes and fill memory)."""
    d = clone(narrow, tmp_path / "m")
    small = {
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2**24,
        "vocab_size": 263,
    }
    (d / "config.json").write_text(json.dumps(small, separators=(",", ":")))
    assert (d / "config.json").stat().st_size < 160
    p = run_py(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        import llmkernels as lk
        try:
            lk.Transformer.from_pretrained({str(d)!r})
        except ValueError as exc:
            print("ERROR", exc)
        """
    )
    assert p.returncode == 0, p.stderr
    assert (
        p.stdout.startswith("ERROR [from_pretrained]") and "num_hidden_layers=16777216" in p.stdout
    )


# ------------------------------------------------------------------------------------------
# loading: no random init, no tensor-sized temporaries, bf16
# ------------------------------------------------------------------------------------------


def test_from_pretrained_does_not_randomly_initialise(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoRandom:
        def standard_normal(self, *a: Any, **k: Any) -> Any:
            raise AssertionError("random initialisation while loading")

        def integers(self, *a: Any, **k: Any) -> Any:
            return np.random.default_rng(0).integers(*a, **k)

    for part in (nn.module, nn.block, nn.model):  # every module that draws initial weights
        monkeypatch.setattr(part, "seeded_rng", lambda seed: NoRandom())
    model = lk.Transformer.from_pretrained(tiny)
    assert np.abs(model.state_dict()["lm_head.weight"]).max() > 0


def test_bf16_checkpoint_loads_without_tensor_sized_temporaries(tmp_path: Path) -> None:
    import safetensors.torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg)
    hf.save_pretrained(tmp_path)
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in hf.state_dict().items()}
    safetensors.torch.save_file(bf16, str(tmp_path / "model.safetensors"), {"format": "pt"})
    tracemalloc.start()
    try:
        model = lk.Transformer.from_pretrained(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    largest = 4096 * 256 * 4  # the embedding as float32: 4 MiB
    assert peak < largest  # chunks of 8 MiB at most read as bf16 -> well under
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, bf16[k].float().numpy())


def test_load_state_dict_accepts_bf16_torch_tensors(tiny: Path) -> None:
    model = lk.Transformer.from_pretrained(tiny)
    sd = {k: torch.from_numpy(v.copy()).to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, sd[k].float().numpy())
    block = model.blocks[0]
    bad = {k: torch.from_numpy(v.copy()) for k, v in block.state_dict().items()}
    bad["mlp.up_proj.weight"] = torch.zeros(3, dtype=torch.complex64)
    with pytest.raises(
        (TypeError, ValueError), match=r"^\[TransformerBlock.load_state_dict\] mlp.up"
    ):
        block.load_state_dict(bad)


# ------------------------------------------------------------------------------------------
# empty inputs (item 7) and generate's arguments (item 13)
# ------------------------------------------------------------------------------------------


def test_empty_inputs(tiny: Path) -> None:
    model, tok = lk.load(tiny)
    for ids in (np.zeros((1, 0), np.int64), np.zeros((0, 3), np.int64), []):
        with pytest.raises(ValueError, match=r"^\[Transformer\] ids holds no tokens"):
            model(ids)
        with pytest.raises(ValueError, match=r"^\[generate\] ids must hold a prompt"):
            model.generate(ids, 3)
    with pytest.raises(ValueError, match=r"^\[generate\] every sequence needs"):
        model.generate(np.ones((2, 3), np.int64), 3, mask=np.array([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"^\[generate\] prompt is empty"):
        lk.generate(model, tok, [])
    cache = model.new_cache(1, 8)
    block, attn = model.blocks[0], model.blocks[0].attention
    for mod, c in ((block, cache.layers[0]), (attn, cache.layers[1])):
        for shape in ((1, 0, 64), (0, 2, 64)):
            kw = {"cache": c} if shape[0] == 1 else {}
            out = mod(np.zeros(shape, np.float32), **kw)
            assert out.shape == shape and out.dtype == np.float32
        assert c.length == 0  # nothing was appended


BAD_GENERATE = [
    ({"max_new_tokens": float("nan")}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": 10**9}, "max_new_tokens = 1000000000 is too large"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": float("nan")}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"min_p": float("nan")}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
    ({"temperature": 10**400}, "temperature"),
]


@pytest.mark.parametrize("kw, name", BAD_GENERATE, ids=[str(k) for k, _ in BAD_GENERATE])
def test_generate_argument_errors_name_the_argument(
    tiny: Path, kw: dict[str, Any], name: str
) -> None:
    model, tok = lk.load(tiny)
    args = {"max_new_tokens": 3, **kw}
    n = args.pop("max_new_tokens")
    with pytest.raises(ValueError, match=r"^\[generate\] " + name):
        model.generate([[1, 2]], n, **args)
    text_kw = {("max_tokens" if k == "max_new_tokens" else k): v for k, v in kw.items()}
    text_name = name.replace("max_new_tokens", "max_tokens")
    n = text_kw.pop("max_tokens", 3)
    with pytest.raises(ValueError, match=r"^\[generate\] " + text_name):
        lk.generate(model, tok, "ab", n, **text_kw)
