"""Where ranks run: the local launcher, join agents on other hosts (both ends), network
interfaces, and batch schedulers behind one door (``scheduler``)."""

__all__: list[str] = []
