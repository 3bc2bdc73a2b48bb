"""When sparse attention pays, end to end: a whole BC training step against tokens per camera.

    python -m benchmarks.payoff                                   # CPU, 1 thread, batch 8
    python -m benchmarks.payoff --sizes 84 160 224 --cameras 1 --rounds 3

The policy is Lift BC with the MLP chunk head (``task=lift policy=bc policy.head=mlp``), one
image step, the default ViT (dim 96, depth 3, 4 heads, CLS) with 8-px patches on uncropped
``S x S`` images (``task.crop_size=S``): S = 84, 120, 160, 224 gives 10x10, 15x15, 20x20,
28x28 patches (100-784 patch tokens, plus CLS). One camera (agentview) or two (agentview +
eye-in-hand). Attention: full (dense SDPA, no mask), Fibottention ``impl=sparse`` and LookHere-90
``impl=sparse`` (the kernels of ``policies/vision/sparse``).

Step: forward + backward + AdamW on a random batch (``--batch-size``, default 8), median over
``--rounds`` steps, every configuration of a size timed in interleaved rounds. Beside it, the
full-attention policy's attention share: ``depth`` x fwd+bwd of SDPA on that step's q/k/v
shape (B x cameras, heads, N, head_dim), timed in the same rounds, over the full step time. No
attention speed-up can make the step faster than 1 / (1 - share).

Writes ``<out>/<name>.json``, ``<out>/<name>.md`` and ``<out>/plot.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from common.figures import save_png
from benchmarks.policy_speed import build, cpu_model, fake_batch

METHODS = {
    "full": ("full", []),
    "fibottention-sparse": ("fibottention", ["attention.impl=sparse"]),
    "lookhere90-sparse": ("lookhere", ["attention.impl=sparse", "attention.variant=90"]),
}


def overrides(size: int, cameras: int) -> list[str]:
    eye = f"[3,{size},{size}]" if cameras == 2 else "null"
    return [f"task.input_shapes.agentview_image=[3,{size},{size}]", f"task.input_shapes.robot0_eye_in_hand_image={eye}",
            f"task.crop_size={size}", "policy.vit.patch_size=8", "policy.head=mlp", "policy.n_image_obs_steps=1"]


class Case:
    def __init__(self, method: str, size: int, cameras: int, batch_size: int):
        kind, extra = METHODS[method]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.policy, self.pc = build("lift", "bc", kind, [*overrides(size, cameras), *extra])
        self.policy.train()
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=1e-4, weight_decay=1e-4)
        self.batch = fake_batch(self.pc, batch_size, torch.device("cpu"))
        self.method, self.size, self.cameras = method, size, cameras
        vit = self.pc.vit
        side = size // vit.patch_size
        self.patches = side * side
        self.tokens = self.patches + (1 if vit.use_cls else 0)
        self.times: list[float] = []

    def step(self):
        loss, _ = self.policy.compute_loss(self.batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def timed(self):
        t = time.perf_counter()
        self.step()
        self.times.append(time.perf_counter() - t)


class AttentionOnly:
    """depth x SDPA fwd+bwd on the full-attention step's q/k/v shape."""

    def __init__(self, case: Case, batch_size: int):
        vit = case.pc.vit
        images = batch_size * case.cameras * case.pc.n_image_obs_steps
        shape = (images, vit.num_heads, case.tokens, vit.dim // vit.num_heads)
        self.q, self.k, self.v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        self.g = torch.randn(shape)
        self.depth = vit.depth
        self.times: list[float] = []

    def timed(self):
        t = time.perf_counter()
        for _ in range(self.depth):
            out = F.scaled_dot_product_attention(self.q, self.k, self.v)
            torch.autograd.grad(out, (self.q, self.k, self.v), self.g)
        self.times.append(time.perf_counter() - t)


def crossover(rows: list[dict], method: str, cameras: int) -> int | None:
    """Smallest tokens per camera from which ``method`` is faster than full at every larger size."""
    mine = sorted((r for r in rows if r["method"] == method and r["cameras"] == cameras), key=lambda r: r["tokens"])
    first = None
    for r in mine:
        if r["speedup_vs_full"] > 1.0:
            first = r["tokens"] if first is None else first
        else:
            first = None
    return first


def to_markdown(rows: list[dict], meta: dict, summary: list[dict]) -> str:
    out = [f"Whole BC training step (forward + backward + AdamW, batch {meta['batch_size']}), {meta['device_model']}, "
           f"torch {meta['torch']}, {meta['threads']} thread, median of {meta['rounds']} interleaved steps. **Shared "
           f"machine** (two training jobs; load average {meta['loadavg_before']} before, {meta['loadavg_after']} after): "
           f"compare rows of the same size.", "",
           "| cameras | image px | tokens per camera | full ms | attention share of full | bound 1/(1-share) "
           "| Fibottention sparse ms | (speed-up) | LookHere-90 sparse ms | (speed-up) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["cameras"], r["size"], r["method"]): r for r in rows}
    for cameras in meta["cameras"]:
        for size in meta["sizes"]:
            full = by[(cameras, size, "full")]
            fib, lh = by[(cameras, size, "fibottention-sparse")], by[(cameras, size, "lookhere90-sparse")]
            out.append(f"| {cameras} | {size} | {full['tokens']} | {full['step_ms']:.0f} | {100 * full['attention_share']:.0f}% "
                       f"| {1 / (1 - full['attention_share']):.2f}x | {fib['step_ms']:.0f} | {fib['speedup_vs_full']:.2f}x "
                       f"| {lh['step_ms']:.0f} | {lh['speedup_vs_full']:.2f}x |")
    out += ["", "| cameras | method | faster than full from (tokens per camera) | speed-up at the largest size |",
            "|---:|---|---|---:|"]
    for s in summary:
        cross = "never in this grid" if s["crossover_tokens"] is None else f"{s['crossover_tokens']}"
        out.append(f"| {s['cameras']} | {s['method']} | {cross} | {s['speedup_at_largest']:.2f}x |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"full": ("k", "o"), "fibottention-sparse": ("C0", "s"), "lookhere90-sparse": ("C1", "^")}
    for cameras, ls in zip(meta["cameras"], ("-", "--")):
        for method in METHODS:
            mine = sorted((r for r in rows if r["method"] == method and r["cameras"] == cameras), key=lambda r: r["tokens"])
            x = [r["tokens"] for r in mine]
            color, marker = styles[method]
            axes[0].plot(x, [r["step_ms"] for r in mine], color=color, marker=marker, linestyle=ls,
                         label=f"{method}, {cameras} cam")
            if method != "full":
                axes[1].plot(x, [r["speedup_vs_full"] for r in mine], color=color, marker=marker, linestyle=ls,
                             label=f"{method}, {cameras} cam")
        full = sorted((r for r in rows if r["method"] == "full" and r["cameras"] == cameras), key=lambda r: r["tokens"])
        axes[1].plot([r["tokens"] for r in full], [1 / (1 - r["attention_share"]) for r in full], color="gray", linestyle=ls,
                     label=f"bound 1/(1-attention share), {cameras} cam")
    axes[0].set(xlabel="tokens per camera", ylabel="train step ms (batch %d)" % meta["batch_size"], yscale="log",
                title="BC training step")
    axes[1].axhline(1.0, color="k", linewidth=0.8)
    axes[1].set(xlabel="tokens per camera", ylabel="speed-up vs full attention", title="sparse vs full (same run)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"CPU, 1 thread, shared machine ({meta['device_model']})", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[84, 120, 160, 224], help="image side in px (8-px patches)")
    ap.add_argument("--cameras", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/payoff")
    ap.add_argument("--name", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = {"device_model": cpu_model(), "torch": torch.__version__, "threads": args.threads, "batch_size": args.batch_size,
            "rounds": args.rounds, "sizes": args.sizes, "cameras": args.cameras,
            "loadavg_before": [round(x, 2) for x in os.getloadavg()], "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "shared_machine": "two training jobs ran on the same 2 cores"}
    rows = []
    for size in args.sizes:
        for cameras in args.cameras:
            cases = [Case(m, size, cameras, args.batch_size) for m in METHODS]
            attn = AttentionOnly(cases[0], args.batch_size)
            for _ in range(args.warmup):
                for c in cases:
                    c.step()
                attn.timed()
            attn.times.clear()
            for _ in range(args.rounds):
                for c in cases:
                    c.timed()
                attn.timed()
            full_ms = 1e3 * statistics.median(cases[0].times)
            share = min(0.99, 1e3 * statistics.median(attn.times) / full_ms)
            for c in cases:
                ms = 1e3 * statistics.median(c.times)
                rows.append({"method": c.method, "size": size, "cameras": cameras, "patches": c.patches, "tokens": c.tokens,
                             "step_ms": ms, "step_ms_all": [1e3 * t for t in c.times], "speedup_vs_full": full_ms / ms,
                             "attention_share": share, "attention_only_ms": 1e3 * statistics.median(attn.times)})
                print(f"{size}px {cameras} cam {c.tokens} tok {c.method:20s} {ms:8.1f} ms  x{full_ms / ms:.2f} "
                      f"(attention share of full {share:.2f})", flush=True)
            del cases, attn
    summary = []
    largest = max(args.sizes)
    for cameras in args.cameras:
        for method in ("fibottention-sparse", "lookhere90-sparse"):
            at_largest = next(r for r in rows if r["method"] == method and r["cameras"] == cameras and r["size"] == largest)
            summary.append({"cameras": cameras, "method": method, "crossover_tokens": crossover(rows, method, cameras),
                            "speedup_at_largest": at_largest["speedup_vs_full"], "largest_tokens": at_largest["tokens"]})
    meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": rows, "summary": summary}, indent=2))
    md = to_markdown(rows, meta, summary)
    (out / f"{args.name}.md").write_text(md)
    plot(rows, meta, out / "plot.png")
    print(md)


if __name__ == "__main__":
    main()
