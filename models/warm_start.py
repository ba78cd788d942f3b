"""Warm starts: a new training run that begins from a packaged model's weights (`train.init_from`).

The package's architecture as it is, or (`init_partial`) a grown one: the tensors whose names and shapes match are
loaded, and new decoder layers or new top conv blocks can start as the identity, so the grown model answers exactly
as the package did and training only adds to it. A model whose token list extends the package's (labels the package
lacks, `Tokenizer.with_symbols`) gets the package's rows for the tokens they share.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import yaml

log = logging.getLogger(__name__)

# the tensors with one row per token: the decoder's embedding and output layer, the CTC's output layer
VOCABULARY_TENSORS = ("decoder.embed.0.weight", "decoder.output_layer.weight", "decoder.output_layer.bias",
                      "ctc.ctc_lo.weight", "ctc.ctc_lo.bias")


def warm_start(model: torch.nn.Module, package: Path, partial: bool = False, grow_decoder: bool = False,
               grow_conv_blocks: bool = False) -> None:
    """Load `package`'s weights into `model`; `grow_decoder` / `grow_conv_blocks` make the decoder layers / top
    late-context conv blocks that got none of them pass their input through unchanged."""
    weights = _rows_by_token(_packaged_weights(package), _packaged_tokens(package), model)
    loaded = _load_matching(model, weights, partial)
    if grow_decoder:
        _new_decoder_layers_as_identity(model, loaded)
    if grow_conv_blocks:
        _new_conv_blocks_as_identity(model, loaded)
    log.info("initialized from %s%s", package, " (matching tensors only)" if partial else "")


def _load_matching(model: torch.nn.Module, weights: dict[str, torch.Tensor], partial: bool) -> set[str]:
    """Load a package's weights: all of them, or (partial) those whose names and shapes match the model; returns
    the names loaded."""
    if not partial:
        model.load_state_dict(weights, strict=True)
        return set(weights)
    own = model.state_dict()
    matched = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    if not matched:
        raise ValueError("init_partial: no tensor of the package matches this model (names and shapes)")
    model.load_state_dict(matched, strict=False)
    dropped = sorted(set(weights) - set(matched))
    if dropped:  # e.g. a config with fewer decoder layers than the package: say so, it is rarely meant
        log.warning("warm start: %d of the package's tensors fit no tensor of this model and are dropped: %s%s",
                    len(dropped), ", ".join(dropped[:4]), " ..." if len(dropped) > 4 else "")
    log.info("warm start: %d of %d tensors loaded (%d parameters); the rest keep their initialization",
             len(matched), len(own), sum(v.numel() for v in matched.values()))
    return set(matched)


def _new_decoder_layers_as_identity(model: torch.nn.Module, loaded: set[str]) -> None:
    """Zero the residual branches' output projections of every decoder layer none of whose tensors were loaded:
    a pre-norm layer adds each branch to its input, so the layer passes its input through unchanged."""
    layers = model.decoder.decoders
    new = [i for i in range(len(layers)) if not any(n.startswith(f"decoder.decoders.{i}.") for n in loaded)]
    with torch.no_grad():
        for i in new:
            for branch_end in (layers[i].self_attn.linear_out, layers[i].src_attn.linear_out,
                               layers[i].feed_forward.w_2):
                branch_end.weight.zero_()
                branch_end.bias.zero_()
    log.info("decoder layers %s start as the identity", new)


def _new_conv_blocks_as_identity(model: torch.nn.Module, loaded: set[str]) -> None:
    """Make the late-context encoder's new top conv blocks pass their input through unchanged.

    Each block ends in a LayerNorm, so zeroing the cgMLP's output projection alone would still renormalize: the
    package's top block hands its output affine to the new top block and normalizes without one, and a
    LayerNorm of normalized frames leaves them as they are (up to its epsilon).
    """
    blocks = getattr(model.encoder, "conv_blocks", None)
    if blocks is None:
        raise ValueError("train.init_new_conv_blocks_identity needs the late_context encoder")
    new = [i for i in range(len(blocks)) if not any(n.startswith(f"encoder.conv_blocks.{i}.") for n in loaded)]
    if not new:
        return
    if new != list(range(new[0], len(blocks))) or new[0] == 0:
        raise ValueError(f"new conv blocks {new} must sit on top of the package's own")
    top_old, top_new = blocks[new[0] - 1].norm_final, blocks[-1].norm_final
    with torch.no_grad():
        top_new.weight.copy_(top_old.weight)
        top_new.bias.copy_(top_old.bias)
        for i in range(new[0] - 1, len(blocks) - 1):
            blocks[i].norm_final.weight.fill_(1.0)
            blocks[i].norm_final.bias.zero_()
        for i in new:
            blocks[i].cgmlp.channel_proj2.weight.zero_()
            blocks[i].cgmlp.channel_proj2.bias.zero_()
    log.info("encoder conv blocks %s start as the identity", new)


def _packaged_weights(folder: Path) -> dict[str, torch.Tensor]:
    """A package's model.pt (float16 on disk) as float32."""
    state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def _packaged_tokens(folder: Path) -> list[str]:
    return list(yaml.safe_load((folder / "config.yaml").read_text())["model"]["token_list"])


def _rows_by_token(weights: dict[str, torch.Tensor], tokens: list[str], model: torch.nn.Module
                   ) -> dict[str, torch.Tensor]:
    """`weights` with their vocabulary tensors laid out by the model's token list: a token the package has keeps
    its row, a token it lacks keeps the model's own initialization."""
    own_tokens = list(model.token_list)
    if own_tokens == tokens:
        return weights
    where = {t: i for i, t in enumerate(tokens)}
    shared = [(j, where[t]) for j, t in enumerate(own_tokens) if t in where]
    if not shared:
        raise ValueError("warm start: the model shares no token with the package")
    own_rows, package_rows = (torch.tensor(rows) for rows in zip(*shared))
    own = model.state_dict()
    laid_out = dict(weights)
    for name in VOCABULARY_TENSORS:
        if name in weights and name in own:
            rows = own[name].detach().clone()
            rows[own_rows] = weights[name][package_rows].to(rows.dtype)
            laid_out[name] = rows
    new = [t for t in own_tokens if t not in where]
    if new:  # info: `pasu train` has already warned about the labels it added
        log.info("warm start: %d tokens the package lacks start untrained: %s%s", len(new),
                 ", ".join(new[:8]), " ..." if len(new) > 8 else "")
    return laid_out
