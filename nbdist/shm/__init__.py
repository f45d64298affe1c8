"""Large tensors between the ranks of one host through shared memory instead of a socket: the
transport and its pooled arena (docs/layout.md)."""

__all__: list[str] = []
