"""The ResNet-18 baseline against the ViT encoders: one training step and one replanning call, on one thread.

    python -m benchmarks.encoder_speed                     # Lift BC, batch 64, 1 thread
    python -m benchmarks.encoder_speed --task can          # Can BC;  --task pusht: PushT diffusion
    python -m benchmarks.encoder_speed --rounds 10 --batch-size 32

Every row is the task's policy as ``recipe=cpu`` trains it (Lift and Can BC, PushT diffusion: the
recipe's cameras, crop, patches, read-out, history and photometric jitter), built from the real
configs with only the encoder changed: ``encoder=resnet18`` against the ViT with ``attention=full``,
``fibottention`` and ``lookhere`` (the recipe's per-attention pieces included, as a user trains them).
Data are random tensors of those shapes. Timing as ``policy_speed.py`` (its ``Bench``): forward +
backward + AdamW per train step, median over interleaved rounds; latency: batch 1,
``predict_action_chunk``. Writes ``<out>/<task>_cpu_<threads>thread.json`` and ``.md`` and prints the table.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.policy_speed import Bench, build, cpu_model, write_report

# each task's policy in the CPU recipe (README "Recipes")
POLICIES = {"lift": "bc", "can": "bc", "pusht": "diffusion"}
# row label -> (attention, extra overrides); the ResNet takes no attention (its group sets full)
ENCODERS = {
    "resnet18": ("full", ["encoder=resnet18"]),
    "vit full": ("full", []),
    "vit fibottention": ("fibottention", []),
    "vit lookhere": ("lookhere", []),
}


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"{meta['policy']} on {meta['task']} as recipe=cpu trains it, batch {meta['batch_size']}, {meta['threads']} thread, "
             f"{meta['device_model']}, torch {meta['torch']}; median of {meta['rounds']} interleaved rounds. "
             f"Load average before/after: {meta['loadavg_before']} / {meta['loadavg_after']}.",
             "",
             "| encoder | params (M) | encoder params (M) | train step s (median) | train samples/s | select_action ms (median) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['encoder']} | {r['params_M']:.2f} | {r['encoder_params_M']:.2f} | {r['train_step_s_median']:.3f} | "
                     f"{r['train_samples_per_s']:.1f} | {r['latency_ms_median']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="lift", choices=list(POLICIES))
    ap.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=list(ENCODERS))
    ap.add_argument("--batch-size", type=int, default=64, help="train.batch_size's default")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed train steps and latency calls per encoder")
    ap.add_argument("--rounds", type=int, default=3, help="timed train steps per encoder (one per round)")
    ap.add_argument("--latency-calls", type=int, default=3, help="timed latency calls per encoder and round")
    ap.add_argument("--out", default="results/encoder_speed")
    ap.add_argument("--name", help="default: <task>_cpu_<threads>thread")
    args = ap.parse_args(argv)
    policy_name = POLICIES[args.task]

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    meta = {"device_model": cpu_model(), "torch": torch.__version__, "threads": args.threads, "task": args.task, "policy": policy_name,
            "batch_size": args.batch_size, "warmup": args.warmup, "rounds": args.rounds, "latency_calls": args.latency_calls,
            "recipe": "cpu", "loadavg_before": [round(x, 2) for x in os.getloadavg()],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    benches = []
    for label in args.encoders:
        attention, extra = ENCODERS[label]
        policy, pc = build(args.task, policy_name, attention, extra, recipe="cpu")
        row = {"encoder": label, "attention": attention, "overrides": extra,
               "params_M": sum(p.numel() for p in policy.parameters()) / 1e6,
               "encoder_params_M": sum(p.numel() for p in policy.obs_encoder.parameters()) / 1e6,
               "input_shapes": pc.input_shapes, "crop_size": pc.crop_size}
        bench = Bench(policy, pc, args.batch_size, device)
        for _ in range(args.warmup):
            bench.train_step(record=False)
            bench.latency_call(record=False)
        benches.append((row, bench))
    for r in range(args.rounds):  # interleaved: a burst of load from other processes lands on every encoder alike
        for _, bench in benches:
            bench.train_step()
            for _ in range(args.latency_calls):
                bench.latency_call()
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = [{**row, **bench.summary(args.batch_size)} for row, bench in benches]
    write_report(args.out, args.name or f"{args.task}_cpu_{args.threads}thread", meta, rows, to_markdown)


if __name__ == "__main__":
    main()
