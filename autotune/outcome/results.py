"""External benchmark output -> a flat ``{metric name: float}`` dict that an objective can use.

:func:`parse_result` reads what a benchmark command wrote (its result file or its stdout) and
returns finite numbers only, under stable names, so that an objective's ``metric`` and constraints
(``p99_ttft_ms <= 2000``, ``busbw_gbps@all_reduce@43008``) name the same thing whichever engine's
benchmark produced it. Kinds:

``sglang-bench-serving``
    ``python -m sglang.bench_serving --output-file F``: JSON Lines, one object per run appended;
    the last line is read.
``vllm-bench``
    ``vllm bench serve --save-result`` (or ``benchmarks/benchmark_serving.py``): one JSON object
    (with ``--append-result``, one per line; the last is read).
``nccl-tests``
    The text table of nccl-tests' ``all_reduce_perf``, ``all_gather_perf``, ... .
``json``
    Any JSON document; every top-level number, plus the one ``json_path`` picks.
``collectives``
    The JSON document of ``python -m autotune.benchmarks.collectives``.

Metric names: :func:`parse_result`.

Anything that shows the benchmark did not measure what it should (no result, a failed or
incomplete run, wrong results reported, zero completed requests) raises :class:`ResultParseError`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal, get_args

ResultKind = Literal["sglang-bench-serving", "vllm-bench", "nccl-tests", "json", "collectives"]
RESULT_KINDS: tuple[str, ...] = get_args(ResultKind)
COLLECTIVES_STATS: tuple[str, ...] = ("latency_us", "latency_us_median", "latency_us_min", "latency_us_max",
                                      "algbw_gbps", "busbw_gbps")
"""``collectives``: the per op and size metrics, recorded as ``STAT@OP@BYTES``."""
COLLECTIVES_TOTALS: tuple[str, ...] = ("nccl_mem_mib", "nccl_mem_mib_after_all", "world_size")
"""``collectives``: the metrics of the whole run (the first two on NCCL runs only)."""


class ResultParseError(ValueError):
    """The text does not hold the result it should; the message is one line that says why."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def parse_result(kind: ResultKind, text: str, *, json_path: str | None = None) -> dict[str, float]:
    """Parse a benchmark's output into a flat dict of finite floats (kinds: the module docstring).

    Metric names:

    - serving kinds (both): ``output_throughput``, ``total_throughput``, ``request_throughput`` (tok/s,
      tok/s, req/s), ``completed``, ``duration_s``, and ``{mean,median,p99}_{ttft,tpot,itl,e2e_latency}_ms``
      where the benchmark reported them (vLLM's ``e2el`` is renamed ``e2e_latency``; other percentiles
      and ``std_`` keep the same pattern, e.g. ``p95_itl_ms``). Every other finite top-level number is
      kept under its own name (``total_input_tokens``, ``failed``, ``accept_length``, ...).
      ``total_throughput`` is (input + output tokens) / duration when a version does not report it.
    - ``nccl-tests``: per size in bytes, from the out-of-place columns ``time_us@SIZE``,
      ``algbw_gbps@SIZE``, ``busbw_gbps@SIZE`` and from the in-place ones ``time_us_inplace@SIZE``, ...;
      ``avg_busbw_gbps`` (nccl-tests' "# Avg bus bandwidth" line) and ``max_busbw_gbps``.
    - ``collectives``: per op and size ``latency_us@OP@BYTES`` (mean), ``latency_us_median@OP@BYTES``,
      ``latency_us_min@OP@BYTES``, ``latency_us_max@OP@BYTES``, ``algbw_gbps@OP@BYTES``,
      ``busbw_gbps@OP@BYTES``; ``nccl_mem_mib`` and ``nccl_mem_mib_after_all`` (NCCL runs only),
      ``world_size``.
    - ``json``: top-level numbers under their keys; the ``json_path`` value under the path's last part.

    Args:
        kind: which benchmark wrote ``text``.
        text: the benchmark's result file or output, as text.
        json_path: for the JSON kinds, a dotted path (``results.0.busbw_gbps``, ``metrics.tput``)
            to one more number, recorded under the path's last part (the whole path when that part
            is a list index); it overrides a top-level number of the same name.

    Raises:
        ResultParseError: ``text`` lacks the expected result, or reports a failed run.
        ValueError: ``kind`` is unknown, or ``json_path`` is given for ``nccl-tests``.
    """
    parser = _PARSERS.get(kind)
    if parser is None:
        raise ValueError(f"unknown result kind {kind!r} (choose from {', '.join(RESULT_KINDS)})")
    if kind == "nccl-tests":
        if json_path is not None:
            raise ValueError("json_path does not apply to nccl-tests output")
        return _parse_nccl_tests(text)
    doc = _load_json(text, kind)
    metrics = parser(doc)
    if json_path is not None:
        name, value = _pick(doc, json_path)
        metrics[name] = value
    if not metrics:
        raise ResultParseError(f"{kind}: no top-level numbers in the JSON, and no json_path to pick one")
    return metrics


# ---------------------------------------------------------------------------------------------
# JSON helpers.


def _load_json(text: str, kind: str) -> Any:
    """The whole text as JSON; failing that, its last non-empty line (JSON Lines, appended runs)."""
    if not text.strip():
        raise ResultParseError(f"{kind}: the output is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole_error:
        last = next(line for line in reversed(text.splitlines()) if line.strip())
        try:
            return json.loads(last)
        except json.JSONDecodeError:
            raise ResultParseError(f"{kind}: not JSON ({whole_error.msg} at line {whole_error.lineno})") from None


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (bools, strings, null, NaN and infinities are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _top_level_numbers(doc: Any) -> dict[str, float]:
    if not isinstance(doc, dict):
        return {}
    out: dict[str, float] = {}
    for key, value in doc.items():
        number = finite_number(value)
        if number is not None:
            out[str(key)] = number
    return out


def _pick(doc: Any, path: str) -> tuple[str, float]:
    """The number at dotted ``path`` in ``doc`` and the name it is recorded under."""
    parts = [p for p in path.split(".")]
    if not path or any(not p for p in parts):
        raise ValueError(f"invalid json_path {path!r}")
    node = doc
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the top level"
        if isinstance(node, dict):
            if part not in node:
                keys = ", ".join(sorted(map(str, node)))[:200]
                raise ResultParseError(f"json_path {path!r}: no key {part!r} at {where} (keys: {keys})")
            node = node[part]
        elif isinstance(node, list):
            if not re.fullmatch(r"-?\d+", part) or not -len(node) <= int(part) < len(node):
                raise ResultParseError(f"json_path {path!r}: no index {part!r} in the list of {len(node)} at {where}")
            node = node[int(part)]
        else:
            raise ResultParseError(f"json_path {path!r}: {where} is a {type(node).__name__}, not an object or list")
    value = node
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    number = finite_number(value)
    if number is None:
        raise ResultParseError(f"json_path {path!r}: {value!r} is not a finite number")
    name = path if re.fullmatch(r"-?\d+", parts[-1]) else parts[-1]
    return name, number


# ---------------------------------------------------------------------------------------------
# Serving benchmarks (sglang.bench_serving, vllm bench serve).

_LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e_latency)_ms$")
_RENAMES = {"duration": "duration_s", "total_token_throughput": "total_throughput"}


def _serving_name(key: str) -> str:
    """A serving benchmark's key under its normalised name (``mean_e2el_ms`` -> ``mean_e2e_latency_ms``)."""
    m = _LATENCY_KEY.match(key)
    if m is not None:
        return f"{m.group(1)}_{'e2e_latency' if m.group(2) == 'e2el' else m.group(2)}_ms"
    return _RENAMES.get(key, key)


def _serving(kind: str) -> Callable[[Any], dict[str, float]]:
    def parse(doc: Any) -> dict[str, float]:
        if not isinstance(doc, dict):
            raise ResultParseError(f"{kind}: expected a JSON object, got {type(doc).__name__}")
        numbers = _top_level_numbers(doc)
        metrics: dict[str, float] = {}
        for key, value in numbers.items():
            name = _serving_name(key)
            if name != key and name in numbers:
                continue  # the benchmark reported the normalised name itself: that one wins
            metrics[name] = value
        for required in ("output_throughput", "completed"):
            if required not in metrics:
                keys = ", ".join(sorted(map(str, doc)))[:300]
                raise ResultParseError(f"{kind}: no {required!r} in the result (keys: {keys})")
        if metrics["completed"] <= 0:
            raise ResultParseError(f"{kind}: the benchmark completed 0 requests")
        if "total_throughput" not in metrics:
            tokens = [metrics.get("total_input_tokens"), metrics.get("total_output_tokens")]
            duration = metrics.get("duration_s")
            if None not in tokens and duration:
                metrics["total_throughput"] = sum(t for t in tokens if t is not None) / duration
        return metrics

    return parse


# ---------------------------------------------------------------------------------------------
# nccl-tests.

_NCCL_TESTS_FAILURE = re.compile(r"Test (NCCL |CUDA )?failure|Invalid number of GPUs")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_TIME_COLUMNS = ("time", "cputime")


def _nccl_tests_layout(lines: list[str]) -> tuple[int, int, str]:
    """(leading columns, columns per out-of-place / in-place group, name of the check column).

    Read from the header (``# size count type redop root time algbw busbw #wrong time ...``); older
    versions have no ``root`` and an ``error`` column, per-iteration timing adds four columns per
    group. Without a header, the current default layout.
    """
    for line in lines:
        if not line.startswith("#"):
            continue
        cols = line.lstrip("#").split()
        if len(cols) < 6 or cols[0] != "size" or "busbw" not in cols:
            continue
        times = [i for i, c in enumerate(cols) if c in _TIME_COLUMNS]
        if not times:
            break
        lead = times[0]
        group = times[1] - times[0] if len(times) > 1 else len(cols) - lead
        check = cols[lead + 3] if lead + 3 < len(cols) else "#wrong"
        return lead, group, check
    return 5, 4, "#wrong"


def _parse_nccl_tests(text: str) -> dict[str, float]:
    """nccl-tests' table -> per-size time / algbw / busbw, and the average bus bandwidth.

    A row is ``size count type redop root`` and then, out-of-place and in-place, ``time algbw busbw
    #wrong`` (``#wrong`` is ``N/A`` when checking is off; more columns follow with per-iteration
    timing). A size that repeats (outputs concatenated) keeps its last row.
    """
    lines = text.splitlines()
    for line in lines:
        if _NCCL_TESTS_FAILURE.search(line):
            raise ResultParseError(f"nccl-tests failed: {line.strip()}")
    lead, group, check = _nccl_tests_layout(lines)
    metrics: dict[str, float] = {}
    out_of_place_busbw: list[float] = []
    avg: float | None = None
    for line in lines:
        if line.startswith("#"):
            m = _AVG_BUSBW.match(line)
            if m is not None:
                try:
                    avg = float(m.group(1))
                except ValueError:
                    avg = None
            m = _OUT_OF_BOUNDS.match(line)
            if m is not None and int(m.group(1)) > 0:
                raise ResultParseError(f"nccl-tests found {m.group(1)} out-of-bounds values: {line.strip()}")
            continue
        tokens = line.split()
        if not tokens or not tokens[0].isdigit() or len(tokens) < lead + 4:
            continue
        size = int(tokens[0])
        for suffix, start in (("", lead), ("_inplace", lead + group)):
            cols = tokens[start : start + 4]
            if len(cols) < 4:
                continue
            try:
                time_us, algbw, busbw = float(cols[0]), float(cols[1]), float(cols[2])
            except ValueError:
                raise ResultParseError(f"nccl-tests: unreadable result row: {line.strip()}") from None
            if check == "#wrong" and cols[3] != "N/A" and float(cols[3]) > 0:
                place = "in-place" if suffix else "out-of-place"
                raise ResultParseError(f"nccl-tests reported {cols[3]} wrong elements at {size} B ({place})")
            metrics[f"time_us{suffix}@{size}"] = time_us
            metrics[f"algbw_gbps{suffix}@{size}"] = algbw
            metrics[f"busbw_gbps{suffix}@{size}"] = busbw
            if not suffix:
                out_of_place_busbw.append(busbw)
    if not out_of_place_busbw:
        raise ResultParseError("nccl-tests: no result rows (size count type redop root time algbw busbw ...)")
    if avg is None or not math.isfinite(avg):
        raise ResultParseError("nccl-tests: no '# Avg bus bandwidth' line; the run did not finish")
    metrics["avg_busbw_gbps"] = avg
    metrics["max_busbw_gbps"] = max(out_of_place_busbw)
    return metrics


# ---------------------------------------------------------------------------------------------
# Generic JSON and this package's collectives benchmark.


def _parse_json(doc: Any) -> dict[str, float]:
    return _top_level_numbers(doc)


def _parse_collectives(doc: Any) -> dict[str, float]:
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not doc["results"]:
        raise ResultParseError("collectives: no 'results' list in the document")
    metrics: dict[str, float] = {}
    for i, row in enumerate(doc["results"]):
        try:
            op, nbytes, lat = str(row["op"]), int(row["bytes"]), row["latency_us"]
            values = dict(zip(COLLECTIVES_STATS, (lat["mean"], lat["median"], lat["min"], lat["max"],
                                                  row["algbw_gbps"], row["busbw_gbps"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultParseError(f"collectives: result {i} lacks {exc}") from None
        if row.get("correct") is False:
            raise ResultParseError(f"collectives: {op} of {nbytes} B gave a wrong result")
        for name, value in values.items():
            number = finite_number(value)
            if number is None:
                raise ResultParseError(f"collectives: {name} of {op} at {nbytes} B is {value!r}, not a number")
            metrics[f"{name}@{op}@{nbytes}"] = number
    for key in COLLECTIVES_TOTALS:
        number = finite_number(doc.get(key))
        if number is not None:
            metrics[key] = number
    return metrics


_PARSERS: dict[str, Callable[[Any], dict[str, float]]] = {
    "sglang-bench-serving": _serving("sglang-bench-serving"),
    "vllm-bench": _serving("vllm-bench"),
    "nccl-tests": lambda doc: {},  # text, not JSON: handled by _parse_nccl_tests
    "json": _parse_json,
    "collectives": _parse_collectives,
}
