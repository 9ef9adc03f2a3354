"""Worker processes for CPU-bound work that is independent per item (replays, cross-validation folds).

Workers are spawned (not forked: torch's thread pools do not survive a fork) and run torch on one
thread each: the models fitted there are small, and on them one thread is as fast as two, so the
cores are better spent on separate items. Results do not depend on the number of workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

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


def map_folds(fn: Callable[..., Any], folds: Sequence[tuple], workers: int, desc: str,
              progress: bool = True) -> list[Any]:
    """``fn(*fold)`` for every fold, in order: in ``workers`` spawned processes (``fn`` and its arguments
    are pickled, so ``fn`` is a module-level function or a ``functools.partial`` of one), or in this
    process with ``workers`` 1. Should a worker die (out of memory, say), the folds are fitted again in
    this process, with a warning: it costs time, not the run. ``desc``: the progress bar's label."""
    workers = min(workers, len(folds))
    bar = {"desc": desc + (f" ({workers} processes)" if workers > 1 else ""), "total": len(folds),
           "unit": "fold", "leave": False, "disable": not progress}
    if workers > 1:
        try:
            with spawn_pool(workers) as pool:
                return list(tqdm(pool.map(fn, *zip(*folds, strict=True)), **bar))
        except BrokenProcessPool as exc:
            log.warning("%s: worker processes stopped (%s); fitting the folds in this process", desc, exc)
    return [fn(*fold) for fold in tqdm(folds, **bar)]
