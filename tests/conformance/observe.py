"""What one run of a case observed, rank by rank, whichever way it ran.

``Run.ranks`` maps each process (``r1``, ``p0``, ``parent``, ``all``) to its observations in
order: what the program recorded (``prelude.record``), then ``printed`` (the lines it printed
on stdout) and ``said`` (lines starting ``nbdist:``, on either stream). Output is told apart
by the prefix each launcher puts on a rank's lines (``[default1]:`` from ``torchrun --tee``,
``[worker1]`` from a world; none: rank 0); a ``spawn`` case's lines all go under ``all``,
since a script's spawned processes share one unprefixed stdout.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Run", "add_output", "read_records", "split_by_rank", "uncaught"]


@dataclass
class Run:
    """One run of a case: per-rank observations, and how the run ended."""

    ranks: dict[str, dict[str, object]] = field(default_factory=dict)
    failed: bool = False  # the script exited non-zero, or the cell ended in an error
    raised: list[str] = field(default_factory=list)  # "r1 NameError": uncaught, by rank
    seconds: float = 0.0
    text: str = ""  # everything it printed, for a failure's message


def read_records(out: Path) -> dict[str, dict[str, object]]:
    """``{who: {key: value}}`` from the ``<who>.jsonl`` files a run's processes wrote."""
    ranks: dict[str, dict[str, object]] = {}
    for path in sorted(out.glob("*.jsonl")):
        seen = ranks.setdefault(path.stem, {})
        for line in path.read_text().splitlines():
            key, value = json.loads(line)
            seen[key] = value
    return ranks


def split_by_rank(text: str, prefix: str, unprefixed: str | None = "r0"
                  ) -> dict[str, list[str]]:
    """Lines of ``text`` by rank: ``prefix`` is a regex whose group 1 is the rank number at
    the start of a line; a line without it is ``unprefixed``'s (None: left out)."""
    by_rank: dict[str, list[str]] = {}
    pattern = re.compile(prefix)
    for line in text.splitlines():
        m = pattern.match(line)
        who, line = (f"r{m.group(1)}", line[m.end():]) if m else (unprefixed, line)
        if who is not None:
            by_rank.setdefault(who, []).append(line)
    return by_rank


def uncaught(by_rank: dict[str, list[str]]) -> list[str]:
    """``"r1 NameError"`` for each traceback's last line (``NameError: ...``) of a rank."""
    found = []
    for who, lines in sorted(by_rank.items()):
        for line in lines:
            m = re.match(r"(\w+(?:Error|Exception)): ", line)
            if m:
                found.append(f"{who} {m.group(1)}")
    return found


def add_output(run: Run, style: str, stdout: dict[str, list[str]],
               stderr: dict[str, list[str]]) -> None:
    """Put each rank's printed lines and nbdist lines into ``run.ranks``."""
    if style == "spawn":  # one shared stdout: compared as a whole
        stdout = {"all": sorted(line for lines in stdout.values() for line in lines)}
        stderr = {"all": [line for lines in stderr.values() for line in lines]}
        whos = {"all"}
    else:
        whos = set(stdout) | set(stderr) | set(run.ranks)
    for who in sorted(whos):
        out, err = stdout.get(who, []), stderr.get(who, [])
        printed = [line for line in out if line.strip() and not line.startswith("nbdist:")]
        said = [line for line in out + err if line.startswith("nbdist:")]
        if printed or said or who in run.ranks or who == "all":
            run.ranks.setdefault(who, {}).update(printed=printed, said=said)
