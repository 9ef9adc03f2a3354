"""What the two job-log replays (:mod:`dprobe.sim.quota` and :mod:`dprobe.sim.fixed`) share: the check that a
log can be replayed in a sensible number of steps, and the progress bar."""

from __future__ import annotations

import numpy as np

from dprobe.sim.jobs import DAY, JobTable

# the most steps (quota decisions, demand samples) a run may take: about 19 years of 10-minute decisions, a
# few minutes of compute; a log that needs more has a wrong submit time or duration
MAX_STEPS = 1_000_000


def check_span(jobs: JobTable, step_seconds: float) -> None:
    """A ValueError, naming the job that makes it so, when replaying ``jobs`` in steps of ``step_seconds``
    (the decision interval, or the demand history's step where finer) takes more than ``MAX_STEPS``
    steps: from the first submission to the last end, were every job started at submission."""
    if not len(jobs):
        return
    ends = jobs.submit + jobs.duration
    last = int(np.argmax(ends))
    steps = (ends[last] - jobs.submit[0]) / step_seconds
    if steps > MAX_STEPS:
        raise ValueError(
            f"the jobs span {(ends[last] - jobs.submit[0]) / DAY:,.0f} days (job {jobs.job_ids[last]} of "
            f"{jobs.vc_names[jobs.vc[last]]}: submitted {(jobs.submit[last] - jobs.submit[0]) / DAY:,.1f} days into "
            f"the log, runs {jobs.duration[last] / DAY:,.1f} days): {steps:,.0f} steps of {step_seconds:g} s, more "
            f"than {MAX_STEPS:,}; is a submit time or duration wrong? (--days, --start-day and --vc simulate part "
            "of the log, a longer --interval takes fewer steps)")


def progress_bar(name: str, days: float, enabled: bool):
    """A tqdm bar over the simulated ``days`` (a no-op bar when not ``enabled``)."""
    from tqdm.auto import tqdm

    return tqdm(total=days, desc=f"simulate {name}", unit="day", disable=not enabled, leave=False,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} days [{elapsed}<{remaining}]")
