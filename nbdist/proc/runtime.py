"""The private runtime directory: where control sockets, rendezvous files and logs live."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

__all__ = ["pid_alive", "runtime_dir"]


def runtime_dir() -> str:
    """A fresh private (0700) directory for this process; stale ones of dead processes go."""
    base = os.path.join(tempfile.gettempdir(), f"nbdist-{os.getuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    for stale in glob.glob(os.path.join(base, "p*-*")):
        pid = int(os.path.basename(stale)[1:].split("-")[0])
        if not pid_alive(pid):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"p{os.getpid()}-", dir=base)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
