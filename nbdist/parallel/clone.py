"""``module_clone``: a copy of a module (or a tree of tensors) that RPC can differentiate through.

RPC sends an ``nn.Parameter`` as a fresh leaf, cut from the graph. A module cloned with
``by='copy'`` holds ``clone()``s of its parameters instead: plain tensors whose
``CloneBackward`` leads back to the originals, so gradients computed on another rank arrive at
the original parameters.

- ``'reference'`` (``'ref'``): the clone shares the very same tensors (a new module object).
- ``'copy'`` (``'clone'``): ``t.clone()``, still in the graph.
- ``'deepcopy'`` (``'deepclone'``): detached copies; parameters stay ``nn.Parameter`` leaves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .trees import tree_map

__all__ = ["module_clone"]

_MODES = {"reference": "reference", "ref": "reference", "copy": "copy", "clone": "copy",
          "deepcopy": "deepcopy", "deepclone": "deepcopy"}


def _replicator(by: str, device: torch.device | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def move(t: torch.Tensor) -> torch.Tensor:
        return t if device is None else t.to(device)

    if by == "reference":
        return move
    if by == "copy":
        return lambda t: move(t.clone())
    return _detached(device)


def _detached(device: torch.device | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def detach(t: torch.Tensor) -> torch.Tensor:
        data = t.detach().clone()
        if device is not None:
            data = data.to(device)
        if isinstance(t, nn.Parameter):
            return nn.Parameter(data, requires_grad=t.requires_grad)
        return data.requires_grad_(t.requires_grad)

    return detach


def module_clone(target: Any, *, by: str = "reference", detach_buffers: bool = False,
                 device: torch.device | str | None = None) -> Any:
    """Clone an ``nn.Module`` or a tuple/list/dict tree of tensors (TorchOpt's semantics).

    ``by`` is ``'reference'``, ``'copy'`` or ``'deepcopy'`` (also ``'ref'``, ``'clone'``,
    ``'deepclone'``). ``detach_buffers`` gives a module's clone detached copies of its buffers.
    ``device`` moves the clone's tensors there.
    """
    if by not in _MODES:
        raise ValueError(f"by must be one of {sorted(_MODES)}, got {by!r}")
    mode = _MODES[by]
    dev = None if device is None else torch.device(device)
    replicate = _replicator(mode, dev)
    if isinstance(target, nn.Module):
        return _clone_module(target, replicate, _detached(dev) if detach_buffers else replicate)

    def leaf(t: Any) -> Any:
        return replicate(t) if isinstance(t, torch.Tensor) else t

    return tree_map(leaf, target)


def _clone_module(module: nn.Module, params: Callable, buffers: Callable) -> nn.Module:
    """Copy the module's structure, then put replicated tensors into the copy's slots."""
    shared = {}
    for m in module.modules():
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                shared[id(t)] = t
    cloned = copy.deepcopy(module, memo=dict(shared))
    done: dict[int, torch.Tensor] = {}  # tied weights stay tied
    for dst in cloned.modules():
        for slots, fn in ((dst._parameters, params), (dst._buffers, buffers)):
            for name, t in list(slots.items()):
                if t is None:
                    continue
                if id(t) not in done:
                    done[id(t)] = fn(t)
                slots[name] = done[id(t)]
    return cloned
