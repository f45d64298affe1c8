"""pdb on a rank, typed at in the notebook: the rank's debugger (``remote_pdb``)
and its prompts served in the notebook's input box (``prompts``)."""

__all__: list[str] = []
