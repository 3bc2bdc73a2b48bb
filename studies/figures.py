"""The adoption figure: each scene fix's success, clean and under each scene shift, beside the recipe's, per task and encoder.

Drawn from the rows of ``studies.claims.adoption``, so it shows what claims.md's adoption table says.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from common.figures import save_png
from studies.catalog import ADOPT_SHIFT_FLOOR

BAR_WIDTH = 0.2  # of one fix's group (four conditions at most: clean and three scene kinds)
LABEL_WIDTH = 14  # characters per line of a fix's name under its group
LEGEND_SPACE = 0.06  # of one panel's height, above the panels, for the one legend


def adoption_figure(rows: list[dict], path: Path) -> None:
    """One panel per (task, encoder): per fix (the recipe first), a bar per condition with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["task"], r["encoder"]) for r in rows))
    colours = {name: f"C{k}" for k, name in enumerate(dict.fromkeys(name for r in rows for name in r["success"]["fix"]))}
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.3 * len(panels)), squeeze=False)
    for ax, (task, encoder) in zip(axes[:, 0], panels):
        mine = [r for r in rows if (r["task"], r["encoder"]) == (task, encoder)]
        groups = [("the recipe", mine[0]["recipe_seeds"], mine[0]["success"]["recipe"]),
                  *((r["fix"], r["seeds"], r["success"]["fix"]) for r in mine)]
        conditions = list(mine[0]["success"]["fix"])
        for k, name in enumerate(conditions):
            x = np.arange(len(groups)) + (k - (len(conditions) - 1) / 2) * BAR_WIDTH
            found = [(xi, s[name]) for xi, (_, _, s) in zip(x, groups) if s.get(name)]
            if found:
                xs, est = zip(*found)
                mean = np.array([100 * e.mean for e in est])  # (fixes,) percent
                err = np.abs(np.array([[100 * e.lo for e in est], [100 * e.hi for e in est]]) - mean)  # (2, fixes) below/above
                ax.bar(xs, mean, BAR_WIDTH, yerr=err, capsize=2, label=name, color=colours[name])  # PushT renders no light
        ax.axhline(100 * ADOPT_SHIFT_FLOOR, color="k", linestyle=":", linewidth=1, label=f"rule: ≥ {ADOPT_SHIFT_FLOOR:.0%} under each shift")
        ax.set_xticks(np.arange(len(groups)), [textwrap.fill(f"{label} ({seeds} seed{'s' * (seeds != 1)})", LABEL_WIDTH)
                                               for label, seeds, _ in groups], fontsize=7)
        ax.set(ylim=(0, 105), ylabel="success %", title=f"{task}, {encoder}")
        ax.grid(axis="y", alpha=0.3)
    legend = {label: handle for ax in axes[:, 0] for handle, label in zip(*ax.get_legend_handles_labels())}  # every panel's
    fig.legend(legend.values(), legend.keys(), loc="upper center", ncol=len(legend), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - LEGEND_SPACE / len(panels)))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=100, metadata={"Software": None})  # no version stamp: a rerun writes the same bytes
