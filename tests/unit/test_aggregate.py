"""The merging rule for equal lines of many ranks (``output.aggregate``), pure: times are
passed in, nothing is started; and the router's use of it, with its writes captured."""

from __future__ import annotations

import random

import pytest

from nbdist.output.aggregate import Aggregator
from nbdist.output.router import Router

W = 0.1
ALL = frozenset(range(1, 13))


def _shown(held: list) -> list[tuple]:
    return [(h.stream, tuple(sorted(h.ranks)), h.text) for h in held]


def _per_rank(shown: list[tuple]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for _, ranks, text in shown:
        for r in ranks:
            out.setdefault(r, []).append(text)
    return out


# -- the rule -----------------------------------------------------------------------------------
def test_equal_lines_within_the_window_show_once_when_the_window_ends():
    a = Aggregator(W)
    assert a.add(1, "stdout", "epoch 3 done", 0.00) == []
    assert a.add(2, "stdout", "epoch 3 done", 0.03) == []
    assert a.add(3, "stdout", "epoch 3 done", 0.06) == []
    assert a.due(0.09) == []
    assert a.next_due() == pytest.approx(0.10)
    assert _shown(a.due(0.10)) == [("stdout", (1, 2, 3), "epoch 3 done")]
    assert len(a) == 0 and a.next_due() is None


def test_a_line_every_expected_rank_printed_shows_at_once():
    a = Aggregator(W)
    for r in range(1, 12):
        assert a.add(r, "stdout", "ready", 0.001 * r, ALL) == []
    assert _shown(a.add(12, "stdout", "ready", 0.02, ALL)) == [("stdout", tuple(ALL), "ready")]


def test_a_rank_alone_is_not_held():
    a = Aggregator(W)
    assert _shown(a.add(3, "stdout", "x", 0.0, frozenset({3}))) == [("stdout", (3,), "x")]


def test_a_line_after_the_window_starts_a_new_group():
    a = Aggregator(W)
    a.add(1, "stdout", "tick", 0.0)
    assert _shown(a.add(2, "stdout", "tick", 0.15)) == [("stdout", (1,), "tick")]
    assert _shown(a.due(0.25)) == [("stdout", (2,), "tick")]


def test_different_streams_are_not_merged():
    a = Aggregator(W)
    a.add(1, "stdout", "x", 0.0)
    a.add(2, "stderr", "x", 0.0)
    assert sorted(_shown(a.due(0.1))) == [("stderr", (2,), "x"), ("stdout", (1,), "x")]


def test_a_rank_printing_the_same_line_twice_shows_it_twice():
    a = Aggregator(W)
    a.add(1, "stdout", "x", 0.0)
    a.add(1, "stdout", "x", 0.01)
    a.add(2, "stdout", "x", 0.02)
    a.add(2, "stdout", "x", 0.03)
    assert _shown(a.due(1.0)) == [("stdout", (1, 2), "x"), ("stdout", (1, 2), "x")]


def test_order_within_a_rank_is_kept_when_ranks_print_in_different_orders():
    a = Aggregator(W)
    a.add(1, "stdout", "A", 0.00)
    a.add(1, "stdout", "B", 0.01)
    a.add(2, "stdout", "B", 0.02)  # rank 2 prints B first ...
    a.add(2, "stdout", "A", 0.03)  # ... so its A cannot join rank 1's A, shown before B
    shown = _shown(a.due(1.0))
    assert shown == [("stdout", (1,), "A"), ("stdout", (1, 2), "B"), ("stdout", (2,), "A")]
    assert _per_rank(shown) == {1: ["A", "B"], 2: ["B", "A"]}


def test_a_complete_line_waits_for_its_ranks_earlier_lines():
    a = Aggregator(W)
    expected = frozenset({1, 2})
    assert a.add(1, "stdout", "only mine", 0.0, expected) == []
    assert a.add(1, "stdout", "both", 0.01, expected) == []
    assert a.add(2, "stdout", "both", 0.02, expected) == []  # complete, but rank 1's first
    shown = _shown(a.due(0.1))  # goes when "only mine" is due, then "both" at once
    assert shown == [("stdout", (1,), "only mine"), ("stdout", (1, 2), "both")]


def test_a_complete_line_of_other_ranks_is_not_held_behind_an_unrelated_one():
    a = Aggregator(W)
    a.add(3, "stdout", "rank 3 alone", 0.0, frozenset({1, 2}))
    a.add(1, "stdout", "both", 0.01, frozenset({1, 2}))
    assert _shown(a.add(2, "stdout", "both", 0.02, frozenset({1, 2}))) == \
        [("stdout", (1, 2), "both")]
    assert _shown(a.due(0.1)) == [("stdout", (3,), "rank 3 alone")]


def test_partial_merges_interleaved_with_unique_lines():
    a = Aggregator(W)
    t = 0.0
    for r in range(1, 5):
        t += 0.001
        a.add(r, "stdout", "epoch 1", t)
        a.add(r, "stdout", f"loss {r / 10}", t)
    shown = _shown(a.add(5, "stdout", "epoch 1", t + 0.2))  # late: the others went first
    shown += _shown(a.due(1.0))
    assert shown[-1] == ("stdout", (5,), "epoch 1")
    assert shown[0] == ("stdout", (1, 2, 3, 4), "epoch 1")
    assert ("stdout", (5,), "epoch 1") in shown
    assert sorted(s for s in shown if s[2].startswith("loss")) == \
        [("stdout", (r,), f"loss {r / 10}") for r in range(1, 5)]
    per = _per_rank(shown)
    for r in range(1, 5):
        assert per[r] == ["epoch 1", f"loss {r / 10}"]


def test_release_shows_a_ranks_lines_and_what_must_come_before():
    a = Aggregator(W)
    a.add(1, "stdout", "first", 0.0)
    a.add(2, "stdout", "other", 0.001)
    a.add(2, "stdout", "first", 0.002)  # after its "other": cannot join rank 1's "first"
    shown = _shown(a.release([2], 0.003))
    assert shown == [("stdout", (1,), "first"), ("stdout", (2,), "other"),
                     ("stdout", (2,), "first")]
    assert len(a) == 0


def test_release_leaves_later_lines_of_other_ranks_held():
    a = Aggregator(W)
    a.add(1, "stdout", "x", 0.0)
    a.add(2, "stdout", "y", 0.01)
    assert _shown(a.release([1], 0.02)) == [("stdout", (1,), "x")]
    assert len(a) == 1
    assert _shown(a.release(None)) == [("stdout", (2,), "y")]


def test_release_lets_a_complete_line_it_was_blocking_go():
    a = Aggregator(W)
    both = frozenset({1, 2})
    a.add(1, "stdout", "a", 0.0, both)
    a.add(3, "stdout", "c", 0.001, both)  # not its business
    a.add(1, "stdout", "b", 0.002, both)
    a.add(2, "stdout", "b", 0.003, both)  # complete, blocked by rank 1's "a"
    shown = _shown(a.release([1], 0.004))
    assert shown == [("stdout", (1,), "a"), ("stdout", (1, 2), "b")]
    assert _shown(a.due(1.0)) == [("stdout", (3,), "c")]  # held on, as nothing needs it


def test_random_interleavings_keep_every_line_once_and_each_ranks_order():
    rng = random.Random(7)
    texts = ["epoch done", "saving", "loss 0.5", "x", "y"]
    for trial in range(200):
        a = Aggregator(W)
        printed: dict[int, list[tuple[str, str]]] = {}
        shown: list[tuple] = []
        t = 0.0
        expected = frozenset(range(1, 6)) if trial % 2 else None
        for _ in range(rng.randint(1, 60)):
            t += rng.choice([0.0, 0.001, 0.02, 0.07, 0.2])
            r = rng.randint(1, 5)
            stream = rng.choice(["stdout", "stdout", "stderr"])
            text = rng.choice(texts)
            printed.setdefault(r, []).append((stream, text))
            shown += _shown(a.add(r, stream, text, t, expected))
            if rng.random() < 0.1:
                shown += _shown(a.release([rng.randint(1, 5)], t))
            if rng.random() < 0.2:
                shown += _shown(a.due(t))
        shown += _shown(a.due(t + 1.0))
        assert len(a) == 0
        got: dict[int, list[tuple[str, str]]] = {}
        for stream, ranks, text in shown:
            assert list(ranks) == sorted(set(ranks))  # a rank at most once per line
            for r in ranks:
                got.setdefault(r, []).append((stream, text))
        assert got == printed


# -- the router's use of it ---------------------------------------------------------------------
@pytest.fixture
def written(monkeypatch):
    out: list[tuple[str, str]] = []
    monkeypatch.setattr(Router, "write", staticmethod(lambda stream, text: out.append(
        (stream, text))))
    return out


def _text(written: list) -> str:
    return "".join(t for _, t in written)


def test_router_merges_equal_lines_and_keeps_each_ranks_log(written):
    router = Router(workers=lambda: range(1, 9))
    router.aggregate = True
    for r in range(1, 9):
        router.feed(r, f"worker{r}", "stdout", f"epoch 3 done\nmine {r}\n")
    assert _text(written).splitlines() == ["[worker1-8] epoch 3 done"]  # all 8 printed it
    router.flush()
    lines = _text(written).splitlines()
    assert sorted(lines[1:]) == sorted(f"[worker{r}] mine {r}" for r in range(1, 9))
    for r in range(1, 9):
        assert router.logs(r) == ["epoch 3 done", f"mine {r}"]


def test_router_switched_off_shows_every_rank_at_once(written):
    router = Router(workers=lambda: range(1, 4))
    assert not router.aggregate  # the world turns it on (WorldSpec.aggregates)
    for r in range(1, 4):
        router.feed(r, f"worker{r}", "stdout", "same\n")
    assert _text(written) == "[worker1] same\n[worker2] same\n[worker3] same\n"


def test_router_switch_per_cell_and_held_lines_shown_when_it_turns_off(written):
    router = Router(workers=lambda: range(1, 4))
    router.aggregate = True
    router.feed(1, "worker1", "stdout", "held\n")
    assert written == []
    with router.aggregating(False, [1, 2]):
        assert _text(written) == "[worker1] held\n"  # what was held goes first
        router.feed(1, "worker1", "stdout", "same\n")
        router.feed(2, "worker2", "stdout", "same\n")
        assert _text(written).count("same") == 2
    with router.aggregating(None, [1, 2]):  # the world's setting, on: waits for 1 and 2
        router.feed(1, "worker1", "stdout", "end\n")
        router.feed(2, "worker2", "stdout", "end\n")
        assert _text(written).endswith("[worker1,2] end\n")
        router.feed(2, "worker2", "stdout", "last\n")
    assert _text(written).endswith("[worker2] last\n")  # the cell's end shows what is held


def test_router_result_flush_keeps_lines_held_and_release_shows_them(written):
    router = Router(workers=lambda: range(1, 4))
    router.aggregate = True
    router.feed(1, "worker1", "stdout", "no newline")
    router.flush(1, release=False)  # a Result: the unfinished line becomes a held line
    assert written == []
    router.feed(2, "worker2", "stdout", "no newline\n")
    router.release([1])  # an rpc_sync to rank 1 returned
    assert _text(written) == "[worker1,2] no newline\n"


def test_router_tick_shows_a_line_alone_after_the_window(written):
    import time

    router = Router(workers=lambda: range(1, 4))
    router.aggregate = True
    router.feed(2, "worker2", "stderr", "only me\n")
    due = router.next_due()
    assert due is not None and due - time.monotonic() <= W + 0.01
    router.tick()
    assert written == []
    time.sleep(max(due - time.monotonic(), 0) + 0.005)
    router.tick()
    assert written == [("stderr", "[worker2] only me\n")]


def test_shared_lines_merge_between_each_ranks_own_lines():
    """Each rank's whole cell arrives at once, one rank after another: the shared lines still
    merge, each rank's own lines keep their place between them, oldest first."""
    a = Aggregator(W)
    ranks = frozenset(range(1, 9))
    shown: list = []
    for r in sorted(ranks):
        for text in ("start", f"step 0 of rank {r}", "step 0 done", f"step 1 of rank {r}",
                     "step 1 done", "end"):
            shown += _shown(a.add(r, "stdout", text, 0.001 * r, ranks))
    shown += _shown(a.due(1.0))  # a rank's own line waits out its window: none joins it
    assert [s for s in shown if "done" in s[2] or s[2] in ("start", "end")] == [
        ("stdout", tuple(ranks), t) for t in ("start", "step 0 done", "step 1 done", "end")]
    assert [s[2] for s in shown[1:9]] == [f"step 0 of rank {r}" for r in range(1, 9)]


def test_many_lines_placed_between_two_others_keep_their_order():
    a = Aggregator(W)
    a.add(1, "stdout", "head", 0.0)
    a.add(1, "stdout", "tail", 0.0)
    a.add(2, "stdout", "head", 0.0)
    for k in range(200):  # each goes between rank 2's last line and rank 1's "tail"
        a.add(2, "stdout", f"line {k}", 0.0)
    a.add(2, "stdout", "tail", 0.0)
    shown = _shown(a.due(1.0))
    assert _per_rank(shown)[2] == ["head", *[f"line {k}" for k in range(200)], "tail"]
    assert shown[-1] == ("stdout", (1, 2), "tail")


def test_a_flood_is_not_held_beyond_a_bound():
    a = Aggregator(W)
    shown = []
    for k in range(Aggregator.MAX_HELD + 500):
        shown += a.add(1 + k % 3, "stdout", f"line {k}", 0.0)
    assert len(a) == Aggregator.MAX_HELD
    assert len(shown) == 500


# -- the switch ---------------------------------------------------------------------------------
def test_the_worlds_setting_auto_from_eight_workers_env_and_explicit(monkeypatch):
    from nbdist.spec import AGGREGATE_FROM, WorldSpec

    monkeypatch.delenv("NBDIST_AGGREGATE", raising=False)
    assert AGGREGATE_FROM == 8
    assert not WorldSpec(7).aggregates() and WorldSpec(8).aggregates()
    assert WorldSpec(0, hosts=(("a", 4), ("b", 4)), iface="lo").aggregates()  # ranks anywhere
    assert WorldSpec(2, aggregate=True).aggregates()
    assert not WorldSpec(12, aggregate=False).aggregates()
    monkeypatch.setenv("NBDIST_AGGREGATE", "1")
    assert WorldSpec(2).aggregates() and not WorldSpec(2, aggregate=False).aggregates()
    monkeypatch.setenv("NBDIST_AGGREGATE", "0")
    assert not WorldSpec(12).aggregates()
    with pytest.raises(ValueError, match="--aggregate on|off|auto"):
        WorldSpec(2, aggregate="yes").validate()


def test_router_shows_a_flood_as_printed_after_what_the_rank_had_held(written):
    router = Router(workers=lambda: range(1, 4))
    router.aggregate = True
    router.feed(1, "worker1", "stdout", "before\n")
    assert written == []
    router.feed(1, "worker1", "stdout", "".join(f"line {i}\n" for i in range(1500)))
    lines = _text(written).splitlines()
    assert lines == ["[worker1] before", *[f"[worker1] line {i}" for i in range(1500)]]
    router.feed(2, "worker2", "stdout", "calm\n")  # another rank is merged as usual
    assert len(_text(written).splitlines()) == 1501


def test_the_start_line_says_so_when_auto_turned_it_on(monkeypatch):
    from nbdist.cluster.world import _merge_note
    from nbdist.spec import WorldSpec

    monkeypatch.delenv("NBDIST_AGGREGATE", raising=False)
    assert "--aggregate off" in _merge_note(WorldSpec(8))
    assert _merge_note(WorldSpec(4)) == ""
    assert _merge_note(WorldSpec(8, aggregate=True)) == ""  # asked for: nothing to explain
