"""One robustness report per checkpoint: a named set of settings (clean, then shifts) over the evaluation that
``rollout.py`` and the studies run, its shifted runs paired with the clean run episode by episode.

    python -m studies.suite RUN [--suite standard] [--workers 2] [--episodes 30] [--clean-episodes 50] [--max-steps N]
                                [--results results] [--recipe cpu]

Each setting is one ``core.evaluation.evaluate_checkpoint`` into ``RUN/eval/suite_<suite>/<setting>/``, whose
summary.json is rollout.py's (its ``identity`` included; ``python -m studies add STUDY RUN --evals
suite_standard/clean,...`` records them). One already there is kept only when it is a finished evaluation of
this checkpoint that answers the same question (``core.eval_identity``: weights, step, shifts, max_steps,
seeds); anything else (a resumed training, a different cap, an interrupted or empty evaluation) is evaluated
again, so an interrupted suite continues where it stopped. Every shifted run plays the clean run's seeds.
Writes ``report.md`` (success with its Wilson interval, the paired drop), ``report.png`` (success against
severity per kind) and ``eval_info.json`` (lerobot's ``eval_info.json`` field names) beside the settings.
A checkpoint folder given as RUN writes into its run's eval/, never inside the checkpoint.

The settings of a train_policy.py run are also records, as the studies write them (``studies.records``), in
``--results``/suite_<suite>/records.jsonl (``python -m studies.claims`` makes its table); where those results hold
the task's blind floor (a policy trained without any camera, ``studies.measure.floors``), the report sets every
setting against it and marks with ✗ each one not resolved above it.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.figures import save_png
from envs.factory import EVAL_SEED_START as EVAL_SEED
from envs.shifts import COMPARED_SEVERITY, RECIPE_PIXEL, SCENE_KINDS, SCENE_SEVERITIES, Shift, scene_kinds_of
from studies.measure import NOT_ABOVE_FLOOR

# the suites, as named sets of shifts; scene kinds a task cannot render are left out for that task
EVERY_SCENE = tuple(Shift(k, s) for k in SCENE_KINDS for s in SCENE_SEVERITIES)
IMAGENET_C = tuple(Shift(k, 3) for k in ("jpeg_compression", "motion_blur", "shot_noise", "pixelate"))  # ImageNet-C's, middle severity
SUITES = {
    "standard": (*EVERY_SCENE, *RECIPE_PIXEL, *IMAGENET_C),  # every scene kind and severity, the studies' pixel corruptions
    "scene": tuple(Shift(k, COMPARED_SEVERITY) for k in SCENE_KINDS),  # what a lab changes between afternoons
    "tiny": (Shift("colour", 1), Shift("brightness", 1)),  # for the tests: seconds
}
CLEAN = "clean"
PROG = "python -m studies.suite"


@dataclass(frozen=True)
class SuiteOptions:
    """How much each setting evaluates; checked before anything loads."""

    workers: int = 2
    episodes: int = 30  # per shifted setting
    clean_episodes: int = 50
    max_steps: int | None = None  # the task's horizon unless given

    def __post_init__(self):
        for name, least in (("workers", 0), ("episodes", 1), ("clean_episodes", 1), ("max_steps", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < least):
                raise ValueError(f"--{name.replace('_', '-')} {value}: give an integer of at least {least}")
        if self.clean_episodes < self.episodes:
            raise ValueError(f"--clean-episodes {self.clean_episodes} is fewer than --episodes {self.episodes}: each shifted "
                             f"run is paired with the clean run on its seeds; give --clean-episodes {self.episodes} or more")


def settings(suite: str, task: str) -> list[Shift]:
    """The suite's settings that ``task`` can render (one line on an unknown suite)."""
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r} does not exist; choose one of {', '.join(SUITES)}")
    return [s for s in SUITES[suite] if s.stage == "pixel" or s.kind in scene_kinds_of(task)]


def suite_folder(ckpt: Path, suite: str) -> Path:
    """<run>/eval/suite_<suite>, checked: inside a run it reaches no symbolic link (``core.rundir.run_path``)."""
    from core.eval_folders import run_of
    from core.rundir import is_run, run_path

    run = run_of(ckpt)
    return run_path(run, "eval", f"suite_{suite}") if is_run(run) else run / "eval" / f"suite_{suite}"


def evaluate_suite(run: Path, suite: str = "standard", options: SuiteOptions = SuiteOptions(), *, log=None,
                   progress: bool = True, results: Path | None = None, recipe: str = "cpu") -> Path:
    """Evaluate what is missing under one progress bar, record it in ``results`` (None: no records), then write the
    report; returns the suite's folder."""
    from tqdm import tqdm

    from core.config import InferenceOverrides
    from core.eval_identity import NotComparable, check_done
    from core.evaluation import evaluate_checkpoint, wanted_identity
    from policies.checkpoint import read_checkpoint_meta, resolve_checkpoint

    ckpt = resolve_checkpoint(run)
    meta = read_checkpoint_meta(ckpt)
    todo = settings(suite, meta["cfg"]["task"]["name"])  # before any evaluation: a bad suite costs nothing
    folder = suite_folder(ckpt, suite)
    plan = []
    for name, shifts, n in [(CLEAN, None, options.clean_episodes), *((s.tag, [s], options.episodes) for s in todo)]:
        inference = InferenceOverrides(corruption=shifts)
        wanted = wanted_identity(ckpt, meta, inference, seed=EVAL_SEED, num_episodes=n, max_steps=options.max_steps)
        try:
            check_done(folder / name / "summary.json", wanted)
            plan.append((name, inference, n, "kept"))
        except NotComparable as exc:
            plan.append((name, inference, n, "" if not (folder / name).exists() else str(exc)))
    with tqdm(total=sum(n for *_, n, kept in plan if kept != "kept"), disable=not progress, dynamic_ncols=True,
              unit="episode") as bar:
        say = log or bar.write
        for name, inference, n, state in plan:
            if state == "kept":
                say(f"{name}: evaluated already, kept")
                continue
            say(f"{name}: {n} episodes" + (f", evaluated again: {state}" if state else ""))
            bar.set_description(f"suite {suite}: {name}")
            t0 = time.perf_counter()
            summary = evaluate_checkpoint(ckpt, num_episodes=n, seed=EVAL_SEED, workers=options.workers,
                                          out_dir=folder / name, num_videos=0, max_steps=options.max_steps,
                                          inference=inference, progress=False, bar=bar, overwrite=True,
                                          clean_dir=folder / CLEAN)
            summary["eval_s"] = time.perf_counter() - t0
            _write(folder / name / "summary.json", json.dumps(summary, indent=2))
    summaries = {name: json.loads((folder / name / "summary.json").read_text()) for name, *_ in plan}
    floor = record(ckpt, suite, summaries, results, recipe, log or print) if results is not None else {}
    _report(folder, suite, summaries, floor)
    return folder


def record(ckpt: Path, suite: str, summaries: dict[str, dict], results: Path, recipe: str, say) -> dict[str, str]:
    """The settings as records in ``results``/suite_<suite>/ (a train_policy.py run's only: a record names its
    training by the run's config); each setting against the task's blind floor where ``results`` holds one."""
    from core.eval_folders import run_of
    from core.run_info import condition_of
    from core.rundir import is_run
    from studies.measure import above_floor, floors, load_all
    from studies.records import records_of_run, save

    run = run_of(ckpt)
    if not is_run(run):
        say(f"{ckpt} is not inside a train_policy.py run: no records written (a record names its training by the run's config)")
        return {}
    # one pass over the run (its config composed once); each setting's record found again by its condition
    recs = {json.dumps(r.condition, sort_keys=True): r for r in records_of_run(run, recipe, settings=[f"suite_{suite}/{n}" for n in summaries])}
    mine = {name: recs[json.dumps(condition_of(s), sort_keys=True)] for name, s in summaries.items()}
    say(f"suite_{suite}: {save(results, f'suite_{suite}', list(mine.values()))} new or changed records in "
        f"{results / f'suite_{suite}' / 'records.jsonl'}")
    floor = floors(load_all(results)).get(mine[CLEAN].task) if CLEAN in mine else None
    return {name: above_floor([rec], floor) for name, rec in mine.items()} if floor else {}


def _write(path: Path, text: str) -> None:
    from core.preflight import replace_file

    replace_file(path, text)  # whole or absent: a Ctrl-C leaves no half-written file


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _report(folder: Path, suite: str, summaries: dict[str, dict], floor: dict[str, str]) -> None:
    """report.md: each setting's success and paired drop, and (``floor``: setting -> text) its difference to the blind floor."""
    head = ["setting", "success [95% CI]", "− clean, paired (points) [95% CI]", *(["− no camera (points) [95% CI]"] * bool(floor)), "episodes"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summaries.items():
        lo, hi = s["success_rate_ci95"]
        p = s.get("paired")
        drop = f"{100 * p['difference']:+.0f} [{100 * p['difference_ci95'][0]:+.0f}, {100 * p['difference_ci95'][1]:+.0f}]" if p else ""
        cells = [name, f"{_pct(s['success_rate'])}% [{_pct(lo)}, {_pct(hi)}]", drop, *([floor.get(name, "")] * bool(floor)), str(s["num_episodes"])]
        rows.append("| " + " | ".join(cells) + " |")
    clean = summaries[CLEAN]
    encoder = f"attention {clean['attention']}" if clean.get("attention") else f"encoder {clean.get('encoder')}"
    against = (" − no camera: against the task's blind floor, a policy trained without any camera (its success holds under "
               f"every visual shift); {NOT_ABOVE_FLOOR}: not resolved above it, so the images have not been shown to help there.") * bool(floor)
    _write(folder / "report.md", f"# Suite `{suite}`: {clean['checkpoint']}\n\n{clean['task']} {clean['policy']}, "
           f"{encoder}. Success with its Wilson interval; the drop against the clean run "
           f"over the same initial states (per-episode pairs, bootstrap).{against}\n\n" + "\n".join(rows) + "\n")
    _write(folder / "eval_info.json", json.dumps(_eval_info(summaries), indent=2))
    _plot(folder / "report.png", summaries)


def _eval_info(summaries: dict[str, dict]) -> dict:
    """lerobot's eval_info.json fields, per setting (``per_episode`` and ``aggregated``)."""
    out = {}
    for name, s in summaries.items():
        eps = s["episodes"]
        out[name] = {"per_episode": [{"episode_ix": i, "sum_reward": e.get("sum_reward"), "max_reward": e["max_reward"],
                                      "success": e["success"], "seed": e["seed"]} for i, e in enumerate(eps)],
                     "aggregated": {"pc_success": 100 * s["success_rate"], "avg_max_reward": s["mean_max_reward"],
                                    "eval_s": s.get("eval_s", s["wall_seconds"])}}
    return out


def _plot(path: Path, summaries: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean = summaries[CLEAN]
    kinds: dict[str, list] = {}
    for s in summaries.values():
        for kind, severity in s.get("corruptions") or []:
            kinds.setdefault(kind, []).append((severity, s))
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, points in sorted(kinds.items()):
        points = [(0, clean)] + sorted(points, key=lambda p: p[0])
        x = [p[0] for p in points]
        y = [100 * p[1]["success_rate"] for p in points]
        err = [[y_ - 100 * p[1]["success_rate_ci95"][0] for y_, p in zip(y, points)],
               [100 * p[1]["success_rate_ci95"][1] - y_ for y_, p in zip(y, points)]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=kind)
    ax.set(xlabel="severity (0: clean)", ylabel="success (%)", ylim=(-2, 102), title=f"{clean['task']} {clean['policy']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_png(fig, path, dpi=100)


def main(argv=None) -> None:
    from core.cli import OneLineParser, at_least

    defaults = SuiteOptions()
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a train_policy.py run_dir or a checkpoint folder")
    ap.add_argument("--suite", default="standard", help=f"one of {', '.join(SUITES)}")
    ap.add_argument("--workers", type=at_least(0), default=defaults.workers)
    ap.add_argument("--episodes", type=at_least(1), default=defaults.episodes, help="per shifted setting")
    ap.add_argument("--clean-episodes", type=at_least(1), default=defaults.clean_episodes)
    ap.add_argument("--max-steps", type=at_least(1), default=defaults.max_steps, help="the task's horizon unless given")
    ap.add_argument("--results", type=Path, default=Path("results"), help="records go to RESULTS/suite_<suite>/records.jsonl")
    ap.add_argument("--recipe", default="cpu", help="the recipe the run was trained with (records name overrides beyond it)")
    args = ap.parse_args(argv)
    try:
        options = SuiteOptions(args.workers, args.episodes, args.clean_episodes, args.max_steps)
        folder = evaluate_suite(args.run, args.suite, options, results=args.results, recipe=args.recipe)
    except KeyboardInterrupt:
        sys.exit(f"{PROG}: interrupted; every finished evaluation is kept: rerun the same command to continue")
    except (ValueError, OSError) as exc:
        sys.exit(f"{PROG}: error: {' '.join(str(exc).split())}")
    print(f"report: {folder / 'report.md'}, {folder / 'report.png'}, {folder / 'eval_info.json'}")


if __name__ == "__main__":
    main()
