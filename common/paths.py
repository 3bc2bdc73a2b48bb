"""Paths derived from a file that came from elsewhere (a dataset's metadata, a checkpoint's JSON) stay inside it.

A dataset or checkpoint is data: a name or template inside it may only reach files under its own root.
``inside`` is the one check every such path goes through; it refuses absolute paths, ``..`` that climbs
out and symbolic links that lead out, in one line naming the source and the offending value.
"""
from __future__ import annotations

import os
import re
import string
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


def plain_name(name: str, what: str) -> str:
    """``name`` if it can be one path component (a dataset's feature name becomes a folder): not empty,
    no path separator, not ``.`` or ``..``, no NUL; else ``UntrustedPathError`` naming ``what``."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise UntrustedPathError(f"{what} {name!r} is not a plain name (it becomes a folder: no '/', '\\', '.', "
                                 f"'..' or empty name); rename it")
    return name


# a template field may carry at most a zero-padded width ("03d"): nothing longer, no attribute or index access
_WIDTH_SPEC = re.compile(r"0?\d{0,2}d?")


def fill_template(template: str, values: dict[str, str | int], what: str) -> str:
    """``template.format(**values)`` for a template taken from a file from elsewhere, allowing only
    ``{name}`` and ``{name:03d}``-style fields whose name is one of ``values``: ``str.format`` would
    otherwise evaluate ``{name.attr}`` and ``{name[i]}`` on the package's own objects."""
    if not isinstance(template, str):
        raise UntrustedPathError(f"{what} must be a string, got {type(template).__name__}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise UntrustedPathError(f"{what} ({template!r}) is not a valid template ({exc})") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        spec_ok = (spec == "" or (isinstance(values.get(field), int) and _WIDTH_SPEC.fullmatch(spec)))
        if field not in values or conversion or not spec_ok:
            raise UntrustedPathError(
                f"{what} ({template!r}) has the field {{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; only {', '.join('{' + k + '}' for k in values)} "
                f"(integers with a width such as :03d) are allowed")
    return template.format(**values)


def links_inside(root: str | Path, what: str) -> None:
    """Refuse a folder from elsewhere holding a symbolic link that leads out of it (a zarr chunk linked
    to another file would be read as data): every link under ``root`` goes through ``inside``."""
    base = Path(root)
    for folder, dirs, files in os.walk(base):  # os.walk does not descend into linked folders
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink():
                inside(base, path.relative_to(base), f"{what}: {path.relative_to(base)}, a symbolic link,")
