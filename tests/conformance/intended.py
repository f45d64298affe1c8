"""The differences nbdist means to make: one table, the README's is generated from it.

Each entry names an observation (``key``, recorded by a case's program or by the harness)
and the value it has in a script and in a world. A difference between the two runs of a
case is intended when both values are the entry's; ``world`` may be a regex (``re:...``)
matched against the JSON of the world's value. Anything else that differs fails the suite.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["INTENDED", "Intended", "intended"]


@dataclass(frozen=True)
class Intended:
    key: str  # the observation
    script: Any  # its value in a script
    world: Any  # its value in a world ("re:..." matches the value's JSON)
    what: str  # the README row: the behaviour
    in_script: str  # ... what torch does
    in_world: str  # ... what a world does
    why: str

    def matches(self, script: Any, world: Any) -> bool:
        if script != self.script:
            return False
        if isinstance(self.world, str) and self.world.startswith("re:"):
            return re.fullmatch(self.world[3:], json.dumps(world)) is not None
        return world == self.world


INTENDED: list[Intended] = [
    Intended(
        "port open", True, False,
        "`init_process_group` with `MASTER_ADDR`/`MASTER_PORT` or `init_method=\"tcp://...\"`",
        "rank 0 opens a TCP store on that port (on every interface)",
        "no port is opened: the group meets through the world's private store",
        "two notebooks running the same tutorial (port 12355, 29500) would meet or collide; "
        "a port on every interface lets anyone on the network in"),
    Intended(
        "said", [], r're:\["nbdist: init_process_group [^"]*"\]',
        "the first `init_process_group` of a world",
        "prints nothing",
        "rank 0 prints one line: `nbdist: init_process_group ...` (no port is opened, or the "
        "world's own group is used)",
        "so that a user who reads `MASTER_PORT` in the code knows why nothing listens there"),
    Intended(
        "MASTER_ADDR set", True, False,
        "`MASTER_ADDR` in each rank's environment",
        "set by `torchrun`",
        "not set",
        "a world's groups need no address; code that reads it sets its own, as the tutorials' "
        "`setup()` does"),
    Intended(
        "MASTER_PORT set", True, False,
        "`MASTER_PORT` in each rank's environment",
        "set by `torchrun`",
        "not set",
        "as `MASTER_ADDR`: no port is needed"),
    Intended(
        "said", [], r're:\["nbdist: rank 0 \([^)]*\) and the other ranks were interrupted: '
                    r'rank \d+ \([^)]*\) failed first"\]',
        "a rank raises while the others wait (in a rendezvous or a collective)",
        "torchrun stops the others and prints its failure summary",
        "the others are interrupted at once; rank 0 prints one line naming the rank that "
        "failed first",
        "a notebook has no launcher to print the summary: the cell shows the first failure"),
]


def intended(key: str, script: Any, world: Any) -> Intended | None:
    """The entry that makes this difference intended, or None."""
    for entry in INTENDED:
        if entry.key == key and entry.matches(script, world):
            return entry
    if isinstance(world, list) and len(world) > 1:  # lines: each one an intended difference
        entries = [intended(key, script, [line]) for line in world]
        if all(entries):
            return entries[0]
    return None
