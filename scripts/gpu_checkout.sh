#!/usr/bin/env bash
# A call to a lent GPU carries the checkout and what it names, 64 MiB in all, and the tracked checkout is larger
# (about 75 MiB, most of it shipped weights). The device and Whisper fine-tuning calls read only the device model
# (scripts/device_finetune_gpu.sh) or their pack (scripts/whisper_finetune_gpu.sh), so the other shipped models
# step out of the checkout for the calls, which leaves about 11 MiB, and come back after:
#   bash scripts/gpu_checkout.sh out     # before the first call
#   bash scripts/gpu_checkout.sh back    # after the last (the tests and the main job need them)
set -euo pipefail
cd "$(dirname "$0")/.."
held="${PASU_GPU_HELD:-/tmp/pasu-gpu-held}"
moved=(models/shipped/text_intent models/shipped/cloud models/shipped/baseline_branchformer
       models/shipped/baseline_conformer models/shipped/lm models/shipped/device/offramp)
case "${1:-}" in
  out)
    for path in "${moved[@]}"; do mkdir -p "$held/$(dirname "$path")" && mv "$path" "$held/$path"; done
    echo "moved to $held: ${moved[*]}" ;;
  back)
    for path in "${moved[@]}"; do mv "$held/$path" "$path"; done
    git status --short -- models/shipped ;;
  *) echo "usage: $0 out | back" >&2; exit 2 ;;
esac
