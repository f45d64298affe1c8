"""Where a test run from a notebook ends otherwise than its reference, on purpose or for a
reason outside nbdist: one table, each entry with why. Anything else fails the suite."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INTENDED", "Intended", "explained"]


@dataclass(frozen=True)
class Intended:
    form: str  # "world" or "script"
    test: str  # "Class.test_name"
    world: str  # the world's outcome ("fail", "pass", ...)
    reference: str  # the reference's
    why: str


INTENDED: list[Intended] = []


def explained(form: str, test_id: str, world: dict | None, reference: dict | None) -> str | None:
    """Why ``world`` and ``reference`` may differ for this test, or None."""
    if world is None or reference is None:
        return None
    for e in INTENDED:
        if (e.form, e.test, e.world, e.reference) == (form, test_id, world["outcome"],
                                                      reference["outcome"]):
            return e.why
    return None
