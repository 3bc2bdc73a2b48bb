"""common.provenance: what a run records of the machine and libraries it ran on, read from what is in use."""
import json
import os
import subprocess
import sys

import pytest
import torch

from common import provenance
from tests.helpers import REPO


def test_environment_names_the_installed_versions_and_the_kernels_torch_runs():
    env = provenance.environment()
    assert env["packages"]["torch"] == torch.__version__
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["cpu"]  # a model name, never empty
    json.dumps(env)  # stored as JSON as it is


def test_a_package_that_is_not_installed_is_recorded_as_none(monkeypatch):
    monkeypatch.setattr(provenance, "PACKAGES", {"torch": "torch", "no-such-distribution-xyz": "no_such_xyz"})
    assert provenance.environment()["packages"] == {"torch": torch.__version__, "no-such-distribution-xyz": None}


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="needs an AVX2 CPU")
def test_kernels_forced_to_avx2_are_recorded_as_avx2():
    # torch picks its CPU kernels by instruction set; another machine's (or ATEN_CPU_CAPABILITY's) must show
    code = "from common.provenance import environment; print(environment()['torch_cpu_capability'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}).stdout.strip()
    assert out == "AVX2"


def test_cpu_model_is_read_from_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU 9000\nflags\t: fpu\n")
    monkeypatch.setattr(provenance, "CPUINFO", info)
    assert provenance.cpu_model() == "Example CPU 9000"


def test_a_run_directory_adds_one_entry_per_session_and_never_follows_a_link(tmp_path):
    from core.rundir import ENVIRONMENT_FILE, RunDirectory

    outside = tmp_path / "elsewhere.json"
    outside.write_text('[{"secret": 1}]')
    run = tmp_path / "run"
    run.mkdir()
    (run / ENVIRONMENT_FILE).symlink_to(outside)  # a run directory from elsewhere
    rd = RunDirectory(run)
    rd.record_environment(0)
    rd.record_environment(500)
    written = run / ENVIRONMENT_FILE
    assert not written.is_symlink() and outside.read_text() == '[{"secret": 1}]'  # the link's target neither read nor written
    assert [s["from_step"] for s in json.loads(written.read_text())] == [0, 500]
