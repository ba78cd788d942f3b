"""Model folders (package -> load round trip) and loading ESPnet ASR training outputs strictly."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from espnet2.asr.espnet_model import ESPnetASRModel
from pasu.models.package import (
    load_espnet_checkpoint,
    load_packaged,
    package_model,
    results_table,
)
from pasu.models.tokenizer import Tokenizer

import pasu_tests_cloud_support as support


@pytest.fixture(scope="module")
def exp_dir(tiny_experiment):
    return tiny_experiment[1]


def _ctc_log_probs(model: ESPnetASRModel, speech: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        enc, _ = model.encode(speech, torch.tensor([speech.size(1)] * speech.size(0)))
        return model.ctc.log_softmax(enc)


def test_package_round_trip(exp_dir, tmp_path):
    results = {"test": {"n": 40, "wer": 0.25, "intent_accuracy": 0.8}, "test_unseen": {"wer": 0.4}}
    (tmp_path / "eval.json").write_text(json.dumps(results))
    folder = package_model(exp_dir, tmp_path / "model", evaluation=tmp_path / "eval.json", name="device-test")
    assert {p.name for p in folder.iterdir()} == {"config.yaml", "model.pt", "tokenizer.model", "README.md"}

    weights = torch.load(folder / "model.pt", weights_only=True)
    assert weights["encoder.embed.conv.0.weight"].dtype == torch.float16
    assert weights["frontend.normalize.mean"].dtype == torch.float32  # the global stats keep full precision
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert "stats" not in config["model"] and config["model"]["specaug"] is None
    assert "frontend.normalize.mean" in weights  # the global stats travel in the weights

    model, tokenizer, loaded_config = load_packaged(folder)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert tokenizer.token_list == model.token_list and loaded_config["name"] == "device-test"

    # the same weights in float32, straight from the experiment
    reference, _, _ = _experiment_model(exp_dir)
    speech = 0.1 * torch.randn(2, 24000, generator=torch.Generator().manual_seed(0))
    a, b = _ctc_log_probs(reference, speech), _ctc_log_probs(model, speech)
    assert (a - b).abs().max() < 0.02  # float16 weights: a small, bounded drift in log-probabilities

    card = (folder / "README.md").read_text()
    assert "# device-test" in card and "parameters" in card and "pasu train --config c.yaml" in card
    assert "| test | 40 | 0.25 | 0.8 |" in card and "| test_unseen |  | 0.4 |  |" in card


def test_averaged_steps_describe_only_the_runs_average(exp_dir, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(exp_dir, exp)
    shutil.copyfile(exp / "model_avg.pt", exp / "hand_average.pt")
    averaged = yaml.safe_load((package_model(exp, tmp_path / "a") / "config.yaml").read_text())["training"]
    other = yaml.safe_load((package_model(exp, tmp_path / "b", weights="hand_average.pt") / "config.yaml").read_text())
    assert averaged["averaged_steps"] and averaged["weights"] == "model_avg.pt"
    assert other["training"]["averaged_steps"] is None and other["training"]["weights"] == "hand_average.pt"


def test_the_card_names_extra_training_corpora(exp_dir, tmp_path):
    extra = tmp_path / "corpus-v1"
    extra.mkdir()
    (extra / "report.json").write_text(json.dumps({"splits": {"train": {
        "utterances": 36000, "hours": 21.445, "voices": 108, "sentences": 8280}}}))
    exp = tmp_path / "exp"
    shutil.copytree(exp_dir, exp)
    config = yaml.safe_load((exp / "config.yaml").read_text())
    config["data"]["extra_corpora"] = [str(extra)]
    (exp / "config.yaml").write_text(yaml.safe_dump(config))
    folder = package_model(exp, tmp_path / "model")
    card = (folder / "README.md").read_text()
    assert (f"- also trained on `{extra}` (split `train`): 36,000 utterances, 21.45 h, 108 voices, "
            "8,280 sentences") in card


@pytest.mark.parametrize("as_agent, says", [
    (False, "`pasu eval` decodes with ESPnet's beam search (beam 5, CTC weight 0.3)."),
    (True, "`pasu eval --as-agent` answers as the device agent does (beam 5, CTC weight 0.3, LM `models/shipped/lm` "
           "at 0.2, length bonus 1.0): PASU's search"),
])
def test_the_card_says_how_its_results_were_decoded(exp_dir, tmp_path, as_agent, says):
    decoding = {"beam_size": 5, "ctc_weight": 0.3}
    if as_agent:
        decoding.update(lm="models/shipped/lm", lm_weight=0.2, length_bonus=1.0)
    results = {"test": {"n": 40, "wer": 0.25}, "decoding": decoding, "as_agent": as_agent}
    (tmp_path / "eval.json").write_text(json.dumps(results))
    card = (package_model(exp_dir, tmp_path / "model", evaluation=tmp_path / "eval.json") / "README.md").read_text()
    assert says in card and "| test | 40 | 0.25 |" in card


def _experiment_model(exp_dir: Path):
    from pasu.models.build import build_asr_model
    from pasu.models.package import inference_model_config

    config = yaml.safe_load((exp_dir / "config.yaml").read_text())
    model = build_asr_model(inference_model_config(config["model"]))
    model.load_state_dict(torch.load(exp_dir / "model_avg.pt", weights_only=True), strict=True)
    return model.eval(), Tokenizer(exp_dir / "tokenizer.model"), config


def test_packaged_model_must_match_its_weights(exp_dir, tmp_path):
    folder = package_model(exp_dir, tmp_path / "model")
    weights = torch.load(folder / "model.pt", weights_only=True)
    weights.pop("decoder.output_layer.bias")
    torch.save(weights, folder / "model.pt")
    with pytest.raises(RuntimeError, match="Missing key"):
        load_packaged(folder)


def test_results_table_without_results():
    assert "TODO" in results_table(None)[0]
    assert results_table({"wer": 0.5})[2] == "| test | 0.5 |"


def test_results_table_from_a_pasu_eval_file():
    results = {"test": {"n": 200, "wer": 0.25}, "test_unseen": {"n": 200, "wer": 0.5},
               "decoding": {"beam_size": 5, "ctc_weight": 0.3}, "corpus": "data/corpus-full"}
    assert results_table(results)[2:] == ["| test | 200 | 0.25 |", "| test_unseen | 200 | 0.5 |"]


# --- ESPnet training outputs ----------------------------------------------------------------------------



def test_load_espnet_checkpoint(tmp_path, monkeypatch):
    config_yaml, pth, reference = support.write_espnet_run(tmp_path / "recipe")
    monkeypatch.chdir(tmp_path)  # not the recipe folder: relative paths resolve from the config's location
    model = load_espnet_checkpoint(config_yaml, pth)
    assert not model.training and model.token_list == support.ESPNET_TOKENS
    speech = 0.1 * torch.randn(2, 16000)
    assert torch.equal(_ctc_log_probs(model, speech), _ctc_log_probs(reference, speech))


def test_load_espnet_checkpoint_without_stats_file(tmp_path):
    config_yaml, pth, reference = support.write_espnet_run(tmp_path / "recipe")
    (tmp_path / "recipe" / "exp" / "asr_stats" / "train" / "feats_stats.npz").unlink()
    model = load_espnet_checkpoint(config_yaml, pth)  # GlobalMVN statistics come from the weights
    speech = 0.1 * torch.randn(1, 12000)
    assert torch.equal(_ctc_log_probs(model, speech), _ctc_log_probs(reference, speech))


def test_load_espnet_checkpoint_is_strict(tmp_path):
    config_yaml, pth, _ = support.write_espnet_run(tmp_path / "recipe")
    state = torch.load(pth, weights_only=True)
    state.pop("encoder.encoders.1.conv_module.pointwise_conv2.weight")
    torch.save(state, pth)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_espnet_checkpoint(config_yaml, pth)


def test_default_frontend_replica_matches_espnet(tmp_path):
    """EspnetDefaultFrontend == espnet2's DefaultFrontend, imported in a child process with a stub torchaudio
    (the real one imports torchaudio only for the multi-channel front end that mono audio never uses)."""
    script = textwrap.dedent(
        """
        import importlib.machinery, sys, types
        class Stub(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                sub = Stub(f"{self.__name__}.{name}")
                sub.__spec__ = importlib.machinery.ModuleSpec(sub.__name__, None)
                sys.modules[sub.__name__] = sub
                return sub
            def __call__(self, *args, **kwargs):
                return None
        stub = Stub("torchaudio"); stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        stub.__version__ = "0.0"
        sys.modules["torchaudio"] = stub
        try:
            from espnet2.asr.frontend.default import DefaultFrontend
        except Exception as e:
            print("SKIP", e); sys.exit(0)
        import torch
        from pasu.models.package import EspnetDefaultFrontend
        torch.set_num_threads(1)
        for conf in ({"n_fft": 512, "win_length": 400, "hop_length": 160, "fs": "16k"}, {}):
            ref, mine = DefaultFrontend(**conf).eval(), EspnetDefaultFrontend(**conf).eval()
            assert list(ref.state_dict()) == list(mine.state_dict())
            x, n = torch.randn(2, 16000), torch.tensor([16000, 11000])
            (a, al), (b, bl) = ref(x, n), mine(x, n)
            assert torch.equal(a, b) and torch.equal(al, bl)
        print("OK")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if "SKIP" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert "OK" in out.stdout
