"""``python -m dprobe.services.sidecar``: the same as ``dprobe sidecar``."""

from __future__ import annotations

import sys

from dprobe.cli import main

if __name__ == "__main__":
    sys.exit(main(["sidecar", *sys.argv[1:]]))
