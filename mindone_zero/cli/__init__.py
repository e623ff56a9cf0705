"""Command-line tools installed as console commands (``setup.py`` ``entry_points``).

* ``mindone-zero-convert`` (``mindone_zero.cli.convert``): combine per-rank checkpoints offline.
* ``mindone-zero-estimate-memory`` (``mindone_zero.cli.estimate_memory``): model-state memory
  per device of ZeRO stages 0-3.

Each module's ``main(argv=None) -> int`` is the command; ``python -m mindone_zero.cli.<module>``
and the wrappers in a checkout's ``tools/`` run the same function. None of them communicates.
"""
