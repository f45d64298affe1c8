"""Run torch's c10d tests with torch's own launcher (``MultiProcessTestCase``: every test spawns
a fresh process per rank) and write one outcome per line: ``python launch_main.py OUT.jsonl
test_name ...`` (plain torch: nothing of nbdist)."""

from __future__ import annotations

import json
import sys
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_rpc.launch_main import outcome_of  # noqa: E402

__all__ = ["main"]


def main(out: str, names: list[str]) -> None:
    """Run each test in its own ``unittest`` result, as torch's test runner does."""
    import runner

    with open(out, "a") as f:
        for name in names:
            result = unittest.TestResult()
            t0 = time.monotonic()
            runner.TestDistBackendWithSpawn(name).run(result)
            f.write(json.dumps({"id": f"TestDistBackendWithSpawn.{name}",
                                "outcome": outcome_of(result),
                                "seconds": round(time.monotonic() - t0, 2)}) + "\n")
            f.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
