"""Checks that run before any work starts: output folders that can be written, and what a path holds.

Every command calls these before it loads a model, reads data or runs an episode, so a path it
cannot write ends in one line at once instead of after the work (a 50-episode evaluation, a
generation) is done.
"""
from __future__ import annotations

import os
from pathlib import Path

SHOWN_ENTRIES = 5  # entries of a folder named in a refusal


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary name beside ``path`` and rename it over: whole at every moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def contents(path: Path) -> str:
    """What ``path`` holds, for a refusal: "a file (N bytes)", "an empty folder" or "a folder holding a, b, ..."."""
    p = Path(path)
    if p.is_symlink() or not p.is_dir():
        return f"a file ({p.stat().st_size} bytes)" if p.is_file() else "something that is not a folder"
    names = sorted(c.name + ("/" if c.is_dir() else "") for c in p.iterdir() if c.name != ".lock")
    if not names:
        return "an empty folder"
    more = f" and {len(names) - SHOWN_ENTRIES} more" if len(names) > SHOWN_ENTRIES else ""
    return f"a folder holding {', '.join(names[:SHOWN_ENTRIES])}{more}"


def nearest_existing(path: Path) -> Path:
    p = Path(path).absolute()
    while not (p.exists() or p.is_symlink()):
        p = p.parent
    return p


def check_output_dir(path, option: str) -> None:
    """Refuse a folder the command cannot create or write: ``path`` or one of its parents is a
    file, or the nearest existing folder is read-only. Creates nothing."""
    p = Path(path)
    if (p.exists() or p.is_symlink()) and not p.is_dir():
        raise FileExistsError(f"{option}={p} is {contents(p)}, not a folder; choose another {option}=")
    base = nearest_existing(p)
    if not base.is_dir():
        raise FileExistsError(f"{option}={p} cannot be created: {base} is a file; choose another {option}=")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"{option}={p} cannot be written: {base} is read-only for this user; "
                              f"make it writable or choose another {option}=")


def check_output_file(path, option: str) -> None:
    """The same for a file (or a dataset folder written by renaming): its folder must be writable."""
    p = Path(path)
    base = nearest_existing(p.parent)
    if not base.is_dir():
        raise FileExistsError(f"{option}={p} cannot be created: {base} is a file; choose another {option}=")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"{option}={p} cannot be written: {base} is read-only for this user; "
                              f"make it writable or choose another {option}=")


class WrittenFiles:
    """The files a command adds under ``root`` while it runs, for the line Ctrl-C ends it with."""

    def __init__(self, root):
        self.root = Path(root)
        self.before = self._files()

    def _files(self) -> set[Path]:
        return {p for p in self.root.rglob("*") if p.is_file()} if self.root.is_dir() else set()

    def interrupted(self):
        from .cli import Interrupted

        new = sorted(self._files() - self.before)
        if not new:
            return Interrupted("interrupted; nothing was written")
        shown = ", ".join(str(p.relative_to(self.root)) for p in new[:SHOWN_ENTRIES])
        more = f" and {len(new) - SHOWN_ENTRIES} more" if len(new) > SHOWN_ENTRIES else ""
        return Interrupted(f"interrupted; {len(new)} file(s) were written under {self.root} ({shown}{more}), "
                           f"no summary")
