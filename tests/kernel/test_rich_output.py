"""Issue 13: workers speak IPython (magics, ``!``, ``?``, display hook) and their rich
outputs (display(), IPython.display objects, ``_repr_html_`` values, matplotlib figures)
arrive in the calling cell as real mime bundles labelled with the rank.

Kernel tests drive a real Jupyter kernel and read every iopub message of a cell, updates
included; the others run in this process's IPython, where bundles show as text.
"""

from __future__ import annotations

import base64

import pytest
from conftest import WORLD_KINDS

from nbdist.control.protocol import ClearOutput, DisplayData, decode, encode
from nbdist.errors import DistCellError
from nbdist.output.rich_output import render_grid

START = "%load_ext nbdist\n%dist_start 2"
RANK = "import os\nr = int(os.environ['NBDIST_RANK'])\n"
PLOT = RANK + "import matplotlib.pyplot as plt\nplt.plot([0, r])\nplt.title(f'rank {r}')\n"


# -- helpers ----------------------------------------------------------------------------------


def _displays(msgs: list[dict], kind: str = "display_data") -> list[dict]:
    return [m["content"] for m in msgs if m["msg_type"] == kind]


def _stdout(msgs: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in msgs
                   if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")


def _bundles(msgs: list[dict], mime: str) -> list[dict]:
    """The displays (not labels) carrying ``mime``, in arrival order."""
    return [d for d in _displays(msgs) if mime in d["data"]
            and not d["metadata"].get("nbdist", {}).get("label")]


def _started(kernels):
    k = kernels()
    status, msgs = k.cell(START)
    assert status == "ok", msgs
    return k


# -- in a real kernel -------------------------------------------------------------------------
@pytest.mark.kernel
def test_plots_from_two_ranks_arrive_as_labelled_pngs_and_side_by_side(kernels):
    k = _started(kernels)
    status, msgs = k.cell("%%dist\n" + PLOT + "plt.show()")
    assert status == "ok", msgs
    pngs = _bundles(msgs, "image/png")
    assert len(pngs) == 2, [d["data"].keys() for d in _displays(msgs)]
    assert sorted(d["metadata"]["nbdist"]["rank"] for d in pngs) == [1, 2]
    assert sorted(d["metadata"]["nbdist"]["name"] for d in pngs) == ["worker1", "worker2"]
    assert all(base64.b64decode(d["data"]["image/png"]).startswith(b"\x89PNG") for d in pngs)
    shown = _displays(msgs)
    for png in pngs:  # each picture comes right after its rank's label
        label = shown[shown.index(png) - 1]
        assert label["data"]["text/plain"] == f"[{png['metadata']['nbdist']['name']}]"
        assert label["metadata"]["nbdist"]["label"] is True

    # a figure left open at the end of the cell shows too, as in a notebook
    status, msgs = k.cell("%%dist --ranks 2\n" + PLOT)
    assert status == "ok", msgs
    assert [d["metadata"]["nbdist"]["name"] for d in _bundles(msgs, "image/png")] == ["worker2"]

    # --grid: one table, a column per rank, both pictures inside
    status, msgs = k.cell("%%dist --grid\n" + PLOT + "plt.show()")
    assert status == "ok", msgs
    grids = _bundles(msgs, "text/html")
    assert len(grids) == 1, _displays(msgs)
    page = grids[0]["data"]["text/html"]
    assert page.count('src="data:image/png;base64,') == 2
    assert page.index("[worker1]") < page.index("[worker2]")
    assert grids[0]["metadata"]["nbdist"]["ranks"] == [1, 2]
    assert not _bundles(msgs, "image/png")  # only inside the grid


@pytest.mark.kernel
def test_html_displays_rich_values_updates_clears_and_widgets(kernels):
    k = _started(kernels)
    status, msgs = k.cell("%%dist\nfrom IPython.display import HTML, display\n"
                            "print('printed first')\ndisplay(HTML('<b>hi</b>'))\n'after'")
    assert status == "ok", msgs
    assert [d["data"]["text/html"] for d in _bundles(msgs, "text/html")] == ["<b>hi</b>"] * 2
    assert "[worker1] 'after'" in _stdout(msgs)
    printed = next(i for i, m in enumerate(msgs) if m["msg_type"] == "stream"
                   and "[worker1] printed first" in m["content"]["text"])
    shown = next(i for i, m in enumerate(msgs) if m["msg_type"] == "display_data"
                 and m["content"]["metadata"].get("nbdist", {}).get("name") == "worker1")
    assert printed < shown  # what a rank printed before a display shows before it

    # a last expression with _repr_html_ shows as HTML (not again as a text line)
    status, msgs = k.cell("%%dist --ranks 1\nclass T:\n    def _repr_html_(self):\n"
                            "        return '<i>table</i>'\n    def __repr__(self):\n"
                            "        return 'T()'\nT()")
    assert status == "ok", msgs
    html = _bundles(msgs, "text/html")
    assert [d["data"]["text/html"] for d in html] == ["<i>table</i>"]
    assert html[0]["metadata"]["nbdist"] == {"rank": 1, "name": "worker1"}
    assert "T()" not in _stdout(msgs)

    # inside an RPC the notebook made: the display shows in the running cell
    status, msgs = k.cell("import torch.distributed.rpc as rpc\n"
                            "def show(x):\n    from IPython.display import HTML, display\n"
                            "    display(HTML(f'<u>{x}</u>'))\n    return x\n"
                            "rpc.rpc_sync('worker2', show, args=(7,))")
    assert status == "ok", msgs
    assert [(d["data"]["text/html"], d["metadata"]["nbdist"]["rank"])
            for d in _bundles(msgs, "text/html")] == [("<u>7</u>", 2)]

    # display ids: an update from the worker updates its output here
    status, msgs = k.cell("%%dist --ranks 1\nh = display(HTML('one'), display_id=True)")
    first = _bundles(msgs, "text/html")
    assert status == "ok" and len(first) == 1, msgs
    status, msgs = k.cell("%%dist --ranks 1\nh.update(HTML('two'))")
    updates = _displays(msgs, "update_display_data")
    assert status == "ok" and len(updates) == 1, msgs
    assert updates[0]["data"]["text/html"] == "two"
    assert updates[0]["transient"]["display_id"] == first[0]["transient"]["display_id"]

    # clear_output(wait=True) in a loop: one place per rank, updated, not a growing list
    status, msgs = k.cell("%%dist\nfrom IPython.display import clear_output\n"
                            "for i in range(3):\n    clear_output(wait=True)\n"
                            "    display(HTML(f'frame {i}'))")
    assert status == "ok", msgs
    assert len(_bundles(msgs, "text/html")) == 2  # one new output per rank
    finals = {u["transient"]["display_id"]: u["data"]["text/html"]
              for u in _displays(msgs, "update_display_data") if "text/html" in u["data"]}
    assert sorted(finals.values()) == ["frame 2", "frame 2"]

    # a worker's widget as a cell's value: a live view of a model relayed to the frontend
    # (tests/kernel/test_worker_widgets.py follows its messages)
    status, msgs = k.cell("%%dist --ranks 2\nimport ipywidgets\nipywidgets.IntSlider(3)")
    assert status == "ok", msgs
    views = [d["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for d in _displays(msgs) if "application/vnd.jupyter.widget-view+json" in d["data"]]
    opened = [m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_open"]
    assert len(views) == 1 and views[0] in opened, msgs


@pytest.mark.kernel
def test_magics_and_shell_escapes_in_a_kernel(kernels):
    k = _started(kernels)
    status, msgs = k.cell("%%dist\n%timeit -n 5 -r 1 sum(range(10))")
    assert status == "ok", msgs
    out = _stdout(msgs)
    assert "[worker1]" in out and "[worker2]" in out and "per loop" in out, out
    status, msgs = k.cell("%%dist\nx = !echo hi from $NBDIST_RANK\nx")
    assert status == "ok", msgs
    assert "[worker1] ['hi from 1']" in _stdout(msgs), _stdout(msgs)
    assert "[worker2] ['hi from 2']" in _stdout(msgs), _stdout(msgs)

    # an exception inside a magic: the usual remote traceback, from the cell's line on
    status, msgs = k.cell("%%dist --ranks 1\n%timeit -n1 -r1 1/0")
    assert status == "error"
    err = next(m["content"] for m in msgs if m["msg_type"] == "error")
    text = "\n".join(err["traceback"])
    assert "ZeroDivisionError" in text and "rank 1 (worker1)" in text, text
    assert "run_line_magic('timeit', '-n1 -r1 1/0')" in text, text
    assert "<magic-timeit>" in text, text


# -- in this process (bundles as text) --------------------------------------------------------
def test_magics_help_and_shell_escapes(ipython, capsys):
    ipython.run_line_magic("dist_start", "2")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "", "%timeit -n 3 -r 1 sum(range(5))")
    assert "per loop" in capsys.readouterr().out
    ipython.run_cell_magic("dist", "--ranks 1", "!echo plain shell")
    assert "[worker1] plain shell" in capsys.readouterr().out
    ipython.run_cell_magic("dist", "", "files = !echo a; echo b\nfiles")
    out = capsys.readouterr().out
    assert "[worker1] ['a', 'b']" in out and "[worker2] ['a', 'b']" in out
    ipython.run_cell_magic("dist", "--ranks 2", "len?")
    assert "[worker2] Docstring:" in capsys.readouterr().out
    # IPython's input transformations and top-level await
    ipython.run_cell_magic("dist", "--ranks 1", ">>> a = 2\n>>> a * 3")
    assert "[worker1] 6" in capsys.readouterr().out
    ipython.run_cell_magic("dist", "--ranks 1",
                           "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'")
    assert "[worker1] 'awaited'" in capsys.readouterr().out


@WORLD_KINDS
def test_values_errors_and_underscore_keep_their_meaning(world, kind):
    c = world(2, rpc=not kind)
    long = "list(range(40))"
    assert c.run(long, show=False) == {1: repr(list(range(40))), 2: repr(list(range(40)))}
    assert c.run("40 + 2", ranks=[1], show=False) == {1: "42"}
    assert c.run("_", ranks=[1], show=False) == {1: "42"}
    assert c.run("x = 5\nx;", ranks=[1], show=False) == {1: None}  # ';' hides it
    with pytest.raises(DistCellError) as info:
        c.run("def f():\n    raise KeyError('deep')\nf()", ranks=[1], show=False)
    text = "\n".join(info.value._render_traceback_())
    assert "raise KeyError('deep')" in text and "<dist-cell-" in text
    assert "IPython" not in text and "nbdist/proc" not in text
    with pytest.raises(DistCellError) as info:
        c.run("def g(:\n  pass", ranks=[2], show=False)
    assert info.value.failures[0].etype == "SyntaxError"
    assert c.run("y = 3\ny * 2", ranks=[2], show=False) == {2: "6"}  # the worker goes on


@WORLD_KINDS
def test_displays_outside_jupyter_and_the_size_limit(world, capsys, monkeypatch, kind):
    monkeypatch.setenv("NBDIST_DISPLAY_MB", "0.01")  # the workers take the notebook's env
    c = world(1, rpc=not kind)
    capsys.readouterr()
    c.run("from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))\n"
          "display(HTML('y' * 20000))")
    c.flush()
    out = capsys.readouterr().out
    assert "[worker1] <IPython.core.display.HTML object>" in out
    assert "[worker1] nbdist: a display of 20 KB from rank 1 (worker1) was not shown" in out
    values = c.run("class T:\n    def _repr_html_(self):\n        return '<i>t</i>'\n"
                   "    def __repr__(self):\n        return 'T()'\nT()")
    assert values == {1: "T()"}
    c.flush()
    assert capsys.readouterr().out.count("[worker1] T()") == 1  # the value's line, once


def test_render_grid_puts_each_rank_in_its_column():
    page = render_grid([("worker1", [{"image/png": "iVBO", "text/plain": "fig"}]),
                        ("worker2", [{"text/html": "<b>2</b>"}, {"text/plain": "a < b"}])])
    assert page.count("<td ") == 2 and page.count("<th ") == 2
    assert 'src="data:image/png;base64,iVBO"' in page
    assert "<b>2</b>" in page and "a &lt; b" in page
    assert page.index("[worker1]") < page.index("[worker2]")


def test_display_messages_round_trip():
    shown = DisplayData(2, {"image/png": "iVBO", "application/json": {"a": [1, 2.5, None]}},
                        {"image/png": {"width": 320}}, "abc", True, 7)
    assert decode(encode(shown)) == shown
    assert decode(encode(ClearOutput(1, True))) == ClearOutput(1, True)
