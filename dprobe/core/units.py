"""Sizes of memory: dprobe's fields, options and outputs hold bytes; a user gives a size with its unit.

:func:`parse_bytes` reads ``80GB`` (1e9 bytes a GB), ``141GiB`` (2**30 a GiB), ``80e9`` or ``85899345920``
(bytes). A bare number below :data:`BARE_BYTES_MIN` is refused: ``--gpu-memory 80`` is a size whose unit was
left out, not 80 bytes. :func:`size_arg` is the same as an ``argparse`` type, :func:`format_bytes` writes a size
back for messages. Imports nothing beyond the standard library (``--help`` stays fast).
"""

from __future__ import annotations

import argparse
import math
import re

# decimal (SI) and binary units; a unit is matched without regard to case, but the binary ones need their "i"
UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
# a bare number (no unit) is bytes only from this on: smaller ones are sizes whose unit was left out
BARE_BYTES_MIN = 10_000
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
EXAMPLE = "e.g. 80GB, 141GiB or 80e9 (bytes)"


def parse_bytes(text: str | float | int, what: str = "size") -> int:
    """Bytes of ``text``: a number with a unit (``80GB``, ``141 GiB``, ``512MiB``) or a bare number of bytes
    (``80e9``; at least :data:`BARE_BYTES_MIN`). A ValueError naming ``what`` for anything else."""
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a size with its unit, {EXAMPLE}; got {text!r}")
    if isinstance(text, (int, float)):
        number, unit = float(text), ""
    else:
        found = _SIZE.match(str(text))
        if found is None:
            raise ValueError(f"{what} must be a size with its unit, {EXAMPLE}; got {text!r}")
        number, unit = float(found.group(1)), found.group(2).lower()
        if unit not in UNITS and unit:
            raise ValueError(f"{what}: unknown unit {found.group(2)!r} in {text!r}; use one of B, kB, MB, GB, TB, "
                             f"KiB, MiB, GiB, TiB ({EXAMPLE})")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{what} must be above zero, got {text!r}")
    if not unit and number < BARE_BYTES_MIN:
        raise ValueError(f"{what} {text!r} has no unit: give one, {EXAMPLE} (a bare number is bytes)")
    return int(round(number * UNITS[unit or "b"]))


def size_arg(text: str) -> int:
    """:func:`parse_bytes` as an ``argparse`` type: a bad size is argparse's one-line usage error, naming the
    option (``argument --gpu-memory: size '80' has no unit: ...``)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_bytes(n: float, binary: bool = False) -> str:
    """``n`` bytes for a person: ``80 GB`` (or ``74.5 GiB`` with ``binary``), three significant digits."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB") if binary else ("B", "kB", "MB", "GB", "TB", "PB")
    base = 1024.0 if binary else 1000.0
    value, i = float(n), 0
    while abs(value) >= base and i < len(units) - 1:
        value, i = value / base, i + 1
    return f"{value:.3g} {units[i]}"
