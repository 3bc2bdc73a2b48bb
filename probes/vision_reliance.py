"""Does the policy look? Its actions when each window's camera images are another window's.

    python -m probes.vision_reliance CKPT_A CKPT_B ... [--frames 48] [--json OUT]

A policy that stops using its camera keeps its success under every scene shift and every image
corruption: its robustness says nothing about its encoder. On ``--frames`` evenly spaced dataset
windows (``action_shift``'s: the whole policy, history and low-dim kept), the first executed action
with the window's own images and with every camera's images taken from the window half the set away
(another demonstration, so another object placement). ``reliance``: the mean change of the action
that the swap makes, over the mean distance between the two windows' own actions; 0 for a policy
that ignores its images, about 1 when the images decide the action. ``action_error``: against the
demonstrator's action (on Lift and Can the arm's dimensions), with the own and the swapped images.

``--into-run`` also writes each result into its run, ``RUN/eval/vision_reliance.json``, with the step and the
sha256 of the weights it measured: ``python -m studies add`` attaches it to the records of evaluations of
those same weights (and to no others), and the study runner runs it on every checkpoint it evaluates.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from core.eval_identity import weights_sha256
from core.eval_folders import run_of
from core.preflight import replace_file
from core.run_info import RELIANCE_FILE
from core.rundir import is_run, run_path
from policies.checkpoint import checkpoint_step, load_policy, read_checkpoint_meta, resolve_checkpoint
from probes.action_shift import ROBOSUITE_TASKS, first_actions, windows
from probes.feature_shift import measure_all, save


def swapped(batch: dict[str, np.ndarray], image_keys: list[str]) -> dict[str, np.ndarray]:
    """Every camera's images of window i taken from window i + F/2 (mod F); low-dim and actions kept. A policy
    without a camera has nothing to swap: its reliance is 0 by construction (the blind floor's)."""
    if not image_keys:
        return dict(batch)
    half = len(batch[image_keys[0]]) // 2
    return {k: np.roll(v, half, axis=0) if k in image_keys else v for k, v in batch.items()}


def reliance(policy, batch: dict[str, np.ndarray], arm: slice = slice(None)) -> dict:
    """The swap's effect on ``policy``'s first actions over ``batch``'s windows (F >= 2)."""
    c = policy.config
    own, other_images = first_actions(policy, batch), first_actions(policy, swapped(batch, c.image_keys))  # (F, Da) each
    partner = torch.roll(own, len(own) // 2, dims=0)  # window i + F/2's own action
    demo = torch.from_numpy(batch["action"][:, c.n_obs_steps - 1]).float()  # (F, Da): the demonstrator's "now"
    change = float((other_images - own)[:, arm].norm(dim=1).mean())
    spread = float((partner - own)[:, arm].norm(dim=1).mean())
    return {"reliance": change / spread if spread > 0 else 0.0, "action_change": change, "action_spread": spread,
            "action_error": {"own images": float((own - demo)[:, arm].norm(dim=1).mean()),
                             "swapped images": float((other_images - demo)[:, arm].norm(dim=1).mean())}}


def measure(checkpoint, frames: int) -> dict:
    ckpt = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(ckpt)
    policy = load_policy(ckpt).eval()
    arm = slice(None, -1) if meta["cfg"]["task"]["name"] in ROBOSUITE_TASKS else slice(None)  # the gripper aside
    return {"checkpoint": str(checkpoint), "encoder": meta["policy_config"].get("encoder", "vit"),
            "attention": meta["policy_config"]["vit"]["attention"]["kind"], "frames": frames,
            # which weights were measured: a record takes the value only for an evaluation of these same weights
            "checkpoint_step": checkpoint_step(ckpt), "weights_sha256": weights_sha256(ckpt),
            **reliance(policy, windows(policy, meta, frames), arm)}


def write_into_run(result: dict) -> Path:
    """``result`` as ``RUN/eval/vision_reliance.json`` of the run its checkpoint belongs to (a link inside the run
    is refused: ``core.rundir.run_path``); a checkpoint outside any run is one line."""
    run = run_of(resolve_checkpoint(result["checkpoint"]))
    if not is_run(run):
        raise ValueError(f"{result['checkpoint']} is not inside a train_policy.py run: --into-run writes into a run's "
                         f"eval/; give the run directory, or use --json")
    path = run_path(run, *RELIANCE_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(result, indent=2) + "\n")
    return path


def main(argv=None):
    args, results = measure_all(argv, "python -m probes.vision_reliance", __doc__, measure, corruption=False, vit_only=False,
                                into_run=True)
    if args.into_run:
        try:
            for r in results:
                print(f"{write_into_run(r)}: reliance {r['reliance']:.2f}")
        except (ValueError, OSError) as exc:
            raise SystemExit(f"python -m probes.vision_reliance: error: {' '.join(str(exc).split())}") from None
    print(f"{'checkpoint':40s} {'reliance':>9s} {'change':>8s} {'spread':>8s} {'arm error own -> swapped':>26s}")
    for r in results:
        e = r["action_error"]
        print(f"{Path(r['checkpoint']).name[:40]:40s} {r['reliance']:>9.2f} {r['action_change']:>8.3f} {r['action_spread']:>8.3f} "
              f"{e['own images']:>12.3f} -> {e['swapped images']:<11.3f}")
    return save(args, results)


if __name__ == "__main__":
    main()
