"""The decision state that survives a change of leader: what the leading scaler writes into its Lease's annotations
with each renewal, and how the next leader (or this one, restarted) resumes from it.

Per workload and virtual cluster: its count (the last decision published, or the one restored), whether it was
published, its stabilisation windows, rate-policy changes and failures in a row
(:meth:`~dprobe.scaling.policy.Recommender.snapshot`), and what a virtual cluster's pods held at its last decision
on data. Times are ages, not clock readings: ages at the cycle that took the state
(``dprobe.io/scaler-state``), plus the seconds since then at the write (``dprobe.io/scaler-state-age``), plus the
seconds since the write as the next leader times it on its own monotonic clock (never more than the truth: a
window resumed ends no sooner than it would have). A state whose write is older than ``restore_seconds`` on the
reader's wall clock (or whose writer's clock is ahead by that much) is not resumed: the next leader then starts as
a restarted scaler does.

With sharding (:mod:`.shards`), each shard's Lease carries the state of that shard's objects only (``keep``), and a
replica that starts holding a shard takes up only that shard's objects from it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dprobe.scaling.policy import Policy
from dprobe.services.scaler.leader import Handover
from dprobe.services.scaler.ledger import Ledger

log = logging.getLogger(__name__)
STATE_ANNOTATION = "dprobe.io/scaler-state"
AGE_ANNOTATION = "dprobe.io/scaler-state-age"
VERSION = 1
MAX_BYTES = 128 * 1024  # of the Lease's 256 KiB of annotations; the objects beyond start as after a restart


def encode(workloads: Ledger[tuple[str, str]], vcs: Ledger[str], now: float,
           keep: Callable[[object], bool] | None = None) -> tuple[str, int]:
    """The state of every object whose count is known (and, with ``keep``, whose key it keeps: a shard's), as JSON
    (at most :data:`MAX_BYTES`), and how many objects did not fit (they start afresh after a change of leader)."""
    rows: list[str] = []
    size, left_out = 0, 0
    for kind, ledger in (("workloads", workloads), ("vcs", vcs)):
        for key, state in ledger.snapshot(now):
            if keep is not None and not keep(key if kind == "workloads" else key[0]):
                continue
            row = json.dumps([kind, list(key), state], separators=(",", ":"))
            if size + len(row) + 64 > MAX_BYTES:
                left_out += 1
                continue
            rows.append(row)
            size += len(row) + 1
    return f'{{"version":{VERSION},"objects":[{",".join(rows)}]}}', left_out


def lease_annotations(text: str | None, age: float) -> dict[str, str]:
    """What a write of the Lease sets: the state taken ``age`` seconds ago (nothing when there is none)."""
    if text is None:
        return {}
    return {STATE_ANNOTATION: text, AGE_ANNOTATION: f"{max(0.0, age):.2f}"}


def resume(handover: Handover | None, workloads: Ledger[tuple[str, str]], vcs: Ledger[str], now: float,
           wall_now: float, restore_seconds: float, policies: Mapping[str, Callable[[], Policy]],
           keep: Callable[[object], bool] | None = None) -> int:
    """Take up the state the last leader left in the Lease (``handover``) into the ledgers, ``now`` on this scaler's
    monotonic clock; ``policies``: each kind's default policy (``workloads``, ``vcs``); ``keep``: the keys to take
    up (a shard's: a state written with another number of shards may hold others). Returns the objects resumed; a
    state missing, stale or unreadable resumes nothing (logged)."""
    if handover is None or restore_seconds <= 0 or STATE_ANNOTATION not in handover.annotations:
        return 0
    written = None if handover.renewed is None else handover.renewed.replace(
        tzinfo=handover.renewed.tzinfo or dt.UTC).timestamp()
    if written is None or abs(wall_now - written) > restore_seconds:
        log.info("the Lease's decision state was written %s: not resumed, starting as after a restart",
                 "at an unknown time" if written is None else f"{wall_now - written:+.0f} s from now")
        return 0
    try:
        doc = json.loads(handover.annotations[STATE_ANNOTATION])
        age = float(handover.annotations.get(AGE_ANNOTATION, "0")) + handover.age
        if not isinstance(doc, dict) or doc.get("version") != VERSION or age != age:
            raise ValueError(f"not a version {VERSION} state")
        objects = list(doc.get("objects", []))
    except (ValueError, TypeError) as exc:
        log.warning("the Lease's decision state cannot be read (%s): starting as after a restart", exc)
        return 0
    at = now - max(0.0, age)
    resumed = 0
    for row in objects:
        try:
            kind, key, state = row
            ledger: Ledger[Any] = workloads if kind == "workloads" else vcs
            if kind not in policies or not isinstance(state, dict):
                raise ValueError(f"not an object's state: {row!r}")
            key = tuple(key) if kind == "workloads" else str(key[0])
            if keep is not None and not keep(key):
                continue
            ledger.resume(key, state, at, policies[kind])
            resumed += 1
        except (ValueError, TypeError, IndexError) as exc:
            log.warning("the Lease's decision state: %s left out (it starts as after a restart)", exc)
    log.info("resumed the decision state of %d workloads and virtual clusters from the Lease (%.1f s old)",
             resumed, age)
    return resumed
