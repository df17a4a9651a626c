"""Hugging Face checkpoint directories, read strictly (the safetensors files themselves:
:mod:`llmkernels._safetensors`): ``model.safetensors`` or a sharded index, keys and shapes checked
against the config before anything is allocated, the quantization config of an int8 / int4
checkpoint, and the whole load of :meth:`Transformer.from_pretrained` (``read_pretrained``, then
``load_pretrained`` / ``load_into`` straight into the model's storage)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ._files import read_small
from ._safetensors import (
    CHUNK_BYTES,
    DTYPES,
    FLOAT_DTYPES,
    INDEX_FILE,
    MAX_INDEX_BYTES,
    PREFIX,
    SHARD_NAME,
    SINGLE_FILE,
    CheckpointError,
    CheckpointNotFoundError,
    Reader,
    TensorInfo,
    check_dtype,
    err,
    is_int,
    load_located,
    open_regular_file,
    parse_json,
    read_header,
    read_header_from,
    short,
    tensors_equal,
)

__all__ = [
    "QuantConfig",
    "check_key_shapes",
    "load_checkpoint_dir",
    "load_pretrained",
    "read_checkpoint_index",
    "read_pretrained",
]


def _check_dir(path: str) -> None:
    if not os.path.exists(path):
        raise CheckpointNotFoundError(f"{PREFIX} {path}: no such directory")
    if not os.path.isdir(path):
        raise err(path, "not a directory")


def _read_json(path: str, what: str) -> Any:
    """The parsed JSON of a small checkpoint file (``what``: "index", "config"), its problems
    raised as CheckpointError / CheckpointNotFoundError naming the file."""
    raw = read_small(
        path,
        MAX_INDEX_BYTES,
        lambda problem: err(path, problem),
        lambda: CheckpointNotFoundError(f"{PREFIX} {path}: no such file"),
    )
    return parse_json(path, raw, what)


def _read_index(directory: str) -> dict[str, str]:
    """The validated ``weight_map`` of ``model.safetensors.index.json``."""
    index_path = os.path.join(directory, INDEX_FILE)
    index = _read_json(index_path, "index")
    if not isinstance(index, dict):
        raise err(index_path, f"must hold a JSON object, got {type(index).__name__}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise err(index_path, "missing 'weight_map' object")
    if not weight_map:
        raise err(index_path, "'weight_map' is empty")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise err(
                index_path, f"weight_map[{short(name)}] must be a file name, got {short(shard)}"
            )
        if not SHARD_NAME.fullmatch(shard) or ".." in shard or shard.startswith("."):
            raise err(
                index_path,
                f"weight_map[{short(name)}] = {short(shard)} is not a plain "
                f"'*.safetensors' file name inside the directory",
            )
    return weight_map


def read_checkpoint_index(
    path: str | os.PathLike[str],
) -> dict[str, tuple[str, TensorInfo]]:
    """The tensors of a checkpoint directory, from the headers only (no tensor data read).

    ``path`` holds ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
    (its ``weight_map``: tensor name -> shard file name). As in transformers, a single
    ``model.safetensors`` is used when both are present. For shards, every file named by the
    index must be a ``*.safetensors`` file directly inside ``path``; each tensor must be in
    the shard the index names; no tensor may appear in two shards or in a shard without
    being listed.

    Returns:
        ``{name: (file path, TensorInfo)}``.

    Raises:
        CheckpointError / CheckpointNotFoundError.
    """
    directory = os.fspath(path)
    _check_dir(directory)
    single = os.path.join(directory, SINGLE_FILE)
    # lexists: a dangling or looping symlink is opened and reported as what it is
    if os.path.lexists(single) or not os.path.lexists(os.path.join(directory, INDEX_FILE)):
        if not os.path.lexists(single):
            raise CheckpointNotFoundError(
                f"{PREFIX} {directory}: no {SINGLE_FILE} or {INDEX_FILE} in the directory"
            )
        tensors, _, _ = read_header(single)
        return {name: (single, info) for name, info in tensors.items()}

    index_path = os.path.join(directory, INDEX_FILE)
    weight_map = _read_index(directory)
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not os.path.lexists(os.path.join(directory, shard)):
            raise CheckpointNotFoundError(
                f"{PREFIX} {index_path}: shard {shard!r} listed in the index does not exist"
            )
    found: dict[str, tuple[str, TensorInfo]] = {}
    for shard in shards:
        shard_path = os.path.join(directory, shard)
        tensors, _, _ = read_header(shard_path)
        for name, info in tensors.items():
            if name in found:
                raise err(shard_path, f"tensor {short(name)} is also in {found[name][0]}")
            listed = weight_map.get(name)
            if listed is None:
                raise err(shard_path, f"tensor {short(name)} is not listed in {INDEX_FILE}")
            if listed != shard:
                raise err(
                    shard_path, f"tensor {short(name)} is listed in {INDEX_FILE} as in {listed!r}"
                )
            found[name] = (shard_path, info)
    for name, shard in weight_map.items():
        if name not in found:
            raise err(
                os.path.join(directory, shard),
                f"tensor {short(name)} listed in {INDEX_FILE} is not in this shard",
            )
    return {name: found[name] for name in weight_map}


def load_checkpoint_dir(
    path: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    """Load the tensors of an HF checkpoint directory (single file or sharded).

    See :func:`read_checkpoint_index` for the checks and :func:`load_file` for ``names`` and
    ``dtype``.
    """
    dt = check_dtype(dtype)
    located = read_checkpoint_index(path)
    if names is None:
        wanted = list(located)
    else:
        if isinstance(names, str):
            raise TypeError(f"{PREFIX} names must be a collection of tensor names, not a str")
        wanted = list(dict.fromkeys(names))
        for name in wanted:
            if name not in located:
                raise err(os.fspath(path), f"no tensor named {short(name)} in the checkpoint")
    return load_located(located, wanted, dt)


# -------------------------------------------------------------------------------------
# matching a checkpoint against a model layout
# -------------------------------------------------------------------------------------

_ROTARY_BUFFER = re.compile(r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def check_key_shapes(
    found: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    fn: str = "from_pretrained",
    ignore: Collection[str] = (),
) -> None:
    """Check that ``found`` has exactly the ``expected`` keys with the expected shapes.

    Keys in ``ignore`` and HF's non-persistent RoPE buffers
    (``model.layers.{i}.self_attn.rotary_emb.inv_freq``, present in some old checkpoints) may
    appear in ``found`` in addition.

    Raises:
        CheckpointError: ``"[<fn>] <source>: ..."`` naming missing / unexpected keys (the
            first few) or the first key whose shape differs.
    """

    def listing(keys: list[str]) -> str:
        head = ", ".join(keys[:5])
        return head + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

    missing = [k for k in expected if k not in found]
    if missing:
        raise CheckpointError(
            f"[{fn}] {source}: missing {len(missing)} tensor(s): {listing(missing)}"
        )
    unexpected = [
        k
        for k in found
        if k not in expected and k not in ignore and not _ROTARY_BUFFER.fullmatch(k)
    ]
    if unexpected:
        raise CheckpointError(
            f"[{fn}] {source}: unexpected tensor(s) for this configuration: {listing(unexpected)}"
        )
    for key, shape in expected.items():
        if tuple(found[key]) != tuple(shape):
            raise CheckpointError(
                f"[{fn}] {source}: tensor {key} has shape {tuple(found[key])}, "
                f"expected {tuple(shape)}"
            )


# (a layer number of more digits than any layer count can have is just an unexpected key)
_LAYER_KEY = re.compile(r"model\.layers\.(\d{1,9})\.")


def _check_layer_count(cfg: Any, located: Mapping[str, Any], source: str) -> None:
    """Refuse a config with more layers than the files hold *before* listing its keys: a
    139-byte ``config.json`` with ``num_hidden_layers: 2**24`` must not build 150 million key
    names (or allocate a model) to find out. Same message as :func:`check_key_shapes`."""
    from ._config import block_key_shapes, hf_key_shapes

    held = 1 + max((int(m.group(1)) for k in located if (m := _LAYER_KEY.match(k))), default=-1)
    if cfg.n_layers <= held:
        return
    block = list(block_key_shapes(cfg))
    # the keys of the layers the files could hold, and the non-layer keys, checked as usual
    base = dataclasses.replace(cfg, n_layers=max(held, 1))
    low = [k for k in hf_key_shapes(base) if held or not _LAYER_KEY.match(k)]
    missing_low = [k for k in low if k not in located]
    first_new = [f"model.layers.{held}.{k}" for k in block]
    missing = missing_low + first_new
    count = len(missing_low) + (cfg.n_layers - held) * len(block)
    head = ", ".join(missing[:5]) + (f" and {count - 5} more" if count > 5 else "")
    raise CheckpointError(
        f"{PREFIX} {source}: missing {count} tensor(s): {head} (the config has "
        f"num_hidden_layers={cfg.n_layers}, the checkpoint holds {held} layer(s))"
    )


def read_pretrained(path: str | os.PathLike[str], with_quantization: bool = False) -> Any:
    """Check an HF LLaMA directory from ``config.json`` and the safetensors headers only.

    Every tensor the config implies must be in the files with its shape and a floating dtype
    (and nothing else, but HF's RoPE buffers and a tied ``lm_head.weight``), so nothing is
    allocated for a config the files do not back. A config with llmkernels'
    ``quantization_config`` (:func:`read_quantization_config`) expects the quantized layout
    instead (:func:`quantized_key_shapes`; codes I8 / U8, scales F16).

    Returns:
        ``(ModelConfig, {hf_key: (file, TensorInfo)})`` for the expected keys, in
        :func:`llmkernels._config.hf_key_shapes` order; with ``with_quantization`` a third
        item, the :class:`QuantConfig` or None. Without it a quantized checkpoint is refused.
    """
    from ._config import hf_key_shapes, read_config_json

    directory = os.fspath(path)
    _check_dir(directory)
    config_path = os.path.join(directory, "config.json")
    if not os.path.lexists(config_path):
        raise CheckpointNotFoundError(f"{PREFIX} {config_path}: no such file")
    cfg = read_config_json(config_path)
    quant = read_quantization_config(config_path)
    located = read_checkpoint_index(directory)
    _check_layer_count(cfg, located, directory)
    head, emb = "lm_head.weight", "model.embed_tokens.weight"
    if (
        cfg.tie_embeddings
        and quant is None
        and head in located
        and emb in located
        and {located[head][1].dtype, located[emb][1].dtype} <= FLOAT_DTYPES
        and located[head][1].shape == located[emb][1].shape
        and not tensors_equal(located, head, emb)
    ):
        # transformers' tie_weights keeps a saved head that differs from the embedding
        warnings.warn(
            f"{PREFIX} {directory}: tie_word_embeddings is true, but {head} differs from "
            f"{emb}: both are kept, untied (as transformers does)",
            stacklevel=3,
        )
        cfg = dataclasses.replace(cfg, tie_embeddings=False)
    qhead = ("lm_head.qweight", "lm_head.scales")
    if (
        cfg.tie_embeddings
        and quant is not None
        and all(k in located for k in (emb, *qhead))
        and _is_quantized_copy_layout(located, emb, quant)
        and not quantized_head_matches(located, quant)
    ):
        # as for a float checkpoint: a saved head that is not the quantized embedding is kept
        warnings.warn(
            f"{PREFIX} {directory}: tie_word_embeddings is true, but {qhead[0]} / "
            f"{qhead[1]} are not the quantized {emb}: both are kept, untied (as transformers "
            "does for a float head)",
            stacklevel=3,
        )
        cfg = dataclasses.replace(cfg, tie_embeddings=False)
    expected = hf_key_shapes(cfg)
    if quant is not None:
        expected = quantized_key_shapes(expected, quant, cfg.tie_embeddings, config_path)
    ignore = ("lm_head.weight",) if cfg.tie_embeddings else ()
    check_key_shapes(
        {k: v[1].shape for k, v in located.items()}, expected, source=directory, ignore=ignore
    )
    for key in expected:
        file, info = located[key]
        want = _quantized_tensor_dtype(key, quant)
        if want is not None:
            if info.dtype != want:
                raise err(file, f"tensor {key} has dtype {info.dtype}, expected {want}")
        elif info.dtype not in FLOAT_DTYPES:
            raise err(file, f"tensor {key} has dtype {info.dtype}; weights must be floating")
    found = {key: located[key] for key in expected}
    if with_quantization:
        return cfg, found, quant
    if quant is not None:
        raise err(directory, "holds a quantized model: load it with Transformer.from_pretrained")
    return cfg, found


def _is_quantized_copy_layout(
    located: Mapping[str, tuple[str, TensorInfo]], emb: str, quant: QuantConfig
) -> bool:
    """Whether ``lm_head.qweight`` / ``.scales`` have the dtypes and shapes of the quantized
    embedding ``emb`` (a float (rows, k) matrix, k a multiple of the group size); anything else
    is left to the key, shape and dtype checks."""
    e, q, s = (located[k][1] for k in (emb, "lm_head.qweight", "lm_head.scales"))
    if e.dtype not in FLOAT_DTYPES or len(e.shape) != 2 or e.shape[1] % quant.group_size:
        return False
    rows, k = e.shape
    return (
        q.dtype == ("I8" if quant.bits == 8 else "U8")
        and q.shape == (rows, k if quant.bits == 8 else k // 2)
        and s.dtype == "F16"
        and s.shape == (rows, k // quant.group_size)
    )


def quantized_head_matches(
    located: Mapping[str, tuple[str, TensorInfo]], quant: QuantConfig
) -> bool:
    """Whether ``lm_head.qweight`` / ``lm_head.scales`` hold :func:`llmkernels.quantize`'s codes
    and scales of ``model.embed_tokens.weight`` (as float32), as a tied quantized model saves
    its head; read a few MiB of rows at a time from the files."""
    from contextlib import ExitStack

    from . import _core

    names = ("model.embed_tokens.weight", "lm_head.qweight", "lm_head.scales")
    e_info = located[names[0]][1]
    step = max(1, CHUNK_BYTES // max(1, e_info.shape[1] * DTYPES[e_info.dtype].itemsize))
    with ExitStack() as stack:
        opened: dict[str, tuple[dict[str, TensorInfo], Reader]] = {}
        pieces = []
        for name in names:
            file, info = located[name]
            if file not in opened:
                f, size = open_regular_file(file)
                stack.enter_context(f)
                opened[file] = (read_header_from(f, file, size)[0], Reader(f, file, size))
                stack.callback(opened[file][1].close)
            header, reader = opened[file]
            if header.get(name) != info:
                raise err(file, f"tensor {short(name)} changed since the header was read")
            pieces.append(reader.rows(name, info, step))
        for e, q, s in zip(*pieces, strict=True):
            try:
                want_q, want_s = _core.quantize(
                    np.ascontiguousarray(e, dtype=np.float32), quant.bits, quant.group_size
                )
            except ValueError:  # not finite, or beyond float16 scales: not its quantized copy
                return False
            same_s = np.array_equal(want_s.view(np.uint16), np.asarray(s).view(np.uint16))
            if not (same_s and np.array_equal(want_q, q)):
                return False
    return True


#: ``quantization_config["quant_method"]`` of the checkpoints save_pretrained writes for int8 /
#: int4 models (docs/quantization.md)
QUANT_METHOD = "llmkernels"


class QuantConfig(NamedTuple):
    """The ``quantization_config`` of a quantized checkpoint: ``bits`` (8 or 4) and
    ``group_size`` (32, 64 or 128)."""

    bits: int
    group_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "quant_method": QUANT_METHOD,
            "bits": self.bits,
            "group_size": self.group_size,
            "format": "int8" if self.bits == 8 else "int4-q4_0",
            "scale_dtype": "float16",
            "symmetric": True,
            "modules": "every *_proj and lm_head; embed_tokens and norms stay float",
        }


def read_quantization_config(config_path: str) -> QuantConfig | None:
    """The ``quantization_config`` of ``config.json`` (None when absent). Only llmkernels' own
    int8 / int4 format is understood: another ``quant_method`` (GPTQ, AWQ, bitsandbytes...) is
    refused by name."""
    data = _read_json(config_path, "config")
    qc = data.get("quantization_config") if isinstance(data, dict) else None
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise err(config_path, "quantization_config must be an object")
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise err(
            config_path,
            f"quantization_config: quant_method {short(method)} is not supported (llmkernels "
            f"reads its own {QUANT_METHOD!r} int8 / int4 layout; load the float checkpoint "
            "and quantize it with dtype='int8' or 'int4')",
        )
    bits, group = qc.get("bits"), qc.get("group_size")
    if not is_int(bits) or bits not in (4, 8):
        raise err(config_path, f"quantization_config: bits must be 8 or 4, got {short(bits)}")
    if not is_int(group) or group not in (32, 64, 128):
        raise err(
            config_path,
            f"quantization_config: group_size must be 32, 64 or 128, got {short(group)}",
        )
    written = QuantConfig(bits, group).to_dict()
    for key in ("format", "scale_dtype", "symmetric"):  # as save_pretrained writes them
        value, want = qc.get(key, written[key]), written[key]
        if value != want or isinstance(value, bool) != isinstance(want, bool):
            raise err(
                config_path,
                f"quantization_config: {key} must be {json.dumps(want)} for bits={bits} "
                f"(llmkernels' layout), got {short(value)}",
            )
    return QuantConfig(bits, group)


def check_finite_scales(file: str, key: str, scales: np.ndarray) -> None:
    """A quantized checkpoint's float16 ``scales`` must be finite (a NaN or Inf scale makes
    NaN logits): the first bad one named by tensor, row and group."""
    bad = ~np.isfinite(scales)
    if bad.any():
        row, group = (int(i) for i in np.argwhere(bad)[0])
        raise err(
            file,
            f"tensor {key} holds {scales[row, group]} at row {row}, group {group}: quantization "
            "scales must be finite",
        )


def is_quantized_key(key: str) -> bool:
    """Whether an HF key names a matrix a quantized model stores as codes + scales: the
    projections (``*_proj.weight``) and the LM head; the embedding and norms stay float."""
    return key.endswith("proj.weight") or key == "lm_head.weight"


def quantized_key_shapes(
    expected: Mapping[str, tuple[int, ...]], quant: QuantConfig, tied: bool, source: str
) -> dict[str, tuple[int, ...]]:
    """The keys of a quantized checkpoint: each matrix ``X.weight`` (rows, k) of
    :func:`is_quantized_key` becomes ``X.qweight`` (rows, k) int8 or (rows, k / 2) uint8 and
    ``X.scales`` (rows, k / group_size) float16; with tied embeddings the quantized LM head is
    stored too (``lm_head.qweight`` / ``.scales``, a quantized copy of the embedding)."""
    items = dict(expected)
    if tied:
        items["lm_head.weight"] = expected["model.embed_tokens.weight"]
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in items.items():
        if not is_quantized_key(key):
            out[key] = shape
            continue
        rows, k = shape
        if k % quant.group_size:
            raise err(
                source,
                f"quantization_config: group_size {quant.group_size} does not divide the input "
                f"dimension {k} of {key}",
            )
        base = key[: -len(".weight")]
        out[base + ".qweight"] = (rows, k if quant.bits == 8 else k // 2)
        out[base + ".scales"] = (rows, k // quant.group_size)
    return out


def _quantized_tensor_dtype(key: str, quant: QuantConfig | None) -> str | None:
    if quant is None:
        return None
    if key.endswith(".qweight"):
        return "I8" if quant.bits == 8 else "U8"
    if key.endswith(".scales"):
        return "F16"
    return None


def load_pretrained(
    path: str | os.PathLike[str], dtype: Any = np.float32
) -> tuple[Any, dict[str, np.ndarray]]:
    """Read an HF LLaMA directory: ``config.json`` and the safetensors weights.

    The weights are checked against :func:`llmkernels._config.hf_key_shapes` from the headers
    before any tensor data is read (:func:`read_pretrained`); only the expected tensors are
    loaded, as ``dtype`` (float32 by default), in ``hf_key_shapes`` order. A
    ``lm_head.weight`` saved although ``tie_word_embeddings`` is true is ignored (as
    transformers does: the embedding wins).

    Returns:
        ``(ModelConfig, {hf_key: array})``.

    Raises:
        ConfigError (``"[config] ..."``) for the config; CheckpointError for the weights.
    """
    cfg, located = read_pretrained(path)
    return cfg, load_located(located, list(located), check_dtype(dtype))


#: the storage dtype names of the float safetensors dtypes (F64 loads as float32)
DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def checkpoint_weight_dtype(located: Mapping[str, tuple[str, TensorInfo]]) -> str:
    """The storage dtype that keeps a checkpoint's matrices (projections, embedding, LM head)
    at their precision: ``"bfloat16"`` or ``"float16"`` when every one of them is stored so,
    else ``"float32"`` (F32, F64 or a mix)."""
    kinds = {
        info.dtype
        for key, (_, info) in located.items()
        if key.endswith("proj.weight") or key.endswith(("embed_tokens.weight", "lm_head.weight"))
    }
    if kinds == {"BF16"}:
        return "bfloat16"
    if kinds == {"F16"}:
        return "float16"
    return "float32"
