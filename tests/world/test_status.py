"""``%dist_status``: a row per rank and one for the warm template, as text and as HTML."""

from __future__ import annotations

import os
import re

from conftest import WORLD_KINDS

import nbdist.cluster.core as cl
from nbdist.cluster.session import session
from nbdist.cluster.status import TEMPLATE_RANK, StatusTable, collect_status


def _text_rows(table: StatusTable) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in str(table).splitlines()]


@WORLD_KINDS
def test_dist_status_shows_every_rank_as_text_and_html(ipython, kind):
    ipython.run_line_magic("dist_start", f"2 --name agent --worker-name obs{{rank}} {kind}")
    table = ipython.run_line_magic("dist_status", "")
    rows = _text_rows(table)
    assert rows.pop() == ["world: running"]  # the world's state (issue 45), below the rows
    assert rows[0][:7] == list(StatusTable.COLUMNS)  # then the GPU's, on a GPU machine
    by_name = {r[1]: r for r in rows[1:]}
    assert by_name["agent"][:4] == ["0", "agent", str(os.getpid()), "notebook"]
    c = cl.current()
    for rank, name in ((1, "obs1"), (2, "obs2")):
        assert by_name[name][:4] == [str(rank), name, str(c.ranks[rank].pid), "alive"]
        assert float(by_name[name][5]) > 0  # memory MB
    assert by_name["template"][:4] == ["-", "template", str(session().template.pid),
                                       "warm template"]
    page = table._repr_html_()
    assert page.startswith("<table class='nbdist-status'>") and page.count("<tr") == 5
    for name in ("agent", "obs1", "obs2", "template"):
        assert f"<td>{name}</td>" in page
    assert "color:#b00" not in page  # nobody dead
    assert page.endswith("<p>world: running</p>")
    assert table.alive() == {0: True, 1: True, 2: True}


def test_template_row_shows_the_warm_template(world):
    c = world(1)
    pid = session().template.pid
    table = collect_status(c, template_pid=pid)
    row = table.rows[-1]
    assert row["rank"] == TEMPLATE_RANK and row["name"] == "template" and row["pid"] == pid
    assert row["alive"] and row["state"] == "warm template"
    assert row["mem_mb"] > 1 and row["uptime"] >= 0
    last = _text_rows(table)[-2]  # the last line names the world's state
    assert last[:4] == ["-", "template", str(pid), "warm template"]
    assert len(last) == len(table.columns)
    page = table._repr_html_()
    assert f"<tr><td>-</td><td>template</td><td>{pid}</td><td>warm template</td>" in page
    assert table.alive() == {0: True, 1: True}  # the template is not a rank
    assert TEMPLATE_RANK not in {r["rank"] for r in collect_status(c).rows}  # only when asked


def test_template_row_of_a_gone_template(world):
    import subprocess

    c = world(1)
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    row = collect_status(c, template_pid=proc.pid).rows[-1]
    assert row["state"] == "gone" and not row["alive"] and row["mem_mb"] is None
    page = collect_status(c, template_pid=proc.pid)._repr_html_()
    assert '<tr style="color:#b00"><td>-</td><td>template</td>' in page


def test_a_world_past_the_threshold_groups_alike_ranks_and_names_the_dead_first(world):
    """Issue 52: with the threshold lowered to 2 workers, a real world of 4 shows its alike
    workers on one line, and a killed one on a line of its own, before them. (A worker busy
    at the moment of sampling stands out on a line of its own: the test allows for it.)"""
    import signal

    from conftest import wait_until

    from nbdist.rank_sets import spans

    def lines() -> list[list[str]]:
        table = collect_status(c)
        table.small = 2
        rows = _text_rows(table)
        assert rows[0][:3] == ["ranks", "names", "n"] and rows[-1] == ["world: running"]
        assert rows[1][:5] == ["0", "worker0", "1", str(os.getpid()), "notebook"]
        return rows[2:-1]

    c = world(4)
    alive = lines()
    assert all(r[4].startswith("alive") for r in alive)
    assert spans(int(n) for r in alive for n in spans_of(r[0])) == "1-4"
    assert len(alive) < 4 or alive[-1][:3] == ["1-4", "worker1-4", "4"]
    os.kill(c.ranks[3].pid, signal.SIGKILL)
    wait_until(lambda: not collect_status(c).alive()[3], 10, "rank 3 seen dead")
    after = lines()
    assert after[0][:3] == ["3", "worker3", "1"] and "killed by SIGKILL" in after[0][4]
    assert spans(int(n) for r in after[1:] for n in spans_of(r[0])) == "1,2,4"


def spans_of(text: str) -> list[int]:
    """``1,2,4`` or ``1-4`` -> the numbers."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out
