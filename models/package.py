"""Shipping trained models: PASU model folders, and loading ordinary ESPnet ASR training outputs.

A PASU model folder holds:
    config.yaml      {"format": 1, "model": build_asr_model config (token_list included, no stats: the
                     frontend's mean/std are buffers in the weights), "tokenizer": "tokenizer.model", ...}
    model.pt         state dict, parameters in float16 (half the download; loaded back as float32)
    tokenizer.model  sentencepiece model (targets <-> ids, see tokenizer.py)
    README.md        model card

`load_espnet_checkpoint` rebuilds a model from an ESPnet `exp/asr_*/config.yaml` + `*.pth` without
espnet2.tasks (which needs torchaudio, missing here), following ASRTask.build_model step by step.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from espnet2.asr.ctc import CTC
from espnet2.asr.espnet_model import ESPnetASRModel
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from pasu.models.build import build_asr_model
from pasu.models.tokenizer import Tokenizer

PACKAGE_FORMAT = 1
TOKENIZER_FILE = "tokenizer.model"
WEIGHTS_FILE = "model.pt"
AVERAGED_WEIGHTS = "model_avg.pt"  # what `pasu train` writes at the end: its best snapshots averaged


# --- PASU model folders -------------------------------------------------------------------------------


def package_model(
    exp_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    weights: str = AVERAGED_WEIGHTS,
    evaluation: str | os.PathLike | Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """Write a model folder from a `pasu train` EXPDIR (weights: model_avg.pt, else the last checkpoint)."""
    exp_dir, out_dir = Path(exp_dir), Path(out_dir)
    resolved = yaml.safe_load((exp_dir / "config.yaml").read_text())
    state, source = _experiment_weights(exp_dir, weights)
    model_config = inference_model_config(resolved["model"])
    data = resolved.get("data", {})
    model = build_asr_model(model_config)
    model.load_state_dict(state, strict=True)  # fail here, not on the device, if config and weights differ

    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exp_dir / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    torch.save(half_state_dict(model), out_dir / WEIGHTS_FILE)
    run = _read_json(exp_dir / "run.json") or {}
    summary = _read_json(exp_dir / "summary.json") or {}
    config = {
        "format": PACKAGE_FORMAT,
        "name": name or exp_dir.name,
        "model": model_config,
        "tokenizer": TOKENIZER_FILE,
        "weights": WEIGHTS_FILE,
        "parameters": sum(p.numel() for p in model.parameters()),
        "training": {
            "weights": source,
            "steps": summary.get("steps"),
            # which snapshots model_avg.pt averages; other weights (a snapshot, a hand-made average) say nothing
            "averaged_steps": summary.get("averaged_steps") if source == AVERAGED_WEIGHTS else None,
            "corpus": repo_relative(run.get("corpus")),
            "corpus_summary": _corpus_summary(run.get("corpus")),  # read where training ran
            # more training speech (`data.extra_corpora`): each corpus's training split, summarized
            "extra_corpora": {repo_relative(c): (_corpus_summary(c) or {}).get(data.get("train_split", "train"))
                              for c in data.get("extra_corpora") or ()},
            "command": run.get("command"),
            # starts that resumed with other learning options than the run's before them (`train.changed_options`)
            "changed_on_resume": [s for s in run.get("starts") or () if s.get("changed")] or None,
            "train_seconds": summary.get("train_seconds"),
            "seconds_per_step": summary.get("seconds_per_step"),
            "epoch": summary.get("epoch"),
            "final_dev": summary.get("final_dev"),
            "options": {k: v for k, v in resolved.items() if k != "model"},
        },
    }
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, width=120))
    results = _read_json(evaluation) if isinstance(evaluation, (str, os.PathLike)) else evaluation
    (out_dir / "README.md").write_text(model_card(config, model, results))
    return out_dir


def _resume_lines(starts: list[dict] | None) -> list[str]:
    """The card's note of each resume that changed the run's learning options (none: no lines)."""
    if not starts:
        return []
    lines = ["", "Resumed with other options than the run's before (the recipe gives the last start's):", ""]
    for start in starts:
        changes = ", ".join(f"`{k}` {a!r} -> {b!r}" for k, (a, b) in start["changed"].items())
        lines.append(f"- at step {start['step']:,}: {changes}")
    return lines


def inference_model_config(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The model config without training-only parts: SpecAugment off, stats left to the weights."""
    config = copy.deepcopy(dict(model_config))
    config.pop("stats", None)
    config.pop("specaug_conf", None)
    config["specaug"] = None
    config.pop("init", None)  # initialization is irrelevant once weights are loaded
    return config


def half_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict with the parameters in float16; buffers (the frontend's global mean/std: 160 numbers
    that every feature passes through) stay as they are."""
    params = {name for name, _ in model.named_parameters()}
    return {
        k: v.detach().to(torch.float16) if k in params and v.is_floating_point() else v.detach()
        for k, v in model.state_dict().items()
    }


def load_packaged(folder: str | os.PathLike) -> tuple[ESPnetASRModel, Tokenizer, dict[str, Any]]:
    """(model in eval mode, float32; tokenizer; config) from a model folder."""
    folder = Path(folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    if config.get("format") != PACKAGE_FORMAT:
        raise ValueError(f"{folder}: unsupported package format {config.get('format')!r}")
    model = build_asr_model(config["model"])
    state = torch.load(folder / config.get("weights", WEIGHTS_FILE), map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    tokenizer = Tokenizer(folder / config.get("tokenizer", TOKENIZER_FILE))
    if tokenizer.token_list != list(config["model"]["token_list"]):
        raise ValueError(f"{folder}: tokenizer and config token lists differ")
    return model.float().eval(), tokenizer, config


def _experiment_weights(exp_dir: Path, weights: str) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict of EXPDIR/weights, else of the last checkpoint, and the name of the file it came from."""
    if (exp_dir / weights).exists():
        return torch.load(exp_dir / weights, map_location="cpu", weights_only=True), weights
    ckpt = exp_dir / "checkpoint.pt"
    if not ckpt.exists():
        raise FileNotFoundError(f"neither {exp_dir / weights} nor {ckpt} exists")
    return torch.load(ckpt, map_location="cpu", weights_only=False)["model"], ckpt.name


def repo_relative(path: str | None) -> str | None:
    """A path inside the repository as repository-relative (model cards travel with the repository)."""
    from pasu.settings import REPO_ROOT

    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return path


def _corpus_summary(corpus: str | None) -> dict[str, Any] | None:
    """Utterances, hours and voices per split, from the corpus's report.json (None when it is not there)."""
    report = _read_json(Path(corpus) / "report.json") if corpus else None
    if not report:
        return None
    return {split: {k: v for k, v in s.items() if k in ("utterances", "hours", "voices", "sentences")}
            for split, s in report.get("splits", {}).items()}


def _read_json(path: str | os.PathLike | None) -> Any:
    if path is None or not Path(path).exists():
        return None
    return json.loads(Path(path).read_text())


# --- Model card ---------------------------------------------------------------------------------------


def model_card(config: Mapping[str, Any], model: ESPnetASRModel, results: Any = None) -> str:
    """README.md: architecture, parameters, streaming share, training data and recipe, results, limitations."""
    m, t = config["model"], config["training"]
    opts = t.get("options", {})
    train_split = opts.get("data", {}).get("train_split", "train")
    lines = [
        f"# {config['name']}",
        "",
        "PASU spoken-language-understanding model: one hybrid CTC/attention ESPnet ASR model whose target is",
        "the intent label, then the words with inline slot markup (`alarm_set wake me at SLOT_time five am",
        "SLOT_END`); see `models/targets.py`.",
        "",
        "## Architecture",
        "",
        "| part | value |",
        "|---|---|",
        "| frontend | 80-dim log-mel fbank, 25 ms / 10 ms, global mean/variance normalization (in the weights) |",
        f"| encoder | `{m.get('encoder', 'late_context')}` {json.dumps(m.get('encoder_conf', {}))} |",
        f"| decoder | transformer {json.dumps(m.get('decoder_conf', {}))} |",
        f"| vocabulary | {len(m['token_list'])} tokens (sentencepiece + intent and slot symbols) |",
        f"| parameters | {_parameter_line(model)} |",
        f"| encoder FLOPs run during ingestion | {_ingestion_line(model)} |",
        "",
        "## Training data",
        "",
        f"- corpus: `{t.get('corpus') or 'unknown'}` (split `{train_split}`)",
        *_corpus_lines(t.get("corpus_summary")),
        *(f"- also trained on `{c}` (split `{train_split}`)" + (f": {_split_line(s)}" if s else "")
          for c, s in (t.get("extra_corpora") or {}).items()),
        "",
        "## Training",
        "",
        *_training_lines(t),
        "",
        "Recipe:",
        "",
        "```",
        t.get("command") or "pasu train --config CONFIG.yaml --corpus CORPUS --out EXPDIR",
        "```",
        *_resume_lines(t.get("changed_on_resume")),
        "",
        "## Results",
        "",
        *results_table(results),
        "",
        "WER and SLU-F1 as the SLURP paper defines them (`pasu.metrics`).",
        _decoding_text(results),
        "",
        "## Files",
        "",
        "`config.yaml` (rebuild: `pasu.models.package.load_packaged`; ESPnet: `pasu.models.espnet_compat.speech2text`),",
        "`model.pt` (state dict, float16 parameters), `tokenizer.model` (sentencepiece).",
        "",
        "## Limitations",
        "",
        "Trained on synthetic (TTS) speech with added noise and reverberation: accuracy on real voices is lower.",
        "English only, SLURP's label set; the tokenizer fixes the intents and slot types it can emit (`pasu "
        "train --init-from` this folder on a corpus with other labels adds them as new tokens).",
        "",
    ]
    return "\n".join(lines)


def _decoding_text(results: Any) -> str:
    """How `pasu eval` decoded the results: ESPnet's beam search, or (`--as-agent`) as the device agent answers."""
    decoding = results.get("decoding") if isinstance(results, Mapping) else None
    settings = ""
    if isinstance(decoding, Mapping):
        parts = [f"beam {decoding.get('beam_size')}", f"CTC weight {decoding.get('ctc_weight')}"]
        if decoding.get("lm"):
            parts.append(f"LM `{decoding['lm']}` at {decoding.get('lm_weight')}")
        if decoding.get("length_bonus"):
            parts.append(f"length bonus {decoding['length_bonus']}")
        settings = f" ({', '.join(parts)})"
    if isinstance(results, Mapping) and results.get("as_agent"):
        # a length bonus turns the decided stop off (pasu.device.decoding.search)
        stop = "" if isinstance(decoding, Mapping) and decoding.get("length_bonus") else (
            ", which stops once its answer is decided")
        return (f"`pasu eval --as-agent` answers as the device agent does{settings}: PASU's search{stop}, with the "
                "intent reader of the model's `offramp/` weighed in and unknown words spelled as known ones.")
    return f"`pasu eval` decodes with ESPnet's beam search{settings}."


def _ingestion_line(model: ESPnetASRModel) -> str:
    from pasu.models.flops import ingestion_fraction

    share = {s: ingestion_fraction(model.encoder, s) for s in (3.0, 5.0)}
    return ", ".join(f"{100 * v:.1f}% at {s:g} s" for s, v in share.items()) + " (`pasu.models.flops`)"


def _corpus_lines(summary: Mapping[str, Any] | None) -> list[str]:
    if not summary:
        return []
    return [f"- {split}: {_split_line(s)}" for split, s in summary.items() if s.get("utterances")]


def _split_line(s: Mapping[str, Any]) -> str:
    return (f"{s.get('utterances', 0):,} utterances, {s.get('hours', 0):.2f} h, {s.get('voices', 0)} voices, "
            f"{s.get('sentences', 0):,} sentences")


def _training_lines(t: Mapping[str, Any]) -> list[str]:
    lines = [f"- steps: {t.get('steps')} (epoch {t.get('epoch')}); weights: `{t.get('weights')}` "
             f"(averaged steps: {t.get('averaged_steps')})"]
    if t.get("train_seconds"):
        lines.append(f"- wall time: {t['train_seconds'] / 3600:.2f} h, {t.get('seconds_per_step') or 0:.2f} s per "
                     f"step in the last run")
    if dev := t.get("final_dev"):
        lines.append(f"- last dev evaluation ({dev.get('n')} utterances, CTC greedy): WER {100 * dev['wer']:.1f}%, "
                     f"IC {100 * dev['intent_accuracy']:.1f}%, SLU-F1 {100 * dev['slu_f1']:.1f}%, "
                     f"decoder accuracy {100 * dev['acc']:.1f}%")
    return lines


def _parameter_line(model: ESPnetASRModel) -> str:
    parts = {name: sum(p.numel() for p in getattr(model, name).parameters()) for name in ("encoder", "decoder", "ctc")}
    total = sum(p.numel() for p in model.parameters())
    return f"{total / 1e6:.2f} M (" + ", ".join(f"{k} {v / 1e6:.2f} M" for k, v in parts.items()) + ")"


def results_table(results: Any) -> list[str]:
    """Markdown table rows from {"split": {"metric": value}} or one {"metric": value} mapping."""
    if not results:
        return ["TODO: `pasu package ... --eval RESULTS.json` fills this table."]
    if all(not isinstance(v, Mapping) for v in results.values()):
        results = {"test": results}
    # `pasu eval` files also carry the decoding options and the corpus: only the splits' scores are rows
    splits = {k: v for k, v in results.items() if isinstance(v, Mapping) and k != "decoding"}
    rows = {split: {k: v for k, v in r.items() if isinstance(v, (int, float))} for split, r in splits.items()}
    columns = list(dict.fromkeys(k for r in rows.values() for k in r))
    out = ["| split | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for split, r in rows.items():
        out.append(f"| {split} | " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    return str(v) if isinstance(v, int) else f"{v:.4g}"


# --- ESPnet training outputs --------------------------------------------------------------------------


class EspnetDefaultFrontend(AbsFrontend):
    """ESPnet's DefaultFrontend for single-channel audio (Stft -> power -> LogMel), without torchaudio.

    espnet2.asr.frontend.default imports the WPE/MVDR front end, which imports torchaudio; that part is
    identity for mono input unless frontend_conf enables it, so this rebuilds the rest with the same
    submodule names (`stft`, `logmel`), hence the same state-dict keys (`frontend.logmel.melmat`).
    """

    def __init__(
        self,
        fs: int | str = 16000,
        n_fft: int = 512,
        win_length: int | None = None,
        hop_length: int = 128,
        window: str | None = "hann",
        center: bool = True,
        normalized: bool = False,
        onesided: bool = True,
        n_mels: int = 80,
        fmin: int | None = None,
        fmax: int | None = None,
        htk: bool = False,
        frontend_conf: Mapping[str, Any] | None = None,
        apply_stft: bool = True,
    ):
        super().__init__()
        from espnet2.layers.log_mel import LogMel
        from espnet2.layers.stft import Stft

        if frontend_conf and (frontend_conf.get("use_wpe") or frontend_conf.get("use_beamformer")):
            raise ValueError("multi-channel WPE/beamformer front ends are not supported")
        if not apply_stft:
            raise ValueError("apply_stft=False (pre-computed STFT input) is not supported")
        if isinstance(fs, str):
            import humanfriendly

            fs = humanfriendly.parse_size(fs)
        self.hop_length = hop_length
        self.stft = Stft(n_fft=n_fft, win_length=win_length, hop_length=hop_length, center=center,
                         window=window, normalized=normalized, onesided=onesided)
        self.logmel = LogMel(fs=fs, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=htk)
        self.n_mels = n_mels

    def output_size(self) -> int:
        return self.n_mels

    def forward(self, input: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec, feats_lens = self.stft(input, input_lengths)  # (B, T, F, 2): real and imaginary parts
        power = spec[..., 0] ** 2 + spec[..., 1] ** 2
        feats, _ = self.logmel(power, feats_lens)
        return feats, feats_lens


def load_espnet_checkpoint(
    config_yaml: str | os.PathLike,
    model_pth: str | os.PathLike,
    stats_file: str | os.PathLike | None = None,
) -> ESPnetASRModel:
    """An ESPnet ASRTask training output (config.yaml + .pth state dict) as an ESPnetASRModel in eval mode.

    Loads with strict=True: ESPnet's own loader (strict=False) silently keeps random weights for keys the
    file lacks. `stats_file` overrides normalize_conf.stats_file (which is relative to the recipe folder);
    when no stats file can be found, GlobalMVN's statistics are taken from the state dict itself.
    """
    config_yaml = Path(config_yaml)
    args = yaml.safe_load(config_yaml.read_text())
    state = torch.load(model_pth, map_location="cpu", weights_only=True)
    model = build_espnet_model(args, state, config_yaml.parent, stats_file)
    model.load_state_dict(state, strict=True)
    return model.eval()


def build_espnet_model(
    args: Mapping[str, Any],
    state: Mapping[str, torch.Tensor] | None = None,
    config_dir: Path | None = None,
    stats_file: str | os.PathLike | None = None,
) -> ESPnetASRModel:
    """ASRTask.build_model, for the pieces that import without torchaudio."""
    token_list = _token_list(args["token_list"], config_dir)
    vocab_size = len(token_list)

    frontend = None
    input_size = args.get("input_size")
    if input_size is None:  # features are computed inside the model
        if args.get("frontend", "default") != "default":
            raise ValueError(f"unsupported frontend {args.get('frontend')!r}")
        frontend = EspnetDefaultFrontend(**(args.get("frontend_conf") or {}))
        input_size = frontend.output_size()

    specaug = None
    if args.get("specaug") is not None:
        if args["specaug"] != "specaug":
            raise ValueError(f"unsupported specaug {args['specaug']!r}")
        from espnet2.asr.specaug.specaug import SpecAug

        specaug = SpecAug(**(args.get("specaug_conf") or {}))

    normalize = _espnet_normalize(args, state, config_dir, stats_file)
    if args.get("preencoder") is not None or args.get("postencoder") is not None:
        raise ValueError("pre-/post-encoders are not supported")

    encoder = _espnet_encoder(args.get("encoder"), input_size, args.get("encoder_conf") or {})
    if args.get("decoder", "transformer") != "transformer":
        raise ValueError(f"unsupported decoder {args.get('decoder')!r}")
    from espnet2.asr.decoder.transformer_decoder import TransformerDecoder

    decoder = TransformerDecoder(vocab_size=vocab_size, encoder_output_size=encoder.output_size(),
                                 **(args.get("decoder_conf") or {}))
    ctc = CTC(odim=vocab_size, encoder_output_size=encoder.output_size(), **(args.get("ctc_conf") or {}))
    if args.get("model", "espnet") != "espnet":
        raise ValueError(f"unsupported model {args.get('model')!r}")
    # No initialize(): every weight is about to be overwritten by the strict load.
    return ESPnetASRModel(
        vocab_size=vocab_size, frontend=frontend, specaug=specaug, normalize=normalize, preencoder=None,
        encoder=encoder, postencoder=None, decoder=decoder, ctc=ctc, joint_network=None,
        token_list=token_list, **(args.get("model_conf") or {}),
    )


def _token_list(value: Any, config_dir: Path | None) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(t) for t in value]
    path = _resolve(value, config_dir)
    if path is None:
        raise FileNotFoundError(f"token list {value!r} not found")
    return [line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()]


def _resolve(path: str | os.PathLike, config_dir: Path | None) -> Path | None:
    """`path` as given, or relative to the config's folder or its ancestors (ESPnet paths are relative to
    the recipe folder, two levels above exp/<name>/config.yaml)."""
    candidates = [Path(path)]
    if config_dir is not None and not Path(path).is_absolute():
        candidates += [d / path for d in [config_dir, *config_dir.resolve().parents][:4]]
    return next((c for c in candidates if c.exists()), None)


def _espnet_normalize(
    args: Mapping[str, Any],
    state: Mapping[str, torch.Tensor] | None,
    config_dir: Path | None,
    stats_file: str | os.PathLike | None,
) -> torch.nn.Module | None:
    kind = args.get("normalize")
    conf = dict(args.get("normalize_conf") or {})
    if kind is None:
        return None
    if kind == "utterance_mvn":
        from espnet2.layers.utterance_mvn import UtteranceMVN

        return UtteranceMVN(**conf)
    if kind != "global_mvn":
        raise ValueError(f"unsupported normalize {kind!r}")
    from espnet2.layers.global_mvn import GlobalMVN

    wanted = stats_file or conf.get("stats_file")
    conf.pop("stats_file", None)
    found = _resolve(wanted, config_dir) if wanted else None
    if found is not None:
        return GlobalMVN(stats_file=found, **conf)
    if state is None or "normalize.mean" not in state:
        raise FileNotFoundError(f"global_mvn stats file {wanted!r} not found and not in the weights")
    # The buffers are in the state dict and the strict load overwrites them; GlobalMVN only insists on a
    # file at construction, so give it one with the same statistics.
    mean, std = state["normalize.mean"].double().numpy(), state["normalize.std"].double().numpy()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "feats_stats.npz"
        np.savez(path, count=np.array(1.0), sum=mean, sum_square=mean * mean + std * std)
        return GlobalMVN(stats_file=path, **conf)


def _espnet_encoder(name: str | None, input_size: int, conf: Mapping[str, Any]) -> torch.nn.Module:
    """ESPnet encoder class by its ASRTask choice name (only the torchaudio-free ones)."""
    if name == "conformer":
        from espnet2.asr.encoder.conformer_encoder import ConformerEncoder as cls
    elif name == "branchformer":
        from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoder as cls
    elif name == "e_branchformer":
        from espnet2.asr.encoder.e_branchformer_encoder import EBranchformerEncoder as cls
    elif name == "transformer":
        from espnet2.asr.encoder.transformer_encoder import TransformerEncoder as cls
    else:
        raise ValueError(f"unsupported encoder {name!r}")
    return cls(input_size=input_size, **conf)
