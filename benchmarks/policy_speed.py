"""Training throughput and action latency of the policies, per attention kind, on synthetic inputs.

    python benchmarks/policy_speed.py                       # CPU, 2 threads, PushT + Lift shapes
    python benchmarks/policy_speed.py --device cuda --out results/policy_speed --name gpu

Policies are built from the real configs (configs/policy/*.yaml, configs/attention/*.yaml,
configs/task/*.yaml: input shapes, crop, action size), so the numbers follow the default model
sizes. Data are random tensors of the task's shapes; no dataset is read.

- train samples/s: batch ``--batch-size`` windows, forward + backward + AdamW step, median over
  ``--rounds`` timed steps after ``--warmup`` untimed ones.
- select_action ms: batch 1, ``predict_action_chunk`` every call (the cost of a replanning step,
  i.e. a fresh chunk each time), eval mode, median (and min) over ``--latency-calls`` calls.
- Configs are timed in interleaved rounds (each round: one train step + a few latency calls of
  every config), so load from other processes spreads over all rows instead of skewing a few.

Writes ``<out>/<name>.json`` and ``<out>/<name>.md`` and prints the Markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from itertools import product
from pathlib import Path

import numpy as np
import torch

from core.config import compose
from policies.registry import make_policy


def build(task: str, policy: str, attention: str, overrides: list[str] = (), recipe: str = "none"):
    """The policy ``train_policy.py task=... policy=... attention=... recipe=... <overrides>`` trains."""
    pc = compose("config", [f"task={task}", f"policy={policy}", f"attention={attention}", f"recipe={recipe}",
                            *overrides]).policy
    stats = {k: {"min": -np.ones(pc.input_shapes[k][0], np.float32), "max": np.ones(pc.input_shapes[k][0], np.float32)}
             for k in pc.lowdim_keys}
    stats["action"] = {"min": -np.ones(pc.action_dim, np.float32), "max": np.ones(pc.action_dim, np.float32)}
    torch.manual_seed(0)
    return make_policy(pc, stats), pc


def fake_batch(pc, b: int, device, with_action: bool = True) -> dict[str, torch.Tensor]:
    """obs[key]: (B, To, H, W, C) uint8 images / (B, To, D) low-dim; action (B, T, Da)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for k in pc.image_keys:
        c, h, w = pc.input_shapes[k]
        out[k] = torch.randint(0, 256, (b, pc.n_obs_steps, h, w, c), generator=g, dtype=torch.uint8)
    for k in pc.lowdim_keys:
        out[k] = torch.rand(b, pc.n_obs_steps, pc.input_shapes[k][0], generator=g) * 2 - 1
    if with_action:
        out["action"] = torch.rand(b, pc.horizon, pc.action_dim, generator=g) * 2 - 1
    return {k: v.to(device) for k, v in out.items()}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Bench:
    """One policy's timing state; ``train_step`` / ``latency_call`` time one unit of work each."""

    def __init__(self, policy, pc, batch_size: int, device, precision: str = "fp32", compile: bool = False):
        self.policy, self.pc, self.device = policy, pc, device
        # what train.precision=bf16 and train.compile=true do in core/training.py: autocast, a compiled loss
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
        self.loss_fn = torch.compile(policy.compute_loss) if compile else policy.compute_loss
        self.opt = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=1e-4)
        self.batch = fake_batch(pc, batch_size, device)
        self.obs = fake_batch(pc, 1, device, with_action=False)
        self.train_times: list[float] = []
        self.latency_times: list[float] = []

    def _timed(self, fn) -> float:
        sync(self.device)
        t = time.perf_counter()
        fn()
        sync(self.device)
        return time.perf_counter() - t

    def _step(self):
        with self.autocast():
            loss, _ = self.loss_fn(self.batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def _act(self):
        chunk = self.policy.predict_action_chunk(self.obs)
        assert chunk.shape == (1, self.pc.n_action_steps, self.pc.action_dim)

    def train_step(self, record: bool = True):
        self.policy.train()
        dt = self._timed(self._step)
        if record:
            self.train_times.append(dt)

    def latency_call(self, record: bool = True):
        self.policy.eval()
        dt = self._timed(self._act)
        if record:
            self.latency_times.append(dt)

    def summary(self, batch_size: int) -> dict:
        med = statistics.median(self.train_times)
        return {
            "train_step_s_median": med,
            "train_samples_per_s": batch_size / med,
            "train_samples_per_s_best": batch_size / min(self.train_times),
            "train_step_s_all": self.train_times,
            "latency_ms_median": 1e3 * statistics.median(self.latency_times),
            "latency_ms_min": 1e3 * min(self.latency_times),
            "latency_ms_all": [1e3 * t for t in self.latency_times],
        }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_report(out_dir, name: str, meta: dict, rows: list[dict], to_markdown) -> None:
    """``out_dir/name.json`` (meta, with the load average after the run, and rows) and ``name.md``; prints the markdown."""
    meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]  # a shared machine: say how shared it was
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    md = to_markdown(rows, meta)
    (out / f"{name}.md").write_text(md)
    print(md)


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Policy speed on {meta['device']} ({meta['device_model']}), torch {meta['torch']}, "
        f"intra-op threads {meta['threads']}, train batch {meta['batch_size']} ({meta.get('precision', 'fp32')}"
        f"{', compiled loss' if meta.get('compile') else ''}), latency batch 1 "
        f"(a fresh `predict_action_chunk` per call). Load average before/after: "
        f"{meta['loadavg_before']} / {meta['loadavg_after']}.",
        "",
        "| threads | task | policy | attention | params (M) | train samples/s (median) | (best) | select_action ms (median) | ms (min) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['task']} | {r['policy_label']} | {r['attention']} | {r['params_M']:.2f} | "
            f"{r['train_samples_per_s']:.1f} | {r['train_samples_per_s_best']:.1f} | {r['latency_ms_median']:.1f} | {r['latency_ms_min']:.1f} |"
        )
    if meta.get("caveat"):
        lines += ["", meta["caveat"]]
    return "\n".join(lines) + "\n"


POLICY_LABELS = {"bc": "bc (mlp head)", "diffusion": "diffusion (DDIM {steps})"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["pusht", "lift"])
    ap.add_argument("--policies", nargs="+", default=["bc", "diffusion"])
    ap.add_argument("--attentions", nargs="+", default=["full", "fibottention", "lookhere"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, nargs="+", default=[2],
                    help="torch intra-op thread counts to measure (CPU); each gives its own rows")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2, help="untimed train steps and latency calls per config")
    ap.add_argument("--rounds", type=int, default=5, help="timed train steps per config (one per round)")
    ap.add_argument("--latency-calls", type=int, default=20, help="timed latency calls per config, spread over the rounds")
    ap.add_argument("--recipe", default="none", help="configs/recipe/ entry the policies are built with (none: defaults)")
    ap.add_argument("--out", default="results/policy_speed")
    ap.add_argument("--name", default=None, help="file stem (default: the device type)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: the training step under autocast")
    ap.add_argument("--compile", action="store_true", help="the training loss under torch.compile (as train.compile=true)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    meta = {
        "device": device.type,
        "device_model": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "batch_size": args.batch_size,
        "precision": args.precision,
        "compile": args.compile,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "latency_calls": args.latency_calls,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "caveat": "Caveat: other processes may share this machine's CPUs during the run (see the load averages). "
                  "Configs are timed in interleaved rounds so such load spreads over all rows, but absolute numbers "
                  "stay noisy: compare rows of the same run and thread count. With as many threads as free cores "
                  "(2 on a 2-core machine) a busy neighbour stalls torch's OpenMP barriers, which inflates small "
                  "batch-1 ops most; 1-thread rows are the steadier ones there.",
    }
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        benches = []
        for task, pol, att in product(args.tasks, args.policies, args.attentions):
            policy, pc = build(task, pol, att, ["policy.head=mlp"] if pol == "bc" else [], recipe=args.recipe)
            policy.to(device)
            row = {
                "threads": threads, "task": task, "policy": pol, "attention": att,
                "policy_label": POLICY_LABELS[pol].format(steps=getattr(pc, "num_inference_steps", "")),
                "params_M": sum(p.numel() for p in policy.parameters()) / 1e6,
                "input_shapes": pc.input_shapes, "crop_size": pc.crop_size,
            }
            bench = Bench(policy, pc, args.batch_size, device, args.precision, args.compile)
            for _ in range(args.warmup):
                bench.train_step(record=False)
                bench.latency_call(record=False)
            benches.append((row, bench))
        # interleaved rounds: a burst of load from other processes lands on every config alike
        # instead of on whichever config happened to run at that moment
        per_round = max(1, args.latency_calls // args.rounds)
        for r in range(args.rounds):
            for _, bench in benches:
                bench.train_step()
                for _ in range(per_round):
                    bench.latency_call()
            print(f"threads={threads} round {r + 1}/{args.rounds} done", flush=True)
        for row, bench in benches:
            row.update(bench.summary(args.batch_size))
            rows.append(row)
            print(f"{threads} thr  {row['task']:6s} {row['policy']:9s} {row['attention']:12s} "
                  f"train {row['train_samples_per_s']:8.1f} samples/s   latency {row['latency_ms_median']:7.1f} ms", flush=True)
        del benches
    meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or device.type
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    md = to_markdown(rows, meta)
    (out / f"{stem}.md").write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
