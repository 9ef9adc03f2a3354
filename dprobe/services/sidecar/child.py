"""Work that may import PyTorch, or run without end, done in a child process within CPU, memory and time limits.

The sidecar predicts training jobs and builds model graphs this way: whatever a model costs (PyTorch's import
alone is about 600 MB of RSS), it costs a child, never the process that serves ``/metrics``. One child runs at
a time (a :class:`ChildRunner` is shared), it sees no GPU, and the kernel's OOM killer picks it before the
sidecar (``oom_score_adj`` 1000). A task is a function of :data:`TASKS`, called with JSON arguments, whose
JSON answer comes back on the child's stdout.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from dprobe.core.options import positive, zero_means
from dprobe.services.sidecar.memory import MIB, MemoryLimit, rss_bytes

# why a child's work was not done: the task failed, or the child ran past a limit or was killed
FAILURES = ("error", "timeout", "cpu", "memory", "killed")
MEMORY_EXIT = 3  # the child's exit status when it ran out of its address space
WATCH_SECONDS = 0.05  # how often a child's resident memory is read (the margin is what it may grow between two reads)
# what a child may run (module:function); the request names one of these, never code
TASKS = {"job": "dprobe.services.sidecar.jobs:predict_fields",
         "graph": "dprobe.services.sidecar.graphs:summarise"}
# the child: reads its request (one JSON line), imports as the sidecar does (its sys.path), runs child_main and
# exits without tearing PyTorch down (which raised a child's peak RSS by about 130 MB)
CHILD = ("import json, os, sys; request = json.loads(sys.stdin.readline()); sys.path[:] = request['path']; "
         "from dprobe.services.sidecar.child import child_main; status = child_main(request); "
         "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)")
RSS_DERIVED = "what the container's memory limit leaves the child"  # job_rss_limit_mib 0


@dataclass(frozen=True)
class JobLimits:
    """What one child may take: wall seconds, CPU seconds (``RLIMIT_CPU``), GiB of address space (``RLIMIT_AS``;
    PyTorch's CUDA build maps about 3 GiB when imported) and MiB of resident memory (``rss_mib``, watched by
    the parent; 0: what the container's memory limit leaves, :meth:`MemoryLimit.child_budget`). The options
    are named after jobs, and bound the model graphs' children too."""

    timeout_s: float = 120.0
    cpu_s: float = 120.0
    memory_gib: float = 8.0
    rss_mib: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("job_timeout", self.timeout_s), ("job_cpu_limit", self.cpu_s),
                            ("job_memory_limit", self.memory_gib)):
            positive(name, value)
        zero_means(RSS_DERIVED)("job_rss_limit_mib", self.rss_mib)


class ChildFailed(Exception):
    """A child's work failed or ran past a limit; ``reason``: one of :data:`FAILURES`, or a task's own reason
    (a :class:`TaskRefused`'s)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TaskRefused(Exception):
    """Raised by a task for a failure with a reason of its own (e.g. ``too_large``), handed to the parent."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is an allocation refused (by ``RLIMIT_AS``): Python's, PyTorch's, or
    a shared library's mapping when it is imported."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or any(s in str(exc) for s in (
                "MemoryError", "Cannot allocate memory", "can't allocate memory", "bad_alloc", "failed to map segment")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _peak_of(out: str) -> int:
    """The peak resident bytes a child reported beside its answer (0 where it did not)."""
    try:
        return int(json.loads(out).get("peak_rss_bytes", 0))
    except (ValueError, AttributeError, TypeError):
        return 0


def _set_limit(kind: int, soft: int, hard: int) -> None:
    """``setrlimit`` within the hard limit the process already has (it may only be lowered)."""
    _, now = resource.getrlimit(kind)
    if now != resource.RLIM_INFINITY:
        soft, hard = min(soft, now), min(hard, now)
    resource.setrlimit(kind, (soft, hard))


def child_main(request: Mapping[str, Any]) -> int:
    """The child (:data:`CHILD`): apply the limits, run the task, write ``{"ok": answer}`` (or ``{"failed":
    reason, "message": ...}`` for a :class:`TaskRefused`) as JSON to stdout; the exit status says why not
    (:data:`MEMORY_EXIT`, else 1, with the error on stderr)."""
    limits = request["limits"]
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    _set_limit(resource.RLIMIT_CPU, cpu, cpu + 2)  # SIGXCPU at the soft limit, SIGKILL at the hard one
    memory = int(limits["memory_gib"] * 2**30)
    _set_limit(resource.RLIMIT_AS, memory, memory)
    _set_limit(resource.RLIMIT_CORE, 0, 0)  # no core file of a child killed by SIGXCPU
    try:  # out of memory in the pod's cgroup: this child is killed, not the sidecar
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what libraries print goes to stderr; stdout holds the answer only
    try:
        module, _, name = TASKS[request["task"]].partition(":")
        answer = {"ok": getattr(importlib.import_module(module), name)(**request["args"])}
    except TaskRefused as exc:
        answer = {"failed": exc.reason, "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - the parent reads the reason from the status and stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return MEMORY_EXIT if _out_of_memory(exc) else 1
    answer["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump(answer, out)
    out.flush()
    return 0


class ChildRunner:
    """Runs tasks in child processes within ``limits``, one child at a time (callers in several threads wait
    their turn); :meth:`stop` kills the child under way and refuses further tasks. A child's resident memory is
    read every :data:`WATCH_SECONDS` and the child killed past ``limits.rss_mib``, or without it past what
    ``memory`` (the container's limit) leaves it beside this process; ``peak_rss_bytes``: the last child's peak."""

    def __init__(self, limits: JobLimits | None = None, memory: MemoryLimit | None = None) -> None:
        self.limits = limits or JobLimits()
        self.memory = memory or MemoryLimit(None, "no memory limit known")
        self._turn = threading.Lock()  # one child at a time: each may hold a PyTorch of its own
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self.stopping = False
        self.peak_rss_bytes = 0

    def rss_budget(self) -> tuple[int | None, str]:
        """The resident bytes a child may take now (None: not watched), and where that comes from."""
        if self.limits.rss_mib:
            return int(self.limits.rss_mib * MIB), "job_rss_limit_mib"
        own = rss_bytes() or 0
        return self.memory.child_budget(own), f"{self.memory} less the sidecar's {own / MIB:.0f} MiB and a margin"

    def run(self, task: str, args: Mapping[str, Any]) -> Any:
        """The answer of ``task`` (a key of :data:`TASKS`) called with ``args`` in a child; a
        :class:`ChildFailed` naming why when it fails or runs past a limit (it is killed then)."""
        request = json.dumps({"task": task, "args": dict(args), "limits": asdict(self.limits), "path": sys.path})
        with self._turn:
            with self._lock:
                if self.stopping:
                    raise ChildFailed("killed", "the sidecar is stopping")
                child = self._child = subprocess.Popen(  # no GPU: a replay runs on the meta device
                    [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
            try:
                out, err = self._watch(child, request + "\n")
            finally:
                with self._lock:
                    self._child = None
        return self._answer(child.returncode, out, err)

    def _watch(self, child: subprocess.Popen, request: str) -> tuple[str, str]:
        """Hand ``request`` to ``child`` and wait for its output, killing it past ``job_timeout`` or its
        resident memory budget (:meth:`rss_budget`, read every :data:`WATCH_SECONDS`)."""
        deadline = time.monotonic() + self.limits.timeout_s
        pending: str | None = request
        self.peak_rss_bytes = 0
        while True:
            budget, why = self.rss_budget()
            wait = deadline - time.monotonic()
            if budget is not None:
                wait = min(wait, WATCH_SECONDS)
            try:
                out, err = child.communicate(pending, timeout=max(0.0, wait))
            except subprocess.TimeoutExpired:
                pending = None  # handed over: communicate() goes on where it stopped
            else:
                self.peak_rss_bytes = max(self.peak_rss_bytes, _peak_of(out))
                return out, err
            rss = rss_bytes(child.pid) or 0
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            if budget is not None and rss > budget:
                self._kill(child)
                raise ChildFailed("memory", f"{rss / MIB:.0f} MiB resident, over its budget of "
                                            f"{max(0, budget) / MIB:.0f} MiB ({why}), killed")
            if time.monotonic() >= deadline:
                self._kill(child)
                raise ChildFailed("timeout", f"still running after {self.limits.timeout_s:g} s (job_timeout), "
                                             "killed")

    @staticmethod
    def _kill(child: subprocess.Popen) -> None:
        child.kill()
        child.communicate()

    def _answer(self, status: int, out: str, err: str) -> Any:
        if status == 0:
            answer = json.loads(out)
            if "failed" in answer:
                raise ChildFailed(answer["failed"], answer["message"])
            return answer["ok"]
        why = _last_line(err) or f"exit status {status}"
        if status == MEMORY_EXIT:
            raise ChildFailed("memory", f"out of its {self.limits.memory_gib:g} GiB of address space "
                                        f"(job_memory_limit): {why}")
        if status == -signal.SIGXCPU:
            raise ChildFailed("cpu", f"past its {self.limits.cpu_s:g} CPU seconds (job_cpu_limit), killed")
        if status < 0:
            try:
                name = signal.Signals(-status).name
            except ValueError:
                name = f"signal {-status}"
            raise ChildFailed("killed", f"killed by {name}")
        raise ChildFailed("error", why)

    def stop(self) -> None:
        """Kill the child under way, if any; tasks asked for from now on fail (reason ``killed``)."""
        with self._lock:
            self.stopping = True
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()


Request = TypeVar("Request")


class ChildQueue(Generic[Request]):
    """A worker thread that takes requests off a queue and computes each (in a child, through ``runner``), so
    that whoever queues them never waits. Subclasses set ``thread_name`` and ``runner`` and define
    :meth:`_compute`."""

    thread_name = "child-work"
    runner: ChildRunner

    def __init__(self) -> None:
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._work, name=self.thread_name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Stop the worker, and the child of a request under way."""
        self.runner.stop()
        self._queue.put(None)

    def run_pending(self) -> None:
        """Compute every queued request now, in this thread (tests; the service uses :meth:`start`)."""
        while not self._queue.empty():
            req = self._queue.get_nowait()
            if req is not None:
                self._compute(req)

    def _work(self) -> None:
        while (req := self._queue.get()) is not None:
            self._compute(req)

    def _compute(self, req: Request) -> None:
        raise NotImplementedError
