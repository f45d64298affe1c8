"""Shared fixtures: real worlds, real kernels, real notebooks; everything started is stopped.

Helpers every test file uses (import them: ``from conftest import wait_until``):

- ``expand_ranks(label)``: the ranks of a rank set (``worker1-4,7``).
- ``wait_until(predicate, timeout, what)``: poll until ``predicate()`` is truthy; a timeout fails
  the test saying what it waited for. Deadlines mean "it hangs": ≥ 10× the expected time.
- ``free_port()``, ``child_pids()``, ``wait_gone(pids)``, ``listening(pids)``.
- ``start_refused(shell, line)``: ``%dist_start line`` fails and starts nothing.
- ``WORLD_KINDS``: run a test in an RPC world and in one without RPC (``--no-rpc``).
- ``run_notebook`` / ``run_checked``: execute a notebook headless in a real kernel.

Fixtures: ``world`` (in-process worlds), ``ipython`` (a shell with ``%load_ext nbdist``),
``kernel`` / ``kernels`` (real Jupyter kernels, kernel_helpers.Kernel), and the autouse leak
guard, which after every test checks child processes, nbdist threads, open file descriptors,
per-world runtime directories and the working directory, naming the test that leaked.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "tests" / "artifacts"

sys.path.insert(0, str(ROOT / "tests"))
# hypothesis keeps its example database and caches in ./.hypothesis unless told otherwise: a
# file a test leaves in the working directory fails the leak guard
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.environ.get("TMPDIR", "/tmp"), "nbdist-hypothesis"))


# -- markers ----------------------------------------------------------------------------------
# `slow` for tests in files this module does not own the markers of (the rest carry their own
# decorators): notebook runs and tests of ~6-30 s on 2 cores; `make test-fast` leaves them out.
SLOW_ELSEWHERE = {
    "test_notebook_07.py::test_notebook_07_torchopt_parallel_quick",
    "test_bounded.py::test_a_million_records_from_four_ranks_cost_under_100_mb",
    "test_exit_clean.py::test_script_ending_while_the_dashboard_draws_a_file_exits_0",
    "test_interrupts.py::test_fifty_random_interrupts_leave_the_world_usable",
    "test_interrupts.py::test_random_interrupts_in_a_real_kernel",
    "test_autoinit_loopback.py::test_loopback_even_where_the_host_name_resolves_elsewhere",
    "test_notebook_00.py::test_quickstart_runs_headless_and_passes_its_checks",
    "test_output_live.py::test_nbconvert_keeps_one_output_per_rank_with_the_final_state",
}


def pytest_collection_modifyitems(config, items):
    """Add `slow` to SLOW_ELSEWHERE and `kernel` to every test that takes a kernel fixture."""
    for item in items:
        if item.nodeid.split("/")[-1] in SLOW_ELSEWHERE:
            item.add_marker(pytest.mark.slow)
        if {"kernel", "kernels"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kernel)


# -- helpers ----------------------------------------------------------------------------------
# A test that holds in both kinds of world runs in each: ``@WORLD_KINDS`` gives it ``kind``,
# "" or "--no-rpc", to append to `%dist_start`'s flags (``world(n, rpc=not kind)``).
WORLD_KINDS = pytest.mark.parametrize("kind", ["", "--no-rpc"], ids=["rpc", "no-rpc"])


def expand_ranks(label: str) -> list[int]:
    """``worker1-4,7`` or ``1-4,7`` -> [1, 2, 3, 4, 7]: the ranks a rank set names (the form
    ``nbdist.rank_sets`` writes for ``worker{rank}``)."""
    ranks: list[int] = []
    for part in label.removeprefix("worker").split(","):
        lo, _, hi = part.partition("-")
        ranks += range(int(lo), int(hi or lo) + 1)
    return ranks


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy, and return that.

    Fails the test after ``timeout`` seconds with "timed out after Ns waiting for <what>".
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 f" (last value: {value!r})")
        time.sleep(interval)


def start_refused(shell, line: str) -> str:
    """``%dist_start line`` raises UsageError and starts nothing (no world, no process but
    the warm template); returns the message."""
    from IPython.core.error import UsageError

    import nbdist
    from nbdist.cluster.session import session

    before = child_pids()
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("dist_start", line)
    assert nbdist.current() is None
    template = {session().template.pid} if session().template is not None else set()
    assert child_pids() - before - template == set()
    return str(info.value)


def ev(shell, expr: str):
    """Evaluate ``expr`` as a cell of the IPython ``shell``; its value, or its error raised."""
    res = shell.run_cell(f"__out = {expr}")
    if not res.success:
        raise res.error_in_exec or res.error_before_exec
    return shell.user_ns["__out"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(pids) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP listener these processes hold."""
    found = []
    for pid in pids:
        found += [(pid, c.laddr.ip, c.laddr.port)
                  for c in psutil.Process(pid).net_connections(kind="inet")
                  if c.status == psutil.CONN_LISTEN]
    return found


def child_pids(match: str | None = None) -> set[int]:
    """Pids of this process's descendants; with ``match``, only those whose command line
    contains one of the words in it (``"ipykernel nbdist"``)."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return set()
    if match is None:
        return {p.pid for p in procs}
    words = match.split()
    found = set()
    for p in procs:
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(w in line for w in words):
            found.add(p.pid)
    return found


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Poll until none of ``pids`` is alive (zombies count as gone); returns the survivors."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive:
        alive = [p for p in alive if not _gone(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive


# -- notebooks --------------------------------------------------------------------------------
def run_notebook(path: Path, timeout: int = 600, env: dict | None = None,
                 save_to: Path | None = None, cwd: Path | None = None):
    """Execute a notebook headless in a real kernel (cwd = ``cwd`` or its folder); returns it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    # nbclient handles SIGINT with asyncio's add_signal_handler, whose removal leaves Python's
    # default handler, whatever was there before (SIG_IGN in a pytest started in the background
    # by a non-interactive shell): put back what was there.
    sigint = signal.getsignal(signal.SIGINT)
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd or path.parent)}})
        client.execute()
    finally:
        signal.signal(signal.SIGINT, sigint)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if save_to is not None:
            save_to.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(save_to))
    return nb


def run_quick(name: str, timeout: int = 300, cwd: Path | None = None):
    """Run ``notebooks/name`` in quick mode; returns (notebook, its text output, seconds)."""
    t0 = time.monotonic()
    nb = run_notebook(NOTEBOOKS / name, env={"NBDIST_QUICK": "1"}, timeout=timeout,
                      save_to=ARTIFACTS / name, cwd=cwd)
    return nb, cell_text(nb), time.monotonic() - t0


def run_checked(name: str, timeout: int = 300, cwd: Path | None = None):
    """Run a tutorial notebook in quick mode and check what every tutorial promises: no error
    output, its checks cell passed, the world was stopped, no traceback printed.
    Returns (notebook, text output, seconds); the executed copy is in tests/artifacts/."""
    nb, text, seconds = run_quick(name, timeout=timeout, cwd=cwd)
    assert_no_errors(nb)
    assert "all checks passed" in text, text[-3000:]
    assert "nbdist: stopped" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return nb, text, seconds


def assert_follows_rules(name: str, forbidden: tuple[str, ...] = ()) -> None:
    """A committed tutorial notebook: story first, parameters cell, checks, stop, no outputs."""
    import nbformat

    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.cells[0].cell_type == "markdown" and re.match(r"# \d\d ", nb.cells[0].source)
    assert 'QUICK = os.environ.get("NBDIST_QUICK") == "1"' in code[0].source
    assert code[-1].source.strip() == "%dist_stop"
    assert "assert" in code[-2].source and "all checks passed" in code[-2].source
    for cell in code:
        assert not cell.get("outputs") and cell.get("execution_count") is None, cell.source
        for word in ("%%writefile", "!python", *forbidden):
            assert word not in cell.source, (word, cell.source)


def assert_no_errors(nb) -> None:
    """No cell of an executed notebook left an error output."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out


def cell_text(nb) -> str:
    """All stream and text outputs of an executed notebook, joined."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "".join(parts)


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def page():
    """A headless Chromium page (Playwright with the system's Chromium, no download); skips
    or fails as ``browser_helpers.chromium`` says where there is none."""
    from browser_helpers import CHROMIUM_ARGS, chromium
    from playwright.sync_api import sync_playwright

    path = chromium()
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 1600})
            yield context.new_page()
        finally:
            browser.close()
    finally:
        pw.stop()


@pytest.fixture
def world():
    """A factory for in-process worlds: ``world(2, name="agent")``; always stopped after."""
    import nbdist

    started = []

    def make(n: int = 2, **kw):
        c = nbdist.start(n, quiet=True, **kw)
        started.append(c)
        return c

    yield make
    c = nbdist.current()
    if c is not None:
        c.stop()
    for c in started:
        c.stop()  # idempotent


@pytest.fixture
def ipython():
    """An IPython shell with ``%load_ext nbdist``; any world it starts is stopped after."""
    from IPython.testing.globalipapp import get_ipython

    import nbdist

    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    yield ip
    nbdist.stop()


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises KeyboardInterrupt in this process, as in a notebook, even where pytest was
    started in the background by a non-interactive shell (which leaves SIGINT ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def kernels():
    """A factory for real Jupyter kernels (``kernels()`` → kernel_helpers.Kernel); every one
    is shut down after the test, whatever happened."""
    from kernel_helpers import Kernel

    started = []

    def make(**kw):
        k = Kernel(**kw)
        started.append(k)
        return k

    yield make
    for k in started:
        k.close()


@pytest.fixture
def kernel(kernels):
    """One real Jupyter kernel, shut down after the test."""
    return kernels()


@contextlib.contextmanager
def notebook_process(tmp_path: Path, start: str, timeout: float):
    """A notebook stand-in: a Python process that runs ``start`` (its world's start call,
    ``session`` imported), says it is ready with the allocation's id in a file, then waits on
    its stdin; yields (process, that id). Killed at the end if it still runs.

    The id goes in a file, not on stdout: torch <= 2.10 prints Gloo's "[Gloo] Rank 0 is
    connected ..." on rank 0's stdout first, and a test reading a pipe until the child exits
    would wait for a child that waits on its stdin."""
    script, ready = tmp_path / "nb.py", tmp_path / "ready"
    script.write_text("import nbdist, pathlib, sys\n"
                      "from nbdist.cluster.session import session\n"
                      f"{start}\n"
                      f"pathlib.Path({str(ready)!r}).write_text(session().allocation.job_id)\n"
                      "sys.stdin.read()\n")
    log = open(tmp_path / "nb.log", "w+")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NBDIST_PREWARM": "0"})
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout,
                   "the notebook process to start its world")
        if not ready.exists():
            log.seek(0)
            raise AssertionError(f"the notebook process exited {proc.returncode}: {log.read()}")
        yield proc, ready.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdin.close()
        log.close()


# -- the leak guard ---------------------------------------------------------------------------
# fds a test may leave open: handles torch and the libraries open once per process, lazily
FD_SLACK = 2
THREAD_GRACE = 5.0  # seconds for nbdist threads to end after a stop (their joins are bounded)
# Threads that live as long as the warm template or the process, not one world:
PROCESS_THREADS = {"nbdist-template-reader", "nbdist-send-the template process",
                   "nbdist-stderr-filter", "nbdist-warmup-import"}  # once, until torch is in


def _nbdist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("nbdist-") and t.name not in PROCESS_THREADS
                  and t.is_alive())


def _fds() -> dict[int, str]:
    """Open fds and what they point to, but TensorPipe's shared-memory segments: torch's RPC
    context of the last world (and its ~24 segments per peer, and with device maps its CUDA
    IPC segment) lives until the next world starts (startup resets the RRefContext singleton
    then), so their count follows the last world's size, not leaks; nor font files, which
    matplotlib's font cache keeps open."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own fd, or one closed meanwhile
        if ("tensorpipe_shm" not in target and "/cuda.shm." not in target  # CUDA IPC: as shm
                and not target.endswith((".ttf", ".otf"))):
            found[int(name)] = target
    return found


def _process_fds() -> set[int]:
    """fds that live as long as the warm template or the process: the template's channel,
    the stderr filter's pipe and saved stderr."""
    from nbdist.cluster.session import session

    keep = set()
    t = session().template
    conn = getattr(t, "conn", None) if t is not None else None
    try:
        if conn is not None and not conn.closed:
            keep.add(conn.fileno())
    except (OSError, ValueError):
        pass
    return keep


def _world_dirs() -> set[str]:
    from nbdist.cluster.session import session

    rt = session().runtime_dir
    if rt is None or not os.path.isdir(rt):
        return set()
    return {os.path.join(rt, d) for d in os.listdir(rt) if d.startswith("w")}


@pytest.fixture(autouse=True, scope="session")
def warm_process():
    """Start and stop one world and make the IPython shell before the first test, so the
    handles a process opens once (torch's TensorPipe shared-memory pool and event fds, the
    stderr filter, the warm template's channel, IPython's history database, zmq's shared
    context, jupyter_client's event loop) are not counted as the first test's leak.
    Costs one world start (~3 s)."""
    import zmq
    from IPython.testing.globalipapp import get_ipython
    from jupyter_core.utils import ensure_event_loop

    import nbdist

    if os.environ.get("NBDIST_TEST_NO_WARM") == "1":  # a pytest run inside a test
        yield
        return
    get_ipython()
    zmq.Context.instance()  # kernel clients share it; it lives as long as the process
    ensure_event_loop()  # jupyter_client's sync calls run on this thread's kept event loop
    nbdist.start(1, quiet=True).stop()
    yield


@pytest.fixture(autouse=True)
def leak_guard(request, warm_process):
    """After every test: no child process (but the warm template), no nbdist thread, no new
    open fd (beyond FD_SLACK), no per-world runtime directory, nothing new in the working
    directory, the SIGINT handler as it was. The failure names the test and what it left."""
    from nbdist.cluster.session import session
    test = request.node.nodeid
    procs, fds = child_pids(), _fds()
    threads_before = set(_nbdist_threads())
    dirs_before = _world_dirs()
    cwd = os.getcwd()
    cwd_before = set(os.listdir(cwd))
    sigint_before = signal.getsignal(signal.SIGINT)
    yield
    problems = []

    if signal.getsignal(signal.SIGINT) is not sigint_before:  # Ctrl-C would go elsewhere
        problems.append(f"SIGINT handler {signal.getsignal(signal.SIGINT)!r} "
                        f"(was {sigint_before!r})")
        signal.signal(signal.SIGINT, sigint_before)

    template_pid = session().template.pid if session().template is not None else None
    left = wait_gone(child_pids() - procs - {template_pid}, 5.0)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    if left:
        problems.append(f"processes {left}")

    try:
        wait_until(lambda: not (set(_nbdist_threads()) - threads_before), THREAD_GRACE,
                   "nbdist threads to end")
    except AssertionError:
        problems.append(f"threads {sorted(set(_nbdist_threads()) - threads_before)}")

    try:
        wait_until(lambda: not (_world_dirs() - dirs_before), THREAD_GRACE,
                   "world runtime directories to be removed")
    except AssertionError:
        problems.append(f"runtime directories {sorted(_world_dirs() - dirs_before)}")

    marker = request.node.get_closest_marker("fd_slack")  # a library's own per-process fds
    slack = marker.args[0] if marker is not None else FD_SLACK
    try:
        wait_until(lambda: len(set(_fds()) - set(fds) - _process_fds()) <= slack, THREAD_GRACE,
                   "open file descriptors to be closed")
    except AssertionError:
        now = _fds()
        new = {fd: now[fd] for fd in sorted(set(now) - set(fds) - _process_fds())}
        problems.append(f"{len(new)} more open file descriptors (slack {slack}): {new}")

    new_files = sorted(set(os.listdir(cwd)) - cwd_before)
    if new_files:
        problems.append(f"new files in the working directory {cwd}: {new_files}")

    if problems:
        import nbdist

        nbdist.stop()  # so the next test starts clean
        pytest.fail(f"{test} left behind: " + "; ".join(problems), pytrace=False)
