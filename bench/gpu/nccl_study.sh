#!/usr/bin/env bash
# NCCL-only study on a multi-GPU host (device kind nvidia-h200-x2 or larger), then the best
# configuration against NCCL's defaults at each message size, and which one each objective prefers.
#
#   bash bench/gpu/nccl_study.sh [TRIALS]        # from the repo root, on the GPU machine
#
# Needs autotune's dependencies that the machine lacks as wheels in .whl/ (bench/gpu/fetch_wheels.sh).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); it is never a search parameter.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
TRIALS=${1:-24}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
SIZES=8KB,42KB,256KB,1MB,4MB,32MB
BENCH="python3 -m autotune.benchmarks.collectives --backend nccl --ops all_reduce,all_gather --sizes $SIZES --dtype bf16 --warmup 10 --iters 50"
echo "GPUs: $NGPU"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true

# 1. NCCL's defaults at each size.
$BENCH --json "$OUT/defaults.json" 2> "$OUT/defaults.log" || { echo "defaults run failed"; tail -20 "$OUT/defaults.log"; }

# 2. The study.
NAME=nccl-h200x$NGPU
cat > "$OUT/nccl_study.yaml" <<YAML
name: $NAME
target: {engine: none, env: {NCCL_NVLS_ENABLE: "0"}}
space: nccl_only
objective: nccl
budget: {trials: $TRIALS}
storage: sqlite:///$OUT/nccl.db
seed: 0
YAML
START=$(date +%s)
python3 -m autotune study start "$OUT/nccl_study.yaml" > "$OUT/study.log" 2>&1
echo "study: exit $? in $(( $(date +%s) - START )) s"; tail -45 "$OUT/study.log"
S="--storage sqlite:///$OUT/nccl.db"
python3 -m autotune study show $NAME --json $S > "$OUT/show.json"
python3 -m autotune study best $NAME --json $S > "$OUT/best.json"
python3 -m autotune study explain $NAME $S > "$OUT/explain.txt" 2>&1; cat "$OUT/explain.txt"
python3 -m autotune export $NAME --format env $S -o "$OUT/best.env"

# 3. The best configuration at every size, in the same run as a second defaults pass.
( set -a; . <(grep -v '^#' "$OUT/best.env"); set +a; $BENCH --json "$OUT/best_sizes.json" 2> "$OUT/best_sizes.log" )
$BENCH --json "$OUT/defaults2.json" 2>> "$OUT/defaults.log"
python3 bench/gpu/nccl_compare.py "$OUT/defaults.json" "$OUT/defaults2.json" "$OUT/best_sizes.json" "$OUT/show.json" | tee "$OUT/compare.md"
# 4. Which of the two each objective prefers: the 42 KB all-reduce alone, or the engine mix (`nccl`).
python3 bench/gpu/nccl_objective.py "$OUT/defaults.json" "$OUT/defaults2.json" "$OUT/best_sizes.json" | tee "$OUT/objective.md"
