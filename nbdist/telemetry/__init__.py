"""What ranks report: logged records (``nbdist.log``), RPC traces and stats, timings."""

__all__: list[str] = []
