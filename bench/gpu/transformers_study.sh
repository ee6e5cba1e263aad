#!/usr/bin/env bash
# autotune against the real transformers serve --continuous-batching on one GPU (the H200 device
# machine: Python 3.12, torch 2.11, transformers 5.17, no network).
#
# What it does, in under 10 minutes:
#   1. installs the carried wheels (.whl/, made by bench/gpu/fetch_wheels.sh) into /tmp/site;
#   2. writes a random-weight Llama of ~3B parameters (bf16, hidden 3072, 28 layers, vocab 32000)
#      with autotune.testing.tiny_model, initialised on the GPU;
#   3. runs one study per load concurrency (CONCURRENCIES, default "16 128"), TRIALS_PER_STUDY
#      trials each (default 6, so 12 in all), over search_spaces/transformers_cb.yaml:
#      --cb-max-memory-percent, --cb-max-batch-tokens, --cb-block-size, --cb-use-cuda-graph.
#      Concurrency is a property of the workload, not a server flag: each study fixes it with
#      `objective_overrides: {load: {concurrency: N}}`, and the best configuration is found per
#      concurrency (tuning it as a free parameter would just pick the largest one);
#   4. exports the first study's best as a launch profile (profile-c<N>.sh: its provenance, engine
#      version, GPU, driver and NCCL, in the header) and launches it once more with `autotune
#      verify` (verify-c<N>.json: measured against recorded); VERIFY=0 skips this;
#   5. writes to $OUT: summary.json and summary.md (per trial: outcome, failure kind, throughput,
#      startup_s; best per study vs the baseline), show-c<N>.json (`study show --json`),
#      best-c<N>.json (`study best --json`: the mean of the best's measurements and their count),
#      run.log, env.txt (versions, GPU) and logs.tar.gz (every trial's server log).
#
# Run it from the repo root with .whl carried, e.g. through the device tool:
#   run(command="bash bench/gpu/transformers_study.sh", carry=[".whl"], timeout_s=600)
# Knobs (env): CONCURRENCIES, TRIALS_PER_STUDY, DEADLINE_S (default 540: the whole script),
# HIDDEN, LAYERS, VOCAB, INPUT_LEN, OUTPUT_LEN, PROMPTS_PER_CONCURRENCY, WORK, DEVICE, SPACE
# (a CPU dry run: DEVICE=cpu HIDDEN=64 LAYERS=2 VOCAB=1024 SPACE=<a small space file> ...).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
START=$(date +%s)
DEADLINE_S="${DEADLINE_S:-540}"
OUT="${OUT:-$REPO/out}"
WORK="${WORK:-/tmp/autotune-gpu}"
CONCURRENCIES="${CONCURRENCIES:-16 128}"
TRIALS_PER_STUDY="${TRIALS_PER_STUDY:-6}"
HIDDEN="${HIDDEN:-3072}"
LAYERS="${LAYERS:-28}"
VOCAB="${VOCAB:-32000}"
INPUT_LEN="${INPUT_LEN:-256}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
PROMPTS_PER_CONCURRENCY="${PROMPTS_PER_CONCURRENCY:-3}"
DEVICE="${DEVICE:-cuda}"
SPACE="${SPACE:-transformers_cb}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT" "$WORK/hf-cache"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[$(elapsed)s] $*"; }

# 1. wheels ---------------------------------------------------------------------------------------
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$REPO"
else
  say "no .whl/ here: using the installed packages (run bench/gpu/fetch_wheels.sh and carry .whl)"
  export PYTHONPATH="$REPO"
fi
# Nothing can be fetched here; an empty hub cache also keeps transformers 5.17's /v1/models from
# listing (and the load generator from naming) some other cached model.
export HF_HUB_OFFLINE=1 HF_HUB_CACHE="$WORK/hf-cache" TOKENIZERS_PARALLELISM=false
{
  "$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "transformers", "tokenizers", "fastapi", "starlette", "uvicorn", "openai", "pydantic",
             "optuna", "sqlalchemy", "typer", "click", "rich", "aiohttp", "huggingface_hub", "accelerate", "psutil"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}  {getattr(mod, '__file__', '')}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name} MISSING: {exc!r}")
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
import transformers.cli.serving.completion  # noqa: F401  (serve's own imports: fastapi, openai, ...)
import autotune.cli.app  # noqa: F401
print("imports ok")
EOF
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
grep -q "imports ok" "$OUT/env.txt" || { say "imports failed: see env.txt"; exit 1; }

# 2. model ----------------------------------------------------------------------------------------
MODEL="$WORK/llama-h${HIDDEN}-l${LAYERS}"
if [ ! -f "$MODEL/config.json" ]; then
  say "writing the random-weight model to $MODEL"
  "$PY" -m autotune.testing.tiny_model "$MODEL" --hidden-size "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" \
    --dtype bfloat16 --device "$DEVICE" --max-position-embeddings 8192 | tee "$WORK/model.json" || exit 1
fi
du -sh "$MODEL"

# 3. studies --------------------------------------------------------------------------------------
STORAGE="sqlite:///$WORK/studies.db"
set -- $CONCURRENCIES
N_STUDIES=$#
I=0
for C in $CONCURRENCIES; do
  NAME="tf-gpu-c$C"
  PROMPTS=$(( C * PROMPTS_PER_CONCURRENCY ))
  [ "$PROMPTS" -lt 32 ] && PROMPTS=32
  cat > "$WORK/$NAME.yaml" <<EOF
name: $NAME
target:
  engine: transformers
  model: $MODEL
  ready_timeout_s: 240
  env: {HF_HUB_OFFLINE: "1", HF_HUB_CACHE: "$WORK/hf-cache", TOKENIZERS_PARALLELISM: "false"}
space: $SPACE
objective: transformers_gpu
objective_overrides:
  load: {concurrency: $C, num_prompts: $PROMPTS, input_len: $INPUT_LEN, output_len: $OUTPUT_LEN,
         warmup_prompts: 4, request_timeout_s: 120}
budget: {trials: $TRIALS_PER_STUDY}
storage: $STORAGE
seed: 0
EOF
  # The time left is shared among the studies still to run; SIGINT lets autotune tear the server
  # down and record the running trial before it stops.
  LEFT=$(( DEADLINE_S - 30 - $(elapsed) ))
  SLICE=$(( LEFT / (N_STUDIES - I) ))
  I=$(( I + 1 ))
  if [ "$SLICE" -lt 45 ]; then say "no time left for $NAME"; continue; fi
  say "study $NAME: concurrency $C, $PROMPTS prompts, $TRIALS_PER_STUDY trials, at most ${SLICE}s"
  timeout -s INT -k 20 "$SLICE" "$PY" -m autotune study start "$WORK/$NAME.yaml"
  say "study $NAME exited with $?"
  "$PY" -m autotune study show "$NAME" --storage "$STORAGE" --json > "$OUT/show-c$C.json" 2>/dev/null
  # the best as `study best` reports it: the mean of its measurements (confirmation runs), count, interval
  "$PY" -m autotune study best "$NAME" --storage "$STORAGE" --json > "$OUT/best-c$C.json" 2>/dev/null
done

# 4. the first study's best as a launch profile, launched again by `autotune verify` -----------------
if [ "${VERIFY:-1}" = 1 ]; then
  set -- $CONCURRENCIES
  NAME="tf-gpu-c$1"
  if "$PY" -m autotune export "$NAME" --format sh -o "$OUT/profile-c$1.sh" --storage "$STORAGE"; then
    LEFT=$(( DEADLINE_S - 20 - $(elapsed) ))
    if [ "$LEFT" -ge 60 ]; then
      say "verify: the profile of $NAME, at most ${LEFT}s"
      timeout -s INT -k 20 "$LEFT" "$PY" -m autotune verify "$OUT/profile-c$1.sh" --json > "$OUT/verify-c$1.json"
      say "verify exited with $?"
    else
      say "no time left to verify $NAME"
    fi
  fi
fi

# 5. results --------------------------------------------------------------------------------------
"$PY" bench/gpu/summarize.py --out "$OUT" --model-info "$WORK/model.json" "$OUT"/show-c*.json
tar -C "$WORK/autotune-artifacts" -czf "$OUT/logs.tar.gz" logs 2>/dev/null || true
say "done"
