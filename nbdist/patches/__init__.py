"""Small, pinned changes to torch.distributed.rpc a notebook needs: interruptible waits,
by-value shipping of notebook code, RRef-context reset between worlds, quiet stderr."""

__all__: list[str] = []
