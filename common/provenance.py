"""What a result depends on beyond its config and seed: the library versions and the machine's CPU.

A training run on the same data, config and seed is bitwise reproducible on one machine, but not across
machines: torch picks its CPU kernels by instruction set (AVX-512 or AVX2, ``ATEN_CPU_CAPABILITY``), and
30 steps of the Lift recipe with AVX2 kernels already differ from AVX-512's in 42 of 58 weight tensors
(by 7e-9 at most, measured 6 Dec), a difference 4000 steps and a closed-loop rollout can grow into other
episodes. So each training session and each evaluation records where it ran (``run_dir/environment.json``,
``summary.json``'s ``environment``), and a result that does not reproduce can be told apart from one that ran
on another CPU or library.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path

# the distributions whose versions change what a run computes or renders, with the module each installs
PACKAGES = {"torch": "torch", "torchvision": "torchvision", "numpy": "numpy", "mujoco": "mujoco", "robosuite": "robosuite",
            "robomimic": "robomimic", "gym-pusht": "gym_pusht", "pymunk": "pymunk", "timm": "timm", "diffusers": "diffusers"}
CPUINFO = Path("/proc/cpuinfo")


def _version(distribution: str, module: str) -> str | None:
    """The module's own ``__version__`` where it is loaded (torch's carries its build, ``2.14.1+cu130``),
    else the installed metadata's, never importing anything; None when it is not installed."""
    loaded = getattr(sys.modules.get(module), "__version__", None)
    if loaded is not None:
        return str(loaded)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what ``platform`` knows)."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_cpu_capability() -> str | None:
    """The instruction set torch's CPU kernels run with (e.g. AVX512, AVX2); None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return torch.backends.cpu.get_cpu_capability()


def environment() -> dict:
    """Where this process computes: Python, the OS, the CPU and torch's kernels for it, the renderer
    MuJoCo was told to use, and the version of each package in ``PACKAGES`` (None: not installed)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_cpu_capability": torch_cpu_capability(),
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "packages": {dist: _version(dist, module) for dist, module in PACKAGES.items()},
    }


def machine_tag(env: dict | None) -> str:
    """One environment as a record names it: the CPU and torch's kernels (``AMD EPYC AVX512``); "" if unknown."""
    if not isinstance(env, dict):
        return ""
    return " ".join(str(env[k]) for k in ("cpu", "torch_cpu_capability") if env.get(k))
