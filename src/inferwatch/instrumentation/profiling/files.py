"""The files on-demand profiles and OOM evidence write: one prefix, and a bound on how many are kept."""

from __future__ import annotations

import contextlib
from pathlib import Path

#: Prefix of every file a capture or an OOM writes: pruning removes only files that carry it.
FILE_PREFIX = "inferwatch-profile-"


def prune(directory: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest capture files in ``directory`` (only files this module names)."""
    files = sorted(
        (p for p in directory.glob(f"{FILE_PREFIX}*") if p.is_file()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in files[keep:]:
        with contextlib.suppress(OSError):
            stale.unlink()
