"""What more than one test module uses, defined once (fixtures are in tests/conftest.py).

- :mod:`tests.helpers.cli`: run the real ``autotune`` command line (a subprocess, or in-process)
  and stop a process group.
- :mod:`tests.helpers.sim_study`: study configs on the simulated host (``write_study``) and the
  recorded real study behind the ``recorded_study`` fixture.
- :mod:`tests.helpers.browser`: a real headless Chromium (``browse``).
- :mod:`tests.helpers.dashboard`: optuna-dashboard's WSGI app, called in-process.
- :mod:`tests.helpers.sshd`: a real sshd on 127.0.0.1 (the ``sshd`` fixture starts one).
- :mod:`tests.helpers.gpus`: a stand-in ``nvidia-smi``.

Test modules import from here and from :mod:`tests.needs`, never from each other.
"""
