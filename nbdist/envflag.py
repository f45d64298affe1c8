"""On-by-default switches read from the environment (``NBDIST_PREWARM=0`` and the like)."""

from __future__ import annotations

import os

__all__ = ["switched_on"]

OFF = ("0", "false", "off", "no")


def switched_on(name: str) -> bool:
    """False when ``name`` is set to 0, false, off or no (any case); True otherwise."""
    return os.environ.get(name, "1").strip().lower() not in OFF
