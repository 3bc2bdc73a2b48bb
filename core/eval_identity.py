"""What an evaluation answers: which weights, on which task, under which shifts, episode cap and seeds.

Every summary.json carries its ``identity``; whatever reuses an evaluation compares it instead of trusting a
file because it exists: "already evaluated" (``rollout.py``, the suite), pairing a shifted run with its clean
run, and ``python -m studies add``. A folder name, a run's config.json or a checkpoint's folder name says
nothing about the weights that were rolled out: a resumed run moves ``last`` on, a copied folder may hold
another task's checkpoint.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

# Bump when a change to the evaluation loop changes what a summary measures (episode ends, success, seeds):
# an evaluation of an older version is then evaluated again rather than counted as done.
EVAL_VERSION = 1
HASH_CHUNK = 1 << 20  # bytes read at a time while hashing the weights
# what must agree for two evaluations to answer the same question (seeds and shifts are compared apart)
SAME_POLICY = ("eval_version", "checkpoint_step", "weights_sha256", "task", "policy", "encoder", "inference", "max_steps")
NAMES = {"eval_version": "evaluation code version", "checkpoint_step": "checkpoint step",
         "weights_sha256": "weights (sha256)", "max_steps": "max_steps", "inference": "inference options"}


class NotComparable(ValueError):
    """An evaluation that does not answer the question asked: one line naming what differs."""


def weights_sha256(checkpoint) -> str:
    """sha256 of the checkpoint's evaluation weights (model.safetensors, the normalizer included)."""
    from policies.checkpoint import own_file

    digest = hashlib.sha256()
    with open(own_file(checkpoint, "model.safetensors"), "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def identity(*, step, weights: str, task: str, policy: str, encoder: str, shifts, inference: dict,
             max_steps: int, seeds: list[int]) -> dict:
    """The identity a summary.json records: ``max_steps`` is the cap the episodes ran under (the task's own
    when none was given), ``inference`` the options that change the policy at rollout (set ones only)."""
    return {"eval_version": EVAL_VERSION, "checkpoint_step": step, "weights_sha256": weights, "task": task,
            "policy": policy, "encoder": encoder, "shifts": [[str(k), int(s)] for k, s in shifts],
            "inference": {k: v for k, v in sorted(inference.items()) if v is not None},
            "max_steps": int(max_steps), "seeds": [int(s) for s in seeds]}


def _short(key: str, value) -> str:
    if key == "weights_sha256" and isinstance(value, str):
        return value[:12]
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)


def differences(found: dict, wanted: dict, keys=SAME_POLICY) -> list[str]:
    """What ``found`` answers otherwise than ``wanted``, as words: "checkpoint step 1 (asked: 2)"."""
    return [f"{NAMES.get(k, k)} {_short(k, found.get(k))} (asked: {_short(k, wanted.get(k))})"
            for k in keys if found.get(k) != wanted.get(k)]


def read_summary(path: Path) -> dict:
    """A summary.json, or NotComparable naming the file when it cannot be one (damaged, not an object)."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotComparable(f"{path} is not a readable summary ({' '.join(str(exc).split())[:80]})") from None
    if not isinstance(summary, dict):
        raise NotComparable(f"{path} is not a summary (a JSON {type(summary).__name__}, not an object)")
    return summary


def complete_identity(summary: dict, path) -> dict:
    """The identity of a finished evaluation, or NotComparable naming why it is none: written before the
    identity was recorded, no episodes, or fewer episodes than its seeds."""
    ident = summary.get("identity")
    if not isinstance(ident, dict) or not all(k in ident for k in (*SAME_POLICY, "shifts", "seeds")):
        raise NotComparable(f"{path} predates the evaluation identity (no checkpoint step and weights hash)")
    episodes = summary.get("episodes")
    seeds = [e.get("seed") for e in episodes] if isinstance(episodes, list) and all(isinstance(e, dict) for e in episodes) else None
    if not ident["seeds"] or seeds is None or sorted(seeds) != sorted(ident["seeds"]) or summary.get("num_episodes") != len(seeds):
        n = len(seeds) if seeds is not None else 0
        raise NotComparable(f"{path} holds {n} of {len(ident['seeds'])} episodes: an evaluation that did not finish")
    return ident


def check_done(path: Path, wanted: dict) -> None:
    """Return if ``path`` (a summary.json) is a finished evaluation answering ``wanted``; else NotComparable
    with the reason in words."""
    found = complete_identity(read_summary(path), path)
    diff = differences(found, wanted, (*SAME_POLICY, "shifts", "seeds"))
    if diff:
        raise NotComparable(f"{path} answers another question: {'; '.join(diff)}")


def check_pair(clean: dict, clean_path, shifted: dict) -> None:
    """A clean evaluation pairs with a shifted one only if it rolled out the same weights at the same step, task,
    policy, options and cap, without shifts, on every seed of the shifted one; else NotComparable naming why."""
    found = complete_identity(clean, clean_path)
    diff = differences(found, shifted)
    if found["shifts"]:
        diff.append(f"shifts {_short('shifts', found['shifts'])} (a clean run has none)")
    missing = sorted(set(shifted["seeds"]) - set(found["seeds"]))
    if missing:
        diff.append(f"{len(missing)} of the shifted run's seeds are missing (e.g. {missing[0]})")
    if diff:
        raise NotComparable(f"{clean_path} is not this evaluation's clean run: {'; '.join(diff)}")
