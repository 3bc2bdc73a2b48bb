"""Run a study, or turn plain runs into records; ``python -m studies.claims`` then writes the tables.

    python -m studies show robustness            # the commands it would run, each with where it stands; nothing runs
    python -m studies run robustness [--budget cpu] [--seeds 0,1] [--jobs 2] [--engine joblib|local|slurm]
    python -m studies run scene_training --arms full --variants 0 --seeds 1 --settings clean,camera2   # a part of it
    python -m studies add robustness RUN_DIR ... [--recipe cpu] [--evals clean,brightness1]   # docs/studies.md
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from core.cli import INTERRUPTED_EXIT
from studies.catalog import STUDIES
from studies.study import BUDGETS


def seeds(text: str) -> tuple[int, ...]:
    if all(s.isdigit() for s in text.split(",")):
        return tuple(int(s) for s in text.split(","))
    raise argparse.ArgumentTypeError(f"{text!r}: give non-negative integers, comma-separated (e.g. 0,1,2)")


def names(text: str) -> list[str]:
    return text.split(",")


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m studies", description=__doc__.splitlines()[0])
    parser.add_argument("verb", choices=["show", "run", "add"])
    parser.add_argument("study", help=f"one of {', '.join(STUDIES)} (add: any name)")
    parser.add_argument("runs", nargs="*", help="add: training run directories")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
    parser.add_argument("--seeds", type=seeds, help="the budget's seeds, replaced: comma-separated")
    parser.add_argument("--arms", type=names, help="show/run: only these arms (full, fibottention, resnet18, "
                        "fibottention:windows=robot, ...), comma-separated")
    parser.add_argument("--variants", type=seeds, help="show/run: only these variants, by index from 0, comma-separated")
    parser.add_argument("--settings", type=names, help="show/run: only these rollout settings (clean, camera2, ...), comma-separated")
    parser.add_argument("--workers", type=int, help="show/run: environment processes per evaluation (the budget's: 2 on cpu)")
    parser.add_argument("--results", default="results", help="records, tables and cells/ (default results/)")
    parser.add_argument("--recipe", default="cpu", help="add: the recipe the runs were trained with")
    parser.add_argument("--evals", type=names, help="add: only these folders of RUN_DIR/eval/, comma-separated "
                        "(default: every one)")
    parser.add_argument("--engine", choices=["joblib", "local", "slurm"], default="joblib", help="joblib, or submitit's local / slurm")
    parser.add_argument("--jobs", type=int, default=1, help="joblib: commands at once")
    parser.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE", help="submitit parameter, e.g. slurm_partition=gpu")
    args = parser.parse_args(argv)
    if args.verb != "add" and args.study not in STUDIES:
        parser.error(f"unknown study {args.study!r}: choose one of {', '.join(STUDIES)}, or add one to studies/catalog.py")
    if args.verb == "add" and not args.runs:
        parser.error("add: give the training run directories to record, e.g. python -m studies add robustness RUN_DIR")
    return args


def check_fits(study: str, run: Path) -> None:
    """A study of the catalog takes runs of its tasks and policies only (any other name takes any run)."""
    from core.run_info import run_config

    cfg, wanted = run_config(run), STUDIES.get(study)
    task, policy = cfg["task"]["name"], cfg["policy"]["name"]
    if wanted and (task not in wanted.tasks or policy not in wanted.policies):
        raise ValueError(f"{run} is a {task} {policy} run, but study {study} holds {'/'.join(wanted.tasks)} "
                         f"{'/'.join(wanted.policies)} runs: add it to a study of its task and policy, or to a name of your own")


def show(study, budget, results: Path) -> None:
    """Each cell's two commands, each with where it stands (trained? evaluated?), then how much is left."""
    from core.config import to_dict
    from studies.records import load, records_of_training
    from studies.study import check

    cells, trained, done, evals, records = study.cells(budget, results), 0, 0, 0, load(results, study.name)
    for cell, cfg in zip(cells, check(study, budget, cells)[0]):  # composed as `run` would: a mistake is one line
        progress = cell.progress(cfg.train.steps)
        if not cell.run_dir.exists() and (kept := records_of_training(records, to_dict(cfg), budget.recipe)):
            progress += f", {len(kept)} record{'s' * (len(kept) > 1)} of it kept (run trains it again)"  # its directory was removed
        print(shlex.join(["python", *cell.train_command()[1:]]) + f"  # {progress}")
        trained += cell.trained_step() >= cfg.train.steps
        for name, opts in study.rollout_options(budget, cell).items():
            result = json.loads(cell.summary(name).read_text()) if cell.summary(name).exists() else None
            state = f"{result['successes']}/{result['num_episodes']} done" if result else "to run"
            print("  " + shlex.join(["python", "rollout.py", f"checkpoint={cell.run_dir}", *opts]) + f"  # {name}: {state}")
            done, evals = done + bool(result), evals + 1
    print(f"# {study.name}: {trained} of {len(cells)} cells trained, {done} of {evals} evaluations done")


def main(argv=None) -> list[str]:
    args = parse(sys.argv[1:] if argv is None else argv)
    results = Path(args.results)
    try:
        if args.verb == "add":
            from studies.records import records_of_run, save

            missing = [f"{run}/eval/{e}" for run in args.runs for e in args.evals or [] if not Path(run, "eval", e, "summary.json").exists()]
            if missing:
                raise FileNotFoundError(f"{', '.join(missing)}: no summary.json; give --evals the names of evaluation folders "
                                        "that rollout.py out_dir=RUN_DIR/eval/NAME wrote")
            for run in args.runs:
                check_fits(args.study, Path(run))
            records = [r for run in args.runs for r in records_of_run(Path(run), args.recipe, args.evals)]
            print(f"{args.study}: {save(results, args.study, records)} new or changed of {len(records)} records; "
                  f"python -m studies.claims rebuilds the tables")
            return []
        budget = replace(BUDGETS[args.budget], **({"seeds": args.seeds} if args.seeds else {}),
                         **({"workers": args.workers} if args.workers is not None else {}))
        study = STUDIES[args.study].select(args.arms, args.variants, args.settings)
        if args.verb == "show":
            show(study, budget, results)
            return []
        from studies.study import run

        slurm = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=", 1) for kv in args.slurm)}
        failed = run(study, budget, results, args.engine, args.jobs, slurm)
    except BrokenPipeError:  # `show ... | head` stopped reading: what it asked for was printed
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would fail again
        raise SystemExit(1) from None
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m studies: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # each command's own line is in its log; finished work is on disk and recorded
        print("python -m studies: interrupted; what finished is kept and recorded, an interrupted training resumes "
              "from its checkpoint: rerun the same command to continue", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None
    if failed:
        print("\n".join(f"failed: {line}" for line in failed), file=sys.stderr)
        raise SystemExit(f"{len(failed)} failed; the rest finished and is recorded. Rerun the same command to retry them.")
    return failed


if __name__ == "__main__":
    main()
