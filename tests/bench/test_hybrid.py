"""pasu bench hybrid's command line: which upload encoding each network profile uses, and reusing the round
trips an earlier run saved."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pasu.bench.hybrid import (
    learned_label,
    load_offloads,
    measured_offloads,
    offload_key,
    save_offloads,
    saved_offloads,
    upload_encodings,
)
from pasu.bench.hybrid_eval import CloudCall
from pasu.metrics import SluResult
from pasu.slu import Slot

PROFILES = ["wifi", "5g", "poor"]


def test_one_encoding_for_every_profile():
    assert upload_encodings("flac", PROFILES) == {"wifi": "flac", "5g": "flac", "poor": "flac"}


def test_per_profile_encodings_leave_the_rest_uncompressed():
    assert upload_encodings("poor=opus, 5g=flac", PROFILES) == {"wifi": "pcm16", "5g": "flac", "poor": "opus"}


@pytest.mark.parametrize("spec, message", [("mp3", "'mp3' is not one of"), ("lte=opus", "names profile 'lte'"),
                                           ("poor=wav", "'wav' is not one of")])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(SystemExit, match=message):
        upload_encodings(spec, PROFILES)


def saved_run(tmp_path, deadline: float = 3.0) -> tuple[list, list[CloudCall]]:
    """Two utterances' round trips on Wi-Fi, saved as a run with `deadline` leaves them in its --out."""
    samples = [SimpleNamespace(id="u1"), SimpleNamespace(id="u2")]
    calls = [CloudCall(True, 0.71, SluResult("wake me at five", "alarm_set", (Slot("time", "five"),))),
             CloudCall(False, 3.0, None, "deadline")]
    key = offload_key(tmp_path / "cloud", samples, "wifi", "pcm16", deadline, 0)
    save_offloads(tmp_path / "calls-wifi.jsonl", key, {"name": "wifi", "encoding": "pcm16"}, calls)
    return samples, calls


def test_saved_offloads_price_a_second_run_without_a_server(tmp_path):
    samples, saved = saved_run(tmp_path)
    # the cloud model folder does not exist: a server would fail to load it, so nothing is offloaded again
    calls, proxies = measured_offloads(tmp_path / "cloud", [], samples, {"wifi": "pcm16"}, 3.0, 0, tmp_path, reuse=True)
    assert calls["wifi"] == saved
    assert proxies["wifi"]["reused"] == str(tmp_path / "calls-wifi.jsonl")


def test_offloads_saved_under_other_settings_are_not_reused(tmp_path):
    samples, _ = saved_run(tmp_path, deadline=3.0)
    path = tmp_path / "calls-wifi.jsonl"
    assert load_offloads(path, offload_key(tmp_path / "cloud", samples, "wifi", "pcm16", 2.0, 0)) is None
    assert load_offloads(path, offload_key(tmp_path / "cloud", samples[:1], "wifi", "pcm16", 3.0, 0)) is None
    assert load_offloads(path, offload_key(tmp_path / "other", samples, "wifi", "pcm16", 3.0, 0)) is None
    assert load_offloads(tmp_path / "calls-5g.jsonl", {}) is None


def test_a_runs_saved_round_trips_read_back_whatever_its_settings(tmp_path):
    samples, saved = saved_run(tmp_path, deadline=2.0)
    assert saved_offloads(tmp_path / "calls-wifi.jsonl") == ([s.id for s in samples], saved)


def test_the_bench_names_what_the_bilstm_learned():
    assert learned_label({"bad_wer": 0.1, "label": "bad"}) == "local WER > 0.1"
    assert learned_label({"bad_wer": 0.3}) == "local WER > 0.3"  # reports from before the label was an option
    assert learned_label({"bad_wer": 0.1, "label": "wer"}) == "the local WER (soft labels)"
