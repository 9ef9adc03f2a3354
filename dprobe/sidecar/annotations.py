"""The pod's annotations, from a Kubernetes downward-API volume, read again when the kubelet rewrites it.

``kubectl annotate pod`` on a running pod reaches the file within the kubelet's sync period; the
sidecar then picks up a new ``dprobe.io/model-graph`` or ``dprobe.io/training-job`` without a restart.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_annotations(path: str | Path) -> dict[str, str]:
    """A Kubernetes downward-API annotations file (``key="value"`` per line); {} when it cannot be read."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].encode().decode("unicode_escape")
            out[key.strip()] = value
    return out


class AnnotationsFile:
    """One annotation of a downward-API file, re-read only when the file changed (a ``stat`` per check)."""

    def __init__(self, path: str | Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self._stamp: tuple[int, int, int] | None = None
        self.value = ""
        self.changed()

    def changed(self) -> bool:
        """Read the file again if it was rewritten; True when the annotation's value is not what it was."""
        try:
            st = os.stat(self.path)  # follows the volume's ..data symlink, which the kubelet swaps
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        value = read_annotations(self.path).get(self.key, "")
        if value == self.value:
            return False
        self.value = value
        return True
