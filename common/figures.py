"""A matplotlib figure written whole: drawn under a temporary name beside its path, then renamed over it."""
from __future__ import annotations

import os
from pathlib import Path


def save_png(fig, path, **savefig) -> None:
    """Save ``fig`` to ``path`` as a PNG and close it; a Ctrl-C or a failed draw leaves the old picture (or none), never a
    half-written one, and no temporary file. ``savefig``: matplotlib's options (dpi, metadata, ...)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", **savefig)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)  # ours alone: gone already after the rename
