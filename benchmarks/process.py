"""What the benchmarks read about their own process."""

from __future__ import annotations


def rss_mb() -> float:
    """Resident set size of this process now (MB; NaN where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
