"""Writing the files a command exports (dashboards, rules): every failure one ``OSError`` naming the path."""

from __future__ import annotations

import errno
from pathlib import Path


class WriteError(OSError):
    """A file cannot be written where it was asked for; ``strerror`` names the path and the reason."""


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``files`` (relative path -> text) under ``out_dir``, making folders as needed; return the
    paths written. Raises :class:`WriteError` for a directory that is a file, unwritable, or full."""
    if out_dir.exists() and not out_dir.is_dir():
        raise WriteError(errno.ENOTDIR, f"cannot write into {out_dir}: it is a file, not a directory")
    written = []
    for name, text in files.items():
        path = out_dir / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            # The OS names the path only sometimes (and then the deepest one); say which file and why.
            raise WriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
        written.append(path)
    return written
