"""Issue 33's differential conformance suite: each case is one short program using
``torch.distributed`` as scripts do, run as a script (``torchrun --standalone`` or
``python prog.py`` with ``mp.spawn``, plain torch) and from a world in a real kernel; what each
rank observes is compared, and any difference not listed in ``intended.py`` fails.

Modules: ``prelude`` (the recorder every program starts with), ``cases`` (the programs),
``script`` and ``world`` (the two ways to run one), ``observe`` (records and output → one
observation per rank), ``intended`` (the differences nbdist means), ``compare``, ``readme``
(the README table generated from ``intended``).
"""
