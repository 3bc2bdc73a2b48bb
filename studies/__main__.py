"""The five studies, one command each; tables, JSON and plots go to results/<study>/.

    python -m studies main --budget small --tasks lift,pusht
    python -m studies data_efficiency --budget small --tasks lift
    python -m studies robustness --budget small --tasks lift
    python -m studies resolution --budget small --tasks lift
    python -m studies diversity --budget small --tasks lift
    python -m studies report main --budget small --tasks lift,pusht     # the table from what has finished
    python -m studies main --budget full --tasks lift --launcher slurm --hydra hydra.launcher.partition=gpu

``--budget small`` fits a 2-core CPU; ``--budget full`` is the paper-scale protocol for a GPU.
A study is a list of jobs (train each cell, then each evaluation) run by Hydra's multirun
launchers (``studies/engine.py``): ``--launcher joblib`` (default) runs as many at once as this
machine's cores hold, ``--launcher slurm`` submits them to SLURM. Run directories are cached under
results/cells/: finished jobs are skipped, interrupted trainings resume, a failed job is reported at
the end without stopping the others. The tables are then built from the run directories
(``report``, also runnable alone at any time on partial results).
"""
from __future__ import annotations

import argparse
import shlex
import sys

import numpy as np
import torch

from studies import common, engine
from studies.common import BUDGETS, Cell, Evaluation, difference, fmt_rate, load_eval, pooled, train_seconds, write_results
from envs.corruptions import CORRUPTIONS
from studies.stats import bootstrap_mean_difference

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


def eval_kwargs(args, budget) -> dict:
    """The evaluation settings every study's rollouts share (``evaluate_checkpoint`` keywords)."""
    kw = dict(num_episodes=budget["episodes"], workers=budget["workers"], progress=False)
    if args.max_steps:
        kw["max_steps"] = args.max_steps
    return kw


def group_of(cells, task, policy, attention):
    return [c for c in cells if (c.task, c.policy, c.attention) == (task, policy, attention)]


def baseline_of(args, budget, task, policy, extra=()):
    """Full attention's cells of a row's seeds, also when the command leaves full out of --attentions:
    a row's difference is to whatever of them has been evaluated (``--attentions bigbird`` after full)."""
    return [make_cell(args, budget, task, policy, BASELINE, s, extra) for s in budget["seeds"]]


def success_text(pool: dict, seeds: int) -> str:
    """The success column; a row built before all its seeds are evaluated says how many it pools."""
    done = len(pool["per_seed"])
    return fmt_rate(pool) + (f", {done} of {seeds} seeds so far" if done < seeds else "")


BASELINE = "full"  # every row's difference is to full attention's row of the same task, policy (and condition)


def versus_full(summaries: list, baseline: list, attention: str) -> dict:
    """The difference columns of a row: ``diff_text`` etc., empty for the baseline itself."""
    if attention == BASELINE:
        return {}
    return difference(summaries, baseline) or {}


def rate_and_difference(pool: dict, diff: dict) -> str:
    """One table cell: ``mean% (difference to full [CI]), k seeds``."""
    seeds = f", {pool['seeds']} seed{'s' * (pool['seeds'] > 1)}"
    return f"{100 * pool['success_rate']:.0f}%" + (f" ({diff['diff_text']})" if diff else "") + seeds


SUCCESS_NOTE = ("Success: mean over training seeds of each seed's rate, with a 95% interval from a bootstrap over seeds, then "
                "over each seed's episodes (studies/stats.py), and the per-seed rates in brackets. Difference to full "
                "attention: in points, both methods resampled the same way, independently.")


# Each study is a plan (the cells it trains and the evaluations it runs: its jobs) and a report (its
# table, built from whatever the run directories hold: a row appears once one of its seeds is evaluated).
def plan_main(args, budget):
    cells = [c for t in args.tasks for c in cells_for(args, t, budget)]
    return cells, [Evaluation(c, "clean", eval_kwargs(args, budget)) for c in cells]


def report_main(args, budget):
    rows = []
    cells = [c for t in args.tasks for c in cells_for(args, t, budget)]
    for t in args.tasks:
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group = group_of(cells, t, p, a)
                evals = [load_eval(c, "clean") for c in group]
                pool = pooled(evals)
                if pool is None:  # not evaluated yet
                    continue
                secs = [train_seconds(c) for c in group]
                base = [load_eval(c, "clean") for c in baseline_of(args, budget, t, p)]
                rows.append({**row_id(args, budget, t, p, a),
                             "success": success_text(pool, len(group)), **pool, **versus_full(evals, base, a),
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
        ax.set_ylabel("success rate (95% CI, seeds then episodes)")
        return fig

    return write_results("main", rows, [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("steps", "steps"),
                                        ("extra", "extra overrides"), ("success", "success [95% CI] (per seed)"), ("diff_text", "− full (points) [95% CI]"),
                                        ("coverage", "mean max coverage"), ("train_min", "train minutes / seed")], merge_on=ROW_KEYS,
                         title="Main comparison: task x policy x attention", plot=plot,
                         notes=f"Budget `{args.budget}`: seeds {budget['seeds']}, {budget['episodes']} evaluation episodes per seed "
                               f"on held-out seeds from 100000. Rows of earlier runs on this budget are kept. {SUCCESS_NOTE}")



def efficiency_groups(args, budget):
    """(task, demos, attention) -> the cells trained on the first ``demos`` demonstrations (first policy)."""
    return {(t, n, a): [make_cell(args, budget, t, budget["policies"][0], a, s, [f"train.max_episodes={n}"]) for s in budget["seeds"]]
            for t in args.tasks for n in budget["demos"] for a in budget["attentions"]}


def plan_data_efficiency(args, budget):
    cells = [c for group in efficiency_groups(args, budget).values() for c in group]
    return cells, [Evaluation(c, "clean", eval_kwargs(args, budget)) for c in cells]


def report_data_efficiency(args, budget):
    rows = []
    groups = efficiency_groups(args, budget)
    for (t, n, a), group in groups.items():
        evals = [load_eval(c, "clean") for c in group]
        pool = pooled(evals)
        if pool is not None:
            base = [load_eval(c, "clean") for c in baseline_of(args, budget, t, budget["policies"][0], [f"train.max_episodes={n}"])]
            rows.append({**row_id(args, budget, t, budget["policies"][0], a), "demos": n,
                         "success": success_text(pool, len(group)), **pool, **versus_full(evals, base, a)})

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
                                                   ("success", "success [95% CI] (per seed)"), ("diff_text", "− full (points) [95% CI]")],
                         title="Data efficiency: success vs number of demonstrations", plot=plot, merge_on=EFFICIENCY_KEYS,
                         notes=SUCCESS_NOTE)



CORRUPTED = [(kind, sev) for kind in CORRUPTIONS for sev in (1, 2, 3)]


def corrupted(args) -> list[tuple[str, int]]:
    """The (kind, severity) cells of the robustness study: ``--corruptions brightness:1,contrast:2``, or all."""
    if not args.corruptions:
        return CORRUPTED
    chosen = []
    for spec in args.corruptions.split(","):
        kind, _, sev = spec.partition(":")
        if (kind, int(sev or 0)) not in CORRUPTED:
            raise SystemExit(f"--corruptions: {spec!r} is not one of {', '.join(f'{k}:{s}' for k, s in CORRUPTED)}")
        chosen.append((kind, int(sev)))
    return chosen


def corrupted_eval(args, budget, cell: Cell, kind: str, sev: int) -> Evaluation:
    kw = dict(eval_kwargs(args, budget), num_episodes=budget.get("corrupted_episodes", budget["episodes"]))
    return Evaluation(cell, f"{kind}_{sev}", kw, corruption=(kind, sev))


def plan_robustness(args, budget):
    cells = [c for t in args.tasks for c in cells_for(args, t, budget)]
    evals = [Evaluation(c, "clean", eval_kwargs(args, budget)) for c in cells]
    evals += [corrupted_eval(args, budget, c, kind, sev) for c in cells for kind, sev in corrupted(args)]
    return cells, evals


def report_robustness(args, budget):
    rows = []
    for t in args.tasks:
        cells = cells_for(args, t, budget)
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group, base = group_of(cells, t, p, a), baseline_of(args, budget, t, p)
                row = {**row_id(args, budget, t, p, a), "rates": {}, "counts": {}, "differences": {}}
                for name in ["clean"] + [f"{kind}_{sev}" for kind, sev in CORRUPTED]:
                    evals = [load_eval(c, name) for c in group]
                    res = pooled(evals)
                    if res is not None:
                        diff = versus_full(evals, [load_eval(c, name) for c in base], a)
                        row[name] = rate_and_difference(res, diff)
                        row["rates"][name], row["counts"][name] = res["success_rate"], res["counts"]
                        if diff:
                            row["differences"][name] = {k: diff[k] for k in ("diff", "diff_ci95", "verdict")}
                if "clean" in row["rates"]:
                    rows.append(row)
    cols = [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("extra", "extra overrides"), ("clean", "clean")]
    cols += [(f"{k}_{s}", f"{k} {s}") for k in CORRUPTIONS for s in (1, 2, 3) if any(f"{k}_{s}" in r for r in rows)]

    def plot(plt, rows):
        fig, axes = plt.subplots(1, len(CORRUPTIONS), figsize=(3 * len(CORRUPTIONS), 2.8), sharey=True)
        for ax, kind in zip(axes, CORRUPTIONS):
            for r in rows:
                sevs = [0] + [s for s in (1, 2, 3) if f"{kind}_{s}" in r["rates"]]  # partial results: what has run
                ax.plot(sevs, [r["rates"]["clean"]] + [r["rates"][f"{kind}_{s}"] for s in sevs[1:]], marker="o",
                        label=f"{r['task']} {r['policy']} {r['attention']} {r.get('extra', '')}".strip())
            ax.set_title(kind, fontsize=9)
            ax.set_xlabel("severity")
            ax.set_ylim(0, 1.05)
        axes[0].set_ylabel("success rate")
        axes[-1].legend(fontsize=6)
        return fig

    return write_results("robustness", rows, cols, title="Robustness: success under image corruptions", plot=plot, merge_on=ROW_KEYS,
                         notes="Corruptions are applied to every camera image the policy sees; severity 0 = clean. Each cell: "
                               "mean success over seeds (difference to full attention in points [95% CI], bootstrap over seeds "
                               f"then episodes), {budget['episodes']} clean and {budget.get('corrupted_episodes', budget['episodes'])} "
                               "corrupted episodes per seed.")


def resolution_variants(attention: str) -> list[tuple[str, str | None]]:
    """(row label, variant) of one attention kind on larger images."""
    variants = [(attention, None)]
    if attention.startswith("lookhere"):
        variants.append((f"{attention} (s_g scaled)", "slope"))
    if attention == "fibottention":
        # keep each cell's training window (N // 3 of the training grid), not the larger grid's
        variants.append((f"{attention} (training window)", "window"))
        # the 1-D offsets' 2-D meaning on the training grid, kept on the larger grid
        variants.append((f"{attention} (training-grid 2-D offsets)", "grid2d"))
    return variants


def eval_sizes(args, task: str) -> list[int]:
    """The resolution study's sizes of ``task``: ``--sizes 112,128``, or all of EVAL_SIZES, always with the training size."""
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else EVAL_SIZES[task]
    return sorted({TRAIN_SIZE[task], *sizes})


def resolution_eval(args, budget, cell: Cell, size: int, variant: str | None) -> Evaluation:
    if size == TRAIN_SIZE[cell.task]:  # every variant is the trained model itself: the main study's evaluation
        return Evaluation(cell, "clean", eval_kwargs(args, budget))
    kw = dict(eval_kwargs(args, budget), image_size=size, num_episodes=budget.get("corrupted_episodes", budget["episodes"]))
    if variant == "slope":  # the paper lowers the global slope on larger images
        kw["global_slope"] = TRAIN_SIZE[cell.task] / size
    if variant == "grid2d":
        kw["offset_grid"] = "train"
    return Evaluation(cell, f"size{size}{'_' + variant if variant else ''}", kw, train_window=variant == "window")


def plan_resolution(args, budget):
    cells = [c for t in args.tasks for c in cells_for(args, t, budget)]
    return cells, [resolution_eval(args, budget, c, size, variant) for c in cells
                   for _, variant in resolution_variants(c.attention) for size in eval_sizes(args, c.task)]


def report_resolution(args, budget):
    rows = []
    for t in args.tasks:
        cells = cells_for(args, t, budget)
        for p in budget["policies"]:
            for a in budget["attentions"]:
                group, base = group_of(cells, t, p, a), baseline_of(args, budget, t, p)
                for label, variant in resolution_variants(a):
                    row = {**row_id(args, budget, t, p, a, label), "rates": {}, "counts": {}}
                    for size in eval_sizes(args, t):
                        evals = [resolution_eval(args, budget, c, size, variant).result() for c in group]
                        res = pooled(evals)
                        if res is not None:
                            diff = versus_full(evals, [resolution_eval(args, budget, c, size, None).result() for c in base], a)
                            row[f"size{size}"] = rate_and_difference(res, diff)
                            row["rates"][size], row["counts"][size] = res["success_rate"], res["counts"]
                    if row["rates"]:
                        rows.append(row)
    # every task's sizes: rows of other tasks kept from earlier runs fill their own columns
    sizes = sorted({s for t in EVAL_SIZES for s in EVAL_SIZES[t]})
    cols = [("task", "task"), ("policy", "policy"), ("attention", "attention"), ("steps", "steps"), ("extra", "extra overrides")]
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
                         notes="Trained at the task's native size (its column is the main study's clean evaluation); cameras "
                               "rendered larger at evaluation, crops scaled with them. Full/Fibottention interpolate their learned "
                               "position embedding; LookHere rebuilds its masks. Each cell: mean success over seeds (difference to "
                               "full attention at that size, points [95% CI], bootstrap over seeds then episodes), "
                               f"{budget['episodes']} episodes per seed at the training size, "
                               f"{budget.get('corrupted_episodes', budget['episodes'])} at the larger ones.")


def diversity_cells(args, budget, task):
    return cells_for(args, task, budget)


def plan_diversity(args, budget):
    return [c for t in args.tasks for c in diversity_cells(args, budget, t)], []


def report_diversity(args, budget):
    """Measured here, on the trained encoders (32 frames through each ViT: seconds on a CPU)."""
    from core.config import TaskConfig, from_dict
    from datasets.factory import make_dataset
    from policies.checkpoint import load_policy, read_checkpoint_meta
    from policies.obs_encoder import crop_images
    from studies.diversity import attention_maps, encoder_diversity

    rows, maps, per_seed = [], {}, {}
    for t in args.tasks:
        cells = [c for c in diversity_cells(args, budget, t) if c.finished()]
        if not cells:
            continue
        meta = read_checkpoint_meta(cells[0].run_dir)
        data = make_dataset(from_dict(TaskConfig, meta["cfg"]["task"]), meta["policy_config"]["input_shapes"])
        idx = np.linspace(0, data.num_frames - 1, 32).astype(int)
        for c in cells:
            policy = load_policy(c.run_dir)
            enc = policy.obs_encoder
            key = policy.config.image_keys[0]  # the first camera's encoder
            x = torch.from_numpy(data.data[key][idx]).permute(0, 3, 1, 2).float() / 255.0  # (32, C, H, W)
            x = crop_images(x, enc.crop_size_for(key, x.shape[-2]), random=False)
            vit = enc.vits[0]
            layers = encoder_diversity(vit, x)
            per_seed.setdefault((t, c.policy, c.attention), []).append(
                {"seed": c.seed, "diversity": float(np.mean([l["diversity"] for l in layers])),
                 "layers": [{"diversity": l["diversity"], "mean_cka": l["mean_cka"]} for l in layers]})
            if (t, c.policy, c.attention) not in maps:  # the first seed's maps
                maps[(t, c.policy, c.attention)] = (attention_maps(vit, x[:1])[-1], x[0])
    for (t, p, a), seeds in per_seed.items():
        values = [s["diversity"] for s in seeds]
        row = {"task": t, "policy": p, "attention": a, "diversity": f"{np.mean(values):.3f}", "values": values,
               "per_seed": ", ".join(f"{v:.3f}" for v in values), "seeds": seeds,
               "per_layer": ", ".join(f"{np.mean([s['layers'][i]['diversity'] for s in seeds]):.3f}"
                                      for i in range(len(seeds[0]["layers"])))}
        base = per_seed.get((t, p, BASELINE))
        if a != BASELINE and base:
            d = bootstrap_mean_difference(values, [s["diversity"] for s in base])
            row.update(diff=d.mean, diff_ci95=[d.lo, d.hi], diff_text=f"{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]")
        rows.append(row)

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
                                             ("diversity", "diversity (1 - mean CKA), mean over seeds"),
                                             ("per_seed", "per seed"), ("diff_text", "− full [95% CI, seeds resampled]"),
                                             ("per_layer", "per layer")],
                         title="Head diversity of the visual encoders", plot=plot,
                         notes="Diversity = 1 - mean pairwise linear CKA between the heads' outputs on 32 dataset frames; "
                               "0 means identical heads. The plot shows each head's attention (last layer, CLS query) on one frame.")


PLANS = {"main": plan_main, "data_efficiency": plan_data_efficiency, "robustness": plan_robustness,
         "resolution": plan_resolution, "diversity": plan_diversity}
REPORTS = {"main": report_main, "data_efficiency": report_data_efficiency, "robustness": report_robustness,
           "resolution": report_resolution, "diversity": report_diversity}
# options that choose how the jobs run, not what they compute: left out of the command a table row records
ENGINE_OPTIONS = {"--launcher": True, "--jobs": True, "--gpus-per-cell": True, "--procs-per-cell": True, "--hydra": True}


def study_command(argv: list[str]) -> str:
    """``python -m studies <study> ...`` as a table records it: without ``report`` and the engine options."""
    words, skip = [], False
    for i, w in enumerate(argv):
        if skip:
            skip = False
        elif i == 0 and w == "report":
            pass
        elif w in ENGINE_OPTIONS:
            skip = ENGINE_OPTIONS[w]
        elif w.split("=", 1)[0] in ENGINE_OPTIONS:
            pass
        else:
            words.append(w)
    return "python -m studies " + shlex.join(words)


def run_jobs(args, budget, cells: list[Cell], evals: list[Evaluation], log=print) -> list[engine.Outcome]:
    """Train every cell that is not finished, then run every evaluation not yet cached: two sweeps of
    the engine. Returns the outcomes of the jobs that failed (or could not start)."""
    failed: list[engine.Outcome] = []
    unique = {c.key: c for c in [*cells, *(e.cell for e in evals)]}
    steps, threads, todo = {}, set(), []
    for key, c in unique.items():
        try:
            cfg = c.config()
        except Exception as exc:  # a cell whose overrides do not compose: reported, the others go on
            failed.append(engine.Outcome(f"train {key}", "failed", f"config: {type(exc).__name__}: {' '.join(str(exc).split())}"))
            continue
        steps[key] = cfg.train.steps
        threads.add(cfg.train.num_threads)
        if not c.finished(cfg.train.steps):
            todo.append(c)
    per_job = None if None in threads or not threads else max(threads)
    if len(todo) < len(steps):
        log(f"train: {len(steps) - len(todo)} cell(s) already trained")
    gpus = args.gpus_per_cell
    outcomes = engine.launch([{"kind": "train", "cell": c.to_json()} for c in todo], stage="train", study=args.study,
                             launcher=args.launcher, threads=per_job, n_jobs=args.jobs, gpus_per_job=gpus,
                             procs_per_job=args.procs_per_cell or max(1, gpus), overrides=args.hydra, log=log)
    failed += [o for o in outcomes if not o.ok]
    pending = [e for e in evals if e.result() is None]
    runnable = [e for e in pending if e.cell.key in steps and e.cell.finished(steps[e.cell.key])]
    ready = {id(e) for e in runnable}
    for e in pending:
        if id(e) not in ready:
            failed.append(engine.Outcome(f"eval {e.cell.key} {e.name}", "failed", "not run: its cell did not finish training"))
    if len(pending) < len(evals):
        log(f"eval: {len(evals) - len(pending)} evaluation(s) already done")
    # an evaluation: the policy's threads and its environment workers (processes) share the cores
    cost = max(budget["workers"], per_job or engine.available_cores())
    outcomes = engine.launch([{"kind": "eval", **e.to_json()} for e in runnable], stage="eval", study=args.study,
                             launcher=args.launcher, threads=per_job, gpus_per_job=min(1, gpus),
                             n_jobs=args.jobs or engine.parallel_jobs(cost, len(runnable)),
                             cpus_per_job=max(per_job or 1, budget["workers"]) if per_job or budget["workers"] else None,
                             overrides=args.hydra, log=log)
    failed += [o for o in outcomes if not o.ok]
    return failed


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    report_only = bool(argv) and argv[0] == "report"
    parser = argparse.ArgumentParser(prog="python -m studies", description=__doc__.splitlines()[0],
                                     epilog="python -m studies report <study> [same options]: only build the table from the "
                                            "run directories (any time, on partial results)")
    parser.add_argument("study", choices=STUDIES)
    parser.add_argument("--budget", choices=sorted(BUDGETS) + ["tiny"], default="full")
    parser.add_argument("--tasks", default="lift", help="comma-separated: pusht,lift,can")
    parser.add_argument("--policies", help="override the budget's policies, comma-separated (bc,diffusion)")
    parser.add_argument("--attentions", help="override the budget's attention kinds (full,fibottention,lookhere,lookhere:45)")
    parser.add_argument("--max-steps", type=int, help="cap evaluation episodes at this many steps")
    parser.add_argument("--steps", type=int, help="override the recipe's training steps (every task)")
    parser.add_argument("--episodes", type=int, help="override the budget's evaluation episodes per seed")
    parser.add_argument("--seeds", type=int_list, help="override the budget's training seeds, comma-separated")
    parser.add_argument("--demos", type=int_list, help="data_efficiency: only these demonstration counts, comma-separated "
                                                       "(e.g. 10,25; to split a study between machines)")
    parser.add_argument("--corruptions", help="robustness: only these kind:severity cells, e.g. brightness:1,contrast:2")
    parser.add_argument("--sizes", help="resolution: only these evaluation sizes, comma-separated (e.g. 112)")
    parser.add_argument("--results", default=str(common.RESULTS), help="results root (default results/)")
    engine_opts = parser.add_argument_group("how the jobs run (Hydra multirun launchers, studies/engine.py)")
    engine_opts.add_argument("--launcher", choices=list(engine.LAUNCHERS), default="joblib",
                             help="joblib: this machine (default); slurm: a SLURM cluster (submitit); submitit_local: "
                                  "submitit's local mode; basic: one job after another")
    engine_opts.add_argument("--jobs", type=int, help="jobs at once on this machine (default: cores // train.num_threads)")
    engine_opts.add_argument("--gpus-per-cell", type=int, default=0,
                             help="submitit launchers: GPUs per training job, one DDP process each (evaluations take one)")
    engine_opts.add_argument("--procs-per-cell", type=int,
                             help="submitit launchers: DDP processes per training job (default: --gpus-per-cell, or 1)")
    engine_opts.add_argument("--hydra", action="append", default=[], metavar="OVERRIDE",
                             help="a Hydra override for the launcher, e.g. hydra.launcher.partition=gpu (repeatable)")
    parser.add_argument("extra", nargs="*", help="extra training overrides for every cell, e.g. policy.vit.dim=64")
    args = parser.parse_intermixed_args(argv[1:] if report_only else argv)
    args.tasks = args.tasks.split(",")
    common.set_results(args.results)
    common.BUDGET_NAME = args.budget
    common.COMMAND = study_command(argv)
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
        budget["seeds"] = args.seeds
    if args.demos:
        budget["demos"] = args.demos
    failed = [] if report_only else run_jobs(args, budget, *PLANS[args.study](args, budget))
    out = REPORTS[args.study](args, budget)
    print((out / "table.md").read_text())
    if failed:
        print(f"{len(failed)} job(s) failed; the table holds what finished. Rerun the same command to retry them "
              f"(finished jobs are skipped):", file=sys.stderr)
        for o in failed:
            print(f"  {o.label}: {o.message}" + (f"  (log: {o.log})" if o.log else ""), file=sys.stderr)
        raise SystemExit(1)
    return out


def int_list(text: str) -> list[int]:
    """argparse type of a comma-separated list of non-negative integers."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 0,1,2)") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more non-negative integers, comma-separated")
    return values


# seconds-long end-to-end runs for the tests
TINY = {"recipe": "none", "seeds": [0], "episodes": 1, "workers": 0, "demos": [2], "policies": ["bc"],
        "attentions": ["full", "lookhere"], "overrides": ["train.steps=2", "train.batch_size=4", "train.checkpoint_every=2"]}

if __name__ == "__main__":
    main()
