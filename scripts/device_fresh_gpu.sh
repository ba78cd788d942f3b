#!/usr/bin/env bash
# One call to a lent GPU that fine-tunes the device model on speech rendered there while it trains
# (pasu.models.fresh_feed; the device's training log, sitting 21). The call carries, in the ignored folder .gpu:
#   whl/                 the wheels the machine lacks (espnet, librosa, soundfile, pyroomacoustics, ...; CPython 3.12)
#   tts-*.tar.xz         the TTS engines (scripts/gpu_tts_bundle.sh)
#   shared-data.tar.xz   the shared SLURP/HWU64 text and noise (`tar -cJf .gpu/shared-data.tar.xz -C ../shared/data
#                        slurp hwu64 slurpfood noise`)
#   build.json           data/corpus-full/build.json: the builds plan with its voices, held-out ones kept out
#   pseudo-train-slots.jsonl, swap-train.jsonl   the other training texts (`pasu text-intent pseudo-label`,
#                        `pasu corpus swap-slots`)
#   devpack/part0        500 `dev` utterances' features (`scripts/device_finetune.py pack ... --set train_utterances=0`)
# The checkout with every shipped model is over 64 MiB: `bash scripts/gpu_checkout.sh out` before, `back` after.
#   bash scripts/device_fresh_gpu.sh MINUTES NAME "SETS" [NAME "SETS" ...]   # runs side by side on one feed
# Writes NAME-avg.pt, NAME-best.pt and runs.tar.gz (logs, summaries, histories, the builds' logs) to $OUT.
# A dry run here, where the engines and wheels are installed: PASU_GPU_SETUP=0 OUT=/tmp/o PATH=.venv/bin:$PATH bash ...
set -euo pipefail
export PYTHONUNBUFFERED=1
minutes=$1
shift
started=$(date +%s)
say() { echo "[$(( $(date +%s) - started )) s] $*"; }

# Python: the wheels, and `pasu` from this checkout (spawned corpus workers import it too, so a path, not a hook)
setup=${PASU_GPU_SETUP:-1}
[ "$setup" = 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/pasu && cp -r pasu/. /tmp/pkg/pasu/
for sub in device cloud models protos; do ln -sfn "$PWD/$sub" "/tmp/pkg/pasu/$sub"; done
export PYTHONPATH=/tmp/site:/tmp/pkg
python3 -c "import torch, espnet2, soundfile, pyroomacoustics; print('torch', torch.__version__, torch.cuda.is_available())"

# the engines: their package files where they expect them, and only the libraries the machine lacks
[ "$setup" = 0 ] || tar -xJf .gpu/tts-files.tar.xz -C / --skip-old-files
rm -rf /tmp/tts-libs && mkdir -p /tmp/tts-libs && tar -xJf .gpu/tts-libs.tar.xz -C /tmp/tts-libs
known=$(ldconfig -p | awk 'NR > 1 {print $1}')
for lib in $( [ "$setup" = 0 ] || find /tmp/tts-libs -name '*.so*' -type f); do
  grep -qx "$(basename "$lib")" <<< "$known" || cp -n "$lib" /usr/lib/x86_64-linux-gnu/
done
[ "$setup" = 0 ] || ldconfig
echo "hello there" > /tmp/hello.txt
espeak-ng -v en-us -w /tmp/e.wav -f /tmp/hello.txt && flite -voice slt -f /tmp/hello.txt -o /tmp/f.wav \
  && pico2wave -l en-US -w /tmp/p.wav "hello there" \
  && echo '(utt.save.wave (utt.synth (Utterance Text "hello there")) "/tmp/h.wav" (quote riff))' > /tmp/hello.scm \
  && festival --batch /tmp/hello.scm && sox /tmp/f.wav /tmp/s.wav pitch 50 \
  || { for b in espeak-ng flite pico2wave festival sox; do ldd "$(command -v $b)" | grep "not found"; done; exit 3; }
say "engines run: $(ls -la /tmp/e.wav /tmp/f.wav /tmp/p.wav /tmp/h.wav | awk '{print $5}' | tr '\n' ' ')"

# the builds, in the background, and the training runs on what they have rendered so far
mkdir -p /tmp/shared && tar -xJf .gpu/shared-data.tar.xz -C /tmp/shared
build() {  # OUT VARIANT UTTERANCES WORKERS [--train-text FILE]
  python3 -m pasu.corpus.cli build --preset full --data-dir /tmp/shared --voices .gpu/build.json --splits train \
    --out "$1" --train-variant "$2" --train-utterances "$3" --workers "$4" "${@:5}" > "$1.log" 2>&1 &
}
build /tmp/fresh10 10 90000 5
build /tmp/fresh11 11 60000 4 --train-text .gpu/pseudo-train-slots.jsonl
build /tmp/fresh12 12 60000 4 --train-text .gpu/swap-train.jsonl
mkdir -p /tmp/runs
names=() pids=()
while [ $# -ge 2 ]; do
  # shellcheck disable=SC2086
  python3 scripts/device_finetune.py fresh --model models/shipped/device --dev-packs .gpu/devpack/part0 \
    --builds /tmp/fresh10 /tmp/fresh11 /tmp/fresh12 --out "/tmp/runs/$1" --set minutes="$minutes" $2 \
    > "/tmp/runs/$1.log" 2>&1 &
  names+=("$1") pids+=($!)
  shift 2
done
(sleep 60 && say "rendered after a minute: $(cat /tmp/fresh1*/shards/*.jsonl 2>/dev/null | wc -l) utterances") &
wait "${pids[@]}" || true
say "runs done; rendered: $(cat /tmp/fresh1*/shards/*.jsonl 2>/dev/null | wc -l) utterances"
pkill -f "pasu.corpus.cli build" || true
pkill -f "multiprocessing.spawn" || true  # their render workers
for name in "${names[@]}"; do
  grep -v -E "Warning|warn\(" "/tmp/runs/$name.log" | tail -8
  cp "/tmp/runs/$name/avg.pt" "$OUT/$name-avg.pt" || true
  cp "/tmp/runs/$name/best.pt" "$OUT/$name-best.pt" || true
done
cp /tmp/fresh1*.log /tmp/runs/ || true
tar -czf "$OUT/runs.tar.gz" -C /tmp/runs --exclude='*.pt' .
say "done"
