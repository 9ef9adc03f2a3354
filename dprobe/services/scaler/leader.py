"""Leader election through a Kubernetes Lease (``coordination.k8s.io/v1``), with client-go's rules, so that
several scaler replicas run and one decides, publishes and acts at a time.

The holder of the Lease renews it every ``retry_seconds``; a replica takes it only once its holder has not
renewed it for ``lease_seconds``, timed on the taker's own clock from when it saw the last renewal (the nodes'
clocks need not agree). The holder leads only while its last renewal is younger than ``renew_seconds``, which
is shorter than ``lease_seconds``: a holder cut off from the API server stops leading before another replica
may start. A holder that stops cleanly gives the Lease up, and another replica takes it within
``retry_seconds``.

Each write of the holder also sets the Lease's annotations its ``annotate`` callback gives (the scaler's decision
state, :mod:`.state`), keeping the others; a replica that starts leading finds the annotations of the Lease it
took, and how long ago they were written, in :meth:`LeaderElector.handover`.

Not ``kubernetes.leaderelection`` (the official client's, 37.0): its ``LeaseLock`` writes the Lease's spec only
(the annotations carrying the decision state are neither written nor read back), reports a conflict (409) as any
other failure, and calls the client's global configuration; its ``LeaderElection`` blocks in ``run()`` on the wall
clock (``time.time``), one Lease per process, with no clock a test can drive. Sharding (:mod:`.shards`) runs
several of the electors here in one thread.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class LeaseError(RuntimeError):
    """The Lease could not be read or written (the API server refused or could not be reached)."""


class LeaseConflict(LeaseError):
    """Another replica wrote the Lease since it was read (HTTP 409): read it again next time."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says: who holds it, for how long, since when, and the version it was read at."""

    holder: str
    lease_seconds: int
    acquired: dt.datetime | None
    renewed: dt.datetime | None
    transitions: int
    version: str  # metadata.resourceVersion: a write fails with a conflict when it changed since
    annotations: Mapping[str, str] = field(default_factory=dict)  # metadata.annotations


@dataclass(frozen=True)
class Handover:
    """What a replica finds in the Lease it starts leading with: the annotations its last holder wrote, at least
    how many seconds ago (timed on this replica's monotonic clock from when it first saw that write: never more
    than the truth), and the writer's wall-clock time of the write (its ``renewTime``)."""

    annotations: Mapping[str, str]
    age: float
    renewed: dt.datetime | None


class LeaseStore(Protocol):
    """Reads and writes one Lease (:class:`KubernetesLease`, or a stand-in)."""

    def get(self) -> LeaseRecord | None: ...  # None: there is no such Lease

    def create(self, record: LeaseRecord) -> None: ...

    def update(self, record: LeaseRecord) -> None: ...  # LeaseConflict when record.version is not the latest


class KubernetesLease:
    """One Lease through the official client (RBAC: ``get``, ``update`` and ``create`` on ``leases`` of
    ``coordination.k8s.io`` in ``namespace``)."""

    def __init__(self, name: str, namespace: str, api: Any, timeout: float = 5.0) -> None:
        from kubernetes import client

        self.name, self.namespace, self.timeout = name, namespace, timeout
        self.api = client.CoordinationV1Api(api)

    def _call(self, what: str, method: Callable[..., Any], *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return method(*args, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404 and what == "read":
                return None
            error = LeaseConflict if exc.status == 409 else LeaseError
            raise error(f"Lease {self.namespace}/{self.name}: {what}: HTTP {exc.status} "
                        f"{exc.reason or ''}".rstrip()) from exc
        except (HTTPError, OSError) as exc:
            raise LeaseError(f"Lease {self.namespace}/{self.name}: {what}: {exc}") from exc

    def get(self) -> LeaseRecord | None:
        lease = self._call("read", self.api.read_namespaced_lease, self.name, self.namespace)
        if lease is None:
            return None
        spec = lease.spec
        return LeaseRecord(spec.holder_identity or "", int(spec.lease_duration_seconds or 0), spec.acquire_time,
                           spec.renew_time, int(spec.lease_transitions or 0), lease.metadata.resource_version or "",
                           dict(lease.metadata.annotations or {}))

    def _body(self, record: LeaseRecord) -> Any:
        from kubernetes import client

        return client.V1Lease(
            api_version="coordination.k8s.io/v1", kind="Lease",
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                         resource_version=record.version or None,
                                         annotations=dict(record.annotations) or None),
            spec=client.V1LeaseSpec(holder_identity=record.holder, lease_duration_seconds=record.lease_seconds,
                                    acquire_time=MicroTime.of(record.acquired), renew_time=MicroTime.of(record.renewed),
                                    lease_transitions=record.transitions))

    def create(self, record: LeaseRecord) -> None:
        self._call("create", self.api.create_namespaced_lease, self.namespace, self._body(record))

    def update(self, record: LeaseRecord) -> None:
        self._call("update", self.api.replace_namespaced_lease, self.name, self.namespace, self._body(record))


class MicroTime(dt.datetime):
    """A time as the API server reads a Lease's: RFC 3339 with exactly six fractional digits (a plain
    ``isoformat()`` drops them at a whole second, which the API server refuses)."""

    def isoformat(self, sep: str = "T", timespec: str = "microseconds") -> str:
        return super().isoformat(sep, timespec)

    @classmethod
    def of(cls, t: dt.datetime | None) -> MicroTime | None:
        if t is None:
            return None
        t = t if t.tzinfo else t.replace(tzinfo=dt.UTC)
        return cls(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=t.tzinfo)


def default_identity() -> str:
    """This replica's name in the Lease: its host name (the pod's name) and a random suffix, as client-go's."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """The pod's own namespace (its service account's), else ``default``."""
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


class RenewalThread:
    """Lease renewals on a thread of their own: :meth:`start` runs :meth:`renew_round` (which returns how long to
    wait for the next) until :meth:`stop`, which, with ``release``, gives up what is held (:meth:`release`)."""

    thread_name = "lease-renewal"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew_round(self) -> float:
        """One round of renewals; the seconds until the next."""
        raise NotImplementedError

    def release(self) -> None:
        """Give up every Lease held."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.renew_round()):
            pass

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, release: bool = True, timeout: float = 3.0) -> None:
        """Stop renewing; with ``release``, give up what is held."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if release:
            self.release()


class LeaderElector(RenewalThread):
    """Takes and renews one Lease from a thread of its own (:meth:`start`); :meth:`is_leader` says whether this
    replica leads now. ``term`` counts the times it started leading; ``errors["lease"]`` the failed calls.
    ``annotate``: the annotations each of its writes sets (called from the election's thread; the others are
    kept); :meth:`handover`: those of the Lease as this replica took it."""

    thread_name = "leader-election"

    def __init__(self, store: LeaseStore, identity: str, lease_seconds: int = 15, renew_seconds: float = 10.0,
                 retry_seconds: float = 2.0, errors: Counter[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < retry_seconds < renew_seconds < lease_seconds:
            raise ValueError("leader election needs 0 < retry_seconds < renew_seconds < lease_seconds, got "
                             f"{retry_seconds:g}, {renew_seconds:g}, {lease_seconds:g}")
        self.store, self.identity = store, identity
        self.lease_seconds, self.renew_seconds, self.retry_seconds = lease_seconds, renew_seconds, retry_seconds
        self.errors = errors if errors is not None else Counter()
        self.clock = clock
        self.holder = ""  # the holder as last read
        self.term = 0
        self.annotate: Callable[[], Mapping[str, str]] = dict
        self._handover: tuple[Mapping[str, str], float, dt.datetime | None] | None = None  # (annotations, seen at)
        self._renewed_at: float | None = None  # own clock, when the last successful write of ours was sent
        self._observed: tuple[str, float] | None = None  # (version, own clock) of the last change seen
        self._duration = float(lease_seconds)  # the Lease's duration as last read
        self._failure = ""
        self._lock = threading.Lock()
        super().__init__()

    def is_leader(self) -> bool:
        """True while this replica's last renewal is younger than ``renew_seconds``."""
        renewed = self._renewed_at
        return renewed is not None and self.clock() - renewed < self.renew_seconds

    def expired(self) -> bool:
        """Whether the Lease, as last read, is held by another replica that has not renewed it for its duration
        (timed on this replica's clock from when it saw the last renewal): anyone may take it."""
        observed = self._observed
        return (bool(self.holder) and self.holder != self.identity and observed is not None
                and self.clock() >= observed[1] + self._duration)

    def seen_renewing(self, within: float) -> bool:
        """Whether the Lease, as last read, changed (its holder renewed it) within ``within`` seconds of this
        replica's clock."""
        observed = self._observed
        return observed is not None and self.clock() - observed[1] < within

    def try_acquire_or_renew(self, take: bool = True) -> bool:
        """One attempt: take the Lease when free or expired, renew it when ours. True when it is ours now.
        ``take=False``: renew it when ours, else only read it (:attr:`holder`, :meth:`expired`)."""
        with self._lock:
            started = self.clock()
            now = dt.datetime.now(dt.UTC)
            try:
                old = self.store.get()
                if old is None and not take:
                    self._answered()
                    self.holder = ""
                    return self._lost()
                if old is None:
                    self.store.create(LeaseRecord(self.identity, self.lease_seconds, now, now, 0, "",
                                                  dict(self.annotate())))
                    return self._won(started, self.identity, None)
                if self._observed is None or self._observed[0] != old.version:
                    self._observed = (old.version, started)
                self.holder = old.holder
                mine = old.holder == self.identity
                self._duration = duration = old.lease_seconds or self.lease_seconds
                if not mine and (not take or (old.holder and started < self._observed[1] + duration)):
                    self._answered()
                    return self._lost()
                self.store.update(LeaseRecord(self.identity, self.lease_seconds, old.acquired if mine else now,
                                              now, old.transitions + (0 if mine else 1), old.version,
                                              {**old.annotations, **self.annotate()}))
                return self._won(started, old.holder, old)
            except LeaseConflict:
                self._answered()
                return self.is_leader()  # another replica wrote first; a holder keeps leading until its deadline
            except LeaseError as exc:
                self.errors["lease"] += 1
                (log.warning if str(exc) != self._failure else log.debug)("leader election: %s", exc)
                self._failure = str(exc)
                return self.is_leader()

    def _answered(self) -> None:
        if self._failure:
            log.info("leader election: the Lease answers again")
            self._failure = ""

    def _won(self, started: float, previous: str, old: LeaseRecord | None) -> bool:
        self._answered()
        if not self.is_leader():
            seen = self._observed[1] if self._observed is not None else started
            self._handover = None if old is None else (dict(old.annotations), seen, old.renewed)
            self.term += 1
            log.info("leading as %s (the Lease was %s)", self.identity, f"held by {previous}"
                     if previous and previous != self.identity else "free")
        self._renewed_at = started
        self.holder = self.identity
        return True

    def _lost(self) -> bool:
        if self._renewed_at is not None:
            log.warning("no longer leading: the Lease is held by %s", self.holder or "nobody")
            self._renewed_at = None
        return False

    def handover(self) -> Handover | None:
        """The annotations of the Lease as this replica last started leading with it (None: it created the
        Lease, or never led), and how long ago they were written, at least."""
        handover = self._handover
        if handover is None:
            return None
        annotations, seen, renewed = handover
        return Handover(annotations, max(0.0, self.clock() - seen), renewed)

    def release(self) -> None:
        """Give the Lease up at once (a clean stop), so that another replica takes it within ``retry_seconds``."""
        with self._lock:
            leading, self._renewed_at = self.is_leader(), None
            if not leading:
                return
            try:
                old = self.store.get()
                if old is not None and old.holder == self.identity:
                    now = dt.datetime.now(dt.UTC)
                    self.store.update(LeaseRecord("", 1, now, now, old.transitions, old.version,
                                                  {**old.annotations, **self.annotate()}))
                    log.info("gave the Lease up")
            except LeaseError as exc:
                log.warning("leader election: could not give the Lease up (another replica takes it once it "
                            "expires): %s", exc)

    def renew_round(self) -> float:
        leader = self.try_acquire_or_renew()
        # followers with a little jitter, so that replicas started together do not call in step
        return self.retry_seconds * (1.0 if leader else 1.0 + 0.2 * random.random())
