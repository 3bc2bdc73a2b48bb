"""The entry points' one convention: Hydra composes the config, a user error is one line.

A mistake the user can fix (a bad value, a missing or damaged file, a run directory in use) is
raised as ValueError / FileNotFoundError / FileExistsError / FloatingPointError with a message that
names the problem and the fix; ``run_command`` prints that message alone and exits 1. A permission
error (a read-only folder) and Ctrl-C end in one line too (Ctrl-C: exit 130, saying what was written;
a command that wrote something raises ``Interrupted`` with that in its message). Anything else is a
bug and keeps its traceback; ``HYDRA_FULL_ERROR=1`` shows the traceback of user errors too.

``main`` is each Hydra entry script's body: it composes the command line once (``compose_command``: a
line Hydra refuses ends in one line too) and runs the command on that composition; Hydra's own flags
(``--help``, ``--cfg``, ``-m``) go to Hydra's runner. ``quiet_ctrl_c``, called before an entry
script's imports (``main`` calls it first), makes a Ctrl-C during them one line too; this module imports
nothing heavy for that reason.
"""
from __future__ import annotations

import argparse
import errno
import functools
import os
import re
import signal
import sys

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, PermissionError)
INTERRUPTED_EXIT = 130  # the shell's status for a command ended by SIGINT
NOTHING_WRITTEN = "interrupted; nothing was written"  # the last line of a command stopped before it wrote a file
# a write the filesystem refuses (full disk, quota, a name too long, a read-only mount): the user's to fix, one line
WRITE_ERRNOS = {errno.ENOSPC: "free space or choose another folder", errno.EDQUOT: "free space or choose another folder",
                errno.ENAMETOOLONG: "choose a shorter name", errno.EROFS: "choose a writable folder"}


def is_write_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS


class OneLineParser(argparse.ArgumentParser):
    """argparse for the ``python -m`` commands: a bad option is one line (``PROG: error: ...``, exit 2), without
    the usage block argparse prints above it, like every other refusal of the package."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def at_least(least: int):
    """argparse type: an integer of at least ``least``, refused in one line before any work."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer of at least {least}")
        return value
    parse.__name__ = f"integer >= {least}"
    return parse


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command had written by then as its message."""


def _interrupted_at_start(prog: str, signum, frame) -> None:
    print(f"{prog}: {NOTHING_WRITTEN}", file=sys.stderr)
    raise SystemExit(INTERRUPTED_EXIT)


def quiet_ctrl_c(prog: str) -> None:
    """Until ``run_command`` starts, a Ctrl-C ends the command in one line: the imports and the
    composition before it (seconds: torch, Hydra) write nothing, and Python would print a traceback of
    its import machinery. An ignored SIGINT stays ignored (a spawned worker importing the entry script)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, functools.partial(_interrupted_at_start, prog))


def _started_quietly() -> bool:
    handler = signal.getsignal(signal.SIGINT)
    return isinstance(handler, functools.partial) and handler.func is _interrupted_at_start


def _message(exc: BaseException) -> str:
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(exc, MissingMandatoryValue):
        return f"{exc.full_key}= is required"
    if isinstance(exc, PermissionError) and exc.filename:
        return f"cannot write {exc.filename} (permission denied); make it writable or choose another path"
    if is_write_error(exc):
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) not in str(exc.strerror) else ""
        return f"{where}{exc.strerror or exc}; {WRITE_ERRNOS[exc.errno]}"
    return " ".join(str(exc).split("\n"))


def _close_progress_bars() -> None:
    """Bars the interrupted or failed work left open would redraw after the message: close them first."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def run_command(prog: str, fn, cfg):
    from omegaconf.errors import MissingMandatoryValue

    from .config import to_object

    if _started_quietly():  # from here a Ctrl-C is a KeyboardInterrupt, whose line says what the command wrote
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(to_object(cfg))
    except KeyboardInterrupt as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _close_progress_bars()
        print(f"{prog}: {str(exc) if isinstance(exc, Interrupted) else NOTHING_WRITTEN}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None
    except (*USER_ERRORS, MissingMandatoryValue, OSError) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or (isinstance(exc, OSError) and not isinstance(exc, USER_ERRORS)
                                                         and not is_write_error(exc)):
            raise
        _close_progress_bars()
        message = _message(exc)
        if isinstance(exc, MissingMandatoryValue):
            message += f" (python {prog} {exc.full_key}=...)"
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None


def hydra_message(text: str) -> str:
    """Hydra's several-line composition error in one line: its option lists joined, its search path and
    OmegaConf's ``full_key``/``object_type`` lines left out."""
    text = re.sub(r":\n((?:\t.*(?:\n|$))+)", lambda m: ": " + ", ".join(m.group(1).split()) + "\n", text.split("Config search path:")[0])
    lines = [line.strip().rstrip(".") for line in text.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith(("full_key:", "object_type=", "reference_type=")))


def _for_hydra(argv: list[str]) -> bool:
    """Hydra's own flags (``--help``, ``--cfg``, ``-m`` with its sweeps and launchers...) and settings of
    Hydra itself (``hydra.*``, ``hydra/...``) are Hydra's runner's business."""
    return any(a.startswith("-") or a.lstrip("+~").startswith(("hydra.", "hydra/")) for a in argv)


def _command(target: str):
    """ "module:function" -> the function, imported only now: a refused command line never loads it."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def compose_command(prog: str, config_name: str, argv: list[str]):
    """The command line composed, Hydra's node included (the recipe report reads its choices); a line
    Hydra refuses (a group option or key that does not exist, a wrong type) ends in one line, where
    Hydra would print several and a HYDRA_FULL_ERROR hint."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .config import compose_dict

    try:
        return compose_dict(config_name, argv, with_hydra=True)
    except (HydraException, OmegaConfBaseException) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        chain = [exc]
        while chain[-1].__cause__ is not None:  # Hydra's "Error merging override ..." is caused by OmegaConf's why
            chain.append(chain[-1].__cause__)
        print(f"{prog}: error: {hydra_message(chr(10).join(map(str, chain)))}", file=sys.stderr)
        raise SystemExit(1) from None


def _run_under_hydra(prog: str, config_name: str, target: str) -> None:
    """Hydra's own runner, for its flags and settings: it composes as each mode needs (``--cfg`` prints,
    a multirun composes once per job) and prints its own errors."""
    from pathlib import Path

    import hydra

    from .config import CONFIG_DIR, register_configs

    def job(cfg):
        return run_command(prog, _command(target), cfg)

    job.__module__ = Path(prog).stem  # Hydra names the job after it: "rollout is powered by Hydra" (--help)
    register_configs()
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config_name)(job)()


def main(prog: str, config_name: str, target: str) -> None:
    """An entry script's body: compose ``configs/<config_name>`` with the command line once and run
    ``target`` ("module:function", given the config's dataclasses) on it under ``run_command``. This is
    what Hydra's runner does for a plain command line under configs/quiet.yaml (no output folder, no log
    files), less its second composition (``Hydra.get_mode`` composes before ``Hydra.run`` does)."""
    quiet_ctrl_c(prog)  # first: a Ctrl-C during the imports and the composition (seconds) ends in one line too
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    argv = sys.argv[1:]
    if _for_hydra(argv):
        return _run_under_hydra(prog, config_name, target)
    cfg = compose_command(prog, config_name, argv)
    HydraConfig.instance().set_config(cfg)  # as Hydra's runner does: the job reads its choices there
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        return run_command(prog, _command(target), cfg)
    finally:
        HydraConfig.instance().cfg = None  # a later command in this process (a test) composes its own
