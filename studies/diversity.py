"""Head diversity: how different are the heads of an encoder (both papers argue diverse heads help)?

    python -m studies.diversity CKPT_A CKPT_B ... [--frames 32] [--json OUT]

Score per layer = 1 - mean pairwise linear CKA between the heads' outputs on a batch of
observations (features: every token of every image). Identical heads give CKA 1, so the
degenerate value is a diversity of 0; orthogonal representations approach 1.
"""
from __future__ import annotations

import torch


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """x, y: (samples, features). Kornblith et al. (2019), linear kernel."""
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    num = (y.T @ x).pow(2).sum()
    den = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    return float(num / den) if den > 0 else 1.0


def head_diversity(per_head: torch.Tensor) -> dict:
    """per_head: (B, heads, N, head_dim) -> {"diversity", "mean_cka", "cka": heads x heads}."""
    b, h, n, d = per_head.shape
    feats = [per_head[:, i].reshape(b * n, d).double() for i in range(h)]
    cka = [[1.0 if i == j else linear_cka(feats[i], feats[j]) for j in range(h)] for i in range(h)]
    off = [cka[i][j] for i in range(h) for j in range(h) if i != j]
    mean = sum(off) / len(off) if off else 1.0
    return {"diversity": 1.0 - mean, "mean_cka": mean, "cka": cka}


def _capture(vit, images: torch.Tensor) -> list[dict]:
    attns = [blk.attn for blk in vit.blocks]
    for a in attns:
        a.capture = True
    try:
        with torch.no_grad():
            vit(images)
        return [a.captured for a in attns]
    finally:
        for a in attns:
            a.capture = False
            a.captured = None


def encoder_diversity(vit, images: torch.Tensor) -> list[dict]:
    """Per layer head-diversity of a ViT on images (B, C, H, W) in [0, 1]."""
    return [head_diversity(c["out"]) for c in _capture(vit, images)]


def measure(checkpoint, frames: int, kind: str, severity: int) -> dict:
    """A checkpoint's first camera encoder on ``frames`` clean dataset frames (the corruption is not used)."""
    from studies.feature_shift import frames_of

    vit, meta, clean, _ = frames_of(checkpoint, frames, kind, severity)
    layers = encoder_diversity(vit, clean)
    return {"checkpoint": str(checkpoint), "attention": meta["policy_config"]["vit"]["attention"]["kind"],
            "diversity": sum(l["diversity"] for l in layers) / len(layers), "layers": [l["diversity"] for l in layers]}


def main(argv=None):
    from studies.feature_shift import measure_all, save

    args, results = measure_all(argv, "python -m studies.diversity", __doc__, measure)
    for r in results:
        print(f"{r['checkpoint']}: {r['attention']} diversity {r['diversity']:.3f} (per layer {', '.join(f'{d:.3f}' for d in r['layers'])})")
    return save(args, results)


if __name__ == "__main__":
    main()
