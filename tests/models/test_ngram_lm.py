"""The word n-gram LM: a proper distribution, prefers in-domain word order, round-trips through its file."""

from __future__ import annotations

import math

import pytest

from pasu.models.ngram_lm import EOS, NgramLm

SENTENCES = ["set an alarm for seven am", "set an alarm for six pm", "wake me up at seven am",
             "play some jazz music", "play the news", "what is the weather like today", "turn the lights off"]


@pytest.fixture(scope="module")
def lm() -> NgramLm:
    return NgramLm.train(SENTENCES, order=3)


@pytest.mark.parametrize("context", [(), ("set",), ("set", "an"), ("unseen", "words"), ("<s>", "<s>")])
def test_next_word_probabilities_sum_to_one(lm, context):
    vocabulary = {gram[0] for gram in lm.counts[0]} | {"never-seen-word"}
    # the unknown word carries the remaining uniform share: one unseen word stands for all of them
    total = sum(math.exp(lm.logprob(w, context)) for w in vocabulary)
    assert total == pytest.approx(1.0, abs=1e-9)
    assert EOS in vocabulary


def test_in_domain_sentence_beats_acoustic_confusion(lm):
    assert lm.sentence_logprob("set an alarm for seven am") > lm.sentence_logprob("set and alarm four seven am")
    assert lm.sentence_logprob("play some jazz music") > lm.sentence_logprob("clay some jazz music")


def test_unknown_words_get_a_finite_score(lm):
    assert math.isfinite(lm.sentence_logprob("zebra quantum"))
    assert lm.sentence_logprob("") < 0  # the end of sentence still costs something


@pytest.mark.parametrize("name", ["lm.json", "lm.json.gz"])
def test_save_and_load_give_the_same_scores(lm, tmp_path, name):
    again = NgramLm.load(lm.save(tmp_path / name))
    for sentence in SENTENCES + ["set an alarm for nine", "zebra"]:
        assert again.sentence_logprob(sentence) == pytest.approx(lm.sentence_logprob(sentence), abs=1e-12)


def test_load_refuses_other_files(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"kind": "text_intent"}')  # another project file that happens to be JSON
    with pytest.raises(ValueError, match="not a word n-gram LM"):
        NgramLm.load(path)


def test_training_sentences_are_distinct_corpus_texts_or_normalized_lines(tmp_path):
    from pasu.models.data import write_synthetic_corpus
    from pasu.models.ngram_lm import training_sentences

    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=10, n_dev=1)  # 8 sentences, 2 said twice
    sentences = training_sentences(corpus)
    assert len(sentences) == 8 and sentences[:2] == ["wake me up at five am", "set an alarm for six thirty"]
    lines = tmp_path / "extra.txt"
    lines.write_text("Wake me up at 5, please!\n\nwake me up at 5, please\n")
    assert training_sentences(lines) == ["wake me up at 5 please"]


def test_sentence_files_give_their_texts_and_the_cli_counts_every_source(tmp_path, capsys):
    from pasu.cli import main
    from pasu.corpus.text import Sentence, write_sentences
    from pasu.models.data import write_synthetic_corpus
    from pasu.models.ngram_lm import NgramLm, training_sentences
    from pasu.slu import Slot

    swapped = tmp_path / "swap.jsonl"
    write_sentences(swapped, [Sentence("s1", "wake me up at nine pm", "alarm", "set", "alarm_set",
                                       (Slot("time", "nine pm"),), "slot_swap")])
    assert training_sentences(swapped) == ["wake me up at nine pm"]
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=10, n_dev=1)
    out = tmp_path / "words.json.gz"
    assert main(["lm", "ngram", "--corpus", str(corpus), "--also", str(swapped), "--out", str(out)]) == 0
    assert "9 sentences" in capsys.readouterr().out  # the corpus's 8 and the swapped one
    assert ("nine",) in NgramLm.load(out).counts[0]


def _read_arpa(path) -> list[dict[tuple[str, ...], tuple[float, float]]]:
    """ARPA's sections: gram -> (log10 P, log10 backoff weight, 0 where none is written)."""
    levels: list[dict] = []
    for line in path.read_text().splitlines():
        if line.endswith("-grams:"):
            levels.append({})
        elif levels and line and not line.startswith("\\"):
            fields = line.split("\t")
            levels[-1][tuple(fields[1].split())] = (float(fields[0]), float(fields[2]) if len(fields) > 2 else 0.0)
    return levels


def _arpa_prob(levels, word: str, context: tuple[str, ...]) -> float:
    """P(word | context) as an ARPA reader computes it: the listed n-gram, else back off."""
    if not context and (word,) not in levels[0]:
        word = "<unk>"
    gram = context + (word,)
    if gram in levels[len(gram) - 1]:
        return 10 ** levels[len(gram) - 1][gram][0]
    backoff = levels[len(context) - 1].get(context, (0.0, 0.0))[1] if context else 0.0
    return 10 ** backoff * _arpa_prob(levels, word, context[1:])


def test_arpa_export_gives_a_decoder_the_same_sentence_scores(lm, tmp_path):
    levels = _read_arpa(lm.write_arpa(tmp_path / "lm.arpa"))
    assert [len(level) for level in levels] == [int(line.split("=")[1]) for line in
                                                (tmp_path / "lm.arpa").read_text().splitlines() if "ngram " in line]
    for sentence in SENTENCES + ["set an alarm for seven pm", "play some news", "zebra"]:
        words = ["<s>"] + sentence.split() + [EOS]
        # ARPA starts a sentence with one <s>, the model with two: the scores must still agree
        arpa = sum(math.log(_arpa_prob(levels, w, tuple(words[max(0, i - 2):i]))) for i, w in enumerate(words) if i)
        assert arpa == pytest.approx(lm.sentence_logprob(sentence), abs=1e-4)


@pytest.mark.parametrize("context", [("<s>",), ("set",), ("set", "an"), ("<s>", "play")])
def test_arpa_distributions_sum_to_one_with_their_backoff_weights(lm, tmp_path, context):
    levels = _read_arpa(lm.write_arpa(tmp_path / "lm.arpa"))
    vocabulary = [gram[0] for gram in levels[0] if gram != ("<s>",)]
    assert sum(_arpa_prob(levels, w, context) for w in vocabulary) == pytest.approx(1.0, abs=1e-4)


def test_arpa_export_leaves_out_the_words_it_is_told_to(lm, tmp_path):
    text = lm.write_arpa(tmp_path / "lm.arpa", keep=lambda word: word != "jazz").read_text()
    assert "jazz" not in text and "\tplay some\t" in text
