"""Paths derived from a file that came from elsewhere (a dataset's metadata, a checkpoint's JSON) stay inside it.

A dataset or checkpoint is data: a name or template inside it may only reach files under its own root.
``inside`` is the one check every such path goes through; it refuses absolute paths, ``..`` that climbs
out and symbolic links that lead out, in one line naming the source and the offending value.
"""
from __future__ import annotations

from pathlib import Path


class UntrustedPathError(ValueError):
    """A path taken from a file points outside that file's root: the CLIs print it as one line."""


def inside(root: str | Path, relative: str | Path, what: str) -> Path:
    """``root / relative``, resolved, if it stays under ``root``; else ``UntrustedPathError`` naming ``what``
    (for example "meta/info.json's video_path of episode 3")."""
    rel = Path(relative)
    base = Path(root).resolve()
    if rel.is_absolute():
        raise UntrustedPathError(f"{what} is an absolute path ({relative}); a dataset or checkpoint may only name "
                                 f"files inside {root}")
    target = (base / rel).resolve()
    if target != base and base not in target.parents:
        raise UntrustedPathError(f"{what} ({relative}) leads outside {root}; a dataset or checkpoint may only name "
                                 f"files inside it")
    return target
