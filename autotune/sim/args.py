"""SGLang's server flags, parsed with argparse exactly as ``python -m sglang.launch_server`` does.

:class:`ServerArgs` holds what the simulator uses; ``None`` means "the engine's default", which
:func:`resolve` fills from the scenario. Other common SGLang flags are accepted and ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["ServerArgs", "build_parser", "parse_server_args", "flag_to_field", "args_from_mapping"]


@dataclass(frozen=True)
class ServerArgs:
    """The SGLang flags the simulated engine reads (``None``: engine default)."""

    model_path: str | None = None
    served_model_name: str | None = None
    tp_size: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool | None = None
    num_continuous_decode_steps: int = 1
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    chunked_prefill_size: int | None = None
    disable_radix_cache: bool | None = None
    kv_cache_dtype: str = "auto"
    context_length: int | None = None
    stream_interval: int = 1
    trust_remote_code: bool = False
    host: str = "127.0.0.1"
    port: int = 30000
    extra: dict[str, Any] = field(default_factory=dict)


# Flags that take a value and are accepted but not modelled (SGLang 0.5.x names).
_IGNORED_VALUE_FLAGS = (
    "--tokenizer-path", "--tokenizer-mode", "--load-format", "--dtype", "--quantization", "--revision",
    "--attention-backend", "--prefill-attention-backend", "--decode-attention-backend", "--sampling-backend",
    "--moe-runner-backend", "--fp8-gemm-backend", "--nsa-decode-backend", "--nsa-prefill-backend",
    "--reasoning-parser", "--tool-call-parser", "--chat-template", "--schedule-policy",
    "--schedule-conservativeness", "--dp-size", "--dp", "--ep-size", "--ep", "--pp-size", "--nnodes",
    "--node-rank", "--dist-init-addr", "--log-level", "--log-level-http", "--api-key", "--random-seed",
    "--max-prefill-tokens", "--speculative-draft-model-path", "--speculative-draft", "--download-dir",
    "--base-gpu-id", "--gpu-id-step", "--watchdog-timeout", "--device", "--cuda-graph-bs",
    "--torch-compile-max-bs", "--grammar-backend", "--mm-attention-backend", "--file-storage-path",
    "--speculative-accept-threshold-single", "--speculative-accept-threshold-acc", "--page-size",
    "--max-queued-requests", "--decode-log-interval", "--enable-custom-logit-processor-json",
)
_IGNORED_SWITCHES = (
    "--enable-torch-compile", "--enable-dp-attention", "--enable-ep-moe", "--enable-mixed-chunk",
    "--enable-metrics", "--skip-tokenizer-init", "--disable-overlap-schedule", "--enable-nan-detection",
    "--disable-custom-all-reduce", "--enable-p2p-check", "--enable-flashinfer-allreduce-fusion",
    "--show-time-cost", "--log-requests", "--enable-cache-report", "--disable-outlines-disk-cache",
    "--enable-nccl-nvls", "--enable-two-batch-overlap", "--enable-deterministic-inference",
    "--is-embedding", "--enable-multimodal", "--disable-fast-image-processor", "--enable-symm-mem",
)


def build_parser(prog: str = "python -m autotune.sim serve") -> argparse.ArgumentParser:
    """SGLang's flags plus the simulator's own (``--scenario``, ``--time-scale``)."""
    p = argparse.ArgumentParser(prog=prog, description="Simulated SGLang server on a scenario's host.")
    p.add_argument("--scenario", required=True, help="built-in scenario name or a scenario YAML file")
    p.add_argument("--time-scale", type=float, default=None,
                   help="start-up/failure time compression (default: env AUTOTUNE_SIM_TIME_SCALE or 120)")
    p.add_argument("--model-path", "--model", dest="model_path", type=str, default=None)
    p.add_argument("--served-model-name", type=str, default=None)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    # SGLang 0.5.14-0.5.19 accept both names (the second a deprecated alias); 0.5.20 and later only
    # the first, older releases only the second.
    p.add_argument("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", dest="cuda_graph_max_bs", type=int,
                   default=None)
    p.add_argument("--disable-cuda-graph", action="store_true", default=None)
    p.add_argument("--num-continuous-decode-steps", type=int, default=1)
    p.add_argument("--speculative-algorithm", type=str, default=None,
                   choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--disable-radix-cache", action="store_true", default=None)
    p.add_argument("--kv-cache-dtype", type=str, default="auto",
                   choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"])
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    for flag in _IGNORED_VALUE_FLAGS:
        p.add_argument(flag, type=str, default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_SWITCHES:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    return p


_FIELDS = {f.name for f in dataclasses.fields(ServerArgs)} - {"extra"}


def known_fields() -> frozenset[str]:
    """Names of the :class:`ServerArgs` fields (``tp`` is accepted as ``tp_size``)."""
    return frozenset(_FIELDS | {"tp"})


def _to_server_args(ns: argparse.Namespace) -> ServerArgs:
    values = vars(ns)
    known = {k: values[k] for k in _FIELDS if k in values}
    extra = {k: v for k, v in values.items() if k not in _FIELDS and k not in ("scenario", "time_scale") and v}
    return ServerArgs(**known, extra=extra)


def parse_server_args(argv: Sequence[str]) -> tuple[argparse.Namespace, ServerArgs]:
    """Parse a command line; a bad flag exits 2 with argparse's own ``error:`` line."""
    ns = build_parser().parse_args(list(argv))
    return ns, _to_server_args(ns)


def flag_to_field(key: str) -> str:
    """``--mem-fraction-static``, ``mem-fraction-static`` or ``mem_fraction_static`` -> field name."""
    return key.strip().lstrip("-").replace("-", "_")


def args_from_mapping(values: Mapping[str, str]) -> ServerArgs:
    """Build :class:`ServerArgs` from flag-name -> text pairs, converting like argparse does.

    Raises:
        ValueError: unknown flag or a value argparse would reject (one line).
    """
    parser = build_parser()
    argv: list[str] = ["--scenario", "x"]
    actions = {a.dest: a for a in parser._actions}  # noqa: SLF001 - argparse offers no public map
    for key, text in values.items():
        dest = flag_to_field(key)
        if dest == "tp":
            dest = "tp_size"
        action = actions.get(dest)
        if action is None or dest in ("scenario", "help"):
            raise ValueError(f"unknown server flag {key!r}")
        flag = action.option_strings[0]
        if action.nargs == 0:
            if str(text).strip().lower() in ("1", "true", "yes", "on", ""):
                argv.append(flag)
            elif str(text).strip().lower() not in ("0", "false", "no", "off"):
                raise ValueError(f"{flag} is a switch: give true or false, not {text!r}")
        else:
            argv += [flag, str(text)]
    try:
        ns = _quiet_parse(parser, argv)
    except _ParseError as exc:
        raise ValueError(str(exc)) from None
    return _to_server_args(ns)


class _ParseError(Exception):
    pass


def _quiet_parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    def fail(message: str) -> None:
        raise _ParseError(message)

    parser.error = fail  # type: ignore[method-assign]
    return parser.parse_args(argv)


def replace(args: ServerArgs, **changes: Any) -> ServerArgs:
    """A copy of ``args`` with fields changed."""
    return dataclasses.replace(args, **changes)


def merge_defaults(args: ServerArgs, defaults: Mapping[str, Any]) -> ServerArgs:
    """Fill fields left at ``None`` from a scenario's ``launch_defaults`` (flag name -> value)."""
    changes: dict[str, Any] = {}
    for key, value in defaults.items():
        name = flag_to_field(key)
        if name == "tp":
            name = "tp_size"
        if name in _FIELDS and getattr(args, name) is None:
            changes[name] = value
    return dataclasses.replace(args, **changes) if changes else args
