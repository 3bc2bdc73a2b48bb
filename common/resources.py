"""Room to work in: memory before a large allocation, disk space when a write fails for lack of it.

A machine without the memory a dataset needs, or a disk that fills up (a quota, ``ulimit -f``), is a
user's matter, not a bug: both end in one line (ValueError subclasses, which the commands print as
one line) saying what was needed and what to do. CPython ignores SIGXFSZ, so a write past
``ulimit -f`` raises OSError(EFBIG) instead of killing the process.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # disk full, file size limit, quota
# libraries that wrap the failed write in their own message (HDF5, Arrow, FFmpeg) still name its errno
_NO_ROOM_TEXT = re.compile(r"errno\s*=?\s*(%s)\b|%s" % ("|".join(map(str, NO_ROOM)),
                                                      "|".join(re.escape(os.strerror(e)) for e in NO_ROOM)), re.I)
GIB, MIB = 2**30, 2**20
MEMINFO = Path("/proc/meminfo")
# the way on when a dataset does not fit (the readers take max_episodes from train.max_episodes)
MEMORY_FIX = "free memory, use a machine with more, or train on fewer episodes (train.max_episodes=N reads only the first N)"
CGROUP_MAX, CGROUP_CURRENT = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")


class NoRoomError(ValueError):
    """A write failed because the disk (or the process's file size limit) had no room; nothing partial was left."""


class NotEnoughMemoryError(ValueError):
    """A dataset needs more memory than the machine has available: refused before allocating it."""


def is_no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for lack of room (ENOSPC, EFBIG, EDQUOT), however wrapped."""
    return isinstance(exc, OSError) and (exc.errno in NO_ROOM or bool(_NO_ROOM_TEXT.search(str(exc))))


def no_room(exc: BaseException, what, fix: str) -> NoRoomError:
    """The one line for a write of ``what`` that ran out of room; ``fix``: what was (not) left and the way out."""
    reason = os.strerror(exc.errno) if getattr(exc, "errno", None) in NO_ROOM else "no space left"
    return NoRoomError(f"could not write {what}: {reason.lower()} (a full disk, a quota or ulimit -f); {fix}")


def available_memory() -> int:
    """Bytes this process can still allocate: the kernel's MemAvailable, or less under a cgroup limit."""
    available = None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    if available is None:  # no /proc (macOS): free physical pages
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = CGROUP_MAX.read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int(CGROUP_CURRENT.read_text()))
    except (OSError, ValueError):
        pass
    return max(available, 0)


def size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def check_memory(needed: int, what: str, fix: str) -> None:
    """Refuse, before allocating, ``needed`` bytes for ``what`` when the machine has less available."""
    have = available_memory()
    if needed > have:
        raise NotEnoughMemoryError(f"{what} needs {size(needed)} of memory but {size(have)} is available; {fix}")
