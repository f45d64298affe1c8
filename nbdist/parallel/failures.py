"""The errors ``nbdist.parallel`` raises: a failed partition, a failed barrier.

Both say which rank (number and worker name) is at fault, and a failed partition carries the
original exception's type, message and remote traceback; IPython shows the remote traceback
instead of our local frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NbdistError, RankFailure, RemoteError

__all__ = ["BarrierError", "PartitionError", "PartitionFailure"]


@dataclass
class PartitionFailure(RankFailure):
    """One failed partition: where it ran (rank, name), which one it was, and what it raised."""

    partition: int = 0
    partitions: int = 1

    def headline(self) -> str:
        where = f"rank {self.rank} ({self.name})"
        if self.partitions > 1:
            where += f", partition {self.partition + 1} of {self.partitions}"
        return f"{where}: {self.etype}: {self.message}"


class PartitionError(RemoteError):
    """A remote call failed on one or more of the ranks its partitions ran on.

    ``failures`` lists every failed partition; ``rank``, ``worker_name``, ``etype`` and
    ``message`` describe the first. The original exception, when it could travel back, is the
    ``__cause__``.
    """

    def __init__(self, func_name: str, failures: list[PartitionFailure]) -> None:
        self.func_name = func_name
        self.failures = list(failures)  # type: ignore[assignment]
        first = self.failures[0]
        self.rank, self.worker_name = first.rank, first.name
        self.etype, self.message = first.etype, first.message
        heads = "; ".join(f.headline() for f in self.failures)
        NbdistError.__init__(self, f"{func_name} failed on {heads}")

    def __reduce__(self) -> tuple:
        """Pickle with its failures (a nested remote call sends it back whole)."""
        return (type(self), (self.func_name, self.failures))


class BarrierError(NbdistError):
    """A barrier could not complete: ranks never arrived, died, or the leader gave up.

    ``missing`` names the workers that had not arrived when it failed.
    """

    def __init__(self, message: str, missing: list[str] | None = None) -> None:
        self.missing = list(missing or [])
        super().__init__(message)

    def __reduce__(self) -> tuple:
        return (type(self), (self.args[0], self.missing))
