"""A rank's process: the warm template, the worker, its shell, its config, joining and leaving
a world, the runtime directory and the rendezvous store. Knows nothing of clusters or displays."""

__all__: list[str] = []
