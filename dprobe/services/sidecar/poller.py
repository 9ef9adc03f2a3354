"""One thread per source: poll every interval, back off on failure, log only changes of state."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from dprobe.services.sources.base import REJECT_REASONS, Sample, Source, SourceError, screen_samples

log = logging.getLogger(__name__)


class SourcePoller:
    """Polls ``source`` every ``interval`` seconds and hands samples to ``sink``.

    Every poll is screened first (:func:`screen_samples`): NaN, impossible readings and samples stamped
    more than ``max_skew`` seconds ahead of ``clock`` are refused and counted in ``rejected`` by
    reason, and a poll left without any reading (an empty or all-NaN answer) is a failed poll.
    On failure the error is counted, the delay doubles up to ``max_backoff``,
    and one line is logged when the source goes from working to failing (and
    one when it recovers), not one per failure.
    """

    def __init__(self, source: Source, sink: Callable[[list[Sample], str], None], interval: float,
                 max_backoff: float = 60.0, stop: threading.Event | None = None, max_skew: float = 5.0,
                 clock: Callable[[], float] = time.time):
        self.source, self.sink, self.interval, self.max_backoff = source, sink, interval, max_backoff
        self.max_skew, self.clock = max_skew, clock
        self.stop = stop or threading.Event()
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)  # fixed keys: read by scrapes while polls add to it
        self.errors_total = 0
        self.polls_total = 0
        self.up = False
        self.consecutive_failures = 0
        self.last_success: float | None = None
        self.last_error: str = ""
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """One poll; returns True on success. Never raises for source failures."""
        self.polls_total += 1
        try:
            got = self.source.poll()
            samples, refused = screen_samples(got, self.clock(), self.max_skew)
            self._count_refused(refused)
            if not samples:
                raise SourceError(f"no usable reading in the answer ({_describe(len(got), refused)})")
            self.sink(samples, self.source.name)
        except SourceError as exc:
            self._failed(str(exc))
            return False
        except Exception as exc:  # a bug or an unexpected library error must not kill the sidecar
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if not self.up:
            if self.consecutive_failures:
                log.warning("source %s recovered after %d failed polls", self.source.name,
                            self.consecutive_failures)
            else:
                log.info("source %s up: %d targets", self.source.name, len({s.target for s in samples}))
        self.up, self.consecutive_failures, self.last_success = True, 0, time.time()
        return True

    def _count_refused(self, refused: dict[str, int]) -> None:
        for reason, n in refused.items():
            if n and not self.rejected[reason]:  # once per reason: the counter says how often
                log.warning("source %s: readings refused (%s), counted in dprobe_rejected_samples_total",
                            self.source.name, reason.replace("_", " "))
            self.rejected[reason] += n

    def _failed(self, message: str) -> None:
        self.errors_total += 1
        self.consecutive_failures += 1
        if self.up or self.consecutive_failures == 1:
            log.warning("source %s failing: %s (retrying with backoff up to %g s)", self.source.name,
                        message, self.max_backoff)
        self.up, self.last_error = False, message

    def next_delay(self) -> float:
        if self.consecutive_failures == 0:
            return self.interval
        delay = min(self.max_backoff, self.interval * 2 ** min(self.consecutive_failures, 20))
        return delay * random.uniform(0.8, 1.0)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.poll_once()
            delay = self.next_delay() - (time.monotonic() - started if self.consecutive_failures == 0 else 0)
            self.stop.wait(max(0.0, delay))

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name=f"poll-{self.source.name}", daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def _describe(n_samples: int, refused: dict[str, int]) -> str:
    """``"empty"`` or ``"3 samples: 3 nan"``, for the log line of a poll without a usable reading."""
    if not n_samples:
        return "empty"
    why = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(refused.items()) if n)
    return f"{n_samples} sample{'s' * (n_samples != 1)}" + (f": {why}" if why else "")
