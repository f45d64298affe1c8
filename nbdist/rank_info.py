"""A rank as the notebook's table of a world sees it (``RankInfo``), and how a rank's
process ended, in words (``describe_exit``): plain data, below every room that shows ranks."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["RankInfo", "describe_exit"]


def describe_exit(code: int | None) -> str:
    """Human words for an exit code from ``os.waitstatus_to_exitcode``."""
    if code is None:
        return "running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = {"SIGSEGV": " (segmentation fault)", "SIGKILL": " (the OOM killer, or kill -9)",
                "SIGABRT": " (aborted)", "SIGBUS": " (bus error)"}.get(name, "")
        return f"killed by {name}{what}"
    return f"exited with code {code}"


@dataclass
class RankInfo:
    """One rank: who it is, its process, its control channel, and how it ended."""

    rank: int
    name: str
    pid: int | None = None
    started: float = 0.0
    channel: Any = None  # its ``control.channel.Channel``, once it connected
    ready: bool = False
    exit_code: int | None = None
    failure: str | None = None
    host: str | None = None  # None: the notebook's machine
    lost: str | None = None  # why its host was lost, if it was
    device: str | None = None  # "cuda:i" where the rank runs on a GPU

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.exit_code is None

    def reason(self) -> str:
        """How it ended, in words, with the last line of a start-up traceback if any."""
        if self.lost:
            return f"lost with its host {self.host} ({self.lost})"
        text = describe_exit(self.exit_code)
        if self.failure:
            last = self.failure.strip().splitlines()[-1]
            text += f" after: {last}"
        return text

    def label(self) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"rank {self.rank} ({self.name}){where}"
