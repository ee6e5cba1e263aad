"""A load's prompts, in the engines' own units: what ``vllm bench serve`` and ``sglang.bench_serving``
send for ``--dataset-name random`` and ``--dataset-name sharegpt``.

With the model's tokenizer (:func:`load_tokenizer`: ``transformers.AutoTokenizer`` from a local
folder or the local Hugging Face cache, never a download) lengths are tokens:

- random (vLLM's ``RandomDataset``): non-special token ids in sequence from a random offset,
  ``input_len`` less the special tokens the tokenizer adds (the server adds them back), decoded to
  text, re-encoded, and cut or padded with random ids until the text is that many tokens (at most
  :data:`MAX_ROUNDS` rounds). The SGLang API is sent ``input_len`` token ids themselves;
- ShareGPT (vLLM's ``ShareGPTDataset``): the conversations of two turns or more, shuffled with the
  seed; the first turn is the prompt, the second's token count the output length (unless the
  dataset gives ``output_len``); a prompt or an output under 4 tokens, a prompt over 1024 or both
  over 2048 is left out; when too few remain they are drawn again at random.

Without a tokenizer (transformers not installed, or the model not on this machine) lengths are
approximate: a random prompt is ``input_len`` random common words (one token each for most
tokenizers, several for some), SGLang's ids are drawn from a fixed range, and a ShareGPT turn's
length is its word count; :attr:`PromptSet.note` says so.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.execution.workload import Workload
from autotune.util.words import COMMON_WORDS

__all__ = ["MAX_ROUNDS", "Prompt", "PromptError", "PromptSet", "load_tokenizer", "make_prompts"]

MAX_ROUNDS = 10
"""Decode/re-encode rounds that bring a random prompt to its length (``vllm bench serve``'s)."""
# Without a tokenizer, SGLang prompts are random token ids from this range: above the special
# tokens of common tokenizers and below every common vocabulary size.
_TOKEN_ID_RANGE = (1000, 30000)
# vLLM's is_valid_sequence: the ShareGPT turns a benchmark keeps.
_MIN_LEN, _MAX_PROMPT, _MAX_TOTAL = 4, 1024, 2048


class PromptError(ValueError):
    """The prompts cannot be made: a tokenizer named but not loadable, a dataset that cannot be read."""


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: ``text`` (or, for the SGLang API with a tokenizer, token ``ids``),
    the prompt tokens the server is expected to count, and the output tokens to ask for."""

    text: str | None
    ids: tuple[int, ...] | None
    input_len: int
    output_len: int


@dataclass(frozen=True)
class PromptSet:
    """A load's prompts: ``measured`` (``num_prompts``) and ``warmup`` (``warmup_prompts``).

    ``tokenizer`` is the tokenizer they were made with (None: no tokenizer, lengths are
    approximate); ``note`` says how they were made, in one line."""

    measured: tuple[Prompt, ...]
    warmup: tuple[Prompt, ...]
    tokenizer: str | None
    note: str

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    @property
    def output_total(self) -> int:
        return sum(p.output_len for p in self.measured)

    @property
    def mean_input(self) -> float:
        return sum(p.input_len for p in self.measured) / max(1, len(self.measured))


def _cached_locally(name: str) -> bool:
    """Whether ``name`` is a local folder or a model in the local Hugging Face cache (so that
    transformers is imported only where a tokenizer can be found without a download)."""
    if Path(name).expanduser().is_dir():
        return True
    if name.count("/") != 1:
        return False
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    return Path(hub, "models--" + name.replace("/", "--")).is_dir()


@functools.lru_cache(maxsize=8)
def _tokenizer(name: str) -> tuple[Any | None, str]:
    if not _cached_locally(name):
        return None, f"'{name}' is neither a local folder nor in the local Hugging Face cache"
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None, "transformers is not installed"
    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(name), local_files_only=True), ""
    except Exception as exc:  # noqa: BLE001 - any failure to load means: no tokenizer from there
        return None, f"'{name}': {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def load_tokenizer(names: list[str | None]) -> tuple[Any | None, str | None, str]:
    """The first of ``names`` (None entries skipped) whose tokenizer loads without a download:
    ``(tokenizer, name, "")``, else ``(None, None, why not)`` naming each one tried."""
    why: list[str] = []
    for name in dict.fromkeys(n for n in names if n):
        tok, problem = _tokenizer(name)
        if tok is not None:
            return tok, name, ""
        why.append(problem)
    return None, None, "; ".join(why) or "no model name to find a tokenizer by"


def make_prompts(workload: Workload, names: tuple[str | None, ...] = ()) -> PromptSet:
    """The prompts of ``workload``, deterministic given its ``seed``: made with the tokenizer of
    ``workload.tokenizer`` when it names one, else of the first of ``names`` (the served model's
    names) that loads (:func:`load_tokenizer`), else approximately (see the module docstring).

    Raises:
        PromptError: ``workload.tokenizer`` does not load; the dataset cannot be read or holds no
            usable conversation.
    """
    stamp = None
    if workload.dataset is not None:
        try:
            stamp = os.stat(workload.dataset.path).st_mtime_ns
        except OSError as exc:
            raise PromptError(f"dataset {workload.dataset.path}: {type(exc).__name__}: {exc.strerror}") from None
    return _made(workload, (workload.tokenizer,) if workload.tokenizer else tuple(names), stamp)


@functools.lru_cache(maxsize=4)
def _made(workload: Workload, names: tuple[str | None, ...], stamp: int | None) -> PromptSet:
    """:func:`make_prompts`, cached (``stamp``: the dataset file's modification time)."""
    tok, name, why = load_tokenizer(list(names))
    if tok is None and workload.tokenizer:
        raise PromptError(f"tokenizer {why}")
    n, k = workload.num_prompts, workload.warmup_prompts
    if tok is not None:
        if workload.dataset is not None:
            rows = _sharegpt(workload, n + k, lambda text: len(tok(text).input_ids))
            prompts = [Prompt(text, None, i, o) for text, i, o in rows]
            note = f"ShareGPT {workload.dataset.path}, lengths in tokens of {name}'s tokenizer (as vllm bench serve)"
        else:
            prompts = _random_tokens(workload, tok, 0, n) + _random_tokens(workload, tok, 1, k)
            note = (f"{workload.input_len} tokens of {name}'s tokenizer each, random token ids decoded to text "
                    "(as vllm bench serve --dataset-name random)")
        return PromptSet(tuple(prompts[:n]), tuple(prompts[n:]), name, "prompts: " + note)
    if workload.dataset is not None:
        rows = _sharegpt(workload, n + k, lambda text: len(text.split()))
        prompts = [Prompt(text, None, i, o) for text, i, o in rows]
        what = f"ShareGPT {workload.dataset.path}, lengths in words, not tokens"
    else:
        prompts = [_words(workload, 0, i) for i in range(n)] + [_words(workload, 1, i) for i in range(k)]
        each = "token ids from a fixed range" if workload.api == "sglang" else "random common words"
        what = f"{workload.input_len} {each} per prompt, not tokens of the model's tokenizer"
    note = (f"prompts: {what}: no tokenizer ({why}); input lengths are approximate, the server's count "
            "is recorded")
    return PromptSet(tuple(prompts[:n]), tuple(prompts[n:]), None, note)


def _words(w: Workload, namespace: int, index: int) -> Prompt:
    rng = np.random.default_rng([w.seed, namespace, index])
    if w.api == "sglang":
        return Prompt(None, tuple(rng.integers(*_TOKEN_ID_RANGE, size=w.input_len).tolist()), w.input_len, w.output_len)
    words = rng.integers(0, len(COMMON_WORDS), size=w.input_len).tolist()
    return Prompt(" ".join([COMMON_WORDS[i] for i in words]), None, w.input_len, w.output_len)


def _random_tokens(w: Workload, tok: Any, namespace: int, count: int) -> list[Prompt]:
    """vLLM's random dataset, ``count`` prompts (see the module docstring)."""
    if not count:
        return []
    rng = np.random.default_rng([w.seed, namespace])
    vocab = int(tok.vocab_size)
    special = set(tok.all_special_ids)
    allowed = np.array([t for t in range(vocab) if t not in special] or list(range(vocab)))
    offsets = rng.integers(0, vocab, size=count)
    added = 0 if w.api == "sglang" else int(tok.num_special_tokens_to_add())
    target = max(1, w.input_len - added)
    out = []
    for i in range(count):
        ids = allowed[(int(offsets[i]) + i + np.arange(target)) % len(allowed)].tolist()
        if w.api == "sglang":
            out.append(Prompt(None, tuple(ids), target, w.output_len))
            continue
        text, ids = _to_length(tok, ids, target, rng, allowed)
        out.append(Prompt(text, None, len(ids) + added, w.output_len))
    return out


def _to_length(tok: Any, ids: list[int], target: int, rng: np.random.Generator,
               allowed: np.ndarray) -> tuple[str, list[int]]:
    """Decode ``ids``, re-encode the text, cut or pad to ``target``; again until the text is
    ``target`` tokens or :data:`MAX_ROUNDS` rounds are spent (vLLM's
    ``gen_prompt_decode_to_target_len``)."""
    for round_ in range(MAX_ROUNDS + 1):
        text = tok.decode(ids)
        ids = list(tok.encode(text, add_special_tokens=False))
        if len(ids) == target or round_ == MAX_ROUNDS:
            return text, ids
        if len(ids) > target:
            ids = ids[:target]
        else:
            ids = ids + allowed[rng.integers(0, len(allowed), size=target - len(ids))].tolist()
    raise AssertionError("unreachable")


def _sharegpt(w: Workload, count: int, length: Any) -> list[tuple[str, int, int]]:
    """``count`` (prompt, prompt length, output length) from the ShareGPT file, as vLLM samples
    them (see the module docstring); ``length(text)`` counts a text's tokens."""
    assert w.dataset is not None
    data = _read_sharegpt(w.dataset.path, os.stat(w.dataset.path).st_mtime_ns)
    order = list(data)
    random.Random(w.seed).shuffle(order)
    fixed = w.dataset.output_len
    rows: list[tuple[str, int, int]] = []
    for entry in order:
        if len(rows) >= count:
            break
        prompt, completion = entry
        prompt_len = length(prompt)
        output_len = fixed if fixed is not None else length(completion)
        if prompt_len < _MIN_LEN or (fixed is None and output_len < _MIN_LEN):
            continue
        if prompt_len > _MAX_PROMPT or prompt_len + output_len > _MAX_TOTAL:
            continue
        rows.append((prompt, prompt_len, output_len))
    if not rows:
        raise PromptError(f"dataset {w.dataset.path}: no conversation fits a benchmark (prompt and answer of "
                          f"{_MIN_LEN} tokens or more, prompt at most {_MAX_PROMPT}, both at most {_MAX_TOTAL})")
    again = random.Random(w.seed)
    rows += [again.choice(rows) for _ in range(count - len(rows))]
    return rows


@functools.lru_cache(maxsize=2)
def _read_sharegpt(path: str, stamp: int) -> tuple[tuple[str, str], ...]:
    """The (first turn, second turn) of each conversation of two turns or more, in file order
    (``stamp``: the file's modification time, so that a changed file is read again).

    Raises:
        PromptError: the file cannot be read, is not JSON, or is not a list of conversations.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise PromptError(f"dataset {path}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}") from None
    if not isinstance(data, list):
        raise PromptError(f"dataset {path}: expected a JSON list of {{\"conversations\": [...]}} entries (ShareGPT)")
    out = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(turns, list) and len(turns) >= 2:
            out.append((_value(turns[0]), _value(turns[1])))
    return tuple(out)


def _value(turn: Any) -> str:
    value = turn.get("value") if isinstance(turn, dict) else None
    return value if isinstance(value, str) else ""
