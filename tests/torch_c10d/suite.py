"""torch's c10d tests from a notebook, script form, beside torch's own launcher.

Each test of ``DistributedTest._DistTestBase`` (gloo, CPU, world size 4) runs as written (its
own ``init_process_group`` ... ``destroy_process_group``), one after another in one ``--no-rpc``
world (``world.py``), and under torch's launcher (``launcher.py``: a fresh process per rank per
test). torch's launcher takes about 10 to 40 s a test on 2 cores, so its outcomes are recorded
(``--out``'s ``.json``, written as each test ends) and ``--resume`` runs it only for the tests
the record does not hold yet: the record can be completed over several runs.

``python -m tests.torch_c10d.suite [--sample N] [--seed S] [--only RE] [--sides world,launcher]
[--resume]`` (``make conformance-torch``: the whole pool, both sides, resumed) writes ``--out``'s
``.json`` and ``.md`` (default ``bench/results/torch_c10d_script``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # torch_rpc, kernel_helpers

from torch_rpc.outcome import agree  # noqa: E402
from torch_rpc.suite import _end_on_sigterm  # noqa: E402

from .intended import explained  # noqa: E402
from .launcher import run_launcher  # noqa: E402
from .pool import Test, pool, sample  # noqa: E402
from .world import C10dWorld  # noqa: E402

__all__ = ["RESULTS", "Record", "differences", "run_world", "torch_version"]

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def torch_version() -> str:
    """The installed torch's version, without its local part (``2.15.0``, not ``+cu132``)."""
    return importlib.metadata.version("torch").split("+")[0]


class Record:
    """Both sides' outcomes over runs, on the installed torch: ``world`` and ``launcher``
    (``{test id: outcome}``), ``launcher_s`` (``{test id: seconds}``), ``world_s`` and
    ``world_run`` (the last world run's seconds and what it ran). The file holds one such part
    per torch version (``{"2.15.0": {...}, "2.8.0": {...}}``: CI judges the sample on the
    oldest torch too). Saved after every launcher test, so a stopped run keeps what it found."""

    def __init__(self, path: Path, torch: str | None = None) -> None:
        self.path = path
        self.torch = torch or torch_version()
        every = json.loads(path.read_text()) if path.exists() else {}
        if "launcher" in every:  # one torch's part alone (how the first runs wrote it)
            every = {every.pop("torch", self.torch).split("+")[0]: every}
        self._others = {v: d for v, d in every.items() if v != self.torch}
        saved = every.get(self.torch, {})
        self.world: dict = saved.get("world", {})
        self.launcher: dict = saved.get("launcher", {})
        self.launcher_s: dict = saved.get("launcher_s", {})
        self.world_s: float = saved.get("world_s", 0.0)
        self.world_run: str = saved.get("world_run", "")
        self._lock = threading.Lock()

    def add_launched(self, test_id: str, outcome: dict, seconds: float) -> None:
        with self._lock:
            self.launcher[test_id], self.launcher_s[test_id] = outcome, seconds
            self.save()

    def save(self) -> None:
        data = {**self._others, self.torch: {
            "world": self.world, "world_s": self.world_s, "world_run": self.world_run,
            "launcher": self.launcher, "launcher_s": self.launcher_s}}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)


def differences(tests: list[Test], world: dict, launcher: dict) -> dict:
    """``{test id: (world, launcher, why intended or None)}`` where both ran and disagree."""
    found = {}
    for t in tests:
        w, r = world.get(t.id), launcher.get(t.id)
        if w is not None and r is not None and not agree(w, r):
            found[t.id] = (w, r, explained(t.id, w, r))
    return found


def run_world(tests: list[Test], where: Path) -> tuple[dict, float, list[str]]:
    """(``{test id: outcome}``, seconds, harness incidents) of ``tests`` in one world."""
    side = C10dWorld()
    t0 = time.monotonic()
    try:
        found = side.run(tests, where)
    finally:
        side.close()
    return found, time.monotonic() - t0, side.incidents


def _counts(outcomes: dict, tests: list[Test]) -> dict:
    got = [outcomes[t.id]["outcome"] for t in tests if t.id in outcomes]
    return {k: got.count(k) for k in ("pass", "skip", "fail", "hang")}


def report(rec: Record, everything: list[Test]) -> str:
    """The ``.md``: both sides' counts and times over the pool, and every difference."""
    ran = [t for t in everything if t.id in rec.launcher]
    w, r = _counts(rec.world, everything), _counts(rec.launcher, everything)
    diffs = differences(everything, rec.world, rec.launcher)
    meant = sum(1 for *_, why in diffs.values() if why)
    both = [t for t in ran if t.id in rec.world]
    launched_s = sum(rec.launcher_s.get(t.id, 0.0) for t in ran)
    lines = [
        "# torch's c10d tests from a notebook (script form)", "",
        f"Pool: {len(everything)} CPU tests of torch's `DistributedTest._DistTestBase` (gloo, "
        f"world size 4; torch {rec.torch}). Rerun: `make "
        "conformance-torch` (whole pool, torch's launcher resumed for the tests it has not "
        "recorded) or `python -m tests.torch_c10d.suite --sample N`.",
        "", "| side | tests | pass | skip | fail | hang | seconds | seconds a test |",
        "|---|---|---|---|---|---|---|---|",
        f"| nbdist world ({rec.world_run}) | {sum(w.values())} | {w['pass']} | {w['skip']} | "
        f"{w['fail']} | {w['hang']} | {rec.world_s:.0f} | "
        f"{rec.world_s / max(1, sum(w.values())):.1f} |",
        f"| torch's launcher (recorded over runs) | {len(ran)} | {r['pass']} | {r['skip']} | "
        f"{r['fail']} | {r['hang']} | {launched_s:.0f} | {launched_s / max(1, len(ran)):.1f} |",
        "", f"torch's launcher has covered {len(ran)} of the pool's {len(everything)} tests"
        + ("." if len(ran) == len(everything) else
           f"; the {len(everything) - len(ran)} others are run by the next `--resume`."),
        f"On the {len(both)} tests both sides ran: {len(both) - len(diffs)} the same, "
        f"{meant} differences listed as intended, {len(diffs) - meant} unexplained.",
    ]
    if diffs:
        lines += ["", "## Differences", ""]
        for test_id, (wo, ro, why) in sorted(diffs.items()):
            lines.append(f"- `{test_id}`: world {_short(wo)}, launcher {_short(ro)}"
                         + (f" (intended: {why})" if why else " **unexplained**"))
    return "\n".join(lines) + "\n"


def _short(o: dict) -> str:
    return o["outcome"] + (f" {', '.join(o['errors'])}" if o.get("errors") else "")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _end_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="this many tests (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", metavar="REGEX", help="the tests whose id matches REGEX")
    ap.add_argument("--sides", default="world,launcher")
    ap.add_argument("--resume", action="store_true",
                    help="torch's launcher runs only the tests the record does not hold")
    ap.add_argument("--out", default=str(RESULTS / "torch_c10d_script"))
    ap.add_argument("--report", action="store_true", help="rewrite the .md from the .json")
    args = ap.parse_args(argv)
    everything = pool()
    out = Path(args.out)
    rec = Record(out.with_suffix(".json"))
    tests = sample(everything, args.sample, args.seed) if args.sample else everything
    if args.only:
        tests = [t for t in tests if re.search(args.only, t.id)]
    sides = args.sides.split(",")
    if not args.report:
        launch = [t for t in tests if not (args.resume and t.id in rec.launcher)]
        with tempfile.TemporaryDirectory(prefix="nbdist-torch-c10d-") as tmp:
            ref = None
            if "launcher" in sides and launch:  # beside the world, in a thread: both are
                ref = threading.Thread(  # mostly waiting on their processes
                    target=run_launcher, args=(launch, Path(tmp) / "launcher", rec.add_launched))
                ref.start()
            if "world" in sides:
                found, seconds, incidents = run_world(tests, Path(tmp) / "world")
                for text in incidents:
                    print("harness incident:", text.splitlines()[0], file=sys.stderr)
                with rec._lock:
                    rec.world.update(found)
                    rec.world_s, rec.world_run = seconds, (
                        "whole pool" if tests == everything else f"{len(tests)} tests")
                    rec.save()
            if ref is not None:
                ref.join()
    text = report(rec, everything)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if all(why for *_, why in differences(tests, rec.world,
                                                    rec.launcher).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
