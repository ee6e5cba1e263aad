"""A random-weight Llama checkpoint with an offline tokenizer, for engine tests and GPU benchmarks.

``make_tiny_llama(path)`` writes, with ``save_pretrained``, a ``LlamaForCausalLM`` of random weights
(safetensors) and a word-level tokenizer built locally (nothing is fetched from a hub), so that
``transformers serve PATH`` loads it with no network. The tokenizer maps each whitespace-separated
word to one token, so a prompt of ``n`` words is ``n`` input tokens; words it does not know become
``<unk>``. The generation config names no end-of-sequence token: a request always generates its
``max_tokens``, as a benchmark wants (``ignore_eos`` without asking for it).

The same function makes a model of benchmark size on a GPU machine, fast: the weights are
initialised on the target device in the target dtype. For hidden sizes from 1024 the heads are
128 wide with a quarter as many key/value heads (grouped-query attention, as in Llama 3) and the
MLP is 8/3 x hidden: hidden 3072 with 28 layers and vocab 32000 is 3.0B parameters (6 GB in
bfloat16), hidden 4096 with 32 layers 5.9B::

    python -m autotune.testing.tiny_model /tmp/tiny                       # ~0.2M parameters, CPU
    python -m autotune.testing.tiny_model /tmp/llama3b --hidden-size 3072 --layers 28 \\
        --vocab 32000 --dtype bfloat16 --device cuda

It needs ``torch``, ``transformers`` and ``tokenizers`` (imported when called).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from autotune.util.words import COMMON_WORDS

__all__ = ["make_tiny_llama", "parameter_count", "main"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
_SPACE = "\u2581"  # the Metaspace marker: a token "\u2581word" decodes to " word"

# Every word the load generator sends (one token each), then the words of the engine tests' chat
# prompts. The rest of the vocabulary is filled with synthetic words ``w<N>``.
_WORDS = (*COMMON_WORDS, "hello", "tell", "a", "upon", "lived", "model", "server", "token")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _build_tokenizer(vocab: int) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` of exactly ``vocab`` tokens, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(w.lower() for w in _WORDS))
    base = len(SPECIAL_TOKENS)
    if vocab < base + 1:
        raise ValueError(f"vocab must be at least {base + 1}, got {vocab}")
    entries = list(SPECIAL_TOKENS) + [_SPACE + w for w in words[: vocab - base]]
    n = 0
    while len(entries) < vocab:
        entries.append(f"{_SPACE}w{n}")
        n += 1
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(entries)}, unk_token="<unk>"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=_SPACE, prepend_scheme="always")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _shapes(hidden_size: int, heads: int | None, kv_heads: int | None, intermediate_size: int | None) -> tuple[int, int, int]:
    if heads is None:
        head_dim = 128 if hidden_size >= 1024 else max(8, hidden_size // 4)
        if hidden_size % head_dim:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of the head size {head_dim}: give --heads")
        heads = hidden_size // head_dim
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of heads {heads}")
    if kv_heads is None:
        kv_heads = heads if heads < 8 else max(1, heads // 4)
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    if intermediate_size is None:
        # Llama's 8/3 x hidden, rounded up to a multiple of 256 (64 for tiny models): 4096 -> 11008.
        step = 256 if hidden_size >= 1024 else 32
        intermediate_size = -(-(8 * hidden_size // 3) // step) * step
    return heads, kv_heads, intermediate_size


def parameter_count(*, hidden_size: int, layers: int, vocab: int, heads: int | None = None,
                    kv_heads: int | None = None, intermediate_size: int | None = None) -> int:
    """The number of parameters :func:`make_tiny_llama` would write for these shapes."""
    heads, kv_heads, inter = _shapes(hidden_size, heads, kv_heads, intermediate_size)
    head_dim = hidden_size // heads
    attn = hidden_size * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden_size * inter
    per_layer = attn + mlp + 2 * hidden_size
    return layers * per_layer + 2 * vocab * hidden_size + hidden_size


def make_tiny_llama(
    path: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    vocab: int = 1024,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Write a random-weight ``LlamaForCausalLM`` and its tokenizer to ``path``; return the path.

    The folder holds ``config.json``, ``generation_config.json``, ``model.safetensors`` (or shards)
    and the tokenizer files; ``transformers serve PATH`` and ``AutoModelForCausalLM.from_pretrained``
    load it offline. Weights are normal(0, 0.02) (norms 1), deterministic for a ``seed``, created
    directly on ``device`` in ``dtype`` so that a multi-billion-parameter model takes seconds on a GPU.

    Raises:
        ValueError: inconsistent shapes (e.g. ``hidden_size`` not a multiple of ``heads``).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    heads, kv_heads, inter = _shapes(hidden_size, heads, kv_heads, intermediate_size)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (e.g. float32, bfloat16, float16)")

    tokenizer = _build_tokenizer(vocab)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    with torch.device(device), torch.no_grad():
        model = LlamaForCausalLM._from_config(config, dtype=torch_dtype)
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02, generator=gen)
            else:
                param.fill_(1.0)
    model.config.dtype = torch_dtype
    # No end-of-sequence token: every request generates its max_tokens (a benchmark's ignore_eos).
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.testing.tiny_model PATH [--hidden-size H] [--layers L] ...``"""
    ap = argparse.ArgumentParser(
        prog="python -m autotune.testing.tiny_model",
        description="Write a random-weight Llama (safetensors) and an offline tokenizer to PATH.",
    )
    ap.add_argument("path")
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--intermediate-size", type=int, default=None)
    ap.add_argument("--max-position-embeddings", type=int, default=4096)
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    ap.add_argument("--device", default="cpu", help="where the weights are initialised: cpu | cuda")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    started = time.monotonic()
    try:
        n = parameter_count(hidden_size=args.hidden_size, layers=args.layers, vocab=args.vocab, heads=args.heads,
                            kv_heads=args.kv_heads, intermediate_size=args.intermediate_size)
        path = make_tiny_llama(
            args.path, hidden_size=args.hidden_size, layers=args.layers, vocab=args.vocab, heads=args.heads,
            kv_heads=args.kv_heads, intermediate_size=args.intermediate_size,
            max_position_embeddings=args.max_position_embeddings, dtype=args.dtype, device=args.device, seed=args.seed,
        )
    except ValueError as exc:
        sys.stderr.write(f"tiny_model: error: {exc}\n")
        return 2
    print(json.dumps({"path": str(path), "parameters": n, "seconds": round(time.monotonic() - started, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
