"""Pinned changes to torch's own functions (torch.distributed.rpc, process groups, logging),
each checked against the private names it needs (``torch_private``; docs/layout.md)."""

__all__: list[str] = []
