"""A strict, safe reader of safetensors files and HF checkpoint directories (NumPy only).

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian unsigned
header length ``N``, ``N`` bytes of UTF-8 JSON mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the byte buffer
that follows the header) plus an optional ``"__metadata__"`` dict of strings, then the byte
buffer, which the tensors must cover exactly (no overlap, no gap, nothing after the last).

The header is read through a descriptor opened first (non-blocking) and ``fstat``-ed
(:mod:`llmkernels._files`) and validated strictly here against the file size — what
``safetensors`` checks plus what it does not: a 100 MiB header limit, at most 64 dimensions,
no duplicate keys, ``__metadata__`` of strings, and for model loading the keys and shapes
against the config, all before anything the header implies is allocated. Nothing is ever
unpickled.

Tensor data is read with the ``safetensors`` library: ``safe_open(framework="numpy")`` on
``/proc/self/fd/<fd>`` (the inode that was validated, not whatever the path names by then),
memory-mapped, sliced in 1 MiB pieces of rows converted straight into the destination (the
model's own storage for :func:`load_into`: no tensor-sized temporary; BF16 comes back as
``ml_dtypes.bfloat16`` and is widened exactly). A mapping keeps the pages it touched resident
until it is closed, so a handle is reopened every 32 MiB read: the loader adds a bounded
amount (~33 MiB) to the model, whatever the checkpoint size. The file size is checked before
each handle; a file truncated by another process *while* a window is mapped would raise
SIGBUS, as with every mmap-based reader (transformers, torch, safetensors itself).

Every error is a :class:`CheckpointError` (a ``ValueError``) reading
``"[from_pretrained] <file>: <what is wrong>"``; a missing file or directory raises
:class:`CheckpointNotFoundError`, which is both a ``CheckpointError`` and a
``FileNotFoundError``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import warnings
from collections.abc import Collection, Iterable, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ._files import DuplicateKey, no_duplicate_keys, open_regular, read_small

__all__ = [
    "DTYPES",
    "CheckpointError",
    "CheckpointNotFoundError",
    "TensorInfo",
    "check_key_shapes",
    "load_checkpoint_dir",
    "load_file",
    "load_pretrained",
    "read_checkpoint_index",
    "read_header",
]

#: safetensors dtype string -> (little-endian NumPy storage dtype, itemsize). BF16 is stored
#: as uint16 and widened to float32 on load (NumPy has no bfloat16).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("u1"),
}
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})

MAX_HEADER_BYTES = 100 << 20  # 100 MiB, as the reference implementation
MAX_INDEX_BYTES = 64 << 20
MAX_NDIM = 64
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_PREFIX = "[from_pretrained]"


class CheckpointError(ValueError):
    """A malformed or inconsistent checkpoint: ``"[from_pretrained] <file>: <problem>"``."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file or directory that does not exist (also a ``FileNotFoundError``)."""


class TensorInfo(NamedTuple):
    """One header entry: safetensors dtype string, shape and ``(begin, end)`` byte offsets."""

    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def _err(file: str | os.PathLike[str], problem: str) -> CheckpointError:
    return CheckpointError(f"{_PREFIX} {os.fspath(file)}: {problem}")


def _short(text: object, limit: int = 80) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_json(file: str, raw: bytes, what: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity; errors name ``file``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _err(file, f"{what} is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constants)
    except DuplicateKey as exc:
        raise _err(file, f"duplicate key {_short(exc.key)} in {what}") from None
    except RecursionError:
        raise _err(file, f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise _err(file, f"{what} is not valid JSON ({exc})") from None


def _is_int(value: object) -> bool:
    return type(value) is int  # JSON ints only (bool is excluded)


def _open_regular(path: str) -> tuple[BinaryIO, int]:
    """Open a regular file for binary reading; return it and its size (from the open fd).

    Opened first (non-blocking, so a FIFO cannot hang the open), then ``fstat``-ed: what is
    checked is what is read (see :mod:`llmkernels._files` for the symlink policy)."""
    return open_regular(
        path,
        lambda problem: _err(path, problem),
        lambda: CheckpointNotFoundError(f"{_PREFIX} {path}: no such file"),
    )


def _read_exact(f: BinaryIO, file: str, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes at ``offset`` into a fresh uint8 array (error if the file is short)."""
    buf = np.empty(nbytes, dtype=np.uint8)
    if nbytes == 0:
        return buf
    f.seek(offset)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise _err(file, f"file ended after {offset + got} bytes (it changed while read?)")
        got += n
    return buf


def _parse_header(file: str, header: Any, data_size: int) -> tuple[dict[str, TensorInfo], dict]:
    """Validate a decoded header against a byte buffer of ``data_size`` bytes."""
    if not isinstance(header, dict):
        raise _err(file, f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict):
        raise _err(file, "__metadata__ must be an object of strings")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _err(file, f"__metadata__[{_short(key)}] must be a string, got {_short(value)}")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {_short(name)}"
        if not isinstance(entry, dict):
            raise _err(file, f"{where}: entry must be an object, got {type(entry).__name__}")
        keys = set(entry)
        if keys != _ENTRY_KEYS:
            missing, extra = _ENTRY_KEYS - keys, keys - _ENTRY_KEYS
            problem = (
                f"missing {', '.join(sorted(missing))}"
                if missing
                else f"unknown keys {', '.join(sorted(map(_short, extra)))}"
            )
            raise _err(file, f"{where}: {problem}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise _err(
                file,
                f"{where}: unsupported dtype {_short(dtype)} (supported: {', '.join(DTYPES)})",
            )
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise _err(
                file, f"{where}: shape must be a list of non-negative ints, got {_short(shape)}"
            )
        if len(shape) > MAX_NDIM:
            raise _err(file, f"{where}: {len(shape)} dimensions (at most {MAX_NDIM})")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)
        ):
            raise _err(
                file,
                f"{where}: data_offsets must be [begin, end] with non-negative "
                f"ints, got {_short(offsets)}",
            )
        begin, end = offsets
        if begin > end:
            raise _err(file, f"{where}: data_offsets out of order: begin {begin} > end {end}")
        if end > data_size:
            raise _err(
                file,
                f"{where}: data_offsets [{begin}, {end}] point past the end of the data "
                f"({data_size} bytes follow the header)",
            )
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise _err(
                file,
                f"{where}: shape {tuple(shape)} of {dtype} needs {nbytes} bytes, "
                f"data_offsets [{begin}, {end}] hold {end - begin}",
            )
        tensors[name] = TensorInfo(dtype, tuple(shape), (begin, end))
    # the byte buffer must be covered exactly: no overlap, no gap, nothing left over
    position, previous = 0, None
    for name, info in sorted(tensors.items(), key=lambda item: item[1].offsets):
        begin, end = info.offsets
        if begin < position:
            raise _err(
                file,
                f"tensor {_short(name)} overlaps tensor {_short(previous)} "
                f"(bytes {begin}..{position})",
            )
        if begin > position:
            raise _err(
                file,
                f"gap of {begin - position} unindexed bytes before tensor "
                f"{_short(name)} (bytes {position}..{begin})",
            )
        position, previous = end, name
    if position != data_size:
        raise _err(
            file,
            f"{data_size - position} bytes after the last tensor are not indexed by the header",
        )
    return tensors, dict(metadata)


def _read_header_from(f: BinaryIO, file: str, size: int) -> tuple[dict[str, TensorInfo], dict, int]:
    if size < 8:
        raise _err(file, f"file of {size} bytes is too short for a safetensors header")
    prefix = f.read(8)
    if len(prefix) != 8:
        raise _err(file, "file ended inside the 8-byte header length")
    n = int.from_bytes(prefix, "little")
    if n > size - 8:
        raise _err(
            file,
            f"header length {n} exceeds the {size - 8} bytes after the length "
            f"field (truncated or not a safetensors file)",
        )
    if n > MAX_HEADER_BYTES:
        raise _err(file, f"header length {n} exceeds the 100 MiB limit")
    if n < 2:
        raise _err(file, f"header length {n} is too small for a JSON object")
    raw = _read_exact(f, file, 8, n).tobytes()
    header = _parse_json(file, raw, "header")
    tensors, metadata = _parse_header(file, header, size - 8 - n)
    return tensors, metadata, 8 + n


def read_header(
    path: str | os.PathLike[str],
) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Read and validate the header of a safetensors file.

    Returns:
        ``(tensors, metadata, data_offset)``: ``tensors`` maps each name (in header order) to
        a :class:`TensorInfo` ``(dtype, shape, (begin, end))`` with offsets relative to the
        byte buffer, which starts at absolute file offset ``data_offset``; ``metadata`` is the
        ``__metadata__`` dict (empty when absent).

    Raises:
        CheckpointError: anything malformed (see the module docstring).
    """
    file = os.fspath(path)
    f, size = _open_regular(file)
    with f:
        return _read_header_from(f, file, size)


def _check_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{_PREFIX} dtype must be a floating dtype or None, got {dt}")
    return dt


def _select(file: str, tensors: Mapping[str, TensorInfo], names: Iterable[str] | None) -> list:
    if names is None:
        return list(tensors)
    if isinstance(names, str):
        raise TypeError(f"{_PREFIX} names must be a collection of tensor names, not a str")
    wanted = list(dict.fromkeys(names))
    for name in wanted:
        if name not in tensors:
            raise _err(file, f"no tensor named {_short(name)}")
    return wanted


def load_file(
    path: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    """Load tensors of a safetensors file into C-contiguous NumPy arrays.

    Args:
        path: the ``.safetensors`` file.
        names: the tensors to load (all when ``None``); an unknown name is an error.
        dtype: floating tensors (F64/F32/F16/BF16) are converted to this floating dtype
            (default float32); ``None`` keeps the stored precision, except that BF16 becomes
            float32. Integer tensors keep their type; BOOL becomes ``bool``.

    Returns:
        ``{name: array}`` in header order (or in the order of ``names``).

    Raises:
        CheckpointError: malformed file or unknown name; CheckpointNotFoundError: no file.
    """
    dt = _check_dtype(dtype)
    file = os.fspath(path)
    f, size = _open_regular(file)
    with f:
        tensors, _, _ = _read_header_from(f, file, size)
        wanted = _select(file, tensors, names)
        out = {
            name: np.empty(tensors[name].shape, _target_dtype(tensors[name], dt)) for name in wanted
        }
        _fill(f, file, size, tensors, out)
        return out


# -------------------------------------------------------------------------------------
# tensor data: through safetensors.safe_open (memory-mapped), one bounded window at a time
# -------------------------------------------------------------------------------------

_CHUNK_BYTES = 1 << 20  # one slice copied out of the mapping and converted: stays in cache
_MAP_WINDOW = 16 << 20  # bytes read through one handle before it is closed (see _Reader)


def _target_dtype(info: TensorInfo, dtype: np.dtype | None) -> np.dtype:
    """The dtype a tensor loads as: floats as ``dtype`` (None: stored, BF16 -> float32),
    integers as stored (native order), BOOL as bool."""
    if info.dtype == "BOOL":
        return np.dtype(bool)
    if info.dtype not in _FLOAT_DTYPES:
        return DTYPES[info.dtype].newbyteorder("=")
    if dtype is not None:
        return dtype
    return np.dtype(np.float32) if info.dtype == "BF16" else DTYPES[info.dtype].newbyteorder("=")


class _Reader:
    """Reads the tensors of one safetensors file, already opened as ``f`` and validated
    (:func:`_read_header_from`), with ``safetensors.safe_open``.

    The handle is opened on ``/proc/self/fd/<fd>``: the inode safetensors maps is the one
    checked (not whatever the path names by then). A mapping keeps every page it touched
    resident (counted in RSS) until it is unmapped, so a handle is closed and reopened every
    ``_MAP_WINDOW`` bytes: the reader adds at most that (plus one ``_CHUNK_BYTES`` slice) to
    the memory of the arrays it fills. Before each handle the file's size is checked against
    the validated one: a file truncated while it is read is reported, not mapped past its end
    (a truncation *during* a window would still raise SIGBUS, as for every mmap reader).
    """

    def __init__(self, f: BinaryIO, file: str, size: int) -> None:
        import ml_dtypes  # noqa: F401 - registers numpy's "bfloat16", which safe_open returns
        from safetensors import safe_open

        self._open, self._fd, self._file, self._size = safe_open, f.fileno(), file, size
        proc = f"/proc/self/fd/{self._fd}"
        self._path = proc if os.path.exists(proc) else file
        self._handle: Any = None
        self._mapped = 0

    def _get_handle(self) -> Any:
        if self._handle is None or self._mapped >= _MAP_WINDOW:
            self.close()
            if os.fstat(self._fd).st_size != self._size:
                raise _err(self._file, "file changed size while it was read")
            try:
                self._handle = self._open(self._path, framework="numpy")
            except MemoryError:  # out of memory (mapping the file), not a bad checkpoint
                raise
            except Exception as exc:  # safetensors' own validation (SafetensorError) or OSError
                raise _err(self._file, f"safetensors cannot open it: {_short(exc, 200)}") from None
            self._mapped = 0
        return self._handle

    def close(self) -> None:
        self._handle = None  # drops the mapping (no slice object outlives a chunk)

    def rows(self, name: str, info: TensorInfo, step: int) -> Any:
        """Tensor ``name`` as it is stored, ``step`` rows (of the first dimension) at a time."""
        for r0 in range(0, info.shape[0], step):
            piece = self._get_handle().get_slice(name)[r0 : min(info.shape[0], r0 + step)]
            self._mapped += piece.nbytes
            yield piece

    def read_into(self, name: str, info: TensorInfo, dst: Any) -> None:
        """Tensor ``name`` into ``dst``, a C-contiguous array of its shape, converted slice by
        slice (rows of the first dimension): no tensor-sized temporary. ``dst`` may also be a
        row sink (:class:`RowSink`: a matrix quantized as it is read), given the slices."""
        if not isinstance(dst, np.ndarray):
            itemsize = DTYPES[info.dtype].itemsize
            row = math.prod(info.shape[1:])
            step = max(1, _CHUNK_BYTES // max(1, row * itemsize))
            for r0 in range(0, info.shape[0], step):
                piece = self._get_handle().get_slice(name)[r0 : min(info.shape[0], r0 + step)]
                self._mapped += piece.nbytes
                dst.write_rows(r0, piece)
            return
        flat = dst.reshape(-1)
        if flat.size == 0:
            return
        if len(info.shape) == 0:
            self._convert(self._get_handle().get_tensor(name), info, flat)
            return
        itemsize = DTYPES[info.dtype].itemsize
        row = math.prod(info.shape[1:])
        step = max(1, _CHUNK_BYTES // max(1, row * itemsize))
        for r0 in range(0, info.shape[0], step):
            r1 = min(info.shape[0], r0 + step)
            piece = self._get_handle().get_slice(name)[r0:r1]
            self._mapped += piece.nbytes
            self._convert(piece, info, flat[r0 * row : r1 * row])

    @staticmethod
    def _convert(piece: np.ndarray, info: TensorInfo, out: np.ndarray) -> None:
        src = piece.reshape(-1)
        if src.dtype == out.dtype:
            # the stored dtype kept (a bf16 checkpoint into bf16 storage): copy the bits as
            # unsigned integers -- NumPy's copy of the ml_dtypes bfloat16 dtype goes element by
            # element, 3x slower than this memcpy
            raw = np.dtype(f"u{src.dtype.itemsize}")
            np.copyto(out.view(raw), src.view(raw))
            return
        # safe_open returns BF16 as ml_dtypes.bfloat16, whose cast to float32 is exact (and
        # faster than shifting the bits with NumPy integer ops)
        np.copyto(out, src, casting="unsafe")


def _fill(
    f: BinaryIO,
    file: str,
    size: int,
    tensors: Mapping[str, TensorInfo],
    dests: Mapping[str, np.ndarray],
    progress: Any = None,
) -> None:
    """Tensors ``dests`` of the validated file ``f`` (header ``tensors``) into their
    destination arrays, in file order (sequential I/O)."""
    reader = _Reader(f, file, size)
    try:
        for name in sorted(dests, key=lambda k: tensors[k].offsets):
            info, dst = tensors[name], dests[name]
            if not isinstance(dst, np.ndarray):  # a RowSink
                if tuple(dst.shape) != info.shape:
                    raise ValueError(f"{_PREFIX} {name}: destination must have shape {info.shape}")
            elif dst.shape != info.shape or not dst.flags.c_contiguous:
                raise ValueError(f"{_PREFIX} {name}: destination must be C-contiguous {info.shape}")
            reader.read_into(name, info, dst)
            if progress is not None:
                progress(info.offsets[1] - info.offsets[0])
    finally:
        reader.close()


def _read_file_into(
    file: str,
    located: Mapping[str, tuple[str, TensorInfo]],
    dests: Mapping[str, np.ndarray],
    progress: Any = None,
) -> None:
    """Tensors ``dests`` of ``file`` (all located there) into their destination arrays, after
    checking the header still says what it said when the file was indexed."""
    f, size = _open_regular(file)
    with f:
        tensors, _, _ = _read_header_from(f, file, size)
        for name in dests:
            if tensors.get(name) != located[name][1]:
                raise _err(file, f"tensor {_short(name)} changed since the header was read")
        _fill(f, file, size, tensors, dests, progress)


def _load_located(
    located: Mapping[str, tuple[str, TensorInfo]],
    names: Collection[str],
    dtype: np.dtype | None,
) -> dict[str, np.ndarray]:
    """Fresh arrays for ``names`` (one file at a time), returned in the order of ``names``."""
    out = {
        name: np.empty(located[name][1].shape, _target_dtype(located[name][1], dtype))
        for name in names
    }
    by_file: dict[str, dict[str, np.ndarray]] = {}
    for name in names:
        by_file.setdefault(located[name][0], {})[name] = out[name]
    for file, dests in by_file.items():
        _read_file_into(file, located, dests)
    return out


def tensors_equal(located: Mapping[str, tuple[str, TensorInfo]], a: str, b: str) -> bool:
    """Whether the 2-D float tensors ``a`` and ``b`` hold equal values (as float32; NaN equals
    nothing), read a few MiB of rows at a time from both files."""
    (file_a, info_a), (file_b, info_b) = located[a], located[b]
    if info_a.shape != info_b.shape or len(info_a.shape) != 2:
        return False
    itemsize = max(DTYPES[info_a.dtype].itemsize, DTYPES[info_b.dtype].itemsize)
    step = max(1, _CHUNK_BYTES // max(1, info_a.shape[1] * itemsize))
    fa, size_a = _open_regular(file_a)
    fb, size_b = _open_regular(file_b)
    with fa, fb:
        for f, file, size, name in ((fa, file_a, size_a, a), (fb, file_b, size_b, b)):
            if _read_header_from(f, file, size)[0].get(name) != located[name][1]:
                raise _err(file, f"tensor {_short(name)} changed since the header was read")
        ra, rb = _Reader(fa, file_a, size_a), _Reader(fb, file_b, size_b)
        try:
            for pa, pb in zip(ra.rows(a, info_a, step), rb.rows(b, info_b, step), strict=True):
                if not np.array_equal(pa.astype(np.float32), pb.astype(np.float32)):
                    return False
        finally:
            ra.close()
            rb.close()
    return True


def load_into(
    located: Mapping[str, tuple[str, TensorInfo]],
    dests: Mapping[str, np.ndarray],
    progress: Any = None,
) -> None:
    """Copy each tensor of ``located`` into ``dests[name]`` (arrays of the tensor's shape, e.g.
    the model's own storage), one file and one tensor at a time, in file order.

    ``progress(nbytes)`` is called after each tensor with the bytes read.
    """
    by_file: dict[str, dict[str, np.ndarray]] = {}
    for name, dst in dests.items():
        by_file.setdefault(located[name][0], {})[name] = dst
    for file, file_dests in by_file.items():
        _read_file_into(file, located, file_dests, progress)


# -------------------------------------------------------------------------------------
# checkpoint directories
# -------------------------------------------------------------------------------------

_SHARD_NAME = re.compile(r"[^/\\\x00]+\.safetensors")


def _check_dir(path: str) -> None:
    if not os.path.exists(path):
        raise CheckpointNotFoundError(f"{_PREFIX} {path}: no such directory")
    if not os.path.isdir(path):
        raise _err(path, "not a directory")


def _read_json(path: str, what: str) -> Any:
    """The parsed JSON of a small checkpoint file (``what``: "index", "config"), its problems
    raised as CheckpointError / CheckpointNotFoundError naming the file."""
    raw = read_small(
        path,
        MAX_INDEX_BYTES,
        lambda problem: _err(path, problem),
        lambda: CheckpointNotFoundError(f"{_PREFIX} {path}: no such file"),
    )
    return _parse_json(path, raw, what)


def _read_index(directory: str) -> dict[str, str]:
    """The validated ``weight_map`` of ``model.safetensors.index.json``."""
    index_path = os.path.join(directory, INDEX_FILE)
    index = _read_json(index_path, "index")
    if not isinstance(index, dict):
        raise _err(index_path, f"must hold a JSON object, got {type(index).__name__}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise _err(index_path, "missing 'weight_map' object")
    if not weight_map:
        raise _err(index_path, "'weight_map' is empty")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise _err(
                index_path, f"weight_map[{_short(name)}] must be a file name, got {_short(shard)}"
            )
        if not _SHARD_NAME.fullmatch(shard) or ".." in shard or shard.startswith("."):
            raise _err(
                index_path,
                f"weight_map[{_short(name)}] = {_short(shard)} is not a plain "
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
                f"{_PREFIX} {directory}: no {SINGLE_FILE} or {INDEX_FILE} in the directory"
            )
        tensors, _, _ = read_header(single)
        return {name: (single, info) for name, info in tensors.items()}

    index_path = os.path.join(directory, INDEX_FILE)
    weight_map = _read_index(directory)
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not os.path.lexists(os.path.join(directory, shard)):
            raise CheckpointNotFoundError(
                f"{_PREFIX} {index_path}: shard {shard!r} listed in the index does not exist"
            )
    found: dict[str, tuple[str, TensorInfo]] = {}
    for shard in shards:
        shard_path = os.path.join(directory, shard)
        tensors, _, _ = read_header(shard_path)
        for name, info in tensors.items():
            if name in found:
                raise _err(shard_path, f"tensor {_short(name)} is also in {found[name][0]}")
            listed = weight_map.get(name)
            if listed is None:
                raise _err(shard_path, f"tensor {_short(name)} is not listed in {INDEX_FILE}")
            if listed != shard:
                raise _err(
                    shard_path, f"tensor {_short(name)} is listed in {INDEX_FILE} as in {listed!r}"
                )
            found[name] = (shard_path, info)
    for name, shard in weight_map.items():
        if name not in found:
            raise _err(
                os.path.join(directory, shard),
                f"tensor {_short(name)} listed in {INDEX_FILE} is not in this shard",
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
    dt = _check_dtype(dtype)
    located = read_checkpoint_index(path)
    if names is None:
        wanted = list(located)
    else:
        if isinstance(names, str):
            raise TypeError(f"{_PREFIX} names must be a collection of tensor names, not a str")
        wanted = list(dict.fromkeys(names))
        for name in wanted:
            if name not in located:
                raise _err(os.fspath(path), f"no tensor named {_short(name)} in the checkpoint")
    return _load_located(located, wanted, dt)


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
        f"{_PREFIX} {source}: missing {count} tensor(s): {head} (the config has "
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
        raise CheckpointNotFoundError(f"{_PREFIX} {config_path}: no such file")
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
        and {located[head][1].dtype, located[emb][1].dtype} <= _FLOAT_DTYPES
        and located[head][1].shape == located[emb][1].shape
        and not tensors_equal(located, head, emb)
    ):
        # transformers' tie_weights keeps a saved head that differs from the embedding
        warnings.warn(
            f"{_PREFIX} {directory}: tie_word_embeddings is true, but {head} differs from "
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
            f"{_PREFIX} {directory}: tie_word_embeddings is true, but {qhead[0]} / "
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
                raise _err(file, f"tensor {key} has dtype {info.dtype}, expected {want}")
        elif info.dtype not in _FLOAT_DTYPES:
            raise _err(file, f"tensor {key} has dtype {info.dtype}; weights must be floating")
    found = {key: located[key] for key in expected}
    if with_quantization:
        return cfg, found, quant
    if quant is not None:
        raise _err(directory, "holds a quantized model: load it with Transformer.from_pretrained")
    return cfg, found


def _is_quantized_copy_layout(
    located: Mapping[str, tuple[str, TensorInfo]], emb: str, quant: QuantConfig
) -> bool:
    """Whether ``lm_head.qweight`` / ``.scales`` have the dtypes and shapes of the quantized
    embedding ``emb`` (a float (rows, k) matrix, k a multiple of the group size); anything else
    is left to the key, shape and dtype checks."""
    e, q, s = (located[k][1] for k in (emb, "lm_head.qweight", "lm_head.scales"))
    if e.dtype not in _FLOAT_DTYPES or len(e.shape) != 2 or e.shape[1] % quant.group_size:
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
    step = max(1, _CHUNK_BYTES // max(1, e_info.shape[1] * DTYPES[e_info.dtype].itemsize))
    with ExitStack() as stack:
        opened: dict[str, tuple[dict[str, TensorInfo], _Reader]] = {}
        pieces = []
        for name in names:
            file, info = located[name]
            if file not in opened:
                f, size = _open_regular(file)
                stack.enter_context(f)
                opened[file] = (_read_header_from(f, file, size)[0], _Reader(f, file, size))
                stack.callback(opened[file][1].close)
            header, reader = opened[file]
            if header.get(name) != info:
                raise _err(file, f"tensor {_short(name)} changed since the header was read")
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
        raise _err(config_path, "quantization_config must be an object")
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise _err(
            config_path,
            f"quantization_config: quant_method {_short(method)} is not supported (llmkernels "
            f"reads its own {QUANT_METHOD!r} int8 / int4 layout; load the float checkpoint "
            "and quantize it with dtype='int8' or 'int4')",
        )
    bits, group = qc.get("bits"), qc.get("group_size")
    if not _is_int(bits) or bits not in (4, 8):
        raise _err(config_path, f"quantization_config: bits must be 8 or 4, got {_short(bits)}")
    if not _is_int(group) or group not in (32, 64, 128):
        raise _err(
            config_path,
            f"quantization_config: group_size must be 32, 64 or 128, got {_short(group)}",
        )
    written = QuantConfig(bits, group).to_dict()
    for key in ("format", "scale_dtype", "symmetric"):  # as save_pretrained writes them
        value, want = qc.get(key, written[key]), written[key]
        if value != want or isinstance(value, bool) != isinstance(want, bool):
            raise _err(
                config_path,
                f"quantization_config: {key} must be {json.dumps(want)} for bits={bits} "
                f"(llmkernels' layout), got {_short(value)}",
            )
    return QuantConfig(bits, group)


def check_finite_scales(file: str, key: str, scales: np.ndarray) -> None:
    """A quantized checkpoint's float16 ``scales`` must be finite (a NaN or Inf scale makes
    NaN logits): the first bad one named by tensor, row and group."""
    bad = ~np.isfinite(scales)
    if bad.any():
        row, group = (int(i) for i in np.argwhere(bad)[0])
        raise _err(
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
            raise _err(
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
    return cfg, _load_located(located, list(located), _check_dtype(dtype))


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


def save_file(
    path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray], dtype: Any = None
) -> None:
    """Write float32/float16/float64/bfloat16 (``ml_dtypes``) tensors, and int8 / uint8 ones
    (quantized codes), as a safetensors file (what ``load_file`` and the ``safetensors``
    package read). ``dtype``: convert every tensor to this (``"float32"``, ``"bfloat16"``,
    ``"float16"``) as it is written, one at a time; ``None`` keeps each tensor's dtype."""
    import ml_dtypes

    codes = {
        np.dtype("<f4"): "F32",
        np.dtype("<f2"): "F16",
        np.dtype("<f8"): "F64",
        np.dtype(ml_dtypes.bfloat16): "BF16",
        np.dtype("i1"): "I8",  # int8 / int4 codes of a quantized model (docs/quantization.md)
        np.dtype("u1"): "U8",
    }
    target = None if dtype is None else np.dtype(getattr(ml_dtypes, dtype, dtype))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    arrays, offset = [], 0
    for name, value in tensors.items():
        arr = np.asarray(value)
        out_dtype = arr.dtype if target is None else target
        if out_dtype.byteorder == "=" and out_dtype.itemsize > 1:
            out_dtype = out_dtype.newbyteorder("<")
        code = codes.get(out_dtype)
        if code is None:
            raise TypeError(f"[save_file] {name}: dtype {out_dtype} is not float16/32/64/bfloat16")
        nbytes = arr.size * out_dtype.itemsize
        header[name] = {
            "dtype": code,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        arrays.append((arr, out_dtype))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data aligned to 8 bytes, as the reference writer does
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for arr, out_dtype in arrays:
            # converted (and made contiguous) one tensor at a time: no model-sized temporary
            np.ascontiguousarray(arr.astype(out_dtype, copy=False)).tofile(f)
