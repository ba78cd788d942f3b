"""pasu.corpus.text: normalization, label joining, leakage checks, on the shipped samples and the shared data."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from pasu.corpus import text as corpus_text
from pasu.corpus.text import (
    ORIGINS, CorpusDataError, CorpusText, LeakageError, Sentence, check_no_leakage, load_corpus_text,
    normalize_text, samples_dir,
)
from pasu.settings import shared_data_dir
from pasu.slu import Slot

SHARED = shared_data_dir()
HAVE_SHARED = (SHARED / "slurp" / "lm.txt").is_file()
SKIP_REASON = f"needs the shared corpus text in ../shared/data (or $PASU_SHARED_DATA); not found at {SHARED}"


def needs_shared(test):
    """Run `test` only where the shared data is present."""
    return pytest.mark.needs_shared(pytest.mark.skipif(not HAVE_SHARED, reason=SKIP_REASON)(test))


@pytest.fixture(scope="module")
def samples() -> CorpusText:
    return load_corpus_text(samples_dir())


@pytest.fixture
def data_copy(tmp_path: Path) -> Path:
    """A writable copy of the samples, for tests that damage or extend the data."""
    return Path(shutil.copytree(samples_dir(), tmp_path / "data"))


def _by_text(sentences) -> dict[str, Sentence]:
    return {s.text: s for s in sentences}


def _add_hwu_row(data_dir: Path, answerid: int, scenario: str, action: str, annotation: str) -> None:
    with open(data_dir / corpus_text.HWU64, "a", newline="") as f:
        csv.writer(f, delimiter=";", lineterminator="\n").writerow(
            [answerid, scenario, action, annotation, annotation, annotation])


def _add_slurpfood(data_dir: Path, sentence: str, label: str) -> None:
    path = data_dir / corpus_text.SLURPFOOD
    labels = json.loads(path.read_text())
    path.write_text(json.dumps(labels | {sentence: label}))


def _add_lm(data_dir: Path, sentence: str) -> None:
    with open(data_dir / corpus_text.LM, "a") as f:
        f.write(sentence + "\n")


# ---------------------------------------------------------------------------------------------- normalization

@pytest.mark.parametrize("raw, expected", [
    ("Set an alarm for Six AM.", "set an alarm for six am"),
    ("i'm home, what's up?", "i'm home what's up"),
    ("I\u2019m late", "i'm late"),                                      # curly apostrophe
    ("my parents' car", "my parents car"),                             # a quote, not a contraction
    ("'quoted' words", "quoted words"),
    ("tweet at&t my service is down", "tweet at and t my service is down"),
    ("email john@gmail dot com", "email john at gmail dot com"),
    ("mail sam.ortiz@example.com", "mail sam ortiz at example dot com"),
    ("go to www.example.org", "go to www dot example dot org"),
    ("tune to 96.5 fm", "tune to 96 point 5 fm"),
    ("price of i. b. m. at five a.m.", "price of i b m at five a m"),
    ("tweet @nike #nothappy", "tweet at nike hashtag nothappy"),
    ("set regular bi-weekly meeting", "set regular bi weekly meeting"),
    ("turn_down speakers", "turn down speakers"),
    ("play tech n9ne", "play tech n9ne"),                               # digits stay
    ("caf\u00e9 near me", "cafe near me"),
    ("  lots   of\tspace  ", "lots of space"),
    ("?!.", ""),
])
def test_normalize_text(raw: str, expected: str) -> None:
    assert normalize_text(raw) == expected


def test_normalize_text_is_idempotent(samples: CorpusText) -> None:
    for s in samples.all():
        assert normalize_text(s.text) == s.text


# ---------------------------------------------------------------------------------------------- the samples

def test_samples_counts(samples: CorpusText) -> None:
    summary = samples.summary()
    assert (summary["train"], summary["dev"], summary["test"]) == (56, 15, 15)
    assert summary["by_source"] == {"hwu64": 12, "slurp_devel": 15, "slurp_test": 15, "slurp_train": 44}
    assert (summary["train_lm_via_hwu64"], summary["train_lm_via_slurpfood"], summary["train_hwu64_extra"]) \
        == (24, 20, 12)
    assert summary["intents"] == {"train": 8, "dev": 8, "test": 8, "all": 8}
    assert summary["test_intents_without_train"] == 0


def test_samples_join_report(samples: CorpusText) -> None:
    join = samples.summary()["join"]
    assert join["lm_sentences"] == 50  # "#NAME?" and "<unk>" lines skipped, repeats collapsed
    assert join["lm_labelled"] == 45
    assert (join["lm_labelled_by_both"], join["both_agree_as_given"], join["both_agree_after_repair"]) == (4, 3, 4)
    assert join["slurpfood_unresolved"] == 1
    assert join["hwu64_only_intent"] == 3


def test_samples_ids_and_sources(samples: CorpusText) -> None:
    assert all(s.source == "slurp_devel" and s.id.startswith("slurp-devel-") for s in samples.dev)
    assert all(s.source == "slurp_test" and s.id.startswith("slurp-test-") for s in samples.test)
    assert all(s.id.startswith("lm-") for s in samples.train if s.source == "slurp_train")
    assert all(s.id.startswith("hwu-") for s in samples.train if s.source == "hwu64")
    ids = [s.id for s in samples.all()]
    assert len(ids) == len(set(ids))
    # ids are stable across loads: a lm.txt id is a hash of the text
    assert [s.id for s in load_corpus_text(samples_dir()).train] == [s.id for s in samples.train]


def test_slots_parsed_and_normalized(samples: CorpusText) -> None:
    test = _by_text(samples.test)
    assert test["set my alarm for five fifteen a m"].slots == (Slot("time", "five fifteen a m"),)
    assert test["shuffle songs by marigold and the foxes"].slots == (Slot("artist_name", "marigold and the foxes"),)
    email = test["send an email to sam ortiz at example dot com about the invoice"]
    assert (email.intent, email.slots) == ("email_sendemail", (Slot("email_address", "sam ortiz at example dot com"),))


def test_slots_unknown_versus_none(samples: CorpusText) -> None:
    train = _by_text(samples.train)
    assert train["turn off all the lamps"].slots == ()            # HWU64 annotation without slots
    assert train["alarm for six please"].slots is None            # slurpfood gives the intent only
    # a sentence both label keeps HWU64's slots
    assert train["order sushi for seven pm"].slots == (Slot("food_type", "sushi"), Slot("time", "seven pm"))


def test_intent_is_scenario_action(samples: CorpusText) -> None:
    # the sample devel row "will it snow in oslo..." has SLURP's action-only `intent` field "query"
    snow = _by_text(samples.dev)["will it snow in oslo this weekend"]
    assert (snow.scenario, snow.action, snow.intent) == ("weather", "query", "weather_query")
    assert all(s.intent == f"{s.scenario}_{s.action}" for s in samples.all())


def test_scenario_less_slurpfood_labels(samples: CorpusText) -> None:
    train = _by_text(samples.train)
    assert train["turn the pantry lights off"].intent == "iot_hue_lightoff"  # only iot has hue_lightoff
    assert train["lights off in the garage"].intent == "iot_hue_lightoff"    # completed from HWU64
    assert "what's on for saturday" not in train                             # "query": which scenario?


def test_hwu_only_intents_and_junk_left_out(samples: CorpusText) -> None:
    intents = {s.intent for s in samples.train}
    assert not intents & corpus_text.HWU_ONLY_INTENTS
    texts = {s.text for s in samples.train}
    assert "hashtag name" not in texts and not any("unk" in t.split() for t in texts)


def test_train_is_deduplicated(samples: CorpusText) -> None:
    texts = [s.text for s in samples.train]
    assert len(texts) == len(set(texts))
    # lm.txt repeats lines; HWU64 has "what's the time pasu" twice, in two spellings
    assert texts.count("what's the time pasu") == 1
    assert texts.count("wake me at dawn on monday") == 1


def test_samples_are_our_own_and_do_not_leak(samples: CorpusText) -> None:
    check_no_leakage(samples)
    train = {s.text for s in samples.train}
    assert not train & {s.text for s in samples.dev + samples.test}


# ---------------------------------------------------------------------------------------------- joining rules

def test_eval_sentences_are_removed_from_train(data_copy: Path) -> None:
    """A devel/test sentence that turns up in lm.txt or HWU64 is dropped from train, never kept."""
    _add_lm(data_copy, "Do I need sunglasses today?")
    _add_slurpfood(data_copy, "Do I need sunglasses today?", "weather_query")
    _add_hwu_row(data_copy, 999001, "iot", "hue_lightoff", "Switch off the lamp in the [house_place : study].")
    text = load_corpus_text(data_copy)
    train = {s.text for s in text.train}
    assert "do i need sunglasses today" not in train
    assert "switch off the lamp in the study" not in train
    join = text.summary()["join"]
    assert (join["removed_eval_overlap"], join["hwu64_in_eval"]) == (1, 1)


def test_disagreement_keeps_slurpfood_intent_without_slots(data_copy: Path) -> None:
    _add_lm(data_copy, "how long until the ferry leaves")
    _add_slurpfood(data_copy, "how long until the ferry leaves", "transport_query")
    _add_hwu_row(data_copy, 999002, "datetime", "query", "how long until the [transport_type : ferry] leaves")
    text = load_corpus_text(data_copy)
    ferry = _by_text(text.train)["how long until the ferry leaves"]
    assert (ferry.intent, ferry.slots) == ("transport_query", None)
    assert text.summary()["join"]["both_disagree"] == 1


def test_hwu_text_with_two_intents_is_dropped(data_copy: Path) -> None:
    _add_hwu_row(data_copy, 999003, "alarm", "set", "six thirty")
    _add_hwu_row(data_copy, 999004, "datetime", "query", "six thirty")
    text = load_corpus_text(data_copy)
    assert "six thirty" not in {s.text for s in text.train}
    assert text.summary()["join"]["hwu64_ambiguous"] == 1


# ---------------------------------------------------------------------------------------------- failures

def test_leakage_is_detected(samples: CorpusText) -> None:
    leaked = [Sentence(f"lm-leak{i}", s.text, s.scenario, s.action, s.intent, None, "slurp_train")
              for i, s in enumerate(samples.test[:3])]
    bad = CorpusText(samples.train + tuple(leaked), samples.dev, samples.test)
    with pytest.raises(LeakageError, match=r"^3 devel/test sentences") as err:
        check_no_leakage(bad)
    assert repr(samples.test[0].text) in str(err.value)


def test_load_checks_leakage(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = []
    monkeypatch.setattr(corpus_text, "check_no_leakage", checked.append)
    load_corpus_text(samples_dir())
    assert len(checked) == 1


@pytest.mark.parametrize("name", sorted(ORIGINS))
def test_missing_file_names_file_and_origin(data_copy: Path, name: str) -> None:
    (data_copy / name).unlink()
    with pytest.raises(CorpusDataError) as err:
        load_corpus_text(data_copy)
    message = str(err.value)
    assert str(data_copy / name) in message
    assert "https://github.com/" in message and ORIGINS[name] in message


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CorpusDataError, match="PASU_SHARED_DATA"):
        load_corpus_text(tmp_path / "nowhere")


def test_malformed_hwu_file(data_copy: Path) -> None:
    (data_copy / corpus_text.HWU64).write_text("answerid,scenario,intent,answer_annotation\n1,alarm,set,hi\n")
    with pytest.raises(CorpusDataError, match="';'-separated"):
        load_corpus_text(data_copy)


def test_sentence_rejects_inconsistent_intent() -> None:
    with pytest.raises(ValueError, match="scenario_action"):
        Sentence("x", "hello", "alarm", "set", "alarm_query", (), "hwu64")


# ---------------------------------------------------------------------------------------------- the real data

@pytest.fixture(scope="module")
def shared() -> CorpusText:
    return load_corpus_text(SHARED)


@needs_shared
def test_shared_data_counts(shared: CorpusText) -> None:
    """The counts the data README publishes, up to the normalization merging a few sentences."""
    summary, join = shared.summary(), shared.join
    assert (summary["dev"], summary["test"]) == (2033, 2974)
    assert abs(join.lm_sentences - 11502) <= 10
    assert abs(join.lm_labelled - 6161) <= 10
    assert abs(join.lm_labelled_by_both - 944) <= 5 and abs(join.both_agree_as_given - 934) <= 5
    assert join.both_agree_after_repair >= join.lm_labelled_by_both - 5
    assert abs(join.hwu64_in_eval - 2161) <= 10
    assert abs(join.hwu64_not_in_lm - 4900) <= 50
    assert 7800 <= summary["train"] <= 8800
    assert summary["intents"]["dev"] == summary["intents"]["test"] == 59
    assert summary["scenarios"] == 18
    assert summary["test_intents_without_train"] == 0


@needs_shared
def test_shared_data_has_no_leakage(shared: CorpusText) -> None:
    check_no_leakage(shared)
    assert not {s.text for s in shared.train} & {s.text for s in shared.dev + shared.test}


@needs_shared
def test_samples_copy_nothing_from_shared(shared: CorpusText, samples: CorpusText) -> None:
    """The repository ships hand-written samples, never sentences of the shared data."""
    theirs = {s.text for s in shared.all()} | set(corpus_text._read_lm(SHARED)) \
        | set(corpus_text._read_slurpfood(SHARED)) | {r.text for r in corpus_text._read_hwu(SHARED)}
    ours = {s.text for s in samples.all()} | set(corpus_text._read_lm(samples_dir())) \
        | set(corpus_text._read_slurpfood(samples_dir())) | {r.text for r in corpus_text._read_hwu(samples_dir())}
    assert not ours & theirs


def test_unlabelled_training_text_is_what_no_source_labels(samples: CorpusText) -> None:
    unlabelled = corpus_text.unlabelled_training_text(samples_dir())
    lm = corpus_text._read_lm(samples_dir())
    labelled = {s.text for s in samples.all()}
    assert unlabelled and set(unlabelled) == set(lm) - labelled
    assert "tell me a joke about penguins" in unlabelled and len(set(unlabelled)) == len(unlabelled)


def test_sentence_files_round_trip_slots_known_and_unknown(tmp_path: Path) -> None:
    sentences = (
        Sentence("a", "wake me at six am", "alarm", "set", "alarm_set", (Slot("time", "six am"),), "slurp_train"),
        Sentence("b", "tell me a joke", "general", "joke", "general_joke", None, corpus_text.PSEUDO_SOURCE),
        Sentence("c", "lights off", "iot", "hue_lightoff", "iot_hue_lightoff", (), "hwu64"),
    )
    path = tmp_path / "sentences.jsonl"
    corpus_text.write_sentences(path, sentences)
    assert corpus_text.read_sentences(path) == sentences
    assert not list(tmp_path.glob("*.tmp"))


def test_a_bad_sentence_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "sentences.jsonl"
    corpus_text.write_sentences(path, [Sentence("a", "hi", "general", "greet", "general_greet", None, "hwu64")])
    path.write_text(path.read_text() + '{"text": "no labels"}\n')
    with pytest.raises(CorpusDataError, match=r"sentences.jsonl:2: not a sentence row"):
        corpus_text.read_sentences(path)
