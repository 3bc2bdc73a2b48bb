"""A spawned child's target that imports nothing heavy: the child starts in about a second, where
unpickling a target from test_reliability would import that module, torch and all, first."""
import signal


def report_sigint_ignored(queue) -> None:
    queue.put(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
