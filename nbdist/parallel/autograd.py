"""Distributed autograd with ``torch.autograd``'s shape: ``backward`` fills ``.grad``, ``grad``
returns gradients.

Inside ``with context() as ctx:`` every RPC made records its send/receive so that
``backward(ctx, loss)`` reaches every rank the forward pass touched. torch keeps the
gradients of this rank's leaves in the context; ``backward`` adds them to ``.grad`` and
``grad`` returns them. Each call hands out only what its own backward pass added, so two
``backward`` calls in one context add each gradient once each (TorchOpt re-adds the running
total the second time).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch
import torch.distributed.autograd as _dist_autograd

from ..patches import no_rpc

__all__ = ["backward", "context", "get_gradients", "grad", "is_available"]

_LOCK_PER_PROCESS = threading.Lock()
_TAKEN_PER_PROCESS: OrderedDict[int, dict[torch.Tensor, torch.Tensor]] = OrderedDict()
_KEEP = 64  # contexts remembered when not opened with ``context()`` (which forgets on exit)

TensorOrTensors = torch.Tensor | Sequence[torch.Tensor]


def is_available() -> bool:
    """Whether this torch build has distributed autograd."""
    return bool(_dist_autograd.is_available())


@contextlib.contextmanager
def context() -> Iterator[int]:
    """A distributed autograd context around a forward and backward pass; yields its id."""
    no_rpc.check("nbdist.parallel.autograd.context (distributed autograd)")
    with _dist_autograd.context() as context_id:
        try:
            yield context_id
        finally:
            with _LOCK_PER_PROCESS:
                _TAKEN_PER_PROCESS.pop(context_id, None)


def get_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """Every gradient this rank's leaves have accumulated in the context, by tensor."""
    return _dist_autograd.get_gradients(context_id)


def _new_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients added to the context since the last ``backward``/``grad`` call on it."""
    now = _dist_autograd.get_gradients(context_id)
    with _LOCK_PER_PROCESS:
        before = _TAKEN_PER_PROCESS.pop(context_id, {})
        _TAKEN_PER_PROCESS[context_id] = {t: g.detach().clone() for t, g in now.items()}
        while len(_TAKEN_PER_PROCESS) > _KEEP:
            _TAKEN_PER_PROCESS.popitem(last=False)
    return {t: (g - before[t] if t in before else g) for t, g in now.items()}


def _as_tuple(tensors: TensorOrTensors, what: str) -> tuple[torch.Tensor, ...]:
    out = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    if not out:
        raise RuntimeError(f"'{what}' cannot be empty")
    return out


def backward(autograd_ctx_id: int, tensors: TensorOrTensors, retain_graph: bool | None = None,
             inputs: TensorOrTensors | None = None) -> None:
    """Distributed backward from ``tensors``; add the gradients of this rank's leaves to ``.grad``.

    ``inputs`` limits which leaves get gradients (like ``torch.autograd.backward``).
    """
    wanted = None
    if inputs is not None:
        wanted = _as_tuple(inputs, "inputs")
        if not all(t.requires_grad for t in wanted):
            raise RuntimeError("one of the inputs does not require grad")
    roots = list(_as_tuple(tensors, "tensors"))
    _dist_autograd.backward(autograd_ctx_id, roots, retain_graph=bool(retain_graph))
    grads = _new_gradients(autograd_ctx_id)
    if wanted is not None:
        keep = {id(t) for t in wanted}
        grads = {t: g for t, g in grads.items() if id(t) in keep}
    with _LOCK_PER_PROCESS:
        for t, g in grads.items():
            t.grad = g.clone() if t.grad is None else t.grad + g


def grad(autograd_ctx_id: int, outputs: TensorOrTensors, inputs: TensorOrTensors,
         retain_graph: bool | None = None,
         allow_unused: bool = False) -> tuple[torch.Tensor | None, ...]:
    """Distributed backward from ``outputs``; return the gradients of ``inputs`` (this rank's
    leaves), like ``torch.autograd.grad``. ``.grad`` is left alone.
    """
    wanted = _as_tuple(inputs, "inputs")
    if not all(t.requires_grad for t in wanted):
        raise RuntimeError("one of the inputs does not require grad")
    roots = list(_as_tuple(outputs, "outputs"))
    _dist_autograd.backward(autograd_ctx_id, roots, retain_graph=bool(retain_graph))
    grads = _new_gradients(autograd_ctx_id)
    out: list[torch.Tensor | None] = []
    for i, t in enumerate(wanted):
        g = grads.get(t)
        if g is None and not allow_unused:
            raise RuntimeError(f"input {i} (shape {tuple(t.shape)}) was not used to compute the "
                               "outputs, or is not a leaf on this rank; pass allow_unused=True "
                               "to get None for it")
        out.append(g)
    return tuple(out)
