"""SLU targets (intent + words + slot markup) and their sentencepiece tokenizer."""

import logging

import pytest

from pasu.metrics import SluResult
from pasu.models.targets import (
    SLOT_END,
    SLOTS_UNKNOWN,
    decode_target,
    encode_target,
    target_symbols,
)
from pasu.models.tokenizer import BLANK, SOS_EOS, UNK, Tokenizer, TokenizerOptions
from pasu.slu import Slot


def test_example_from_the_docs():
    target = encode_target("wake me up at five am", "alarm_set", [Slot("time", "five am")])
    assert target == "alarm_set wake me up at SLOT_time five am SLOT_END"


@pytest.mark.parametrize(
    "text, intent, slots",
    [
        ("turn off the lights", "iot_hue_lightoff", ()),
        ("paris weather", "weather_query", (Slot("place_name", "paris"),)),  # slot at the start
        ("what's the weather in new york", "weather_query", (Slot("place_name", "new york"),)),  # at the end
        (
            "wake me at dawn on monday",
            "alarm_set",
            (Slot("time", "dawn"), Slot("date", "monday")),
        ),
        ("play jazz rock", "play_music", (Slot("music_genre", "jazz"), Slot("music_genre", "rock"))),  # adjacent
        ("that's all", "general_quirky", ()),  # apostrophes stay in words
    ],
)
def test_round_trip(text, intent, slots):
    assert decode_target(encode_target(text, intent, slots)) == SluResult(text, intent, tuple(slots))


def test_repeated_value_follows_annotation_order():
    slots = [Slot("time", "five"), Slot("time", "five thirty")]
    target = encode_target("from five to five thirty", "alarm_set", slots)
    assert target == "alarm_set from SLOT_time five SLOT_END to SLOT_time five thirty SLOT_END"
    assert decode_target(target).slots == tuple(slots)


def test_same_value_twice_marks_both_occurrences():
    slots = [Slot("time", "five"), Slot("time", "five")]
    target = encode_target("five or five", "alarm_set", slots)
    assert target.count("SLOT_time") == 2
    assert decode_target(target).slots == tuple(slots)


def test_out_of_order_slots_are_still_found():
    slots = [Slot("date", "monday"), Slot("time", "dawn")]
    result = decode_target(encode_target("wake me at dawn on monday", "alarm_set", slots))
    assert result.slots == (Slot("time", "dawn"), Slot("date", "monday"))  # in spoken order


def test_value_not_in_text_is_skipped_and_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="pasu.models.targets"):
        target = encode_target("set an alarm", "alarm_set", [Slot("time", "seven am")])
    assert target == "alarm_set set an alarm"
    assert "not found" in caplog.text


def test_unknown_slots_get_the_marker_and_no_markup():
    target = encode_target("remind me to call mum", "calendar_set", None)
    assert target == f"calendar_set {SLOTS_UNKNOWN} remind me to call mum"
    assert decode_target(target) == SluResult("remind me to call mum", "calendar_set", ())


def test_intent_must_be_a_label():
    with pytest.raises(ValueError):
        encode_target("hello", "greeting", ())


@pytest.mark.parametrize(
    "output, expected",
    [
        # unclosed slot: runs to the end
        ("alarm_set wake me at SLOT_time five am",
         SluResult("wake me at five am", "alarm_set", (Slot("time", "five am"),))),
        # missing intent
        ("wake me SLOT_time now SLOT_END", SluResult("wake me now", "", (Slot("time", "now"),))),
        # stray SLOT_END
        ("alarm_set SLOT_END wake me SLOT_END", SluResult("wake me", "alarm_set", ())),
        # a slot opened inside another closes the first
        ("alarm_set SLOT_date monday SLOT_time dawn SLOT_END",
         SluResult("monday dawn", "alarm_set", (Slot("date", "monday"), Slot("time", "dawn")))),
        # empty slot, empty output
        ("alarm_set SLOT_time SLOT_END hi", SluResult("hi", "alarm_set", ())),
        ("", SluResult("", "", ())),
        # intent not first, a second intent: the first wins, neither is a word
        ("wake alarm_set me weather_query", SluResult("wake me", "alarm_set", ())),
        # marker anywhere is ignored
        (f"alarm_set {SLOTS_UNKNOWN} hi {SLOTS_UNKNOWN}", SluResult("hi", "alarm_set", ())),
    ],
)
def test_decode_malformed(output, expected):
    assert decode_target(output) == expected


def test_target_symbols():
    symbols = target_symbols(["b_x", "a_y", "a_y"], ["time", "place name"])
    assert symbols == ["a_y", "b_x", SLOTS_UNKNOWN, SLOT_END, "SLOT_place_name", "SLOT_time"]


# --- Tokenizer --------------------------------------------------------------------------------------

TEXTS = [
    "wake me up at five am", "set an alarm for six thirty", "what's the weather in paris",
    "play some jazz", "turn off the lights", "remind me to call mum tomorrow",
] * 5
SYMBOLS = target_symbols(["alarm_set", "weather_query", "play_music", "calendar_set"], ["time", "place_name"])


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(TEXTS, SYMBOLS, TokenizerOptions(vocab_size=60))


def test_token_list_is_espnet_shaped(tokenizer):
    tl = tokenizer.token_list
    assert tl[0] == BLANK and tl[1] == UNK and tl[-1] == SOS_EOS
    assert len(set(tl)) == len(tl) == tokenizer.vocab_size
    assert set(SYMBOLS) <= set(tl)
    assert tl[tokenizer.token_id(SLOTS_UNKNOWN)] == SLOTS_UNKNOWN and tokenizer.token_id("nope_x") == 1


def test_symbols_are_single_tokens_without_extra_word_boundaries(tokenizer):
    target = "alarm_set wake me up at SLOT_time five am SLOT_END"
    ids = tokenizer.encode(target)
    pieces = [tokenizer.token_list[i] for i in ids]
    assert pieces[0] == "alarm_set" and "SLOT_time" in pieces and pieces[-1] == SLOT_END
    # no lone word-boundary piece in front of a symbol (sentencepiece's own handling of symbols in text)
    assert all(prev != "▁" for prev, p in zip(pieces, pieces[1:]) if p in SYMBOLS)
    assert tokenizer.decode(ids) == target


def test_round_trip_through_ids(tokenizer):
    for text in TEXTS[:6]:
        target = encode_target(text, "calendar_set", None)
        assert tokenizer.decode(tokenizer.encode(target)) == target


def test_unknown_symbol_becomes_unk_and_decode_skips_specials(tokenizer):
    ids = tokenizer.encode("music_likeness play SLOT_artist jazz SLOT_END")
    assert ids[0] == tokenizer.unk_id and tokenizer.unk_id in ids[2:]
    eos = tokenizer.vocab_size - 1
    assert tokenizer.decode([0, *tokenizer.encode("play_music play"), eos, -1]) == "play_music play"


def test_save_and_load(tokenizer, tmp_path):
    loaded = Tokenizer(tokenizer.save(tmp_path / "tok.model"))
    assert loaded.token_list == tokenizer.token_list
    target = "weather_query what's the weather in SLOT_place_name paris SLOT_END"
    assert loaded.encode(target) == tokenizer.encode(target)


def test_new_labels_are_appended_as_single_tokens_and_every_other_id_stays(tokenizer, tmp_path):
    """How a warm start learns intents and slot types its package lacks: the package's ids keep their meaning."""
    extended = tokenizer.with_symbols(["music_likeness", "SLOT_artist", "alarm_set"])  # the last one it has
    old, new = tokenizer.token_list, extended.token_list
    assert new[:-1] == old[:-1] + ["music_likeness", "SLOT_artist"] and new[-1] == SOS_EOS
    target = "music_likeness play SLOT_artist jazz SLOT_END"
    ids = extended.encode(target)
    assert tokenizer.unk_id not in ids and extended.decode(ids) == target
    assert new[ids[0]] == "music_likeness" and "SLOT_artist" in [new[i] for i in ids]  # one token each
    words = "alarm_set wake me up at SLOT_time five am SLOT_END"
    assert extended.encode(words) == tokenizer.encode(words)
    assert "music_likeness" in extended.intents
    assert Tokenizer(extended.save(tmp_path / "tok.model")).token_list == new
    assert tokenizer.with_symbols(["alarm_set"]) is tokenizer


def test_bpe_tokenizer_also_works():
    tok = Tokenizer.train(TEXTS, SYMBOLS, TokenizerOptions(vocab_size=70, model_type="bpe"))
    target = "play_music play some jazz"
    assert tok.decode(tok.encode(target)) == target
