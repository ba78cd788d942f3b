"""New training sentences by slot-value swaps: intents kept, markup recoverable, held-out text never written."""

from __future__ import annotations

import random

from pasu.cli import main
from pasu.corpus.text import SWAP_SOURCE, Sentence, load_corpus_text, read_sentences, samples_dir
from pasu.models.slot_swap import SwapOptions, swap_slots, swapped, value_pools
from pasu.models.targets import decode_target, encode_target
from pasu.slu import Slot


def _sentence(text: str, intent: str, slots: tuple[Slot, ...] | None) -> Sentence:
    scenario, _, action = intent.partition("_")
    return Sentence(f"t-{text}", text, scenario, action, intent, slots, "slurp_train")


TRAIN = (
    _sentence("wake me at five am", "alarm_set", (Slot("time", "five am"),)),
    _sentence("set an alarm for noon on monday", "alarm_set", (Slot("time", "noon"), Slot("date", "monday"))),
    _sentence("what is the weather in paris", "weather_query", (Slot("place_name", "paris"),)),
    _sentence("is it cold in new york tomorrow", "weather_query",
              (Slot("place_name", "new york"), Slot("date", "tomorrow"))),
    _sentence("tell me a joke", "general_joke", ()),
    _sentence("remind me to call mum", "calendar_set", None),
)


def test_a_swap_keeps_the_intent_and_puts_another_value_of_the_same_type_where_the_old_one_was():
    pools = value_pools(TRAIN)
    new = swapped(TRAIN[3], pools, random.Random(0))
    assert new is not None and new.intent == "weather_query" and new.source == SWAP_SOURCE
    assert [s.type for s in new.slots] == ["place_name", "date"]
    assert new.slots[0].value == "paris" and new.slots[1].value == "monday"  # the only other values of each type
    assert new.text == "is it cold in paris monday"
    # the target built from it marks the new values, and decoding it gives them back
    decoded = decode_target(encode_target(new.text, new.intent, new.slots))
    assert decoded.intent == new.intent and list(decoded.slots) == list(new.slots)


def test_sentences_without_known_slots_are_never_carriers():
    pools = value_pools(TRAIN)
    assert swapped(TRAIN[4], pools, random.Random(0)) is None
    assert swapped(TRAIN[5], pools, random.Random(0)) is None
    assert "calendar_set" not in {s.intent for s in swap_slots(TRAIN, SwapOptions(count=50))}


def test_no_input_or_excluded_sentence_is_written_and_each_is_new_once():
    everything = swap_slots(TRAIN, SwapOptions(count=1000, seed=1))
    assert everything, "the carriers hold some new combinations"
    texts = [s.text for s in everything]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & {s.text for s in TRAIN}
    held_out = texts[:2]
    again = swap_slots(TRAIN, SwapOptions(count=1000, seed=1), exclude=held_out)
    assert not set(held_out) & {s.text for s in again}
    assert len(again) == len(everything) - 2  # the small text runs out of combinations before 1,000


def test_the_same_seed_draws_the_same_sentences():
    assert swap_slots(TRAIN, SwapOptions(count=5, seed=3)) == swap_slots(TRAIN, SwapOptions(count=5, seed=3))


def test_cli_writes_a_sentence_file_without_devel_or_test_text(tmp_path, capsys):
    out = tmp_path / "swap.jsonl"
    assert main(["corpus", "swap-slots", "--count", "20", "--out", str(out), "--data-dir", str(samples_dir())]) == 0
    written = read_sentences(out)
    assert 0 < len(written) <= 20 and all(s.source == SWAP_SOURCE for s in written)
    text = load_corpus_text(samples_dir())
    assert not {s.text for s in written} & {s.text for s in text.dev + text.test + text.train}
    assert f"-> {out}" in capsys.readouterr().out


def test_cli_refuses_a_count_below_one(tmp_path, capsys):
    assert main(["corpus", "swap-slots", "--count", "0", "--out", str(tmp_path / "x.jsonl"),
                 "--data-dir", str(samples_dir())]) == 2
    assert "--count" in capsys.readouterr().err
