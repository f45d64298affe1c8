"""Issue 53, item 10: torch's own c10d tests (``DistributedTest._DistTestBase``, gloo, CPU,
world size 4) as written, one after another in one ``--no-rpc`` world, end as under torch's
launcher (a fast sample; the whole pool: ``make conformance-torch``).

torch's launcher takes 10 to 60 s a test on 2 cores, so the sample's world outcomes are judged
against its outcomes recorded on the same torch (``bench/results/torch_c10d_script.json``, a
part per torch version), and ``LIVE`` tests
run under torch's launcher beside the world, in the same test. Differences listed in
``intended.py`` are the only ones allowed.
"""

from __future__ import annotations

import threading

import pytest

from .intended import INTENDED
from .launcher import run_launcher
from .pool import pool, sample
from .suite import RESULTS, Record, differences, run_world

pytestmark = [pytest.mark.conformance, pytest.mark.kernel, pytest.mark.timeout(600)]

SEED = 53
SAMPLE = 25  # about 0.7 s a test in the world
# always in the sample: every rank exits with a skip code at once (``skip_if_small_worldsize``:
# an earlier harness let the first rank's exit end its cell, and read it as a failure)
MUST = ("TestDistBackendWithSpawn.test_all_gather_group",)
# run under torch's launcher beside the world: a pass, and that every-rank skip
LIVE = ("TestDistBackendWithSpawn.test_all_reduce_sum",
        "TestDistBackendWithSpawn.test_all_gather_group")


@pytest.fixture(scope="module")
def tests():
    return pool()


def _chosen(tests):
    picked = sample(tests, SAMPLE, SEED)
    return picked + [t for t in tests if t.id in MUST and t not in picked]


def _explain(bad: dict) -> str:
    return "\n\n".join(
        f"{test_id}: world {(w['outcome'], w['errors'])}, launcher {(r['outcome'], r['errors'])}"
        f"\n--- world:\n{w['detail'][-1500:]}\n--- launcher:\n{r['detail'][-1500:]}"
        for test_id, (w, r, _) in bad.items())


def test_the_pool_is_torchs_cpu_suite(tests):
    """114 CPU tests on torch 2.15 (of 285: the others are NCCL's, or need GPUs)."""
    assert len(tests) >= 100
    ids = {t.id for t in tests}
    assert set(MUST) | set(LIVE) <= ids


def test_tests_as_written_in_a_world_end_as_under_torchs_launcher(tests, tmp_path):
    chosen = _chosen(tests)
    recorded = Record(RESULTS / "torch_c10d_script.json").launcher
    missing = [t.name for t in chosen if t.id not in recorded]
    assert not missing, ("not in the launcher's record on this torch: record them with "
                         "`python -m tests.torch_c10d.suite --sides launcher --resume --only "
                         f"'\\.({'|'.join(missing)})$'` (about 15 s a test)")
    live: dict = {}
    beside = threading.Thread(target=lambda: live.update(run_launcher(
        [t for t in tests if t.id in LIVE], tmp_path / "launcher")[0]))
    beside.start()
    try:
        world, _, incidents = run_world(chosen, tmp_path / "world")
    finally:
        beside.join()
    assert not incidents
    assert len(world) == len(chosen)
    assert sorted(live) == sorted(LIVE)
    assert [live[i]["outcome"] for i in LIVE] == ["pass", "skip"]
    for against in (recorded, live):
        bad = {k: v for k, v in differences(chosen, world, against).items() if v[2] is None}
        assert not bad, _explain(bad)


def test_every_intended_difference_says_why():
    assert all(e.why and e.test.startswith("TestDistBackendWithSpawn.") for e in INTENDED)
