#!/usr/bin/env bash
# A GPU held by a process autotune did not start, on one real GPU (H100/H200, no network): the
# trials must be `gpu-busy` faults (the environment's), never `infeasible oom` (the
# configuration's); and an out-of-memory under load must be `oom` (phase load) when the GPU is
# ours, `gpu-busy` (cause oom) when a foreign process still holds it after teardown.
#
# What it does, in under 8 minutes:
#   1. installs the carried wheels (.whl/, made by bench/gpu/fetch_wheels.sh) into /tmp/site and
#      writes a random-weight Llama (HIDDEN x LAYERS, bf16) with autotune.testing.tiny_model;
#   2. (i) held: a torch process takes all but HOLD_LEAVE_GIB of the free GPU memory and keeps
#      it; a transformers-serve study (3 trials at most, gpu_busy_wait_s 10, quarantine after 3)
#      must record only gpu-busy faults naming its pid and stop with the slot quarantined;
#      the holder is killed;
#   3. (ii) oom under load: one trial of the untuned server; once its KV cache is in (the GPU
#      more than CACHE_FRACTION used), a holder takes all but OOM_LEAVE_MIB of what is left, so
#      the load's forward passes run out of memory:
#        a. oom-kept: the holder stays through teardown -> expected gpu-busy, cause oom;
#        b. oom-released: the holder is killed as soon as the server logs the out-of-memory,
#           so the GPU is free again at teardown -> expected oom, phase load;
#   4. writes to $OUT: summary.txt (per study and trial: outcome, kind, cause, phase, message),
#      show-<study>.json (`study show --json`), nvidia-smi.txt (the two queries autotune asks,
#      while held), run.log, env.txt and logs.tar.gz (the trials' server logs).
#
# Run it from the repo root with .whl carried, e.g. through the device tool:
#   run(command="bash bench/gpu/gpu_busy.sh", carry=[".whl"], timeout_s=600)
# Knobs (env): DEADLINE_S (default 470: the whole script), HIDDEN, LAYERS, VOCAB, HOLD_LEAVE_GIB,
# OUT_LEN, CACHE_FRACTION, OOM_LEAVE_MIB, WORK.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
START=$(date +%s)
DEADLINE_S="${DEADLINE_S:-470}"
OUT="${OUT:-$REPO/out}"
WORK="${WORK:-/tmp/autotune-gpu-busy}"
HIDDEN="${HIDDEN:-2048}"
LAYERS="${LAYERS:-16}"
VOCAB="${VOCAB:-32000}"
HOLD_LEAVE_GIB="${HOLD_LEAVE_GIB:-3}"
CACHE_FRACTION="${CACHE_FRACTION:-0.6}"
OOM_LEAVE_MIB="${OOM_LEAVE_MIB:-256}"
OUT_LEN="${OUT_LEN:-128}"
PY="${PYTHON:-python3}"
rm -rf "$WORK/autotune-artifacts" "$WORK/studies.db"
mkdir -p "$OUT" "$WORK/hf-cache"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
HOLDER_PID=""
WATCH_PID=""

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[$(elapsed)s] $*"; }
left() { echo $(( DEADLINE_S - $(elapsed) )); }
stop_holder() {  # only the processes this script started, by their pid
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null; WATCH_PID=""
  if [ -n "$HOLDER_PID" ]; then kill -9 "$HOLDER_PID" 2>/dev/null; wait "$HOLDER_PID" 2>/dev/null; fi
  HOLDER_PID=""
}
trap stop_holder EXIT

# 1. wheels, environment, model -------------------------------------------------------------------
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$REPO"
else
  say "no .whl/ here: using the installed packages (run bench/gpu/fetch_wheels.sh and carry .whl)"
  export PYTHONPATH="$REPO"
fi
export HF_HUB_OFFLINE=1 HF_HUB_CACHE="$WORK/hf-cache" TOKENIZERS_PARALLELISM=false
{
  "$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "transformers", "optuna", "pydantic", "fastapi", "uvicorn", "openai"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(f"{name} MISSING: {exc!r}")
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
import transformers.cli.serving.completion  # noqa: F401
import autotune.cli.app, autotune.execution.gpu_check  # noqa: F401
print("imports ok")
EOF
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
grep -q "imports ok" "$OUT/env.txt" || { say "imports failed: see env.txt"; exit 1; }

MODEL="$WORK/llama-h${HIDDEN}-l${LAYERS}"
if [ ! -f "$MODEL/config.json" ]; then
  say "writing the random-weight model to $MODEL"
  "$PY" -m autotune.testing.tiny_model "$MODEL" --hidden-size "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" \
    --dtype bfloat16 --device cuda --max-position-embeddings 8192 || exit 1
fi

# The holder: `now` takes all but LEAVE MiB of the free memory at once; `after-cache` first waits,
# with no CUDA context of its own, until the GPU is more than FRACTION used (the server's KV
# cache is in), then does the same. It prints what it holds, touches READY, and keeps it.
cat > "$WORK/holder.py" <<'EOF'
import subprocess, sys, time
from pathlib import Path

mode, leave_mib, ready, fraction = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
if mode == "after-cache":
    while True:
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
        used, total = (float(v) for v in out.split(",")[:2])
        if used > fraction * total:
            break
        time.sleep(0.2)
    time.sleep(0.5)
import torch

free, total = torch.cuda.mem_get_info()
want, held, blocks = free - leave_mib * 2**20, 0, []
for chunk in (2**30, 2**26, 2**22):
    while want - held >= chunk:
        try:
            blocks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            break
        held += chunk
free_now = torch.cuda.mem_get_info()[0]
print(f"holder: holding {held / 2**30:.1f} GiB of {total / 2**30:.1f} GiB; {free_now / 2**30:.2f} GiB free", flush=True)
ready.write_text(str(held))
while True:
    time.sleep(60)
EOF

start_holder() {  # MODE LEAVE_MIB
  rm -f "$WORK/holder.ready"
  "$PY" "$WORK/holder.py" "$1" "$2" "$WORK/holder.ready" "$CACHE_FRACTION" &
  HOLDER_PID=$!
  say "holder started: pid $HOLDER_PID ($1, leaving $2 MiB)"
}

STORAGE="sqlite:///$WORK/studies.db"
write_config() {  # NAME WAIT_S QUARANTINE_AFTER RETRIES CONCURRENCY PROMPTS
  cat > "$WORK/$1.yaml" <<EOF
name: $1
target:
  engine: transformers
  model: $MODEL
  ready_timeout_s: 240
  gpu_busy_wait_s: $2
  env: {HF_HUB_OFFLINE: "1", HF_HUB_CACHE: "$WORK/hf-cache", TOKENIZERS_PARALLELISM: "false"}
space: transformers_cb
objective: transformers_gpu
objective_overrides:
  load: {concurrency: $5, num_prompts: $6, input_len: 512, output_len: $OUT_LEN, warmup_prompts: 4,
         request_timeout_s: 120}
baseline: {cb_max_memory_percent: 0.9}
budget: {trials: 1}
quarantine_after: $3
max_fault_retries: $4
storage: $STORAGE
seed: 0
EOF
}

run_study() {  # NAME LIMIT_S
  say "study $1: at most ${2}s"
  timeout -s INT -k 20 "$2" "$PY" -m autotune study start "$WORK/$1.yaml"
  say "study $1 exited with $?"
  "$PY" -m autotune study show "$1" --storage "$STORAGE" --json > "$OUT/show-$1.json" 2>/dev/null
  "$PY" - "$1" "$OUT/show-$1.json" "$3" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
name, path, expected = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    trials = json.load(open(path))["trials"]
except Exception as exc:  # noqa: BLE001
    print(f"{name}: no study record ({exc})"); sys.exit(0)
print(f"== {name} (expected: {expected})")
for t in trials:
    f = t.get("failure") or {}
    print(f"  trial {t['number']}: {t['outcome']} kind={f.get('kind', '-')} cause={f.get('cause', '-')} "
          f"phase={f.get('phase', '-')} :: {f.get('message', '')}")
kinds = [(t.get("failure") or {}).get("kind") for t in trials]
print(f"  {len(trials)} trials: {sum(t['outcome'] == 'fault' for t in trials)} fault "
      f"({kinds.count('gpu-busy')} gpu-busy), {sum(t['outcome'] == 'infeasible' for t in trials)} infeasible, "
      f"{sum(t['outcome'] == 'ok' for t in trials)} ok")
EOF
}

# 2. (i) a held GPU: gpu-busy faults, no trial infeasible ---------------------------------------------
start_holder now $(( HOLD_LEAVE_GIB * 1024 ))
for _ in $(seq 120); do [ -f "$WORK/holder.ready" ] && break; sleep 0.5; done
{ echo "# while held"; nvidia-smi --query-gpu=index,uuid,memory.total,memory.used --format=csv,noheader,nounits
  nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits; } \
  | tee "$OUT/nvidia-smi.txt"
write_config held 10 3 2 16 32
run_study held 120 "every trial gpu-busy naming pid $HOLDER_PID, none infeasible, the slot quarantined"
stop_holder

# 3. (ii) out of memory under load -------------------------------------------------------------------
for variant in oom-kept oom-released; do
  LIMIT=$(( $(left) - 10 ))
  [ "$variant" = oom-kept ] && LIMIT=$(( LIMIT / 2 ))
  if [ "$LIMIT" -lt 60 ]; then say "no time left for $variant"; continue; fi
  start_holder after-cache "$OOM_LEAVE_MIB"
  if [ "$variant" = oom-released ]; then
    LOG="$WORK/autotune-artifacts/logs/$variant/trial-0000.log"
    ( until grep -q -E "out of memory|OutOfMemoryError" "$LOG" 2>/dev/null; do sleep 0.1; done
      kill -9 "$HOLDER_PID" 2>/dev/null && echo "[watch] the server logged an out-of-memory: holder killed" ) &
    WATCH_PID=$!
    EXPECTED="oom, phase load (the holder was gone by teardown)"
  else
    EXPECTED="gpu-busy, cause oom (the holder still there at teardown)"
  fi
  write_config "$variant" 10 1 0 64 256
  run_study "$variant" "$LIMIT" "$EXPECTED"
  [ -f "$WORK/holder.ready" ] || say "the holder never allocated (the KV cache never took $CACHE_FRACTION of the GPU)"
  stop_holder
done

# 4. results --------------------------------------------------------------------------------------------
tar -C "$WORK/autotune-artifacts" -czf "$OUT/logs.tar.gz" logs 2>/dev/null || true
say "done"
cat "$OUT/summary.txt"
