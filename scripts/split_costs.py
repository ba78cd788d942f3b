"""What each late-context split costs after the end of speech: the shipped device's (its config's conv and
attention blocks) and the paper's 6 + 3 against the splits of nine blocks our Branchformer's branch weights give
(the paper's rule: 3 + 6; counting only a run of attention-leaning blocks that ends at the top, of which there is
none: 8 + 1).

Builds each encoder with the shipped device's sizes (random weights: FLOPs and time do not depend on them),
streams `seconds` of features through `IncrementalEncoder` in 100-ms chunks as the agent does, and reports the
share of encoder FLOPs done during ingestion, the FLOPs left for after the end of speech, and the time that
final `encode()` takes on this machine (median of repeats, one torch thread).

    .venv/bin/python scripts/split_costs.py [--seconds 3 5] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import yaml

from pasu.models.flops import feature_frames, streamed_flops
from pasu.models.frontend import N_MELS
from pasu.models.late_context_encoder import IncrementalEncoder, LateContextEncoder
from pasu.settings import shipped_model

SHIPPED_CONFIG = shipped_model("device") / "config.yaml"
ALTERNATIVES = {"6 + 3 (the paper's)": (6, 3), "3 + 6 (the paper's rule, k = 5)": (3, 6),
                "8 + 1 (no top run, k = 0)": (8, 1)}


def shipped_encoder_conf() -> dict:
    return dict(yaml.safe_load(SHIPPED_CONFIG.read_text())["model"]["encoder_conf"])


def splits(conf: dict) -> dict[str, tuple[int, int]]:
    """The shipped split first, then each alternative it is not."""
    shipped = (conf["num_conv_blocks"], conf["num_attn_blocks"])
    named = {f"{shipped[0]} + {shipped[1]} (shipped)": shipped}
    return named | {name: split for name, split in ALTERNATIVES.items() if split != shipped}


def encode_seconds(encoder: LateContextEncoder, seconds: float, repeats: int, chunk_frames: int = 10) -> float:
    """Median seconds of the final `encode()` after streaming `seconds` of features."""
    n = feature_frames(seconds)
    feats = torch.randn(1, n, N_MELS)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            stream = IncrementalEncoder(encoder)
            for start in range(0, n, chunk_frames):
                stream.accept(feats[:, start : start + chunk_frames])
            started = time.perf_counter()
            stream.encode()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, nargs="+", default=[3.0, 5.0], help="utterance lengths")
    parser.add_argument("--repeats", type=int, default=30, help="timed encodes per split and length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    conf = shipped_encoder_conf()
    print(f"encoder sizes from {SHIPPED_CONFIG.relative_to(SHIPPED_CONFIG.parents[3])}; 1 torch thread\n")
    print(f"{'split (conv + attention)':34s} {'params':>8s} {'seconds':>7s} {'ingested':>9s} "
          f"{'MFLOPs after':>13s} {'encode after':>13s}")
    for name, (conv, attn) in splits(conf).items():
        encoder = LateContextEncoder(N_MELS, **{**conf, "num_conv_blocks": conv, "num_attn_blocks": attn}).eval()
        params = sum(p.numel() for p in encoder.parameters()) / 1e6
        for seconds in args.seconds:
            ingest, final = streamed_flops(encoder, seconds)
            took = encode_seconds(encoder, seconds, args.repeats)
            print(f"{name:34s} {params:7.2f}M {seconds:7.1f} {ingest / (ingest + final):9.1%} "
                  f"{final / 1e6:13.0f} {1000 * took:10.1f} ms")


if __name__ == "__main__":
    main()
