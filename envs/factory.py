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

from common.camera_pose import CAMERA_POSE_SUFFIX

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


CAMERA_SUFFIX = "_image"  # robosuite tasks: the observation key of camera CAM is CAM_image


def env_kwargs_from_task(task, image_keys: list[str], image_size: int | None = None, scene_shifts=(),
                         lowdim_keys: list[str] = ()) -> dict:
    """Constructor arguments for the task's environment (a TaskConfig), rendering the cameras
    ``image_keys`` that the policy reads, under ``scene_shifts`` ``[(kind, severity), ...]`` (the scene
    stage of ``envs.shifts.parse_shifts``; none: clean, and the arguments of before), and reporting
    the cameras' poses where the policy reads one among ``lowdim_keys`` (``<camera>_camera``)."""
    kwargs = {"max_episode_steps": task.env.max_episode_steps}
    if task.name in ("lift", "can"):  # robosuite's camera CAM renders the observation key CAM_image
        foreign = [k for k in image_keys if not k.endswith(CAMERA_SUFFIX) or k == CAMERA_SUFFIX.lstrip("_")]
        if foreign:
            raise ValueError(f"the policy reads camera key(s) {foreign}, which task {task.name!r} does not give (its "
                             f"cameras are <camera>{CAMERA_SUFFIX}, e.g. agentview{CAMERA_SUFFIX}): the checkpoint's task "
                             f"was edited, or the policy was trained on another task")
        kwargs["cameras"] = tuple(k[: -len(CAMERA_SUFFIX)] for k in image_keys)
        if any(k.endswith(CAMERA_POSE_SUFFIX) for k in lowdim_keys):
            kwargs["camera_poses"] = True
    if image_size is not None:
        kwargs["image_size"] = image_size
    if scene_shifts:
        kwargs["scene_shifts"] = tuple((str(kind), int(severity)) for kind, severity in scene_shifts)
    return kwargs


@contextmanager
def ctrl_c_deferred():
    """A Ctrl-C inside is held until the block ends, then delivered to the handler of before.

    Starting workers is not cut in half: a Ctrl-C in the middle of ``Pool()`` or of a rollout's workers
    left running workers that nothing owned, and each failed seconds later with a traceback (rebuilding
    a queue the parent had removed, reading a pipe it had closed). Nothing changes where SIGINT is
    ignored (a background job) or outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        signal.raise_signal(signal.SIGINT)


class _SpawnProcessIgnoringCtrlC(mp.context.SpawnProcess):
    """A spawned process that leaves Ctrl-C to its parent, which stops it and reports once.

    A spawned child imports the entry script and torch for seconds before its own code runs, and a
    Ctrl-C then (the terminal sends it to the whole process group) killed it with a traceback. The
    launching thread blocks SIGINT while it launches, and the child inherits that mask through exec:
    from its first instruction a Ctrl-C waits, until ``run`` ignores it for good (dropping one that
    waited). The parent loses none: one that came during the launch is delivered right after it.
    """

    @staticmethod
    def _Popen(process_obj):
        # the launch starts multiprocessing's resource tracker the first time, and that start unblocks
        # SIGINT in this thread when it is done: started first, it leaves our block in place
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return mp.context.SpawnProcess._Popen(process_obj)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def run(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # first: a Ctrl-C that waited is dropped, not delivered
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        super().run()


class _SpawnContextIgnoringCtrlC(mp.context.SpawnContext):
    Process = _SpawnProcessIgnoringCtrlC


def worker_context() -> mp.context.BaseContext:
    """The multiprocessing context for environment and generation workers: ``spawn`` (forked OpenGL/EGL
    contexts crash) with children that hold Ctrl-C back from their first instruction, then ignore it."""
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
            elif cmd == "scene_shifts":  # for the episodes from the next reset on: a suite reuses its workers
                out = env.set_scene_shifts(arg)
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
            if cmd == "scene_shifts":
                return self.env.set_scene_shifts(arg)
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

    def wait_ready(self) -> None:
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

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


class EnvPool:
    """``max(1, workers)`` environments; with workers > 0 each lives in its own process."""

    def __init__(self, task: str, kwargs: dict, workers: int = 0):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if workers == 0:
            self.envs = [LocalEnv(task, kwargs)]
        else:
            ctx = worker_context()
            self.envs = []
            try:
                with ctrl_c_deferred():  # all started, or none: each is listed as it starts, for the kill below
                    for _ in range(workers):
                        self.envs.append(WorkerEnv(task, kwargs, ctx))
                for env in self.envs:  # they import and build their environments at once, seconds each
                    env.wait_ready()
            except BaseException:  # a worker that failed to start, or Ctrl-C: no worker outlives this
                for env in self.envs:
                    env.kill()
                raise

    def __len__(self) -> int:
        return len(self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
