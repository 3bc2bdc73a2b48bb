"""Fixtures shared by the tests; helpers (configs, synthetic episodes) live in tests/helpers.py."""
from __future__ import annotations

import os

# One thread per process, for torch here and for the commands the tests start (which inherit this
# environment): the tests' models are tiny, so a second intra-op thread buys nothing, and on a busy
# machine (`make test` runs two pytest-xdist workers on 2 cores) OpenMP's spinning threads burn CPU
# time the other worker needs. A test that wants more threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_pusht_zarr(tmp_path_factory):
    from datasets.zarr_replay import write_pusht_zarr
    from tests.helpers import pusht_episodes

    path = tmp_path_factory.mktemp("data") / "pusht.zarr"
    write_pusht_zarr(path, pusht_episodes((14, 10, 12)))
    return path

