"""The build plan: deterministic, voices held out per engine, splits and sizes as the preset says."""

from collections import Counter
from dataclasses import replace

import pytest

from pasu.corpus.plan import PRESETS, make_plan, split_voices
from pasu.corpus.text import load_corpus_text, samples_dir

VOICES = ([f"espeak:en-us+m{i}" for i in range(1, 21)] + [f"mbrola:v{i}" for i in range(6)]
          + ["festival:kal", "festival:rab", "festival:slt", "flite:awb", "flite:rms", "pico:en-US"])


@pytest.fixture(scope="module")
def text():
    return load_corpus_text(samples_dir())


def test_same_seed_same_plan_other_seed_other_plan(text):
    a = make_plan(text, VOICES, PRESETS["tiny"], seed=3)
    b = make_plan(text, VOICES, PRESETS["tiny"], seed=3)
    c = make_plan(text, VOICES, PRESETS["tiny"], seed=4)
    assert a == b
    assert [j.voice_id for j in a.jobs] != [j.voice_id for j in c.jobs]


def test_unseen_voices_never_appear_outside_test_unseen(text):
    plan = make_plan(text, VOICES, PRESETS["tiny"], seed=0)
    for job in plan.jobs:
        assert (job.voice_id in plan.unseen_voices) == (job.split == "test_unseen")
    assert set(plan.seen_voices).isdisjoint(plan.unseen_voices)
    assert sorted(plan.seen_voices + plan.unseen_voices) == sorted(VOICES)


def test_voices_are_held_out_per_engine_and_small_engines_stay_in_training():
    seen, unseen = split_voices(VOICES, PRESETS["full"], seed=0)
    held = Counter(v.split(":")[0] for v in unseen)
    assert held["espeak"] == 3  # 15% of 20
    assert held["mbrola"] == 1 and held["festival"] == 1
    assert held["flite"] == 0 and held["pico"] == 0  # fewer than 3 voices: all kept for training
    assert {v.split(":")[0] for v in seen} == {"espeak", "mbrola", "festival", "flite", "pico"}


def test_sizes_follow_the_preset_and_test_splits_share_sentences(text):
    preset = replace(PRESETS["tiny"], train_utterances=123, dev_sentences=5, test_sentences=7)
    plan = make_plan(text, VOICES, preset, seed=0)
    assert len(plan.jobs_in("train")) == 123
    assert len(plan.jobs_in("dev")) == 5
    test, unseen = plan.jobs_in("test"), plan.jobs_in("test_unseen")
    assert [j.sentence for j in test] == [j.sentence for j in unseen]
    assert len({j.utt_id for j in plan.jobs}) == len(plan.jobs)


def test_training_renders_cycle_every_sentence_before_repeating(text):
    preset = replace(PRESETS["tiny"], train_utterances=len(text.train) * 2)
    counts = Counter(j.sentence.id for j in make_plan(text, VOICES, preset, seed=0).jobs_in("train"))
    assert set(counts.values()) == {2}


def test_engines_are_weighted_not_dominated_by_espeak_variants(text):
    preset = replace(PRESETS["tiny"], train_utterances=2000)
    engines = Counter(j.voice_id.split(":")[0] for j in make_plan(text, VOICES, preset, seed=0).jobs_in("train"))
    share = {e: n / 2000 for e, n in engines.items()}
    for engine, weight in preset.engine_weights.items():
        assert abs(share[engine] - weight) < 0.05, (engine, share)


def test_prosody_is_in_range(text):
    preset = PRESETS["tiny"]
    for job in make_plan(text, VOICES, preset, seed=0).jobs:
        assert preset.rate_range[0] <= job.rate <= preset.rate_range[1]
        assert preset.pitch_range[0] <= job.pitch <= preset.pitch_range[1]


def test_evaluation_splits_do_not_depend_on_the_training_size(text):
    small = make_plan(text, VOICES, replace(PRESETS["tiny"], train_utterances=50), seed=0)
    large = make_plan(text, VOICES, replace(PRESETS["tiny"], train_utterances=500), seed=0)
    for split in ("dev", "test", "test_unseen"):
        assert small.jobs_in(split) == large.jobs_in(split)


def test_a_training_variant_renders_training_afresh_and_keeps_held_out_voices_and_evaluation(text):
    first = make_plan(text, VOICES, PRESETS["tiny"], seed=0)
    variant = make_plan(text, VOICES, PRESETS["tiny"], seed=0, train_variant=1)
    assert variant.unseen_voices == first.unseen_voices
    for split in ("dev", "test", "test_unseen"):
        assert variant.jobs_in(split) == first.jobs_in(split)
    old, new = first.jobs_in("train"), variant.jobs_in("train")
    assert len(new) == len(old)
    counts_old, counts_new = Counter(j.sentence.id for j in old), Counter(j.sentence.id for j in new)
    assert set(counts_new) == set(counts_old)  # the same sentences, each about as often (whole passes, then part)
    assert all(abs(counts_new[s] - counts_old[s]) <= 1 for s in counts_old)
    assert [(j.sentence, j.voice_id, j.seed) for j in new] != [(j.sentence, j.voice_id, j.seed) for j in old]
    assert {j.utt_id for j in new}.isdisjoint(j.utt_id for j in old)  # both can be trained on together
    assert all(j.voice_id in variant.seen_voices for j in new)
