"""Warm starts from a package's weights: all of them, the matching ones, and grown models that start as the
package answers. `pasu train --init-from` through the trainer (tokenizer, refusals) is in test_train.py."""

import itertools
import logging

import pytest
import torch
import yaml

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py
from pasu.models.build import build_asr_model
from pasu.models.late_context_encoder import IncrementalEncoder
from pasu.models.warm_start import warm_start

TOKENS = ["<blank>", "<unk>", *(f"t{i}" for i in range(38)), "<sos/eos>"]
TINY_MODEL = {**support.TINY_MODEL, "token_list": TOKENS}
SEEDS = itertools.count()
SPEECH, LENGTHS = torch.randn(2, 16000, generator=torch.Generator().manual_seed(0)), torch.tensor([16000, 12000])


def _model(**sections) -> torch.nn.Module:
    """The tiny model, its sections updated by `sections` (an encoder_conf for another encoder replaces its own)."""
    config = dict(TINY_MODEL)
    for name, value in sections.items():
        keep_own = isinstance(value, dict) and "encoder" not in sections
        config[name] = {**TINY_MODEL[name], **value} if keep_own else value
    torch.manual_seed(next(SEEDS))  # every model its own random weights
    return build_asr_model(config).eval()


@pytest.fixture
def package(tmp_path):
    """(model, folder): the tiny model's weights stored as a package stores them (float16 model.pt)."""
    model = _model()
    for p in model.parameters():  # what float16 holds exactly, so "equal to the package" can be exact
        p.data = p.data.half().float()
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()},
               tmp_path / "model.pt")
    _write_token_list(tmp_path, TOKENS)
    return model, tmp_path


def _write_token_list(folder, tokens) -> None:
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"token_list": tokens}}))


def test_a_full_warm_start_loads_every_tensor(package):
    shipped, folder = package
    model = _model()
    warm_start(model, folder)
    assert all(torch.equal(shipped.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_full_warm_start_refuses_another_architecture(package):
    with pytest.raises(RuntimeError):
        warm_start(_model(decoder_conf=dict(num_blocks=2)), package[1])


def test_partial_warm_start_loads_what_matches_and_names_what_it_drops(package, caplog):
    """A Branchformer keeps its own blocks but takes the package's decoder and CTC; the package's blocks it has no
    place for are named in a warning, not dropped in silence."""
    shipped, folder = package
    model = _model(encoder="branchformer", encoder_conf=dict(output_size=32, num_blocks=2, cgmlp_linear_units=64,
                                                             attention_heads=2))
    own_encoder = {k: v.clone() for k, v in model.encoder.encoders[0].state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="pasu.models.warm_start"):
        warm_start(model, folder, partial=True)
    assert any("are dropped" in r.getMessage() and "encoder.attn_blocks.0." in r.getMessage() for r in caplog.records)
    a, b = shipped.state_dict(), model.state_dict()
    shared = [k for k in b if k in a and a[k].shape == b[k].shape]
    assert any(k.startswith("decoder.") for k in shared) and "ctc.ctc_lo.weight" in shared
    assert all(torch.equal(a[k], b[k]) for k in shared)
    assert all(torch.equal(v, model.encoder.encoders[0].state_dict()[k]) for k, v in own_encoder.items())


def test_a_partial_warm_start_that_matches_nothing_is_refused(tmp_path):
    torch.save({"something.else": torch.zeros(3)}, tmp_path / "model.pt")
    _write_token_list(tmp_path, TOKENS)
    with pytest.raises(ValueError, match="no tensor"):
        warm_start(_model(), tmp_path, partial=True)


def test_a_model_with_labels_the_package_lacks_keeps_its_rows_by_token(package, caplog):
    """Two labels added before <sos/eos> (Tokenizer.with_symbols): every shared token, <sos/eos> included, gets
    the package's row in the embedding, the decoder's output and the CTC; the new ones keep their own."""
    shipped, folder = package
    tokens = [*TOKENS[:-1], "thermostat_set", "SLOT_room", TOKENS[-1]]
    model = _model(token_list=tokens)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="pasu.models.warm_start"):
        warm_start(model, folder)
    assert any("thermostat_set, SLOT_room" in r.getMessage() for r in caplog.records)
    a, b = shipped.state_dict(), model.state_dict()
    for name in ("decoder.embed.0.weight", "decoder.output_layer.bias", "ctc.ctc_lo.weight"):
        assert torch.equal(b[name][: len(TOKENS) - 1], a[name][:-1])
        assert torch.equal(b[name][-1], a[name][-1])  # <sos/eos> moved to the end with its row
        assert torch.equal(b[name][-3:-1], fresh[name][-3:-1])
    assert all(torch.equal(a[k], b[k]) for k in a if a[k].shape == b[k].shape)


def test_a_deeper_decoder_starts_from_the_package_answers(package):
    """A decoder layer the package lacks starts as the identity: the grown model scores every target as the
    package does; only the ends of its branches are zeroed, so the rest of the layer still learns."""
    shipped, folder = package
    grown, plain = _model(decoder_conf=dict(num_blocks=2)), _model(decoder_conf=dict(num_blocks=2))
    warm_start(grown, folder, partial=True, grow_decoder=True)
    warm_start(plain, folder, partial=True)
    assert float(grown.decoder.decoders[1].feed_forward.w_1.weight.detach().abs().sum()) > 0

    tokens, token_lengths = torch.randint(2, 40, (2, 5)), torch.tensor([5, 3])
    with torch.no_grad():
        encoded, encoded_lengths = shipped.encode(SPEECH, LENGTHS)
        a, b, c = (m.decoder(encoded, encoded_lengths, tokens, token_lengths)[0] for m in (shipped, grown, plain))
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, c, atol=1e-3)  # without growing, the new layer is random: the answers move


def test_deeper_streaming_conv_stack_starts_from_the_package_answers(package):
    """Conv blocks the package lacks, stacked on its own, start as the identity: the grown encoder encodes as
    the package's does, offline and chunk by chunk, and the new blocks' weights are still there to learn."""
    shipped, folder = package
    grown, plain = (_model(encoder_conf=dict(num_conv_blocks=3)) for _ in range(2))
    warm_start(grown, folder, partial=True, grow_conv_blocks=True)
    warm_start(plain, folder, partial=True)
    assert float(grown.encoder.conv_blocks[2].cgmlp.channel_proj1[0].weight.detach().abs().sum()) > 0

    with torch.no_grad():
        a, a_lengths = shipped.encode(SPEECH, LENGTHS)
        b, b_lengths = grown.encode(SPEECH, LENGTHS)
        c, _ = plain.encode(SPEECH, LENGTHS)
        feats, _ = grown._extract_feats(SPEECH[:1], LENGTHS[:1])
        stream = IncrementalEncoder(grown.encoder)
        for start in range(0, feats.size(1), 13):
            stream.accept(feats[:, start:start + 13])
        streamed = stream.encode()
    assert torch.equal(a_lengths, b_lengths)
    assert torch.allclose(a, b, atol=1e-4)
    assert torch.allclose(streamed, b[:1, : streamed.size(1)], atol=1e-4)
    assert not torch.allclose(a, c, atol=1e-3)  # without growing, the new blocks are random: the encoding moves


def test_growing_conv_blocks_needs_the_late_context_encoder(package):
    model = _model(encoder="branchformer", encoder_conf=dict(output_size=32, num_blocks=1, cgmlp_linear_units=64,
                                                             attention_heads=2))
    with pytest.raises(ValueError, match="late_context"):
        warm_start(model, package[1], partial=True, grow_conv_blocks=True)
