"""Processes and the control plane: the protocol, the channel, the warm template, workers,
output forwarding and the runtime directory. Knows nothing of clusters or displays."""

__all__: list[str] = []
