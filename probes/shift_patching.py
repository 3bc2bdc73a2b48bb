"""Which part of a trained encoder carries a corruption to its output: activation patching.

    python -m probes.shift_patching CKPT_A CKPT_B ... [--frames 48] [--corruption brightness:1] [--json OUT]

The first camera's ViT runs on corrupted frames with one component's output (a head, a block's attention
or MLP, every block's) restored to its value on the clean frames. With ``r = ||f(clean) - f(corrupted,
restored)|| / ||f(clean)||`` and ``r0`` with nothing restored, ``1 - r / r0`` is the share of the output's
change that passes through that component, everything downstream included.
"""
from __future__ import annotations

import torch

from envs.shifts import Shift
from probes.feature_shift import frames_of, measure_all, relative_change, save


@torch.no_grad()
def run(vit, x: torch.Tensor, clean: dict | None = None, restore: frozenset = frozenset()) -> tuple[torch.Tensor, dict]:
    """``vit(x)`` step by step; a name in ``restore`` ("block0.head2", "block1.attn", "block1.mlp", or
    "patches@block1": the patch tokens' residual stream entering block 1, "patches@out" leaving the
    last) takes its activation from ``clean`` (a previous run's activations). Returns (feature, activations)."""
    t, grid = vit.embed(x)  # (B, prefix + P, dim)
    acts = {}
    B, N, C = t.shape
    p = vit.num_prefix

    def stream(name):  # the patch tokens' residual stream at this point, restored if asked
        nonlocal t
        acts[name] = t[:, p:].clone()  # (B, P, C)
        if name in restore:
            t = torch.cat([t[:, :p], clean[name]], dim=1)  # (B, N, C)

    for i, block in enumerate(vit.blocks):
        stream(f"patches@block{i}")
        attn = block.attn
        attn.capture = True
        attn(block.norm1(t), grid, vit.num_prefix)
        attn.capture = False
        heads = attn.captured["out"].clone()  # (B, heads, N, head_dim)
        acts[f"block{i}.heads"] = heads.clone()
        for h in range(heads.shape[1]):
            if f"block{i}.head{h}" in restore or f"block{i}.attn" in restore:
                heads[:, h] = clean[f"block{i}.heads"][:, h]
        t = t + attn.proj(heads.transpose(1, 2).reshape(B, N, C))  # (B, N, C)
        mlp = block.mlp(block.norm2(t))  # (B, N, C)
        acts[f"block{i}.mlp"] = mlp
        t = t + (clean[f"block{i}.mlp"] if f"block{i}.mlp" in restore else mlp)
    stream("patches@out")
    return vit.read_out(vit.norm(t), grid), acts


def components(vit) -> list[tuple[str, frozenset]]:
    """(label, names restored) of every component the study patches."""
    depth, heads = len(vit.blocks), vit.cfg.num_heads
    out = [("every block's attention", frozenset(f"block{i}.attn" for i in range(depth))),
           ("every block's MLP", frozenset(f"block{i}.mlp" for i in range(depth)))]
    out += [(f"patch tokens entering block{i}", frozenset({f"patches@block{i}"})) for i in range(1, depth)]
    out.append(("patch tokens after the last block", frozenset({"patches@out"})))
    for i in range(depth):
        out += [(f"block{i}.attn", frozenset({f"block{i}.attn"})), (f"block{i}.mlp", frozenset({f"block{i}.mlp"}))]
        out += [(f"block{i}.head{h}", frozenset({f"block{i}.head{h}"})) for h in range(heads)]
    return out


def measure(checkpoint, frames: int, shift: Shift) -> dict:
    vit, meta, clean_x, shifted_x = frames_of(checkpoint, frames, shift)
    f_clean, clean = run(vit, clean_x)
    f_shift, _ = run(vit, shifted_x)
    r0 = relative_change(f_clean, f_shift)
    shares = {}
    for label, names in components(vit):
        f, _ = run(vit, shifted_x, clean, names)
        shares[label] = 1.0 - relative_change(f_clean, f) / r0
    att = meta["policy_config"]["vit"]["attention"]
    return {"checkpoint": str(checkpoint), "attention": att["kind"], "windows": att.get("windows", "paper"),
            "mask_mode": att.get("mask_mode", "additive"), "corruption": str(shift), "frames": frames,
            "output_change": r0, "share_through": shares}


def main(argv=None):
    args, results = measure_all(argv, "python -m probes.shift_patching", __doc__, measure)
    print(f"share of the output change under {args.corruption} through".ljust(44) +
          "".join(f"{r['attention'][:13]:>14}" for r in results))
    print("  (output change, nothing restored)".ljust(44) + "".join(f"{r['output_change']:>14.3f}" for r in results))
    for label in results[0]["share_through"]:
        print(f"  {label:42s}" + "".join(f"{r['share_through'].get(label, float('nan')):>14.2f}" for r in results))
    return save(args, results)


if __name__ == "__main__":
    main()
