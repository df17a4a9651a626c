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

import json
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ._files import DuplicateKey, no_duplicate_keys, open_regular

__all__ = [
    "DTYPES",
    "CheckpointError",
    "CheckpointNotFoundError",
    "TensorInfo",
    "load_file",
    "load_into",
    "read_header",
    "save_file",
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
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})

MAX_HEADER_BYTES = 100 << 20  # 100 MiB, as the reference implementation
MAX_INDEX_BYTES = 64 << 20
MAX_NDIM = 64
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PREFIX = "[from_pretrained]"


class CheckpointError(ValueError):
    """A malformed or inconsistent checkpoint: ``"[from_pretrained] <file>: <problem>"``."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file or directory that does not exist (also a ``FileNotFoundError``)."""


class TensorInfo(NamedTuple):
    """One header entry: safetensors dtype string, shape and ``(begin, end)`` byte offsets."""

    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def err(file: str | os.PathLike[str], problem: str) -> CheckpointError:
    return CheckpointError(f"{PREFIX} {os.fspath(file)}: {problem}")


def short(text: object, limit: int = 80) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse_json(file: str, raw: bytes, what: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity; errors name ``file``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise err(file, f"{what} is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constants)
    except DuplicateKey as exc:
        raise err(file, f"duplicate key {short(exc.key)} in {what}") from None
    except RecursionError:
        raise err(file, f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise err(file, f"{what} is not valid JSON ({exc})") from None


def is_int(value: object) -> bool:
    return type(value) is int  # JSON ints only (bool is excluded)


def open_regular_file(path: str) -> tuple[BinaryIO, int]:
    """Open a regular file for binary reading; return it and its size (from the open fd).

    Opened first (non-blocking, so a FIFO cannot hang the open), then ``fstat``-ed: what is
    checked is what is read (see :mod:`llmkernels._files` for the symlink policy)."""
    return open_regular(
        path,
        lambda problem: err(path, problem),
        lambda: CheckpointNotFoundError(f"{PREFIX} {path}: no such file"),
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
            raise err(file, f"file ended after {offset + got} bytes (it changed while read?)")
        got += n
    return buf


def _parse_header(file: str, header: Any, data_size: int) -> tuple[dict[str, TensorInfo], dict]:
    """Validate a decoded header against a byte buffer of ``data_size`` bytes."""
    if not isinstance(header, dict):
        raise err(file, f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict):
        raise err(file, "__metadata__ must be an object of strings")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise err(file, f"__metadata__[{short(key)}] must be a string, got {short(value)}")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {short(name)}"
        if not isinstance(entry, dict):
            raise err(file, f"{where}: entry must be an object, got {type(entry).__name__}")
        keys = set(entry)
        if keys != _ENTRY_KEYS:
            missing, extra = _ENTRY_KEYS - keys, keys - _ENTRY_KEYS
            problem = (
                f"missing {', '.join(sorted(missing))}"
                if missing
                else f"unknown keys {', '.join(sorted(map(short, extra)))}"
            )
            raise err(file, f"{where}: {problem}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise err(
                file,
                f"{where}: unsupported dtype {short(dtype)} (supported: {', '.join(DTYPES)})",
            )
        if not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape):
            raise err(
                file, f"{where}: shape must be a list of non-negative ints, got {short(shape)}"
            )
        if len(shape) > MAX_NDIM:
            raise err(file, f"{where}: {len(shape)} dimensions (at most {MAX_NDIM})")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(is_int(o) and o >= 0 for o in offsets)
        ):
            raise err(
                file,
                f"{where}: data_offsets must be [begin, end] with non-negative "
                f"ints, got {short(offsets)}",
            )
        begin, end = offsets
        if begin > end:
            raise err(file, f"{where}: data_offsets out of order: begin {begin} > end {end}")
        if end > data_size:
            raise err(
                file,
                f"{where}: data_offsets [{begin}, {end}] point past the end of the data "
                f"({data_size} bytes follow the header)",
            )
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise err(
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
            raise err(
                file,
                f"tensor {short(name)} overlaps tensor {short(previous)} "
                f"(bytes {begin}..{position})",
            )
        if begin > position:
            raise err(
                file,
                f"gap of {begin - position} unindexed bytes before tensor "
                f"{short(name)} (bytes {position}..{begin})",
            )
        position, previous = end, name
    if position != data_size:
        raise err(
            file,
            f"{data_size - position} bytes after the last tensor are not indexed by the header",
        )
    return tensors, dict(metadata)


def read_header_from(f: BinaryIO, file: str, size: int) -> tuple[dict[str, TensorInfo], dict, int]:
    if size < 8:
        raise err(file, f"file of {size} bytes is too short for a safetensors header")
    prefix = f.read(8)
    if len(prefix) != 8:
        raise err(file, "file ended inside the 8-byte header length")
    n = int.from_bytes(prefix, "little")
    if n > size - 8:
        raise err(
            file,
            f"header length {n} exceeds the {size - 8} bytes after the length "
            f"field (truncated or not a safetensors file)",
        )
    if n > MAX_HEADER_BYTES:
        raise err(file, f"header length {n} exceeds the 100 MiB limit")
    if n < 2:
        raise err(file, f"header length {n} is too small for a JSON object")
    raw = _read_exact(f, file, 8, n).tobytes()
    header = parse_json(file, raw, "header")
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
    f, size = open_regular_file(file)
    with f:
        return read_header_from(f, file, size)


def check_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{PREFIX} dtype must be a floating dtype or None, got {dt}")
    return dt


def _select(file: str, tensors: Mapping[str, TensorInfo], names: Iterable[str] | None) -> list:
    if names is None:
        return list(tensors)
    if isinstance(names, str):
        raise TypeError(f"{PREFIX} names must be a collection of tensor names, not a str")
    wanted = list(dict.fromkeys(names))
    for name in wanted:
        if name not in tensors:
            raise err(file, f"no tensor named {short(name)}")
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
    dt = check_dtype(dtype)
    file = os.fspath(path)
    f, size = open_regular_file(file)
    with f:
        tensors, _, _ = read_header_from(f, file, size)
        wanted = _select(file, tensors, names)
        out = {
            name: np.empty(tensors[name].shape, _target_dtype(tensors[name], dt)) for name in wanted
        }
        _fill(f, file, size, tensors, out)
        return out


# -------------------------------------------------------------------------------------
# tensor data: through safetensors.safe_open (memory-mapped), one bounded window at a time
# -------------------------------------------------------------------------------------

CHUNK_BYTES = 1 << 20  # one slice copied out of the mapping and converted: stays in cache
_MAP_WINDOW = 16 << 20  # bytes read through one handle before it is closed (see Reader)


def _target_dtype(info: TensorInfo, dtype: np.dtype | None) -> np.dtype:
    """The dtype a tensor loads as: floats as ``dtype`` (None: stored, BF16 -> float32),
    integers as stored (native order), BOOL as bool."""
    if info.dtype == "BOOL":
        return np.dtype(bool)
    if info.dtype not in FLOAT_DTYPES:
        return DTYPES[info.dtype].newbyteorder("=")
    if dtype is not None:
        return dtype
    return np.dtype(np.float32) if info.dtype == "BF16" else DTYPES[info.dtype].newbyteorder("=")


class Reader:
    """Reads the tensors of one safetensors file, already opened as ``f`` and validated
    (:func:`read_header_from`), with ``safetensors.safe_open``.

    The handle is opened on ``/proc/self/fd/<fd>``: the inode safetensors maps is the one
    checked (not whatever the path names by then). A mapping keeps every page it touched
    resident (counted in RSS) until it is unmapped, so a handle is closed and reopened every
    ``_MAP_WINDOW`` bytes: the reader adds at most that (plus one ``CHUNK_BYTES`` slice) to
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
                raise err(self._file, "file changed size while it was read")
            try:
                self._handle = self._open(self._path, framework="numpy")
            except MemoryError:  # out of memory (mapping the file), not a bad checkpoint
                raise
            except Exception as exc:  # safetensors' own validation (SafetensorError) or OSError
                raise err(self._file, f"safetensors cannot open it: {short(exc, 200)}") from None
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
            step = max(1, CHUNK_BYTES // max(1, row * itemsize))
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
        step = max(1, CHUNK_BYTES // max(1, row * itemsize))
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
    reader = Reader(f, file, size)
    try:
        for name in sorted(dests, key=lambda k: tensors[k].offsets):
            info, dst = tensors[name], dests[name]
            if not isinstance(dst, np.ndarray):  # a RowSink
                if tuple(dst.shape) != info.shape:
                    raise ValueError(f"{PREFIX} {name}: destination must have shape {info.shape}")
            elif dst.shape != info.shape or not dst.flags.c_contiguous:
                raise ValueError(f"{PREFIX} {name}: destination must be C-contiguous {info.shape}")
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
    f, size = open_regular_file(file)
    with f:
        tensors, _, _ = read_header_from(f, file, size)
        for name in dests:
            if tensors.get(name) != located[name][1]:
                raise err(file, f"tensor {short(name)} changed since the header was read")
        _fill(f, file, size, tensors, dests, progress)


def load_located(
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
    step = max(1, CHUNK_BYTES // max(1, info_a.shape[1] * itemsize))
    fa, size_a = open_regular_file(file_a)
    fb, size_b = open_regular_file(file_b)
    with fa, fb:
        for f, file, size, name in ((fa, file_a, size_a, a), (fb, file_b, size_b, b)):
            if read_header_from(f, file, size)[0].get(name) != located[name][1]:
                raise err(file, f"tensor {short(name)} changed since the header was read")
        ra, rb = Reader(fa, file_a, size_a), Reader(fb, file_b, size_b)
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

SHARD_NAME = re.compile(r"[^/\\\x00]+\.safetensors")


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
