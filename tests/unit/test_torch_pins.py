"""The private torch names nbdist relies on. A torch upgrade that moves one fails here, loudly."""

from __future__ import annotations

import collections
import threading

import pytest


def test_rpc_counters_and_all_gather_state_exist():
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import api

    assert isinstance(rpc._init_counter, int)
    assert isinstance(rpc._init_counter_lock, type(threading.Lock()))
    assert isinstance(api._all_gather_sequence_id, dict)
    assert isinstance(api._all_gather_sequence_id_to_states, collections.defaultdict)
    assert hasattr(api._all_gather_dict_lock, "acquire")


def test_init_rpc_reads_its_gloo_timeout_from_the_constants_module():
    """Rank 0 bounds init_rpc's Gloo group by setting this constant while it joins."""
    import inspect
    from datetime import timedelta

    from torch.distributed.rpc import backend_registry, constants

    assert isinstance(constants.DEFAULT_PROCESS_GROUP_TIMEOUT, timedelta)
    assert "rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT" in inspect.getsource(
        backend_registry._init_process_group)


def test_rpc_internals_patched_by_nbdist_exist():
    from torch.distributed.rpc import api, internal

    for name in ("_invoke_rpc", "_require_initialized", "RPCExecMode", "rpc_sync", "rpc_async"):
        assert hasattr(api, name), name
    for name in ("_internal_rpc_pickler", "_run_function", "_thread_local_tensor_tables",
                 "RemoteException", "PythonUDF"):
        assert hasattr(internal, name), name
    pickler = internal._internal_rpc_pickler
    for name in ("_dispatch_table", "_py_rref_reducer", "_rref_reducer",
                 "_script_module_reducer", "_class_reducer_dict", "serialize",
                 "deserialize"):
        assert hasattr(pickler, name), name


def test_rref_context_symbols_are_found():
    from nbdist.patches import rref_reset

    assert rref_reset.available(), "libtorch's RRefContext symbols moved: restarts with RRefs " \
                                   "in the notebook will break; update nbdist/patches/rref_reset.py"
    import ctypes

    assert hasattr(ctypes.PyDLL(rref_reset._libtorch_cpu()), rref_reset._DTOR)


def test_tensorpipe_address_static_is_found():
    """rank 0 re-pins TensorPipe's per-process address before each world (tp_address)."""
    from nbdist.patches import tp_address

    assert tp_address._addresses() is not None


def test_async_execution_marker_attribute():
    import torch.distributed.rpc as rpc

    @rpc.functions.async_execution
    def f():
        pass

    assert hasattr(f, "_wrapped_async_rpc_function")


# -- the registry: every private name looked up once, in nbdist/patches/torch_private.py ----
PINNED = {
    "torch.distributed.rpc.internal._internal_rpc_pickler.serialize",
    "torch.distributed.rpc.internal._internal_rpc_pickler._dispatch_table",
    "torch.distributed.rpc.internal._internal_rpc_pickler._class_reducer_dict",
    "torch.distributed.rpc.internal._internal_rpc_pickler._py_rref_reducer",
    "torch.distributed.rpc.internal._internal_rpc_pickler._rref_reducer",
    "torch.distributed.rpc.internal._internal_rpc_pickler._script_module_reducer",
    "torch.distributed.rpc.internal._internal_rpc_pickler.deserialize",
    "torch.distributed.rpc.internal._thread_local_tensor_tables",
    "torch.distributed.rpc.internal.PythonUDF",
    "torch.distributed.rpc.internal._run_function",
    "torch.distributed.rpc.internal.RemoteException",
    "torch.distributed.rpc.api._to_worker_info",
    "torch.distributed.rpc.api._invoke_rpc_python_udf",
    "torch.distributed.rpc.api._invoke_remote_python_udf",
    "torch.distributed.rpc.api._invoke_rpc_builtin",
    "torch.distributed.rpc.api._invoke_remote_builtin",
    "torch.distributed.rpc.api._invoke_rpc_torchscript",
    "torch.distributed.rpc.api._invoke_remote_torchscript",
    "torch.distributed.rpc.api._invoke_rpc",
    "torch.distributed.rpc.api._require_initialized",
    "torch.distributed.rpc.api.RPCExecMode.SYNC",
    "torch.distributed.rpc.api.PythonUDF",
    "torch.distributed.rpc.api._all_gather_dict_lock",
    "torch.distributed.rpc.api._all_gather_sequence_id",
    "torch.distributed.rpc.api._all_gather_sequence_id_to_states",
    "torch.distributed.rpc.backend_registry._init_process_group",
    "torch.distributed.rpc.backend_registry._tensorpipe_exchange_and_check_all_device_maps",
    "torch.distributed.rpc.api._is_current_rpc_agent_set",
    "torch.distributed.rpc.api._get_current_rpc_agent",
    "torch.distributed.rpc.api._ignore_rref_leak",
    "torch.distributed.autograd._current_context",
    "torch.distributed.autograd._release_context",
    "torch.distributed.rpc._init_counter",
    "torch.distributed.rpc._init_counter_lock",
    "torch.distributed.rpc.rendezvous_iterator",
    "torch.distributed.rpc._set_rpc_timeout",
    "torch.distributed.rpc.constants.DEFAULT_PROCESS_GROUP_TIMEOUT",
    "torch.distributed.rpc.rref_proxy._local_invoke",
    "torch.distributed.rpc.rref_proxy._local_invoke_async_execution",
    "torch.distributed.rpc.functions._wrapped_async_rpc_function",
    "torch._C._distributed_rpc._get_current_rpc_agent",
    "torch._C._distributed_rpc.PyRRef.to_here",
    "libtorch_cpu.so.RRefContext::getInstance()::context",
    "libtorch_cpu.so.TensorPipeAgent::guessAddress()::uvAddress",
    "libtorch_cpu.so.rpc::barrierId",
    "torch.distributed.distributed_c10d._world.pg_map",
    "torch.distributed.distributed_c10d._world.group_count",
    "torch.distributed.distributed_c10d._world.pg_names",
    "torch.distributed.distributed_c10d._world.pg_group_ranks",
    "torch.distributed.distributed_c10d._world.pg_backend_config",
    "torch.distributed.distributed_c10d._world.pg_to_tag",
    "torch.distributed.distributed_c10d._world.tags_to_pg",
    "torch.distributed.distributed_c10d._world.pg_coalesce_state",
    "torch.distributed.distributed_c10d._update_default_pg",
    "torch._C._distributed_c10d._register_process_group",
    "torch._C._distributed_c10d._unregister_process_group",
    "cloudpickle.cloudpickle._find_imported_submodules",
    "cloudpickle.cloudpickle._extract_code_globals",
    "cloudpickle.cloudpickle._get_cell_contents",
    "cloudpickle.cloudpickle._empty_cell_value",
    "cloudpickle.cloudpickle._class_setstate",
    "cloudpickle.cloudpickle._make_skeleton_class",
    "cloudpickle.cloudpickle._DYNAMIC_CLASS_TRACKER_BY_ID",
    "cloudpickle.cloudpickle._should_pickle_by_reference",
    "cloudpickle.cloudpickle.Pickler.globals_ref",
}


def test_the_list_of_private_names_is_pinned():
    """A name added to or dropped from nbdist's use of torch internals shows up here."""
    from nbdist.patches import torch_private

    assert {p.name for p in torch_private.PRIVATES} == PINNED
    assert {p.feature for p in torch_private.PRIVATES} == set(torch_private.FEATURES)
    assert all(p.verified for p in torch_private.PRIVATES)


def test_every_private_name_checks_out_on_this_torch():
    """What %load_ext checks: on a torch the suite runs on, nothing is reported."""
    import torch

    from nbdist.patches import torch_private

    assert [(p.name, wrong) for p, wrong in torch_private.problems()] == []
    assert torch.__version__.split("+")[0] in torch_private.VERIFIED, \
        "add this torch to torch_private.VERIFIED once the whole suite passed on it"
    assert torch_private.report() == []


def test_the_accepted_range_is_the_verified_versions():
    """pyproject.toml accepts from the oldest torch the whole suite passed on up to the newest,
    2.15 (October 2026: what `pip install torch` gives a new user) included; the README's
    table lists each of them."""
    import re

    from conftest import ROOT

    from nbdist.patches import torch_private

    def minor(version: str) -> tuple[int, int]:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)

    low, high = re.search(r'"torch>=([\d.]+),<([\d.]+)"',
                          (ROOT / "pyproject.toml").read_text()).groups()
    verified = sorted(minor(v) for v in torch_private.VERIFIED)
    assert "2.15.0" in torch_private.VERIFIED
    assert minor(low) == verified[0]
    assert minor(high) == (verified[-1][0], verified[-1][1] + 1)
    table = (ROOT / "docs" / "torch-versions.md").read_text()
    for version in torch_private.VERIFIED:
        assert f"\n| {version} |" in table, f"docs/torch-versions.md's table lacks {version}"


def test_the_accepted_cloudpickle_is_the_verified_versions():
    """pyproject.toml accepts cloudpickle from the oldest version its private names were
    checked on (this one among them) up to the newest's next minor."""
    import re

    import cloudpickle
    from conftest import ROOT

    from nbdist.patches import torch_private

    low, high = re.search(r'"cloudpickle>=([\d.]+),<([\d.]+)"',
                          (ROOT / "pyproject.toml").read_text()).groups()
    verified = sorted(tuple(map(int, v.split("."))) for v in torch_private.CLOUDPICKLE_VERIFIED)
    assert cloudpickle.__version__ in torch_private.CLOUDPICKLE_VERIFIED
    assert tuple(map(int, low.split("."))) == verified[0]
    assert tuple(map(int, high.split("."))) == (verified[-1][0], verified[-1][1] + 1)
    cloudpickle_names = [p for p in torch_private.PRIVATES if p.module.startswith("cloudpickle")]
    assert cloudpickle_names and all(p.verified == torch_private.CLOUDPICKLE_VERIFIED
                                     for p in cloudpickle_names)


def test_every_private_torch_name_in_the_source_is_in_the_registry():
    """A new ``api._x``/``internal._x`` reach into torch must be listed (and so checked)."""
    import re
    from pathlib import Path

    from nbdist.patches import torch_private

    listed = {part for p in torch_private.PRIVATES for part in p.attr.split(".")}
    reach = re.compile(r"\b(?:api|internal|rpc|rref_proxy|constants)\.(_[a-z]\w*)"
                       r"|from torch\._C\._distributed_rpc import (\w+)")
    found = {}
    for path in (Path(torch_private.__file__).parent.parent).rglob("*.py"):
        for m in reach.finditer(path.read_text()):
            name = m.group(1) or m.group(2)
            if not name.startswith(("_rpc_", "_w_rpc")) and name not in ("_rpc",):
                found.setdefault(name, path.name)
    missing = {n: where for n, where in found.items() if n not in listed
               and n != "_barrier"}  # named in a docstring: nbdist does not call it
    assert not missing, f"private torch names used but not in torch_private.PRIVATES: {missing}"


FAKE_MISSING = r'''
import sys
from nbdist.patches import torch_private as tp
tp._looked_up = lambda: [(p, "missing") for p in tp.PRIVATES if p.feature in sys.argv[1].split(",")]
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api, internal
pickler = internal._internal_rpc_pickler
before = (api.rpc_sync, internal._run_function, pickler.serialize, pickler.deserialize,
          api._invoke_rpc_python_udf, api._to_worker_info)
from nbdist.patches import rpc_hooks, thread_states
from nbdist.shipping import pickler as shipping
from nbdist.telemetry import tracing
shipping.install(); thread_states.install(); rpc_hooks.install_caller()
rpc_hooks.install_callee(); rpc_hooks.reset_world_state(); tracing.install(0, "agent")
after = (api.rpc_sync, internal._run_function, pickler.serialize, pickler.deserialize,
         api._invoke_rpc_python_udf, api._to_worker_info)
print("UNCHANGED" if all(a == b for a, b in zip(before, after)) else "PATCHED")
for line in tp.report():
    print(line)
'''


def test_missing_names_turn_their_features_off_with_one_line_each():
    import subprocess
    import sys

    features = "shipping,thread_states,caller,callee,restart,tracing"
    out = subprocess.run([sys.executable, "-c", FAKE_MISSING, features], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "UNCHANGED"  # nothing whose shape is unknown was patched
    from nbdist.patches.torch_private import FEATURES

    for feature in features.split(","):
        hits = [line for line in lines[1:] if FEATURES[feature] in line]
        assert len(hits) == 1, (feature, lines)
        assert hits[0].startswith("nbdist: ") and " on torch " in hits[0]
        assert "missing" in hits[0]


LOAD_EXT = r"""
import sys
from nbdist.patches import torch_private as tp
tp._looked_up = lambda: [(p, "missing") for p in tp.PRIVATES if p.feature in ("callee", "tracing")]
if sys.argv[1] == "torch-first":
    import torch.distributed.rpc
from IPython.testing.globalipapp import get_ipython
import nbdist
ip = get_ipython()
ip.run_line_magic("load_ext", "nbdist")
print("LOADED", file=sys.stderr, flush=True)
ip.run_line_magic("dist_start", "1 --name agent --worker-name w{rank}")
r = ip.run_cell("import torch, torch.distributed.rpc as rpc\n"
                "def inc(x):\n    return x + 1\n"
                "rpc.rpc_sync('w1', inc, args=(torch.ones(1),)).item()")
print("RESULT", r.result)
nbdist.stop()
"""


@pytest.mark.parametrize("order", ["torch-first", "load-ext-first"])
def test_load_ext_says_what_degrades_and_a_world_still_works(order):
    """Said once: by %load_ext when torch is imported already, else by the first start
    (%load_ext does not import torch: it returns at once)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LOAD_EXT, order], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT 2.0" in out.stdout
    err = out.stderr.splitlines()
    said = [i for i, line in enumerate(err) if line.startswith("nbdist: ")
            and " on torch " in line]
    assert len(said) == 2, out.stderr[-3000:]
    loaded = err.index("LOADED")
    assert all(i < loaded for i in said) if order == "torch-first" else \
        all(i > loaded for i in said), out.stderr[-3000:]
    assert any("Ctrl-C does not stop RPC functions" in err[i] for i in said)
    assert any("no RPC tracing" in err[i] for i in said)
