"""The shipped ESPnet-family models: each loads through our runtime and through ESPnet's Speech2Text, both decode a
spoken command alike, and both understand it."""

import shutil

import pytest
import torch

from pasu.corpus.tts import render, voice_by_id
from pasu.models.espnet_compat import speech2text
from pasu.models.recognizer import DecodingOptions, EspnetRecognizer, espnet_beam_search
from pasu.settings import shipped_model

# Speech2Text does not ban SLOTS_UNKNOWN; neither may ours where the two are compared
OPTIONS = DecodingOptions(beam_size=5, ctc_weight=0.3, ban_slots_unknown=False, num_threads=1)
COMMAND, INTENT = "wake me up at seven am tomorrow", "alarm_set"

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (make tts)")


@pytest.fixture(scope="module")
def spoken_command():
    return render(voice_by_id("espeak:en-us"), COMMAND)


@pytest.mark.parametrize("name", ["device", "baseline_conformer", "baseline_branchformer"])
def test_runtime_and_speech2text_understand_a_spoken_command_alike(name, spoken_command):
    folder = shipped_model(name)
    ours = EspnetRecognizer.from_folder(folder, OPTIONS)
    s2t = speech2text(folder, beam_size=OPTIONS.beam_size, ctc_weight=OPTIONS.ctc_weight, nbest=1)
    speech = torch.from_numpy(spoken_command)[None]
    with torch.inference_mode():
        encoded, _ = ours.model.encode(speech, torch.tensor([spoken_command.size]))
        our_hyp = espnet_beam_search(ours.model, ours.tokenizer.token_list, OPTIONS)(x=encoded[0])[0]
    (text, _, token_ids, hyp), = s2t(spoken_command)
    assert token_ids == [int(t) for t in our_hyp.yseq[1:-1]]
    assert float(hyp.score) == pytest.approx(float(our_hyp.score), abs=1e-3)

    recognition = ours.recognize_batch([spoken_command])[0]
    assert recognition.intent == INTENT, (name, text)
    assert "seven" in recognition.text.split(), (name, recognition.text)
    assert any(s.type == "time" and "seven" in s.value for s in recognition.slots), (name, recognition.slots)
