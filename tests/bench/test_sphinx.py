"""The PocketSphinx streaming baseline: an LM of our sentences, chunk-by-chunk decoding on the virtual clock."""

from __future__ import annotations

import pytest

from pasu.bench.sphinx import SphinxOptions, StreamingSphinx, write_language_files
from pasu.corpus import tts

COMMANDS = ["set an alarm for seven in the morning", "play some jazz music", "what is the weather like today",
            "turn the lights off in the kitchen", "wake me up at six am", "switch on the wemo plug"]


@pytest.fixture(scope="module")
def spoken():
    voice = tts.voice_by_id("espeak:en-us")
    if not tts.is_installed(voice):
        pytest.skip("espeak-ng is not installed (make tts)")
    return tts.render(voice, COMMANDS[0])


@pytest.mark.parametrize("live", [True, False])
def test_recognizes_a_spoken_command_its_language_model_knows(tmp_path, spoken, live):
    write_language_files(COMMANDS, tmp_path)
    sphinx = StreamingSphinx(tmp_path, SphinxOptions(live=live))
    # the decoder is reused utterance after utterance, as a server's is; its live cepstral mean starts from a
    # default and adapts over the first one
    sphinx.replay(spoken)
    answer = sphinx.replay(spoken)
    heard = answer.text.split()
    assert sum(w in heard for w in COMMANDS[0].split()) >= 6, answer.text
    assert 0.0 <= answer.end_of_utterance <= answer.latency


def test_words_without_a_pronunciation_are_left_out_of_the_lm_and_counted(tmp_path):
    unknown_words = write_language_files(COMMANDS, tmp_path)
    sphinx = StreamingSphinx(tmp_path)
    assert unknown_words == 1  # "wemo", a brand name CMUdict lacks
    assert "wemo" not in (tmp_path / "lm.arpa").read_text()
    assert "wemo" not in (tmp_path / "words.dict").read_text()
    assert sphinx.decoder.config["fwdflat"] is False and sphinx.decoder.config["bestpath"] is False
