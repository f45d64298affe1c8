"""torch's RPC tests from a notebook, both forms, each beside its reference.

- world form: bodies in an nbdist RPC world vs. the same bodies in plain processes that keep
  RPC up (``control``); tests that start RPC themselves, or whose meaning is a rank's process
  ending, have no body form (``pool.Test.body``).
- script form: tests as written in a ``--no-rpc`` world vs. torch's own launcher.

``python -m tests.torch_rpc.suite [--sample N] [--seed S] [--forms world,script]`` (``make
conformance-torch`` runs the whole pool, one form at a time) writes ``--out``'s ``.md`` and
``.json`` (default ``bench/results/torch_rpc``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # kernel_helpers

from .control import run_control  # noqa: E402
from .intended import explained  # noqa: E402
from .launcher import run_launcher  # noqa: E402
from .outcome import agree  # noqa: E402
from .pool import Test, pool, sample  # noqa: E402
from .world import WorldSide  # noqa: E402

__all__ = ["Form", "run_form"]

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@dataclass
class Form:
    """One form's runs: ``{test id: outcome}`` on each side, and the seconds each took."""

    name: str
    tests: list[Test]
    world: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    world_s: float = 0.0
    reference_s: float = 0.0
    incidents: list = field(default_factory=list)  # the world's harness cells that failed

    def differences(self) -> dict[str, tuple[dict, dict, str | None]]:
        """``{test id: (world, reference, why intended or None)}`` where they disagree."""
        found = {}
        for t in self.tests:
            w, r = self.world.get(t.id), self.reference.get(t.id)
            if w is None or r is None or not agree(w, r):
                found[t.id] = (w, r, explained(self.name, t.id, w, r))
        return found


def run_form(name: str, tests: list[Test], where: Path) -> Form:
    """Run ``tests`` in the ``name`` form ("world" or "script") and in its reference, side by
    side (the reference in a thread: both are mostly waiting on their processes)."""
    if name == "world":
        tests = [t for t in tests if t.body]
    tests = sorted(tests, key=lambda t: t.world_size)  # one world per size, in pool order
    form = Form(name, tests)
    side = WorldSide("body" if name == "world" else "script")
    with ThreadPoolExecutor(max_workers=1) as pool_:
        ref = pool_.submit(_reference, name, tests, where / "reference")
        t0 = time.monotonic()
        try:
            form.world = side.run(tests, where / "world")
        finally:
            form.incidents = side.incidents
            side.close()
        form.world_s = time.monotonic() - t0
        form.reference, form.reference_s = ref.result()
    return form


def _reference(name: str, tests: list[Test], where: Path) -> tuple[dict, float]:
    if name == "script":
        return run_launcher(tests, where)
    t0 = time.monotonic()
    found: dict = {}
    for n in sorted({t.world_size for t in tests}):  # one control per world size, in order
        found.update(run_control([t for t in tests if t.world_size == n], n, where / f"n{n}"))
    return found, time.monotonic() - t0


def _report(forms: list[Form], pooled: int, label: str) -> str:
    lines = [f"# torch's RPC tests from a notebook ({label})", "",
             f"Pool: {pooled} CPU tests of torch's TensorPipe suites. Rerun: `make "
             "conformance-torch` (whole pool) or `python -m tests.torch_rpc.suite --sample N`.",
             "", "| form | tests | pass | skip | fail | hang | same as reference | intended "
             "| unexplained | world s | reference s |", "|---" * 11 + "|"]
    for f in forms:
        counts = {k: sum(1 for o in f.world.values() if o["outcome"] == k)
                  for k in ("pass", "skip", "fail", "hang")}
        diffs = f.differences()
        meant = sum(1 for *_, why in diffs.values() if why)
        lines.append(f"| {f.name} | {len(f.tests)} | {counts['pass']} | {counts['skip']} | "
                     f"{counts['fail']} | {counts['hang']} | {len(f.tests) - len(diffs)} | "
                     f"{meant} | {len(diffs) - meant} | {f.world_s:.0f} | {f.reference_s:.0f} |")
    for f in forms:
        if f.incidents:
            lines += ["", f"## {f.name} form: harness cells that failed", ""]
            lines += [f"- {text.splitlines()[0]}" for text in f.incidents]
        diffs = f.differences()
        if diffs:
            lines += ["", f"## {f.name} form: differences", ""]
            for test_id, (w, r, why) in sorted(diffs.items()):
                lines.append(f"- `{test_id}`: world {_short(w)}, reference {_short(r)}"
                             + (f" (intended: {why})" if why else " **unexplained**"))
    return "\n".join(lines) + "\n"


def _short(o: dict | None) -> str:
    if o is None:
        return "not run"
    return o["outcome"] + (f" {', '.join(o['errors'])}" if o.get("errors") else "")


def _end_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a ``timeout``, a job's end): kill every process this run started (kernels,
    torch's launchers, plain ranks), whose ``finally`` would not run, then exit."""
    import psutil

    for p in psutil.Process().children(recursive=True):
        try:
            p.kill()
        except psutil.Error:
            pass
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _end_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="this many tests (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--forms", default="world,script")
    ap.add_argument("--out", default=str(RESULTS / "torch_rpc"))
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep every rank's records")
    ap.add_argument("--only", metavar="REGEX", help="the tests whose id matches REGEX")
    ap.add_argument("--report", action="store_true",
                    help="rewrite --out's .md from its .json with today's intended list (no run)")
    ap.add_argument("--shard", metavar="K/N", help="every Nth test from the Kth (1-based): "
                    "the pool in N runs, e.g. on N machines; --merge joins their results")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="join the .json of shard runs into --out (no run)")
    args = ap.parse_args(argv)
    everything = pool()
    if args.report:
        return _rewrite(Path(args.out), everything)
    if args.merge:
        return _merge([Path(p) for p in args.merge], Path(args.out), everything)
    tests = sample(everything, args.sample, args.seed) if args.sample else everything
    if args.only:
        tests = [t for t in tests if re.search(args.only, t.id)]
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        if not 1 <= k <= n:
            ap.error(f"--shard {args.shard}: K must be 1..N")
        tests = tests[k - 1::n]
    with tempfile.TemporaryDirectory(prefix="nbdist-torch-rpc-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        forms = [run_form(name, tests, base / name) for name in args.forms.split(",")]
    label = (f"sample of {len(tests)}, seed {args.seed}" if args.sample
             else f"{len(tests)} matching {args.only!r}" if args.only else "whole pool")
    if args.shard:
        label += f", shard {args.shard}"
    text = _report(forms, len(everything), label)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps(
        {f.name: {"world": f.world, "reference": f.reference, "world_s": f.world_s,
                  "reference_s": f.reference_s, "incidents": f.incidents} for f in forms},
        indent=1))
    print(text)
    return 0 if all(why for f in forms for *_, why in f.differences().values()) else 1


def _forms(saved: dict, by_id: dict[str, Test]) -> list[Form]:
    return [Form(name, [by_id[i] for i in d["world"] if i in by_id], d["world"], d["reference"],
                 d["world_s"], d["reference_s"], d.get("incidents", []))
            for name, d in saved.items()]


def _merge(parts: list[Path], out: Path, everything: list[Test]) -> int:
    """Shard runs' results as one run's (times added: the shards ran one after another, or
    side by side on as many machines)."""
    joined: dict = {}
    for part in parts:
        for name, d in json.loads(part.read_text()).items():
            into = joined.setdefault(name, {"world": {}, "reference": {}, "world_s": 0.0,
                                            "reference_s": 0.0, "incidents": []})
            for key in ("world", "reference"):
                into[key].update(d[key])
            for key in ("world_s", "reference_s"):
                into[key] += d[key]
            into["incidents"] += d.get("incidents", [])
    forms = _forms(joined, {t.id: t for t in everything})
    label = f"{sum(len(f.tests) for f in forms)} tests from {len(parts)} shards"
    out.with_suffix(".json").write_text(json.dumps(joined, indent=1))
    text = _report(forms, len(everything), label)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if all(why for f in forms for *_, why in f.differences().values()) else 1


def _rewrite(out: Path, everything: list[Test]) -> int:
    """The report of a saved run, judged by the intended list as it is now."""
    saved = json.loads(out.with_suffix(".json").read_text())
    forms = _forms(saved, {t.id: t for t in everything})
    head = out.with_suffix(".md").read_text().splitlines()[0]
    label = head.split("(", 1)[1].rstrip(")") if "(" in head else "saved run"
    out.with_suffix(".md").write_text(_report(forms, len(everything), label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
