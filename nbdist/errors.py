"""Every exception nbdist raises, in one place.

``NbdistError`` is the base of everything nbdist raises on purpose: ``ClusterStateError``,
``StartError``, ``WorkerDiedError``, ``DistTimeoutError``, ``NoRpcError``, and ``RemoteError``
(code raised on a worker, with its traceback) with its subclasses ``DistCellError`` (a ``%%dist``
cell) and ``DistCallError`` (a view's call; ``.results`` has the rest). ``CellInterrupted``
(Ctrl-C stopped a ``%%dist`` cell) is a ``KeyboardInterrupt`` instead.

Many ranks failing alike read as one: failures with the same type, message and frames form
one group (``failure_groups``), headed by its ranks written compactly (``[worker1-255]
ZeroDivisionError: ...``) and shown with one traceback, not one per rank.

User mistakes made through magics become ``IPython.core.error.UsageError`` in ``magics.py``;
the same mistakes through the Python API raise ``ValueError`` with the same message.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from . import tracebacks
from .rank_sets import SMALL, grouped, labels, named, rank_set

#: The exceptions user code may catch; the package exports them at its top (``nbdist.X``).
RAISED = ("CellInterrupted", "ClusterStateError", "DistCallError", "DistCellError",
          "DistTimeoutError", "NbdistError", "NoRpcError", "RemoteError", "StartError",
          "WorkerDiedError")
__all__ = [*RAISED, "RAISED", "RankFailure", "failure_groups", "ranks_named", "safe_str"]


class NbdistError(RuntimeError):
    """Base class of the errors nbdist raises on purpose.

    What to do: catch ``nbdist.NbdistError`` to handle them all; each subclass says its own
    cause and remedy, and its message names the rank and what it waited for."""


class ClusterStateError(NbdistError):
    """The call needs a running world and there is none, or the reverse.

    What to do: ``%dist_start N`` (``nbdist.start(N)``) before ``%%dist``, views or
    ``%dist_status``; ``%dist_restart`` or ``%dist_stop`` a running world before starting
    another. ``nbdist.current()`` says whether one runs."""


class StartError(NbdistError):
    """A world could not be started; nothing is left running.

    What to do: the message names the rank that failed and its traceback (an import error, a
    bad ``--hosts`` entry, a GPU plan that does not fit); fix that and start again. A start
    that only ran out of time takes ``--start-timeout``."""


class WorkerDiedError(NbdistError):
    """A worker rank died while something waited on it.

    What to do: the message says how it died (a signal, the OOM killer, an exit code);
    ``%dist_status`` shows every rank. ``%dist_restart --keep`` replaces the dead rank and keeps
    the others' state; ``--heal`` does it by itself next time."""

    def __init__(self, rank: int, name: str, reason: str, waiting_for: str = "") -> None:
        self.rank, self.name, self.reason = rank, name, reason
        what = f" while {waiting_for}" if waiting_for else ""
        super().__init__(f"rank {rank} ({name}) died{what}: {reason}")


class DistTimeoutError(NbdistError, TimeoutError):
    """A wait ran past its deadline.

    What to do: the message names the rank and what it waited for. A rank busy in a long call
    answers once it returns: interrupt the cell (Ctrl-C, the stop button) or raise the
    timeout (``%%dist --timeout``, ``--rpc-timeout``, ``--start-timeout``)."""


class NoRpcError(NbdistError):
    """Something that needs torch RPC ran in a world that has no RPC agent (``--no-rpc``,
    or a torch build without ``torch.distributed.rpc``).

    What to do: ``%dist_restart --rpc`` brings RPC back; in a ``--no-rpc`` world use
    ``%%dist`` cells and process-group collectives instead."""


@dataclass
class RankFailure:
    """What one rank raised: exception type name, message and formatted traceback."""

    rank: int
    name: str
    etype: str
    message: str
    traceback: str

    def headline(self) -> str:
        return f"[{self.name}] {self.etype}: {self.message}"

    def shape(self) -> tuple:
        """What makes two ranks' failures alike: type, message and frames (file, line,
        function); the rank's own name in a traceback's text does not count."""
        return (self.etype, self.message,
                tuple((f.file, f.line, f.func) for f in tracebacks.frames(self.traceback)))


def failure_groups(failures: list[RankFailure]) -> list[list[RankFailure]]:
    """``failures`` that are alike (``RankFailure.shape``) together, in the order each kind
    first came; up to ``SMALL`` of them each stays its own (a small world reads rank by
    rank, as it always did)."""
    if len(failures) <= SMALL:
        return [[f] for f in failures]
    return [members for _, members in grouped(failures, RankFailure.shape)]


def ranks_named(failures: list[RankFailure]) -> str:
    """``rank 2 (worker2)``, ``ranks 1 (worker1), 3 (worker3)``; past ``SMALL`` ranks
    ``255 ranks 1-255 (worker1-255)``."""
    if len(failures) > SMALL:
        return labels((f.rank, f.name) for f in failures)
    s = "s" if len(failures) > 1 else ""
    return f"rank{s} " + ", ".join(f"{f.rank} ({f.name})" for f in failures)


def _named(group: list[RankFailure]) -> str:
    return named((f.rank, f.name) for f in group)


def _blocks(failures: list[RankFailure]) -> list[str]:
    """A block per kind of failure: a blank line, its ranks, the first one's traceback."""
    lines: list[str] = []
    for group in failure_groups(failures):
        lines += ["", f"--- {_named(group)} ---", *group[0].traceback.rstrip("\n").splitlines()]
    return lines


def _group_headline(group: list[RankFailure]) -> str:
    first = group[0]
    names = rank_set(f.name for f in sorted(group, key=lambda f: f.rank))
    return f"[{names}] {first.etype}: {first.message}"


class RemoteError(NbdistError):
    """An exception raised by code running on another rank.

    What to do: read the rank's traceback, shown in place of nbdist's own frames;
    ``%dist_debug`` opens pdb at that rank's failure. ``failures`` has each rank's."""

    def __init__(self, failures: list[RankFailure], summary: str = "") -> None:
        self.failures = failures
        heads = "; ".join(_group_headline(g) for g in failure_groups(failures))
        super().__init__(summary + heads if summary else heads)

    def _render_traceback_(self) -> list[str]:
        """IPython calls this instead of printing our local frames: one block per kind of
        failure, its ranks above the first one's traceback."""
        return [f"{type(self).__name__}: {self.args[0]}", *_blocks(self.failures)]


class DistCellError(RemoteError):
    """A ``%%dist`` cell raised on some ranks; the others' output was still shown.

    What to do: the error names each failing rank with its traceback; ``%dist_debug RANK``
    opens pdb there. The ranks that did not fail keep what the cell defined."""


class DistCallError(RemoteError):
    """A view's call (``c[:].call``, ``push``, ``pull``, ...) raised or died on some ranks;
    ``results`` holds what the other ranks returned (``{rank: value}``).

    What to do: fix the failing ranks' cause (named with tracebacks) and call again, or use
    ``results`` when the others' answers are enough."""

    def __init__(self, failures: list[RankFailure], summary: str = "",
                 results: dict | None = None) -> None:
        super().__init__(failures, summary)
        self.results = results if results is not None else {}


class CellInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a cell on workers (still a ``KeyboardInterrupt``, so ``except
    Exception`` does not swallow it). ``failures``: what each rank that stopped raised;
    ``silent``: the ranks that had not answered yet. A notebook shows one short block per
    rank, where its code was, and none of nbdist's frames (``NBDIST_TRACEBACK=full``: all).

    What to do: nothing: the ranks are ready for the next cell and keep their state. A rank
    listed as silent is still busy in a call Python cannot interrupt; ``%dist_status`` shows
    it, ``%dist_restart --keep`` replaces it."""

    def __init__(self, failures: list[RankFailure], silent: list[str]) -> None:
        self.failures, self.silent = failures, silent
        super().__init__(f"interrupted on {ranks_named(failures)}" if failures
                         else "interrupted")

    def _render_traceback_(self) -> list[str]:
        """IPython calls this instead of printing the notebook's frames."""
        n = len(self.failures) + len(self.silent)
        head = f"KeyboardInterrupt: the cell was interrupted on {n} rank{'s' if n != 1 else ''}"
        if self.failures:
            head += f"; `%dist_debug {self.failures[0].rank}` opens pdb where it stopped"
        lines = [head]
        if tracebacks.full():
            own = "".join(traceback.format_exception(self)).rstrip("\n").splitlines()
            lines += own[:-1]  # the notebook's own frames (the last line: the head's)
            lines += _blocks(self.failures)
        else:
            for group in failure_groups(self.failures):
                f = group[0]
                lines += tracebacks.short_block(_named(group), f.etype, f.message,
                                                f.traceback)
        lines += [f"{label}: did not stop at once (busy outside Python?); still running the "
                  "cell" for label in self.silent]
        return lines


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming its type when ``__str__`` itself fails."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__}; str() failed>"
