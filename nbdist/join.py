"""``python -m nbdist.join``: the agent a launcher starts on another host (see
``nbdist.hosts.join_agent``); it reads its instructions from stdin."""

from .hosts.join_agent import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
