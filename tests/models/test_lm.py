"""Token-level LMs over an ASR model's tokenizer: training, resuming, LM folders, and shallow fusion in decoding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pasu.cli import build_parser
from pasu.models.build import build_asr_model
from pasu.models.lm import (
    LmConfig,
    LmNetOptions,
    LmTrainOptions,
    build_lm,
    check_token_list,
    encode_texts,
    load_lm,
    package_lm,
    perplexity,
    read_texts,
    train_lm,
)
from pasu.models.recognizer import EspnetRecognizer, espnet_beam_search
from pasu.models.targets import target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions
from pasu.models.train import OptimOptions
import pasu_tests_cloud_support  # loaded by tests/conftest.py

# What the strong LM is trained on, and what decoding should turn into with it.
LM_TARGET = "alarm_set wake me up at SLOT_time five am SLOT_END"
# A network and a schedule that learn a few sentences in a few dozen steps.
TINY = LmConfig(
    lm=LmNetOptions(unit=32, nlayers=1, dropout_rate=0.0),
    optim=OptimOptions(lr=1e-2, scheduler="constant", warmup_steps=1, weight_decay=0.0, grad_clip=1.0),
    train=LmTrainOptions(batch_size=4, max_epochs=None, max_steps=30, patience=None, num_threads=1),
)


def _steps(config: LmConfig, steps: int) -> LmConfig:
    return dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=steps))


def _manifest(folder: Path, split: str, rows: list[tuple[str, str, list | None]]) -> None:
    """A corpus manifest with the fields training reads; no audio: the LM reads only the text."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"{split}-{i}", "audio": f"wav/{split}-{i}.flac", "duration": 1.0, "text": text,
                         "intent": intent, "slots": slots}) for i, (text, intent, slots) in enumerate(rows)]
    (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def asr_folder(tmp_path_factory) -> Path:
    return pasu_tests_cloud_support.write_model_folder(tmp_path_factory.mktemp("asr") / "tiny")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    rows = [("wake me up at five am", "alarm_set", [["time", "five am"]]),
            ("what is the weather tomorrow", "weather_query", [["date", "tomorrow"]]),
            ("play some jazz music", "alarm_set", None)]
    _manifest(folder, "train", rows * 3)  # each sentence in three voices, as the corpus renders them
    _manifest(folder, "dev", rows[:2])
    return folder


@pytest.fixture(scope="module")
def strong_lm(asr_folder, tmp_path_factory) -> Path:
    """An LM folder that has learnt one target string by heart, from text files."""
    root = tmp_path_factory.mktemp("strong_lm")
    (root / "train.txt").write_text(f"{LM_TARGET}\n")
    train_lm(asr_folder, root / "train.txt", root / "exp", _steps(TINY, 60), dev=root / "train.txt")
    return package_lm(root / "exp", root / "lm", name="strong")


def test_corpus_text_is_the_distinct_target_strings(corpus):
    assert read_texts(corpus, "train") == [
        "alarm_set wake me up at SLOT_time five am SLOT_END", "weather_query what is the weather SLOT_date tomorrow "
        "SLOT_END", "alarm_set SLOTS_UNKNOWN play some jazz music"]


def test_a_sentence_file_reads_as_target_strings(tmp_path):
    """The rows `pasu corpus swap-slots` and `pasu text-intent pseudo-label` write, as training targets."""
    rows = [{"text": "wake me at seven am", "scenario": "alarm", "action": "set", "intent": "alarm_set",
             "slots": [["time", "seven am"]], "sentence_id": "swap-1", "source": "slot_swap"},
            {"text": "tell me a joke", "scenario": "general", "action": "joke", "intent": "general_joke",
             "slots": None, "sentence_id": "pseudo-2", "source": "slurp_train_pseudo"}]
    path = tmp_path / "sentences.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]))
    assert read_texts(path, "train") == ["alarm_set wake me at SLOT_time seven am SLOT_END",
                                         "general_joke SLOTS_UNKNOWN tell me a joke"]


def test_more_sources_join_the_training_text_once(asr_folder, corpus, tmp_path):
    extra = tmp_path / "extra.txt"
    extra.write_text("alarm_set wake me up at SLOT_time six am SLOT_END\n" + read_texts(corpus, "train")[0] + "\n")
    train_lm(asr_folder, corpus, tmp_path / "exp", _steps(TINY, 2), also=[extra])
    run = json.loads((tmp_path / "exp" / "run.json").read_text())
    assert run["train_sentences"] == 4  # the corpus's three and one new; the repeated one counted once
    card = (package_lm(tmp_path / "exp", tmp_path / "lm") / "README.md").read_text()
    assert f"`{extra}`" in card and "4 distinct sentences" in card
    with pytest.raises(FileNotFoundError, match="no such corpus folder, sentence file or text file"):
        train_lm(asr_folder, corpus, tmp_path / "exp2", _steps(TINY, 2), also=[tmp_path / "missing.jsonl"])


def test_train_package_load_round_trip(asr_folder, corpus, tmp_path):
    tokenizer = Tokenizer(asr_folder / "tokenizer.model")
    dev = encode_texts(tokenizer, read_texts(corpus, "dev"))
    torch.manual_seed(0)
    untrained = perplexity(build_lm(tokenizer.vocab_size, TINY.lm), dev)

    result = train_lm(asr_folder, corpus, tmp_path / "exp", TINY, command="pasu lm train --out lm")
    history = [json.loads(line) for line in (tmp_path / "exp" / "log.jsonl").read_text().splitlines()]
    assert [h["dev_perplexity"] for h in history][-1] < history[0]["dev_perplexity"] < untrained  # it learns
    assert result.dev_perplexity < 2.0 < untrained / 10  # the dev sentences are training sentences

    folder = package_lm(tmp_path / "exp", tmp_path / "lm")
    assert {p.name for p in folder.iterdir()} == {"config.yaml", "model.pt", "tokenizer.model", "README.md"}
    assert torch.load(folder / "model.pt", weights_only=True)["lm.rnn.weight_ih_l0"].dtype == torch.float16
    lm = load_lm(folder)
    assert lm.token_list == tokenizer.token_list and not lm.model.training
    assert perplexity(lm.model, dev) == pytest.approx(result.dev_perplexity, rel=0.02)  # float16 weights
    card = (folder / "README.md").read_text()
    assert f"Dev perplexity: **{result.dev_perplexity:.2f}**" in card and "pasu lm train --out lm" in card
    assert "3 distinct sentences" in card


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(asr_folder, corpus, tmp_path):
    train_lm(asr_folder, corpus, tmp_path / "straight", _steps(TINY, 6))
    train_lm(asr_folder, corpus, tmp_path / "resumed", _steps(TINY, 4))
    result = train_lm(asr_folder, corpus, tmp_path / "resumed", _steps(TINY, 6))
    assert result.steps == 6
    straight, resumed = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=False)["model"]
                         for run in ("straight", "resumed"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_an_lm_over_another_token_list_is_refused(strong_lm):
    support = pasu_tests_cloud_support
    other = Tokenizer.train(["turn on the radio", "stop the music"], target_symbols(["music_play"], ["song"]),
                            TokenizerOptions(vocab_size=40))
    model = build_asr_model({"token_list": other.token_list, **support.TINY_MODEL}).eval()
    options = dataclasses.replace(support.TINY_DECODING, lm=str(strong_lm))
    with pytest.raises(ValueError, match="another token list"):
        EspnetRecognizer(model, other, options)
    with pytest.raises(ValueError, match="another token list"):  # a preloaded LM is checked too
        espnet_beam_search(model, other.token_list, options, lm=load_lm(strong_lm))


def test_lm_weight_zero_changes_nothing_and_a_strong_lm_pulls_the_decode_to_its_text(strong_lm):
    support = pasu_tests_cloud_support
    model, tokenizer = support.tiny_parts()
    options = dataclasses.replace(support.TINY_DECODING, maxlenratio=0.0)  # end when <eos> wins: the LM's call
    speech = [support.waveform(2.0, seed=3)]

    def decode(**lm):
        return EspnetRecognizer(model, tokenizer, dataclasses.replace(options, **lm)).recognize_batch(speech)[0]

    without = decode()
    assert decode(lm=str(strong_lm), lm_weight=0.0) == without
    fused = decode(lm=str(strong_lm), lm_weight=5.0)
    assert (fused.text, fused.intent, [tuple(s) for s in fused.slots]) == (
        "wake me up at five am", "alarm_set", [("time", "five am")])
    assert without.text != fused.text  # the untrained model alone says something else

    search = espnet_beam_search(model, tokenizer.token_list, dataclasses.replace(options, lm=str(strong_lm)))
    assert "lm" in search.full_scorers and search.weights["lm"] == options.lm_weight


def test_the_device_agent_fuses_the_lm_in_its_final_decode(asr_folder, strong_lm, tmp_path, capsys):
    import soundfile

    wav = tmp_path / "speech.wav"
    soundfile.write(wav, pasu_tests_cloud_support.waveform(2.0, seed=3), 16000)

    def run(*flags):
        args = build_parser().parse_args(["device", "run", "--audio", str(wav), "--model", str(asr_folder),
                                          "--no-pilots", "--json", *flags])
        code = args.run(args)
        captured = capsys.readouterr()
        return code, json.loads(captured.out) if code == 0 else captured.err

    _, without = run()
    code, fused = run("--lm", str(strong_lm), "--lm-weight", "5")
    assert code == 0 and (fused["text"], fused["intent"]) == ("wake me up at five am", "alarm_set")
    assert without["text"] != fused["text"]
    code, error = run("--lm-weight", "0.2")
    assert code == 2 and "needs an LM" in error
    code, error = run("--lm", str(tmp_path), "--lm-weight", "0.2")
    assert code == 2 and "no LM folder there" in error


def test_the_commands_end_to_end(asr_folder, tmp_path, capsys):
    from pasu.models.data import write_synthetic_corpus

    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=4, n_dev=2)
    args = build_parser().parse_args(
        ["lm", "train", "--model", str(asr_folder), "--corpus", str(corpus), "--exp", str(tmp_path / "exp"),
         "--out", str(tmp_path / "lm"), "--units", "16", "--layers", "1", "--dropout", "0", "--max-steps", "3",
         "--threads", "1"])
    assert args.run(args) == 0
    assert "dev perplexity" in capsys.readouterr().out
    config = load_lm(tmp_path / "lm")
    assert config.name == "lm" and config.model.lm.nhid == 16

    out = tmp_path / "eval.json"
    args = build_parser().parse_args(
        ["eval", str(asr_folder), "--corpus", str(corpus), "--splits", "dev", "--beam", "2", "--threads", "1",
         "--lm", str(tmp_path / "lm"), "--lm-weight", "0.5", "--out", str(out)])
    assert args.run(args) == 0
    results = json.loads(out.read_text())
    assert results["decoding"]["lm"] == str(tmp_path / "lm") and results["decoding"]["lm_weight"] == 0.5
    assert 0.0 <= results["dev"]["wer"]


def test_the_shipped_lm_reads_the_shipped_devices_tokens_and_knows_a_command_from_a_jumble():
    from pasu.settings import shipped_model

    lm = load_lm(shipped_model("lm"))
    tokenizer = Tokenizer(shipped_model("device") / "tokenizer.model")
    check_token_list(lm, tokenizer.token_list)  # what decoding checks before it fuses the LM
    command = "alarm_set wake me up at SLOT_time seven am SLOT_END tomorrow"
    intent, *words = command.split()
    jumble = " ".join([intent, *reversed(words)])
    ppl_command, ppl_jumble = (perplexity(lm.model, encode_texts(tokenizer, [t])) for t in (command, jumble))
    assert ppl_command < 10 < 5 * ppl_command < ppl_jumble
