"""Attributes of a library replaced for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def replaced(owner: object, name: str, value: object) -> Iterator[None]:
    """``owner``'s attribute ``name`` set to ``value`` inside, then put back; left alone where ``owner`` has no
    such attribute (or it is None: another version of the library)."""
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
