"""``%dist_status`` of a big world (``cluster.status_groups``), pure, on generated rows of
256 ranks on two hosts: alike ranks share a line, the odd ones come first, one by one,
the not alive before the alive that stand out."""

from __future__ import annotations

import re

from nbdist.cluster.status import TEMPLATE_RANK, StatusTable
from nbdist.cluster.status_groups import group_rows, outliers


def _row(rank, host=None, state="alive", cpu=1.0, mem=400.0):
    alive = state in ("alive", "notebook", "warm template")
    return {"rank": rank, "name": "agent" if rank == 0 else
            "template" if rank == TEMPLATE_RANK else f"worker{rank}",
            "pid": 1000 + (rank if isinstance(rank, int) else 999), "alive": alive,
            "state": state, "cpu": cpu if alive else None, "mem_mb": mem if alive else None,
            "uptime": 12.0 if alive else None, "exit_code": None, "host": host}


def _world() -> list[dict]:
    """Ranks 1-127 local, 128-255 on nodeb; 17 died, 40 busy, 200 large, 201 starting."""
    rows = [_row(0, state="notebook", cpu=3.0, mem=900.0)]
    for r in range(1, 256):
        host = None if r < 128 else "nodeb"
        state = {17: "killed by SIGKILL", 201: "starting"}.get(r, "alive")
        rows.append(_row(r, host, state, cpu=98.0 if r == 40 else 1.0 + r % 2,
                         mem=4100.0 if r == 200 else 400.0 + r % 5))
    return [*rows, _row(TEMPLATE_RANK, state="warm template", cpu=0.0, mem=150.0)]


def _lines(table: StatusTable) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in str(table).splitlines()]


def test_outliers_are_alive_workers_well_above_the_median():
    assert outliers(_world()) == {40: "cpu 98 %", 200: "mem 4100 MB"}
    assert outliers([_row(r, cpu=100.0) for r in range(1, 9)]) == {}  # all busy: none odd


def test_a_big_world_shows_a_line_per_host_and_state_odd_ones_first():
    lines = group_rows(_world())
    assert [(line.ranks, line.state) for line in lines] == [
        ("0", "notebook"), ("17", "killed by SIGKILL"), ("40", "alive, cpu 98 %"),
        ("1-16,18-39,41-127", "alive"),
        ("201", "starting"), ("200", "alive, mem 4100 MB"),  # the not alive first
        ("128-199,202-255", "alive"),
        ("-", "warm template")]
    assert lines[3].names == "worker1-16,18-39,41-127" and len(lines[3].rows) == 125
    assert lines[3].values(lambda r: r["cpu"], ".0f") == "1-2"


def test_status_table_of_256_ranks_fits_a_screen_and_small_worlds_stay_per_rank():
    table = StatusTable(_world(), with_host=True, world="running")
    text = _lines(table)
    assert text[0] == ["ranks", "names", "host", "n", "pid", "state", "cpu %", "mem MB",
                       "uptime s"]
    assert text[4] == ["1-16,18-39,41-127", "worker1-16,18-39,41-127", "local", "125", "-",
                       "alive", "1-2", "400-404", "12.0"]
    assert text[7] == ["128-199,202-255", "worker128-199,202-255", "nodeb", "126", "-",
                       "alive", "1-2", "400-404", "12.0"]
    assert len(text) == 10 and text[-1] == ["world: running"]
    page = table._repr_html_()
    assert page.count("<tr") == 9 and page.count("color:#b00") == 2  # the dead, the starting
    assert table.alive()[17] is False and len(table.alive()) == 256  # rows keep every rank
    small = StatusTable(_world()[:17])
    assert not small.grouped and _lines(small)[0][0] == "rank" and len(_lines(small)) == 18
    assert StatusTable(_world()[:17], small=4).grouped


def test_many_dead_ranks_of_one_state_share_a_line():
    rows = [_row(0, state="notebook")] + [_row(r, state="stopped") for r in range(1, 41)]
    assert [(line.ranks, line.state) for line in group_rows(rows)] == \
        [("0", "notebook"), ("1-40", "stopped")]
