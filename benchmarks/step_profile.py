"""Where the time of one training step goes, per CPU recipe: a torch.profiler breakdown.

    python -m benchmarks.step_profile                          # Lift BC full/Fibottention/LookHere, PushT diffusion
    python -m benchmarks.step_profile --recipes lift:bc:full pusht:diffusion:full --rounds 3

Each recipe's policy is built through the config tree exactly as ``train_policy.py task=...
policy=... attention=... recipe=cpu`` builds it (``benchmarks/policy_speed.build``), with the
recipe's batch size, AdamW settings, gradient clipping and diffusers ``EMAModel``; the batch is
random data of the task's shapes (uint8 images, as the loader delivers them). One step is what
``core/training.py`` does: batch to device, ``compute_loss``, ``zero_grad``, ``backward``,
``clip_grad_norm_``, ``AdamW.step``, ``EMAModel.step`` (the LR scheduler's step is left out).

Groups. Forward: module hooks open a ``record_function`` range per module, so an op belongs
to the innermost labelled module around it: patch embedding (``ViT.patch_embed``), attention
qkv / proj (``Attention.qkv`` / ``.proj``), attention kernel (the rest of ``Attention``: the
reshapes and the SDPA call or sparse kernel), MLP (``Block.mlp``), ViT rest (layer norms,
residual adds, position embedding, pooling / keypoints, read-out), head or U-Net, data / batch
conversion (batch to device, ``ObsEncoder``'s own ops: uint8 -> float, /255, crop, low-dim
normalisation, concatenation). Backward: each autograd node's ``evaluate_function`` event is
matched to its forward op by the autograd sequence number and gets that op's group. Optimizer:
zero_grad + clip_grad_norm_ + AdamW.step; EMA: EMAModel.step. Other: ops outside every group
(the loss, diffusion noising and timestep sampling, the policy's action normalisation) and the
time between ops (Python, dispatcher and profiler overhead): the step's wall time minus the
groups.

The profiled step runs slower than a plain one (the profiler costs a few microseconds per op):
the table gives profiled ms and shares, and beside them the median plain step time of the
same run. FLOP: ``torch.utils.flop_counter.FlopCounterMode`` over forward + backward (matmuls,
convolutions, SDPA; the elementwise ops and the optimizer are not counted), divided by the
plain step time; the reference is the fp32 ``torch.mm`` rate of the step's largest linear
shapes (forward ``(M, K) x (K, N)`` of the linear layers with the most FLOP), timed in the same
run. Writes ``<out>/<name>.json`` and ``<out>/<name>.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch
from torch import nn
from torch.autograd.profiler import record_function

from benchmarks.policy_speed import cpu_model, fake_batch, write_report
from core.config import compose
from policies.registry import make_policy
from policies.vision.attention import Attention
from policies.vision.vit import Block, ViT

GROUPS = (
    "patch embedding",
    "attention: qkv",
    "attention: kernel (SDPA / sparse)",
    "attention: proj",
    "MLP",
    "ViT rest (norms, residuals, pooling)",
    "head / U-Net",
    "data / batch conversion",
    "optimizer (zero_grad, clip, AdamW)",
    "EMA",
    "other (loss, noise, Python, overhead)",
)
PREFIX = "grp::"
DEFAULT_RECIPES = ("lift:bc:full", "lift:bc:fibottention", "lift:bc:lookhere", "pusht:diffusion:full")


def build_recipe(spec: str, overrides: list[str] = ()):
    """``task:policy:attention`` -> (policy, policy config, train config) of ``recipe=cpu``."""
    import numpy as np

    task, pol, att = spec.split(":")
    cfg = compose("config", [f"task={task}", f"policy={pol}", f"attention={att}", "recipe=cpu", *overrides])
    pc = cfg.policy
    stats = {k: {"min": -np.ones(pc.input_shapes[k][0], np.float32), "max": np.ones(pc.input_shapes[k][0], np.float32)}
             for k in pc.lowdim_keys}
    stats["action"] = {"min": -np.ones(pc.action_dim, np.float32), "max": np.ones(pc.action_dim, np.float32)}
    torch.manual_seed(0)
    return make_policy(pc, stats), pc, cfg.train


def module_group(policy: nn.Module, name: str, module: nn.Module) -> str | None:
    """The group label of a module (None: not labelled; its ops go to the enclosing label)."""
    if isinstance(module, ViT):
        return "ViT rest (norms, residuals, pooling)"
    if isinstance(module, Block):
        return "ViT rest (norms, residuals, pooling)"
    if name.endswith("patch_embed"):
        return "patch embedding"
    if isinstance(module, Attention):
        return "attention: kernel (SDPA / sparse)"
    if name.endswith("attn.qkv"):
        return "attention: qkv"
    if name.endswith("attn.proj"):
        return "attention: proj"
    if name.endswith(".mlp"):
        return "MLP"
    if name in ("head", "unet"):
        return "head / U-Net"
    if name == "obs_encoder":
        return "data / batch conversion"
    return None


class Labeller:
    """Forward pre/post hooks that open/close a record_function range per labelled module."""

    def __init__(self, policy: nn.Module):
        self.handles = []
        self.stack: list = []
        for name, module in policy.named_modules():
            group = module_group(policy, name, module)
            if group is None:
                continue
            label = f"{PREFIX}{group}"
            self.handles.append(module.register_forward_pre_hook(lambda m, a, label=label: self._enter(label)))
            self.handles.append(module.register_forward_hook(lambda m, a, o: self._exit()))

    def _enter(self, label):
        rf = record_function(label)
        rf.__enter__()
        self.stack.append(rf)

    def _exit(self):
        self.stack.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()


class Step:
    """One recipe's training step, as core/training.py runs it."""

    def __init__(self, spec: str, batch_size: int | None, device):
        from diffusers.training_utils import EMAModel

        self.spec = spec
        self.policy, self.pc, self.tcfg = build_recipe(spec)
        self.policy.to(device).train()
        self.batch_size = batch_size or self.tcfg.batch_size
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=self.tcfg.lr, weight_decay=self.tcfg.weight_decay,
                                     betas=(0.95, 0.999))
        self.ema = EMAModel(self.policy.parameters(), decay=self.tcfg.ema_max_decay, use_ema_warmup=True,
                            power=self.tcfg.ema_power) if self.tcfg.ema else None
        self.cpu_batch = fake_batch(self.pc, self.batch_size, torch.device("cpu"))
        self.device = device
        self.times: list[float] = []

    def __call__(self, labelled: bool = False):
        def phase(name):
            return record_function(f"{PREFIX}{name}") if labelled else _null()

        with phase("data / batch conversion"):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in self.cpu_batch.items()}
        with record_function("phase::forward") if labelled else _null():
            loss, _ = self.policy.compute_loss(batch)
        with phase("optimizer (zero_grad, clip, AdamW)"):
            self.opt.zero_grad(set_to_none=True)
        with record_function("phase::backward") if labelled else _null():
            loss.backward()
        with phase("optimizer (zero_grad, clip, AdamW)"):
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.tcfg.grad_clip)
            self.opt.step()
        if self.ema is not None:
            with phase("EMA"):
                self.ema.step(self.policy.parameters())

    def timed(self):
        t = time.perf_counter()
        self()
        self.times.append(time.perf_counter() - t)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _label_of(event) -> str | None:
    """The innermost group label around a profiler event (itself included)."""
    e = event
    while e is not None:
        if e.name.startswith(PREFIX):
            return e.name[len(PREFIX):]
        e = e.cpu_parent
    return None


def _inside(event, prefix: str) -> bool:
    e = event.cpu_parent
    while e is not None:
        if e.name.startswith(prefix):
            return True
        e = e.cpu_parent
    return False


def breakdown(step: Step) -> dict:
    """Profile one step; ms per group (exclusive), total wall ms of the profiled step."""
    labeller = Labeller(step.policy)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            with record_function("phase::step"):
                step(labelled=True)
            wall_ms = (time.perf_counter() - t) * 1e3
    finally:
        labeller.remove()
    events = list(prof.events())
    ms = defaultdict(float)
    ms_bwd = defaultdict(float)  # the backward share of ms
    # forward and phase labels: exclusive time of each label range (minus its labelled children)
    labels = [e for e in events if e.name.startswith(PREFIX)]
    child_total = defaultdict(float)
    for e in labels:
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith(PREFIX):
            parent = parent.cpu_parent
        if parent is not None:
            child_total[id(parent)] += e.cpu_time_total
    for e in labels:
        ms[e.name[len(PREFIX):]] += (e.cpu_time_total - child_total[id(e)]) / 1e3
    # backward: autograd nodes -> the group of the forward op with the same sequence number
    seq_group = {}
    for e in events:
        if getattr(e, "sequence_nr", -1) >= 0 and not e.name.startswith("autograd::") and _inside(e, "phase::forward"):
            seq_group.setdefault(e.sequence_nr, _label_of(e))
    backward_ms = unmatched = 0.0
    for e in events:
        if not e.name.startswith("autograd::engine::evaluate_function"):
            continue
        if _inside(e, "autograd::engine::evaluate_function"):
            continue
        group = seq_group.get(e.sequence_nr)
        if group is None and any(s in e.name for s in ("ScaledDotProduct", "LookHere", "Fib", "Csr", "Attention")):
            group = "attention: kernel (SDPA / sparse)"
        dt = e.cpu_time_total / 1e3
        backward_ms += dt
        if group is None:
            unmatched += dt
            group = "other (loss, noise, Python, overhead)"
        ms[group] += dt
        ms_bwd[group] += dt
    attributed = sum(v for k, v in ms.items() if k in GROUPS)
    ms["other (loss, noise, Python, overhead)"] += max(0.0, wall_ms - attributed)
    return {"profiled_step_ms": wall_ms, "ms": {g: ms.get(g, 0.0) for g in GROUPS},
            "ms_backward": {g: ms_bwd.get(g, 0.0) for g in GROUPS},
            "backward_nodes_ms": backward_ms, "backward_unmatched_ms": unmatched}


def step_flops(step: Step) -> tuple[float, list[tuple[int, int, int]]]:
    """FLOP of forward + backward (FlopCounterMode) and the forward (M, K, N) of every linear layer."""
    from torch.utils.flop_counter import FlopCounterMode

    shapes = []

    def hook(module, args, out):
        x = args[0]
        shapes.append((x.numel() // x.shape[-1], module.in_features, module.out_features))

    handles = [m.register_forward_hook(hook) for m in step.policy.modules() if isinstance(m, nn.Linear)]
    try:
        batch = {k: v.to(step.device) for k, v in step.cpu_batch.items()}
        with FlopCounterMode(display=False) as counter:
            loss, _ = step.policy.compute_loss(batch)
            loss.backward()
        step.opt.zero_grad(set_to_none=True)
    finally:
        for h in handles:
            h.remove()
    return float(counter.get_total_flops()), shapes


def gemm_rate(shape: tuple[int, int, int], min_time: float = 0.2) -> float:
    """GFLOP/s of an fp32 (M, K) x (K, N) torch.mm."""
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        torch.mm(a, b)
        iters += 1
    return 2 * m * k * n * iters / (time.perf_counter() - t0) / 1e9


def to_markdown(rows: list[dict], meta: dict) -> str:
    out = [
        f"One training step per CPU recipe (`recipe=cpu`, its batch size), {meta['device_model']}, torch "
        f"{meta['torch']}, {meta['threads']} thread. **The machine was shared with two training jobs** "
        f"(load average {meta['loadavg_before']} before, {meta['loadavg_after']} after): compare rows of this "
        f"run, not absolute values. Profiled ms (the profiler slows a step by a few us per op); "
        f"`plain step` is the median of {meta['rounds']} unprofiled steps, interleaved over recipes.",
        "",
    ]
    for r in rows:
        out += [f"### {r['recipe']}  (batch {r['batch_size']}, {r['tokens_per_camera']} tokens per camera, "
                f"attention impl {r['impl']}, {r['params_M']:.2f} M params)", "",
                f"plain step {r['plain_step_ms']:.0f} ms (profiled {r['profiled_step_ms']:.0f} ms)", "",
                "| group | ms | of which backward | share |", "|---|---:|---:|---:|"]
        for g in GROUPS:
            v = r["ms"][g]
            out.append(f"| {g} | {v:.1f} | {r['ms_backward'][g]:.1f} | {100 * v / r['profiled_step_ms']:.1f}% |")
        out.append("")
    out += ["### Arithmetic rate vs the core's GEMM rate", "",
            "| recipe | step GFLOP (fwd+bwd) | step GFLOP/s | largest linear (M, K, N) | fp32 GEMM GFLOP/s "
            "| step / GEMM |", "|---|---:|---:|---|---:|---:|"]
    for r in rows:
        out.append(f"| {r['recipe']} | {r['gflop']:.2f} | {r['gflop_per_s_best']:.1f} ({r['gflop_per_s']:.1f}) | "
                   f"{tuple(r['gemm_shape'])} | {r['gemm_gflop_per_s_best']:.1f} ({r['gemm_gflop_per_s']:.1f}) | "
                   f"{r['gflop_per_s_best'] / r['gemm_gflop_per_s_best']:.2f} ({r['gflop_per_s'] / r['gemm_gflop_per_s']:.2f}) |")
    out += ["", "GFLOP/s: best step / best GEMM sample (in brackets: medians), both from the same interleaved rounds; "
            "the FLOP count covers matmuls, convolutions and attention only (forward + backward), so the ratio is "
            "a lower bound on how busy the core's GEMM units are kept."]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES), help="task:policy:attention, recipe=cpu")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the recipe's train.batch_size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="plain timed steps per recipe, interleaved")
    ap.add_argument("--profiles", type=int, default=3, help="profiled steps per recipe, interleaved (per group: the median)")
    ap.add_argument("--out", default="results/step_profile")
    ap.add_argument("--name", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    meta = {"device_model": cpu_model(), "torch": torch.__version__, "threads": args.threads, "rounds": args.rounds,
            "loadavg_before": [round(x, 2) for x in os.getloadavg()], "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "shared_machine": "two training jobs ran on the same 2 cores"}
    steps = [Step(spec, args.batch_size, device) for spec in args.recipes]
    for s in steps:
        for _ in range(args.warmup):
            s()
    # the step's linear shapes and FLOP, then the GEMM reference timed in the same rounds as the steps
    flop_info = {s.spec: step_flops(s) for s in steps}
    biggest = {spec: max(set(shapes), key=lambda mkn: mkn[0] * mkn[1] * mkn[2]) for spec, (_, shapes) in flop_info.items()}
    gemm: dict[tuple, list[float]] = {shape: [] for shape in biggest.values()}
    for r in range(args.rounds):
        for s in steps:
            s.timed()
        for shape in gemm:
            gemm[shape].append(gemm_rate(shape, 0.1))
        print(f"round {r + 1}/{args.rounds}", flush=True)
    profiles = {s.spec: [] for s in steps}
    for _ in range(args.profiles):  # interleaved; per group the median over the profiles
        for s in steps:
            profiles[s.spec].append(breakdown(s))
    rows = []
    for s in steps:
        profs = profiles[s.spec]
        prof = {"profiled_step_ms": statistics.median(p["profiled_step_ms"] for p in profs),
                "ms": {g: statistics.median(p["ms"][g] for p in profs) for g in GROUPS},
                "ms_backward": {g: statistics.median(p["ms_backward"][g] for p in profs) for g in GROUPS},
                "backward_unmatched_ms": statistics.median(p["backward_unmatched_ms"] for p in profs),
                "profiles": profs}
        flops, _ = flop_info[s.spec]
        shape = biggest[s.spec]
        vit = s.pc.vit
        h, w = s.pc.crop_size, s.pc.crop_size
        plain, best = statistics.median(s.times), min(s.times)
        rows.append({
            "recipe": s.spec + " (recipe=cpu)", "batch_size": s.batch_size, "impl": vit.attention.impl,
            "params_M": sum(p.numel() for p in s.policy.parameters()) / 1e6,
            "tokens_per_camera": (h // vit.patch_size) * (w // vit.patch_size) + (1 if vit.use_cls else 0),
            "cameras": len(s.pc.image_keys),
            "plain_step_ms": plain * 1e3, "best_step_ms": best * 1e3, "plain_step_ms_all": [t * 1e3 for t in s.times],
            **prof, "gflop": flops / 1e9, "gflop_per_s": flops / 1e9 / plain, "gflop_per_s_best": flops / 1e9 / best,
            "gemm_shape": list(shape), "gemm_gflop_per_s": statistics.median(gemm[shape]),
            "gemm_gflop_per_s_best": max(gemm[shape]), "gemm_gflop_per_s_all": gemm[shape],
        })
        print(f"{s.spec}: plain {plain * 1e3:.0f} ms, {flops / 1e9:.2f} GFLOP, {flops / 1e9 / best:.1f} GFLOP/s (best step) "
              f"vs GEMM {max(gemm[shape]):.1f} (best) on {shape}", flush=True)
    write_report(args.out, args.name, meta, rows, to_markdown)


if __name__ == "__main__":
    main()
