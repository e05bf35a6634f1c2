"""The faults a walk may draw, and the ``--faults`` option's type (light: no I/O imports)."""

from __future__ import annotations

import argparse
from typing import Final

__all__ = ["FAULTS", "faults_arg"]

FAULTS: Final = ("delay", "reorder", "pause", "restart")
"""delay: we hold our sends; reorder: our NIXL agent makes no progress while we read
frames; pause: we do nothing at all; restart: we die and come back as a new incarnation
(see :mod:`p2pfsm.tools.conform.walk_tester` and :mod:`p2pfsm.tools.conform.walk_run`)."""


def faults_arg(text: str) -> tuple[str, ...]:
    """``all``, ``none`` or a comma-separated list of :data:`FAULTS`."""
    if text == "all":
        return FAULTS
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected all, none or some of {','.join(FAULTS)}; got {text!r}")
    return names
