"""Opening the files of a model directory safely: open first, then check what was opened.

Checking a path with ``stat()`` and then opening it is a race: a file replaced by a FIFO in
between makes ``open()`` block forever (and a device or socket can hang or misbehave too).
Here the path is opened with ``O_NONBLOCK`` (opening a FIFO or a device cannot block), the
descriptor is ``fstat``-ed, anything but a regular file is refused, and every read goes
through that descriptor, so what is read is what was checked.

Symlinks are followed, as the OS resolves them: HF's cache stores a snapshot as symlinks
(``snapshots/<rev>/model.safetensors -> ../../blobs/<sha>``), which must keep working. What
is checked is the object the link resolves to (a regular file); names taken from *inside*
the files (shard names in an index) are held to plain names in the directory elsewhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(
    path: str,
    error: Callable[[str], Exception],
    not_found: Callable[[], Exception] | None = None,
) -> tuple[BinaryIO, int]:
    """Open ``path`` for unbuffered binary reading and return it with its size.

    ``error(problem)`` builds the exception for a path that cannot be opened or is not a
    regular file; ``not_found()`` the one for a path that does not exist (default:
    ``error("no such file")``).
    """
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise (not_found() if not_found else error("no such file")) from None
    except OSError as exc:  # ENXIO (a socket), ELOOP, EACCES, ...
        raise error(f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error("not a regular file")
        os.set_blocking(fd, True)  # regular files never block; plain reads from here on
        f = open(fd, "rb", buffering=0, closefd=True)  # noqa: SIM115 - returned to the caller
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size  # type: ignore[return-value]


def read_small(
    path: str,
    limit: int,
    error: Callable[[str], Exception],
    not_found: Callable[[], Exception] | None = None,
) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes."""
    f, size = open_regular(path, error, not_found)
    with f:
        if size > limit:
            raise error(f"file of {size} bytes exceeds the {_human(limit)} limit")
        try:
            raw = f.read(size + 1)  # +1: notice a file that grew since fstat
        except OSError as exc:
            raise error(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise error(f"file exceeds the {_human(limit)} limit")
    return raw


class DuplicateKey(Exception):
    """A JSON object holding ``key`` twice (raised by :func:`no_duplicate_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` for the model files (config.json, safetensors
    headers and indexes): a key given twice raises :class:`DuplicateKey` instead of the last
    value winning silently."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"
