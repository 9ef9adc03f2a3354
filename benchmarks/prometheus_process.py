"""A real Prometheus on loopback for the benchmarks: started with the arguments given, awaited until it answers,
stopped (and killed if it will not stop) on the way out."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(args: list[str], log_path: Path, ready: Callable[[], bool], timeout: float,
            what: str = "prometheus did not become ready") -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` (the prometheus binary and its flags), its output in ``log_path``, until ``ready()`` is true
    (checked every 0.2 s; an ``OSError`` from it counts as not yet); a RuntimeError with the log's end if the
    process exits first, with ``what`` after ``timeout`` s."""
    log = log_path.open("w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {log_path.read_text()[-2000:]}")
            try:
                if ready():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
