#!/usr/bin/env bash
# Everything one call of scripts/device_fresh_gpu.sh carries, in the ignored folder .gpu (about 49 MB; a few
# minutes here, more if data/corpus-full's dev split or the pseudo-labelled text must be made first):
#   bash scripts/device_fresh_prepare.sh
#   bash scripts/gpu_checkout.sh out        # the checkout and .gpu together stay under a call's 64 MiB
#   (the call) bash scripts/device_fresh_gpu.sh 7 A "--set lr=3e-4" ...   with .gpu carried
#   bash scripts/gpu_checkout.sh back
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${PASU_SHARED_DATA:-../shared/data}
pasu=.venv/bin/pasu
mkdir -p .gpu/whl .git/info
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude

# the wheels the GPU image lacks, for its CPython 3.12 (the versions pinned here, pure Python where they can be)
wheels=(espnet==202511 typeguard==4.6.1 humanfriendly==10.0 ConfigArgParse==1.9.0 librosa==0.11.0 soundfile==0.14.0
        cffi pycparser soxr audioread pooch decorator platformdirs pyroomacoustics==0.10.1 kaldiio torch_complex)
for wheel in "${wheels[@]}"; do
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl "$wheel"
done

bash scripts/gpu_tts_bundle.sh
tar -cJf .gpu/shared-data.tar.xz -C "$shared" slurp hwu64 slurpfood noise

# the plan's voices (the held-out ones stay out of training) and the 500 `dev` utterances the runs are judged on
[ -f data/corpus-full/dev.jsonl ] || "$pasu" corpus build --preset full --out data/corpus-full --splits dev
cp data/corpus-full/build.json .gpu/
rm -rf .gpu/devpack
.venv/bin/python scripts/device_finetune.py pack --model models/shipped/device --corpora data/corpus-full \
  --out .gpu/devpack --set train_utterances=0 --set dev_utterances=500

# the training texts beside the labelled one, as the shipped device's last runs had them (its card's recipe)
[ -f data/pseudo-train-slots.jsonl ] || "$pasu" text-intent pseudo-label --out data/pseudo-train-slots.jsonl
cp data/pseudo-train-slots.jsonl .gpu/
"$pasu" corpus swap-slots --count 9600 --seed 12 --out .gpu/swap-train.jsonl --also data/pseudo-train-slots.jsonl
du -sh .gpu
