"""What a training run directory says about itself, read as data from elsewhere: its config, where it trained, and
each evaluation's step, cap, identity, condition and vision reliance. ``studies.records`` makes records of them;
every path inside the run goes through ``core.rundir.run_path``, so a symbolic link inside it is refused.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from common.provenance import machine_tag
from .rundir import read_environment, run_path
from envs.factory import EVAL_SEED_START

RELIANCE_FILE = ("eval", "vision_reliance.json")  # inside a run: where probes.vision_reliance --into-run writes
EVALUATION_ID_CHARS = 16  # of the sha256 of an evaluation's identity: what tells two records of one evaluation apart


def value_text(v) -> str:
    """An override's or option's value as the command line writes it: true, null, [1,2], 0.5."""
    return {True: "true", False: "false", None: "null"}.get(v, v) if isinstance(v, (bool, type(None))) else \
        json.dumps(v, separators=(",", ":")) if isinstance(v, list) else str(v)


def condition_of(summary: dict) -> dict:
    """The inference options an evaluation changed, from its summary.json: its shifts, image size and attention
    settings, then every other option its identity names (camera_pose=nominal, n_action_steps=...), and its first seed."""
    from .inference import ATTENTION_OPTIONS

    ident = summary["identity"]
    other = {k: v for k, v in ident["inference"].items() if k not in ("image_size", *ATTENTION_OPTIONS)}
    condition = {k: summary[k] for k in ("image_size",) if summary.get(k)} | other
    condition |= {"attention": summary["attention_overrides"]} if summary.get("attention_overrides") else {}
    if summary.get("seed_start", EVAL_SEED_START) != EVAL_SEED_START:
        condition["seed_start"] = summary["seed_start"]
    return {**condition, **({"corruption": [list(c) for c in ident["shifts"]]} if ident["shifts"] else {})}


def reliance_of(run_dir: Path, weights: str) -> float | None:
    """The run's vision reliance (RUN/eval/vision_reliance.json, read through ``run_path``: a link is refused) when it
    measured the weights of sha256 ``weights``, else None (none measured, or another checkpoint's)."""
    path = run_path(run_dir, *RELIANCE_FILE)
    try:
        found = json.loads(path.read_text()) if path.is_file() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON ({' '.join(str(exc).split())[:80]}): measure it again with "
                         f"python -m probes.vision_reliance {run_dir} --into-run") from None
    return float(found["reliance"]) if isinstance(found, dict) and found.get("weights_sha256") == weights else None


RUN_CONFIG_KEYS = ("task", "policy", "attention", "train", "seed")  # what a record names its training by


def run_config(run_dir: Path) -> dict:
    """A run's config.json, read as input from elsewhere: a link, a file that is not JSON or one that lacks
    what a record needs ends in one line naming the file."""
    path = run_path(run_dir, "config.json")
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no config.json: give the run_dir= of a train_policy.py run")
    try:
        cfg = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON ({' '.join(str(exc).split())[:80]}): it is not a run's config as "
                         f"train_policy.py wrote it; restore it or train the run again") from None
    missing = [k for k in RUN_CONFIG_KEYS if not isinstance(cfg, dict) or k not in cfg]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it is not a run's config as train_policy.py wrote it; "
                         f"restore it or train the run again")
    return cfg


def trained_on(run_dir: Path) -> str:
    """Where a run trained: each session's CPU and kernels (environment.json), "" for runs from before it was recorded."""
    tags = list(dict.fromkeys(filter(None, map(machine_tag, read_environment(run_dir)))))
    return "trained on " + ", ".join(tags) if tags else ""


def machine_text(trained: str, summary: dict) -> str:
    """A record's ``machine``: where the run trained (``trained_on``) and where ``summary``'s evaluation ran."""
    evaluated = machine_tag(summary.get("environment"))
    return "; ".join(filter(None, (trained, evaluated and "evaluated on " + evaluated)))


def evaluation_fields(summary: dict, path: Path, run_cfg: dict) -> dict:
    """What a record takes from the evaluation itself: the checkpoint step it rolled out, its episode cap and its
    identity, hashed. A summary that is not a finished evaluation with an identity, or one of another task or
    policy than the run's, is refused in one line naming it."""
    from core.eval_identity import NotComparable, complete_identity

    try:
        ident = complete_identity(summary, path)
    except NotComparable as exc:
        raise ValueError(f"{exc}: evaluate it again (python rollout.py checkpoint=RUN_DIR out_dir={path.parent} "
                         f"overwrite=true) before recording it") from None
    theirs, ours = (ident["task"], ident["policy"]), (run_cfg["task"]["name"], run_cfg["policy"]["name"])
    if theirs != ours or not isinstance(ident["checkpoint_step"], int):
        raise ValueError(f"{path} evaluates a {' '.join(theirs)} checkpoint at step {ident['checkpoint_step']}, not one of "
                         f"this {' '.join(ours)} run: move it out of the run's eval/")
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:EVALUATION_ID_CHARS]
    return dict(steps=ident["checkpoint_step"], max_steps=ident["max_steps"], evaluation=digest)
