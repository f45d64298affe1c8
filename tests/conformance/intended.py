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
    key: str  # the observation ("re:..." matches its name)
    script: Any  # its value in a script
    world: Any  # its value in a world ("re:..." matches the value's JSON; so for script)
    what: str  # the README row: the behaviour
    in_script: str  # ... what torch does
    in_world: str  # ... what a world does
    why: str

    def matches(self, script: Any, world: Any) -> bool:
        return _matches(self.script, script) and _matches(self.world, world)


def _matches(expected: Any, value: Any, raw: bool = False) -> bool:
    """``value == expected``, or (``expected`` "re:...") its JSON (``raw``: itself) matches."""
    if isinstance(expected, str) and expected.startswith("re:"):
        text = value if raw else json.dumps(value)
        return re.fullmatch(expected[3:], text) is not None
    return value == expected


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
        "said", [], r're:\["nbdist: rank 0 \([^)]*\) and the other ranks were interrupted: '
                    r'rank \d+ \([^)]*\) failed first"\]',
        "a rank raises while the others wait (in a rendezvous or a collective)",
        "torchrun stops the others and prints its failure summary",
        "the others are interrupted at once; rank 0 prints one line naming the rank that "
        "failed first",
        "a notebook has no launcher to print the summary: the cell shows the first failure"),
    Intended(
        "re:after (spawns|the raising spawn)", {"initialized": False, "raised": "ValueError"},
        're:\\{"initialized": true, "rank": 0, "size": \\d+, "backend": "gloo"\\}',
        "the process that called `mp.spawn`, afterwards, in a world with a group "
        "(`--process-group`, `--no-rpc`)",
        "has no process group (it never made one)",
        "the notebook has the world's group, before and after (the spawned function did not "
        "see it)",
        "such a world gives the notebook a group; a spawn neither takes it nor ends it"),
    Intended(
        "after init_device_mesh",
        're:\\{"initialized": true, "rank": \\d+, "size": \\d+, "backend": "undefined"\\}',
        're:\\{"initialized": true, "rank": \\d+, "size": \\d+, "backend": "gloo"\\}',
        "`init_device_mesh(\"cpu\", ...)` in a `--process-group` world",
        "makes the default group with torch's default backend (`get_backend()`: "
        "\"undefined\")",
        "uses the world's group, which is up already (`get_backend()`: \"gloo\")",
        "device_mesh makes a group only where none is up; `--process-group` has one up"),
]


def intended(key: str, script: Any, world: Any) -> Intended | None:
    """The entry that makes this difference intended, or None."""
    for entry in INTENDED:
        if _matches(entry.key, key, raw=True) and entry.matches(script, world):
            return entry
    if isinstance(world, list) and len(world) > 1:  # lines: each one an intended difference
        entries = [intended(key, script, [line]) for line in world]
        if all(entries):
            return entries[0]
    return None
