"""``key=value`` command lines, as Hydra writes overrides, for the flat CLIs (rollout, generate)."""
from __future__ import annotations

import yaml


def parse_key_values(argv: list[str], defaults: dict, usage: str) -> dict:
    """Values are parsed as YAML scalars (``3`` -> int, ``true`` -> bool, ``null`` -> None)."""
    args = dict(defaults)
    for a in argv:
        if "=" not in a:
            raise SystemExit(f"argument {a!r} is not key=value\n{usage}")
        k, v = a.split("=", 1)
        if k not in defaults:
            raise SystemExit(f"unknown argument {k!r}; known: {', '.join(defaults)}\n{usage}")
        args[k] = yaml.safe_load(v) if v else None
    return args
