"""The few calls into ``torch.cuda`` nbdist makes, and where each may run.

``visible`` runs in the notebook (which may use its GPU as it likes); ``take`` runs in a worker
right after the fork, before any user code; ``memory`` and ``utilisation`` answer
``%dist_status`` (``memory`` by RPC on the rank that owns the device). The warm template and
the join agents call none of them: they never initialise CUDA, which is what lets a notebook
that already uses its GPU start a world whose workers use theirs (a fork of a process that
initialised CUDA cannot use CUDA). NVML (``pynvml``, from ``nvidia-ml-py``) is optional.
"""

from __future__ import annotations

import os

__all__ = ["memory", "take", "utilisation", "visible"]


def visible() -> tuple[bool, int]:
    """Whether this torch sees CUDA, and how many GPUs (``CUDA_VISIBLE_DEVICES`` decides).
    Neither call creates a CUDA context."""
    import torch

    if not torch.cuda.is_available():
        return False, 0
    return True, torch.cuda.device_count()


def take(rank: int, name: str, device: str | None) -> None:
    """Make ``device`` this worker's current CUDA device (``None``: stay on the CPU).

    A worker forked from a process that had initialised CUDA cannot use it; torch's own
    message does not say which process, so this one does."""
    if device is None:
        return
    import torch

    if not torch.cuda.is_available():  # planned from a scheduler's allocation, not torch
        import sys

        print(f"nbdist: rank {rank} ({name}) was given {device} "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}) but this "
              "torch sees no CUDA here; it stays on the CPU", file=sys.stderr)
        return
    try:
        torch.cuda.set_device(torch.device(device))
    except RuntimeError as exc:
        if "forked subprocess" in str(exc):
            raise RuntimeError(
                f"rank {rank} ({name}) cannot use {device}: the process it was forked from "
                "had initialised CUDA (nbdist's template never does; was `import nbdist` run "
                "with a sitecustomize or a preload that touches torch.cuda?); restart the "
                "kernel, or start with --gpus none") from exc
        raise


def memory(device: str) -> tuple[float, float]:
    """MB allocated and reserved by torch's caching allocator on ``device`` in this process
    (0, 0 where CUDA was never initialised here, without initialising it)."""
    import torch

    if not torch.cuda.is_initialized():
        return 0.0, 0.0
    dev = torch.device(device)
    return (torch.cuda.memory_allocated(dev) / 2**20, torch.cuda.memory_reserved(dev) / 2**20)


def utilisation(index: int) -> float | None:
    """GPU ``index``'s utilisation in percent through NVML, or None without ``pynvml``.

    ``index`` counts the GPUs this process sees; NVML counts all of them, so a
    ``CUDA_VISIBLE_DEVICES`` of plain indices is translated (other forms: None)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        if shown:
            index = int(shown.split(",")[index])
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # noqa: BLE001 - a status column, never an error
        return None
