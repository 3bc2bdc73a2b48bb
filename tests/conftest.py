"""Fixtures shared by the tests; helpers (configs, synthetic episodes) live in tests/helpers.py."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_pusht_zarr(tmp_path_factory):
    from datasets.zarr_replay import write_pusht_zarr
    from tests.helpers import pusht_episodes

    path = tmp_path_factory.mktemp("data") / "pusht.zarr"
    write_pusht_zarr(path, pusht_episodes((14, 10, 12)))
    return path
