from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.outcome.results import RESULT_KINDS, ResultParseError, parse_result

DATA = Path(__file__).resolve().parents[1] / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def _one_line_error(excinfo: pytest.ExceptionInfo[ResultParseError]) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


# --- sglang.bench_serving ---------------------------------------------------------------------


def test_sglang_reads_the_last_run_of_the_jsonl_file() -> None:
    text = _read("sglang_bench_serving.jsonl")
    last = json.loads(text.splitlines()[-1])
    m = parse_result("sglang-bench-serving", text)
    assert m["output_throughput"] == pytest.approx(last["output_throughput"])
    assert m["total_throughput"] == pytest.approx(last["total_throughput"])
    assert m["request_throughput"] == pytest.approx(last["request_throughput"])
    assert m["completed"] == 1024
    assert m["duration_s"] == pytest.approx(96.40218)
    for stat in ("mean", "median", "p99"):
        for what in ("ttft", "tpot", "itl", "e2e_latency"):
            assert f"{stat}_{what}_ms" in m
    assert m["p99_ttft_ms"] == pytest.approx(6120.4)
    assert m["p95_itl_ms"] == pytest.approx(last["p95_itl_ms"])  # other stats pass through
    assert m["accept_length"] == pytest.approx(2.87)
    assert "request_rate" not in m  # Infinity is not a metric
    assert "duration" not in m and "sharegpt_output_len" not in m
    assert all(isinstance(v, float) for v in m.values())


def test_sglang_without_total_throughput_derives_it_from_tokens_and_duration() -> None:
    first = _read("sglang_bench_serving.jsonl").splitlines()[0]
    raw = json.loads(first)
    assert "total_throughput" not in raw  # an older version's result
    m = parse_result("sglang-bench-serving", first)
    expected = (raw["total_input_tokens"] + raw["total_output_tokens"]) / raw["duration"]
    assert m["total_throughput"] == pytest.approx(expected)
    assert "accept_length" not in m  # null


def test_sglang_total_token_throughput_name_is_normalised() -> None:
    doc = {"output_throughput": 10.0, "total_token_throughput": 30.0, "completed": 4, "duration": 2.0}
    m = parse_result("sglang-bench-serving", json.dumps(doc))
    assert m["total_throughput"] == 30.0 and "total_token_throughput" not in m
    assert m["duration_s"] == 2.0


# --- vllm bench serve -------------------------------------------------------------------------


def test_vllm_save_result() -> None:
    raw = json.loads(_read("vllm_bench_serve.json"))
    m = parse_result("vllm-bench", _read("vllm_bench_serve.json"))
    assert m["output_throughput"] == pytest.approx(raw["output_throughput"])
    assert m["total_throughput"] == pytest.approx(raw["total_token_throughput"])
    assert m["request_throughput"] == pytest.approx(raw["request_throughput"])
    assert m["completed"] == 15 and m["failed"] == 1
    assert m["duration_s"] == pytest.approx(raw["duration"])
    assert m["mean_e2e_latency_ms"] == pytest.approx(raw["mean_e2el_ms"])
    assert m["p99_e2e_latency_ms"] == pytest.approx(raw["p99_e2el_ms"])
    assert m["p90_ttft_ms"] == pytest.approx(raw["p90_ttft_ms"])
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms"):
        assert m[key] == pytest.approx(raw[key])
    assert not {"request_rate", "latencies", "mean_e2el_ms", "total_token_throughput", "label"} & set(m)


def test_vllm_appended_results_take_the_last() -> None:
    raw = json.loads(_read("vllm_bench_serve.json"))
    second = dict(raw, output_throughput=999.5)
    m = parse_result("vllm-bench", json.dumps(raw) + "\n" + json.dumps(second) + "\n")
    assert m["output_throughput"] == 999.5


@pytest.mark.parametrize("kind", ["vllm-bench", "sglang-bench-serving"])
def test_serving_results_that_are_not_results(kind: str) -> None:
    for text, needle in [
        ("", "empty"),
        ("Traceback (most recent call last):\n  boom", "not JSON"),
        ('{"completed": 3, "duration": 1.0}', "output_throughput"),
        ('{"output_throughput": 0.0, "completed": 0, "duration": 1.0}', "0 requests"),
        ("[1, 2, 3]", "JSON object"),
    ]:
        with pytest.raises(ResultParseError) as excinfo:
            parse_result(kind, text)  # type: ignore[arg-type]
        assert needle in _one_line_error(excinfo)


# --- nccl-tests -------------------------------------------------------------------------------


def test_nccl_tests_all_reduce_rows_and_average() -> None:
    m = parse_result("nccl-tests", _read("nccl_tests_all_reduce_h200x8.txt"))
    row = next(
        line for line in _read("nccl_tests_all_reduce_h200x8.txt").splitlines() if line.strip().startswith("43008 ")
    )
    cols = row.split()
    assert m["time_us@43008"] == float(cols[5])
    assert m["algbw_gbps@43008"] == float(cols[6])
    assert m["busbw_gbps@43008"] == float(cols[7])
    assert m["time_us_inplace@43008"] == float(cols[9])
    assert m["busbw_gbps_inplace@43008"] == float(cols[11])
    assert m["avg_busbw_gbps"] == 54.815
    sizes = [43008 * 2**k for k in range(7)]
    assert all(f"busbw_gbps@{s}" in m for s in sizes)
    assert m["max_busbw_gbps"] == max(m[f"busbw_gbps@{s}"] for s in sizes)
    # nccl-tests' busbw is algbw x 2(n-1)/n for all_reduce on 8 ranks (to the printed precision).
    assert m["busbw_gbps@2752512"] == pytest.approx(m["algbw_gbps@2752512"] * 2 * 7 / 8, abs=0.01)


def test_nccl_tests_older_all_gather_output() -> None:
    m = parse_result("nccl-tests", _read("nccl_tests_all_gather_pcie.txt"))
    assert m["avg_busbw_gbps"] == pytest.approx(6.02214)
    assert m["busbw_gbps@4194304"] == pytest.approx(m["algbw_gbps@4194304"] * 7 / 8, abs=0.01)
    assert "time_us@1024" in m and "time_us_inplace@1048576" in m


def test_nccl_tests_invalid_usage_is_an_error_with_nccls_text() -> None:
    with pytest.raises(ResultParseError) as excinfo:
        parse_result("nccl-tests", _read("nccl_tests_all_gather_invalid_usage.txt"))
    message = _one_line_error(excinfo)
    assert "invalid usage" in message and "NCCL_ALGO was set to Tree" in message


def test_nccl_tests_wrong_elements_are_an_error() -> None:
    lines = _read("nccl_tests_all_reduce_h200x8.txt").splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("172032 "))
    cols = lines[i].split()
    cols[8] = "12"  # out-of-place #wrong
    lines[i] = "  ".join(cols)
    with pytest.raises(ResultParseError) as excinfo:
        parse_result("nccl-tests", "\n".join(lines))
    assert "12 wrong elements at 172032 B (out-of-place)" in _one_line_error(excinfo)


def test_nccl_tests_incomplete_or_failed_runs() -> None:
    text = _read("nccl_tests_all_reduce_h200x8.txt")
    truncated = text[: text.index("# Out of bounds")]
    with pytest.raises(ResultParseError, match="Avg bus bandwidth"):
        parse_result("nccl-tests", truncated)
    failed = text.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 4 FAILED")
    with pytest.raises(ResultParseError, match="out-of-bounds"):
        parse_result("nccl-tests", failed)
    with pytest.raises(ResultParseError, match="no result rows"):
        parse_result("nccl-tests", "# nThread 1 nGpus 8\n# Avg bus bandwidth : 0\n")
    with pytest.raises(ResultParseError, match="no result rows"):
        parse_result("nccl-tests", "")


def test_nccl_tests_unchecked_and_per_iteration_layouts() -> None:
    unchecked = _read("nccl_tests_all_reduce_h200x8.txt").replace("       0\n", "     N/A\n")
    assert parse_result("nccl-tests", unchecked)["busbw_gbps@43008"] > 0
    # With per-iteration timing each group has i_min i_max i_p99 i_cv% after #wrong.
    cols = ["size", "count", "type", "redop", "root"] + 2 * [
        "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"
    ]  # fmt: skip
    head = "# " + "  ".join(f"{c:>8}" for c in cols)
    row = (
        "       43008         21504  bfloat16     sum      -1    16.45    2.61    4.58       0    15.90    17.80    "
        "17.70     2.10    16.28    2.64    4.62       0    15.80    17.10    17.05     1.90"
    )
    m = parse_result("nccl-tests", f"{head}\n{row}\n# Avg bus bandwidth    : 4.6 ")
    assert m["busbw_gbps@43008"] == 4.58
    assert m["time_us_inplace@43008"] == 16.28 and m["busbw_gbps_inplace@43008"] == 4.62


# --- json -------------------------------------------------------------------------------------

DOC = {
    "version": 2,
    "name": "run-7",
    "ok": True,
    "nan_value": None,
    "metrics": {"throughput": 1234.5, "as_text": "17.25", "label": "x"},
    "results": [{"busbw_gbps": 3.25}, {"busbw_gbps": 4.5}],
}


def test_json_top_level_numbers_and_a_picked_path() -> None:
    text = json.dumps(DOC)
    assert parse_result("json", text) == {"version": 2.0}
    assert parse_result("json", text, json_path="results.1.busbw_gbps") == {"version": 2.0, "busbw_gbps": 4.5}
    assert parse_result("json", text, json_path="metrics.throughput")["throughput"] == 1234.5
    assert parse_result("json", text, json_path="metrics.as_text")["as_text"] == 17.25
    assert parse_result("json", "[[1, 2], [3, 4]]", json_path="1.0") == {"1.0": 3.0}


def test_json_path_errors() -> None:
    text = json.dumps(DOC)
    for path, needle in [
        ("metrics.missing", "no key 'missing' at metrics"),
        ("results.5.busbw_gbps", "no index '5'"),
        ("metrics.label", "not a finite number"),
        ("version.x", "is a int"),
    ]:
        with pytest.raises(ResultParseError) as excinfo:
            parse_result("json", text, json_path=path)
        assert needle in _one_line_error(excinfo)
    with pytest.raises(ResultParseError, match="no top-level numbers"):
        parse_result("json", '{"a": "b"}')
    with pytest.raises(ValueError, match="invalid json_path"):
        parse_result("json", text, json_path="metrics..x")


# --- collectives ------------------------------------------------------------------------------


def test_collectives_document() -> None:
    text = _read("collectives_gloo.json")
    doc = json.loads(text)
    m = parse_result("collectives", text)
    first = doc["results"][0]
    assert m["latency_us@all_reduce@43008"] == first["latency_us"]["mean"]
    assert m["latency_us_median@all_reduce@43008"] == first["latency_us"]["median"]
    assert m["busbw_gbps@all_reduce@4194304"] > 0
    assert m["algbw_gbps@all_gather@43008"] > 0
    assert m["world_size"] == 2
    assert "nccl_mem_mib" not in m  # gloo: null

    nccl = dict(doc, backend="nccl", nccl_mem_mib=312.5, nccl_mem_mib_after_all=330.1)
    m = parse_result("collectives", json.dumps(nccl), json_path="results.0.count")
    assert m["nccl_mem_mib"] == 312.5 and m["nccl_mem_mib_after_all"] == 330.1
    assert m["count"] == first["count"]


def test_collectives_document_from_nccl_on_two_h200s() -> None:
    text = _read("collectives_nccl_h200x2.json")  # a real run: NCCL 2.28.9, torch 2.11, NVLink
    doc = json.loads(text)
    m = parse_result("collectives", text)
    assert doc["backend"] == "nccl" and doc["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert m["nccl_mem_mib"] == doc["nccl_mem_mib"] > 0
    assert m["nccl_mem_mib_after_all"] >= m["nccl_mem_mib"]
    assert 1 < m["latency_us@all_reduce@43008"] < 100
    assert m["busbw_gbps@all_reduce@4194304"] == pytest.approx(m["algbw_gbps@all_reduce@4194304"])  # 2(n-1)/n = 1
    assert m["busbw_gbps@all_gather@4194304"] == pytest.approx(m["algbw_gbps@all_gather@4194304"] / 2, rel=1e-4)


def test_collectives_malformed() -> None:
    doc = json.loads(_read("collectives_gloo.json"))
    wrong = json.loads(json.dumps(doc))
    wrong["results"][1]["correct"] = False
    with pytest.raises(ResultParseError, match="wrong result"):
        parse_result("collectives", json.dumps(wrong))
    with pytest.raises(ResultParseError, match="no 'results'"):
        parse_result("collectives", json.dumps(dict(doc, results=[])))
    broken = json.loads(json.dumps(doc))
    del broken["results"][0]["latency_us"]
    with pytest.raises(ResultParseError, match="lacks"):
        parse_result("collectives", json.dumps(broken))


# --- the function's own contract -------------------------------------------------------------


def test_unknown_kind_and_misused_json_path() -> None:
    assert set(RESULT_KINDS) == {"sglang-bench-serving", "vllm-bench", "nccl-tests", "json", "collectives"}
    with pytest.raises(ValueError, match="unknown result kind"):
        parse_result("locust", "{}")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="json_path"):
        parse_result("nccl-tests", _read("nccl_tests_all_reduce_h200x8.txt"), json_path="a")
