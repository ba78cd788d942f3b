"""What the agent did for one utterance and when: JSON out, and a picture of it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Lanes of the picture, bottom to top, and the colour of each kind of event.
LANES = ("ingest", "pilot", "offramp", "encode", "decode", "cloud")
COLOURS = {"ingest": "#9ecae1", "pilot": "#fdae6b", "pilot_abandoned": "#d9d9d9", "offramp": "#c994c7",
           "encode": "#74c476", "decode": "#238b45", "cloud": "#6baed6"}


@dataclass(frozen=True)
class Event:
    kind: str  # ingest | pilot | pilot_abandoned | offramp | encode | decode | cloud
    start: float  # seconds since the utterance's first sample was due
    end: float
    info: dict[str, Any] = field(default_factory=dict)  # e.g. a pilot's hypothesis and audio seconds

    @property
    def lane(self) -> str:
        return "pilot" if self.kind.startswith("pilot") else self.kind


@dataclass
class Timeline:
    events: list[Event] = field(default_factory=list)
    end_of_speech: float | None = None  # when the last sample arrived
    result_at: float | None = None  # when the result was ready

    def add(self, kind: str, start: float, end: float, **info: Any) -> Event:
        event = Event(kind, start, end, info)
        self.events.append(event)
        return event

    def busy(self, kind: str, after: float = float("-inf")) -> float:
        """Seconds spent in events of `kind` (from `after` on)."""
        return sum(e.end - max(e.start, after) for e in self.events if e.kind == kind and e.end > after)

    def to_dict(self) -> dict[str, Any]:
        return {"end_of_speech": self.end_of_speech, "result_at": self.result_at,
                "events": [asdict(e) for e in self.events]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Timeline:
        return cls([Event(**e) for e in raw["events"]], raw.get("end_of_speech"), raw.get("result_at"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        return cls.from_dict(json.loads(Path(path).read_text()))


def plot_timeline(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """A Gantt chart: one lane per kind of work, end of speech and result marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    for event in timeline.events:
        y = LANES.index(event.lane) if event.lane in LANES else len(LANES)
        width = max(event.end - event.start, 0.002)  # keep very short work visible
        ax.barh(y, width, left=event.start, height=0.6, color=COLOURS.get(event.kind, "#969696"),
                edgecolor="black", linewidth=0.3)
        if event.kind == "pilot" and event.info.get("text"):
            ax.text(event.start, y + 0.38, event.info["text"][:40], fontsize=6)
    if timeline.end_of_speech is not None:
        ax.axvline(timeline.end_of_speech, color="red", linestyle="--", linewidth=1, label="end of speech")
    if timeline.result_at is not None:
        ax.axvline(timeline.result_at, color="black", linewidth=1, label="result")
        if timeline.end_of_speech is not None:
            ms = 1000 * (timeline.result_at - timeline.end_of_speech)
            ax.set_title(f"{title}  (latency after end of speech: {ms:.0f} ms)".strip())
    ax.set_yticks(range(len(LANES)), LANES)
    ax.set_xlabel("seconds since the first sample")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
