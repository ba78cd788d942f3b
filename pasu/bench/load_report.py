"""The figures of `pasu bench load` from what its clients and RSS sampler recorded, and their printed table."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pasu.metrics import LatencyStats


@dataclass
class Tally:
    """What the clients saw, updated on the client loop."""

    sent: int = 0
    codes: Counter[str] = field(default_factory=Counter)  # (status code name) -> count
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"unary": [], "streaming": []})  # OK only
    audio_s: float = 0.0  # audio seconds in OK answers

    @property
    def answered(self) -> int:
        return sum(self.codes.values())


@dataclass(frozen=True)
class RssSample:
    t_s: float  # since the load began
    answered: int  # requests answered by then (any status)
    rss_bytes: int


def rss_growth(samples: list[RssSample], warmup: int, window: int) -> dict[str, Any]:
    """RSS change over `window` answered requests after the first `warmup` (or over what was answered).

    The ends are the medians of the first and the last tenth of the span's samples, not single samples: RSS at
    one instant depends on which utterances happen to be in the running batch (an 11 s one pads them all).
    """
    start = next((i for i, s in enumerate(samples) if s.answered >= warmup), None)
    if start is None:
        return {"pct": None, "requests": 0, "full_window": False,
                "note": f"fewer than {warmup} warm-up requests were answered"}
    goal = samples[start].answered + window
    stop = next((i for i, s in enumerate(samples) if s.answered >= goal), len(samples) - 1)
    span = samples[start : stop + 1]
    k = max(1, len(span) // 10)
    first = float(np.median([s.rss_bytes for s in span[:k]]))
    last = float(np.median([s.rss_bytes for s in span[-k:]]))
    requests = span[-1].answered - span[0].answered
    return {"pct": 100.0 * (last - first) / first, "requests": requests, "full_window": requests >= window,
            "from_bytes": first, "to_bytes": last}


def figures(tally: Tally, samples: list[RssSample], elapsed_s: float, warmup: int, window: int) -> dict[str, Any]:
    ok = tally.codes["OK"]
    failed = {code: n for code, n in sorted(tally.codes.items()) if code not in ("OK", "RESOURCE_EXHAUSTED")}
    latency = {}
    for kind, values in [("all", tally.latencies["unary"] + tally.latencies["streaming"]), *tally.latencies.items()]:
        if values:
            stats = LatencyStats.from_seconds(values)
            latency[kind] = {"n": stats.n, "p50_ms": 1000 * stats.p50, "p90_ms": 1000 * stats.p90,
                             "p99_ms": 1000 * stats.p99, "max_ms": 1000 * stats.max}
    return {
        "sent": tally.sent,
        "served": ok,
        "failed": sum(failed.values()),
        "failed_by_code": failed,
        "resource_exhausted": tally.codes["RESOURCE_EXHAUSTED"],
        "elapsed_s": elapsed_s,
        "throughput_rps": ok / elapsed_s if elapsed_s > 0 else 0.0,
        "audio_s_per_s": tally.audio_s / elapsed_s if elapsed_s > 0 else 0.0,
        "latency": latency,
        "peak_rss_bytes": max((s.rss_bytes for s in samples), default=0),
        "rss_growth": rss_growth(samples, warmup, window),
    }


def format_table(result: dict[str, Any]) -> str:
    f, o = result["figures"], result["options"]
    lat = f["latency"]

    def pct(kind: str) -> str:
        if kind not in lat:
            return "-"
        x = lat[kind]
        return f"{x['p50_ms']:.0f} / {x['p90_ms']:.0f} / {x['p99_ms']:.0f} ms (n={x['n']})"

    growth = f["rss_growth"]
    if growth["pct"] is None:
        growth_text = growth["note"]
    else:
        span = "" if growth["full_window"] else f" (run ended before {o['rss_window']:,})"
        growth_text = f"{growth['pct']:+.2f}% over {growth['requests']:,} requests{span}; target < 5%"
    by_code = ", ".join(f"{code} {n}" for code, n in f["failed_by_code"].items()) or "none"
    rows = [
        ("clients / duration",
         f"{o['clients']} clients, {f['elapsed_s']:.1f} s, {100 * o['streaming_share']:.0f}% streaming"),
        ("model", result["model_id"]),
        ("requests sent", f"{f['sent']:,}"),
        ("served (OK)", f"{f['served']:,}"),
        ("failed", f"{f['failed']:,} (by code: {by_code})"),
        ("RESOURCE_EXHAUSTED (backpressure)", f"{f['resource_exhausted']:,}"),
        ("throughput", f"{f['throughput_rps']:.2f} req/s ({f['audio_s_per_s']:.1f} s of audio per s)"),
        ("latency p50 / p90 / p99, all", pct("all")),
        ("  unary", pct("unary")),
        ("  streaming", pct("streaming")),
        ("server peak RSS", f"{f['peak_rss_bytes'] / 2**20:.0f} MiB"),
        ("server RSS growth", growth_text),
        ("server", f"survived, exit code {result['server_exit_code']}" if result["server_survived"]
         else f"DIED (exit code {result['server_exit_code']})"),
        ("machine", f"{os.cpu_count()} CPU cores"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
