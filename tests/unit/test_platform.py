"""nbdist runs on Linux only: elsewhere ``import nbdist`` and ``%load_ext nbdist`` say so in one
line (faked here: ``sys.platform`` set in a subprocess before nbdist is imported)."""

from __future__ import annotations

import subprocess
import sys

from nbdist.linux import message

PLAIN = r"""
import sys
sys.platform = sys.argv[1]
import nbdist
"""

IN_IPYTHON = r"""
import sys
from IPython.testing.globalipapp import get_ipython
ip = get_ipython()
sys.platform = sys.argv[1]
for cell in ("import nbdist", "%load_ext nbdist"):  # the second import checks again
    print("CELL", cell, flush=True)
    result = ip.run_cell(cell)
    print("FAILED" if result.error_in_exec is not None else "PASSED", flush=True)
"""


def _run(code: str, platform: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, platform], capture_output=True,
                          text=True, timeout=120)


def test_the_line_names_the_platform_the_reasons_and_wsl2():
    line = message("win32")
    assert "\n" not in line and line.startswith("nbdist runs on Linux only, not on win32")
    for reason in ("fork", "unix sockets", "/proc", "WSL2"):
        assert reason in line


def test_import_on_another_platform_fails_with_the_one_line():
    out = _run(PLAIN, "darwin")
    assert out.returncode != 0
    assert out.stderr.splitlines()[-1] == "nbdist.linux.NotLinuxError: " + message("darwin")
    assert "fcntl" not in out.stderr and "socket" not in out.stderr.replace("unix sockets", "")


def test_import_and_load_ext_in_ipython_show_only_the_line():
    out = _run(IN_IPYTHON, "win32")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert lines == ["CELL import nbdist", message("win32"), "FAILED",
                     "CELL %load_ext nbdist", message("win32"), "FAILED"], lines


def test_linux_imports_as_usual():
    out = _run(PLAIN, "linux")
    assert out.returncode == 0, out.stderr[-3000:]
