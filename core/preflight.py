"""Checks that run before any work starts: output folders that can be written, and what a path holds.

Every command calls these before it loads a model, reads data or runs an episode, so a path it
cannot write ends in one line at once instead of after the work (a 50-episode evaluation, a
generation) is done.
"""
from __future__ import annotations

import os
from pathlib import Path

# what a path holds and whether its folder can be written: the data layer's writers check with them
# too, so they live there (datasets imports no core)
from datasets.episodes import SHOWN_ENTRIES, check_writable, contents


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary name beside ``path`` and rename it over: whole at every moment. The temporary
    name carries the process id, so two processes writing the same file never write into each other's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; a write that failed leaves nothing behind


def check_output_dir(path, option: str) -> None:
    """Refuse a folder the command cannot create or write: ``path`` or one of its parents is a
    file, or the nearest existing folder is read-only. Creates nothing."""
    p = Path(path)
    if (p.exists() or p.is_symlink()) and not p.is_dir():
        raise FileExistsError(f"{option}={p} is {contents(p)}, not a folder; choose another {option}=")
    check_writable(p, option, folder=p)


class WrittenFiles:
    """The files a command adds under ``root`` while it runs, for the line Ctrl-C ends it with."""

    def __init__(self, root):
        self.root = Path(root)
        self.before = self._files()

    def _files(self) -> set[Path]:
        return {p for p in self.root.rglob("*") if p.is_file()} if self.root.is_dir() else set()

    def interrupted(self):
        from .cli import NOTHING_WRITTEN, Interrupted

        new = sorted(self._files() - self.before)
        if not new:
            return Interrupted(NOTHING_WRITTEN)
        shown = ", ".join(str(p.relative_to(self.root)) for p in new[:SHOWN_ENTRIES])
        more = f" and {len(new) - SHOWN_ENTRIES} more" if len(new) > SHOWN_ENTRIES else ""
        return Interrupted(f"interrupted; {len(new)} file(s) were written under {self.root} ({shown}{more}), "
                           f"no summary")
