"""Head diversity: how different are the heads of an encoder (both papers argue diverse heads help)?

    python -m probes.diversity RUN_DIR [RUN_DIR ...] [--study diversity] [--frames 32] [--recipe cpu]

Score per layer = 1 - mean pairwise linear CKA between the heads' outputs (every token of every image):
identical heads give 0, orthogonal ones approach 1. A run's value is the mean over its first camera
encoder's layers on ``--frames`` dataset frames, evenly spaced; each run becomes one record of measure
``head_diversity`` in ``results/<study>/records.jsonl`` (``python -m studies.claims`` compares them).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from policies.obs_encoder import crop_images

FRAMES = 32  # the frames of the committed measurements


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


def encoder_input(enc, key: str, images: np.ndarray) -> torch.Tensor:
    """uint8 camera frames (F, H, W, C) of ``key`` -> the ViT's input (F, C, crop, crop) in [0, 1], centre-cropped as at evaluation."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0  # (F, C, H, W)
    return crop_images(x, enc.crop_size_for(key, images.shape[1]), random=False)


@torch.no_grad()
def encoder_layers(run_dir: Path, frames: int) -> list[float]:
    """Each layer's head diversity of the run's first camera encoder on ``frames`` dataset frames."""
    from core.config import TaskConfig, from_dict
    from datasets.factory import make_dataset
    from policies.checkpoint import load_policy, read_checkpoint_meta

    meta, policy = read_checkpoint_meta(run_dir), load_policy(run_dir)
    data = make_dataset(from_dict(TaskConfig, meta["cfg"]["task"]), meta["policy_config"]["input_shapes"])
    key, enc = policy.config.image_keys[0], policy.obs_encoder
    x = encoder_input(enc, key, data.data[key][np.linspace(0, data.num_frames - 1, frames).astype(int)])  # (F, C, crop, crop)
    blocks = enc.vits[0].blocks
    for block in blocks:
        block.attn.capture = True
    try:
        enc.vits[0](x)
        return [head_diversity(block.attn.captured["out"])["diversity"] for block in blocks]
    finally:
        for block in blocks:
            block.attn.capture = False


def main(argv=None):
    from core.cli import OneLineParser, at_least
    from policies.checkpoint import read_checkpoint_meta
    from studies.records import Record, run_fields, save

    parser = OneLineParser(prog="python -m probes.diversity", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="training run directories")
    parser.add_argument("--study", default="diversity", help="records go to RESULTS/STUDY/records.jsonl")
    parser.add_argument("--results", default="results")
    parser.add_argument("--recipe", default="cpu", help="the recipe the runs were trained with")
    parser.add_argument("--frames", type=at_least(2), default=FRAMES)  # CKA over frames needs two
    args = parser.parse_args(argv)
    try:
        for run in args.runs:  # every run's encoder before the first is measured
            if (encoder := read_checkpoint_meta(run)["policy_config"].get("encoder", "vit")) != "vit":
                raise ValueError(f"{run} has encoder {encoder}: head diversity is a ViT's; give ViT runs")
        records = []
        for run in map(Path, args.runs):
            layers = encoder_layers(run, args.frames)
            records.append(Record(**run_fields(run, args.recipe), condition={}, measure="head_diversity", value=float(np.mean(layers)),
                                  detail={"frames": args.frames, "layers": layers}))
            print(f"{run}: head diversity {records[-1].value:.3f} (per layer {', '.join(f'{v:.3f}' for v in layers)})")
    except (ValueError, OSError, KeyError) as exc:
        parser.error(" ".join(str(exc).split()))
    print(f"{args.study}: {save(Path(args.results), args.study, records)} new or changed records; python -m studies.claims compares them")
    return records


if __name__ == "__main__":
    main()
