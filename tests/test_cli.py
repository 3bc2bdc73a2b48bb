"""The entry scripts (core.cli.main): each composes its command line once, and Hydra's own flags still work."""
import runpy
import signal

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig

from tests.helpers import REPO

# each entry script, a command line and the function it hands the composed config to (stubbed: no work is done)
COMMANDS = {
    "train_policy.py": (["task=lift", "policy=bc", "attention=full"], "core.training", "train"),
    "rollout.py": (["checkpoint=x"], "core.evaluation", "run"),
    "generate_demos.py": (["task=pusht"], "datasets.generate", "run"),
}


@pytest.fixture
def compositions(monkeypatch):
    """Hydra's compositions so far (its runner's and its compose API's all load here)."""
    calls = []
    real = ConfigLoaderImpl.load_configuration

    def counting(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counting)
    return calls


@pytest.fixture(autouse=True)
def _restore_sigint():
    handler = signal.getsignal(signal.SIGINT)  # an entry script installs its own Ctrl-C handler
    yield
    signal.signal(signal.SIGINT, handler)


def _run_script(monkeypatch, script: str, argv: list[str], module: str, name: str) -> list:
    import importlib

    jobs = []
    monkeypatch.setattr(importlib.import_module(module), name, lambda cfg: jobs.append(cfg))
    monkeypatch.setattr("sys.argv", [script, *argv])
    runpy.run_path(str(REPO / script), run_name="__main__")
    return jobs


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_each_command_composes_its_config_once(script, compositions, monkeypatch, capsys):
    argv, module, name = COMMANDS[script]
    jobs = _run_script(monkeypatch, script, argv, module, name)
    assert len(jobs) == 1 and len(compositions) == 1  # before: train 5 (the recipe report's 2), rollout 3, generate 3
    if script == "train_policy.py":  # the recipe report reads the same composition
        assert "recipe changed task.crop_size: 76 -> 84" in capsys.readouterr().out
    assert not HydraConfig.initialized()  # nothing of this command is left for the next one in this process


def test_a_refused_command_line_is_composed_once_and_said_in_one_line(compositions, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        _run_script(monkeypatch, "rollout.py", ["checkpoint=x", "num_episodes=abc"], "core.evaluation", "run")
    assert exit_.value.code == 1 and len(compositions) == 1
    assert capsys.readouterr().err.splitlines() == ["rollout.py: error: Error merging override num_episodes=abc; "
                                                    "Value 'abc' of type 'str' could not be converted to Integer"]


def test_multirun_runs_one_job_per_value(monkeypatch, tmp_path):
    jobs = _run_script(monkeypatch, "rollout.py", ["-m", "checkpoint=a,b", f"hydra.sweep.dir={tmp_path}"],
                       "core.evaluation", "run")
    assert [job.checkpoint for job in jobs] == ["a", "b"]


def test_hydra_flags_print_the_config_and_the_help(monkeypatch, capsys):
    argv = ["checkpoint=x", "num_episodes=7", "--cfg", "job"]
    jobs = _run_script(monkeypatch, "rollout.py", argv, "core.evaluation", "run")
    assert not jobs and "num_episodes: 7" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        _run_script(monkeypatch, "rollout.py", ["--help"], "core.evaluation", "run")
    help_text = capsys.readouterr().out
    assert exit_.value.code == 0 and "rollout is powered by Hydra" in help_text and "corruption: null" in help_text
