"""What each patch feature gives the user, and turning one off with one line.

``FEATURES`` names what is lost when a feature cannot work on the torch at hand (a private
name missing, ``torch_private``; a C++ static not laid out as nbdist knows, found as it was
about to be written: ``turn_off``).
"""

from __future__ import annotations

import sys

from .installed import first_time

__all__ = ["FEATURES", "turn_off"]

# feature -> what the user loses when it cannot be installed on their torch
FEATURES = {
    "shipping": "functions and classes defined in notebook cells cannot be sent over RPC "
                "(torch sends them by name)",
    "thread_states": "small RPCs are slower (~1.2x plain torch: thread states not kept)",
    "callee": "Ctrl-C does not stop RPC functions running on a rank, and their printed "
              "output may arrive after the result",
    "caller": "Ctrl-C does not interrupt rpc_sync, and a call to a dead rank waits for its "
              "timeout",
    "restart": "a second world in one kernel hangs (%dist_restart, --keep, --heal): "
               "restart the kernel between worlds",
    "rref_reset": "RRefs held in the notebook may fail after %dist_restart",
    "rerun": "a cell with its own init_rpc ... shutdown may hang when it runs a second time "
             "in one kernel",
    "tp_address": "switching between a local world and one across hosts needs a kernel "
                  "restart",
    "tracing": "no RPC tracing (rpc_stats and the dashboard's latencies stay empty)",
    "start_timeout": "a rank that never joins makes %dist_start wait Gloo's own timeout",
    "rpc_timeout": "a world keeps its start deadline as the default RPC timeout",
    "current_agent": "nbdist.parallel does not find the running RPC agent",
    "async_marker": "nbdist.parallel runs @rpc.functions.async_execution functions as plain "
                    "ones",
    "process_group": "destroy_process_group keeps only the default group alive until it is "
                     "safe to free, so freeing a subgroup (new_group) may still freeze a rank; "
                     "after a failed init_process_group the next one may wait in vain",
    "no_rpc": "in a world without RPC (--no-rpc), torch's RPC calls say 'RPC has not been "
              "initialized' instead of naming --no-rpc",
    "hidden_groups": "a function run by mp.spawn in a world with a process group sees the "
                     "world's group as its default, and a group of its own may be refused",
}


def turn_off(feature: str, why: str) -> bool:
    """Say once per process that ``feature`` is off on this torch, and why (a C++ static
    not laid out as nbdist knows, found as it was about to be written); False, for the
    caller to return."""
    if first_time(f"features.off.{feature}"):
        sys.stderr.write(f"nbdist: {FEATURES[feature]} on this torch ({why})\n")
    return False
