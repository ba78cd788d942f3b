"""Offramp data: what the early and late decisions judge, the local answer and timing, and the replay cache."""

from __future__ import annotations

import numpy as np
import soundfile as sf
import torch
from pasu.device.agent import AgentOptions, PilotOptions, replay
from pasu.device.offramp_data import (
    cache_key,
    collect,
    encodings_path,
    load_or_collect,
    load_samples,
    save_samples,
)
from pasu.models.data import Utterance

SCHEDULED = AgentOptions(pilot=PilotOptions(at_pause=False))  # the paper's pilots: none in the endpointer's wait

def utterances(tmp_path, speech_like) -> list[Utterance]:
    """A long utterance with one pilot (at 1.5 s, with 0.7 s of audio left to finish in: its count cannot hang on
    how loaded the machine is; a pilot due 0.1 s before the end did, in a full run) and a short one with none."""
    rows = []
    for i, seconds in enumerate((2.2, 1.0)):
        path = tmp_path / f"u{i}.flac"
        sf.write(path, speech_like(seconds, seed=20 + i), 16000, subtype="PCM_16")
        rows.append(Utterance(f"u{i}", path, seconds, "", "set an alarm for seven", "alarm_set", ()))
    return rows


def test_samples_hold_the_pilot_for_the_early_decision_and_the_full_decode_for_the_late_one(tiny_model, speech_like,
                                                                                              tmp_path):
    search = tiny_model.search
    long, short = collect(tiny_model, utterances(tmp_path, speech_like), SCHEDULED)
    assert tiny_model.search is search  # the recorder is removed again
    assert long.pilots >= 1 and long.early is not None and long.final is not None
    assert long.early.ended is False or len(long.early.token_att) == len(long.early.tokens) + 1
    assert long.decision_at < long.local_latency  # decided at end of speech, before the full decode
    assert short.pilots == 0 and short.early == short.final  # no pilot: the agent judges the full decode
    # the early hypothesis keeps the frames its search read (the CNN offramp's input): the last pilot's, a prefix
    assert long.early.encoded.dtype == np.float16 and long.final.encoded is None
    stream = tiny_model.open_stream()
    stream.accept(sf.read(tmp_path / "u0.flac", dtype="float32")[0])
    with torch.no_grad():
        assert 0 < len(long.early.encoded) < stream.encode().size(0)
    assert long.early.hypothesis().encoded.dtype == torch.float32
    assert short.decision_at <= short.local_latency + 1e-3
    audio = sf.read(tmp_path / "u0.flac", dtype="float32")[0]
    assert long.local.text == replay(tiny_model, audio, AgentOptions()).text
    assert long.ref_words == 5 and long.local_edits >= 0 and long.bad() == (long.local_wer > 0.1)
    # the end-of-speech pilot: the CTC's best path over the whole input, decided on after the encode
    with torch.no_grad():
        whole = tiny_model.search.ctc_greedy(stream.encode())
    assert long.end.tokens == whole.tokens and long.judged("end") == long.end
    assert long.decision_at < long.end_decision_at < long.local_latency


def test_replays_from_before_the_end_of_speech_pilots_still_load(tiny_model, speech_like, tmp_path):
    import json

    samples = collect(tiny_model, utterances(tmp_path, speech_like)[1:])
    save_samples(tmp_path / "old.jsonl", samples, {})
    header, *rows = (tmp_path / "old.jsonl").read_text().splitlines()
    rows = [json.dumps({k: v for k, v in json.loads(r).items() if k not in ("end", "end_decision_at")}) for r in rows]
    (tmp_path / "old.jsonl").write_text("\n".join([header, *rows]) + "\n")
    old = load_samples(tmp_path / "old.jsonl")
    assert old[0].end is None and old[0].end_decision_at is None and old[0].final == samples[0].final
    key = cache_key(tiny_model.model_id, tmp_path / "dev.jsonl", ["u1"], AgentOptions())
    assert key["end_pilot"]  # what a cache made before them lacks: it is made again


def test_the_cache_round_trips_and_is_ignored_for_another_key(tiny_model, speech_like, tmp_path):
    utts = utterances(tmp_path, speech_like)[1:]
    key = cache_key(tiny_model.model_id, tmp_path / "dev.jsonl", [u.id for u in utts], AgentOptions())
    samples = collect(tiny_model, utts)
    save_samples(tmp_path / "cache.jsonl", samples, key)
    loaded = load_samples(tmp_path / "cache.jsonl", key)
    assert loaded == samples
    np.testing.assert_array_equal(loaded[0].early.encoded, samples[0].early.encoded)  # kept beside the JSONL
    assert load_samples(tmp_path / "cache.jsonl", {**key, "ids": ["other"]}) is None
    calls = []
    again = load_or_collect(tmp_path / "cache.jsonl", key, lambda: calls.append(1) or [])
    assert again == samples and not calls
    encodings_path(tmp_path / "cache.jsonl").unlink()  # the key says it keeps encoder outputs: made again
    assert load_samples(tmp_path / "cache.jsonl", key) is None


def test_replays_spread_over_processes_answer_as_one_process_does(tiny_model, speech_like, tmp_path):
    utts = utterances(tmp_path, speech_like)
    alone = collect(tiny_model, utts)
    seen = []
    spread = collect(tiny_model, utts, progress=lambda done, total: seen.append((done, total)), jobs=2)
    assert [s.id for s in spread] == ["u0", "u1"]  # in the utterances' order, whichever finished first
    for a, b in zip(alone, spread):  # the same answers and evidence; only the measured times differ
        assert (b.local, b.pilots, b.early.tokens, b.final.tokens) == (a.local, a.pilots, a.early.tokens,
                                                                       a.final.tokens)
        np.testing.assert_allclose(b.early.token_att, a.early.token_att, atol=1e-4)
    assert seen == [(1, 2), (2, 2)]


def test_the_pause_pilot_keys_its_own_replays_and_leaves_older_caches_valid(tiny_model, speech_like, tmp_path):
    from dataclasses import asdict

    plain = cache_key(tiny_model.model_id, tmp_path / "dev.jsonl", ["u0"], SCHEDULED)
    assert "at_pause" not in plain["options"]["pilot"]  # as a cache written before the pause pilot holds it
    assert plain["options"]["pilot"].keys() | {"at_pause", "pause_seconds"} == asdict(AgentOptions().pilot).keys()
    paused = AgentOptions()  # the agent as shipped
    assert cache_key(tiny_model.model_id, tmp_path / "dev.jsonl", ["u0"], paused) != plain
    long, short = collect(tiny_model, utterances(tmp_path, speech_like), paused)
    stream = tiny_model.open_stream()
    stream.accept(sf.read(tmp_path / "u0.flac", dtype="float32")[0])
    with torch.no_grad():
        whole = stream.encode().size(0)
    assert long.pilots == 2 and len(long.early.encoded) == whole  # the early decision judges the whole input's pilot
    assert long.decision_at < long.local_latency
    # a command shorter than T_s has no scheduled pilot, but the pause pilot runs on it: judged before the decode
    assert short.pilots == 1 and short.early != short.final and short.decision_at < short.local_latency
