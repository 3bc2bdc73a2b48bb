"""Does a corruption move the policy's actions, and does that predict the rollouts? Measured on dataset windows.

    python -m probes.action_shift CKPT_A CKPT_B ... [--frames 48] [--corruption brightness:1] [--json OUT]

The whole policy (every camera, history To, head) on ``--frames`` dataset windows, clean and with every
image corrupted; its first executed action (index To-1) against the demonstrator's: ``action_error``
(mean ||a - a_demo||, clean and corrupted; on Lift and Can the arm's dimensions, all but the gripper),
``action_change`` (mean ||a' - a||) and ``action_bias`` (the norm of its mean: a drift every state shares,
which a closed loop accumulates), ``gripper_flips`` (the share of windows whose gripper command changes
sign) and ``feature_change`` (as ``feature_shift``). With the rollout success under the same corruption
(``<run>/eval/<tag>/summary.json``, the study's folder, e.g. ``eval/contrast2``), a Spearman rank correlation of each
measure with it across the checkpoints says which measure predicts the rollouts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from core.config import TaskConfig, from_dict
from datasets.factory import make_dataset
from datasets.sampler import SequenceDataset
from policies.checkpoint import load_policy, read_checkpoint_meta
from envs.corruptions import corrupt
from envs.shifts import Shift
from probes.feature_shift import encoder_input, measure_all, relative_change, save

ROBOSUITE_TASKS = ("lift", "can")  # their last action dimension is the gripper (open < 0 < closed)


def windows(policy, meta, frames: int) -> dict[str, np.ndarray]:
    """``frames`` evenly spaced training windows: {key: (F, To, ...)} and "action": (F, T, Da)."""
    c = policy.config
    data = make_dataset(from_dict(TaskConfig, meta["cfg"]["task"]), c.input_shapes)
    seq = SequenceDataset(data, list(c.input_shapes), n_obs_steps=c.n_obs_steps, horizon=c.horizon,
                          n_action_steps=c.n_action_steps)
    items = [seq[int(i)] for i in np.linspace(0, len(seq) - 1, frames).astype(int)]
    return {k: torch.stack([it[k] for it in items]).numpy() for k in items[0]}


def corrupted(batch: dict[str, np.ndarray], image_keys: list[str], shift: Shift) -> dict[str, np.ndarray]:
    """Every image of every window corrupted, as the rollouts corrupt every camera image."""
    out = dict(batch)
    for k in image_keys:
        imgs = batch[k]  # (F, To, H, W, C) uint8
        out[k] = np.stack([corrupt(im, *shift) for im in imgs.reshape(-1, *imgs.shape[2:])]).reshape(imgs.shape)
    return out


@torch.no_grad()
def first_actions(policy, batch: dict[str, np.ndarray]) -> torch.Tensor:
    """The first action the policy would execute on each window: (F, Da), unnormalized."""
    obs = {k: torch.from_numpy(batch[k]) for k in policy.config.input_shapes}
    torch.manual_seed(0)  # a GMM head or a diffusion policy samples: the same draws for clean and corrupted windows
    return policy.predict_action_chunk(obs)[:, 0]  # (F, Ta, Da) -> (F, Da)


def rollout_success(checkpoint, shift: Shift) -> float | None:
    """The success of this checkpoint's rollouts under the corruption (the study's folder), or None where there
    are none that evaluate these weights: a summary of another checkpoint, an unfinished or damaged one is
    named on stderr and not counted."""
    import sys

    from core.eval_folders import run_of
    from core.eval_identity import NotComparable, complete_identity, read_summary, weights_sha256
    from core.rundir import run_path
    from policies.checkpoint import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    path = run_path(run_of(ckpt), "eval", shift.tag, "summary.json")
    if not path.exists():
        return None
    try:
        summary = read_summary(path)
        if complete_identity(summary, path)["weights_sha256"] != weights_sha256(ckpt):
            raise NotComparable(f"{path} evaluates other weights than {ckpt}")
    except NotComparable as exc:
        print(f"note: {exc}; its rollout success is not used", file=sys.stderr)
        return None
    return summary["success_rate"]


def measure(checkpoint, frames: int, shift: Shift) -> dict:
    meta = read_checkpoint_meta(checkpoint)
    policy = load_policy(checkpoint).eval()
    clean = windows(policy, meta, frames)
    shifted = corrupted(clean, policy.config.image_keys, shift)
    demo = torch.from_numpy(clean["action"][:, policy.config.n_obs_steps - 1]).float()  # (F, Da): the demonstrator's "now"
    a, b = first_actions(policy, clean), first_actions(policy, shifted)
    enc = policy.obs_encoder
    key = policy.config.image_keys[0]
    with torch.no_grad():  # the first camera's newest frame of each window: (F, H, W, C)
        feature_change = relative_change(enc.vits[0](encoder_input(enc, key, clean[key][:, -1])),
                                         enc.vits[0](encoder_input(enc, key, shifted[key][:, -1])))
    att = meta["policy_config"]["vit"]["attention"]
    gripper = meta["cfg"]["task"]["name"] in ROBOSUITE_TASKS
    arm = slice(None, -1) if gripper else slice(None)
    return {"checkpoint": str(checkpoint), "attention": att["kind"], "windows": att.get("windows", "paper"),
            "mask_mode": att.get("mask_mode", "additive"), "input_norm": meta["policy_config"]["vit"].get("input_norm", "fixed"),
            "corruption": str(shift), "frames": frames,
            "action_error": {"clean": float((a - demo)[:, arm].norm(dim=1).mean()),
                             "corrupted": float((b - demo)[:, arm].norm(dim=1).mean())},
            "action_change": float((b - a)[:, arm].norm(dim=1).mean()),
            "action_bias": float((b - a)[:, arm].mean(0).norm()),  # a drift every window shares: closed loop, it adds up
            "gripper_flips": float((torch.sign(a[:, -1]) != torch.sign(b[:, -1])).float().mean()) if gripper else None,
            "feature_change": feature_change, "rollout_success": rollout_success(checkpoint, shift)}


def spearman(x, y) -> float:
    """Rank correlation (average ranks for ties); nan when either side is constant."""
    from scipy.stats import spearmanr

    return float("nan") if len(set(x)) < 2 or len(set(y)) < 2 else float(spearmanr(x, y).statistic)


def correlations(results: list[dict]) -> dict[str, float]:
    """Spearman correlation of each measure with rollout success, over the checkpoints that have one."""
    rows = [r for r in results if r["rollout_success"] is not None]
    if len(rows) < 3:
        return {}
    success = [r["rollout_success"] for r in rows]
    flips = [r["gripper_flips"] for r in rows]
    return {"checkpoints": len(rows),
            "action_error (corrupted)": spearman([r["action_error"]["corrupted"] for r in rows], success),
            "action_error (corrupted / clean)": spearman([r["action_error"]["corrupted"] / r["action_error"]["clean"] for r in rows], success),
            "action_change": spearman([r["action_change"] for r in rows], success),
            "action_bias": spearman([r["action_bias"] for r in rows], success),
            "gripper_flips": spearman(flips, success) if None not in flips else float("nan"),
            "feature_change": spearman([r["feature_change"] for r in rows], success)}


def main(argv=None):
    args, results = measure_all(argv, "python -m probes.action_shift", __doc__, measure, vit_only=False)
    print(f"{'checkpoint':40s} {'arm error clean -> corrupted':>28s} {'change':>7s} {'bias':>6s} {'gripper':>8s} {'feature':>8s} {'rollout':>8s}")
    for r in results:
        e, s, g = r["action_error"], r["rollout_success"], r["gripper_flips"]
        flips, rollout = ("" if g is None else f"{g:.2f}"), ("" if s is None else f"{s:.2f}")
        print(f"{Path(r['checkpoint']).name[:40]:40s} {e['clean']:>13.3f} -> {e['corrupted']:<11.3f} {r['action_change']:>7.3f} "
              f"{r['action_bias']:>6.3f} {flips:>8s} {r['feature_change']:>8.2f} {rollout:>8s}")
    # dense rows (full attention, or a mask applied as logits x 0/1) against sparse ones is the split the
    # rollouts show; the sparse checkpoints alone ask whether a measure also tells their seeds apart
    sparse = [r for r in results if r["attention"] != "full" and r["mask_mode"] != "multiplicative"]
    corr = {"all": correlations(results), "sparse rows only": correlations(sparse)}
    for group, values in corr.items():
        for name, rho in values.items():
            if name != "checkpoints":
                print(f"Spearman with rollout success, {group} ({values['checkpoints']} checkpoints), {name}: {rho:+.2f}")
    save(args, {"checkpoints": results, "spearman_with_rollout_success": corr})
    return results, corr


if __name__ == "__main__":
    main()
