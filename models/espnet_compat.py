"""PASU model folders through ESPnet's own `espnet2.bin.asr_inference.Speech2Text`.

    from pasu.models.espnet_compat import speech2text
    s2t = speech2text(MODEL_DIR, beam_size=5)        # a `pasu package` folder
    text, tokens, token_ids, hyp = s2t(waveform)[0]   # text: the target, `alarm_set wake me at SLOT_time ...`

Three things stand between a PASU folder and Speech2Text:

1. Importing it. Speech2Text's import chain (espnet2.tasks.asr, espnet2.tasks.abs_task) imports, at module
   level, packages that only encoders, frontends, data sets and tasks PASU never uses call: torchaudio (BEATs
   encoder, MelSpectrogramTorch frontend, data augmentation), h5py and kaldiio (training data sets), TTS and
   enhancement helpers. torchaudio has no build for this CPU torch. `import_speech2text` imports the chain
   with a stand-in (`StubModule`) for each of those packages that cannot be imported, and takes the stand-ins
   out of sys.modules again right after, so nothing later mistakes them for the real package; a real,
   importable package is always used as is. Calling anything on a stand-in raises `StubbedModuleError`.
2. Building the model. ASRTask builds from its ClassChoices; `register_pasu_classes` adds PASU's frontend
   and encoder to them.
3. The files. ASRTask.build_model_from_file reads an ESPnet training config and a float32 .pth state dict;
   `write_espnet_files` derives both from the folder (in a temporary folder when `speech2text` loads, so a
   package does not carry its weights twice).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from espnet2.text.abs_tokenizer import AbsTokenizer
from pasu.models.build import DECODER_DEFAULTS, ENCODER_DEFAULTS, MODEL_DEFAULTS
from pasu.models.frontend import FbankFrontend
from pasu.models.late_context_encoder import LateContextEncoder
from pasu.models.package import PACKAGE_FORMAT, TOKENIZER_FILE, WEIGHTS_FILE
from pasu.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from espnet2.bin.asr_inference import Speech2Text

# Packages Speech2Text's import chain imports at module level, and what in ESPnet actually uses them.
OPTIONAL_MODULES: dict[str, str] = {
    "torchaudio": "the BEATs encoder, the MelSpectrogramTorch frontend and data augmentation",
    "h5py": "ESPnet's training data sets",
    "kaldiio": "ESPnet's training data sets",
    "g2p_en": "phoneme tokenizers",
    "jamo": "phoneme tokenizers",
    "tacotron_cleaner": "TTS text cleaners",
    "jaconv": "TTS text cleaners",
    "ci_sdr": "speech enhancement losses",
    "fast_bss_eval": "speech enhancement losses",
    "nltk": "BLEU scores of machine translation",
}

# ASRTask choice names; prefixed so that they can never collide with one of ESPnet's own.
FRONTEND_CHOICE = "pasu_fbank"
ENCODER_CHOICE = "pasu_late_context"
CONFIG_FILE = "espnet_config.yaml"
ESPNET_WEIGHTS_FILE = "model.pth"


# --- Stand-ins for packages that cannot be imported ------------------------------------------------------


class StubbedModuleError(ImportError):
    """Something ESPnet imported with a stand-in (see `StubModule`) was actually called."""


class _StubAttribute:
    """Any attribute of a stand-in (also nested: `torchaudio.transforms.MelSpectrogram`); raises when called."""

    def __init__(self, name: str, reason: str):
        self._name = name
        self._reason = reason

    def __getattr__(self, attr: str) -> _StubAttribute:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StubAttribute(f"{self._name}.{attr}", self._reason)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StubbedModuleError(f"{self._name} is not available: {self._reason}")

    def __repr__(self) -> str:
        return f"<stand-in for {self._name}>"


class StubModule(types.ModuleType):
    """Stands in for a package that cannot be imported, so that modules which import it at module level but
    call it only in code PASU never runs can be imported."""

    def __init__(self, name: str, reason: str):
        super().__init__(name, f"Stand-in for {name}, which cannot be imported ({reason}).")
        self.__path__: list[str] = []  # a package, so `import torchaudio.compliance.kaldi` works too
        self._reason = reason

    def __getattr__(self, attr: str) -> _StubAttribute:
        if attr.startswith("__"):  # import machinery and introspection probe dunders: say "absent"
            raise AttributeError(attr)
        return _StubAttribute(f"{self.__name__}.{attr}", self._reason)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a `StubModule` for the given top-level packages and any of their submodules."""

    def __init__(self, reasons: Mapping[str, str]):
        self.reasons = dict(reasons)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.reasons:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> StubModule:
        return StubModule(spec.name, self.reasons[spec.name.partition(".")[0]])

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def unimportable(name: str) -> str | None:
    """Why `name` cannot be imported, or None when it can (then it is imported)."""
    before = set(sys.modules)
    try:
        importlib.import_module(name)
        return None
    except Exception as e:  # a broken binary install fails with OSError or RuntimeError, not ImportError
        for leftover in [m for m in sys.modules if m not in before and m.partition(".")[0] == name]:
            del sys.modules[leftover]  # half-imported submodules must not mix with the stand-ins
        return f"{type(e).__name__}: {e}"


@contextmanager
def stubbed_missing_modules(names: Iterable[str] = OPTIONAL_MODULES) -> Iterator[list[str]]:
    """Within the block, packages among `names` that cannot be imported import as `StubModule`s; yields their
    names. Afterwards sys.modules holds no stand-in: modules imported meanwhile keep theirs."""
    reasons = {}
    for name in names:
        why = unimportable(name)
        if why is not None:
            used_by = OPTIONAL_MODULES.get(name, "code PASU does not use")
            reasons[name] = f"{name} cannot be imported ({why}); ESPnet needs it for {used_by}"
    finder = _StubFinder(reasons)
    sys.meta_path.insert(0, finder)
    try:
        yield sorted(reasons)
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, StubModule)]:
            del sys.modules[name]


def import_speech2text() -> type[Speech2Text]:
    """espnet2.bin.asr_inference.Speech2Text, imported with stand-ins for what cannot be imported here."""
    if "espnet2.bin.asr_inference" not in sys.modules:
        with stubbed_missing_modules():
            importlib.import_module("espnet2.bin.asr_inference")
    return sys.modules["espnet2.bin.asr_inference"].Speech2Text


def register_pasu_classes() -> None:
    """Add PASU's frontend and encoder to ASRTask's ClassChoices (call after `import_speech2text`)."""
    from espnet2.tasks.asr import encoder_choices, frontend_choices

    for choices, name, cls in ((frontend_choices, FRONTEND_CHOICE, FbankFrontend),
                               (encoder_choices, ENCODER_CHOICE, LateContextEncoder)):
        if choices.classes.setdefault(name, cls) is not cls:
            raise RuntimeError(f"ESPnet's {choices.name} choice {name!r} is already {choices.classes[name]}")


# --- The files ASRTask.build_model_from_file reads ------------------------------------------------------


def espnet_training_config(model_config: Mapping[str, Any], tokenizer_path: str | os.PathLike) -> dict[str, Any]:
    """ESPnet ASR training config for a PASU model config, such that ASRTask.build_model builds what
    pasu.models.build.build_asr_model does (same defaults, same state-dict keys)."""
    m = model_config
    norm = m.get("normalize", "frontend")
    if norm not in ("frontend", "global_mvn", None):
        raise ValueError(f"unknown normalize {norm!r}")
    encoder = m.get("encoder", "late_context")
    if encoder not in ENCODER_DEFAULTS:
        raise ValueError(f"unknown encoder {encoder!r}")
    return {
        "token_list": list(m["token_list"]),
        "token_type": "bpe",
        "bpemodel": str(Path(tokenizer_path).resolve()),
        "input_size": None,
        "frontend": FRONTEND_CHOICE,
        "frontend_conf": {**m.get("frontend_conf", {}), "global_norm": norm == "frontend"},
        "specaug": m.get("specaug"),
        "specaug_conf": m.get("specaug_conf", {}),
        "normalize": "global_mvn" if norm == "global_mvn" else None,
        "normalize_conf": m.get("normalize_conf", {}) if norm == "global_mvn" else {},
        "preencoder": None,
        "preencoder_conf": {},
        # ESPnet's own choices for the baselines: same names, same classes as build_encoder's.
        "encoder": ENCODER_CHOICE if encoder == "late_context" else encoder,
        "encoder_conf": {**ENCODER_DEFAULTS[encoder], **m.get("encoder_conf", {})},
        "postencoder": None,
        "postencoder_conf": {},
        "decoder": "transformer",
        "decoder_conf": {**DECODER_DEFAULTS, **m.get("decoder_conf", {})},
        "ctc_conf": m.get("ctc_conf", {}),
        "model": "espnet",
        "model_conf": {**MODEL_DEFAULTS, **m.get("model_conf", {})},
        "init": None,  # every weight comes from the state dict
    }


def write_espnet_files(model_dir: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """(config, weights) for ASRTask.build_model_from_file from a PASU model folder: the config points at the
    folder's tokenizer.model, the weights are the folder's in float32."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    config = _read_package_config(model_dir)
    args = espnet_training_config(config["model"], model_dir / config.get("tokenizer", TOKENIZER_FILE))
    state = torch.load(model_dir / config.get("weights", WEIGHTS_FILE), map_location="cpu", weights_only=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path, weights_path = out_dir / CONFIG_FILE, out_dir / ESPNET_WEIGHTS_FILE
    config_path.write_text(yaml.safe_dump(args, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8")
    torch.save({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, weights_path)
    return config_path, weights_path


def _read_package_config(model_dir: Path) -> dict[str, Any]:
    config = yaml.safe_load((model_dir / "config.yaml").read_text())
    if config.get("format") != PACKAGE_FORMAT:
        raise ValueError(f"{model_dir}: unsupported package format {config.get('format')!r}")
    return config


# --- Speech2Text ---------------------------------------------------------------------------------------


class PasuTextTokenizer(AbsTokenizer):
    """ESPnet tokenizer over PASU's: text is the training target (`intent words SLOT_x ... SLOT_END`).

    Plain sentencepiece decoding glues a user-defined symbol to the word before it (`meSLOT_time`)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def text2tokens(self, line: str) -> list[str]:
        return [self.tokenizer.token_list[i] for i in self.tokenizer.encode(line)]

    def tokens2text(self, tokens: Iterable[str]) -> str:
        return self.tokenizer.decode(self.tokenizer.token_id(t) for t in tokens)


def speech2text(model_dir: str | os.PathLike, **speech2text_kwargs: Any) -> Speech2Text:
    """ESPnet's Speech2Text for a PASU model folder.

    Decoding defaults are PASU's (`pasu.models.recognizer.DecodingOptions`: beam 10, CTC weight 0.3), so
    this decodes as `EspnetRecognizer.from_folder` does, except that Speech2Text has no ban on SLOTS_UNKNOWN.
    Unless token_type or bpemodel are given, the text is PASU's target string (`PasuTextTokenizer`).
    """
    from pasu.models.recognizer import DecodingOptions

    defaults = DecodingOptions()
    kwargs = dict(beam_size=defaults.beam_size, ctc_weight=defaults.ctc_weight, penalty=defaults.length_bonus,
                  maxlenratio=defaults.maxlenratio, minlenratio=defaults.minlenratio)
    kwargs.update(speech2text_kwargs)
    speech2text_cls = import_speech2text()
    register_pasu_classes()
    model_dir = Path(model_dir)
    with tempfile.TemporaryDirectory(prefix="pasu-espnet-") as tmp:
        config_path, weights_path = write_espnet_files(model_dir, tmp)
        s2t = speech2text_cls(asr_train_config=config_path, asr_model_file=weights_path, **kwargs)
        _check_all_loaded(s2t.asr_model, torch.load(weights_path, map_location="cpu", weights_only=True))
    if "token_type" not in speech2text_kwargs and "bpemodel" not in speech2text_kwargs:
        tokenizer_file = _read_package_config(model_dir).get("tokenizer", TOKENIZER_FILE)
        s2t.tokenizer = PasuTextTokenizer(Tokenizer(model_dir / tokenizer_file))
    return s2t


def _check_all_loaded(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """ESPnet loads with strict=False, which silently keeps random weights for keys the file lacks."""
    missing = sorted(set(model.state_dict()) - set(state))
    unexpected = sorted(set(state) - set(model.state_dict()))
    if missing or unexpected:
        raise RuntimeError(f"Missing key(s) in the weights: {missing}; unexpected key(s): {unexpected}")
