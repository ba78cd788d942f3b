"""The figures of `pasu bench load` from recorded samples."""

from __future__ import annotations

from collections import Counter

from pasu.bench.load_report import RssSample, Tally, figures, format_table, rss_growth


def test_rss_growth_over_a_window_or_what_was_served():
    samples = [RssSample(t, answered, rss) for t, answered, rss in
               [(0, 0, 100), (1, 10, 200), (2, 60, 202), (3, 120, 210), (4, 130, 230)]]
    full = rss_growth(samples, warmup=10, window=100)
    assert full["full_window"] and full["requests"] == 110 and full["pct"] == 5.0  # 200 -> 210
    partial = rss_growth(samples, warmup=10, window=1000)
    assert not partial["full_window"] and partial["requests"] == 120 and partial["pct"] == 15.0  # to the last
    assert rss_growth(samples, warmup=500, window=100)["pct"] is None


def test_rss_growth_ends_are_medians_not_single_spikes():
    # 40 samples, flat at 1000 with one transient spike at the very end (a batch of long utterances).
    samples = [RssSample(i, 10 * i, 1000) for i in range(40)] + [RssSample(40, 400, 1500)]
    assert rss_growth(samples, warmup=0, window=400)["pct"] == 0.0
    leaking = [RssSample(i, 10 * i, 1000 + 10 * i) for i in range(41)]  # a steady climb is still seen
    assert rss_growth(leaking, warmup=0, window=400)["pct"] > 30


def test_failures_are_counted_by_code_with_backpressure_apart():
    tally = Tally(sent=10, codes=Counter(OK=6, RESOURCE_EXHAUSTED=2, DEADLINE_EXCEEDED=1, UNAVAILABLE=1),
                  latencies={"unary": [0.1, 0.2, 0.3], "streaming": [0.4, 0.5, 0.6]}, audio_s=12.0)
    samples = [RssSample(0, 0, 100 * 2**20), RssSample(1, 10, 110 * 2**20)]
    f = figures(tally, samples, elapsed_s=2.0, warmup=0, window=5000)
    assert f["served"] == 6 and f["resource_exhausted"] == 2
    assert f["failed"] == 2 and f["failed_by_code"] == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 1}
    assert f["throughput_rps"] == 3.0 and f["audio_s_per_s"] == 6.0 and f["peak_rss_bytes"] == 110 * 2**20
    assert f["latency"]["all"]["n"] == 6 and f["latency"]["unary"]["p50_ms"] == 200.0
    result = {"figures": f, "options": {"clients": 2, "streaming_share": 0.5, "rss_window": 5000},
              "model_id": "m", "server_survived": False, "server_exit_code": -9}
    table = format_table(result)
    assert "2 (by code: DEADLINE_EXCEEDED 1, UNAVAILABLE 1)" in table and "DIED (exit code -9)" in table
