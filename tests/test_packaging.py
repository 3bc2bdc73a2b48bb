"""Installing the package (a wheel, or editable) puts no top-level module into the environment: the
repository's folders (``datasets``, ``core``, ``envs``, ``policies``, ``tests`` ...) are importable
from the repository root only, so HuggingFace ``datasets`` stays itself everywhere else."""
import json
import shutil
import subprocess
import sys
import zipfile

from tests.helpers import REPO

TOP_LEVEL = ("datasets", "core", "envs", "policies", "studies", "benchmarks", "tests")

BUILD = """
import json, sys
from setuptools import build_meta
out = sys.argv[1]
print(json.dumps([build_meta.build_wheel(out), build_meta.build_editable(out)]))
"""

# an environment whose site-packages holds only what the wheel installs, imported from outside the repo
FIND = """
import importlib.util, json, site, sys
site.addsitedir(sys.argv[1])  # runs the wheel's .pth files, as an installed environment does
print(json.dumps({name: getattr(importlib.util.find_spec(name), "origin", None) for name in sys.argv[2:]}))
"""


def _build(tmp_path) -> list:
    """(regular wheel, editable wheel) of a copy of the repository's code, built by its own build
    backend (in a copy: building writes build/ and *.egg-info beside pyproject.toml)."""
    src, out = tmp_path / "src", tmp_path / "dist"
    out.mkdir()
    for name in TOP_LEVEL:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "train_policy.py", "rollout.py", "generate_demos.py", "export_dataset.py"):
        shutil.copy(REPO / name, src / name)
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [out / name for name in json.loads(proc.stdout.strip().splitlines()[-1])]


def test_neither_wheel_installs_or_maps_a_top_level_module(tmp_path):
    wheel, editable = _build(tmp_path)
    files = zipfile.ZipFile(wheel).namelist()
    assert files and all(name.split("/")[0].endswith(".dist-info") for name in files), files
    for path in (wheel, editable):
        installed = tmp_path / path.name.split("-")[1]
        zipfile.ZipFile(path).extractall(installed)
        probe = tmp_path / "elsewhere"
        probe.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", FIND, str(installed), *TOP_LEVEL], cwd=probe,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        origins = json.loads(proc.stdout)
        # -I -S: no PYTHONPATH, no current folder, no site-packages: what is found here the wheel put there
        assert origins == {name: None for name in TOP_LEVEL}, origins
