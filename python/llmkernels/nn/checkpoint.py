"""Checkpoint helpers of :meth:`Transformer.from_pretrained` / :meth:`save_pretrained`: the
local directory, the token ids written back, and quantize-on-load."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _core
from .module import check_weight_dtype


def hf_token_ids(config_path: str) -> dict[str, Any]:
    """bos / eos / pad token ids of an HF config.json (ints, lists of ints or null), for
    save_pretrained to write back; {} when the file has none (or cannot be read again)."""
    import json

    try:
        with open(config_path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = d.get(key, ...) if isinstance(d, dict) else ...
        ok = v is None or (isinstance(v, int) and not isinstance(v, bool))
        ok = ok or (isinstance(v, list) and all(type(i) is int for i in v))
        if v is not ... and ok:
            out[key] = v
    return out


class QuantizingSink:
    """Where :meth:`Transformer.from_pretrained` puts a float checkpoint matrix stored as
    int8 / int4: the loader hands it the matrix a few rows at a time (``write_rows``), each
    slice widened to float32 and quantized into the module's codes and scales (the bits of
    :func:`llmkernels.quantize`) -- never a float32 copy of the matrix."""

    def __init__(self, key: str, qweight: np.ndarray, scales: np.ndarray, group: int) -> None:
        self.key, self.qweight, self.scales, self.group = key, qweight, scales, group
        self.bits = 8 if qweight.dtype == np.int8 else 4
        self.shape = (qweight.shape[0], scales.shape[1] * group)

    def write_rows(self, r0: int, piece: np.ndarray) -> None:
        rows = np.ascontiguousarray(piece, dtype=np.float32).reshape(-1, self.shape[1])
        try:
            q, sc = _core.quantize(rows, self.bits, self.group)
        except ValueError as exc:
            msg = str(exc).removeprefix("[quantize] ")
            raise ValueError(f"[from_pretrained] {self.key} (from row {r0}): {msg}") from None
        self.qweight[r0 : r0 + len(rows)] = q
        self.scales[r0 : r0 + len(rows)] = sc


def check_load_dtype(fn: str, dtype: Any) -> None:
    check_weight_dtype(fn, dtype, allow_none=True)


def checkpoint_dir(path: Any) -> str:
    """``path`` as a local directory; a hub id gets told to download it first."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(
            f"[from_pretrained] path must be a directory path, got {type(path).__name__}"
        ) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if os.path.isdir(p):
        return p
    parts = p.split("/")
    if not os.path.lexists(p) and len(parts) == 2 and all(parts) and not p.startswith((".", "~")):
        raise ValueError(
            f"[from_pretrained] {p!r} is not a directory; it looks like a Hugging Face hub id. "
            f"llmkernels does not download: fetch it first, e.g. `huggingface-cli download {p}` "
            f"or `huggingface_hub.snapshot_download({p!r})`, and pass the local directory "
            "(it needs config.json and *.safetensors)"
        )
    raise ValueError(f"[from_pretrained] {p!r} is not a directory")
