"""Helpers for testing and benchmarking against real engines without downloading anything.

:func:`make_tiny_llama` writes a random-weight Llama checkpoint with an offline tokenizer that
``transformers serve`` (and any other engine that reads a Hugging Face folder) can load. It needs
``torch``, ``transformers`` and ``tokenizers``, which are imported only when it is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_tiny_llama"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m autotune.testing.tiny_model` does not import the module twice.
    if name == "make_tiny_llama":
        from autotune.testing.tiny_model import make_tiny_llama

        return make_tiny_llama
    raise AttributeError(f"module 'autotune.testing' has no attribute {name!r}")
