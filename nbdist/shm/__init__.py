"""Large tensors between the ranks of one host through shared memory instead of a socket: the
transport and its pooled arena (README, Layout)."""

__all__: list[str] = []
