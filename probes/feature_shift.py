"""Where a uniform image change (brightness, contrast) moves a trained encoder's features.

    python -m probes.feature_shift CKPT_A CKPT_B ... [--frames 48] [--corruption brightness:1] [--json OUT]

For each checkpoint's first camera ViT, on dataset frames clean and corrupted, the relative
change ``||f(x') - f(x)|| / ||f(x)||`` (mean over frames) of every stage: the patch embedding,
after the position embedding, the CLS and the patch tokens after each block, each head's attention
output, and the encoder's output feature; plus the patch queries' attention mass on CLS and each block's
head diversity (``probes.diversity``), clean -> corrupted. A stage whose change grows is where the shift is amplified.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from core.config import TaskConfig, from_dict
from core.preflight import replace_file
from datasets.factory import make_dataset
from policies.checkpoint import load_policy, read_checkpoint_meta
from envs.corruptions import corrupt
from envs.shifts import PIXEL, Shift, parse_shift
from probes.diversity import encoder_input, head_diversity


def relative_change(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over the batch of ||a - b|| / ||a|| (each sample flattened)."""
    a, b = a.flatten(1), b.flatten(1)
    return float(((a - b).norm(dim=1) / a.norm(dim=1).clamp_min(1e-12)).mean())


@torch.no_grad()
def stages(vit, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every stage of ``vit.forward`` on images (B, C, H, W) in [0, 1]."""
    out = {}
    t = vit.patch_embed(vit.normalize_input(x))  # (B, dim, gh, gw)
    grid = (t.shape[-2], t.shape[-1])
    t = t.flatten(2).transpose(1, 2)  # (B, P, dim)
    out["patch_embed"] = t
    pos = vit._position(grid, t.device, t.dtype)
    if pos is not None:
        t = t + pos
        out["+pos_embed"] = t
    if vit.cls_token is not None:
        t = torch.cat([vit.cls_token.expand(t.shape[0], -1, -1), t], dim=1)  # (B, 1 + P, dim)
    p = vit.num_prefix
    for i, block in enumerate(vit.blocks):
        block.attn.capture = True
        t = block(t, grid, p)
        block.attn.capture = False
        cap = block.attn.captured
        heads = out[f"block{i}.heads"] = cap["out"]  # (B, heads, N, head_dim)
        for h in range(heads.shape[1]):
            out[f"block{i}.head{h}.patch_out"] = heads[:, h, p:]
        if p:
            scores = cap["q"] @ cap["k"].transpose(-2, -1) / cap["q"].shape[-1] ** 0.5  # (B, heads, N, N)
            bias = block.attn.dense_bias(grid, p, t.device)
            if bias is not None and block.attn.mask_mode == "multiplicative":  # the public code: logits x 0/1
                scores = scores * torch.isfinite(bias)
            elif bias is not None:
                scores = scores + bias
            out[f"block{i}.cls_mass"] = scores.softmax(-1)[:, :, p:, 0].mean(dim=(1, 2))  # (B,)
            out[f"block{i}.cls"] = t[:, :p]
        out[f"block{i}.patches"] = t[:, p:]
    out["feature"] = vit(x)
    return out


def frames_of(checkpoint, frames: int, shift: Shift):
    """(first camera's ViT, checkpoint meta, clean images, images under ``shift``) on ``frames`` dataset frames."""
    meta = read_checkpoint_meta(checkpoint)
    policy = load_policy(checkpoint)
    data = make_dataset(from_dict(TaskConfig, meta["cfg"]["task"]), meta["policy_config"]["input_shapes"])
    key = policy.config.image_keys[0]
    idx = np.linspace(0, data.num_frames - 1, frames).astype(int)
    clean = data.data[key][idx]  # (F, H, W, C) uint8
    shifted = np.stack([corrupt(im, *shift) for im in clean])
    enc = policy.obs_encoder
    return enc.vits[0], meta, encoder_input(enc, key, clean), encoder_input(enc, key, shifted)


def measure(checkpoint, frames: int, shift: Shift) -> dict:
    vit, meta, clean_x, shifted_x = frames_of(checkpoint, frames, shift)
    a, b = stages(vit, clean_x), stages(vit, shifted_x)
    rows = {}
    for name in a:
        if name.endswith("cls_mass"):
            rows[name] = {"clean": float(a[name].mean()), "corrupted": float(b[name].mean())}
        elif name.endswith(".heads"):  # 1 - mean pairwise CKA of the heads' outputs on every token
            rows[f"{name[:-6]}.head_diversity"] = {"clean": head_diversity(a[name])["diversity"],
                                                    "corrupted": head_diversity(b[name])["diversity"]}
        else:
            rows[name] = relative_change(a[name], b[name])
    return {"checkpoint": str(checkpoint), "attention": meta["policy_config"]["vit"]["attention"]["kind"],
            "input_norm": meta["policy_config"]["vit"].get("input_norm", "fixed"), "frames": frames, "corruption": str(shift), "stages": rows}


def corruption_arg(text: str) -> Shift:
    """argparse type of ``KIND:SEVERITY``, by the vocabulary's parser (``envs.shifts``)."""
    try:
        shift = parse_shift(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if shift.stage != PIXEL:  # the probes change dataset frames, which no simulator renders again
        raise argparse.ArgumentTypeError(f"{shift}: a scene shift is rendered by the simulator, and the probes corrupt "
                                         "dataset frames: give a pixel corruption, e.g. --corruption brightness:1")
    return shift


def measure_all(argv, prog: str, doc: str, measure, corruption: bool = True, vit_only: bool = True,
                into_run: bool = False) -> tuple[argparse.Namespace, list[dict]]:
    """The probes' command line: ``measure`` every checkpoint (under ``--corruption`` unless the probe takes
    none); a bad option, a missing or wrong checkpoint, or (``vit_only``: the probe reads a ViT's stages) a
    checkpoint of another encoder ends in one line, the options before anything loads."""
    from core.cli import OneLineParser, at_least
    from core.preflight import check_output_dir

    parser = OneLineParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--frames", type=at_least(1), default=48)
    if corruption:
        parser.add_argument("--corruption", type=corruption_arg, default="brightness:1", help="KIND:SEVERITY, e.g. contrast:2")
    parser.add_argument("--json", help="write the results here")
    if into_run:
        parser.add_argument("--into-run", action="store_true", help="also write each result into its run's eval/")
    args = parser.parse_args(argv)
    shift = (args.corruption,) if corruption else ()  # a probe that takes none measures (checkpoint, frames)
    try:
        if args.json:
            check_output_dir(Path(args.json).parent, "--json's folder")
        for c in args.checkpoints:
            encoder = read_checkpoint_meta(c)["policy_config"].get("encoder", "vit")
            if vit_only and encoder != "vit":
                raise ValueError(f"{c} has encoder {encoder}: {prog} reads a ViT's stages; give ViT checkpoints")
        results = [measure(c, args.frames, *shift) for c in args.checkpoints]
    except (ValueError, OSError, KeyError) as exc:
        parser.error(" ".join(str(exc).split("\n")))
    return args, results


def save(args, results: list[dict]) -> list[dict]:
    """``--json``: the results, written whole or not at all."""
    if args.json:
        replace_file(Path(args.json), json.dumps(results, indent=2))
    return results


def main(argv=None):
    args, results = measure_all(argv, "python -m probes.feature_shift", __doc__, measure)
    print(f"relative change under {args.corruption} ({args.frames} frames)".ljust(34) +
          "".join(f"{r['attention']:>14}" for r in results))
    for n in results[0]["stages"]:
        vals = [r["stages"].get(n) for r in results]
        cells = [f"{v['clean']:.2f}->{v['corrupted']:.2f}" if isinstance(v, dict) else ("" if v is None else f"{v:.3f}")
                 for v in vals]
        print(f"  {n:32s}" + "".join(f"{c:>14}" for c in cells))
    return save(args, results)


if __name__ == "__main__":
    main()
