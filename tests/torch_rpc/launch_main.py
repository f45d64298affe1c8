"""Run torch's RPC tests with torch's own launcher and write one outcome per line:
``python launch_main.py OUT.jsonl Class.test ...`` (plain torch: nothing of nbdist)."""

from __future__ import annotations

import json
import re
import sys
import unittest

__all__ = ["outcome_of"]

# MultiProcessTestCase's failure text names each process that raised, then its traceback
_PROCESS = re.compile(r"Process (\d+) exited with error code \d+ and exception:\n(.*?)"
                      r"(?=\nProcess \d+ exited|\Z)", re.S)
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure))\b", re.M)


def outcome_of(result: unittest.TestResult) -> dict:
    """The outcome of the one test ``result`` saw."""
    problems = result.errors + result.failures
    if problems:
        text = problems[0][1]
        errors = []
        for rank, tb in _PROCESS.findall(text):
            raised = _RAISED.findall(tb)
            errors.append(f"r{rank} {raised[-1].rsplit('.', 1)[-1] if raised else 'unknown'}")
        if not errors:  # raised in the launcher itself (a timeout, a return code)
            raised = _RAISED.findall(text)
            errors = [f"r? {raised[-1].rsplit('.', 1)[-1] if raised else 'unknown'}"]
        return {"outcome": "fail", "errors": sorted(errors), "detail": text[-4000:]}
    if result.skipped:
        return {"outcome": "skip", "errors": [], "detail": result.skipped[0][1]}
    return {"outcome": "pass", "errors": [], "detail": ""}


def main(out: str, ids: list[str]) -> None:
    import runner

    with open(out, "a") as f:
        for test_id in ids:
            cls_name, name = test_id.split(".")
            result = unittest.TestResult()
            runner.CLASSES[cls_name](name).run(result)
            f.write(json.dumps({"id": test_id, "outcome": outcome_of(result)}) + "\n")
            f.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
