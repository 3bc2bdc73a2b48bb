"""Tiny synthetic data and configs shared by the tests (seconds, not minutes)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

TINY_POLICY = [
    "policy.vit.dim=32", "policy.vit.depth=2", "policy.vit.num_heads=4", "policy.vit.out_dim=16",
    "policy.horizon=8", "policy.n_action_steps=4",
]
# a tiny policy on PushT-shaped tensors (one 32x32 camera, a 2-D position, 2-D actions), for tests
# that build policies without a dataset: its normalization statistics and its encoder fields
ACT_MIN, ACT_MAX = np.array([0.0, -5.0], np.float32), np.array([512.0, 5.0], np.float32)
TINY_STATS = {"agent_pos": {"min": np.zeros(2, np.float32), "max": np.full(2, 512.0, np.float32)},
              "action": {"min": ACT_MIN, "max": ACT_MAX}}
TINY_ENCODER = dict(input_shapes={"image": [3, 32, 32], "agent_pos": [2]}, action_dim=2, crop_size=24,
                    vit=dict(patch_size=8, dim=32, depth=1, num_heads=2, out_dim=16))
VIT_CROP = 72  # the crop the tests' standalone ViTs are made for: a 9x9 grid of the default 8-px patches
TINY_DIFFUSION = ["policy.down_dims=[16,32]", "policy.diffusion_step_embed_dim=16", "policy.num_inference_steps=3"]


def pusht_episodes(lengths=(12, 9), seed=0, img_dtype=np.uint8):
    rng = np.random.default_rng(seed)
    eps = []
    for n in lengths:
        eps.append(dict(
            img=rng.integers(0, 256, (n, 96, 96, 3)).astype(img_dtype),
            state=rng.uniform(0, 512, (n, 5)).astype(np.float32),
            action=rng.uniform(0, 512, (n, 2)).astype(np.float32),
            keypoint=rng.uniform(0, 512, (n, 9, 2)).astype(np.float32),
            n_contacts=np.zeros((n, 1), np.float32),
        ))
    return eps


def compose(overrides: list[str], config_name: str = "config"):
    """The config a command composes from these overrides (core.config.compose)."""
    from core.config import compose as core_compose

    return core_compose(config_name, overrides)


def tiny_overrides(tmp_path, dataset, policy="diffusion", attention="fibottention", extra=()) -> list[str]:
    overrides = [f"policy={policy}", f"attention={attention}", "recipe=none", f"task.dataset.path={dataset}",
                 f"run_dir={tmp_path / 'run'}", "train.steps=2", "train.batch_size=4", "train.warmup_steps=1",
                 "train.log_every=1", "train.val_every=2", "train.checkpoint_every=2", "train.val_fraction=0.34",
                 *TINY_POLICY]
    if policy == "diffusion":
        overrides += TINY_DIFFUSION
    return overrides + list(extra)


def tiny_train_cfg(tmp_path, dataset, policy="diffusion", attention="fibottention", extra=()):
    return compose(tiny_overrides(tmp_path, dataset, policy, attention, extra))


def run_command(args: list[str], timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """Run one of the package's commands (e.g. ``["train_policy.py", "task=..."]``) as a user would."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl", **env}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
