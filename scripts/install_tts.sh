#!/usr/bin/env bash
# Installs the Debian TTS engines and sox that `pasu corpus build` renders speech with.
# mbrola voices and SVOX Pico live in contrib/non-free: a private sources list enables them without editing /etc.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
dir="${PASU_APT_DIR:-/tmp/pasu-apt}"
mkdir -p "$dir/etc" "$dir/lists/partial"
cat > "$dir/etc/debian-all.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
O="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$dir/etc -o Dir::State::Lists=$dir/lists"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get $O update -qq
# mbrola-pl1 is left out: it produces garbage for English.
$SUDO apt-get $O install -y -qq --no-install-recommends \
  espeak-ng mbrola mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 \
  festival festvox-kallpc16k festvox-kdlpc16k festvox-rablpc16k festvox-us-slt-hts \
  festvox-us1 festvox-us2 festvox-us3 festvox-en1 flite libttspico-utils sox libsox-fmt-all \
  mbrola-af1 mbrola-de1 mbrola-de2 mbrola-de3 mbrola-de4 mbrola-de5 mbrola-de6 mbrola-de7 mbrola-de8 \
  mbrola-fr1 mbrola-fr4 mbrola-gr2 mbrola-hu1 mbrola-nl2 mbrola-ro1 mbrola-sw1 mbrola-sw2 >/dev/null
echo "TTS engines installed: $(command -v espeak-ng festival flite pico2wave sox | tr '\n' ' ')"
