"""Choosing k: how much weight each block of a trained Branchformer gives its attention branch.

Wang & Lin (Sec. 4, "Model training details") size the late-context encoder from a Branchformer of the same
depth N trained with learned branch weights (ESPnet `merge_method: learned_ave`): "assume there are k
transformer blocks with weights exceeding a threshold h ... we design the encoder with N-k-1 CNN layers
followed by k+1 transformer layers" (their 9 blocks: k = 2 -> 6 convolution + 3 attention blocks). The
blocks that keep attention are rearranged to the end, so k is a count, not a position.

How learned_ave weighs the branches (espnet2/asr/encoder/branchformer_encoder.py): each branch output is
attention-pooled over time (pooling_proj1/2), projected to one logit (weight_proj1/2), and the two logits
are softmaxed per utterance into (w_attn, w_cgmlp). Forward hooks on weight_proj1/2 read those logits while
the unmodified model encodes each utterance; the softmax here is the one ESPnet applies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoderLayer
from espnet2.asr.espnet_model import ESPnetASRModel

PLOT_FILE = "branch_weights.png"
TABLE_FILE = "branch_weights.md"
JSON_FILE = "branch_weights.json"
CARD_HEADING = "## Branch weights and the late-context split (k)"


@dataclass(frozen=True)
class SplitRule:
    """How k follows from the per-block mean attention weights."""

    # h: a block counts as needing attention when its mean w_attn exceeds this. The paper gives no value;
    # 0.5 means "the attention branch carries more than the cgMLP branch".
    threshold: float = 0.5
    # False: the paper's rule, k = every block above h. True: only the run of blocks above h that ends at
    # the last block (stricter when a low block also leans on attention).
    tail_only: bool = False


@dataclass(frozen=True)
class Split:
    """The suggested late-context layout, named as in models/configs/device_late_context.yaml."""

    num_blocks: int  # N, the Branchformer's depth
    above: tuple[int, ...]  # blocks (0-based, encoder.encoders.<i>) with mean w_attn above the threshold
    counted: tuple[int, ...]  # the blocks the rule counts: all of `above`, or its tail run

    @property
    def k(self) -> int:
        return len(self.counted)

    @property
    def num_attn_blocks(self) -> int:
        """k+1, at most N (k = N would leave -1 convolution blocks)."""
        return min(self.k + 1, self.num_blocks)

    @property
    def num_conv_blocks(self) -> int:
        """N-k-1 (or 0 when every block is above the threshold)."""
        return self.num_blocks - self.num_attn_blocks

    def describe(self) -> str:
        return f"{self.num_conv_blocks} conv-only + {self.num_attn_blocks} attention blocks"


@dataclass(frozen=True, eq=False)
class BranchAnalysis:
    """Per-utterance, per-block attention-branch weights of one model, and the split they suggest."""

    ids: tuple[str, ...]  # utterance ids, the rows of `weights`
    weights: np.ndarray = field(repr=False)  # (utterances, blocks) w_attn; the cgMLP branch gets 1 - w_attn
    rule: SplitRule = SplitRule()
    source: str = ""  # what was measured (model, corpus split), for the report

    @property
    def mean(self) -> np.ndarray:
        return self.weights.mean(axis=0)

    @property
    def std(self) -> np.ndarray:
        """Spread over utterances (population standard deviation)."""
        return self.weights.std(axis=0)

    @property
    def split(self) -> Split:
        return suggest_split(self.mean, self.rule)


# --- Measuring ------------------------------------------------------------------------------------------


def learned_ave_blocks(model: ESPnetASRModel) -> list[BranchformerEncoderLayer]:
    """The encoder's Branchformer blocks, in order; all must merge their two branches with learned_ave."""
    blocks = [m for m in getattr(model.encoder, "encoders", ()) if isinstance(m, BranchformerEncoderLayer)]
    if not blocks:
        raise ValueError(f"{type(model.encoder).__name__} has no Branchformer blocks (encoder.encoders)")
    for i, block in enumerate(blocks):
        if block.merge_method != "learned_ave" or not block.use_two_branches:
            raise ValueError(f"block {i} merges with {block.merge_method!r} (two branches: "
                             f"{block.use_two_branches}); only learned_ave learns branch weights")
    return blocks


@contextmanager
def merge_logit_hooks(blocks: Sequence[BranchformerEncoderLayer]) -> Iterator[list[list[torch.Tensor | None]]]:
    """While active, logits[i] = [weight_proj1, weight_proj2] outputs (batch, 1) of block i's last forward."""
    logits: list[list[torch.Tensor | None]] = [[None, None] for _ in blocks]
    handles = [proj.register_forward_hook(partial(_store_output, logits[i], branch))
               for i, block in enumerate(blocks)
               for branch, proj in enumerate((block.weight_proj1, block.weight_proj2))]
    try:
        yield logits
    finally:  # also on errors: a model left with hooks would keep filling lists nobody reads
        for handle in handles:
            handle.remove()


def _store_output(slot: list[torch.Tensor | None], branch: int, _module: Any, _inputs: Any, output: Any) -> None:
    slot[branch] = output.detach()


def branch_weights(model: ESPnetASRModel, waveforms: Iterable[np.ndarray | torch.Tensor]) -> np.ndarray:
    """(utterances, blocks, 2): each block's learned_ave weights (w_attn, w_cgmlp) for each 16 kHz waveform.

    One utterance per forward: in a padded batch the cgMLP convolution would mix padding into the frames
    that the pooling weighs, and the weights would depend on the batch.
    """
    blocks = learned_ave_blocks(model)
    was_training = model.training
    model.eval()  # dropout off, and learned_ave never drops the attention branch in eval mode
    rows = []
    try:
        with merge_logit_hooks(blocks) as logits, torch.inference_mode():
            for wave in waveforms:
                for slot in logits:
                    slot[:] = [None, None]
                speech = torch.as_tensor(wave, dtype=torch.float32).reshape(1, -1)
                model.encode(speech, torch.tensor([speech.size(1)]))
                rows.append(_merge_weights(logits))
    finally:
        model.train(was_training)
    if not rows:
        raise ValueError("no waveforms to analyse")
    return np.stack(rows)


def _merge_weights(logits: Sequence[Sequence[torch.Tensor | None]]) -> np.ndarray:
    """(blocks, 2) softmax over the two branch logits, as BranchformerEncoderLayer.forward computes it."""
    missing = [i for i, (a, b) in enumerate(logits) if a is None or b is None]
    if missing:
        raise RuntimeError(f"blocks {missing} computed no merge weights in this forward")
    stacked = torch.stack([torch.cat([a, b], dim=-1)[0] for a, b in logits])  # (blocks, 2)
    return torch.softmax(stacked.double(), dim=-1).numpy()


# --- Choosing k ---------------------------------------------------------------------------------------


def suggest_split(mean_attention: Sequence[float], rule: SplitRule = SplitRule()) -> Split:
    """k by the paper's rule (blocks with mean w_attn > rule.threshold), or the tail run when tail_only."""
    n = len(mean_attention)
    above = tuple(i for i, w in enumerate(mean_attention) if w > rule.threshold)
    counted = above
    if rule.tail_only:
        start = n
        while start > 0 and start - 1 in above:
            start -= 1
        counted = tuple(range(start, n))
    return Split(num_blocks=n, above=above, counted=counted)


def analyze(
    model: ESPnetASRModel,
    waveforms: Iterable[np.ndarray | torch.Tensor],
    ids: Sequence[str] | None = None,
    rule: SplitRule = SplitRule(),
    source: str = "",
) -> BranchAnalysis:
    """Attention-branch weights of every block on every waveform; ids default to "0", "1", ..."""
    weights = branch_weights(model, waveforms)[:, :, 0]
    ids = tuple(ids) if ids is not None else tuple(str(i) for i in range(len(weights)))
    if len(ids) != len(weights):
        raise ValueError(f"{len(ids)} ids for {len(weights)} waveforms")
    return BranchAnalysis(ids=ids, weights=weights, rule=rule, source=source)


def analyze_corpus(
    model: ESPnetASRModel,
    corpus_dir: str | Path,
    split: str = "dev",
    utterances: int = 200,
    rule: SplitRule = SplitRule(),
    source: str = "",
) -> BranchAnalysis:
    """`analyze` on a fixed random subset of a corpus split (the one `pasu eval --limit` picks; 0: all)."""
    from tqdm import tqdm

    from pasu.models.data import dev_subset, load_split, read_audio

    chosen = dev_subset(load_split(corpus_dir, split), utterances)
    waves = (read_audio(u.audio) for u in tqdm(chosen, desc=split, unit="utt", dynamic_ncols=True))
    where = f"{len(chosen)} `{split}` utterances of `{corpus_dir}`"
    return analyze(model, waves, [u.id for u in chosen], rule, f"{source}, {where}" if source else where)


def load_model(path: str | Path, espnet_config: str | Path | None = None,
               stats_file: str | Path | None = None) -> ESPnetASRModel:
    """A PASU model folder (pasu package), or an ESPnet *.pth with its config.yaml (default: beside it)."""
    from pasu.models.package import load_espnet_checkpoint, load_packaged

    path = Path(path)
    if path.is_dir():
        return load_packaged(path)[0]
    return load_espnet_checkpoint(espnet_config or path.with_name("config.yaml"), path, stats_file)


# --- Reporting ----------------------------------------------------------------------------------------


def markdown_table(analysis: BranchAnalysis) -> list[str]:
    """Rows: block, mean w_attn, std, min, max, whether the mean is above the threshold."""
    h = analysis.rule.threshold
    lines = [f"| block | mean attention weight | std | min | max | > h = {h:g} |", "|---:|---:|---:|---:|---:|:---:|"]
    w = analysis.weights
    for i, (mean, std) in enumerate(zip(analysis.mean, analysis.std)):
        lines.append(f"| {i} | {mean:.3f} | {std:.3f} | {w[:, i].min():.3f} | {w[:, i].max():.3f} | "
                     f"{'yes' if mean > h else ''} |")
    return lines


def card_section(analysis: BranchAnalysis, plot: str = PLOT_FILE) -> str:
    """The model-card section: rule, table, suggested split, plot (linked relative to the card)."""
    split, rule = analysis.split, analysis.rule
    counting = ("the length of the run of blocks above h that ends at the last block" if rule.tail_only
                else "the number of blocks above h")
    above = ", ".join(map(str, split.above)) or "none"
    counted_note = f" (counted: {', '.join(map(str, split.counted)) or 'none'})" if rule.tail_only else ""
    lines = [
        CARD_HEADING,
        "",
        "Weight of the attention branch in each block's learned_ave merge (w_attn; the cgMLP branch gets "
        f"1 - w_attn), per utterance, then mean and spread over {len(analysis.ids)} utterances"
        f"{f' ({analysis.source})' if analysis.source else ''}. Blocks are numbered from the input "
        "(`encoder.encoders.<i>`).",
        "",
        f"Rule (Wang & Lin, Sec. 4): k = {counting}, h = {rule.threshold:g}; the late-context encoder gets "
        "N-k-1 convolution-only blocks followed by k+1 attention blocks.",
        "",
        *markdown_table(analysis),
        "",
        f"Blocks above h: {above}{counted_note}; k = {split.k} -> **{split.describe()}** "
        f"(`num_conv_blocks: {split.num_conv_blocks}`, `num_attn_blocks: {split.num_attn_blocks}` in "
        "`models/configs/device_late_context.yaml`).",
        "",
        f"![attention-branch weight per block]({plot})",
        "",
    ]
    return "\n".join(lines)


def plot_weights(analysis: BranchAnalysis, path: str | Path) -> Path:
    """Bar per block (mean w_attn, std as error bar), the threshold, the counted blocks highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split, h = analysis.split, analysis.rule.threshold
    blocks = np.arange(len(analysis.mean))
    colors = ["tab:orange" if i in split.counted else "tab:gray" for i in blocks]
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(blocks) + 2), 3.6))
    ax.bar(blocks, analysis.mean, yerr=analysis.std, color=colors, capsize=3)
    ax.axhline(h, color="k", linestyle="--", linewidth=1, label=f"h = {h:g}")
    ax.set_xticks(blocks)
    ax.set_ylim(0, 1)
    ax.set_xlabel("Branchformer block (from the input)")
    ax.set_ylabel("attention-branch weight")
    ax.set_title(f"k = {split.k}: {split.describe()} ({len(analysis.ids)} utt.)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def to_json(analysis: BranchAnalysis) -> dict[str, Any]:
    """Everything needed to redraw or re-threshold the analysis, per-utterance weights included."""
    split = analysis.split
    return {
        "source": analysis.source,
        "rule": {"threshold": analysis.rule.threshold, "tail_only": analysis.rule.tail_only},
        "split": {"num_blocks": split.num_blocks, "k": split.k, "blocks_above_threshold": list(split.above),
                  "blocks_counted": list(split.counted), "num_conv_blocks": split.num_conv_blocks,
                  "num_attn_blocks": split.num_attn_blocks},
        "blocks": [{"block": i, "mean": float(m), "std": float(s), "min": float(analysis.weights[:, i].min()),
                    "max": float(analysis.weights[:, i].max())}
                   for i, (m, s) in enumerate(zip(analysis.mean, analysis.std))],
        "utterances": [{"id": u, "attention_weights": [float(x) for x in row]}
                       for u, row in zip(analysis.ids, analysis.weights)],
    }


def write_report(analysis: BranchAnalysis, out_dir: str | Path) -> dict[str, Path]:
    """branch_weights.{png,md,json} in out_dir; the Markdown is the card section, linking the PNG beside it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"plot": out_dir / PLOT_FILE, "markdown": out_dir / TABLE_FILE, "json": out_dir / JSON_FILE}
    plot_weights(analysis, paths["plot"])
    paths["markdown"].write_text(card_section(analysis, PLOT_FILE))
    paths["json"].write_text(json.dumps(to_json(analysis), indent=2) + "\n")
    return paths


def update_card(card: str | Path, section: str) -> Path:
    """Put `section` into a model card (README.md), replacing an earlier one with the same heading."""
    card = Path(card)
    text = card.read_text() if card.exists() else ""
    heading = section.splitlines()[0]
    # From our heading to the next level-2 heading (or the end): the previous run's section.
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section if text else section
    card.write_text(text.rstrip("\n") + "\n")
    return card
