"""Worker processes for CPU-bound work that is independent per item (replays, cross-validation folds).

Workers are spawned (not forked: torch's thread pools do not survive a fork) and run torch on one
thread each: the models fitted there are small, and on them one thread is as fast as two, so the
cores are better spent on separate items. Results do not depend on the number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

MAX_WORKERS = 4  # each worker holds its own torch (about 1 GB with a model being replayed)


def default_workers() -> int:
    """One worker per CPU core this process may use, at most :data:`MAX_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def resolve_workers(workers: int | None) -> int:
    """``workers`` as given (at least 1), or :func:`default_workers` for None."""
    if workers is None:
        return default_workers()
    if workers < 1:
        raise ValueError(f"workers must be at least 1 (1: no worker processes), or null for one per core; got {workers}")
    return int(workers)


def _start() -> None:
    import torch

    torch.set_num_threads(1)


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes, torch on one thread each.

    Hand large inputs to the tasks themselves, not to an initializer: initializer arguments travel in
    the pipe that starts each process, and should the process die before reading them, the parent
    stays blocked writing to that pipe, where a task's inputs would only break the pool (which callers
    catch as :class:`concurrent.futures.process.BrokenProcessPool`)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start)
