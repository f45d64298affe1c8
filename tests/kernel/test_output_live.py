"""Issue 8: output that reads like one program.

Causal order of worker and notebook prints, live progress lines updated in place, a status
line for long cells, logs kept per rank, and a per-cell flood limit — in a real Jupyter
kernel (iopub messages timed as they arrive) and in-process where the kernel adds nothing.
"""

from __future__ import annotations

import contextlib
import io
import queue
import re
import time

import pytest
from conftest import wait_until
from kernel_helpers import Kernel, kernel_with_world

import nbdist

START = "%load_ext nbdist\n%dist_start 2\nimport nbdist, torch.distributed.rpc as rpc"


@pytest.fixture(scope="module")
def kernel():
    yield from kernel_with_world(START)


def _messages(k: Kernel, code: str, timeout: float = 120,
              on_message=None) -> tuple[list[tuple], float]:
    """Every iopub message the cell caused, as (seconds since sent, type, content), and the
    time the cell went idle; ``on_message(type, content)`` sees each one as it arrives."""
    msg_id = k.send(code)
    t0 = time.monotonic()
    got: list[tuple] = []
    while True:
        left = t0 + timeout - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"cell did not finish within {timeout}s: {code[:60]!r}")
        try:
            msg = k.kc.get_iopub_msg(timeout=left)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        now = time.monotonic() - t0
        if on_message is not None:
            on_message(msg["msg_type"], msg["content"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return got, now
        got.append((now, msg["msg_type"], msg["content"]))


def _stdout(msgs: list[tuple]) -> str:
    return "".join(c["text"] for _, kind, c in msgs if kind == "stream" and c["name"] == "stdout")


def test_worker_prints_inside_rpc_sync_come_before_the_notebooks_next_print(kernel):
    msgs, _ = _messages(kernel, (
        "def say(i):\n    print(f'w{i}')\n    return i\n"
        "for i in range(500):\n"
        "    rpc.rpc_sync('worker1', say, args=(i,))\n"
        "    print(f'n{i}')\n"))
    lines = _stdout(msgs).splitlines()
    expected = [x for i in range(500) for x in (f"[worker1] w{i}", f"n{i}")]
    swapped = [(k, a, b) for k, (a, b) in enumerate(zip(lines, expected, strict=False)) if a != b]
    assert len(lines) == 1000 and not swapped, swapped[:5]


def test_a_worker_line_never_lands_inside_a_line_the_notebook_is_printing(kernel):
    """The notebook's ``print`` writes its text and its newline in two calls; a worker's line
    shown between them would join the notebook's (``n7[worker1] w3``). Both print at once
    here, and every line must be one or the other's, whole."""
    both_print = ("def spam(n):\n    for i in range(n):\n        print(f'w{i}')\n    return n\n"
                  "fut = rpc.rpc_async('worker1', spam, args=(3000,))\n"
                  "for i in range(3000):\n    print(f'n{i}')\nfut.wait()\n")
    lines = _stdout(_messages(kernel, both_print)[0]).splitlines()
    joined = [s for s in lines if not re.fullmatch(r"\[worker1\] w\d+|n\d+", s)]
    assert not joined, joined[:5]
    assert sum(s.startswith("n") for s in lines) == 3000, len(lines)
    assert sum(s.startswith("[worker1] ") for s in lines) == 3000, len(lines)


def test_a_line_the_notebook_left_open_ends_before_a_worker_line(kernel):
    """``print(..., end="")`` left the notebook's line open while a worker printed: the
    worker's line starts on a line of its own and the notebook's text goes on after it."""
    msgs, _ = _messages(kernel, (
        "def say():\n    print('from the worker')\n"
        "print('waiting...', end='')\n"
        "rpc.rpc_sync('worker1', say)\n"
        "print(' done')\n"))
    assert _stdout(msgs).splitlines() == ["waiting...", "[worker1] from the worker", " done"]


def test_progress_lines_show_live_one_per_rank_and_end_as_the_final_state(kernel, tmp_path):
    # after its first step each rank waits (60 s at most) until this test has seen the
    # notebook show its line: lines shown only when the cell ends would never end that wait
    code = ("%%dist\nimport os, time\n"
            f"seen = os.path.join({str(tmp_path)!r}, 'seen' + os.environ['NBDIST_RANK'])\n"
            "for i in range(30):\n"
            "    print(f'\\rstep {i:2d}/30', end='', flush=True)\n"
            "    deadline = time.monotonic() + 60\n"
            "    while i == 0 and not os.path.exists(seen) and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            "    time.sleep(0.1)\n"
            "print()\n"
            "print('the notebook showed it' if os.path.exists(seen) else 'never shown')\n")

    def on_message(kind, content):
        text = content.get("data", {}).get("text/plain", "")
        for rank in (1, 2):
            if kind == "display_data" and text.startswith(f"[worker{rank}] step"):
                (tmp_path / f"seen{rank}").touch()

    msgs, idle = _messages(kernel, code, on_message=on_message)
    by_rank: dict[str, list[tuple[float, str, str]]] = {"worker1": [], "worker2": []}
    for t, kind, content in msgs:
        if kind in ("display_data", "update_display_data"):
            text = content["data"].get("text/plain", "")
            for name in by_rank:
                if text.startswith(f"[{name}] step"):
                    by_rank[name].append((t, kind, text))
    for name, events in by_rank.items():
        kinds = [k for _, k, _ in events]
        assert kinds.count("display_data") == 1, (name, kinds)  # one live line per rank
        assert kinds.count("update_display_data") >= 5, (name, kinds)  # updated in place
        assert events[-1][2] == f"[{name}] step 29/30", events[-1]  # ends at the final state
    assert "step" not in _stdout(msgs)  # no line per update in the stream
    for name in by_rank:  # each line was shown while its loop still ran
        assert f"[{name}] the notebook showed it" in _stdout(msgs), _stdout(msgs)


def test_live_line_shows_while_the_cell_still_runs(kernel, tmp_path):
    """The worker writes a live line, then waits (60 s at most) until this test has seen the
    notebook show it: a line shown only when the cell ends would never end that wait."""
    seen = tmp_path / "seen"
    code = ("%%dist --ranks 1\nimport os, time\n"
            "print('\\rwritten', end='', flush=True)\n"
            "deadline = time.monotonic() + 60\n"
            f"while not os.path.exists({str(seen)!r}) and time.monotonic() < deadline:\n"
            "    time.sleep(0.02)\n"
            f"print('\\nthe notebook showed it' if os.path.exists({str(seen)!r}) else '\\n')\n")

    def on_message(kind, content):
        if kind == "display_data" and content["data"].get("text/plain") == "[worker1] written":
            seen.touch()

    msgs, _ = _messages(kernel, code, on_message=on_message)
    assert seen.exists(), msgs
    assert "[worker1] the notebook showed it" in _stdout(msgs), msgs


def test_long_cell_says_who_is_still_running_then_sums_up(kernel):
    code = ("%%dist\nimport time, os\n"
            "time.sleep(1.0 + 2.0 * (os.environ['NBDIST_RANK'] == '2'))\n")
    msgs, _ = _messages(kernel, code)
    texts = [c["data"].get("text/plain", "") for _, kind, c in msgs
             if kind in ("display_data", "update_display_data")]
    running = [t for t in texts if t.startswith("nbdist: running on")]
    assert running and "worker2" in running[-1] and "worker1" not in running[-1], texts
    assert texts[-1].startswith("nbdist: finished: worker1 1.") and "worker2 3." in texts[-1]


def test_short_cells_have_no_status_line(kernel):
    msgs, _ = _messages(kernel, "%%dist\n1")
    assert not [c for _, kind, c in msgs if kind in ("display_data", "update_display_data")]


def _stream(msgs: list[tuple], name: str) -> str:
    return "".join(c["text"] for _, kind, c in msgs if kind == "stream" and c["name"] == name)


def test_worker_output_goes_to_the_cell_not_into_a_redirect_of_the_notebook(kernel):
    """Issue 27 (5a): while the notebook's ``sys.stdout``/``sys.stderr`` are redirected (the
    user's ``redirect_stdout``, pytest's capture in a kernel), what the workers print still
    shows in the cell; the user's buffer gets only the notebook's own prints."""
    msgs, _ = _messages(kernel, (
        "import contextlib, io, sys\n"
        "def say(i):\n"
        "    print(f'out {i}')\n"
        "    print(f'err {i}', file=sys.stderr)\n"
        "    return i\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
        "    rpc.rpc_sync('worker1', say, args=(1,))\n"
        "    get_ipython().run_cell_magic('dist', '--ranks 2', 'import sys\\n'\n"
        "        'print(\"out 2\")\\nprint(\"err 2\", file=sys.stderr)')\n"
        "    print('mine')\n"
        "print('captured:', repr(buf.getvalue()))\n"))
    out, err = _stream(msgs, "stdout"), _stream(msgs, "stderr")
    assert "[worker1] out 1" in out and "[worker2] out 2" in out, (out, err)
    assert "[worker1] err 1" in err and "[worker2] err 2" in err, (out, err)
    assert "captured: 'mine\\n'" in out, out


# ---- in-process: logs and flood limits -------------------------------------------------------
def test_output_outside_any_cell_lands_in_the_log(world):
    c = world(2)
    c.run("import threading, time\n"
          "def later():\n    time.sleep(0.3)\n    print('from a background thread')\n"
          "threading.Thread(target=later).start()", ranks=2, show=False)
    wait_until(lambda: "from a background thread" in c.logs(2), 10,
               "rank 2's background thread's print in its log")
    assert c.logs("worker2", tail=1) == ["from a background thread"]
    assert "from a background thread" not in c.logs(1, tail=None)


def test_a_flood_stops_echoing_but_the_log_keeps_everything(world):
    c = world(1)
    c.router.limit_lines = 100
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        c.run("for i in range(1000):\n    print(f'line {i}')", show=False)
    echoed = [x for x in out.getvalue().splitlines() if x.startswith("[worker1] line ")]
    assert len(echoed) == 100, len(echoed)
    assert out.getvalue().count("more than this cell's limit") == 1
    assert "%dist_logs worker1" in out.getvalue()
    full = c.logs(1, tail=None)
    assert full[:1000] == [f"line {i}" for i in range(1000)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the next cell echoes again
        c.run("print('after')", show=False)
    assert "[worker1] after" in out.getvalue()


def test_dist_logs_magic_and_keeping_logs_after_stop(ipython, tmp_path, capsys):
    ipython.run_line_magic("dist_start", "2 --worker-name obs{rank}")
    ipython.run_cell_magic("dist", "", "import os\nprint('hello from', os.environ['NBDIST_RANK'])")
    capsys.readouterr()
    ipython.run_line_magic("dist_logs", "obs2 --tail 5")
    shown = capsys.readouterr().out
    assert "--- rank 2 (obs2): 1 line" in shown and "[obs2] hello from 2" in shown
    assert "obs1" not in shown
    nbdist.current().stop(keep_logs=str(tmp_path / "logs"))
    kept = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert kept == ["rank1-obs1.log", "rank2-obs2.log"]
    assert (tmp_path / "logs" / "rank2-obs2.log").read_text() == "hello from 2\n"


def test_nbconvert_keeps_one_output_per_rank_with_the_final_state(tmp_path):
    """nbclient applies display updates to the stored outputs: one line per rank remains."""
    import nbformat
    from conftest import run_notebook

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (
        "%load_ext nbdist\n%dist_start 2",
        "%%dist\nimport time\nfor i in range(10):\n"
        "    print(f'\\rstep {i}', end='', flush=True)\n    time.sleep(0.1)\nprint()",
        "%dist_stop")]
    path = tmp_path / "progress.ipynb"
    nbformat.write(nb, str(path))
    done = run_notebook(path, timeout=300)
    outputs = done.cells[1].outputs
    live = [o for o in outputs if o.get("output_type") == "display_data"]
    assert sorted(o["data"]["text/plain"] for o in live) == ["[worker1] step 9",
                                                            "[worker2] step 9"], outputs
    streams = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "step" not in streams, streams


def test_in_a_terminal_live_lines_share_one_carriage_return_line(capsys):
    from nbdist.output.router import Router

    router = Router()
    assert not router.jupyter  # pytest is no Jupyter kernel
    router.feed(1, "w1", "stdout", "\rstep 1")
    router.feed(2, "w2", "stdout", "\rstep 1")
    time.sleep(0.15)  # past the update interval
    router.feed(1, "w1", "stdout", "\rstep 2")
    router.feed(1, "w1", "stdout", "\n")
    err = capsys.readouterr().err
    assert "\r[w1] step 1" in err and "[w1] step 1 | [w2] step 1" in err
    assert err.rstrip(" \r").endswith("[w2] step 1")  # w2 stays live after w1 ended
    assert "\r[w1] step 2" in err  # w1's final state, written as a line of its own
    assert "[w1] step 2" in err.split("\n")[-2] if "\n" in err else False
    assert router.logs(1) == ["step 2"]
