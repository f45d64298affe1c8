"""Behaviour 2: what workers print shows in the cell that caused it, led by the rank's name."""

from __future__ import annotations

import time

from conftest import WORLD_KINDS, wait_until

CODE = '''
import sys, threading, warnings
import torch.distributed.rpc as rpc

def chatty(n):
    print(f"observer {n} runs an episode")
    print("to stderr", file=sys.stderr)
    t = threading.Thread(target=lambda: print("from a thread"))
    t.start(); t.join()
    warnings.warn("a real user warning")
    return n
'''


def test_rpc_output_stdout_stderr_threads_warnings(ipython, capsys):
    ipython.run_line_magic("dist_start", "2 --name agent --worker-name obs{rank}")
    assert ipython.run_cell(CODE).success
    capsys.readouterr()
    assert ipython.run_cell("rpc.rpc_sync('obs2', chatty, args=(2,))").success
    seen = ["", ""]

    def arrived() -> bool:
        o, e = capsys.readouterr()
        seen[0], seen[1] = seen[0] + o, seen[1] + e
        return "a real user warning" in seen[1]

    wait_until(arrived, 30, "the worker's warning on stderr")  # "hangs"; it is shown at once
    out, err = seen
    assert "[obs2] observer 2 runs an episode\n" in out
    assert "[obs2] from a thread\n" in out
    assert "[obs2] to stderr\n" in err
    assert "UserWarning: a real user warning" in err and "[obs2]" in err
    assert "[obs1]" not in out + err


def test_output_arrives_before_rpc_returns(ipython, capsys, monkeypatch):
    """Flushed before the reply is sent, and shown before rpc_sync returns: the very next
    statement sees it, with no wait, even where showing a line is slow (a busy front end:
    here each line of the function takes 0.2 s to write, well within the 0.5 s rpc_sync
    waits for the receiver to catch up)."""
    from nbdist.output.router import Router

    real = Router.write

    def slow_front_end(stream: str, text: str) -> None:
        if "hello there" in text:
            time.sleep(0.2)
        real(stream, text)

    monkeypatch.setattr(Router, "write", staticmethod(slow_front_end))
    ipython.run_line_magic("dist_start", "1")
    ipython.run_cell("import torch.distributed.rpc as rpc\n"
                     "def hello(i):\n    print('hello there', i)\n    return i")
    for i in range(5):
        capsys.readouterr()
        ipython.run_cell(f"rpc.rpc_sync('worker1', hello, args=({i},)); print('after', {i})")
        out, _ = capsys.readouterr()  # right after the return, no polling
        assert f"[worker1] hello there {i}\nafter {i}\n" in out, (i, out)


@WORLD_KINDS
def test_dist_cell_streams_and_shows_last_expression(ipython, capsys, kind):
    ipython.run_line_magic("dist_start", f"2 {kind}")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "", "import os\nprint('pid', os.getpid() > 0)\n"
                                       "{'rank': int(os.environ['NBDIST_RANK'])}")
    out, _ = capsys.readouterr()
    assert "[worker1] pid True" in out and "[worker2] pid True" in out
    assert "[worker1] {'rank': 1}" in out and "[worker2] {'rank': 2}" in out


@WORLD_KINDS
def test_partial_lines_are_flushed_and_state_persists(ipython, capsys, kind):
    ipython.run_line_magic("dist_start", f"1 {kind}")
    ipython.run_cell_magic("dist", "", "counter = 41")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "", "counter += 1\nprint('no newline', end='')\ncounter")
    out, _ = capsys.readouterr()
    assert "[worker1] no newline\n" in out
    assert "[worker1] 42" in out


def test_ranks_by_name_and_range(ipython, capsys):
    ipython.run_line_magic("dist_start", "3 --worker-name w{rank}")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "--ranks w2", "'two'")
    out, _ = capsys.readouterr()
    assert out.strip() == "[w2] 'two'"
    ipython.run_cell_magic("dist", "--ranks 1-2", "'x'")
    out, _ = capsys.readouterr()
    assert "[w1] 'x'" in out and "[w2] 'x'" in out and "[w3]" not in out


def test_dollar_variables_expand_next_to_rank_patterns(ipython, capsys):
    ipython.run_cell("N_WORKERS = 2\nWHO = 'obs2'")
    ipython.run_line_magic("dist_start", "$N_WORKERS --worker-name obs{rank}")
    capsys.readouterr()
    ipython.run_cell_magic("dist", "--ranks $WHO", "'picked'")
    out, _ = capsys.readouterr()
    assert out.strip() == "[obs2] 'picked'"


def test_flush_delivers_everything_before_returning_and_stop_keeps_last_lines(world, capsys):
    import torch.distributed.rpc as rpc

    import nbdist

    c = world(1)
    c.run("import nbdist\ndef work(n):\n    for i in range(n):\n"
          "        nbdist.log(step=i, loss=float(i))\n    print('worked', n)\n    return n",
          show=False)
    nbdist.clear_history()
    for k in range(20):
        assert rpc.rpc_sync("worker1", _call_work, args=(5,)) == 5
        assert c.flush()
        assert len(nbdist.history(rank=1, key="loss")) == 5 * (k + 1)
    out, _ = capsys.readouterr()
    assert out.count("[worker1] worked 5") == 20
    rpc.rpc_sync("worker1", _call_work, args=(1,))
    c.stop()
    out, _ = capsys.readouterr()
    assert "[worker1] worked 1" in out


def _call_work(n):
    import __main__

    return __main__.work(n)


@WORLD_KINDS
def test_background_thread_output_outside_any_cell_lands(world, tmp_path, kind):
    """A worker thread prints after its cell ended, while no cell runs: the line is kept
    and ``nbdist.current().logs(rank)`` returns it."""
    import nbdist

    c = world(2, rpc=not kind)
    go = tmp_path / "go"
    c.run("import os, threading, time\n"
          "def later(flag):\n    t0 = time.monotonic()\n"
          "    while not os.path.exists(flag) and time.monotonic() - t0 < 60:\n"
          "        time.sleep(0.01)\n"
          "    print('tick from a background thread', flush=True)\n"
          f"bg = threading.Thread(target=later, args=({str(go)!r},))\nbg.start()",
          ranks=[2], show=False)
    assert "tick from a background thread" not in nbdist.current().logs(2)
    go.touch()  # now, outside any cell, the thread prints
    wait_until(lambda: "tick from a background thread" in nbdist.current().logs(2), 30,
               "the background thread's line in rank 2's log")
    assert c.run("bg.join(60)\nbg.is_alive()", ranks=[2], show=False) == {2: "False"}
    assert nbdist.current().logs("worker2", tail=1) == ["tick from a background thread"]
    assert "tick from a background thread" not in c.logs(1, tail=None)
