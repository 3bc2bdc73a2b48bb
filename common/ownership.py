"""One rule for every ``overwrite=true``: a command replaces only what it wrote itself, and only after
every check has passed.

What a command writes carries its mark: a folder holds a marker file naming the command and listing
every file it wrote (``.export``, ``.generate``); a single file, which cannot hold one, carries an
attribute of its own format (a robomimic hdf5's ``data`` group: ``generated_by``). Anything without
the mark (a dataset downloaded or brought, one written before the mark existed), or a folder holding
files the marker does not list (notes, annotations added to it), is refused in one line naming it and
the way on. Training's run folders follow the same rule with their ``.run`` marker (core/rundir.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SHOWN_ENTRIES = 5  # entries of a folder named in a refusal


def contents(path: Path) -> str:
    """What ``path`` holds, for a refusal: "a file (N bytes)", "an empty folder" or "a folder holding a, b, ..."."""
    p = Path(path)
    if p.is_symlink() or not p.is_dir():
        return f"a file ({p.stat().st_size} bytes)" if p.is_file() else "something that is not a folder"
    names = sorted(c.name + ("/" if c.is_dir() else "") for c in p.iterdir() if c.name != ".lock")
    if not names:
        return "an empty folder"
    return f"a folder holding {shown(names)}"


def shown(names: list[str]) -> str:
    """The first SHOWN_ENTRIES of ``names`` and how many more."""
    more = f" and {len(names) - SHOWN_ENTRIES} more" if len(names) > SHOWN_ENTRIES else ""
    return ", ".join(names[:SHOWN_ENTRIES]) + more


def _entries(root: Path) -> set[str]:
    """Every file, link and folder under ``root``, relative, '/'-separated."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@dataclass(frozen=True)
class Owner:
    """A command that writes outputs it may later replace: its name, the marker file it leaves in a
    folder it writes, and (for messages) what it writes."""

    command: str  # recorded as written_by: "export_dataset.py"
    marker: str  # the marker file's name in a folder it wrote: ".export"
    kind: str  # "an export": "overwrite=true replaces only <kind>"
    unmarked: str = ""  # said of a folder without the marker, e.g. that older outputs carry none

    def sign(self, folder: Path) -> None:
        """Write the marker into ``folder`` (the temporary folder, once every file is in it), listing them all."""
        files = sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())
        record = {"written_by": self.command, "pid": os.getpid(), "files": files}
        (Path(folder) / self.marker).write_text(json.dumps(record) + "\n")

    def _listed(self, folder: Path) -> set[str] | None:
        """What the marker says this command wrote (with the marker and the folders on the way); None
        without a marker of this command (a damaged marker vouches for nothing)."""
        try:
            record = json.loads((folder / self.marker).read_text())
            if record.get("written_by") != self.command:
                return None
            files = {str(f) for f in record["files"]}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return files | {self.marker} | {p.as_posix() for f in files for p in Path(f).parents}

    def check_replaceable(self, out: Path, option: str = "out",
                          file_signed_by: Callable[[Path], str | None] | None = None, file_mark: str = "") -> None:
        """Refuse to replace ``out`` unless this command wrote it and it holds nothing else. Deletes nothing.

        A folder needs the marker; a single file needs ``file_mark`` (say "a generated_by attribute in
        its data group"), which ``file_signed_by(out)`` reads: the command that wrote it, or None."""
        out = Path(out)
        if out.is_dir() and not out.is_symlink():
            listed = self._listed(out)
            if listed is None:
                raise self._refusal(out, option, f"no {self.marker} marker{self.unmarked}")
            foreign = sorted(_entries(out) - listed)
            if foreign:
                raise FileExistsError(f"{option}={out} holds {shown(foreign)}, which {self.command} did not write; "
                                      f"overwrite=true replaces only what it wrote: move those away, choose another "
                                      f"{option}= or remove it yourself")
            return
        if file_signed_by is not None and out.is_file() and not out.is_symlink():
            if file_signed_by(out) != self.command:
                raise self._refusal(out, option, f"no {file_mark}{self.unmarked}")
            return
        raise self._refusal(out, option, f"no {self.marker} marker")

    def _refusal(self, out: Path, option: str, why: str) -> FileExistsError:
        return FileExistsError(f"{option}={out} is {contents(out)}, not a dataset written by {self.command} ({why}); "
                               f"overwrite=true replaces only {self.kind}: choose another {option}= or remove it yourself")
