"""NCCL process groups that never hang the notebook.

NCCL has no notion of a peer that died: a collective waits for it until the group's watchdog
timeout, and by default the watchdog then ends the whole process, which for rank 0 is the
notebook's kernel. So rank 0 joins with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the
communicator, keep the process) unless the user set it, and a world that stops, restarts or
loses a rank aborts the communicator (``ProcessGroup.abort``) before destroying the group, in a
thread it waits on for a bounded time. Workers keep torch's default: a worker that times out
ends, and its death is reported like any other.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..patches import process_group

__all__ = ["device_id", "end_group", "leave_group", "notebook_safe"]

_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def device_id(backend: str | None, device: str | None) -> Any:
    """What ``init_process_group(device_id=...)`` takes: the rank's GPU for NCCL (which binds
    the communicator to it at once), else None."""
    if backend != "nccl" or device is None:
        return None
    import torch

    return torch.device(device)


@contextlib.contextmanager
def notebook_safe(backend: str | None) -> Iterator[None]:
    """While rank 0 makes an NCCL group: a timed-out collective raises, the kernel lives."""
    if backend != "nccl" or _HANDLING in os.environ:
        yield
        return
    os.environ[_HANDLING] = "2"  # CleanUpOnly: read once, when the group is made
    try:
        yield
    finally:
        os.environ.pop(_HANDLING, None)


def end_group(timeout: float = 3.0) -> bool:
    """Abort this process's default group's communicators without waiting for any peer
    (pending collectives here fail at once), then destroy the group; in a thread waited on
    for ``timeout`` seconds. True if it finished in time."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    done = threading.Event()

    def run() -> None:
        abort = getattr(dist.group.WORLD, "abort", None)
        for step in (abort, process_group.destroy_own):
            try:
                if step is not None:
                    step()
            except Exception:  # noqa: BLE001 - already aborted, or gone
                pass
        done.set()

    threading.Thread(target=run, daemon=True, name="nbdist-nccl-end").start()
    return done.wait(timeout)


def leave_group() -> None:
    """End this process's default group, if any, without waiting for a peer that may be dead
    or inside a collective: NCCL's is aborted first (``end_group``), any other destroyed."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        end_group()
        return
    try:
        process_group.destroy_own()  # kept alive until freeing it cannot freeze (graveyard)
    except Exception:  # noqa: BLE001 - the group's peers may be gone
        pass
