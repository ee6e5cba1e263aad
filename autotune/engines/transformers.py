"""transformers serve (transformers >= 5, ``pip install 'transformers[serving]'``).

What the preset relies on, seen by running transformers 5.24 on CPU and read in 5.17's source:

- The command is ``transformers serve`` run as ``{python} -m transformers.cli.transformers serve``, so
  that it is the transformers of the Python that runs autotune (no console script on PATH needed).
- ``transformers serve MODEL`` takes the model as its positional FORCE_MODEL argument: the model
  (a hub id or a local folder) is loaded *before* the HTTP server binds its port, so ``GET /health``
  answering 200 means the weights are loaded. Requests may leave ``model`` out (the pinned model is
  used) or must name it exactly as given on the command line, else HTTP 400 ``Server is pinned to
  '...'; requested '...'``. 5.24's ``GET /v1/models`` lists the pinned model; 5.17's lists the
  models of the Hugging Face cache only.
- ``--continuous-batching`` is in the template: without it the ``--cb-*`` flags do nothing and
  requests are served one ``generate()`` call each. The continuous-batching manager (KV cache
  sizing, ``--cb-*`` validation) starts at the *first request*, not at launch: a bad ``--cb-*``
  value fails that request (HTTP 500 with a ``ValueError`` traceback in the log, or a stream
  ``data: {"error": ...}`` plus ``ContinuousBatchingLogger - ERROR - Error in generation loop``),
  the process stays up and ``/health`` turns 503 ``cb_worker_dead``.
- Errors the command line rejects exit at once: click's ``Error: No such option '--x'`` /
  ``Error: Invalid value for '--cb-block-size': 'abc' is not a valid integer.`` (exit 2), and
  ``ValueError: Unsupported attention implementation: 'x'`` (exit 1).
- ``POST /v1/completions`` streams ``data: {...}`` chunks whose last one carries ``finish_reason``
  and ``usage`` (always; ``stream_options`` is ignored) and **no** ``data: [DONE]`` line; unknown
  body fields such as ``ignore_eos`` are rejected with HTTP 422.
"""

from __future__ import annotations

from autotune.engines import EnginePreset
from autotune.outcome.failures import Pattern, server_patterns
from autotune.outcome.failures import pattern as _p


# Before the common patterns: texts that the common ones would miss or misname.
_FIRST: tuple[Pattern, ...] = (
    # CPU: the KV cache or the static batch tensors do not fit in RAM (--cb-max-memory-percent > 1).
    _p("oom", r"DefaultCPUAllocator: can't allocate memory"),
    # Command-line errors (typer/click): exit code 2 before anything is loaded.
    _p("invalid-argument", r"^Error: (No such option|Invalid value for|Missing option|Missing argument|Got unexpected extra argument)"),
    # --cb-* values the continuous-batching manager rejects (5.17: "Block size must be at least 4, but got 0",
    # 5.24: "page_size must be at least 4 but got ..."; "Invalid values: max_batch_tokens = -1, num_sectors = ...").
    _p("invalid-argument", r"(Block size|page_size) must be at least \d+"),
    # "Invalid values: max_batch_tokens = M, num_blocks = N" (num_sectors in 5.24): M <= 0 is the user's
    # value; N <= 0 was solved from memory (the KV share cannot hold a batch of M tokens).
    _p("invalid-argument", r"Invalid values: max_batch_tokens = (-\d+|0),"),
    _p("not-enough-memory", r"Invalid values: max_batch_tokens = \d+, num_(blocks|sectors) = (-\d+|0)\b"),
    _p("invalid-argument", r"Invalid values: max_batch_tokens = "),
    _p("invalid-argument", r"Unsupported attention implementation: "),
    _p("not-enough-memory", r"No (real|positive) solution \((discriminant|root) = "),
)

# After the common patterns: the continuous-batching worker died for a reason none of the above names.
_LAST: tuple[Pattern, ...] = (
    _p("crash", r"ContinuousBatchingLogger - ERROR - Error in generation loop"),
    _p("crash", r"CB worker (is dead|died)"),
)

TRANSFORMERS = EnginePreset(
    name="transformers",
    package="transformers",
    template="{python} -m transformers.cli.transformers serve {model} --host {host} --port {port} --continuous-batching",
    api="openai",
    ready_path="/health",
    default_port=8000,
    ready_probe=True,  # --cb-* values are checked, and the KV cache sized, at the first request
    patterns=server_patterns(_FIRST, _LAST),
)
