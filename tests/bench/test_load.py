"""`pasu bench load` end to end on a small budget: its own server process, real clients, the printed figures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from pasu.cli import main


def _support():
    name = "pasu_tests_cloud_support"  # the same module object tests/cloud/conftest.py loads
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "cloud" / "support.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_bench_load_prints_and_writes_its_figures(tmp_path, capsys):
    support = _support()
    model = support.write_model_folder(tmp_path / "model")
    audio = tmp_path / "audio"
    audio.mkdir()
    for i, seconds in enumerate((0.5, 0.8, 1.2)):
        sf.write(audio / f"u{i}.wav", support.waveform(seconds, seed=i), 16000)
    sf.write(audio / "stereo-44k.wav", np.stack([support.waveform(0.6)] * 2, axis=1), 44100)  # resampled, downmixed
    # The untrained tiny model rarely ends a hypothesis: cap its output so each decode stays short.
    (tmp_path / "cloud.yaml").write_text("decoding: {beam_size: 2, maxlenratio: -5}\n")
    out = tmp_path / "load.json"

    code = main(["bench", "load", "--model", str(model), "--clients", "4", "--duration", "60", "--max-requests", "40",
                 "--warmup", "10", "--audio", str(audio), "--threads", "1", f"--server-arg=--config={tmp_path / 'cloud.yaml'}",
                 "--out", str(out)])

    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    f = result["figures"]
    assert code == 0 and result["server_survived"] and result["server_exit_code"] == 0
    assert f["sent"] == f["served"] == 40 and f["failed"] == 0 and f["resource_exhausted"] == 0
    assert result["server_counts"] == {"OK": 40}  # the server's own log agrees with the clients
    assert result["audio"]["utterances"] == 4
    lat = f["latency"]
    assert lat["all"]["n"] == 40 and lat["unary"]["n"] + lat["streaming"]["n"] == 40
    assert lat["unary"]["n"] > 0 and lat["streaming"]["n"] > 0  # both kinds of call were made
    assert 0 < lat["all"]["p50_ms"] <= lat["all"]["p90_ms"] <= lat["all"]["p99_ms"]
    assert f["throughput_rps"] > 0 and f["peak_rss_bytes"] > 50 * 2**20  # torch alone is bigger than that
    assert f["rss_growth"]["pct"] is not None and f["rss_growth"]["requests"] <= 30  # measured after 10 warm-up ones
    for figure in ("served (OK)", "RESOURCE_EXHAUSTED", "throughput", "p50 / p90 / p99", "peak RSS", "RSS growth"):
        assert figure in printed
