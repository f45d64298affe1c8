"""The private runtime directory: trusted only when it is ours, swept only where it is ours.

Real directories under ``tmp_path``; ``TMPDIR`` and ``XDG_RUNTIME_DIR`` point there. Another
user's directory is simulated with ``os.chown`` (root only).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from nbdist.errors import StartError
from nbdist.proc.runtime import runtime_dir

OTHER_UID = 54321
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown to another uid")


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


def _tree(path: Path) -> dict[str, tuple[int, int, bool]]:
    """Every entry under ``path``: mode, owner, is-link (to see that nothing was touched)."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_mode, st.st_uid, p.is_symlink())
    return out


@pytest.fixture
def tmp_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``TMPDIR`` = a fresh folder, no ``XDG_RUNTIME_DIR``; returns the expected base path."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its answer
    return tmp / f"nbdist-{os.getuid()}"


def _check_fresh(path: str, base: Path) -> None:
    p = Path(path)
    assert p.parent == base and p.is_dir() and not p.is_symlink()
    assert p.name.startswith(f"p{os.getpid()}-") and len(p.name.split("-", 1)[1]) == 8
    assert stat.S_IMODE(p.lstat().st_mode) == 0o700
    assert stat.S_IMODE(base.lstat().st_mode) == 0o700


def test_fresh_base_is_made_private(tmp_env: Path):
    path = runtime_dir()
    _check_fresh(path, tmp_env)
    assert runtime_dir() != path  # a fresh one each call


def test_planted_symlink_is_refused_and_its_target_untouched(tmp_env: Path, tmp_path: Path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / f"p{_dead_pid()}-abcdefgh").mkdir()  # would be "stale" if we followed the link
    (victim / "data.txt").write_text("keep")
    before = _tree(victim)
    tmp_env.symlink_to(victim)
    with pytest.raises(StartError) as info:
        runtime_dir()
    msg = str(info.value)
    assert str(tmp_env) in msg and "symbolic link" in msg and str(victim) in msg
    assert "TMPDIR" in msg and "rm -rf" in msg
    assert _tree(victim) == before and tmp_env.is_symlink()


def test_a_file_in_its_place_is_refused(tmp_env: Path):
    tmp_env.write_text("not a directory")
    with pytest.raises(StartError, match="not a directory"):
        runtime_dir()
    assert tmp_env.read_text() == "not a directory"


@as_root
def test_another_users_directory_is_refused_naming_path_and_owner(tmp_env: Path):
    tmp_env.mkdir(mode=0o700)
    stale = tmp_env / f"p{_dead_pid()}-abcdefgh"
    stale.mkdir()
    os.chown(tmp_env, OTHER_UID, OTHER_UID)
    with pytest.raises(StartError) as info:
        runtime_dir()
    msg = str(info.value)
    assert str(tmp_env) in msg and f"owned by uid {OTHER_UID}" in msg
    assert stale.is_dir() and len(list(tmp_env.iterdir())) == 1  # nothing swept, nothing made


def test_our_own_loose_directory_is_tightened(tmp_env: Path):
    tmp_env.mkdir()
    tmp_env.chmod(0o755)
    _check_fresh(runtime_dir(), tmp_env)


def test_sweep_removes_only_dead_entries_named_as_we_name_them(tmp_env: Path, tmp_path: Path):
    dead = _dead_pid()
    tmp_env.mkdir(mode=0o700)
    stale = tmp_env / f"p{dead}-k3_x9zq1"
    (stale / "w1").mkdir(parents=True)
    (stale / "w1" / "rpc").write_text("x")
    live = tmp_env / f"p{os.getpid()}-abcdefgh"
    live.mkdir()
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    odd = {
        "pdf-x": "dir", "p-abcdefgh": "dir", f"p{dead}x-abcdefgh": "dir",
        f"p{dead}-abcdefghi": "dir", f"p{dead}-abc": "dir", f"p{dead}-ABCDEFGH": "dir",
        f"p0{dead}-abcdefgh": "dir", f"p{dead}-abcdefgh": "file", f"p{dead}-zzzzzzzz": "link",
        "p99999999999-abcdefgh": "dir", "notes": "file",
    }
    for name, kind in odd.items():
        p = tmp_env / name
        if kind == "dir":
            p.mkdir()
        elif kind == "file":
            p.write_text("x")
        else:
            p.symlink_to(outside)
    outside_before = _tree(outside)
    path = runtime_dir()
    _check_fresh(path, tmp_env)
    assert not stale.exists()
    assert live.is_dir()
    for name in odd:
        assert os.path.lexists(tmp_env / name), name
    assert _tree(outside) == outside_before


@as_root
def test_sweep_leaves_a_stale_looking_entry_of_another_user(tmp_env: Path):
    tmp_env.mkdir(mode=0o700)
    theirs = tmp_env / f"p{_dead_pid()}-abcdefgh"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    runtime_dir()
    assert theirs.is_dir()


def test_xdg_runtime_dir_is_preferred_when_usable(tmp_env: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    xdg.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    _check_fresh(runtime_dir(), xdg / "nbdist")
    assert not tmp_env.exists()


@pytest.mark.parametrize("problem", ["loose mode", "symlink", "missing", "relative"])
def test_unusable_xdg_runtime_dir_falls_back_to_tmpdir(tmp_env: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       problem: str):
    real = tmp_path / "real-xdg"
    real.mkdir(mode=0o700)
    real.chmod(0o700)
    xdg = {"loose mode": real, "symlink": tmp_path / "xdg-link",
           "missing": tmp_path / "nope", "relative": Path("relative/xdg")}[problem]
    if problem == "loose mode":
        real.chmod(0o755)
    elif problem == "symlink":
        xdg.symlink_to(real)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    _check_fresh(runtime_dir(), tmp_env)
    assert not (real / "nbdist").exists()


def test_start_with_a_planted_symlink_fails_cleanly(tmp_path: Path):
    """End to end, in a fresh notebook-like process: StartError, no process left running."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp / f"nbdist-{os.getuid()}").symlink_to(victim)
    script = textwrap.dedent("""
        import json, psutil, nbdist
        from nbdist.errors import StartError
        try:
            nbdist.start(1, quiet=True)
            out = {"error": None}
        except StartError as exc:
            out = {"error": str(exc)}
        finally:
            nbdist.stop()
        out["children"] = [p.pid for p in psutil.Process().children(recursive=True)]
        print("RESULT " + json.dumps(out))
    """)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    env.pop("XDG_RUNTIME_DIR", None)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, text
    out = json.loads(text.split("RESULT ", 1)[1])
    assert out["error"] and "symbolic link" in out["error"], out
    assert out["children"] == []
    assert list(victim.iterdir()) == []  # the leak guard checks our own children
