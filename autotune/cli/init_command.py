"""``autotune init``: write a starter study config for one's own server.

Contracts:

- Takes the answers as flags; on a terminal it asks for the engine and the model when they are
  not given, elsewhere their absence is a usage error (exit 2).
- Writes the config (:func:`autotune.config.starter.starter_files`) and, where parameters were left
  out of the built-in space, the space beside it; an existing file is refused unless ``--force``.
  Nothing else is created: no storage, no study.
"""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path
from typing import Optional

import typer

from autotune.cli.common import err as _err
from autotune.cli.common import user_umask
from autotune.config.starter import STARTERS, Answers, starter_files
from autotune.config.study import DEFAULT_STORAGE
from autotune.errors import UsageError
from autotune.util.files import check_output, write_whole

ENGINES = sorted({e for e, _ in STARTERS})

EXAMPLES = """\b
Examples:
  autotune init --engine vllm --model meta-llama/Llama-3.1-8B-Instruct
  autotune init --engine sglang --model /models/GLM-5 --tp 8 --input-tokens 1024 --output-tokens 256
  autotune init --engine vllm --model ./tiny --device cpu --python /opt/vllm/bin/python
  autotune init --engine sglang --model /models/m --tp 4 --host ssh://root@gpu1:22 --python /opt/venv/bin/python"""


def init(
    engine: Optional[str] = typer.Option(None, "--engine", metavar="|".join(ENGINES), help="The server's engine."),
    model: Optional[str] = typer.Option(None, "--model", metavar="PATH|HUB_ID", help="A model path or a Hugging Face id."),
    tp: int = typer.Option(1, "--tp", min=1, max=1024, metavar="N", help="GPUs of one server (tensor parallel size)."),
    device: str = typer.Option("gpu", "--device", metavar="gpu|cpu", help="gpu, or cpu (vLLM's CPU build, transformers)."),
    host: str = typer.Option("local", "--host", metavar="local|ssh://USER@HOST:PORT", help="Where the servers run."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="The interpreter that has the engine (default: the one running autotune; "
                                              "python3 over SSH)."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", metavar="PATH",
                                              help="An EAGLE draft model: tune speculative decoding (SGLang)."),
    input_tokens: Optional[int] = typer.Option(None, "--input-tokens", min=1, metavar="N", help="Tokens per prompt."),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens", min=1, metavar="N", help="Tokens generated per request."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, metavar="N", help="Requests in flight."),
    prompts: Optional[int] = typer.Option(None, "--prompts", min=1, metavar="N", help="Requests per trial."),
    dataset: Optional[str] = typer.Option(None, "--dataset", metavar="FILE",
                                          help="A ShareGPT JSON file: its conversations are the prompts."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, metavar="N", help="The trial budget (default: 30 on GPUs, 6 on CPU)."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="The study name (default: from the model)."),
    storage: str = typer.Option(DEFAULT_STORAGE, "--storage", metavar="URL", help="Optuna storage URL the study will use."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", help="Where to write (default: NAME.yaml)."),
    force: bool = typer.Option(False, "--force", help="Replace files that exist."),
) -> None:
    """Write a short, commented study config for your own vLLM, SGLang or transformers server,
    with the built-in space and objective for it; `autotune study start FILE --dry-run` then
    shows the baseline's launch."""
    engine = engine or _ask("engine", f"Engine ({', '.join(ENGINES)})")
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine}: not one of {', '.join(ENGINES)}")
    if device not in ("gpu", "cpu"):
        raise UsageError(f"--device {device}: gpu or cpu")
    model = model or _ask("model", "Model (a path or a Hugging Face id)")
    name = name or _name_from(model)
    load = {"input_len": input_tokens, "output_len": output_tokens, "concurrency": concurrency, "num_prompts": prompts}
    answers = Answers(engine=engine, model=model, name=name, device=device, tp=tp, host=host, python=python,
                      draft_model=draft_model, load={k: v for k, v in load.items() if v is not None},
                      dataset=dataset, trials=trials,
                      storage=storage)
    config_path = output or Path(f"{name}.yaml")
    files = starter_files(answers, config_path=str(config_path), when=datetime.date.today().isoformat())
    writes = [(config_path, files.config)]
    if files.space_file is not None and files.space is not None:
        writes.append((Path(files.space_file), files.space))
    for path, _ in writes:  # every file checked before any is written
        check_output(path)
        if path.exists() and not force:
            raise UsageError(f"{path} exists: give --force to replace it, or -o another file")
    for path, text in writes:
        write_whole(path, text, 0o666 & ~(user_umask() or 0o022))  # a config the user edits and shares
        _err.print(f"wrote {path}", markup=False, soft_wrap=True)
    _err.print(f"next: autotune study start {config_path} --dry-run", markup=False, soft_wrap=True)


init.__doc__ = f"{init.__doc__}\n\n{EXAMPLES}"


def _ask(what: str, prompt: str) -> str:
    """The answer to ``prompt`` on a terminal; elsewhere a usage error naming ``--what``."""
    if not sys.stdin.isatty():
        raise UsageError(f"missing --{what} (autotune init asks for it only on a terminal)")
    return str(typer.prompt(prompt)).strip()


def _name_from(model: str) -> str:
    """A study name from a model path or hub id: its last part, in the characters a name allows."""
    base = Path(model.rstrip("/")).name or "study"
    name = re.sub(r"[^\w.@+-]+", "-", base).strip("-._@+") or "study"
    return name[:200]
