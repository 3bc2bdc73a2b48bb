"""The five studies, one command each; tables, JSON and plots go to results/<study>/.

    python -m studies main --budget small --tasks lift,pusht
    python -m studies data_efficiency --budget small --tasks lift
    python -m studies robustness --budget small --tasks lift
    python -m studies resolution --budget small --tasks lift
    python -m studies diversity --budget small --tasks lift

``--budget small`` fits a 2-core CPU; ``--budget full`` is the paper-scale protocol for a GPU.
Finished cells are cached under results/cells/, so an interrupted study resumes.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from studies import common
from studies.common import BUDGETS, Cell, eval_cell, fmt_rate, pooled, train_cell, train_seconds, write_results
from studies.corruptions import CORRUPTIONS, obs_corruptor

TRAIN_SIZE = {"pusht": 96, "lift": 84, "can": 84}
EVAL_SIZES = {"pusht": [96, 128], "lift": [84, 112, 128], "can": [84, 112, 128]}
STUDIES = ("main", "data_efficiency", "robustness", "resolution", "diversity")
# what identifies a table row across runs (main, robustness, resolution); a resolution variant is in its attention label
ROW_KEYS = ("task", "policy", "attention", "steps", "extra")
EFFICIENCY_KEYS = ("task", "policy", "attention", "steps", "demos", "extra")


def cell_extra(args, budget, extra=()) -> list[str]:
    """Overrides of a cell on top of its recipe: the budget's, the command line's, then the study's."""
    return list(budget.get("overrides", [])) + list(args.extra) + list(extra)


def make_cell(args, budget, task: str, policy: str, attention: str, seed: int, extra=()) -> Cell:
    return Cell(task, policy, attention, seed, budget["recipe"], cell_extra(args, budget, extra))


def row_id(args, budget, task: str, policy: str, attention: str, label: str | None = None) -> dict:
    """The ROW_KEYS fields of a table row, so reruns with other overrides get rows of their own."""
    steps = make_cell(args, budget, task, policy, attention, budget["seeds"][0]).config().train.steps
    return {"task": task, "policy": policy, "attention": label or attention, "steps": steps,
            "extra": " ".join(cell_extra(args, budget))}


def cells_for(args, task, budget, extra=()):
    return [make_cell(args, budget, task, p, a, s, extra)
            for p in budget["policies"] for a in budget["attentions"] for s in budget["seeds"]]


def eval_kwargs(args, budget):
    kw = dict(num_episodes=budget["episodes"], workers=budget["workers"], progress=False)
    if args.max_steps:
        kw["max_steps"] = args.max_steps
    return kw


def run_main(args, budget):
    rows = []
    cells = [c for t in args.tasks for c in cells_for(args, t, budget)]
    for c in tqdm(cells, desc="main: train+eval", unit="cell"):
        train_cell(c, log=tqdm.write)
        eval_cell(c, "clean", **eval_kwargs(args, budget))
    for t in args.tasks:
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group = [c for c in cells if (c.task, c.policy, c.attention) == (t, p, a)]
                pool = pooled([eval_cell(c, "clean", **eval_kwargs(args, budget)) for c in group])
                secs = [train_seconds(c) for c in group]
                rows.append({**row_id(args, budget, t, p, a),
                             "success": fmt_rate(pool), **pool,
                             "coverage": f"{pool['mean_max_coverage']:.3f}" if "mean_max_coverage" in pool else "",
                             "train_min": f"{np.mean([s for s in secs if s]) / 60:.1f}" if any(secs) else ""})

    def plot(plt, rows):
        fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows)), 3))
        labels = [f"{r['task']}\n{r['policy']}\n{r['attention']}" for r in rows]
        rates = [r["success_rate"] for r in rows]
        err = [[r["success_rate"] - r["ci95"][0] for r in rows], [r["ci95"][1] - r["success_rate"] for r in rows]]
        ax.bar(range(len(rows)), rates, yerr=err, capsize=3, color="tab:blue")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("success rate (95% Wilson)")
        return fig

    return write_results("main", rows, [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("steps", "steps"),
                                        ("extra", "extra overrides"), ("success", "success [95% CI] (k/n)"), ("coverage", "mean max coverage"),
                                        ("train_min", "train minutes / seed")], merge_on=ROW_KEYS,
                         title="Main comparison: task x policy x attention", plot=plot,
                         notes=f"Budget `{args.budget}`: seeds {budget['seeds']}, {budget['episodes']} evaluation episodes per seed "
                               f"on held-out seeds from 100000. Rows of earlier runs on this budget are kept.")


def run_data_efficiency(args, budget):
    rows = []
    for t in args.tasks:
        for n in tqdm(budget["demos"], desc=f"data efficiency {t}", unit="size"):
            for c_att in budget["attentions"]:
                group = [make_cell(args, budget, t, p, c_att, s, [f"train.max_episodes={n}"])
                         for p in budget["policies"][:1] for s in budget["seeds"]]
                for c in group:
                    train_cell(c, log=tqdm.write)
                pool = pooled([eval_cell(c, "clean", **eval_kwargs(args, budget)) for c in group])
                rows.append({**row_id(args, budget, t, budget["policies"][0], c_att), "demos": n,
                             "success": fmt_rate(pool), **pool})

    def plot(plt, rows):
        fig, ax = plt.subplots(figsize=(4.5, 3))
        for group in sorted({(r["task"], r["policy"], r["attention"], r["steps"]) for r in rows}):
            rr = sorted((r for r in rows if (r["task"], r["policy"], r["attention"], r["steps"]) == group), key=lambda r: r["demos"])
            ax.errorbar([r["demos"] for r in rr], [r["success_rate"] for r in rr],
                        yerr=[[r["success_rate"] - r["ci95"][0] for r in rr], [r["ci95"][1] - r["success_rate"] for r in rr]],
                        marker="o", capsize=3, label="{} {} {} ({} steps)".format(*group))
        ax.set_xscale("log")
        demos = sorted({r["demos"] for r in rows})
        ax.set_xticks(demos, [str(d) for d in demos])
        ax.minorticks_off()
        ax.set_xlabel("demonstrations")
        ax.set_ylabel("success rate")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7)
        return fig

    return write_results("data_efficiency", rows, [("task", "task"), ("policy", "policy"), ("demos", "demos"),
                                                   ("attention", "attention"), ("steps", "steps"), ("extra", "extra overrides"),
                                                   ("success", "success [95% CI] (k/n)")],
                         title="Data efficiency: success vs number of demonstrations", plot=plot, merge_on=EFFICIENCY_KEYS)


def run_robustness(args, budget):
    rows = []
    for t in args.tasks:
        for c in tqdm(cells_for(args, t, budget), desc=f"robustness {t}", unit="cell"):
            last = train_cell(c, log=tqdm.write)
        # the cameras the policies see, as the trained config names them
        from policies.checkpoint import read_checkpoint_meta

        shapes = read_checkpoint_meta(last)["policy_config"]["input_shapes"]
        image_keys = [k for k, s in shapes.items() if len(s) == 3]
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group = [c for c in cells_for(args, t, budget) if (c.policy, c.attention) == (p, a)]
                row = row_id(args, budget, t, p, a)
                clean = pooled([eval_cell(c, "clean", **eval_kwargs(args, budget)) for c in group])
                row["clean"] = f"{100 * clean['success_rate']:.0f}%"
                row["rates"] = {"clean": clean["success_rate"]}
                for kind in CORRUPTIONS:
                    for sev in (1, 2, 3):
                        res = pooled([eval_cell(c, f"{kind}_{sev}", obs_transform=obs_corruptor(kind, sev, image_keys), **eval_kwargs(args, budget))
                                      for c in group])
                        row[f"{kind}_{sev}"] = f"{100 * res['success_rate']:.0f}%"
                        row["rates"][f"{kind}_{sev}"] = res["success_rate"]
                rows.append(row)
    cols = [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("clean", "clean")]
    cols += [(f"{k}_{s}", f"{k} {s}") for k in CORRUPTIONS for s in (1, 2, 3)]

    def plot(plt, rows):
        fig, axes = plt.subplots(1, len(CORRUPTIONS), figsize=(3 * len(CORRUPTIONS), 2.8), sharey=True)
        for ax, kind in zip(axes, CORRUPTIONS):
            for r in rows:
                ax.plot([0, 1, 2, 3], [r["rates"]["clean"]] + [r["rates"][f"{kind}_{s}"] for s in (1, 2, 3)], marker="o",
                        label=f"{r['task']} {r['policy']} {r['attention']}")
            ax.set_title(kind, fontsize=9)
            ax.set_xlabel("severity")
            ax.set_ylim(0, 1.05)
        axes[0].set_ylabel("success rate")
        axes[-1].legend(fontsize=6)
        return fig

    return write_results("robustness", rows, cols, title="Robustness: success under image corruptions", plot=plot, merge_on=ROW_KEYS,
                         notes="Corruptions are applied to every camera image the policy sees; severity 0 = clean.")


def fib_train_window(cell: Cell) -> int:
    """Fibottention's default window of a trained cell: N // 3 of its training patch grid."""
    from policies.checkpoint import read_checkpoint_meta
    from policies.vision.masks import default_w_max

    vit = read_checkpoint_meta(cell.run_dir / "checkpoints" / "last")["policy_config"]["vit"]
    if vit["attention"].get("w_max") is not None:
        return int(vit["attention"]["w_max"])
    return default_w_max(vit["base_grid"][0] * vit["base_grid"][1])


def run_resolution(args, budget):
    rows = []
    for t in args.tasks:
        for c in tqdm(cells_for(args, t, budget), desc=f"resolution {t}", unit="cell"):
            train_cell(c, log=tqdm.write)
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group = [c for c in cells_for(args, t, budget) if (c.policy, c.attention) == (p, a)]
                variants = [(a, None)]
                if a.startswith("lookhere"):
                    variants.append((f"{a} (s_g scaled)", "slope"))
                if a == "fibottention":
                    variants.append((f"{a} (training window)", "window"))
                    # the 1-D offsets' 2-D meaning on the training grid, kept on the larger grid
                    variants.append((f"{a} (training-grid 2-D offsets)", "grid2d"))
                # keep each cell's training window (N // 3 of the training grid), not the larger grid's
                windows = {c.key: fib_train_window(c) for c in group} if a == "fibottention" else {}
                for label, variant in variants:
                    row = {**row_id(args, budget, t, p, a, label), "rates": {}}
                    for size in EVAL_SIZES[t]:
                        kw = dict(eval_kwargs(args, budget), image_size=size)
                        if variant == "slope":  # the paper lowers the global slope on larger images
                            kw["global_slope"] = TRAIN_SIZE[t] / size
                        if variant == "grid2d":
                            kw["offset_grid"] = "train"
                        name = f"size{size}{'_' + variant if variant else ''}"
                        res = pooled([eval_cell(c, name, **kw, **({"w_max": windows[c.key]} if variant == "window" else {}))
                                      for c in group])
                        row[f"size{size}"] = f"{100 * res['success_rate']:.0f}%"
                        row["rates"][size] = res["success_rate"]
                    rows.append(row)
    # every task's sizes: rows of other tasks kept from earlier runs fill their own columns
    sizes = sorted({s for t in EVAL_SIZES for s in EVAL_SIZES[t]})
    cols = [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("steps", "steps")]
    cols += [(f"size{s}", f"{s} px") for s in sizes]

    def plot(plt, rows):
        tasks = sorted({r["task"] for r in rows})  # one panel per task: their sizes differ
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.2), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            for r in (r for r in rows if r["task"] == t):
                rates = {int(k): v for k, v in r["rates"].items()}  # rows read back from JSON have str keys
                xs = sorted(rates)
                ax.plot(xs, [rates[x] for x in xs], marker="o", label=f"{r['policy']} {r['attention']}")
            ax.set_title(t, fontsize=9)
            ax.set_xlabel("evaluation image size (px)")
            ax.set_ylim(0, 1.05)
            ax.legend(fontsize=6, loc="lower left")
        axes[0, 0].set_ylabel("success rate")
        return fig

    return write_results("resolution", rows, cols, title="Larger images at test time", plot=plot, merge_on=ROW_KEYS,
                         notes="Trained at the task's native size; cameras rendered larger at evaluation, crops scaled with "
                               "them. Full/Fibottention interpolate their learned position embedding; LookHere rebuilds its masks.")


def run_diversity(args, budget):
    from core.config import TaskConfig, from_dict
    from datasets.factory import make_dataset
    from policies.checkpoint import load_policy, read_checkpoint_meta
    from policies.obs_encoder import crop_images
    from studies.diversity import attention_maps, encoder_diversity

    rows, maps = [], {}
    for t in args.tasks:
        cells = [c for c in cells_for(args, t, budget) if c.seed == budget["seeds"][0]]
        for c in cells:
            train_cell(c, log=tqdm.write)
        meta = read_checkpoint_meta(cells[0].run_dir / "checkpoints" / "last")
        data = make_dataset(from_dict(TaskConfig, meta["cfg"]["task"]), meta["policy_config"]["input_shapes"])
        idx = np.linspace(0, data.num_frames - 1, 32).astype(int)
        for c in cells:
            policy = load_policy(c.run_dir / "checkpoints" / "last")
            enc = policy.obs_encoder
            key = policy.config.image_keys[0]  # the first camera's encoder
            x = torch.from_numpy(data.data[key][idx]).permute(0, 3, 1, 2).float() / 255.0  # (32, C, H, W)
            x = crop_images(x, enc.crop_size_for(key, x.shape[-2]), random=False)
            vit = enc.vits[0]
            layers = encoder_diversity(vit, x)
            rows.append({"task": t, "policy": c.policy, "attention": c.attention,
                         "diversity": f"{np.mean([l['diversity'] for l in layers]):.3f}",
                         "per_layer": ", ".join(f"{l['diversity']:.3f}" for l in layers),
                         "layers": [{"diversity": l["diversity"], "mean_cka": l["mean_cka"]} for l in layers]})
            maps[(t, c.policy, c.attention)] = (attention_maps(vit, x[:1])[-1], x[0])

    def plot(plt, rows):
        n = len(maps)
        heads = max(m.shape[0] for m, _ in maps.values())
        fig, axes = plt.subplots(n, heads + 1, figsize=(1.6 * (heads + 1), 1.7 * n), squeeze=False)
        for r, ((t, p, a), (m, img)) in enumerate(maps.items()):
            axes[r, 0].imshow(img.permute(1, 2, 0).numpy())
            axes[r, 0].set_ylabel(f"{t}\n{p}\n{a}", fontsize=7)
            for h in range(heads):
                ax = axes[r, h + 1]
                if h < m.shape[0]:
                    ax.imshow(m[h].numpy(), cmap="magma")
                    if r == 0:
                        ax.set_title(f"head {h}", fontsize=7)
            for ax in axes[r]:
                ax.set_xticks([])
                ax.set_yticks([])
        return fig

    return write_results("diversity", rows, [("task", "task"), ("policy", "policy"), ("attention", "attention"),
                                             ("diversity", "diversity (1 - mean CKA)"), ("per_layer", "per layer")],
                         title="Head diversity of the visual encoders", plot=plot,
                         notes="Diversity = 1 - mean pairwise linear CKA between the heads' outputs on 32 dataset frames; "
                               "0 means identical heads. The plot shows each head's attention (last layer, CLS query) on one frame.")


RUNNERS = {"main": run_main, "data_efficiency": run_data_efficiency, "robustness": run_robustness,
           "resolution": run_resolution, "diversity": run_diversity}


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m studies", description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=STUDIES)
    parser.add_argument("--budget", choices=sorted(BUDGETS) + ["tiny"], default="full")
    parser.add_argument("--tasks", default="lift", help="comma-separated: pusht,lift,can")
    parser.add_argument("--policies", help="override the budget's policies, comma-separated (bc,diffusion)")
    parser.add_argument("--attentions", help="override the budget's attention kinds (full,fibottention,lookhere,lookhere:45)")
    parser.add_argument("--max-steps", type=int, help="cap evaluation episodes at this many steps")
    parser.add_argument("--steps", type=int, help="override the recipe's training steps (every task)")
    parser.add_argument("--episodes", type=int, help="override the budget's evaluation episodes per seed")
    parser.add_argument("--seeds", help="override the budget's training seeds, comma-separated")
    parser.add_argument("--results", default=str(common.RESULTS), help="results root (default results/)")
    parser.add_argument("extra", nargs="*", help="extra training overrides for every cell, e.g. policy.vit.dim=64")
    args = parser.parse_intermixed_args(argv)
    args.tasks = args.tasks.split(",")
    common.RESULTS = Path(args.results)
    common.CELLS = common.RESULTS / "cells"
    common.BUDGET_NAME = args.budget
    common.COMMAND = "python -m studies " + shlex.join(sys.argv[1:] if argv is None else argv)
    budget = dict(TINY if args.budget == "tiny" else BUDGETS[args.budget])
    if args.policies:
        budget["policies"] = args.policies.split(",")
    if args.attentions:
        budget["attentions"] = args.attentions.split(",")
    if args.steps:
        budget["overrides"] = list(budget.get("overrides", [])) + [f"train.steps={args.steps}"]
    if args.episodes:
        budget["episodes"] = args.episodes
    if args.seeds:
        budget["seeds"] = [int(x) for x in args.seeds.split(",")]
    out = RUNNERS[args.study](args, budget)
    print((out / "table.md").read_text())
    return out


# seconds-long end-to-end runs for the tests
TINY = {"recipe": "none", "seeds": [0], "episodes": 1, "workers": 0, "demos": [2], "policies": ["bc"],
        "attentions": ["full", "lookhere"], "overrides": ["train.steps=2", "train.batch_size=4", "train.checkpoint_every=2"]}

if __name__ == "__main__":
    main()
