"""``python -m policies.vision.masks KIND --grid HxW --heads H``: one attention pattern, per head, as
text, JSON or a PNG. The patterns themselves are in ``masks/__init__.py``; this module only reads them."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from common.figures import save_png
from ..attention import AttentionConfig
from . import FIB_WINDOWS, FibottentionPattern, LookHerePattern, make_pattern


CLI_KINDS = ("full", "fibottention", "lookhere-180", "lookhere-90", "lookhere-45", "bigbird")


def pattern_from_cli_kind(kind: str, heads: int, layer: int, depth: int, modified: bool, windows: str | None = None):
    """The pattern of one CLI kind, with ``AttentionConfig``'s defaults for every other setting."""
    if kind.startswith("lookhere-"):
        config = AttentionConfig(kind="lookhere", variant=kind.split("-", 1)[1])
    elif kind == "fibottention":
        config = AttentionConfig(kind="fibottention", modified=modified, **({"windows": windows} if windows else {}))
    elif kind in ("full", "bigbird"):
        config = AttentionConfig(kind=kind)
    else:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(CLI_KINDS)}")
    return make_pattern(config.kind, heads, layer, depth, **config.pattern_options())


def summarize(pattern, grid: tuple[int, int]) -> dict:
    """Visible fraction per head over the patch-to-patch block (prefix excluded)."""
    bias = pattern.dense_bias(grid, 0)
    p = grid[0] * grid[1]
    heads = []
    for h in range(pattern.num_heads):
        frac = 1.0 if bias is None else float(torch.isfinite(bias[h]).sum()) / (p * p)
        entry = {"visible_fraction": frac}
        if isinstance(pattern, FibottentionPattern):
            entry["offsets"] = pattern.offsets(grid)[h]
        if isinstance(pattern, LookHerePattern):
            direction, _ = pattern.plan()[h]
            entry["direction"] = direction or "undirected"
            entry["slope"] = pattern.head_slopes()[h]
        heads.append(entry)
    return {
        "kind": pattern.kind if not isinstance(pattern, LookHerePattern) else f"lookhere-{pattern.variant}",
        "grid": list(grid),
        "heads": heads,
        "visible_fraction": sum(h["visible_fraction"] for h in heads) / len(heads),
    }


def draw_png(pattern, grid: tuple[int, int], path: str) -> None:
    """Each head's view from the centre query (top row) and its whole P x P mask (bottom row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gh, gw = grid
    p = gh * gw
    bias = pattern.dense_bias(grid, 0)
    if bias is None:
        bias = torch.zeros(pattern.num_heads, p, p)
    centre = (gh // 2) * gw + gw // 2
    fig, axes = plt.subplots(2, pattern.num_heads, figsize=(1.8 * pattern.num_heads, 3.8), squeeze=False)
    for h in range(pattern.num_heads):
        row = bias[h, centre].reshape(gh, gw)
        # masked keys black, visible keys brighter where the distance penalty is smaller,
        # the query itself marked red
        view = torch.where(torch.isfinite(row), 0.3 + 0.7 * torch.exp(row.clamp(min=-30)), torch.zeros_like(row))
        rgb = view[..., None].repeat(1, 1, 3)
        rgb[gh // 2, gw // 2] = torch.tensor([1.0, 0.1, 0.1])
        axes[0, h].imshow(rgb.numpy())
        axes[0, h].set_title(f"head {h}", fontsize=8)
        axes[1, h].imshow(torch.isfinite(bias[h]).float(), cmap="gray", vmin=0, vmax=1)
        for ax in axes[:, h]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_ylabel("centre query", fontsize=8)
    axes[1, 0].set_ylabel("P x P mask", fontsize=8)
    fig.suptitle(f"{summarize(pattern, grid)['kind']} on a {gh}x{gw} grid", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def parse_grid(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--grid must look like 14x14, got {text!r}") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"--grid sides must be >= 1, got {text!r}")
    return h, w


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policies.vision.masks", description="Inspect one attention pattern, per head.")
    parser.add_argument("kind", choices=CLI_KINDS)
    parser.add_argument("--grid", type=parse_grid, default=(14, 14), help="patch grid HxW (default 14x14)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--layer", type=int, default=0, help="0-based layer index (Fibottention shuffle, LookHere slope)")
    parser.add_argument("--depth", type=int, default=12, help="number of layers (LookHere layer slope)")
    parser.add_argument("--modified", action="store_true", help="modified Fibottention (more local interactions)")
    parser.add_argument("--windows", choices=FIB_WINDOWS, help="Fibottention windows: paper (default) or robot "
                        "(the authors' robot-learning code: window N for every head)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", help="draw each head's pattern to this PNG file")
    args = parser.parse_args(argv)
    if args.heads < 1:
        parser.error("--heads must be >= 1")
    if not 0 <= args.layer < args.depth:
        parser.error(f"--layer must be in [0, --depth), got {args.layer} with depth {args.depth}")
    pattern = pattern_from_cli_kind(args.kind, args.heads, args.layer, args.depth, args.modified, args.windows)
    summary = summarize(pattern, args.grid)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['kind']}  grid {args.grid[0]}x{args.grid[1]}  heads {args.heads}  layer {args.layer}")
        for h, entry in enumerate(summary["heads"]):
            extra = ""
            if "offsets" in entry:
                extra = f"  offsets {entry['offsets']}"
            if "direction" in entry:
                extra = f"  {entry['direction']:<11} slope {entry['slope']:.4g}"
            print(f"  head {h:2d}: visible {100 * entry['visible_fraction']:6.2f}%{extra}")
        print(f"  mean visible fraction: {100 * summary['visible_fraction']:.2f}%")
    if args.png:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        draw_png(pattern, args.grid, args.png)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0
