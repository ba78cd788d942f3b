# The two commands of the README: `make demo` (the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pasu-installed

.PHONY: setup tts demo test

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

# A hard crash leaves tests/conftest.py's crash log (test in progress, every thread's stack): shown first.
test: $(STAMP) tts
	@rm -f .pytest-crash.log
	$(PY) -m pytest -q tests || { rc=$$?; if [ -s .pytest-crash.log ]; then \
	  echo "--- hard crash; .pytest-crash.log:"; head -c 6000 .pytest-crash.log; fi; exit $$rc; }
