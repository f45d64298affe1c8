"""``nbdist.tracebacks``: a worker's formatted traceback read as the user's code (pure), and
``CellInterrupted``'s rendering of it."""

from __future__ import annotations

import os
import sysconfig

import nbdist
from nbdist.errors import CellInterrupted, RankFailure
from nbdist.tracebacks import Frame, frames, is_own, short_block, user_frame

NBDIST_DIR = os.path.dirname(nbdist.__file__)
SITE = sysconfig.get_paths()["purelib"]

IN_A_CELL = '''Traceback (most recent call last):
  File "<dist-cell-7>", line 3, in <module>
    time.sleep(30)
KeyboardInterrupt
'''

IN_A_LIBRARY = f'''Traceback (most recent call last):
  File "<dist-cell-9>", line 4, in <module>
    train(model)
  File "<dist-cell-8>", line 2, in train
    dist.barrier()
    ^^^^^^^^^^^^^^
  File "{SITE}/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
  File "{NBDIST_DIR}/proc/worker.py", line 72, in _on_sigint
    raise KeyboardInterrupt
KeyboardInterrupt
'''

CHAINED = '''Traceback (most recent call last):
  File "<dist-cell-3>", line 2, in <module>
    {}["a"]
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "<dist-cell-3>", line 4, in <module>
    raise ValueError("b")
ValueError: b
'''


def test_frames_in_order_with_their_source_lines():
    got = frames(IN_A_LIBRARY)
    assert [(f.file, f.line, f.func) for f in got][:2] == [("<dist-cell-9>", 4, "<module>"),
                                                           ("<dist-cell-8>", 2, "train")]
    assert [f.source for f in got] == ["train(model)", "dist.barrier()",
                                       "return func(*args, **kwargs)", "raise KeyboardInterrupt"]
    assert [f.line for f in frames(CHAINED)] == [4]  # the exception that was raised last


def test_the_users_frame_is_the_innermost_of_their_code():
    assert user_frame(frames(IN_A_LIBRARY)) == Frame("<dist-cell-8>", 2, "train",
                                                     "dist.barrier()")
    assert is_own(frames(IN_A_LIBRARY)[-1])
    assert not is_own(frames(IN_A_CELL)[0])
    only_library = [Frame(f"{SITE}/torch/x.py", 5, "f", "g()"),
                    Frame(f"{NBDIST_DIR}/proc/worker.py", 72, "_on_sigint")]
    assert user_frame(only_library) == only_library[0]  # nothing of the user's: not nbdist's
    assert user_frame([Frame("/usr/lib/python3.11/threading.py", 331, "wait")]) is None


def test_short_block_names_the_line_and_the_library_call_below_it():
    assert short_block("rank 1 (worker1)", "KeyboardInterrupt", "", IN_A_CELL) == [
        'rank 1 (worker1): KeyboardInterrupt, at "<dist-cell-7>", line 3, in <module>',
        "    time.sleep(30)"]
    head, source = short_block("rank 2 (w2)", "KeyboardInterrupt", "", IN_A_LIBRARY)
    assert head == ('rank 2 (w2): KeyboardInterrupt, at "<dist-cell-8>", line 2, in train '
                    "(inside wrapper, c10d_logger.py:81)")
    assert source == "    dist.barrier()"
    assert short_block("rank 3 (w3)", "WorkerDiedError", "killed by SIGKILL", "") == [
        "rank 3 (w3): WorkerDiedError: killed by SIGKILL"]


def _interrupted() -> CellInterrupted:
    return CellInterrupted([RankFailure(r, f"worker{r}", "KeyboardInterrupt", "", IN_A_CELL)
                            for r in (1, 2, 3)], ["rank 4 (worker4)"])


def test_cell_interrupted_shows_a_short_block_per_rank(monkeypatch):
    monkeypatch.delenv("NBDIST_TRACEBACK", raising=False)
    err = _interrupted()
    assert isinstance(err, KeyboardInterrupt) and not isinstance(err, Exception)
    lines = err._render_traceback_()
    assert len(lines) == 8, lines
    assert lines[0].startswith("KeyboardInterrupt: the cell was interrupted on 4 ranks; "
                               "`%dist_debug 1`")
    assert [ln.split(":")[0] for ln in lines[1::2]][:3] == [f"rank {r} (worker{r})"
                                                            for r in (1, 2, 3)]
    assert lines[-1].startswith("rank 4 (worker4): did not stop at once")
    assert not any("Traceback" in ln or NBDIST_DIR in ln for ln in lines)


def test_nbdist_traceback_full_shows_every_frame(monkeypatch):
    monkeypatch.setenv("NBDIST_TRACEBACK", "full")
    try:
        raise _interrupted()
    except CellInterrupted as exc:
        text = "\n".join(exc._render_traceback_())
    assert "test_tracebacks.py" in text  # the notebook's own frames
    assert text.count("Traceback (most recent call last):") == 4  # and each rank's whole one


def test_past_sixteen_ranks_those_stopped_alike_share_one_block(monkeypatch):
    monkeypatch.delenv("NBDIST_TRACEBACK", raising=False)
    err = CellInterrupted([RankFailure(r, f"worker{r}", "KeyboardInterrupt", "",
                                       IN_A_LIBRARY if r == 3 else IN_A_CELL)
                           for r in range(1, 21)], [])
    lines = err._render_traceback_()
    heads = [ln.split(":")[0] for ln in lines[1::2]]
    assert heads == ["ranks 1,2,4-20 (worker1,2,4-20)", "rank 3 (worker3)"], lines
