"""The entry points' one convention: Hydra composes the config, a user error is one line.

A mistake the user can fix (a bad value, a missing or damaged file, a run directory in use) is
raised as ValueError / FileNotFoundError / FileExistsError / FloatingPointError with a message that
names the problem and the fix; ``run_command`` prints that message alone and exits 1. A permission
error (a read-only folder) and Ctrl-C end in one line too (Ctrl-C: exit 130, saying what was written;
a command that wrote something raises ``Interrupted`` with that in its message). Anything else is a
bug and keeps its traceback; ``HYDRA_FULL_ERROR=1`` shows the traceback of user errors too. A command
line Hydra itself refuses (a group option or key that does not exist, a wrong type) is composed first by
``check_overrides``, which says it in one line. ``quiet_ctrl_c``, called before an entry script's
imports, makes a Ctrl-C during them one line too; this module imports nothing heavy for that reason.
"""
from __future__ import annotations

import functools
import os
import re
import signal
import sys

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, PermissionError)
INTERRUPTED_EXIT = 130  # the shell's status for a command ended by SIGINT
NOTHING_WRITTEN = "interrupted; nothing was written"  # the last line of a command stopped before it wrote a file


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
    except (*USER_ERRORS, MissingMandatoryValue) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
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


def check_overrides(prog: str, config_name: str, argv: list[str] | None = None) -> None:
    """Compose the command line before Hydra does: a bad override (a group option or key that does not
    exist, a wrong type) ends in one line, where Hydra would print several. Hydra's own flags
    (``--cfg``, ``-m``, ``--help``) and ``hydra.*`` overrides are left to Hydra."""
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or any(a.startswith("-") for a in argv):
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .config import compose_dict

    try:
        compose_dict(config_name, [a for a in argv if not a.lstrip("+~").startswith("hydra.")])
    except (HydraException, OmegaConfBaseException) as exc:
        chain = [exc]
        while chain[-1].__cause__ is not None:  # Hydra's "Error merging override ..." is caused by OmegaConf's why
            chain.append(chain[-1].__cause__)
        print(f"{prog}: error: {hydra_message(chr(10).join(map(str, chain)))}", file=sys.stderr)
        raise SystemExit(1) from None
