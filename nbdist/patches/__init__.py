"""Pinned changes to torch.distributed.rpc and torch's entry points a notebook needs, and the
by-value shipping of notebook code and large tensors (README, Layout, lists each module).
"""

__all__: list[str] = []
