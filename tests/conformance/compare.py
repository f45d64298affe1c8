"""Compare the two runs of a case, rank by rank: every difference, intended or not."""

from __future__ import annotations

import json
from typing import Any

from .cases import Case
from .intended import intended
from .observe import Run

__all__ = ["differences"]

_MISSING = "<not observed>"


def differences(case: Case, script: Run, world: Run) -> tuple[list[str], list[str]]:
    """(unintended differences, intended ones), each one line naming the rank and key."""
    bad: list[str] = []
    meant: list[str] = []
    for who in sorted(set(script.ranks) | set(world.ranks)):
        s, w = script.ranks.get(who, {}), world.ranks.get(who, {})
        for key in list(s) + [k for k in w if k not in s]:
            unseen = [] if key in ("printed", "said") else _MISSING  # a rank that printed nothing
            sv, wv = s.get(key, unseen), w.get(key, unseen)
            if sv == wv:
                continue
            line = f"{who} {key!r}: script {_show(sv)}, world {_show(wv)}"
            (meant if intended(key, sv, wv) else bad).append(line)
    if script.failed != world.failed:
        bad.append(f"the run failed: script {script.failed}, world {world.failed}")
    if case.raises is not None:
        sr = sorted(r for r in script.raised if r.endswith(" " + case.raises))
        wr = sorted(r for r in world.raised if r.endswith(" " + case.raises))
        if sr != wr or not sr:
            bad.append(f"raised {case.raises}: script {sr}, world {wr}")
    if world.seconds > case.bound:
        bad.append(f"the world's cell took {world.seconds:.1f}s, more than {case.bound:g}s "
                   f"(the script: {script.seconds:.1f}s)")
    return bad, meant


def _show(value: Any) -> str:
    return value if value is _MISSING else json.dumps(value)
