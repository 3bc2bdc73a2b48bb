"""Tiny synthetic data and configs shared by the tests (seconds, not minutes)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
torch.set_num_threads(min(2, torch.get_num_threads()))

REPO = Path(__file__).resolve().parents[1]

TINY_POLICY = [
    "policy.vit.dim=32", "policy.vit.depth=2", "policy.vit.num_heads=4", "policy.vit.out_dim=16",
    "policy.horizon=8", "policy.n_action_steps=4",
]
TINY_DIFFUSION = ["policy.down_dims=[16,32]", "policy.diffusion_step_embed_dim=16", "policy.num_inference_steps=3"]
ATTENTIONS = ["full", "fibottention", "lookhere", "bigbird"]


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


@pytest.fixture(scope="session")
def tiny_pusht_zarr(tmp_path_factory):
    from datasets.zarr_replay import write_pusht_zarr

    path = tmp_path_factory.mktemp("data") / "pusht.zarr"
    write_pusht_zarr(path, pusht_episodes((14, 10, 12)))
    return path


def compose(overrides: list[str]) -> dict:
    from common.config import compose_config

    return compose_config(overrides)


def tiny_train_cfg(tmp_path, dataset, policy="diffusion", attention="fibottention", extra=()):
    overrides = [f"policy={policy}", f"attention={attention}", f"task.dataset.path={dataset}", f"run_dir={tmp_path / 'run'}",
                 "train.steps=2", "train.batch_size=4", "train.warmup_steps=1", "train.log_every=1",
                 "train.val_every=2", "train.checkpoint_every=2", "train.val_fraction=0.34", *TINY_POLICY]
    if policy == "diffusion":
        overrides += TINY_DIFFUSION
    return compose(overrides + list(extra))
