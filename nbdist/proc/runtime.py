"""The private runtime directory: where control sockets, rendezvous files and logs live.

Security model: the base directory (``$XDG_RUNTIME_DIR/nbdist`` when that is usable, else
``$TMPDIR/nbdist-<uid>``) must be a real directory, not a symlink, owned by this uid; it is
opened with ``O_NOFOLLOW`` and every later step works relative to that descriptor, so a path
swapped under us cannot redirect it. A base that is ours but too open is tightened to 0700;
anything else is refused with a ``StartError`` that names the path and its owner. The sweep of
stale directories removes only real, self-owned directories named exactly as we name them
(``p<pid>-<8 chars>``) whose pid is dead, and never follows a symlink.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile

from ..errors import StartError

__all__ = ["pid_alive", "runtime_dir"]

# What ``tempfile.mkdtemp(prefix=f"p{pid}-")`` makes and what ``_make_private_subdir`` makes.
_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_ENTRY = re.compile(r"p([1-9][0-9]{0,9})-[a-z0-9_]{8}")
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def runtime_dir() -> str:
    """A fresh private (0700) directory for this process; stale ones of dead processes go.

    Raises ``StartError`` when the base directory is not one we can trust.
    """
    base = _base_path()
    fd = _open_private_base(base)
    try:
        _sweep_stale(fd)
        name = _make_private_subdir(fd)
        _check_still_same(base, fd)
    finally:
        os.close(fd)
    return os.path.join(base, name)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _base_path() -> str:
    """``$XDG_RUNTIME_DIR/nbdist`` if that runtime dir is ours and private, else the temp one."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        try:
            st = os.lstat(xdg)
        except OSError:
            st = None
        if (st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and stat.S_IMODE(st.st_mode) == 0o700):
            return os.path.join(xdg, "nbdist")
    return os.path.join(tempfile.gettempdir(), f"nbdist-{os.getuid()}")


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse(path: str, what: str) -> StartError:
    return StartError(
        f"nbdist will not use {path} as its private runtime directory: {what}. nbdist keeps "
        f"its control sockets there, so it must be a real directory owned by you "
        f"({_owner(os.getuid())}) with mode 0700. If it is a leftover, remove it "
        f"(`rm -rf {path}`); otherwise point nbdist elsewhere by setting TMPDIR to a directory "
        f"of your own (e.g. `export TMPDIR=$HOME/.cache/tmp` before starting Jupyter)")


def _open_private_base(base: str) -> int:
    """Create ``base`` (0700) if missing, open it without following links, check it is ours."""
    parent, name = os.path.split(base)
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StartError(f"cannot open {parent} to make nbdist's runtime directory there "
                         f"({exc.strerror}); set TMPDIR to a directory of your own") from exc
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StartError(f"cannot create nbdist's runtime directory {base} "
                             f"({exc.strerror}); set TMPDIR to a directory of your own") from exc
        try:
            fd = os.open(name, _O_DIR, dir_fd=pfd)
        except OSError as exc:
            st = _lstat_or_none(name, pfd)
            if st is not None and stat.S_ISLNK(st.st_mode):
                target = _readlink_or_unknown(name, pfd)
                what = f"it is a symbolic link (to {target}) owned by {_owner(st.st_uid)}"
            elif st is not None and exc.errno in (errno.ENOTDIR, errno.ELOOP):
                what = f"it is not a directory; it is owned by {_owner(st.st_uid)}"
            elif st is not None:
                what = (f"it cannot be opened ({exc.strerror}); it is owned by "
                        f"{_owner(st.st_uid)}")
            else:
                what = f"it cannot be opened ({exc.strerror})"
            raise _refuse(base, what) from exc
    finally:
        os.close(pfd)
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise _refuse(base, f"it is owned by {_owner(st.st_uid)}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)  # ours and real (checked on this very descriptor): tighten it
    return fd


def _lstat_or_none(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _readlink_or_unknown(name: str, dir_fd: int) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _sweep_stale(fd: int) -> None:
    """Remove ``p<pid>-xxxxxxxx`` directories of dead processes; leave everything else."""
    uid = os.getuid()
    for name in os.listdir(fd):
        match = _ENTRY.fullmatch(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        st = _lstat_or_none(name, fd)
        if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        if sys.version_info >= (3, 11):
            shutil.rmtree(name, dir_fd=fd, ignore_errors=True)  # fd-relative, links not followed
        else:  # pragma: no cover - 3.10: rmtree's own fd walk still refuses symlinks
            shutil.rmtree(os.path.join(f"/proc/self/fd/{fd}", name), ignore_errors=True)


def _make_private_subdir(fd: int) -> str:
    """``p<pid>-xxxxxxxx`` (0700) inside the base, made relative to its descriptor."""
    for _ in range(100):
        name = f"p{os.getpid()}-" + "".join(secrets.choice(_NAME_CHARS) for _ in range(8))
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            continue
        return name
    raise StartError("could not make a fresh directory in nbdist's runtime directory "
                     "after 100 tries; remove its contents or set TMPDIR elsewhere")


def _check_still_same(base: str, fd: int) -> None:
    """The path we return must still name the directory we checked."""
    st = os.fstat(fd)
    try:
        now = os.lstat(base)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise _refuse(base, "it was replaced while nbdist was setting it up")
