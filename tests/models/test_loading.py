"""The loading layer: the safetensors reader, checkpoint directories and ModelConfig.

Peers: files written by the ``safetensors`` package and by ``transformers`` ``save_pretrained``
(sharded and single-file), HF ``LlamaConfig`` dicts and HF's RoPE frequencies. Hostile files
must raise the documented ``ValueError`` subclasses, never read past the file and never
allocate what the header merely claims.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers
from _models import TWO_LAYERS
from conftest import run_python
from llmkernels import _safetensors as st
from llmkernels._checkpoint import (
    check_key_shapes,
    load_checkpoint_dir,
    load_pretrained,
    read_checkpoint_index,
)
from llmkernels._config import (
    MAX_PARAMETERS,
    ConfigError,
    ModelConfig,
    block_key_shapes,
    hf_key_shapes,
    read_config_json,
)
from llmkernels._safetensors import (
    CheckpointError,
    CheckpointNotFoundError,
    load_file,
    read_header,
)
from llmkernels.families import FAMILIES
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

TINY = {**TWO_LAYERS, "vocab_size": 128}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
CKPT_ERR = r"^\[from_pretrained\] "


def hf_config(**kw: Any) -> LlamaConfig:
    """A tiny LlamaConfig; ``rope`` goes where this transformers version wants it."""
    params = {**TINY, **kw}
    rope = params.pop("rope", None)
    theta = params.pop("theta", 10000.0)
    if int(transformers.__version__.split(".")[0]) >= 5:
        params["rope_parameters"] = {"rope_type": "default", **(rope or {}), "rope_theta": theta}
    else:  # pragma: no cover - transformers 4.x
        params.update(rope_theta=theta, rope_scaling=rope)
    return LlamaConfig(**params)


def save_hf(directory: Path, cfg: LlamaConfig, **save_kw: Any) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(directory, **save_kw)
    return model


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Path, LlamaForCausalLM]]:
    """Sharded HF checkpoints (200 KB shards), untied and tied."""
    out = {}
    for tie in (False, True):
        d = tmp_path_factory.mktemp(f"sharded_tie{tie}")
        out[tie] = (d, save_hf(d, hf_config(tie_word_embeddings=tie), max_shard_size="200KB"))
    return out


def copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


# --------------------------------------------------------------------------------------
# safetensors round trips against the safetensors package
# --------------------------------------------------------------------------------------

NUMPY_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def sample(dtype: type, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype is np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape).astype(dtype)
    if x.size >= 4:
        flat = x.reshape(-1)
        flat[:4] = [np.inf, -np.inf, -0.0, np.finfo(dtype).tiny]
    return x


@pytest.mark.parametrize("code", list(NUMPY_DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 0, 4), (2, 3, 4, 5)])
def test_round_trip_numpy_dtypes(tmp_path: Path, code: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    dtype = NUMPY_DTYPES[code]
    tensors = {"a": sample(dtype, shape, rng), "b.weight": sample(dtype, (5,), rng)}
    path = tmp_path / "x.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "np", "k": "v"})
    header, metadata, data_offset = read_header(path)
    assert metadata == {"format": "np", "k": "v"}
    assert header["a"].dtype == code and header["a"].shape == shape
    assert data_offset == 8 + int.from_bytes(path.read_bytes()[:8], "little")

    peer = safetensors.numpy.load_file(str(path))
    exact = load_file(path, dtype=None)
    converted = load_file(path)
    for name, ref in peer.items():
        assert exact[name].dtype == ref.dtype and exact[name].shape == ref.shape
        np.testing.assert_array_equal(exact[name], ref)
        got = converted[name]
        assert got.flags.c_contiguous and got.flags.writeable
        if code.startswith("F"):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, ref.astype(np.float32))
        else:
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)
    f64 = load_file(path, dtype=np.float64)["a"]
    assert f64.dtype == (np.float64 if code.startswith("F") else dtype)


def test_bf16_matches_torch(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((17, 9)).astype(np.float32) * 100)
    x.view(-1)[:6] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e-40, 3e38])
    bf = x.to(torch.bfloat16)
    tensors = {"w": bf, "v": torch.arange(5, dtype=torch.bfloat16), "e": bf[:0]}
    path = tmp_path / "bf16.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    got = load_file(path)
    for name, t in tensors.items():
        ref = t.to(torch.float32).numpy()
        assert got[name].dtype == np.float32 and got[name].shape == ref.shape
        # bitwise: BF16 is exactly the upper half of the float32
        np.testing.assert_array_equal(got[name].view(np.uint32), ref.view(np.uint32))
    assert load_file(path, dtype=None)["w"].dtype == np.float32
    assert load_file(path, dtype=np.float64)["w"].dtype == np.float64


def test_f16_matches_torch(tmp_path: Path) -> None:
    x = torch.linspace(-70000, 70000, 101).to(torch.float16)
    path = tmp_path / "f16.safetensors"
    safetensors.torch.save_file({"x": x}, str(path))
    np.testing.assert_array_equal(load_file(path)["x"], x.to(torch.float32).numpy())


def test_names_selection_and_order(tmp_path: Path) -> None:
    arrays = {f"t{i}": np.full((i + 1,), i, np.float32) for i in range(5)}
    path = tmp_path / "x.safetensors"
    safetensors.numpy.save_file(arrays, str(path))
    got = load_file(path, names=["t3", "t0"])
    assert list(got) == ["t3", "t0"]
    np.testing.assert_array_equal(got["t3"], arrays["t3"])
    with pytest.raises(CheckpointError, match=CKPT_ERR + r".*no tensor named 'nope'"):
        load_file(path, names=["nope"])
    with pytest.raises(TypeError):
        load_file(path, names="t0")
    with pytest.raises(TypeError):
        load_file(path, dtype=np.int32)


def test_key_order_independent_of_data_order(tmp_path: Path) -> None:
    # the spec sorts by offsets: JSON key order may differ from the data order
    header = {
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    }
    path = write_raw(tmp_path, header, struct.pack("<ff", 1.0, 2.0))
    got = load_file(path)
    assert list(got) == ["b", "a"] and got["a"][0] == 1.0 and got["b"][0] == 2.0


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=CKPT_ERR) as info:
        load_file(tmp_path / "missing.safetensors")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_header(tmp_path)


# --------------------------------------------------------------------------------------
# hostile safetensors files
# --------------------------------------------------------------------------------------


def write_raw(
    tmp_path: Path,
    header: Any,
    data: bytes = b"",
    *,
    header_bytes: bytes | None = None,
    length: int | None = None,
    name: str = "bad.safetensors",
) -> Path:
    raw = header_bytes if header_bytes is not None else json.dumps(header).encode()
    n = len(raw) if length is None else length
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def f32(n: int, begin: int = 0) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [n], "data_offsets": [begin, begin + 4 * n]}


@pytest.fixture
def read_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int, int]]]:
    """Records every (file, offset, nbytes) data read the reader makes."""
    log: list[tuple[str, int, int]] = []
    original = st._read_exact

    def spy(f: Any, file: str, offset: int, nbytes: int) -> np.ndarray:
        log.append((file, offset, nbytes))
        return original(f, file, offset, nbytes)

    monkeypatch.setattr(st, "_read_exact", spy)
    yield log


HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "empty file": (lambda d: _bytes(d, b""), "too short"),
    "4 bytes": (lambda d: _bytes(d, b"\x02\x00\x00\x00"), "too short"),
    "length only": (lambda d: _bytes(d, struct.pack("<Q", 2)), "exceeds the 0 bytes"),
    "header length > file": (
        lambda d: write_raw(d, {"a": f32(1)}, b"\0" * 4, length=10_000),
        "header length 10000 exceeds",
    ),
    "header length 2**64-1": (
        lambda d: write_raw(d, {}, length=2**64 - 1),
        "header length 18446744073709551615 exceeds",
    ),
    "data past the end": (lambda d: write_raw(d, {"a": f32(4)}, b"\0" * 8), "past the end"),
    "huge claim": (
        lambda d: write_raw(
            d, {"a": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}, b"\0" * 16
        ),
        "past the end",
    ),
    "begin > end": (
        lambda d: write_raw(d, {"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}),
        "out of order",
    ),
    "overlap": (
        lambda d: write_raw(d, {"a": f32(2), "b": f32(2, begin=4)}, b"\0" * 12),
        "overlaps",
    ),
    "gap": (lambda d: write_raw(d, {"a": f32(1), "b": f32(1, begin=8)}, b"\0" * 12), "gap of 4"),
    "leading gap": (lambda d: write_raw(d, {"a": f32(1, begin=4)}, b"\0" * 8), "gap of 4"),
    "trailing bytes": (lambda d: write_raw(d, {"a": f32(1)}, b"\0" * 9), "5 bytes after"),
    "unknown dtype": (
        lambda d: write_raw(d, {"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}),
        "unsupported dtype 'F8_E4M3'",
    ),
    "numpy dtype name": (
        lambda d: write_raw(d, {"a": {"dtype": "float32", "shape": [1], "data_offsets": [0, 4]}}),
        "unsupported dtype",
    ),
    "dtype not a string": (
        lambda d: write_raw(d, {"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}}),
        "unsupported dtype",
    ),
    "size mismatch": (
        lambda d: write_raw(
            d, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8
        ),
        r"needs 12 bytes, data_offsets \[0, 8\] hold 8",
    ),
    "negative dim": (
        lambda d: write_raw(d, {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
        "shape must be a list of non-negative ints",
    ),
    "float dim": (
        lambda d: write_raw(d, {"a": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}}),
        "shape must be",
    ),
    "bool dim": (
        lambda d: write_raw(d, {"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}),
        "shape must be",
    ),
    "offsets wrong arity": (
        lambda d: write_raw(d, {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}),
        "data_offsets must be",
    ),
    "missing field": (lambda d: write_raw(d, {"a": {"dtype": "U8", "shape": [0]}}), "missing"),
    "extra field": (
        lambda d: write_raw(d, {"a": {**f32(0), "x": 1}}),
        "unknown keys 'x'",
    ),
    "entry not an object": (lambda d: write_raw(d, {"a": [1, 2]}), "entry must be an object"),
    "duplicate tensor": (
        lambda d: write_raw(
            d,
            None,
            b"\0" * 4,
            header_bytes=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
            b' "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        ),
        "duplicate key 'a'",
    ),
    "duplicate field": (
        lambda d: write_raw(
            d,
            None,
            header_bytes=b'{"a": {"dtype": "F32", "dtype": "U8", "shape": [0], '
            b'"data_offsets": [0, 0]}}',
        ),
        "duplicate key 'dtype'",
    ),
    "non-UTF-8": (lambda d: write_raw(d, None, header_bytes=b'{"\xff\xfe": 1}'), "not valid UTF-8"),
    "non-JSON": (lambda d: write_raw(d, None, header_bytes=b"{not json}"), "not valid JSON"),
    "NaN constant": (
        lambda d: write_raw(d, None, header_bytes=b'{"__metadata__": {"a": NaN}}'),
        "not valid JSON",
    ),
    "header is a list": (lambda d: write_raw(d, []), "header must be a JSON object"),
    "header is a string": (lambda d: write_raw(d, "abc"), "header must be a JSON object"),
    "deep nesting": (
        lambda d: write_raw(d, None, header_bytes=b"[" * 100_000 + b"]" * 100_000),
        "(nested too deeply|not valid JSON)",
    ),
    "metadata not strings": (
        lambda d: write_raw(d, {"__metadata__": {"a": 1}}),
        r"__metadata__\['a'\] must be a string",
    ),
    "metadata not an object": (
        lambda d: write_raw(d, {"__metadata__": ["a"]}),
        "__metadata__ must be an object",
    ),
}


def _bytes(d: Path, raw: bytes) -> Path:
    path = d / "bad.safetensors"
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files(tmp_path: Path, case: str, read_log: list) -> None:
    make, message = HOSTILE[case]
    path = make(tmp_path)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        for fn in (read_header, load_file):
            with pytest.raises(CheckpointError, match=CKPT_ERR + ".*" + str(path)) as info:
                fn(path)
            assert re.search(message, str(info.value)), str(info.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + 4 * size
    for _, offset, nbytes in read_log:
        assert offset + nbytes <= size


@pytest.mark.parametrize("cut", [0, 7, 8, 20, -13, -1])
def test_truncated_files(tmp_path: Path, cut: int, read_log: list) -> None:
    good = tmp_path / "good.safetensors"
    safetensors.numpy.save_file(
        {"a": np.arange(12, dtype=np.float32), "b": np.ones(3, np.float16)}, str(good)
    )
    raw = good.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:cut])
    with pytest.raises(CheckpointError, match=CKPT_ERR):
        load_file(path)
    for _, offset, nbytes in read_log:
        assert offset + nbytes <= len(raw[:cut])


def test_header_over_100_mib_is_refused_without_reading(tmp_path: Path, read_log: list) -> None:
    path = tmp_path / "sparse.safetensors"
    n = (100 << 20) + 1
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n + 16)  # sparse: no disk space used
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="100 MiB limit"):
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20 and read_log == []


def test_file_changing_under_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    safetensors.numpy.save_file({"a": np.arange(1000, dtype=np.float32)}, str(path))
    with open(path, "rb", buffering=0) as f:
        size = path.stat().st_size
        tensors, _, data_offset = st.read_header_from(f, str(path), size)
        os.truncate(path, data_offset + 100)
        dests = {"a": np.empty(1000, np.float32)}
        with pytest.raises(CheckpointError, match="changed size while it was read"):
            st._fill(f, str(path), size, tensors, dests)


def test_reads_the_validated_file_not_its_replacement(tmp_path: Path) -> None:
    # the path is swapped for another file between the header check and the data read: the
    # data comes from the inode that was checked (safe_open is given /proc/self/fd/<fd>)
    path = tmp_path / "x.safetensors"
    safetensors.numpy.save_file({"a": np.arange(1000, dtype=np.float32)}, str(path))
    other = tmp_path / "y.safetensors"
    safetensors.numpy.save_file({"a": -np.arange(1000, dtype=np.float32)}, str(other))
    with open(path, "rb", buffering=0) as f:
        size = path.stat().st_size
        tensors, _, _ = st.read_header_from(f, str(path), size)
        os.replace(other, path)
        dests = {"a": np.empty(1000, np.float32)}
        st._fill(f, str(path), size, tensors, dests)
    np.testing.assert_array_equal(dests["a"], np.arange(1000, dtype=np.float32))


def test_data_is_read_with_safe_open_in_bounded_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tensor data goes through safetensors.safe_open (memory-mapped); a handle is reopened
    # every _MAP_WINDOW bytes (its touched pages stay resident until it closes) and each
    # tensor is converted slice by slice (CHUNK_BYTES), equal to the safetensors peer
    rng = np.random.default_rng(0)
    tensors = {
        "emb": torch.from_numpy(rng.standard_normal((300, 70), dtype=np.float32)).bfloat16(),
        "w": torch.from_numpy(rng.standard_normal((129, 33), dtype=np.float32)),
        "h": torch.from_numpy(rng.standard_normal((5, 7, 3), dtype=np.float32)).half(),
        "s": torch.tensor(3.5, dtype=torch.float64),
        "e": torch.zeros((0, 4)),
    }
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    opened: list[str] = []
    real = safetensors.safe_open

    def spy(filename: str, framework: str, **kw: object) -> object:
        opened.append(filename)
        return real(filename, framework=framework, **kw)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    monkeypatch.setattr(st, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(st, "_MAP_WINDOW", 4096)
    got = load_file(path, dtype=None)
    assert len(opened) > 10 and all(name.startswith("/proc/self/fd/") for name in opened)
    for name, t in tensors.items():
        want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        np.testing.assert_array_equal(got[name], want)


@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""), reason="ASan changes the resident set"
)
def test_loading_adds_a_bounded_amount_to_the_resident_set(tmp_path: Path) -> None:
    # 160 MiB of float32 weights in one tensor: the peak resident set while loading is the
    # loaded array plus the reader's bounded window, not twice the file
    path = tmp_path / "big.safetensors"
    rows = 160 * 1024
    st.save_file(path, {"w": np.ones((rows, 256), np.float32)})
    code = f"""
        import numpy as np
        from llmkernels._safetensors import load_file, _MAP_WINDOW, CHUNK_BYTES
        def hwm():
            return next(int(line.split()[1]) << 10 for line in open("/proc/self/status")
                        if line.startswith("VmHWM"))
        load_file({str(path)!r}, names=[])  # imports and one header read
        base = hwm()
        w = load_file({str(path)!r})["w"]
        assert w.shape == ({rows}, 256) and w[-1, -1] == 1.0
        print((hwm() - base - w.nbytes) / (_MAP_WINDOW + CHUNK_BYTES))
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) < 1.5, proc.stdout


# --------------------------------------------------------------------------------------
# checkpoint directories written by transformers
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_sharded_checkpoint_loads_expected_keys(sharded: dict, tie: bool) -> None:
    directory, model = sharded[tie]
    index = json.loads((directory / st.INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) >= 2  # really sharded
    # transformers 5 does not save lm_head.weight when the embeddings are tied
    assert ("lm_head.weight" in index["weight_map"]) is (not tie)

    cfg = ModelConfig.from_dict(model.config.to_dict())
    expected = hf_key_shapes(cfg)
    tensors = load_checkpoint_dir(directory)
    assert list(tensors) == list(index["weight_map"])
    assert {k: v.shape for k, v in tensors.items()} == expected
    reference = model.state_dict()
    for key, value in tensors.items():
        assert value.dtype == np.float32 and value.flags.c_contiguous
        np.testing.assert_array_equal(value, reference[key].numpy())

    cfg2, weights = load_pretrained(directory)
    assert cfg2 == cfg and list(weights) == list(expected)
    for key, value in weights.items():
        np.testing.assert_array_equal(value, reference[key].numpy())

    located = read_checkpoint_index(directory)
    assert {k: v[1].shape for k, v in located.items()} == expected
    assert all(os.path.dirname(f) == str(directory) for f, _ in located.values())


def test_single_file_checkpoint_bf16(tmp_path: Path) -> None:
    cfg = hf_config(attention_bias=True, mlp_bias=True, head_dim=32, tie_word_embeddings=True)
    model = save_hf(tmp_path, cfg.__class__(**cfg.to_dict()))
    assert (tmp_path / "model.safetensors").exists()
    # re-save in bfloat16 the way HF checkpoints usually ship
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    bf16.pop("lm_head.weight")
    safetensors.torch.save_file(bf16, str(tmp_path / "model.safetensors"), {"format": "pt"})
    mc, weights = load_pretrained(tmp_path)
    assert mc.head_dim == 32 and mc.attention_bias and mc.mlp_bias and mc.tie_embeddings
    assert {k: v.shape for k, v in weights.items()} == hf_key_shapes(mc)
    for key, value in weights.items():
        ref = bf16[key].to(torch.float32).numpy()
        np.testing.assert_array_equal(value, ref)


def test_tied_checkpoint_with_saved_lm_head(tmp_path: Path, sharded: dict) -> None:
    directory, model = sharded[True]
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    assert "lm_head.weight" in state  # tied: the same tensor under both names
    safetensors.numpy.save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    cfg, weights = load_pretrained(tmp_path)
    assert cfg.tie_embeddings and "lm_head.weight" not in weights
    assert set(weights) == set(hf_key_shapes(cfg))


def test_single_file_wins_over_index(tmp_path: Path, sharded: dict) -> None:
    directory = copy_dir(sharded[False][0], tmp_path / "ckpt")
    safetensors.numpy.save_file(
        {"only": np.zeros(2, np.float32)}, str(directory / "model.safetensors")
    )
    assert list(load_checkpoint_dir(directory)) == ["only"]  # as transformers does


def test_names_from_checkpoint_dir(sharded: dict) -> None:
    directory, _ = sharded[False]
    got = load_checkpoint_dir(directory, names=["model.norm.weight", "lm_head.weight"])
    assert list(got) == ["model.norm.weight", "lm_head.weight"]
    with pytest.raises(CheckpointError, match="no tensor named 'x'"):
        load_checkpoint_dir(directory, names=["x"])


def mutate_index(directory: Path, change: Callable[[dict], None]) -> None:
    path = directory / st.INDEX_FILE
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))


def _first_shard(wm: dict) -> str:
    return sorted(set(wm.values()))[0]


def _norm_in(shard: object) -> Callable[[dict], None]:
    """The index change that lists model.norm.weight in ``shard``."""
    return lambda wm: wm.update({"model.norm.weight": shard})


INDEX_CASES: dict[str, tuple[Callable[[dict], None], type, str]] = {
    "missing shard": (
        _norm_in("model-00009-of-00009.safetensors"),
        CheckpointNotFoundError,
        "does not exist",
    ),
    "parent directory": (_norm_in("../model.safetensors"), CheckpointError, "not a plain"),
    "absolute path": (_norm_in("/etc/passwd.safetensors"), CheckpointError, "not a plain"),
    "subdirectory": (_norm_in("sub/x.safetensors"), CheckpointError, "not a plain"),
    "dot dot name": (_norm_in("..safetensors"), CheckpointError, "not a plain"),
    "not a safetensors name": (_norm_in("config.json"), CheckpointError, "not a plain"),
    "tensor absent from its shard": (
        lambda wm: wm.update({"model.extra.weight": _first_shard(wm)}),
        CheckpointError,
        "'model.extra.weight' listed in model.safetensors.index.json is not in this shard",
    ),
    "tensor not listed": (
        lambda wm: wm.pop("model.norm.weight"),
        CheckpointError,
        "'model.norm.weight' is not listed",
    ),
    "tensor in the wrong shard": (
        lambda wm: wm.update(
            {"model.norm.weight": next(s for s in set(wm.values()) if s != wm["model.norm.weight"])}
        ),
        CheckpointError,
        "'model.norm.weight' is (listed|not listed|also)",
    ),
    "shard value not a string": (_norm_in(3), CheckpointError, "must be a file name"),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_hostile_index(tmp_path: Path, sharded: dict, case: str) -> None:
    directory = copy_dir(sharded[False][0], tmp_path / "ckpt")
    change, error, message = INDEX_CASES[case]
    mutate_index(directory, change)
    for fn in (load_checkpoint_dir, read_checkpoint_index, load_pretrained):
        with pytest.raises(error, match=CKPT_ERR + ".*" + message):
            fn(directory)


def test_duplicate_tensor_across_shards(tmp_path: Path, sharded: dict) -> None:
    directory = copy_dir(sharded[False][0], tmp_path / "ckpt")
    wm = json.loads((directory / st.INDEX_FILE).read_text())["weight_map"]
    first, second = sorted(set(wm.values()))
    moved = next(k for k, s in wm.items() if s == second)
    tensors = safetensors.numpy.load_file(str(directory / first))
    tensors[moved] = safetensors.numpy.load_file(str(directory / second))[moved]
    safetensors.numpy.save_file(tensors, str(directory / first))
    with pytest.raises(CheckpointError, match=f"'{moved}' is (also|listed)"):
        load_checkpoint_dir(directory)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not valid JSON"),
        (b'{"weight_map": {}, "weight_map": {}}', "duplicate key 'weight_map'"),
        (b"[]", "must hold a JSON object"),
        (b'{"metadata": {}}', "missing 'weight_map'"),
        (b'{"weight_map": {}}', "is empty"),
        (b'{"weight_map": {"\xff": "a.safetensors"}}', "not valid UTF-8"),
    ],
)
def test_malformed_index(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / st.INDEX_FILE).write_bytes(content)
    with pytest.raises(CheckpointError, match=CKPT_ERR + ".*index.json: .*" + message):
        load_checkpoint_dir(tmp_path)


def test_empty_and_missing_directories(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no model.safetensors"):
        load_checkpoint_dir(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        load_checkpoint_dir(tmp_path / "nope")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint_dir(tmp_path / "f")
    with pytest.raises(CheckpointNotFoundError, match="config.json: no such file"):
        load_pretrained(tmp_path)


def test_load_pretrained_checks_shapes_before_reading(
    tmp_path: Path, sharded: dict, read_log: list
) -> None:
    directory = copy_dir(sharded[False][0], tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    config["intermediate_size"] = 80
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"mlp\.gate_proj\.weight has shape \(96, 64\), expected \(80, 64\)"
    ):
        load_pretrained(directory)
    assert read_log and all(offset == 8 for _, offset, _ in read_log)  # headers only

    config["intermediate_size"] = 96
    config["num_hidden_layers"] = 3
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"missing 9 tensor\(s\): model\.layers\.2\."):
        load_pretrained(directory)

    config["num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\).*model\.layers\.1\."):
        load_pretrained(directory)


def test_check_key_shapes() -> None:
    expected = {"a": (2, 3), "b": (4,)}
    check_key_shapes({"a": (2, 3), "b": (4,)}, expected, source="s")
    check_key_shapes(
        {"a": (2, 3), "b": (4,), "model.layers.0.self_attn.rotary_emb.inv_freq": (8,), "x": ()},
        expected,
        source="s",
        ignore=["x"],
    )
    with pytest.raises(CheckpointError, match=r"^\[load_state_dict\] s: missing 1 tensor\(s\): b"):
        check_key_shapes({"a": (2, 3)}, expected, source="s", fn="load_state_dict")
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) .*: c"):
        check_key_shapes({"a": (2, 3), "b": (4,), "c": (1,)}, expected, source="s")
    with pytest.raises(CheckpointError, match=r"tensor a has shape \(3, 2\), expected \(2, 3\)"):
        check_key_shapes({"a": (3, 2), "b": (4,)}, expected, source="s")


# --------------------------------------------------------------------------------------
# ModelConfig
# --------------------------------------------------------------------------------------


def test_from_hf_config_fields() -> None:
    cfg = ModelConfig.from_dict(hf_config().to_dict())
    assert cfg == ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, vocab_size=128
    )
    assert (cfg.head_dim, cfg.norm_eps, cfg.rope_theta, cfg.rope_scaling) == (16, 1e-6, 1e4, None)
    assert (cfg.norm, cfg.norm_position, cfg.max_seq_len) == ("rms", "pre", 2048)
    assert not (cfg.attention_bias or cfg.mlp_bias or cfg.tie_embeddings)
    assert cfg.n_params == sum(p.numel() for p in LlamaForCausalLM(hf_config()).parameters())


@pytest.mark.parametrize("tie", [False, True])
def test_from_hf_config_llama3_rope(tie: bool) -> None:
    hf = hf_config(
        rope=LLAMA3_ROPE,
        theta=500000.0,
        tie_word_embeddings=tie,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    )
    cfg = ModelConfig.from_dict(hf.to_dict())
    assert cfg.tie_embeddings is tie and cfg.rope_theta == 500000.0 and cfg.norm_eps == 1e-5
    assert cfg.rope_scaling == LLAMA3_ROPE and cfg.max_seq_len == 131072
    hf_inv = LlamaRotaryEmbedding(hf).inv_freq.numpy()
    np.testing.assert_allclose(cfg.inv_freq(), hf_inv, rtol=1e-6)
    # through JSON, as config.json
    assert ModelConfig.from_dict(json.loads(hf.to_json_string())) == cfg
    assert ("lm_head.weight" in hf_key_shapes(cfg)) is (not tie)


def test_original_max_position_defaults_like_hf() -> None:
    rope = {k: v for k, v in LLAMA3_ROPE.items() if k != "original_max_position_embeddings"}
    hf = hf_config(rope=rope, max_position_embeddings=4096)
    cfg = ModelConfig.from_dict(hf.to_dict())
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096
    np.testing.assert_allclose(cfg.inv_freq(), LlamaRotaryEmbedding(hf).inv_freq.numpy(), rtol=1e-6)


def test_legacy_4x_config_dict() -> None:
    legacy = {
        "model_type": "llama",
        **TINY,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "torch_dtype": "bfloat16",
        "pretraining_tp": 1,
    }
    cfg = ModelConfig.from_dict(legacy)
    assert cfg.rope_theta == 50000.0
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0, "rope_type": "linear"}
    np.testing.assert_allclose(cfg.inv_freq(), 1 / 50000.0 ** (np.arange(0, 16, 2) / 16) / 2)
    # the legacy key wins over rope_parameters, as in transformers 5
    both = {**legacy, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}
    assert ModelConfig.from_dict(both).rope_scaling["rope_type"] == "linear"


def test_to_hf_dict_round_trip() -> None:
    # TINY's shape (one KV head of 32 features), LLaMA 3 RoPE, biases, a tied head
    sizes = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 1, "head_dim": 32,
             "hidden_dim": 96, "vocab_size": 128, "max_seq_len": 16384}  # fmt: skip
    cfg = ModelConfig(**sizes, rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE),
                      attention_bias=True, tie_embeddings=True)  # fmt: skip
    hf = LlamaConfig(**cfg.to_hf_dict())
    assert ModelConfig.from_dict(hf.to_dict()) == cfg
    assert ModelConfig.from_dict(cfg.to_hf_dict()) == cfg
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert hash(ModelConfig.from_dict(cfg.to_dict())) == hash(cfg)
    model = LlamaForCausalLM(hf)
    state = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert state == hf_key_shapes(cfg)
    layer = LlamaDecoderLayer(hf, 0)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == block_key_shapes(cfg)
    post = ModelConfig(**{**cfg.to_dict(), "norm_position": "post"})
    with pytest.raises(ConfigError, match=r"^\[config\] norm_position: "):
        post.to_hf_dict()


def test_layer_norm_keys_and_defaults() -> None:
    cfg = ModelConfig(
        dim=8,
        n_layers=1,
        n_heads=2,
        hidden_dim=16,
        vocab_size=10,
        norm="layer",
        norm_position="post",
    )
    assert cfg.norm_eps == 1e-5
    keys = hf_key_shapes(cfg)
    assert keys["model.layers.0.input_layernorm.bias"] == (8,)
    assert keys["model.layers.0.post_attention_layernorm.bias"] == (8,)
    assert keys["model.norm.bias"] == (8,) and keys["lm_head.weight"] == (10, 8)
    assert "input_layernorm.bias" in block_key_shapes(cfg)
    assert cfg.n_params == sum(int(np.prod(s)) for s in keys.values())
    with pytest.raises(ConfigError, match=r"^\[config\] norm: "):
        cfg.to_hf_dict()


BASE = dict(dim=64, n_layers=2, n_heads=4, hidden_dim=96, vocab_size=128)
HF_BASE = dict(TINY, model_type="llama")

CONFIG_ERRORS: dict[str, tuple[dict[str, Any], str]] = {
    "dim 2**40": ({**BASE, "dim": 2**40}, r"dim: 1099511627776 exceeds"),
    "hidden_size 2**40": ({**HF_BASE, "hidden_size": 2**40}, r"hidden_size: 1099511627776 exc"),
    "too many parameters": (
        {**BASE, "dim": 2**13, "vocab_size": 2**24},
        r"dim: the configuration implies .* parameters",
    ),
    "dim % heads": ({**BASE, "dim": 65}, r"dim: 65 is not divisible by n_heads=4"),
    "hidden_size % heads": (
        {**HF_BASE, "hidden_size": 66},
        r"hidden_size: 66 is not divisible by num_attention_heads=4",
    ),
    "heads % kv heads": ({**BASE, "n_kv_heads": 3}, r"n_heads: 4 is not a multiple of n_kv_hea"),
    "hf heads % kv heads": (
        {**HF_BASE, "num_key_value_heads": 3},
        r"num_attention_heads: 4 is not a multiple of num_key_value_heads=3",
    ),
    "odd head_dim": ({**BASE, "head_dim": 15}, r"head_dim: must be even"),
    "hidden_act": ({**HF_BASE, "hidden_act": "gelu"}, r"hidden_act: only 'silu'"),
    "model_type": (
        {**HF_BASE, "model_type": "gemma3"},
        r"model_type: 'gemma3' is not supported \(supported: " + ", ".join(FAMILIES) + r"\)",
    ),
    "zero layers": ({**BASE, "n_layers": 0}, r"n_layers: must be a positive int, got 0"),
    "float size": ({**HF_BASE, "hidden_size": 64.0}, r"hidden_size: must be a positive int"),
    "bool size": ({**BASE, "n_heads": True}, r"n_heads: must be a positive int"),
    "negative eps": ({**HF_BASE, "rms_norm_eps": -1e-6}, r"rms_norm_eps: must be >= 0"),
    "nan theta": ({**BASE, "rope_theta": float("nan")}, r"rope_theta: must be finite"),
    "bias not bool": ({**HF_BASE, "attention_bias": "yes"}, r"attention_bias: must be true"),
    "bad norm": ({**BASE, "norm": "batch"}, r"norm: must be one of 'rms', 'layer'"),
    "unknown canonical key": ({**BASE, "dropout": 0.1}, r"dropout: unknown key"),
    "missing canonical key": ({"dim": 64}, r"n_layers: missing required key"),
    "missing hf key": (
        {k: v for k, v in HF_BASE.items() if k != "intermediate_size"},
        r"intermediate_size: missing required key",
    ),
    "mixed forms": ({**HF_BASE, "n_layers": 2}, r"n_layers: canonical key in an HF-style"),
    "rope missing key": (
        {**HF_BASE, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
        r"rope_parameters: scaling is missing required key 'low_freq_factor'",
    ),
    "rope unknown type": (
        {**BASE, "rope_scaling": {"rope_type": "ntk-magic"}},
        r"rope_scaling: unknown scaling\['rope_type'\]",
    ),
    "rope nested dict": (
        {**HF_BASE, "rope_parameters": {"full_attention": {"rope_type": "default"}}},
        r"rope_parameters\['full_attention'\]: unsupported value",
    ),
    "rope theta conflict": (
        {
            **BASE,
            "rope_theta": 5.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 7.0},
        },
        r"rope_scaling: rope_theta=7.0 conflicts with rope_theta=5.0",
    ),
    "not a dict": ([], r"config: must be a dict"),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("case", list(CONFIG_ERRORS))
def test_config_errors(case: str) -> None:
    d, message = CONFIG_ERRORS[case]
    with pytest.raises(ConfigError, match=r"^\[config\] " + message):
        ModelConfig.from_dict(d)


def test_parameter_limit_is_exact() -> None:
    cfg = ModelConfig(dim=1, n_layers=1, n_heads=1, head_dim=2, hidden_dim=1, vocab_size=1)
    assert cfg.n_params < MAX_PARAMETERS
    with pytest.raises(ConfigError):
        ModelConfig(dim=4096, n_layers=4096, n_heads=32, hidden_dim=11008, vocab_size=32000)


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "vocab_size"])
def test_absurd_config_json_refused_quickly(tmp_path: Path, key: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_BASE, key: 2**40}))
    # refused before anything the size implies is allocated: less than 1 MiB traced at peak
    # (a memory bound, not a clock: the suite holds no wall-clock assertion)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=rf"^\[config\] {key}: 1099511627776 exceeds"):
            read_config_json(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"hidden_size": "\xff"}', "not valid UTF-8"),
        (b"[1, 2]", "must hold a JSON object, got list"),
        (b'"llama"', "must hold a JSON object, got str"),
        (b"{oops", "not valid JSON"),
        (b'{"hidden_size": 64, "hidden_size": 128}', "duplicate key 'hidden_size'"),
        (b"{" + b" " * (1 << 20) + b"}", "file of 1048578 bytes exceeds the 1 MiB limit"),
        (b"[" * 50_000 + b"]" * 50_000, "(JSON nested too deeply|not valid JSON)"),
    ],
)
def test_malformed_config_json(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"^\[config\] .*config\.json: " + message):
        read_config_json(path)


def test_config_json_from_save_pretrained(sharded: dict) -> None:
    directory, model = sharded[True]
    cfg = read_config_json(directory / "config.json")
    assert cfg == ModelConfig.from_dict(model.config.to_dict())
    assert cfg.tie_embeddings and cfg.n_kv_heads == 2
    with pytest.raises(ConfigError, match="cannot read"):
        read_config_json(directory / "nope.json")
