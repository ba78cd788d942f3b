#!/usr/bin/env bash
# The commands the GPU calls of Whisper's fine-tuning run (scripts/whisper_finetune.py; the recipe in
# models/shipped/cloud/README.md). Each call carries the ignored folder .gpu: the wheels the GPU machine lacks
# (.gpu/whl: soundfile, cffi, pycparser for CPython 3.12) and one pack part (.gpu/part0 or .gpu/part1), since a
# call takes 64 MiB and the pack is about 120 MiB.
#   bash scripts/whisper_finetune_gpu.sh keep               # call 1, part0 carried: keep it there, 30-s smoke run
#   bash scripts/whisper_finetune_gpu.sh train --set minutes=2.2 ...  # call 2, part1 carried: train on both
# The checkout alone is over 64 MiB: `bash scripts/gpu_checkout.sh out` before the calls, `back` after.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import soundfile, torch; print('soundfile', soundfile.__libsndfile_version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
case "$1" in
  keep)  # /tmp outlives the call while the machine stays warm; the next call's carry replaces .gpu
    mkdir -p /tmp/packs && rm -rf /tmp/packs/part0 && cp -r .gpu/part0 /tmp/packs/
    python3 scripts/whisper_finetune.py train --packs /tmp/packs/part0 --out /tmp/smoke --set minutes=0.5 \
      --set eval_seconds=10 2>&1 | grep -v Warning | tail -25
    cp /tmp/smoke/summary.json "$OUT/smoke-summary.json" ;;
  train)
    shift
    python3 scripts/whisper_finetune.py train --packs /tmp/packs/part0 .gpu/part1 --out "$OUT" "$@" 2>&1 \
      | grep -v Warning | tail -40 ;;
  *) echo "usage: $0 keep | train [--set FIELD=VALUE ...]" >&2; exit 2 ;;
esac
