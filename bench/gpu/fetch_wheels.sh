#!/usr/bin/env bash
# Download, on a machine with pip access, the wheels that the H200 device machine lacks for
# `transformers serve` and for autotune itself, into .whl/ at the repo root (ignored by git).
# The device image (Python 3.12, torch 2.11, transformers 5.17) already has aiohttp, requests,
# numpy, PyYAML, rich, typer, click, tqdm, packaging, psutil, accelerate, huggingface-hub,
# tokenizers, safetensors, jinja2, MarkupSafe, anyio, httpx, h11, annotated-doc, uvloop
# (/work/.library/device/KINDS.md "Python packages already there"); it has no fastapi,
# starlette, uvicorn, openai or pydantic, and none of optuna's own needs. The versions are the
# ones tested together on CPU (transformers 5.17 and 5.24 serving a tiny model).
#
#   bench/gpu/fetch_wheels.sh            # then carry .whl (see bench/gpu/transformers_study.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"

WHEELS=(
  # transformers serve (transformers[serving] minus what the image has)
  fastapi==0.165.0
  opentelemetry-api==1.45.2   # fastapi >= 0.160 imports it
  starlette==1.10.0
  uvicorn==0.54.0
  openai==3.57.0
  httpx2==2.16.2              # openai 3.x talks httpx2, not the image's httpx
  httpcore2==2.16.2
  truststore==0.10.5
  anyio==4.16.0               # openai needs >= 4.10
  distro==1.9.0
  jiter==0.19.0
  sniffio==1.3.1
  idna==3.20                  # httpx2 needs >= 3.18
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  # autotune (study start/show/best; ray, fabric and optuna-dashboard are not needed for a
  # serial study on local hosts, so they are not carried)
  optuna==5.0.0
  alembic==1.20.1
  sqlalchemy==2.1.9
  mako==1.4.3
  colorlog==6.12.0
  greenlet==3.3.1
)

mkdir -p .whl
for spec in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "$spec"
done
ls -la .whl
du -sh .whl
