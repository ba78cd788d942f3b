"""`pasu branches`: learned_ave branch weights of a Branchformer, k, the report and the CLI."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py
from pasu.cli import main
from pasu.models.branch_analysis import (
    CARD_HEADING,
    SplitRule,
    analyze,
    branch_weights,
    card_section,
    learned_ave_blocks,
    suggest_split,
    update_card,
)
from pasu.models.build import build_asr_model
from pasu.models.data import load_split, write_synthetic_corpus
from pasu.models.package import half_state_dict
from pasu.models.targets import target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions

NUM_BLOCKS = 4
TOKENS = ["<blank>", "<unk>", "▁a", "▁b", "c", "<sos/eos>"]
ENCODER_CONF = dict(output_size=32, attention_heads=2, cgmlp_linear_units=64, cgmlp_conv_kernel=7,
                    num_blocks=NUM_BLOCKS, merge_method="learned_ave")
DECODER_CONF = dict(linear_units=64, attention_heads=2)


def tiny_config(token_list=TOKENS, **encoder) -> dict:
    return {"token_list": list(token_list), "encoder": "branchformer", "encoder_conf": {**ENCODER_CONF, **encoder},
            "decoder_conf": DECODER_CONF, "model_conf": dict(report_cer=False, report_wer=False)}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return build_asr_model(tiny_config()).eval()


def waves(n: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [0.1 * rng.standard_normal(int(16000 * s)).astype(np.float32) for s in (0.6, 1.0, 0.8)[:n]]


def force_attention(model, attention_blocks: set[int], logit: float = 8.0) -> None:
    """Constant merge logits: w_attn ~ 1 in `attention_blocks`, ~ 0 elsewhere, whatever the input."""
    with torch.no_grad():
        for i, block in enumerate(learned_ave_blocks(model)):
            for proj in (block.weight_proj1, block.weight_proj2):
                proj.weight.zero_()
            block.weight_proj1.bias.fill_(logit if i in attention_blocks else -logit)
            block.weight_proj2.bias.zero_()


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


# --- Measuring ------------------------------------------------------------------------------------------


def test_weights_are_a_distribution_per_block(model):
    w = branch_weights(model, waves())
    assert w.shape == (3, NUM_BLOCKS, 2)
    assert ((w >= 0) & (w <= 1)).all()
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-9)
    assert w[:, :, 0].std() > 0  # random projections: the weights depend on the input (not a constant read)
    assert hook_count(model) == 0


def test_weights_are_the_softmax_of_the_merge_logits(model):
    """Zero projections leave only the biases: w_attn = sigmoid(b1 - b2) exactly, for every utterance."""
    with torch.no_grad():
        for i, block in enumerate(learned_ave_blocks(model)):
            block.weight_proj1.weight.zero_()
            block.weight_proj2.weight.zero_()
            block.weight_proj1.bias.fill_(0.1 * i)
            block.weight_proj2.bias.fill_(-0.2)
    attention = analyze(model, waves()).weights
    expected = [1 / (1 + math.exp(-(0.1 * i + 0.2))) for i in range(NUM_BLOCKS)]
    np.testing.assert_allclose(attention, np.tile(expected, (3, 1)), atol=1e-6)


def test_per_utterance_weights_do_not_depend_on_the_other_utterances(model):
    a, b, c = waves()
    together = analyze(model, [a, b, c]).weights
    np.testing.assert_allclose(analyze(model, [b]).weights[0], together[1], atol=1e-6)


def test_hooks_removed_and_mode_restored_after_an_error(model):
    def unreadable_second_file():
        yield waves(1)[0]
        raise OSError("cannot read audio")

    model.train()
    with pytest.raises(OSError, match="cannot read audio"):
        branch_weights(model, unreadable_second_file())  # fails mid-analysis, hooks registered
    assert hook_count(model) == 0 and model.training


def test_only_learned_ave_branchformers():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="learned_ave"):
        branch_weights(build_asr_model(tiny_config(merge_method="concat")), waves(1))
    late = build_asr_model({**tiny_config(), "encoder": "late_context",
                            "encoder_conf": support.TINY_MODEL["encoder_conf"]})
    with pytest.raises(ValueError, match="no Branchformer blocks"):
        branch_weights(late, waves(1))


# --- Choosing k -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention_blocks, tail_only, k, conv, attn", [
    ({2, 3}, False, 2, 1, 3),  # attention dominates the last two blocks: the paper's 9 -> 6 + 3, at depth 4
    ({3}, False, 1, 2, 2),
    (set(), False, 0, 3, 1),  # no block needs attention: still k+1 = 1 attention block
    ({0, 3}, False, 2, 1, 3),  # the paper counts every block above h (the kept blocks move to the end) ...
    ({0, 3}, True, 1, 2, 2),  # ... tail_only counts only the run that ends at the last block
    ({0, 1, 2, 3}, False, 4, 0, 4),  # k = N: N-k-1 would be -1, so every block keeps attention
])
def test_forced_weights_give_the_expected_split(model, attention_blocks, tail_only, k, conv, attn):
    force_attention(model, attention_blocks)
    analysis = analyze(model, waves(), rule=SplitRule(tail_only=tail_only))
    assert analysis.split.above == tuple(sorted(attention_blocks))
    assert (analysis.split.k, analysis.split.num_conv_blocks, analysis.split.num_attn_blocks) == (k, conv, attn)
    assert analysis.split.describe() == f"{conv} conv-only + {attn} attention blocks"


def test_threshold_is_strict_and_configurable():
    mean = [0.2, 0.5, 0.61, 0.7]
    assert suggest_split(mean).k == 2  # 0.5 does not exceed h = 0.5
    assert suggest_split(mean, SplitRule(threshold=0.65)).counted == (3,)
    assert suggest_split(mean, SplitRule(threshold=0.1)).k == 4
    assert suggest_split([0.9, 0.1, 0.9], SplitRule(tail_only=True)).counted == (2,)


def test_paper_example_nine_blocks():
    mean = [0.1, 0.3, 0.2, 0.4, 0.1, 0.3, 0.2, 0.8, 0.9]
    split = suggest_split(mean)
    assert (split.k, split.num_conv_blocks, split.num_attn_blocks) == (2, 6, 3)


# --- Reporting ------------------------------------------------------------------------------------------


def test_card_section_and_update(model, tmp_path):
    force_attention(model, {3})
    analysis = analyze(model, waves(), ids=["u1", "u2", "u3"], source="tiny")
    section = card_section(analysis, "plot.png")
    assert section.startswith(CARD_HEADING)
    assert "| 3 | 1.000 | 0.000 | 1.000 | 1.000 | yes |" in section and "| 0 | 0.000 | 0.000 |" in section
    assert "**2 conv-only + 2 attention blocks**" in section and "`num_attn_blocks: 2`" in section
    assert "![attention-branch weight per block](plot.png)" in section

    card = tmp_path / "README.md"
    card.write_text("# model\n\n## Results\n\nnone\n\n## Files\n\nmodel.pt\n")
    update_card(card, section)
    force_attention(model, {2, 3})
    update_card(card, card_section(analyze(model, waves()), "plot.png"))  # a second run replaces the first
    text = card.read_text()
    assert text.count(CARD_HEADING) == 1 and "**1 conv-only + 3 attention blocks**" in text
    assert "## Files\n\nmodel.pt" in text and text.index("## Results") < text.index(CARD_HEADING)


def test_analyze_checks_ids(model):
    with pytest.raises(ValueError, match="2 ids for 3 waveforms"):
        analyze(model, waves(), ids=["a", "b"])


# --- CLI ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_synthetic_corpus(tmp_path_factory.mktemp("corpus"), n_train=4, n_dev=4)


def write_package(folder: Path, corpus: Path, attention_blocks: set[int]) -> Path:
    """A PASU model folder (as `pasu package` writes it) holding a tiny learned_ave Branchformer."""
    utts = load_split(corpus, "train")
    symbols = target_symbols({u.intent for u in utts}, {s.type for u in utts for s in u.slots or ()})
    tokenizer = Tokenizer.train([u.text for u in utts], symbols, TokenizerOptions(vocab_size=60))
    torch.manual_seed(0)
    config = tiny_config(tokenizer.token_list)
    model = build_asr_model(config)
    force_attention(model, attention_blocks)
    folder.mkdir(parents=True)
    tokenizer.save(folder / "tokenizer.model")
    torch.save(half_state_dict(model), folder / "model.pt")
    (folder / "config.yaml").write_text(yaml.safe_dump({"format": 1, "name": "tiny", "model": config}))
    (folder / "README.md").write_text("# tiny\n\n## Files\n\nmodel.pt\n")
    return folder


def test_cli_writes_plot_table_json_and_card(corpus, tmp_path, capsys):
    folder = write_package(tmp_path / "model", corpus, {2, 3})
    out = tmp_path / "branches"
    assert main(["branches", str(folder), "--corpus", str(corpus), "--split", "dev", "--utterances", "3",
                 "--out", str(out), "--card", "--threads", "1"]) == 0
    assert "k = 2: 1 conv-only + 3 attention blocks" in capsys.readouterr().out

    assert (out / "branch_weights.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "branch_weights.json").read_text())
    assert data["split"] == {"num_blocks": 4, "k": 2, "blocks_above_threshold": [2, 3], "blocks_counted": [2, 3],
                             "num_conv_blocks": 1, "num_attn_blocks": 3}
    assert len(data["utterances"]) == 3 and len(data["utterances"][0]["attention_weights"]) == 4
    assert [round(b["mean"], 3) for b in data["blocks"]] == [0.0, 0.0, 1.0, 1.0]
    assert "**1 conv-only + 3 attention blocks**" in (out / "branch_weights.md").read_text()
    assert CARD_HEADING in (folder / "README.md").read_text() and (folder / "branch_weights.png").exists()


def test_cli_reads_an_espnet_checkpoint(corpus, tmp_path, capsys):
    """An ESPnet exp folder: config.yaml (token list inline, default frontend) beside the .pth."""
    from pasu.models.package import build_espnet_model

    exp = tmp_path / "exp" / "asr_branchformer"
    exp.mkdir(parents=True)
    args = {"token_list": TOKENS, "input_size": None, "frontend": "default",
            "frontend_conf": {"n_fft": 512, "win_length": 400, "hop_length": 160, "fs": "16k"},
            "specaug": None, "normalize": None, "encoder": "branchformer", "encoder_conf": ENCODER_CONF,
            "decoder": "transformer", "decoder_conf": DECODER_CONF, "ctc_conf": {}, "model": "espnet",
            "model_conf": {"ctc_weight": 0.3}}
    (exp / "config.yaml").write_text(yaml.safe_dump(args))
    model = build_espnet_model(args)
    force_attention(model, {3})
    torch.save(model.state_dict(), exp / "valid.acc.ave.pth")

    out = tmp_path / "branches"
    assert main(["branches", str(exp / "valid.acc.ave.pth"), "--corpus", str(corpus), "--utterances", "2",
                 "--out", str(out), "--tail-only"]) == 0
    assert "k = 1: 2 conv-only + 2 attention blocks" in capsys.readouterr().out
    assert json.loads((out / "branch_weights.json").read_text())["rule"] == {"threshold": 0.5, "tail_only": True}
    with pytest.raises(SystemExit, match="--card needs a packaged model folder"):
        main(["branches", str(exp / "valid.acc.ave.pth"), "--corpus", str(corpus), "--out", str(out), "--card"])
