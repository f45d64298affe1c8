"""Shared fixtures: real worlds, real kernels, real notebooks; everything started is stopped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "tests" / "artifacts"


def _descendants() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    """Poll until none of ``pids`` is alive (zombies count as gone); returns the survivors."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if alive:
            time.sleep(0.05)
    return alive


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
        if c.running:  # Cluster.stop is not idempotent: a second call writes to closed fds
            c.stop()


@pytest.fixture
def ipython():
    """An IPython shell with ``%load_ext nbdist``; any world it starts is stopped after."""
    from IPython.testing.globalipapp import get_ipython

    import nbdist

    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    yield ip
    nbdist.stop()


def run_notebook(path: Path, timeout: int = 600, env: dict | None = None,
                 save_to: Path | None = None):
    """Execute a notebook headless in a real kernel (cwd = its folder); returns it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if save_to is not None:
            save_to.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(save_to))
    return nb


def run_quick(name: str, timeout: int = 300):
    """Run ``notebooks/name`` in quick mode; returns (notebook, its text output, seconds)."""
    import time as _time

    t0 = _time.monotonic()
    nb = run_notebook(NOTEBOOKS / name, env={"NBDIST_QUICK": "1"}, timeout=timeout,
                      save_to=ARTIFACTS / name)
    return nb, cell_text(nb), _time.monotonic() - t0


def assert_follows_rules(name: str, forbidden: tuple[str, ...] = ()) -> None:
    """A committed tutorial notebook: story first, parameters cell, checks, stop, no outputs."""
    import nbformat

    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# 0")
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


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no child processes behind (the template may idle; it's ours)."""
    before = _descendants()
    yield
    from nbdist.cluster.session import SESSION as cl

    template_pid = cl.template.pid if cl.template is not None else None
    extra = _descendants() - before - {template_pid}
    left = wait_gone(extra, 5.0)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    assert not left, f"processes left behind: {left}"


sys.path.insert(0, str(ROOT / "tests"))
