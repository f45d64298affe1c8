"""What ranks print and show, both sides: a worker's streams (``rank_streams``), the
notebook's receiver, router, rich output and the rules that merge lines."""

__all__: list[str] = []
