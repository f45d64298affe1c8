"""Clean exits: an IPython script that starts a world and a dashboard exits 0, every time,
with no nbdist thread drawing during interpreter shutdown and nothing left in its cwd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

IPYTHON = Path(sys.executable).with_name("ipython")
RUNS = 8

SCRIPT = """\
%load_ext nbdist
%dist_start 2
import nbdist
d = nbdist.dashboard()
%dist_stop
"""

# a dashboard that keeps drawing a file (outside the cwd) while the script ends
BUSY = """\
%load_ext nbdist
%dist_start 2
import nbdist
d = nbdist.dashboard(save_to={picture!r}, hz=50)
get_ipython().run_cell_magic("dist", "", "import nbdist\\nfor i in range(3000):\\n"
                             "    nbdist.log(reward=i % 17)\\n")
"""


def _run(script: str, cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess:
    path = cwd.parent / f"{cwd.name}.ipy"
    path.write_text(script)
    env = dict(os.environ, NBDIST_TEMPLATE_IDLE="30")
    try:
        return subprocess.run([str(IPYTHON), "--no-banner", "--quick", str(path)], cwd=cwd,
                              env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        path.unlink()


def _check(proc: subprocess.CompletedProcess, cwd: Path) -> None:
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert os.listdir(cwd) == [], f"left in the cwd: {os.listdir(cwd)}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_script_with_a_dashboard_exits_0_eight_times_and_leaves_the_cwd_empty(tmp_path):
    """Eight runs in a row (twenty until CI's time counted: each run is ~5 s of a fresh
    interpreter, a world and a dashboard)."""
    failures = []
    for i in range(RUNS):
        cwd = tmp_path / f"run{i}"
        cwd.mkdir()
        proc = _run(SCRIPT, cwd)
        if proc.returncode != 0 or os.listdir(cwd):
            failures.append((i, proc.returncode, os.listdir(cwd), proc.stderr[-1000:]))
    assert not failures, f"{len(failures)}/{RUNS} runs were not clean: {failures[:3]}"


def test_script_ending_while_the_dashboard_draws_a_file_exits_0(tmp_path):
    picture = tmp_path / "pictures" / "live.png"
    picture.parent.mkdir()
    for i in range(2):
        cwd = tmp_path / f"busy{i}"
        cwd.mkdir()
        _check(_run(BUSY.format(picture=str(picture)), cwd), cwd)
        assert picture.read_bytes().startswith(b"\x89PNG")
        assert os.listdir(picture.parent) == ["live.png"], "a temporary file was left"
