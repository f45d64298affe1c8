"""torch's RPC imported in the notebook on a background thread the session owns, so that
``%load_ext nbdist`` returns at once and the first ``%dist_start`` finds it done.

Contract: ``start`` returns at once (once per process); nothing in the caller's thread imports
torch. The thread lets ``PAUSE`` pass first (the starting cell's reply goes out before the import
holds the GIL), then imports ``torch`` itself before any submodule. A cell that imports torch
meanwhile waits for the rest of the import; a cell that names torch waits for ``wait`` before it
runs (``%load_ext`` registers that), as Python would run its submodule beside a half-imported
torch. ``close`` (interpreter exit) waits a moment: an import under way cannot be stopped.
``imported(name)`` says whether a module is in ``sys.modules`` and done.
"""

from __future__ import annotations

import enum
import sys
import threading
import time

__all__ = ["MODULE", "Warmup", "WarmupState", "imported", "names_torch"]

MODULE = "torch.distributed.rpc"  # what rank 0 needs to join a world; it imports torch
PAUSE = 0.05  # s: the starting cell's reply goes out before the import takes the GIL


class WarmupState(enum.Enum):
    IDLE = "idle"  # not started: NBDIST_PREWARM=0, or not asked yet
    IMPORTING = "importing"  # the thread is importing torch
    DONE = "done"  # the import ended (imported, or failed: %dist_start says why)
    CLOSED = "closed"  # the process is exiting


def imported(name: str) -> bool:
    """``name`` and its parent packages are imported and done: no thread is still running
    the body of any (``torch/__init__`` imports ``torch.distributed.rpc`` half-way through)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
    return True


def names_torch(source: str) -> bool:
    """Whether a cell's source may import torch or one of its submodules."""
    return "torch" in source


class Warmup:
    """One background import of torch's RPC per process."""

    def __init__(self) -> None:
        self.state = WarmupState.IDLE
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Begin the import on a daemon thread unless it is done or under way; True if it
        was started now. Returns at once."""
        with self._lock:
            if self.state is not WarmupState.IDLE:
                return False
            if imported(MODULE):
                self.state = WarmupState.DONE
                return False
            self.state = WarmupState.IMPORTING
            self._thread = threading.Thread(target=self._run, name="nbdist-warmup-import",
                                            daemon=True)
            self._thread.start()
            return True

    @property
    def importing(self) -> bool:
        return self.state is WarmupState.IMPORTING

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the import to end; True if it is not running."""
        thread = self._thread
        if thread is not None:
            thread.join(max(timeout, 0.0))
        return not self.importing

    def close(self, timeout: float) -> None:
        """At exit: wait ``timeout`` seconds at most for an import under way."""
        self.wait(timeout)
        with self._lock:
            self.state = WarmupState.CLOSED

    def _run(self) -> None:
        try:
            time.sleep(PAUSE)
            import torch  # noqa: F401 - first: the top-level lock alone, see above
            import torch.distributed.rpc  # noqa: F401 - MODULE
        except Exception:  # noqa: BLE001 - %dist_start imports it again and says why
            pass
        finally:
            with self._lock:
                if self.state is WarmupState.IMPORTING:
                    self.state = WarmupState.DONE
