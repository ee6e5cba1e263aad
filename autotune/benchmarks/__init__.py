"""Benchmarks that a trial can run as its measurement, each a module runnable with ``python -m``.

- :mod:`autotune.benchmarks.collectives`: latency and bandwidth of torch.distributed collectives
  (NCCL on GPUs, gloo on CPU) under the NCCL environment of the trial.

Nothing is imported here, so that ``python -m autotune.benchmarks.<name>`` loads only what it needs.
"""

from __future__ import annotations
