"""Worker processes for CPU-bound work that is independent per item (replays, cross-validation folds).

Workers are spawned (not forked: torch's thread pools do not survive a fork) and run torch on one
thread each: the models fitted there are small, and on them one thread is as fast as two, so the
cores are better spent on separate items. Results do not depend on the number of workers.
:class:`Beside` runs one function in a process of its own while the caller goes on (a training
stage beside another).
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


def available_cores() -> int:
    """The CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """One worker per CPU core this process may use, at most :data:`MAX_WORKERS`."""
    return min(available_cores(), MAX_WORKERS)


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


class Beside:
    """``fn(*args)`` in a spawned process while this one goes on with other work.

    The process is not a daemon, so ``fn`` may start worker processes of its own. :meth:`result` waits for
    its return value, or raises its exception (the process's traceback added as a note), or
    :class:`ChildProcessError` if it died without either (e.g. killed for memory); :meth:`stop` ends it.
    ``fn`` and ``args`` are pickled: ``fn`` is a module-level function."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "dprobe-beside") -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_run_beside, args=(child_end, fn, args), name=name)
        self._process.start()
        child_end.close()  # the parent keeps the reading end only: EOF once the process is gone

    def done(self) -> bool:
        """Whether the result (or the process's end) is there, without waiting."""
        return self._conn.closed or self._conn.poll() or not self._process.is_alive()

    def result(self) -> Any:
        try:
            ok, value = self._conn.recv()
        except EOFError:
            self._process.join()
            raise ChildProcessError(f"{self._process.name} stopped (exit code {self._process.exitcode}) "
                                    "before it returned") from None
        finally:
            self._conn.close()
        self._process.join()
        if ok:
            return value
        raise value

    def stop(self) -> None:
        """End the process if it still runs."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._conn.close()


def _run_beside(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    import traceback

    try:
        outcome = (True, fn(*args))
    except BaseException as exc:  # handed to the parent, which raises it
        exc.add_note("in the process beside:\n" + traceback.format_exc())
        outcome = (False, exc)
    try:
        conn.send(outcome)
    except Exception as exc:  # a value or exception that does not pickle
        conn.send((False, RuntimeError(f"{fn.__name__}: its outcome could not be handed back ({exc!r}): "
                                       f"{outcome[1]!r}")))
    finally:
        conn.close()
