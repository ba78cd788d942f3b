# The two commands of the README: `make demo` (the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pasu-installed

.PHONY: setup tts demo test corpora

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

# Debian TTS engines, needed only where a corpus is built (the tests build the tiny one).
tts:
	@command -v espeak-ng >/dev/null && command -v festival >/dev/null && command -v flite >/dev/null \
	  && command -v pico2wave >/dev/null && command -v sox >/dev/null || bash scripts/install_tts.sh

# The main job: cloud server on loopback + device agent over generated sample commands (espeak-ng renders them).
demo: $(STAMP) tts
	$(VENV)/bin/pasu demo

# The corpora every measured number in the README uses (about 22 minutes on 2 cores; a build resumes where it
# stopped and an existing one takes seconds): the full corpus, and the pseudo-labelled SLURP sentences that the
# device model trained on and its intent reader learns, and the slot-swapped sentences the shipped LM also read
# (text only, seconds). Needs the shared SLURP text ($$PASU_SHARED_DATA, else ../shared/data).
corpora: $(STAMP) tts
	$(VENV)/bin/pasu corpus build --preset full --out data/corpus-full
	test -s data/pseudo-train-slots.jsonl || $(VENV)/bin/pasu text-intent pseudo-label --out data/pseudo-train-slots.jsonl
	$(VENV)/bin/pasu corpus build --preset full --out data/corpus-full-p4 --train-variant 4 \
	  --train-text data/pseudo-train-slots.jsonl --train-utterances 19200 --voices data/corpus-full/build.json --splits train
	test -s data/swap-lm.jsonl || $(VENV)/bin/pasu corpus swap-slots --count 40000 --seed 100 --out data/swap-lm.jsonl \
	  --also data/pseudo-train-slots.jsonl

# A hard crash leaves tests/conftest.py's crash log (test in progress, every thread's stack): shown first.
test: $(STAMP) tts
	@rm -f .pytest-crash.log
	$(PY) -m pytest -q tests || { rc=$$?; if [ -s .pytest-crash.log ]; then \
	  echo "--- hard crash; .pytest-crash.log:"; head -c 6000 .pytest-crash.log; fi; exit $$rc; }
