"""make_env(task) and a pool of environment worker processes for parallel rollouts.

Every task is a ``gymnasium.Env`` with one convention: observation dict of uint8 HWC camera
images and float32 low-dim vectors named as in the datasets, and ``info["success"]``.
Workers are started with ``spawn``: forked OpenGL/EGL contexts crash.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import traceback
from contextlib import contextmanager

TASKS = ("pusht", "lift", "can")
# Demonstrations use initial-state seeds below this, evaluation seeds start here: they never overlap.
EVAL_SEED_START = 100_000


def make_env(task: str, **kwargs):
    if task == "pusht":
        from .pusht import PushTEnv

        return PushTEnv(**kwargs)
    if task in ("lift", "can"):
        from .robosuite_tasks import RobosuiteEnv

        return RobosuiteEnv(task, **kwargs)
    raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")


def env_kwargs_from_task(task, image_keys: list[str], image_size: int | None = None) -> dict:
    """Constructor arguments for the task's environment (a TaskConfig), rendering the cameras
    ``image_keys`` that the policy reads."""
    kwargs = {"max_episode_steps": task.env.max_episode_steps}
    if task.name in ("lift", "can"):
        kwargs["cameras"] = tuple(k[: -len("_image")] for k in image_keys)
    if image_size is not None:
        kwargs["image_size"] = image_size
    return kwargs


@contextmanager
def _sigint_ignored():
    """SIGINT ignored in this process while inside; outside the main thread (which alone may set a
    handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _SpawnProcessIgnoringCtrlC(mp.context.SpawnProcess):
    """A spawned process that leaves Ctrl-C to its parent, which stops it and reports once.

    A spawned child imports the entry script and torch for seconds before its own code runs, and a
    Ctrl-C then (the terminal sends it to the whole process group) killed it with a traceback. SIG_IGN
    is the one disposition exec keeps, so this process is launched with it and ignores SIGINT from its
    first instruction. The parent ignores it too, but only while it launches the child (7-44 ms for a
    pool of two on a loaded 2-core machine), not through the pool's whole start-up, so a Ctrl-C soon
    after the workers exist is the parent's again. ``run`` ignores it once more, for a child launched
    from another thread, where the parent may not change handlers.
    """

    @staticmethod
    def _Popen(process_obj):
        with _sigint_ignored():
            return mp.context.SpawnProcess._Popen(process_obj)

    def run(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        super().run()


class _SpawnContextIgnoringCtrlC(mp.context.SpawnContext):
    Process = _SpawnProcessIgnoringCtrlC


def worker_context() -> mp.context.BaseContext:
    """The multiprocessing context for environment and generation workers: ``spawn`` (forked OpenGL/EGL
    contexts crash) with children that ignore Ctrl-C from their first instruction."""
    if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
        # inside a joblib (loky) worker the process-wide start method is "loky", which a spawned
        # child cannot set up: spawn's children inherit the parent's method by name
        mp.set_start_method("spawn", force=True)
    return _SpawnContextIgnoringCtrlC()


def _worker(conn, task: str, kwargs: dict) -> None:
    try:
        env = make_env(task, **kwargs)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "reset":
                out = env.reset(seed=arg)[0]
            elif cmd == "step":
                out = env.step(arg)
            elif cmd == "render":
                out = env.render()
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", out))
        except Exception as exc:  # reported to the caller, which records the episode as failed
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class EnvError(RuntimeError):
    pass


class LocalEnv:
    """Same calls as a worker, in this process (workers=0: tests, debugging)."""

    def __init__(self, task: str, kwargs: dict):
        self.env = make_env(task, **kwargs)

    def send(self, cmd: str, arg=None) -> None:
        self._pending = (cmd, arg)

    def recv(self):
        cmd, arg = self._pending
        try:
            if cmd == "reset":
                return self.env.reset(seed=arg)[0]
            if cmd == "step":
                return self.env.step(arg)
            if cmd == "render":
                return self.env.render()
        except Exception as exc:
            raise EnvError(f"{type(exc).__name__}: {exc}") from exc
        raise ValueError(cmd)

    def close(self) -> None:
        self.env.close()


class WorkerEnv:
    def __init__(self, task: str, kwargs: dict, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, task, kwargs), daemon=True)
        self.proc.start()
        child.close()  # the worker's end lives in the worker only: if it dies, recv() ends instead of waiting forever
        try:
            status, msg = self.conn.recv()
        except EOFError:
            self.proc.join(timeout=10)
            raise EnvError(f"environment worker exited before it was ready (exit code {self.proc.exitcode}); "
                           "its error is above") from None
        if status != "ready":
            raise EnvError(f"environment worker failed to start:\n{msg}")

    def send(self, cmd: str, arg=None) -> None:
        self.conn.send((cmd, arg))

    def recv(self):
        status, out = self.conn.recv()
        if status != "ok":
            raise EnvError(out)
        return out

    def close(self) -> None:
        try:
            self.conn.send(("close", None))
            self.conn.recv()
        except (EOFError, BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


class EnvPool:
    """``max(1, workers)`` environments; with workers > 0 each lives in its own process."""

    def __init__(self, task: str, kwargs: dict, workers: int = 0):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if workers == 0:
            self.envs = [LocalEnv(task, kwargs)]
        else:
            ctx = worker_context()
            self.envs = [WorkerEnv(task, kwargs, ctx) for _ in range(workers)]

    def __len__(self) -> int:
        return len(self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
