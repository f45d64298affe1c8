"""Workers' widgets, both sides: a worker's comms over the control channel
(``channel_comm``) and their relay to the notebook's frontend (``relay``)."""

__all__: list[str] = []
