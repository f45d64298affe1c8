"""Issue 33: every case runs as a script and from a world in a real kernel; what each rank
observes must be the same, but for the differences listed in ``intended.py``.

One module-scoped fixture runs everything once: the scripts two at a time on a thread pool
(each program once, however many world kinds it is a case of) while the world side runs the
cases in order in one kernel (keep-restarts between sizes).
Each test then compares one case's two runs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .cases import CASES
from .compare import differences
from .intended import INTENDED, intended
from .readme import README, block, current
from .script import run_script
from .world import WorldSide

pytestmark = [pytest.mark.conformance, pytest.mark.kernel, pytest.mark.timeout(900)]

# cases that still differ, with why (strict: they fail the suite once they pass); none now
XFAIL: dict[str, str] = {}

# cases that pass in some runs and not in others, with what they show; none now
FLAKY: dict[str, str] = {}


def _selected(session) -> list:
    """The cases whose tests this session runs (``-k`` picks some), in CASES order."""
    chosen = {item.callspec.params["case"].name for item in session.items
              if item.originalname == "test_a_world_observes_what_a_script_does"}
    return [c for c in CASES if c.name in chosen]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``{case name: (script Run or the exception, world Run or the exception)}``."""
    base = tmp_path_factory.mktemp("conformance")
    cases = _selected(request.session) or CASES
    world = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        # a program runs once as a script however many world kinds it is a case of: the
        # script side depends on nothing else (pg_collectives' script is collectives')
        once: dict[tuple, object] = {}
        for c in cases:
            key = (c.style, c.n, c.body)
            if key not in once:
                once[key] = pool.submit(run_script, c, base / c.name / "script")
        scripts = {c.name: once[(c.style, c.n, c.body)] for c in cases}
        side = WorldSide()
        try:
            for c in cases:
                try:
                    world[c.name] = side.run(c, base / c.name / "world")
                except Exception as exc:  # noqa: BLE001 - reported by the case's test
                    world[c.name] = exc
        finally:
            side.close()
        found = {}
        for name, future in scripts.items():
            try:
                found[name] = (future.result(), world[name])
            except Exception as exc:  # noqa: BLE001 - reported by the case's test
                found[name] = (exc, world[name])
    return found


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[case.name])] \
            if case.name in XFAIL else \
            [pytest.mark.xfail(strict=False, reason=FLAKY[case.name])] \
            if case.name in FLAKY else []
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_a_world_observes_what_a_script_does(case, runs):
    script, world = runs[case.name]
    for side, run in (("script", script), ("world", world)):
        if isinstance(run, Exception):
            raise AssertionError(f"the {side} run of {case.name} did not finish") from run
    bad, meant = differences(case, script, world)
    assert not bad, (f"{case.name}: {len(bad)} unintended difference(s):\n  "
                     + "\n  ".join(bad)
                     + f"\n--- script printed:\n{script.text[-3000:]}"
                     + f"\n--- world printed:\n{world.text[-3000:]}")


def test_the_suite_covers_issue_33():
    """At least 30 cases, every row of the issue's table, every kind of world and launcher."""
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
    assert {c.row for c in CASES} >= {"1", "2", "3", "4", "5", "6"}
    assert {c.world for c in CASES} == {"rpc", "pg", "norpc"}
    assert {c.style for c in CASES} == {"torchrun", "spawn"}


def test_every_intended_difference_is_seen(runs):
    """An entry of the table no case shows would be a claim the suite does not check."""
    if len(runs) < len(CASES):
        pytest.skip("only some cases ran (-k)")
    seen = set()
    for script, world in runs.values():
        if isinstance(script, Exception) or isinstance(world, Exception):
            continue
        for who in set(script.ranks) & set(world.ranks):
            for key, value in script.ranks[who].items():
                entry = intended(key, value, world.ranks[who].get(key))
                if entry is not None:
                    seen.add(entry.key)
    assert seen == {e.key for e in INTENDED}


def test_readme_table_is_generated_from_the_suite():
    assert current(README.read_text()) == block(), (
        "the guide's table (docs/guide/paste-tutorials.md) is stale: run "
        "`python -m tests.conformance.readme`")
