"""The notebook process's nbdist state, in one object: the active world, the warm template,
the runtime directory, the last settings, and the counters worlds draw from.

Interpreter exit (atexit) removes the runtime directory first (what a kill would leave),
then stops the template, which SIGKILLs every worker it forked, then the active world.
Displays register their own exit handler later, so it runs before this one (LIFO).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING

from ..errors import StartError
from ..proc.launch import Template
from ..proc.runtime import runtime_dir
from ..spec import WorldSpec

if TYPE_CHECKING:
    from .core import Cluster

__all__ = ["SESSION", "Session"]


class Session:
    """Everything nbdist keeps per notebook process between worlds."""

    def __init__(self) -> None:
        self.current: Cluster | None = None
        self.template: Template | None = None
        self.runtime_dir: str | None = None
        self.last_spec: WorldSpec | None = None
        self.exec_ids = itertools.count(1)  # cells and flush tokens, unique per process
        self.epochs = itertools.count(1)  # one per world: keeps RRef ids of worlds apart
        self.joiner: threading.Thread | None = None  # rank 0's init_rpc of a failed start

    def settle_joiner(self, deadline: float) -> None:
        """Before a new ``init_rpc``: let a failed start's joining thread end (it is bounded
        by that start's deadline); a new one must not run beside it."""
        joiner, self.joiner = self.joiner, None
        if joiner is None or not joiner.is_alive():
            return
        joiner.join(max(deadline - time.monotonic(), 0))
        if joiner.is_alive():
            self.joiner = joiner
            raise StartError("rank 0 is still inside init_rpc from the previous start, which "
                             "failed; it ends by that start's deadline: try again then")

    def runtime(self) -> str:
        """This process's private runtime directory, made on first use."""
        if self.runtime_dir is None or not os.path.isdir(self.runtime_dir):
            self.runtime_dir = runtime_dir()
        return self.runtime_dir

    def get_template(self) -> Template:
        """The warm template (started by ``ensure_started``; survives worlds)."""
        if self.template is None:
            self.template = Template(self.runtime())
        return self.template

    def template_pid(self) -> int | None:
        t = self.template
        return t.pid if t is not None and t.alive() else None

    def at_exit(self) -> None:
        """Quick on purpose: Jupyter gives a kernel a few seconds to exit before it kills it."""
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        try:
            if self.template is not None:
                self.template.close(timeout=2.0)
        finally:
            if self.current is not None:
                self.current.stop(timeout=1.0)


SESSION = Session()
atexit.register(SESSION.at_exit)
