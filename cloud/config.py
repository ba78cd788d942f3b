"""The cloud server's settings: one frozen dataclass, read from YAML, then overridden by command-line flags.

cloud/server.yaml (installed as pasu/cloud/server.yaml, `pasu cloud serve`'s default --config) holds every
field at its default, with its comment; a file of your own needs only what it changes:

    host: 0.0.0.0
    port: 50051
    max_batch_size: 8
    decoding: {beam_size: 10, ctc_weight: 0.3}
    tls: {cert: server.pem, key: server.key, client_ca: ca.pem}
    auth_token_file: /run/secrets/pasu-tokens
    text_intent: null      # no text second pass (default: auto, the shipped classifier when present)

Tokens are never written in the YAML itself: `auth_token_file` names a file with one token per line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pasu.config import from_dict, given, load_yaml
from pasu.models.recognizer import DecodingOptions
from pasu.settings import shipped_model

AUTO = "auto"  # text_intent: the shipped classifier when there is one


@dataclass(frozen=True)
class TlsConfig:
    """Server-side TLS; mutual TLS when `client_ca` is set."""

    cert: str  # PEM certificate chain of the server
    key: str  # PEM private key of the server
    client_ca: str | None = None  # PEM CA bundle; when set, clients must present a certificate it signed

    def __post_init__(self) -> None:
        # fail where the settings are read, before the model loads (as the device's ClientTls does)
        if not (self.cert and self.key):
            raise ValueError("TLS needs both the server certificate and its key (tls.cert and tls.key, "
                             "or --tls-cert and --tls-key)")
        for name, path in (("cert", self.cert), ("key", self.key), ("client_ca", self.client_ca)):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS {name}: no file {path}")

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """(cert, key, client CA) bytes, read once at start."""
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return Path(self.cert).read_bytes(), Path(self.key).read_bytes(), ca


@dataclass(frozen=True)
class ServerConfig:
    """Everything `pasu cloud serve` needs besides the model."""

    host: str = "127.0.0.1"  # listen address; 0.0.0.0 to serve other machines (then use TLS and tokens)
    port: int = 50051  # gRPC port; 0 picks a free one (tests)
    metrics_port: int | None = 9464  # Prometheus /metrics HTTP port on `host`; 0 picks a free one, None: off

    # Limits: reject what the model should never see, before it costs anything.
    max_message_bytes: int = 4 * 1024 * 1024  # gRPC receive limit per message (RESOURCE_EXHAUSTED beyond)
    max_audio_seconds: float = 30.0  # longest utterance accepted (OUT_OF_RANGE beyond); SLURP's are < 20 s
    min_audio_seconds: float = 0.1  # shortest (OUT_OF_RANGE below): the encoder's subsampling needs ~70 ms
    max_concurrent_rpcs: int | None = 256  # gRPC itself refuses RPCs beyond this (streams receiving audio too)
    # One client's RPCs in progress (client: its token, else its TLS certificate, else its IP; see
    # cloud/limits.py) beyond which it gets RESOURCE_EXHAUSTED; None: no limit. A device has one or two in
    # progress; the default leaves room for a gateway or a NAT in front of many, yet one client can never take
    # more than an eighth of max_concurrent_rpcs.
    max_streams_per_client: int | None = 32
    stream_idle_timeout_s: float = 10.0  # a stream silent this long is ended (OUT_OF_RANGE): it holds a slot
    max_stream_seconds: float = 60.0  # a stream open this long without EndOfAudio is ended (OUT_OF_RANGE)

    # Micro-batching and admission control (cloud/batching.py).
    max_batch_size: int = 8  # utterances per recognize_batch call
    max_batch_wait_ms: float = 10.0  # how long the first request of a batch waits for company
    max_queue: int = 32  # requests waiting for inference beyond which new ones get RESOURCE_EXHAUSTED

    # Security.
    tls: TlsConfig | None = None  # None: plaintext (loopback and tests only)
    auth_tokens: tuple[str, ...] = ()  # accepted bearer tokens (set programmatically; YAML uses the file)
    auth_token_file: str | None = None  # file with one accepted token per line; auth is on when any token exists

    # Lifecycle and logs.
    shutdown_grace_s: float = 10.0  # on SIGTERM: stop accepting, let in-flight requests finish for this long
    log_content: bool = False  # log transcripts and pilot hypotheses (debug only: user speech content)

    # Second pass: a text classifier re-reads each transcript and its intent replaces the recognizer's
    # (models/text_intent.py; the rule is TextIntentPass's in models/recognizer.py). A `pasu text-intent train`
    # folder; "auto": models/shipped/text_intent when it exists, else no second pass; None: no second pass.
    text_intent: str | None = AUTO

    decoding: DecodingOptions = field(default_factory=DecodingOptions)  # the recognizer's beam search

    def tokens(self) -> tuple[str, ...]:
        """Accepted tokens: `auth_tokens` plus the non-empty lines of `auth_token_file`."""
        tokens = list(self.auth_tokens)
        if self.auth_token_file:
            lines = Path(self.auth_token_file).read_text().splitlines()
            tokens += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return tuple(tokens)

    def text_intent_folder(self) -> Path | None:
        """The second pass's classifier folder, or None for none; FileNotFoundError for a folder that is not there."""
        if self.text_intent is None:
            return None
        if self.text_intent == AUTO:
            shipped = shipped_model("text_intent")
            return shipped if shipped.is_dir() else None
        folder = Path(self.text_intent)
        if not folder.is_dir():
            raise FileNotFoundError(f"text_intent: no classifier folder {folder} (`pasu text-intent train --out`)")
        return folder

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with `changes`; `None` values are ignored (an absent command-line flag)."""
        return dataclasses.replace(self, **given(**changes))


def config_from_dict(raw: Mapping[str, Any], where: str = "cloud config") -> ServerConfig:
    """ServerConfig from plain data (parsed YAML) over the defaults; unknown keys are errors, not ignored."""
    return from_dict(ServerConfig, raw, where, ServerConfig())


def load_config(path: str | os.PathLike | None) -> ServerConfig:
    """ServerConfig from a YAML file; the defaults when `path` is None."""
    return ServerConfig() if path is None else config_from_dict(load_yaml(path), str(path))
