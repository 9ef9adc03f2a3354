"""What the options' declarations (:mod:`dprobe.core.options`) and their sources
(:mod:`dprobe.core.option_sources`) both say: URLs without their passwords, a former option name's warning,
and the sections a settings file may hold."""

from __future__ import annotations

import logging
import re

LOG = logging.getLogger("dprobe.settings")
USERINFO = re.compile(r"//([^/?#\s]*)@")  # the user info of a URL's authority (up to its last @)
SERVICE_SECTIONS = ("sidecar", "scaler", "exporter")  # one file may hold the settings of several services


def _hide_userinfo(found: re.Match[str]) -> str:
    user, colon, _ = found.group(1).partition(":")
    return f"//{user}:xxxxx@" if colon else "//xxxxx@"


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message quoting URLs) as it may be shown: the password of each URL's user info
    replaced (``https://user:xxxxx@host``), and user info without a password (a token) wholly (``xxxxx@``)."""
    return USERINFO.sub(_hide_userinfo, text)


def deprecated(where: str, old: str, new: str) -> None:
    """Log that option ``old`` (given as ``where``: a variable, a flag, a file's key) is a former name of ``new``."""
    LOG.warning("%s: option %s is deprecated: use %s", where, old, new)
