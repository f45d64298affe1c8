"""Run one of torch's shipped RPC tests on one rank, as torch's launcher does, and record how it
ended. Imported by every rank of every side (a world's ranks, the control's plain processes,
torch's own launcher through ``launched.py``): plain torch only, nothing of nbdist.

Forms: ``script`` calls the test as written (``dist_init`` starts and shuts down RPC itself);
``body`` calls what ``dist_init`` wraps, with its preamble but without ``init_rpc`` and
``shutdown``, in a process whose RPC agent is up already (a world, or the control).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import sys
import traceback
import unittest
from pathlib import Path
from typing import Any

from torch.testing._internal.common_distributed import TEST_SKIPS
from torch.testing._internal.common_utils import SEED, set_rng_seed
from torch.testing._internal.distributed import rpc_utils
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (
    TensorPipeRpcAgentTestFixture,
)

__all__ = ["CLASSES", "dist_init_of", "fresh_module_state", "instance", "run_one"]

PREFIX = "TensorPipe"
# the CPU suites torch's own test/distributed/rpc/test_tensorpipe_agent.py runs
CLASSES: dict[str, type] = rpc_utils.generate_tests(
    PREFIX, TensorPipeRpcAgentTestFixture,
    rpc_utils.GENERIC_TESTS + rpc_utils.TENSORPIPE_TESTS, __name__)
globals().update(CLASSES)
_SKIP_CODES = {s.exit_code: s.message for s in TEST_SKIPS.values()}
_PLAIN = (list, dict, set, int, float, bool, str, type(None), tuple)
_NEW_FUTURE = object()  # marks a module's unset concurrent.futures.Future
_IF_GONE = object()  # marks any other value: put back only if a test deleted it


def _module_state() -> dict:
    """The plain module-level values of torch's test modules (``rpc_done``, ``ctx_ids``, ...),
    as a fresh process has them."""
    state = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(("torch.testing._internal.distributed",
                                                   "torch.testing._internal.dist_utils")):
            continue
        for k, v in vars(mod).items():
            if k.startswith("__"):
                continue
            if type(v) in _PLAIN:
                try:
                    state[(mod_name, k)] = copy.deepcopy(v)
                except Exception:  # noqa: BLE001 - not copyable: left as it is
                    continue
            elif isinstance(v, concurrent.futures.Future) and not v.done():
                state[(mod_name, k)] = _NEW_FUTURE  # a one-shot signal: a fresh one each time
            else:
                state[(mod_name, k)] = (_IF_GONE, v)  # a function a test deleted comes back
    return state


_FRESH = _module_state()


def fresh_module_state() -> None:
    """Give torch's test modules the values a fresh process has: a body run after another
    must not see what the one before left (a ``rpc_done`` flag still set makes
    ``_check_rpc_done`` return before this test's RPC came, and the context it then looks up
    is the earlier test's). Every form does it after every test, as a launched process ends."""
    for (mod_name, k), v in _FRESH.items():
        mod = sys.modules[mod_name]
        if v is _NEW_FUTURE:
            setattr(mod, k, concurrent.futures.Future())
        elif type(v) is tuple and len(v) == 2 and v[0] is _IF_GONE:
            if not hasattr(mod, k):
                setattr(mod, k, v[1])
        else:
            setattr(mod, k, copy.deepcopy(v))


def dist_init_of(fn: Any) -> Any:
    """The ``dist_init`` wrapper inside ``fn``'s decorators, or None."""
    while fn is not None:
        code = getattr(fn, "__code__", None)  # wraps() copies the name: look at the code
        if code is not None and code.co_name == "new_test_method" \
                and "old_test_method" in code.co_freevars:
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


def instance(cls_name: str, name: str, rank: int, file_name: str) -> Any:
    """The test case object a launched process makes (``MultiProcessTestCase._run``)."""
    case = CLASSES[cls_name](name)
    case.rank = rank
    case.file_name = file_name
    return case


def _seed() -> None:
    """torch's per-test seed: ``set_rng_seed()`` (2.9 on), ``set_rng_seed(SEED)`` before."""
    try:
        set_rng_seed()
    except TypeError:
        set_rng_seed(SEED)


def _call(case: Any, name: str, form: str) -> None:
    _seed()  # as MultiProcessTestCase.run_test does before each test
    if form == "script":
        getattr(case, name)()
        return
    wrapper = dist_init_of(getattr(type(case), name))
    nonlocals = {k: c.cell_contents for k, c in
                 zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (), strict=True)}
    import torch.distributed.rpc.api as api

    api._ignore_rref_leak = False
    case.worker_id = case.rank
    case.setup_fault_injection(nonlocals["faulty_messages"], nonlocals["messages_to_delay"])
    import torch.distributed.rpc as rpc

    timeout = rpc.get_rpc_timeout()
    try:
        nonlocals["old_test_method"](case)
    finally:  # what the test changed of its process ends with it: the default group it
        import torch.distributed as dist  # made, the RPC timeout it set, its module state

        if dist.is_initialized():
            dist.destroy_process_group()
        rpc._set_rpc_timeout(timeout)


def run_one(cls_name: str, name: str, rank: int, file_name: str, form: str,
            out: str | None = None, raise_: bool = False) -> dict:
    """Run the test on this rank; its outcome (``{"outcome": "pass" | "skip" | "fail",
    "error": type name, "detail": last lines}``) is returned and, with ``out``, written to
    ``out/<class>.<test>.<rank>.json``; ``raise_``: a failure is raised again after that (it
    ends the cell, as it ends a launched process)."""
    result: dict = {"outcome": "pass"}
    failure: BaseException | None = None
    try:
        try:
            _call(instance(cls_name, name, rank, file_name), name, form)
        finally:
            fresh_module_state()
    except unittest.SkipTest as exc:
        result = {"outcome": "skip", "detail": str(exc)}
    except SystemExit as exc:  # the launched process ends with this code: judged by it
        code = exc.code if isinstance(exc.code, int) else 1
        result = ({"outcome": "skip", "detail": _SKIP_CODES[code]} if code in _SKIP_CODES
                  else {"outcome": "pass"} if code == 0
                  else {"outcome": "fail", "error": "SystemExit", "detail": str(code)})
        failure = exc  # the process ended here: with ``raise_`` the cell ends too
    except BaseException as exc:  # noqa: BLE001 - the test's outcome
        failure = exc
        result = {"outcome": "fail", "error": type(exc).__name__,
                  "detail": "".join(traceback.format_exception(exc))[-2000:]}
    if out is not None:
        path = Path(out) / f"{cls_name}.{name}.{rank}.json"
        path.write_text(json.dumps(result))
    if raise_ and failure is not None:
        raise failure
    return result


if __name__ == "__main__":  # pragma: no cover - a manual check of one test on one rank
    print(run_one(*sys.argv[1:3], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
