"""Ranks written compactly (``nbdist.rank_sets``) and what reads them at 256 ranks: a world's
start line and the errors of many ranks (``nbdist.errors``), pure, on generated data."""

from __future__ import annotations

import pytest

from nbdist.cluster.cells import _names as _running, _spread
from nbdist.cluster.core import _fresh
from nbdist.cluster.world import _names
from nbdist.errors import DistCellError, RankFailure, failure_groups, ranks_named
from nbdist.rank_sets import SMALL, grouped, labels, named, numbers, rank_set, spans


@pytest.mark.parametrize("names, text", [
    ([f"worker{r}" for r in range(1, 13)], "worker1-12"),
    (["worker1", "worker2", "worker3", "worker4", "worker7"], "worker1-4,7"),
    (["worker1", "worker2"], "worker1,2"),  # a pair stays a pair
    (["worker3"], "worker3"),
    (["ps", "trainer2", "trainer3", "trainer4"], "ps,trainer2-4"),
    (["obs1", "obs2", "obs3", "learner4", "obs5"], "obs1-3,5,learner4"),
    (["ps", "agent"], "ps,agent"),
    (["node01", "node02"], "node01,2"),  # a leading zero stays in the stem
    (["w10", "w11", "w12", "w9"], "w9-12"),
])
def test_rank_sets_are_written_compactly(names, text):
    assert rank_set(names) == text


def test_spans_and_named_pairs():
    assert spans([1, 2, 3, 5, 7, 8]) == "1-3,5,7,8"
    assert spans([8, 7, 7]) == "7,8" and spans([]) == ""
    assert named([(2, "obs2")]) == "rank 2 (obs2)"
    assert named([(5, "obs5"), (1, "obs1"), (2, "obs2"), (3, "obs3")]) == \
        "ranks 1-3,5 (obs1-3,5)"


def test_small_sets_are_listed_one_by_one_as_before_and_big_ones_compactly():
    assert numbers([4, 1, 3]) == "1, 3, 4" and numbers(range(1, 256)) == "1-255"
    assert labels([(1, "w1"), (3, "w3")]) == "rank 1 (w1), rank 3 (w3)"
    assert labels((r, f"w{r}") for r in range(1, 256)) == "255 ranks 1-255 (w1-255)"
    assert _fresh([(2, "killed by SIGKILL"), (5, "new")]) == "2 (killed by SIGKILL), 5 (new)"
    grown = [(2, "killed by SIGKILL"), *((r, "new") for r in range(5, 256))]
    assert _fresh(grown) == "2 (killed by SIGKILL), 5-255 (new)"


def test_a_cells_status_lines_of_255_ranks_are_one_short_line():
    names = [f"worker{r}" for r in range(1, 256)]
    assert _running(names[:3]) == "worker1, worker2, worker3" and _running(names) == "worker1-255"
    took = {n: 0.1 + (0.3 if n == "worker17" else 0.0) for n in names if n != "worker9"}
    assert _spread(took, ["worker9"]) == \
        "worker1-8,10-255 in 0.1-0.4s (slowest worker17), worker9 ended"


def test_grouped_keeps_the_order_each_key_first_came():
    assert grouped([3, 1, 4, 1, 5, 9, 2, 6], lambda n: n % 2) == \
        [(1, [3, 1, 1, 5, 9]), (0, [4, 2, 6])]


def test_the_start_line_lists_a_small_world_and_writes_a_big_one_compactly():
    small = ["agent", *(f"obs{r}" for r in range(1, SMALL + 1))]  # %dist_start 16
    assert _names(small).startswith("0=agent, 1=obs1, 2=obs2") and f"{SMALL}=obs" in _names(small)
    assert _names([*small, "obs17"]) == "ranks 0-17: agent,obs1-17"
    big = ["agent", *(f"worker{r}" for r in range(1, 256))]
    assert _names(big) == "ranks 0-255: agent,worker1-255"
    odd = [*big[:100], "ps", *big[101:]]  # rank 100 has a name of its own
    assert _names(odd) == "ranks 0-255: agent,worker1-99,101-255,ps"


def _tb(line: int, message: str = "division by zero") -> str:
    return ('Traceback (most recent call last):\n'
            f'  File "<dist-cell-3>", line {line}, in <module>\n    1 / 0\n'
            f'ZeroDivisionError: {message}\n')


def _failures() -> list[RankFailure]:
    """255 workers: rank 17 fails elsewhere, rank 40 with another message, the rest alike."""
    out = []
    for r in range(1, 256):
        line, message = (7, "division by zero") if r == 17 else (2, "division by zero")
        if r == 40:
            message = "float division by zero"
        out.append(RankFailure(r, f"worker{r}", "ZeroDivisionError", message,
                               _tb(line, message)))
    return out


def test_failures_of_many_ranks_show_one_block_per_kind():
    failures = _failures()
    groups = failure_groups(failures)
    assert [[f.rank for f in g][:3] for g in groups] == [[1, 2, 3], [17], [40]]
    assert len(groups[0]) == 253
    err = DistCellError(failures, f"the cell failed on {ranks_named(failures)}: ")
    assert str(err) == (
        "the cell failed on 255 ranks 1-255 (worker1-255): "
        "[worker1-16,18-39,41-255] ZeroDivisionError: division by zero; "
        "[worker17] ZeroDivisionError: division by zero; "
        "[worker40] ZeroDivisionError: float division by zero")
    shown = err._render_traceback_()
    heads = [line for line in shown if line.startswith("---")]
    assert heads == ["--- ranks 1-16,18-39,41-255 (worker1-16,18-39,41-255) ---",
                     "--- rank 17 (worker17) ---", "--- rank 40 (worker40) ---"]
    assert sum(line.startswith("Traceback") for line in shown) == 3
    assert len(shown) < 20


def test_a_few_failures_keep_their_names_one_by_one():
    two = [RankFailure(r, f"w{r}", "ValueError", f"rank {r} says no",
                       _tb(2, f"rank {r} says no")) for r in (1, 3)]
    assert ranks_named(two) == "ranks 1 (w1), 3 (w3)"
    assert ranks_named(two[:1]) == "rank 1 (w1)"
    assert len(failure_groups(two)) == 2  # their messages differ: two blocks
    assert [line for line in DistCellError(two)._render_traceback_() if "---" in line] == \
        ["--- rank 1 (w1) ---", "--- rank 3 (w3) ---"]
