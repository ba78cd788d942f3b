#!/usr/bin/env bash
# The TTS engines for a lent GPU machine, which has none and reaches no package archive: the files of this
# machine's installed engine packages (scripts/install_tts.sh) that the training voices need, and the shared
# libraries those engines load beyond glibc, as two archives in the ignored folder .gpu for a call to carry.
#   bash scripts/gpu_tts_bundle.sh            # writes .gpu/tts-files.tar.xz and .gpu/tts-libs.tar.xz (~34 MB)
# There: `tar -xJf .gpu/tts-files.tar.xz -C / --skip-old-files`, and each library of tts-libs that the machine
# lacks copied into its library folder (scripts/device_fresh_gpu.sh), so nothing of the machine is replaced.
# Left out for size: mbrola's voice databases (4-55 MB each; the mbrola voices and festival's *_mbrola are then
# skipped by `pasu corpus build`), espeak-ng's other languages, pico's other languages, sox's format plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
mkdir -p "$out"
packages=(espeak-ng espeak-ng-data libespeak-ng1 libpcaudio0 libsonic0 flite libflite1 libttspico0 libttspico-data
          libttspico-utils festival festlex-cmu festlex-poslex festvox-kallpc16k festvox-rablpc16k festvox-kdlpc16k
          festvox-us-slt-hts libestools2.5 sox libsox3)
list=$(mktemp)
trap 'rm -f "$list" "$list.libs"' EXIT
for p in "${packages[@]}"; do dpkg -L "$p"; done | sort -u | while read -r f; do
  if [ -f "$f" ]; then echo "${f#/}"; fi
done | grep -v -E '^usr/share/(doc|man|lintian)/' \
     | grep -v -E 'espeak-ng-data/[a-z_]+_dict$' \
     | grep -v -E '^usr/share/pico/lang/(de-DE|es-ES|fr-FR|it-IT)_' > "$list"
echo "usr/lib/x86_64-linux-gnu/espeak-ng-data/en_dict" >> "$list"
tar -cf - -C / -T "$list" | xz -T0 -6 > "$out/tts-files.tar.xz"
# libraries the engines load that their packages do not hold, glibc's and the C++ runtime's left to the machine
ldd /usr/bin/espeak-ng /usr/bin/flite /usr/bin/pico2wave /usr/bin/festival /usr/bin/sox 2>/dev/null \
  | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
  | grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
  | grep -v -F -f <(sed 's|.*/|/|' "$list" | grep '\.so') > "$list.libs" || true  # by name: /lib is /usr/lib
tar -chf - -C / $(sed 's|^/||' "$list.libs") | xz -T0 -6 > "$out/tts-libs.tar.xz"
ls -la "$out"/tts-*.tar.xz
