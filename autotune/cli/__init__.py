"""The ``autotune`` command line (the top layer: it may import from every other).

- :mod:`~autotune.cli.app`: the commands in ``--help`` order, and ``main``, the entry point.
- :mod:`~autotune.cli.study_commands`: ``study start|resume|ablate``, which run trials.
- :mod:`~autotune.cli.service_commands`: ``study status|stop`` and ``dashboard``.
- :mod:`~autotune.cli.show_commands`: ``study list|show|best|explain``, read only.
- :mod:`~autotune.cli.profile_commands`: ``export``, ``verify`` and ``report``.
- :mod:`~autotune.cli.common`: consoles, common arguments, the one-line error exit.
"""
