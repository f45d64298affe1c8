"""The control channel between the notebook and each rank, both sides: every message
(``protocol``) and the framed, authenticated connections that carry them (``channel``)."""

__all__: list[str] = []
