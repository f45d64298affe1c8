"""``%%dist --tabs``: the pure parts (a rank's text, titles, pane HTML, ranks sharing tabs
past ``MAX_TABS``), the live tabs in a real kernel (their widget messages, badges running →
done / failed / dead, output kept out of the flat stream), shared tabs on a real world, and
the flat stream with one line where no widget can show."""

from __future__ import annotations

import time

import pytest
from kernel_helpers import Kernel

from nbdist.display.panes import (
    MAX_TABS,
    RankText,
    group_title,
    render_pane,
    tab_groups,
    tab_title,
)

VIEW = "application/vnd.jupyter.widget-view+json"


# -- pure -------------------------------------------------------------------------------------
def test_rank_text_takes_any_chunking_and_keeps_a_progress_bar_on_one_line():
    t = RankText(keep=3)
    for chunk in ["he", "llo\nwor", "ld\n", "10%\r", "50%\r", "100%"]:
        t.feed("stdout", chunk)
    t.feed("stderr", "warn\n")
    assert t.view() == [("stdout", "hello"), ("stdout", "world"), ("stderr", "warn"),
                        ("stdout", "100%")]
    t.feed("stdout", "\nlast\n")
    assert t.hidden == 2 and t.view() == [("stderr", "warn"), ("stdout", "100%"),
                                          ("stdout", "last")]


def test_titles_carry_the_state_as_a_badge():
    assert tab_title("obs1", "running") == "obs1 ⏳ running"
    assert tab_title("obs1", "done") == "obs1 ✔ done"
    assert tab_title("obs1", "failed") == "obs1 ✘ failed"
    assert tab_title("obs1", "dead") == "obs1 ☠ dead"
    with pytest.raises(ValueError, match="one of"):
        tab_title("obs1", "sleeping")


def test_256_ranks_share_at_most_max_tabs_and_a_world_across_hosts_gets_a_tab_per_host():
    ranks = list(range(1, 256))
    tabs = tab_groups(ranks)
    assert len(tabs) == MAX_TABS and sum(tabs, []) == ranks
    assert tabs[0] == list(range(1, 17)) and tabs[-1] == list(range(241, 256))
    assert tab_groups([1, 2, 3]) == [[1], [2], [3]]  # a small world: a tab per rank
    hosts = {r: "nodea" if r < 100 else "nodeb" for r in ranks}
    assert tab_groups(ranks, hosts) == [list(range(1, 100)), list(range(100, 256))]
    assert tab_groups(ranks, {r: f"n{r}" for r in ranks}) == tabs  # 255 hosts: runs again


def test_a_shared_tab_counts_its_ranks_states_and_labels_their_lines():
    names = [f"worker{r}" for r in range(1, 17)]
    states = ["done"] * 14 + ["failed", "running"]
    assert group_title(names, states) == "worker1-16: ⏳ 1 running, ✔ 14 done, ✘ 1 failed"
    assert group_title(["obs3"], ["dead"]) == "obs3 ☠ dead"
    with pytest.raises(ValueError, match="one of"):
        group_title(names[:2], ["done", "sleeping"])
    t = RankText()
    t.feed("stdout", "step 1 of", "worker1")
    t.feed("stdout", "step 1 of 2\n", "worker2")
    t.feed("stdout", " 2\n", "worker1")
    assert t.view() == [("stdout", "[worker2] step 1 of 2"), ("stdout", "[worker1] step 1 of 2")]


def test_pane_html_escapes_marks_stderr_and_counts_hidden_lines():
    html = render_pane([("stdout", "<b>x</b>"), ("stderr", "oops")], hidden=1200)
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>" not in html
    assert '<span style="color:#c00">oops</span>' in html
    assert "1,200 earlier lines" in html and "%dist_logs" in html
    assert "no output yet" in render_pane([])


# -- in a real kernel -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def k():
    kernel = Kernel()
    try:
        rep = kernel.execute("%load_ext nbdist\n%dist_start 3", timeout=180)
        assert rep.status == "ok", rep
        yield kernel
        kernel.execute("%dist_stop", timeout=60)
    finally:
        kernel.close()


def _models(msgs: list[dict], name: str) -> list[str]:
    return [m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_open"
            and m["content"]["data"]["state"]["_model_name"] == name]


def _states(msgs: list[dict], comm_id: str, key: str) -> list:
    """Every value ``key`` took on the model ``comm_id``: at its opening, then each update."""
    seen = []
    for m in msgs:
        c = m["content"]
        if c.get("comm_id") != comm_id:
            continue
        state = c["data"].get("state", {})
        if m["msg_type"] in ("comm_open", "comm_msg") and key in state:
            seen.append(state[key])
    return seen


def test_a_tab_per_rank_with_badges_and_live_output(k):
    code = ("%%dist --tabs\nimport os, time\nrank = int(os.environ['NBDIST_RANK'])\n"
            "print(f'hello from {rank}')\ntime.sleep(0.6)\n"
            "print(f'bye from {rank}')\n"
            "if rank == 2:\n    raise ValueError('rank two fails')")
    status, msgs = k.cell(code)
    assert status == "error"
    tabs = _models(msgs, "TabModel")
    assert len(tabs) == 1
    titles = _states(msgs, tabs[0], "titles")
    assert titles[0] == ["worker1 ⏳ running", "worker2 ⏳ running", "worker3 ⏳ running"]
    assert titles[-1] == ["worker1 ✔ done", "worker2 ✘ failed", "worker3 ✔ done"]
    views = [m["content"]["data"][VIEW]["model_id"] for m in msgs
             if m["msg_type"] == "display_data" and VIEW in m["content"]["data"]]
    assert views == tabs
    # each pane shows its rank's lines, updated as they came (hello before bye)
    panes = _models(msgs, "HTMLModel")
    assert len(panes) == 3
    first_pane = _states(msgs, panes[0], "value")
    assert any("hello from 1" in v and "bye" not in v for v in first_pane), first_pane
    assert "bye from 1" in first_pane[-1]
    # printed lines stayed out of the flat stream; the error is reported as always
    streamed = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert "hello from" not in streamed, streamed
    assert any(m["msg_type"] == "error" for m in msgs)
    # and were logged as always
    rep = k.execute("%dist_logs 1 --tail 2")
    assert "[worker1] hello from 1" in rep.stdout and "[worker1] bye from 1" in rep.stdout


def test_the_world_setting_and_a_cell_that_opts_out(k):
    assert k.execute("%dist_restart --keep --tabs", timeout=120).status == "ok"
    status, msgs = k.cell("%%dist --ranks 1\nprint('in a tab')")
    assert status == "ok" and len(_models(msgs, "TabModel")) == 1
    status, msgs = k.cell("%%dist --ranks 1 --no-tabs\nprint('flat')")
    assert status == "ok" and not _models(msgs, "TabModel")
    streamed = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert "[worker1] flat" in streamed
    assert k.execute("%dist_restart --keep --no-tabs", timeout=120).status == "ok"


def test_a_rank_that_dies_shows_dead(kernel):
    assert kernel.execute("%load_ext nbdist\n%dist_start 2", timeout=180).status == "ok"
    t0 = time.monotonic()
    status, msgs = kernel.cell("%%dist --tabs\nimport os, signal, time\n"
                               "if os.environ['NBDIST_RANK'] == '2':\n"
                               "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(0.3)")
    assert status == "error" and time.monotonic() - t0 < 60
    tabs = _models(msgs, "TabModel")
    assert _states(msgs, tabs[0], "titles")[-1] == ["worker1 ✔ done", "worker2 ☠ dead"]
    assert kernel.execute("%dist_stop", timeout=60).status == "ok"


def test_a_real_world_past_the_threshold_shares_tabs(world):
    """Ranks of a real world of 4, with at most 2 tabs: each tab shows its ranks' lines led
    by their names, and its title their states."""
    from nbdist.display.tabs import RankTabs

    c = world(4)
    view = RankTabs({r: c.names[r] for r in range(1, 5)}, lambda r: c.ranks[r].alive, most=2)
    assert view.tab.titles == ("worker1,2: ⏳ 2 running", "worker3,4: ⏳ 2 running")
    with c.router.viewing(view):
        with pytest.raises(Exception, match="rank 4"):
            c.run("import os\nrank = int(os.environ['NBDIST_RANK'])\nprint('hi from', rank)\n"
                  "if rank == 4:\n    raise ValueError('rank 4 fails')", show=False)
        c.flush()
    view.redraw()
    assert view.tab.titles == ("worker1,2: ✔ 2 done", "worker3,4: ✔ 1 done, ✘ 1 failed")
    first, second = (p.value for p in view.panes)
    assert "[worker1] hi from 1" in first and "[worker2] hi from 2" in first
    assert "[worker3] hi from 3" in second and "worker1" not in second


# -- where no widget can show ------------------------------------------------------------------
def test_without_a_frontend_the_flat_stream_and_one_line(ipython, capsys):
    import nbdist

    ipython.run_line_magic("dist_start", "1 --tabs")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "", "print('plain')")
    out = capsys.readouterr()
    assert "[worker1] plain" in out.out
    assert out.err.count("--tabs needs a Jupyter frontend") == 1
    ipython.run_cell_magic("dist", "--no-tabs", "print('plain')")
    assert "--tabs needs" not in capsys.readouterr().err
    # the world's setting outlives a stop, as every flag not given again does
    ipython.run_line_magic("dist_stop", "")
    ipython.run_line_magic("dist_restart", "")
    assert nbdist.current().tabs is True
    nbdist.current().tabs = False
    ipython.run_line_magic("dist_restart", "--keep")
    assert nbdist.current().tabs is False
