"""A test's outcome over its ranks, read from the files ``runner.run_one`` writes, and the
comparison of two sides' outcomes.

An outcome is ``{"outcome": "pass" | "skip" | "fail" | "hang", "errors": ["r1 AssertionError",
...], "detail": text}``; two sides agree when outcome and errors are the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kernel_helpers import kill_tree

__all__ = ["agree", "collect", "hang", "key", "kill_tree", "merge"]  # kill_tree: re-exported


def merge(per_rank: dict[int, dict]) -> dict:
    """One outcome from each rank's: a failure on any rank fails the test, as under torch's
    launcher; else a skip on any rank skips it."""
    fails = {r: o for r, o in per_rank.items() if o["outcome"] == "fail"}
    if fails:
        return {"outcome": "fail", "errors": sorted(f"r{r} {o['error']}" for r, o in fails.items()),
                "detail": "\n".join(f"[rank {r}] {o.get('detail', '')}"
                                    for r, o in sorted(fails.items()))[-4000:]}
    skips = [o for o in per_rank.values() if o["outcome"] == "skip"]
    if skips:
        return {"outcome": "skip", "errors": [], "detail": skips[0].get("detail", "")}
    return {"outcome": "pass", "errors": [], "detail": ""}


def _read(out: Path, test, n: int) -> dict[int, dict]:
    found = {}
    for rank in range(n):
        path = out / f"{test.cls}.{test.name}.{rank}.json"
        try:
            found[rank] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def collect(out: Path, test, n: int, merge_: Callable[[dict], dict] = merge) -> dict | None:
    """The test's outcome once every rank wrote its own, else None; ``merge_`` makes it of
    the ranks' (a suite whose launcher judges ranks otherwise passes its own)."""
    found = _read(out, test, n)
    return merge_(found) if len(found) == n else None


def hang(out: Path, test, n: int, after: float, merge_: Callable[[dict], dict] = merge) -> dict:
    """The outcome of a test some ranks never finished."""
    found = _read(out, test, n)
    missing = [r for r in range(n) if r not in found]
    return {"outcome": "hang", "errors": [f"r{r} unfinished" for r in missing],
            "detail": f"ranks {missing} had not finished after {after:g}s; the others: "
                      + json.dumps(merge_(found) if found else None)[:2000]}


def key(outcome: dict) -> tuple:
    """What two sides must share: how the test ended and what was raised (not on which rank,
    which torch's launcher reports in its own order, and not the interrupts that stop the
    other ranks once one failed)."""
    errors = {e.split(" ", 1)[1] for e in outcome.get("errors", ())}
    return outcome["outcome"], tuple(sorted(errors - {"KeyboardInterrupt", "unfinished"}))


def agree(a: dict, b: dict) -> bool:
    return key(a) == key(b)
