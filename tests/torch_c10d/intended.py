"""Where a c10d test run in a world ends otherwise than under torch's launcher, on purpose or
for a reason outside nbdist: one table, each entry with why. Anything else fails the suite."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTENDED", "Intended", "explained"]


@dataclass(frozen=True)
class Intended:
    test: str  # "TestDistBackendWithSpawn.test_name"
    world: str  # the world's outcome ("fail", "pass", ...)
    launcher: str  # torch's launcher's
    why: str


INTENDED: list[Intended] = []


def explained(test_id: str, world: dict | None, launcher: dict | None) -> str | None:
    """Why ``world`` and ``launcher`` may differ for this test, or None."""
    if world is None or launcher is None:
        return None
    for e in INTENDED:
        if (e.test, e.world, e.launcher) == (test_id, world["outcome"], launcher["outcome"]):
            return e.why
    return None
