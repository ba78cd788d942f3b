#!/usr/bin/env bash
# The commands the GPU calls of the device's fine-tuning run (scripts/device_finetune.py; the recipe in
# models/shipped/device/TRAINING_LOG.md). A call carries 64 MiB with the checkout, so the pack travels one part
# per call in the ignored folder .gpu (.gpu/partN), and the first call also carries .gpu/whl: the wheels the GPU
# machine lacks (espnet, typeguard, librosa and what importing them needs, for CPython 3.12). /tmp outlives a
# call while the machine stays warm (30 s), so each call keeps its part there and the last one trains on all.
#   bash scripts/device_finetune_gpu.sh smoke     # call 1, .gpu/whl and .gpu/part0 carried: a 20-s run, its step rate
#   bash scripts/device_finetune_gpu.sh keep      # the calls between, one part each
#   bash scripts/device_finetune_gpu.sh train NAME "--set lr=6e-4" [NAME "SETS" ...]   # the last: runs in parallel
# A part or the wheels already kept in /tmp are not copied again (a warm machine may keep the ignored .gpu too).
# The checkout alone is over 64 MiB: `bash scripts/gpu_checkout.sh out` before the calls, `back` after.
set -euo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/espnet2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
fi
mkdir -p /tmp/packs /tmp/runs
for part in .gpu/part*; do
  if [ -d "$part" ] && [ ! -d "/tmp/packs/$(basename "$part")" ]; then cp -r "$part" /tmp/packs/; fi
done
echo "kept: $(ls /tmp/packs | tr '\n' ' ')"
train() {  # NAME SETS: one run on every kept part, its log in /tmp/runs/NAME.log
  # shellcheck disable=SC2086
  python3 scripts/device_finetune.py train --model models/shipped/device --packs /tmp/packs/part* \
    --out "/tmp/runs/$1" $2 > "/tmp/runs/$1.log" 2>&1
}
case "$1" in
  smoke)
    python3 -c "import espnet2, librosa, torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    train smoke "--set minutes=0.35 --set eval_seconds=10" || true
    grep -v Warning /tmp/runs/smoke.log | tail -12 ;;
  keep) ;;
  train)
    shift
    names=()
    while [ $# -ge 2 ]; do train "$1" "$2" & names+=("$1"); shift 2; done
    wait || true
    for name in "${names[@]}"; do
      grep -v Warning "/tmp/runs/$name.log" | tail -6
      cp "/tmp/runs/$name/avg.pt" "$OUT/$name-avg.pt" || true
      cp "/tmp/runs/$name/best.pt" "$OUT/$name-best.pt" || true
    done
    tar -czf "$OUT/runs.tar.gz" -C /tmp/runs --exclude='*.pt' . ;;
  *) echo "usage: $0 smoke | keep | train NAME SETS [NAME SETS ...]" >&2; exit 2 ;;
esac
