"""LateContextEncoder: offline shapes, causality, and chunked streaming == offline."""

import numpy as np
import pytest
import torch

from espnet.nets.pytorch_backend.transformer.subsampling import TooShortUttError
from pasu.models.late_context_encoder import IncrementalEncoder, LateContextEncoder, subsampled_length

TOL = 1e-4


@pytest.fixture(scope="module")
def encoder() -> LateContextEncoder:
    torch.manual_seed(0)
    return LateContextEncoder(80).eval()


def _feats(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, n, 80, generator=torch.Generator().manual_seed(seed))


def _stream(encoder: LateContextEncoder, feats: torch.Tensor, sizes) -> torch.Tensor:
    state = encoder.init_stream_state()
    outs, pos = [], 0
    for size in sizes:
        if pos >= feats.size(1):
            break
        out, state = encoder.forward_chunk(feats[:, pos : pos + size], state)
        outs.append(out)
        pos += size
        # Each call emits exactly the frames whose receptive field (7 feature frames) is now complete.
        assert state.num_frames == sum(o.size(1) for o in outs) == subsampled_length(min(pos, feats.size(1)))
    assert pos >= feats.size(1) and state.num_feats == feats.size(1)
    return torch.cat(outs, dim=1)


def test_default_size(encoder):
    n = sum(p.numel() for p in encoder.parameters())
    assert 2_000_000 <= n <= 4_000_000
    assert encoder.output_size() == 144
    assert len(encoder.conv_blocks) == 6 and len(encoder.attn_blocks) == 3


@pytest.mark.parametrize("num_feats", [7, 8, 10, 11, 300, 301, 302, 303])
def test_offline_lengths(encoder, num_feats):
    with torch.no_grad():
        out, olens, states = encoder(_feats(num_feats), torch.tensor([num_feats]))
    assert states is None
    assert out.shape == (1, ((num_feats - 1) // 2 - 1) // 2, 144) and olens.tolist() == [out.size(1)]


def test_too_short(encoder):
    with pytest.raises(TooShortUttError):
        encoder(_feats(6), torch.tensor([6]))
    out, state = encoder.forward_chunk(_feats(6), encoder.init_stream_state())
    assert out.shape == (1, 0, 144) and state.feat_cache.size(1) == 6


@pytest.mark.parametrize("num_feats", [298, 301, 303])
@pytest.mark.parametrize("chunking", ["10frames", "random", "single"])
def test_streaming_equals_offline(encoder, num_feats, chunking):
    feats = _feats(num_feats, seed=num_feats)
    if chunking == "10frames":
        sizes = [10] * (num_feats // 10 + 1)
    elif chunking == "single":
        sizes = [1] * num_feats
    else:
        sizes = list(np.random.default_rng(num_feats).integers(0, 23, size=400))
    with torch.no_grad():
        conv_off, olens = encoder.forward_conv(feats, torch.tensor([num_feats]))
        full, _, _ = encoder(feats, torch.tensor([num_feats]))
        conv_str = _stream(encoder, feats, sizes)
        ctx = encoder.forward_context(conv_str)
    # Every frame the offline pass emits is emitted while streaming: nothing waits for a flush.
    assert conv_str.shape == conv_off.shape == full.shape
    assert (conv_str - conv_off).abs().max().item() < TOL
    assert (ctx - full).abs().max().item() < TOL


@pytest.mark.parametrize("chunk", [1, 10, 37])
def test_incremental_encoder_equals_forward_at_every_pilot(encoder, chunk):
    feats = _feats(350, seed=chunk)
    stream = IncrementalEncoder(encoder)
    with torch.no_grad():
        assert stream.encode().shape == (1, 0, 144)  # nothing emitted yet
        for start in range(0, 350, chunk):
            stream.accept(feats[:, start : start + chunk])
            end = min(start + chunk, 350)
            if stream.num_frames and (start // chunk) % 7 == 3:  # a pilot now and then
                prefix, _, _ = encoder(feats[:, :end], torch.tensor([end]))
                assert (stream.encode() - prefix).abs().max().item() < TOL
        full, _, _ = encoder(feats, torch.tensor([350]))
        assert (stream.encode() - full).abs().max().item() < TOL
    # the first attention block ran on arrival; the later blocks' position tables were built then too
    assert stream.first is not None and stream.first.num_frames == full.size(1)
    assert all(table.max_frames >= full.size(1) for table in stream.tables)


def test_incremental_encoder_without_concat_merge_runs_attention_at_encode():
    torch.manual_seed(0)
    enc = LateContextEncoder(80, output_size=64, num_conv_blocks=2, num_attn_blocks=2, cgmlp_linear_units=128,
                             merge_method="learned_ave").eval()
    feats = _feats(200, seed=9)
    stream = IncrementalEncoder(enc)
    with torch.no_grad():
        for start in range(0, 200, 10):
            stream.accept(feats[:, start : start + 10])
        full, _, _ = enc(feats, torch.tensor([200]))
        assert stream.first is None and (stream.encode() - full).abs().max().item() < TOL


def test_an_encoder_without_attention_blocks_streams_whole_and_equals_forward():
    """The streaming baseline (models/configs/baseline_streaming.yaml): conv blocks only, nothing left for encode."""
    torch.manual_seed(0)
    enc = LateContextEncoder(80, output_size=64, num_conv_blocks=3, num_attn_blocks=0, cgmlp_linear_units=128).eval()
    feats = _feats(200, seed=4)
    stream = IncrementalEncoder(enc)
    with torch.no_grad():
        for start in range(0, 200, 10):
            stream.accept(feats[:, start : start + 10])
            partial, _, _ = enc(feats[:, : start + 10], torch.tensor([min(start + 10, 200)]))
            assert (stream.encode() - partial).abs().max().item() < TOL  # every pilot
    assert stream.first is None and not stream.tables


def test_old_conv_outputs_never_change(encoder):
    feats = _feats(400, seed=3)
    with torch.no_grad():
        prefix, _ = encoder.forward_conv(feats[:, :157], torch.tensor([157]))
        whole, _ = encoder.forward_conv(feats, torch.tensor([400]))
        assert (whole[:, : prefix.size(1)] - prefix).abs().max().item() < TOL
        # ...whereas the attention blocks' outputs do change: they see the whole input.
        ctx_prefix = encoder.forward_context(prefix)
        ctx_whole = encoder.forward_context(whole)
        assert (ctx_whole[:, : prefix.size(1)] - ctx_prefix).abs().max().item() > 1e-3


def test_padded_batch_conv_outputs_match_single(encoder):
    a, b = _feats(300, seed=1), _feats(211, seed=2)
    batch = torch.zeros(2, 300, 80)
    batch[0], batch[1, :211] = a[0], b[0]
    with torch.no_grad():
        conv, olens = encoder.forward_conv(batch, torch.tensor([300, 211]))
        single, _ = encoder.forward_conv(b, torch.tensor([211]))
        out, olens2, _ = encoder(batch, torch.tensor([300, 211]))
    assert olens.tolist() == olens2.tolist() == [subsampled_length(300), subsampled_length(211)]
    # Causal conv blocks never read the padding, so the shorter input's valid frames are unaffected.
    assert (conv[1, : olens[1]] - single[0]).abs().max().item() < TOL
    assert torch.isfinite(out).all()


def test_chunked_batch_of_two(encoder):
    feats = torch.randn(2, 120, 80, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        conv_off, _ = encoder.forward_conv(feats, torch.tensor([120, 120]))
        state, outs = encoder.init_stream_state(batch_size=2), []
        for i in range(0, 120, 13):
            out, state = encoder.forward_chunk(feats[:, i : i + 13], state)
            outs.append(out)
    assert (torch.cat(outs, 1) - conv_off).abs().max().item() < TOL


def test_gradients_flow_in_training_mode():
    torch.manual_seed(0)
    enc = LateContextEncoder(80, output_size=64, num_conv_blocks=2, num_attn_blocks=1, cgmlp_linear_units=128)
    out, olens, _ = enc(torch.randn(2, 50, 80), torch.tensor([50, 40]))
    out.sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
