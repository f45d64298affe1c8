"""Issue 37, items 1-3, in real Jupyter kernels: ``%load_ext nbdist`` returns at once (torch
is imported in the background), the start line's time is the wait the user had, and Ctrl-C
during ``%%dist`` shows one short block per rank at the user's line, the kernel idle at once.

Timing budgets hold on an idle machine of the project's kind; where a test runs on a loaded
one, the ``%load_ext`` budget grows with how much slower than usual ``import torch`` is
measured beside it (``_load_factor``), never below the issue's figure. "Ready one import of
torch plus 0.5 s after ``%load_ext``" is measured by ``bench/startup/first_minute.py``: on a loaded
machine every process's import competes for the same cores, so the test checks the shape
instead (both imports under way when ``%load_ext`` returns).
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import time

import pytest
from conftest import expand_ranks
from kernel_helpers import Kernel, kernel_with_world

pytestmark = pytest.mark.kernel

LOAD_EXT_BUDGET = 0.3  # s, issue 37
IMPORT_HERE = 1.5  # s: `import torch.distributed.rpc` on an idle 2-core machine of ours
IDLE_BUDGET = 0.1  # s from Ctrl-C to an idle kernel, issue 37
READY = re.compile(r"(\d+) ranks ready in ([\d.]+)s")
OWN_FRAMES = ("magics.py", "cells.py", "core.py", "threading.py", "nbdist/")

LOAD = ("import time as _t\n_t0 = _t.perf_counter()\n%load_ext nbdist\n"
        "_took = _t.perf_counter() - _t0\n"
        "from nbdist.cluster.session import session\n_S = session()\n"
        "print(repr((_took, _S.warmup.importing, _S.template_pid())))")


def _import_seconds() -> float:
    """How long a fresh Python takes to import torch's RPC now (the machine's load in it)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch.distributed.rpc"], check=True,
                   timeout=300)
    return time.monotonic() - t0


def _load_factor(import_s: float) -> float:
    return max(1.0, import_s / IMPORT_HERE)


def _timed(k: Kernel, code: str, timeout: float = 180) -> tuple[float, str]:
    """Run ``code``; (seconds from sending it to its reply, what it printed)."""
    t0 = time.monotonic()
    rep = k.execute(code, timeout=timeout)
    took = time.monotonic() - t0
    assert rep.status == "ok", rep
    return took, rep.stdout


def _ready_in(out: str) -> float:
    m = READY.search(out)
    assert m, out
    return float(m.group(2))


ROUNDING = 0.005  # the line prints two decimals: 1.505 s reads "1.51s"


def test_load_ext_returns_at_once_with_both_imports_under_way(kernels):
    k = kernels()
    _, out = _timed(k, LOAD)
    took, importing, template = eval(out.strip().splitlines()[-1])  # noqa: S307 - our repr
    waited, out = _timed(k, "%dist_start 4")
    said = _ready_in(out)
    assert _timed(k, "%%dist\n6 * 7")[1].count("42") == 4
    _timed(k, "%dist_stop")
    import_s = _import_seconds()  # after the kernel's imports: beside nothing of ours
    factor = _load_factor(import_s)
    report = (f"%load_ext {took:.3f}s, %dist_start 4 waited {waited:.2f}s and said "
              f"{said:.2f}s; import torch here {import_s:.2f}s (load factor {factor:.1f})")
    print(report)
    assert importing, f"torch's import was over when %load_ext returned: it waited ({report})"
    assert template is not None, "%load_ext did not launch the template"
    assert took <= LOAD_EXT_BUDGET * factor, report
    # from the call, not from later; before the call, loading torch's libraries on the
    # background thread may hold the GIL for a moment, longer on a loaded machine
    assert waited - 0.3 * factor <= said <= waited + ROUNDING, report


def test_only_a_cell_that_names_torch_waits_for_its_import(kernels):
    """Right after ``%load_ext``: a cell without torch runs at once, beside the background
    import; one that imports a submodule of torch first waits for the import to end (run
    beside torch's own body it would see torch half-imported)."""
    k = kernels()
    _timed(k, "%load_ext nbdist")
    _, out = _timed(k, "from nbdist.cluster.session import session\nS = session()\n"
                       "print(S.warmup.importing)")
    assert out.strip() == "True", out  # not held up: the import goes on
    _, out = _timed(k, "print(S.warmup.importing)\nfrom torch.utils.data import DataLoader\n"
                       "import torch.nn as nn\nprint(nn.Linear(2, 3).out_features)")
    assert out.split() == ["False", "3"], out


def test_start_line_counts_from_the_call_without_prewarm(kernels):
    k = kernels()
    _timed(k, "%env NBDIST_PREWARM=0\n%load_ext nbdist")
    # what a cell costs the kernel around the magic (message, parse, reply): not counted
    slack = 0.3 + max(_timed(k, "pass")[0] for _ in range(3))
    waited, out = _timed(k, "%dist_start 4")
    said = _ready_in(out)
    _timed(k, "%dist_stop")
    # it used to start its clock after this process's import of torch: 1.5 s short here
    assert waited - slack <= said <= waited + ROUNDING, \
        f"waited {waited:.2f}s, the line said {said:.2f}s (slack {slack:.2f}s)"
    waited, out = _timed(k, "%dist_restart 2")
    said = _ready_in(out)
    _timed(k, "%dist_stop")
    assert waited - slack <= said <= waited + ROUNDING, \
        f"restart: waited {waited:.2f}s, said {said:.2f}s (slack {slack:.2f}s)"


# ---------------------------------------------------------------- Ctrl-C during %%dist
@pytest.fixture(scope="module")
def world4():
    for k in kernel_with_world("%load_ext nbdist\n%dist_start 4"):
        rep = k.execute("%%dist\nimport os, time\nmine = os.getpid()")
        assert rep.status == "ok", rep
        yield k


SLEEPER = "%%dist\nslept_here = 41\nprint('asleep', flush=True)\ntime.sleep(30)\n"


def _interrupt_asleep(k: Kernel, cell: str = SLEEPER) -> tuple[float, str]:
    """Run ``cell`` until all 4 ranks printed 'asleep', then Ctrl-C; (seconds from the
    interrupt to the kernel going idle, the error's traceback text)."""
    msg_id = k.kc.execute(cell, stop_on_error=False)
    asleep, error, t_int = 0, None, None
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, f"the cell did not end ({asleep} ranks asleep)"
        try:
            msg = k.kc.get_iopub_msg(timeout=0.01)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            asleep += content["text"].count("asleep")
            if asleep == 4 and t_int is None:
                t_int = time.monotonic()
                k.km.interrupt_kernel()
        elif kind == "error":
            error = content
        elif kind == "status" and content["execution_state"] == "idle":
            assert t_int is not None, "the cell ended before every rank was asleep"
            took = time.monotonic() - t_int
            break
    assert error is not None, "Ctrl-C did not end the cell with an error"
    return took, "\n".join(error["traceback"])


def _ranks_at_the_users_line(lines: list[str]) -> set[int]:
    """The ranks whose block says they stopped at ``time.sleep(30)``: ranks stopped at one line
    share a block (``ranks 1-3 (worker1-3): KeyboardInterrupt, at ...``)."""
    at = set()
    for i, line in enumerate(lines):
        m = re.match(r"ranks? ([\d,\-]+) \(", line)
        if m and i + 1 < len(lines) and "time.sleep(30)" in lines[i + 1]:
            at.update(expand_ranks(m.group(1)))
    return at


def test_ctrl_c_shows_each_rank_at_the_users_line_and_is_idle_at_once(world4, monkeypatch):
    monkeypatch.delenv("NBDIST_TRACEBACK", raising=False)
    times = []
    for _ in range(3):
        took, text = _interrupt_asleep(world4)
        times.append(took)
        lines = text.splitlines()
        assert len(lines) <= 12, text
        assert _ranks_at_the_users_line(lines) == {1, 2, 3, 4}, text
        assert '"<dist-cell-' in text, text
        assert not [own for own in OWN_FRAMES if own in text], text
    # the world and every rank's state survived
    _, out = _timed(world4, "%%dist\n(mine == os.getpid(), slept_here)")
    assert out.count("(True, 41)") == 4, out
    # best of three: the machine's load may hold one up, not the three
    assert min(times) <= IDLE_BUDGET, f"Ctrl-C to idle: {times}"
    assert max(times) <= 1.0, f"Ctrl-C to idle: {times}"


def test_every_frame_on_request_and_pdb_where_the_rank_stopped(world4):
    _timed(world4, "%env NBDIST_TRACEBACK=full")
    try:
        _, text = _interrupt_asleep(world4)
    finally:
        _timed(world4, "%env NBDIST_TRACEBACK=")
    # every frame: the notebook's own traceback, then one per distinct traceback of the ranks
    # (ranks stopped at one line share one)
    assert "cells.py" in text and text.count("Traceback (most recent call last)") >= 2, text
    blocks = re.findall(r"^--- ranks? ([\d,\-]+) \(", text, re.M)
    assert sorted(r for b in blocks for r in expand_ranks(b)) == [1, 2, 3, 4], text
    _, text = _interrupt_asleep(world4)
    assert "`%dist_debug 1` opens pdb where it stopped" in text
    out, prompts, status = world4.run_answering("%dist_debug 2", ["p slept_here + 1", "q"])
    assert status == "ok", out
    assert prompts and prompts[0] == "(Pdb worker2) ", prompts
    assert "[worker2] 42" in out, out  # the cell's own frame, not nbdist's signal handler
