"""Summary of a built corpus: hours per split, voices, engines, SNR histogram, failures, build time."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pasu.corpus.build import read_manifest  # noqa: E402
from pasu.corpus.plan import SPLITS, Plan  # noqa: E402

SNR_BINS = list(range(0, 30, 5))  # 0-5, 5-10, ..., 25-30 dB


def summarize(out: Path) -> dict:
    """Counts over the manifests and error files of a corpus folder."""
    splits = {}
    snrs: list[float] = []
    for split in SPLITS:
        manifest = out / f"{split}.jsonl"
        rows = read_manifest(manifest) if manifest.exists() else []
        splits[split] = {
            "utterances": len(rows),
            "hours": round(sum(r["duration"] for r in rows) / 3600, 3),
            "voices": len({r["voice"] for r in rows}),
            "engines": dict(Counter(r["engine"] for r in rows)),
            "sentences": len({r["sentence_id"] for r in rows}),
            "noise": dict(Counter(r["augmentation"]["noise"].split(":")[0] for r in rows)),
            "rir": dict(Counter(r["augmentation"]["rir"].split(":")[0] for r in rows)),
        }
        snrs += [r["augmentation"]["snr_db"] for r in rows if r["augmentation"]["noise"] != "none"]
    errors = [json.loads(line) for p in sorted((out / "shards").glob("*.errors.jsonl"))
              for line in p.read_text().splitlines() if line.strip()]
    hist = Counter(min(int(s // 5) * 5, SNR_BINS[-1]) for s in snrs)
    return {
        "splits": splits,
        "snr_histogram_db": {f"{b}-{b + 5}": hist.get(b, 0) for b in SNR_BINS},
        "render_failures": len(errors),
        "render_failures_by_voice": dict(Counter(e["voice"] for e in errors)),
        "failure_examples": errors[:5],
    }


def write_report(out: Path, plan: Plan, build_seconds: float, skipped_voices: Sequence[str] = ()) -> dict:
    """Write report.json, report.md and snr_hist.png into the corpus folder; return the report."""
    report = summarize(out)
    report["preset"] = plan.preset.name
    report["voices"] = {"seen": list(plan.seen_voices), "unseen": list(plan.unseen_voices),
                        "total": len(plan.seen_voices) + len(plan.unseen_voices),
                        "not_installed": list(skipped_voices)}
    report["build_seconds"] = round(build_seconds, 1)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(to_markdown(report))
    _plot_snr(report["snr_histogram_db"], out / "snr_hist.png")
    return report


def to_markdown(report: dict) -> str:
    lines = [f"# Corpus report ({report['preset']})", "",
             f"Build time: {report['build_seconds']:.0f} s. Voices: {report['voices']['total']} "
             f"({len(report['voices']['seen'])} seen, {len(report['voices']['unseen'])} held out for test_unseen).",
             "", "| split | utterances | hours | sentences | voices | engines |", "|---|---|---|---|---|---|"]
    for split, s in report["splits"].items():
        engines = ", ".join(f"{e} {n}" for e, n in sorted(s["engines"].items()))
        lines.append(f"| {split} | {s['utterances']} | {s['hours']:.2f} | {s['sentences']} | {s['voices']} | {engines} |")
    lines += ["", "SNR of noisy utterances (dB): " + ", ".join(
        f"{k}: {v}" for k, v in report["snr_histogram_db"].items()),
        f"Render failures: {report['render_failures']}", "",
        "Held-out voices: " + ", ".join(report["voices"]["unseen"]), ""]
    if report["voices"].get("not_installed"):
        lines += ["Planned voices not installed here (their utterances are skipped; a build where they are "
                  "installed fills them in): " + ", ".join(report["voices"]["not_installed"]), ""]
    return "\n".join(lines)


def _plot_snr(hist: dict[str, int], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(hist), list(hist.values()), color="#4477aa")
    ax.set_xlabel("SNR (dB)")
    ax.set_ylabel("utterances")
    ax.set_title("Additive noise SNR")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
