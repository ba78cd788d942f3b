"""PASU model folders through ESPnet's own Speech2Text, and the stand-ins that let it import without torchaudio."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pasu.models.espnet_compat import (
    CONFIG_FILE,
    ESPNET_WEIGHTS_FILE,
    StubbedModuleError,
    StubModule,
    speech2text,
    stubbed_missing_modules,
    write_espnet_files,
)
from pasu.models.package import package_model
from pasu.models.recognizer import DecodingOptions, EspnetRecognizer, espnet_beam_search
from pasu.models.targets import decode_target
from pasu.settings import shipped_model

OPTIONS = DecodingOptions(beam_size=3, ctc_weight=0.3, ban_slots_unknown=False, num_threads=1)


@pytest.fixture(scope="module")
def model_dir(tiny_experiment, tmp_path_factory) -> Path:
    return package_model(tiny_experiment[1], tmp_path_factory.mktemp("espnet_compat") / "model", name="tiny")


def _waveform(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


def _our_decode(ours: EspnetRecognizer, wave: np.ndarray, options: DecodingOptions = OPTIONS):
    """(encoder output, best hypothesis) of ESPnet's beam search as our runtime runs it on `wave`."""
    with torch.inference_mode():
        encoded, _ = ours.model.encode(torch.from_numpy(wave)[None], torch.tensor([wave.size]))
        return encoded, espnet_beam_search(ours.model, ours.tokenizer.token_list, options)(x=encoded[0])[0]


def test_speech2text_decodes_like_pasu(model_dir):
    s2t = speech2text(model_dir, beam_size=OPTIONS.beam_size, ctc_weight=OPTIONS.ctc_weight, nbest=1)
    ours = EspnetRecognizer.from_folder(model_dir, OPTIONS)
    for seed, seconds in enumerate((1.0, 2.3)):
        wave = _waveform(seconds, seed)
        (text, tokens, token_ids, hyp), = s2t(wave)

        our_enc, our_hyp = _our_decode(ours, wave)
        with torch.inference_mode():
            enc, _ = s2t.asr_model.encode(torch.from_numpy(wave)[None], torch.tensor([wave.size]))
        assert torch.equal(enc, our_enc)  # same weights, frontend and encoder
        assert token_ids == [int(t) for t in our_hyp.yseq[1:-1]]
        assert float(hyp.score) == pytest.approx(float(our_hyp.score), abs=1e-4)
        assert tokens == [ours.tokenizer.token_list[i] for i in token_ids]
        assert text == ours.tokenizer.decode(token_ids)

        recognition, slu = ours.recognize_batch([wave])[0], decode_target(text)
        assert (recognition.text, recognition.intent, recognition.slots) == (slu.text, slu.intent, slu.slots)


# Speech2Text does not ban SLOTS_UNKNOWN; neither may ours where the two are compared
SHIPPED_OPTIONS = DecodingOptions(beam_size=5, ctc_weight=0.3, ban_slots_unknown=False, num_threads=1)


@pytest.fixture(scope="module")
def spoken_command() -> np.ndarray:
    from pasu.corpus.tts import render, voice_by_id

    return render(voice_by_id("espeak:en-us"), "wake me up at seven am tomorrow")


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (make tts)")
@pytest.mark.parametrize("name", ["device", "baseline_conformer", "baseline_branchformer"])
def test_shipped_models_understand_a_spoken_command_alike_through_speech2text(name, spoken_command):
    folder = shipped_model(name)
    ours = EspnetRecognizer.from_folder(folder, SHIPPED_OPTIONS)
    s2t = speech2text(folder, beam_size=SHIPPED_OPTIONS.beam_size, ctc_weight=SHIPPED_OPTIONS.ctc_weight, nbest=1)
    _, our_hyp = _our_decode(ours, spoken_command, SHIPPED_OPTIONS)
    (text, _, token_ids, hyp), = s2t(spoken_command)
    assert token_ids == [int(t) for t in our_hyp.yseq[1:-1]]
    assert float(hyp.score) == pytest.approx(float(our_hyp.score), abs=1e-3)

    recognition = ours.recognize_batch([spoken_command])[0]
    assert recognition.intent == "alarm_set", (name, text)
    assert "seven" in recognition.text.split(), (name, recognition.text)
    assert any(s.type == "time" and "seven" in s.value for s in recognition.slots), (name, recognition.slots)


def test_espnet_files(model_dir, tmp_path):
    config_path, weights_path = write_espnet_files(model_dir, tmp_path)
    assert (config_path.name, weights_path.name) == (CONFIG_FILE, ESPNET_WEIGHTS_FILE)
    args = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    package = yaml.safe_load((model_dir / "config.yaml").read_text())
    assert args["token_list"] == package["model"]["token_list"]
    assert (args["frontend"], args["encoder"], args["decoder"]) == ("pasu_fbank", "pasu_late_context", "transformer")
    assert args["encoder_conf"]["output_size"] == 32 and args["specaug"] is None
    assert Path(args["bpemodel"]) == (model_dir / "tokenizer.model").resolve()
    weights = torch.load(weights_path, weights_only=True)
    assert all(v.dtype == torch.float32 for v in weights.values() if v.is_floating_point())
    assert set(weights) == set(torch.load(model_dir / "model.pt", weights_only=True))
    assert not any(p.name in (CONFIG_FILE, ESPNET_WEIGHTS_FILE) for p in model_dir.iterdir())  # not in the package


def test_speech2text_loads_every_weight(model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = torch.load(broken / "model.pt", weights_only=True)
    weights.pop("decoder.output_layer.bias")
    torch.save(weights, broken / "model.pt")
    with pytest.raises(RuntimeError, match="Missing key.*decoder.output_layer.bias"):
        speech2text(broken)


def test_no_stand_in_is_left_behind(model_dir):
    speech2text(model_dir, beam_size=2)
    assert not any(isinstance(m, StubModule) for m in sys.modules.values())
    # What ESPnet imported meanwhile keeps its stand-in, which fails loudly when used.
    import espnet2.layers.augmentation as augmentation

    if isinstance(augmentation.torchaudio, StubModule):
        assert "torchaudio" not in sys.modules
        with pytest.raises(StubbedModuleError, match="torchaudio.functional.lowpass_biquad .*torchaudio cannot"):
            augmentation.torchaudio.functional.lowpass_biquad(torch.zeros(4), 16000, 1000.0)


def _fake_package(root: Path, name: str, init: str) -> None:
    (root / name / "compliance").mkdir(parents=True)
    (root / name / "__init__.py").write_text(init)
    (root / name / "compliance" / "__init__.py").write_text("")
    (root / name / "compliance" / "kaldi.py").write_text("def fbank(*a, **k):\n    return 'real'\n")


@pytest.fixture
def no_torchaudio_module(monkeypatch):
    """sys.modules without torchaudio (and whatever the test imports under that name removed afterwards)."""
    saved = {k: v for k, v in sys.modules.items() if k.partition(".")[0] == "torchaudio"}
    for k in saved:
        monkeypatch.delitem(sys.modules, k)
    yield
    for k in [k for k in sys.modules if k.partition(".")[0] == "torchaudio"]:
        del sys.modules[k]
    sys.modules.update(saved)


def test_a_real_torchaudio_is_never_shadowed(tmp_path, monkeypatch, no_torchaudio_module):
    _fake_package(tmp_path, "torchaudio", "REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with stubbed_missing_modules(["torchaudio"]) as stubbed:
        import torchaudio.compliance.kaldi as kaldi

        assert stubbed == [] and sys.modules["torchaudio"].REAL and kaldi.fbank() == "real"
    assert not isinstance(sys.modules["torchaudio"], StubModule)


def test_a_missing_or_broken_torchaudio_is_stubbed(tmp_path, monkeypatch, no_torchaudio_module):
    _fake_package(tmp_path, "torchaudio", "raise OSError('undefined symbol: _ZN3c10')\n")  # a mismatched build
    monkeypatch.syspath_prepend(str(tmp_path))
    with stubbed_missing_modules(["torchaudio"]) as stubbed:
        import torchaudio.compliance.kaldi as kaldi

        assert stubbed == ["torchaudio"] and isinstance(sys.modules["torchaudio"], StubModule)
        with pytest.raises(StubbedModuleError, match=r"torchaudio.compliance.kaldi.fbank .*OSError: undefined symbol"):
            kaldi.fbank(torch.zeros(400))
    assert "torchaudio" not in sys.modules and "torchaudio.compliance.kaldi" not in sys.modules


def _shipped_espnet_folders() -> list[Path]:
    from pasu.models.recognizer import is_model_folder
    from pasu.settings import shipped_model

    return sorted(p.parent for p in shipped_model("device").parent.glob("*/config.yaml") if is_model_folder(p.parent))


@pytest.mark.parametrize("folder", _shipped_espnet_folders(), ids=lambda p: p.name)
def test_every_shipped_model_encodes_alike_in_pasu_and_speech2text(folder):
    s2t = speech2text(folder, beam_size=1, ctc_weight=0.3, nbest=1)
    ours = EspnetRecognizer.from_folder(folder, OPTIONS)
    speech, lengths = torch.from_numpy(_waveform(1.5, 7))[None], torch.tensor([24000])
    with torch.inference_mode():
        theirs, _ = s2t.asr_model.encode(speech, lengths)
        mine, _ = ours.model.encode(speech, lengths)
    assert torch.equal(theirs, mine)
    assert s2t.asr_model.token_list == ours.tokenizer.token_list
