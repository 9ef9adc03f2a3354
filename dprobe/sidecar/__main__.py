"""``python -m dprobe.sidecar``: the same as ``dprobe sidecar``."""

from __future__ import annotations

import argparse
import logging
import sys

from dprobe.sidecar.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dprobe.sidecar")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["sidecar", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"dprobe sidecar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
