"""The private torch names nbdist relies on. A torch upgrade that moves one fails here, loudly."""

from __future__ import annotations

import collections
import threading


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
