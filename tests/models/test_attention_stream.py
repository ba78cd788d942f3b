"""AttentionBlockStream / PositionTable: a Branchformer block computed on arrival equals ESPnet's forward."""

import numpy as np
import pytest
import torch

from espnet.nets.pytorch_backend.transformer.attention import RelPositionMultiHeadedAttention
from espnet.nets.pytorch_backend.transformer.embedding import RelPositionalEncoding
from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoderLayer
from espnet2.asr.layers.cgmlp import ConvolutionalGatingMLP
from pasu.models.attention_stream import AttentionBlockStream, PositionTable, can_stream

TOL = 1e-4
D = 64


def _block(merge_method: str = "concat") -> BranchformerEncoderLayer:
    torch.manual_seed(0)
    block = BranchformerEncoderLayer(
        D,
        RelPositionMultiHeadedAttention(4, D, 0.1),
        ConvolutionalGatingMLP(D, 256, 31, 0.1, False, "identity"),
        0.1,
        merge_method,
    )
    # Non-zero position biases (ESPnet initializes them randomly too) so both score terms are exercised.
    return block.eval()


@pytest.fixture(scope="module")
def positions() -> RelPositionalEncoding:
    return RelPositionalEncoding(D, 0.1).eval()


def _espnet(block, positions, x: torch.Tensor) -> torch.Tensor:
    pos_emb = positions(x)[1]
    (y, _), _ = block((x, pos_emb), None)
    return y


def _inputs(n: int, seed: int = 0) -> torch.Tensor:
    return 3 * torch.randn(1, n, D, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("chunking", ["one_shot", "single", "random"])
def test_stream_equals_forward_at_every_point(positions, chunking):
    block, x = _block(), _inputs(90)
    sizes = {"one_shot": [90], "single": [1] * 90,
             "random": list(np.random.default_rng(1).integers(0, 9, size=200))}[chunking]
    stream, pos = AttentionBlockStream(block, PositionTable(block.attn, positions)), 0
    with torch.no_grad():
        for size in sizes:
            if pos >= 90:
                break
            stream.accept(x[:, pos : pos + size])
            pos = min(pos + size, 90)
            if pos:
                # A pilot at any moment sees exactly the block's output on the input so far.
                expected = _espnet(block, positions, x[:, :pos])
                assert (stream.output() - expected).abs().max().item() < TOL
    assert stream.num_frames == 90


def test_batch_of_two(positions):
    block = _block()
    x = torch.cat([_inputs(40, seed=1), _inputs(40, seed=2)])
    stream = AttentionBlockStream(block, PositionTable(block.attn, positions))
    with torch.no_grad():
        for i in range(0, 40, 7):
            stream.accept(x[:, i : i + 7])
        assert (stream.output() - _espnet(block, positions, x)).abs().max().item() < TOL


def test_position_table_grows_by_doubling_and_keeps_values(positions):
    block = _block()
    small, large = PositionTable(block.attn, positions), PositionTable(block.attn, positions)
    small.reserve(10)
    large.reserve(500)
    assert small.max_frames == 64 and large.max_frames == 500
    small.reserve(65)
    assert small.max_frames == 128  # doubled, not grown to exactly 65
    q_v = torch.randn(1, 4, 5, D // 4)
    rows, cols = slice(60, 65), slice(0, 65)
    assert torch.allclose(small.scores(q_v, rows, cols), large.scores(q_v, rows, cols), atol=1e-5)
    # many rows, few columns takes the other path: same logits
    q_v = torch.randn(1, 4, 60, D // 4)
    many, few = slice(0, 60), slice(60, 63)
    wide = large.scores(q_v, many, slice(0, 63))[..., 60:]
    assert torch.allclose(small.scores(q_v, many, few), wide, atol=1e-5)


def test_unsupported_blocks_are_refused(positions):
    assert can_stream(_block())
    assert not can_stream(_block("learned_ave"))
    with pytest.raises(ValueError, match="concat"):
        AttentionBlockStream(_block("learned_ave"), PositionTable(_block().attn, positions))
    training = _block().train()
    with pytest.raises(ValueError, match="eval mode"):
        AttentionBlockStream(training, PositionTable(training.attn, positions))
    with pytest.raises(ValueError, match="no frames"):
        AttentionBlockStream(_block(), PositionTable(_block().attn, positions)).output()
