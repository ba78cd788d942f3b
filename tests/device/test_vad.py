"""End of speech by Silero VAD (`--vad`, `--mic`): on a real voice (espeak-ng), not on noise or silence."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from pasu.device.audio import SAMPLE_RATE
from pasu.device.vad import Endpointer, VadOptions

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (make tts)")


@pytest.fixture(scope="module")
def command() -> np.ndarray:
    from pasu.corpus import tts

    return tts.render(tts.voice_by_id("espeak:en-us"), "set an alarm for seven in the morning")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), np.float32)


def feed(endpointer: Endpointer, audio: np.ndarray, chunk: int = SAMPLE_RATE // 10) -> float | None:
    """Feed in microphone-sized chunks; the audio time at which the end was declared, or None."""
    for start in range(0, len(audio), chunk):
        if endpointer.accept(audio[start : start + chunk]):
            return (start + chunk) / SAMPLE_RATE
    return None


def test_the_end_comes_after_the_trailing_silence(command):
    spoken = len(command) / SAMPLE_RATE
    endpointer = Endpointer()
    ended_at = feed(endpointer, np.concatenate([command, silence(2.0), command]))
    assert endpointer.speech_s > 0.5
    assert spoken - 0.5 < endpointer.last_speech_end <= spoken + 0.05  # the fading last syllable may count as silence
    # 0.6 s of silence after the last speech window, declared at the end of the chunk that completed them
    assert endpointer.last_speech_end + 0.6 <= ended_at <= endpointer.last_speech_end + 0.6 + 0.1 + 0.04
    assert ended_at < spoken + 2.0  # long before the second command


def test_no_end_without_speech(command):
    assert feed(Endpointer(), silence(3.0)) is None
    noise = (0.01 * np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE)).astype(np.float32)
    assert feed(Endpointer(), noise) is None  # a quiet hiss is not speech
    assert feed(Endpointer(VadOptions(trailing_silence_s=5.0)), np.concatenate([command, silence(2.0)])) is None


def test_chunk_sizes_do_not_move_the_end(command):
    """A microphone callback's block size changes when the end is noticed, not where the speech ended."""
    audio = np.concatenate([command, silence(1.5)])
    last_speech = set()
    for chunk in (160, 512, 1600, 4000):
        endpointer = Endpointer()
        assert feed(endpointer, audio, chunk) is not None
        last_speech.add(endpointer.last_speech_end)
    assert len(last_speech) == 1  # the same 32 ms windows whatever the chunking


def test_device_run_vad_answers_at_the_end_of_speech(command, tmp_path, capsys, cloud_support):
    """`pasu device run --vad`: what follows the end of speech is not part of the utterance."""
    import soundfile
    from pasu.cli import main

    model = cloud_support.write_model_folder(tmp_path / "model")
    path = tmp_path / "two-commands.wav"
    soundfile.write(path, np.concatenate([command, silence(2.0), command]), SAMPLE_RATE)
    capsys.readouterr()  # what importing ESPnet to build the model printed

    def seconds(*flags: str) -> float:
        assert main(["device", "run", "--audio", str(path), "--model", str(model), "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)["audio_seconds"]

    whole, cut = seconds("--no-pause-pilot"), seconds("--vad", "--no-pause-pilot")  # the VAD's cut replayed whole
    spoken = len(command) / SAMPLE_RATE
    assert whole == pytest.approx(len(soundfile.read(path)[0]) / SAMPLE_RATE, abs=0.01)
    assert spoken < cut < spoken + 1.0 < whole  # the first command and its trailing silence, not the second


def test_device_run_vad_with_the_pause_pilot_replays_the_speech_and_models_the_silence(command, tmp_path, capsys,
                                                                                       cloud_support):
    """`--vad` with the pause pilot (the default): the replay hears the speech up to where the VAD heard it end,
    and its pause pilot (run in the modelled silence) is the last pilot."""
    import soundfile
    from pasu.cli import main

    model = cloud_support.write_model_folder(tmp_path / "model")
    path = tmp_path / "two-commands.wav"
    soundfile.write(path, np.concatenate([command, silence(2.0), command]), SAMPLE_RATE)
    capsys.readouterr()

    def run(*flags: str) -> dict:
        assert main(["device", "run", "--audio", str(path), "--model", str(model), "--json", "--vad", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    plain, paused = run("--no-pause-pilot"), run()
    endpointer = Endpointer()
    feed(endpointer, np.concatenate([command, silence(2.0)]))
    assert paused["audio_seconds"] == pytest.approx(endpointer.last_speech_end, abs=0.01)
    assert paused["audio_seconds"] < plain["audio_seconds"] - 0.5  # the trailing silence is modelled, not replayed
    assert paused["pilots"] >= 1
