"""Shared by the cloud and device tests: a tiny but real ESPnet recognizer, a slow wrapper, audio, certs,
a `pasu cloud serve` process.

Loaded by path (`_load_cloud_support()` in tests/conftest.py, which also holds the `start_server` fixture):
with pytest's importlib import mode, test folders are not packages.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
import yaml

from pasu.models.recognizer import DecodingOptions, EspnetRecognizer, Recognition
from pasu.protos import slu_pb2

SAMPLE_RATE = 16000
TEXTS = ["wake me up at five am", "what is the weather tomorrow", "play some jazz music", "turn off the lights"]
TINY_MODEL = {
    "encoder": "late_context",
    "encoder_conf": dict(output_size=32, num_conv_blocks=1, num_attn_blocks=1, cgmlp_linear_units=64,
                         attention_heads=2),
    "decoder_conf": dict(linear_units=64, attention_heads=2),
}
# Untrained weights rarely emit <eos>: cap the output so a decode costs a bounded, small time.
TINY_DECODING = DecodingOptions(beam_size=3, maxlenratio=-10)


@functools.lru_cache(maxsize=1)
def tiny_parts():
    """(model, tokenizer): an untrained ~100k-parameter late-context model and a real sentencepiece tokenizer."""
    from pasu.models.build import build_asr_model
    from pasu.models.targets import target_symbols
    from pasu.models.tokenizer import Tokenizer, TokenizerOptions

    tokenizer = Tokenizer.train(TEXTS, target_symbols(["alarm_set", "weather_query"], ["time", "date"]),
                                TokenizerOptions(vocab_size=40))
    torch.manual_seed(0)
    model = build_asr_model({"token_list": tokenizer.token_list, **TINY_MODEL}).eval()
    return model, tokenizer


def tiny_recognizer(model_id: str = "tiny-untrained") -> EspnetRecognizer:
    """A real EspnetRecognizer (batched encoder + BatchBeamSearch) over the tiny model."""
    model, tokenizer = tiny_parts()
    return EspnetRecognizer(model, tokenizer, TINY_DECODING, model_id=model_id)


def write_model_folder(folder: Path) -> Path:
    """The tiny model as a PASU model folder (what `pasu cloud serve --model` loads)."""
    from pasu.models.package import PACKAGE_FORMAT

    model, tokenizer = tiny_parts()
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")  # float32: load_packaged takes either precision
    tokenizer.save(folder / "tokenizer.model")
    config = {"format": PACKAGE_FORMAT, "name": "tiny-untrained",
              "model": {"token_list": tokenizer.token_list, **TINY_MODEL},
              "tokenizer": "tokenizer.model", "weights": "model.pt"}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def offramp_levels(l: float, m: float, h: float) -> dict:
    """An offramp's calibrated Offload-L/M/H thresholds as offramp.json (`pasu offramp train`) holds them."""
    return {"levels": {level: {"threshold": value} for level, value in (("L", l), ("M", m), ("H", h))}}


class SlowRecognizer:
    """Fault injection: a real recognizer that first sleeps, to play a slow or overloaded server.

    Records the lengths of every batch it was given, so tests can tell which requests were run.
    """

    def __init__(self, inner: EspnetRecognizer, delay_s: float):
        self.inner = inner
        self.delay_s = delay_s
        self.model_id = inner.model_id
        self.sample_rate = inner.sample_rate
        self.batches: list[list[int]] = []
        self.started = threading.Event()  # set when a batch begins (tests stop the server mid-request)

    def recognize_batch(self, waveforms: list[np.ndarray]) -> list[Recognition]:
        self.batches.append([len(w) for w in waveforms])
        self.started.set()
        time.sleep(self.delay_s)
        return self.inner.recognize_batch(waveforms)


def eventually(predicate, timeout: float = 5.0) -> bool:
    """Poll `predicate` until true: the server records an RPC's metrics just after the client has its answer."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def waveform(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """Noise-like speech stand-in in [-1, 1]: the transport does not care what was said."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.standard_normal(int(seconds * SAMPLE_RATE)) * 0.1, -1, 1).astype(np.float32)


def pcm16(seconds: float = 1.0, seed: int = 0) -> bytes:
    return (waveform(seconds, seed) * 32767).astype("<i2").tobytes()


def request(seconds: float = 1.0, seed: int = 0, utterance_id: str = "utt") -> slu_pb2.UnderstandRequest:
    return slu_pb2.UnderstandRequest(
        audio=slu_pb2.Audio(encoding=slu_pb2.LINEAR16, sample_rate=SAMPLE_RATE, data=pcm16(seconds, seed)),
        metadata=slu_pb2.UtteranceMetadata(utterance_id=utterance_id, client_id="test"))


# --- Certificates -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (EC P-256: fast)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool, usage=None, san=None) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(path: Path, obj) -> Path:
        if isinstance(obj, x509.Certificate):
            path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return path

    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = cert("pasu-test-ca", ca_key, "pasu-test-ca", ca_key, ca=True)
    server = cert("localhost", server_key, "pasu-test-ca", ca_key, ca=False, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                  san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client = cert("pasu-device-1", client_key, "pasu-test-ca", ca_key, ca=False,
                  usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return Pki(ca=write(folder / "ca.pem", ca), server_cert=write(folder / "server.pem", server),
               server_key=write(folder / "server.key", server_key), client_cert=write(folder / "client.pem", client),
               client_key=write(folder / "client.key", client_key))


# --- A server process -------------------------------------------------------------------------------------


class CliServer:
    """`pasu cloud serve --model FOLDER FLAGS...` in a subprocess, on a free port, as users run it.

    Its stderr is read on a thread into `lines` (JSON log lines and anything else): a pipe nobody reads
    would stall the server once full.
    """

    def __init__(self, folder: Path, *flags: str, timeout: float = 180.0):  # a ceiling: a loaded CI box is slow
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pasu.cli", "cloud", "serve", "--model", str(folder), "--port", "0",
             "--no-metrics", "--threads", "1", "--no-text-intent", *flags],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        self.lines: list[str] = []
        self.serving: dict = {}
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line)
                if not ready.is_set() and line.startswith("{") and json.loads(line)["msg"] == "serving":
                    self.serving = json.loads(line)
                    ready.set()
            ready.set()  # exited before serving

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or not self.serving:
            self.kill()
            raise AssertionError(f"server not serving within {timeout} s:\n{''.join(self.lines[-20:])}")

    @property
    def address(self) -> str:
        return self.serving["address"]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful stop); the exit code, once stderr is fully read."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as on an OOM kill or a power cut."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def log(self) -> list[dict]:
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# --- an ESPnet recipe's training output ------------------------------------------------------------------

ESPNET_TOKENS = ["<blank>", "<unk>", "▁a", "▁b", "c", "d", "<sos/eos>"]
FRONTEND_CONF = {"n_fft": 512, "win_length": 400, "hop_length": 160, "fs": "16k", "n_mels": 80}
ENCODER_CONF = {"output_size": 32, "attention_heads": 2, "linear_units": 64, "num_blocks": 2,
                "cnn_module_kernel": 7, "macaron_style": True, "use_cnn_module": True,
                "pos_enc_layer_type": "rel_pos", "selfattention_layer_type": "rel_selfattn", "rel_pos_type": "latest"}
DECODER_CONF = {"attention_heads": 2, "linear_units": 64, "num_blocks": 1}


def write_espnet_run(root: Path) -> tuple[Path, Path, Any]:
    """An ESPnet recipe folder: data/token_list, exp/asr_stats/feats_stats.npz, exp/asr_train/{config.yaml,
    valid.acc.ave.pth}, as ASRTask writes them (paths relative to the recipe folder); returns the config, the
    weights and the model they hold (an untrained Conformer, 7 tokens)."""
    (root / "data" / "token_list").mkdir(parents=True)
    (root / "data" / "token_list" / "tokens.txt").write_text("\n".join(ESPNET_TOKENS) + "\n")
    stats_dir = root / "exp" / "asr_stats" / "train"
    stats_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    mean = rng.normal(-5, 1, 80)
    std = rng.uniform(1, 3, 80)
    np.savez(stats_dir / "feats_stats.npz", count=np.array(1000), sum=1000 * mean,
             sum_square=1000 * (std**2 + mean**2))
    exp = root / "exp" / "asr_train"
    exp.mkdir(parents=True)
    config = {
        "config": "conf/train_asr.yaml", "output_dir": "exp/asr_train", "ngpu": 0, "seed": 0,
        "batch_type": "numel", "optim": "adam", "optim_conf": {"lr": 0.002}, "scheduler": "warmuplr",
        "token_list": "data/token_list/tokens.txt", "init": None, "input_size": None,
        "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": None,
                     "zero_infinity": True},
        "model": "espnet", "model_conf": {"ctc_weight": 0.3, "lsm_weight": 0.1, "length_normalized_loss": False},
        "frontend": "default", "frontend_conf": FRONTEND_CONF,
        "specaug": "specaug", "specaug_conf": {"apply_time_warp": True, "time_warp_window": 5,
                                               "time_mask_width_range": [0, 40]},
        "normalize": "global_mvn", "normalize_conf": {"stats_file": "exp/asr_stats/train/feats_stats.npz"},
        "preencoder": None, "preencoder_conf": {},
        "encoder": "conformer", "encoder_conf": ENCODER_CONF,
        "postencoder": None, "postencoder_conf": {},
        "decoder": "transformer", "decoder_conf": DECODER_CONF,
        "required": ["output_dir", "token_list"], "version": "202511", "distributed": False,
    }
    (exp / "config.yaml").write_text(yaml.safe_dump(config))

    # The model ASRTask would build, assembled by hand from ESPnet's classes.
    from espnet2.asr.ctc import CTC
    from espnet2.asr.decoder.transformer_decoder import TransformerDecoder
    from espnet2.asr.encoder.conformer_encoder import ConformerEncoder
    from espnet2.asr.espnet_model import ESPnetASRModel
    from espnet2.asr.specaug.specaug import SpecAug
    from espnet2.layers.global_mvn import GlobalMVN
    from pasu.models.package import EspnetDefaultFrontend

    torch.manual_seed(1)
    frontend = EspnetDefaultFrontend(**FRONTEND_CONF)
    encoder = ConformerEncoder(input_size=80, **ENCODER_CONF)
    vocab = len(ESPNET_TOKENS)
    reference = ESPnetASRModel(
        vocab_size=vocab, token_list=ESPNET_TOKENS, frontend=frontend,
        specaug=SpecAug(**config["specaug_conf"]), normalize=GlobalMVN(stats_dir / "feats_stats.npz"),
        preencoder=None, encoder=encoder, postencoder=None,
        decoder=TransformerDecoder(vocab, 32, **DECODER_CONF), ctc=CTC(vocab, 32), joint_network=None,
        **config["model_conf"],
    ).eval()
    torch.save(reference.state_dict(), exp / "valid.acc.ave.pth")
    return exp / "config.yaml", exp / "valid.acc.ave.pth", reference
