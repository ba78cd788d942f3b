"""SecondOpinion: the SLU model proposes transcripts and scores any transcript, Whisper's included."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from pasu.models.second_opinion import MAX_INTENTS, SecondOpinion
from pasu.models.targets import SLOTS_UNKNOWN
from pasu.settings import shipped_model

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng renders the test speech")
COMMAND = "turn off the lights in the kitchen"


@pytest.fixture(scope="module")
def second() -> SecondOpinion:
    return SecondOpinion.from_folder(shipped_model("device"), beam_size=5)


@pytest.fixture(scope="module")
def lights_off() -> np.ndarray:
    from pasu.corpus.tts import render, voice_by_id

    return render(voice_by_id("espeak:en-us"), COMMAND)


@needs_espeak
def test_it_proposes_distinct_transcripts_and_intents(second, lights_off):
    opinion = second.listen(lights_off)
    assert opinion.texts and len(set(opinion.texts)) == len(opinion.texts)
    assert 1 <= len(opinion.intents) <= MAX_INTENTS
    assert all(intent in second.tokenizer.intents for intent in opinion.intents)
    assert opinion.encoded.ndim == 2 and opinion.encoded.size(0) > 0


@needs_espeak
def test_it_prefers_what_was_said(second, lights_off):
    opinion = second.listen(lights_off)
    said, garbled = second.scores(opinion, [COMMAND, "turn of the light in a kitten"])
    # finite although the search bans SLOTS_UNKNOWN: the scorer does not (a -1e10 ban would swamp float32)
    assert np.isfinite(said) and -200 < said < 0
    assert said > garbled


@needs_espeak
def test_a_transcript_scores_its_best_intent(second, lights_off):
    opinion = second.listen(lights_off)
    sequences = [second.tokenizer.encode(f"{intent} {SLOTS_UNKNOWN} {COMMAND}") for intent in opinion.intents]
    each = [h.score for h in second.scorer.token_scores(opinion.encoded, sequences, second.options)]
    [score] = second.scores(opinion, [COMMAND])
    assert score == pytest.approx(max(each))


@needs_espeak
def test_it_reads_the_intent_it_hears_in_a_transcript(second, lights_off):
    opinion = second.listen(lights_off)
    logprobs = second.intent_logprobs(opinion, COMMAND)
    assert set(logprobs) == set(second.tokenizer.intents)  # every intent it knows, not only its n-best's
    assert np.logaddexp.reduce(list(logprobs.values())) == pytest.approx(0.0, abs=1e-6)  # a distribution
    # each is the transcript's joint score under that intent, less the normalizer
    sequences = [second.tokenizer.encode(f"{intent} {SLOTS_UNKNOWN} {COMMAND}") for intent in opinion.intents]
    joint = [h.score for h in second.scorer.token_scores(opinion.encoded, sequences, second.options)]
    offsets = [logprobs[intent] - score for intent, score in zip(opinion.intents, joint)]
    assert offsets == pytest.approx([offsets[0]] * len(offsets), abs=1e-4)
    assert max(logprobs, key=logprobs.get) == "iot_hue_lightoff"


def test_a_model_trained_without_slots_unknown_is_refused():
    tokenizer = SimpleNamespace(token_list=["<blank>", "<unk>", "alarm_set", "wake", "<sos/eos>"])
    with pytest.raises(ValueError, match=SLOTS_UNKNOWN):
        SecondOpinion(SimpleNamespace(), tokenizer, "old-model")
