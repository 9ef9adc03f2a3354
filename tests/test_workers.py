"""Worker processes: a function run beside this process hands back its value, its error, or its death."""

from __future__ import annotations

import math
import os
import time

import pytest

from dprobe.core.workers import Beside


def test_beside_hands_back_the_value():
    job = Beside(math.factorial, 5)
    assert job.result() == 120


def test_beside_raises_the_error_with_the_traceback_as_a_note():
    job = Beside(math.factorial, -1)
    with pytest.raises(ValueError, match="not defined for negative values") as err:
        job.result()
    assert "in the process beside" in "".join(err.value.__notes__)


def test_beside_says_when_the_process_died_without_an_answer():
    job = Beside(os._exit, 3)
    with pytest.raises(ChildProcessError, match="exit code 3"):
        job.result()


def test_stop_ends_a_running_process():
    job = Beside(time.sleep, 60)
    assert not job.done()
    t0 = time.monotonic()
    job.stop()
    assert time.monotonic() - t0 < 10 and job.done()
