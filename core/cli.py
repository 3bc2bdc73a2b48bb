"""The entry points' one convention: Hydra composes the config, a user error is one line.

A mistake the user can fix (a bad value, a missing or damaged file, a run directory in use) is
raised as ValueError / FileNotFoundError / FileExistsError / FloatingPointError with a message that
names the problem and the fix; ``run_command`` prints that message alone and exits 1. Anything else
is a bug and keeps its traceback; ``HYDRA_FULL_ERROR=1`` shows the traceback of user errors too.
"""
from __future__ import annotations

import os
import sys

from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from .config import to_object

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError)


def run_command(prog: str, fn, cfg: DictConfig):
    try:
        return fn(to_object(cfg))
    except (*USER_ERRORS, MissingMandatoryValue) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if isinstance(exc, MissingMandatoryValue):
            message = f"{exc.full_key}= is required (python {prog} {exc.full_key}=...)"
        else:
            message = " ".join(str(exc).split("\n"))
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None
