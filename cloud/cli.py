"""`pasu cloud serve`: the cloud SLU server over a model folder (PASU package or Whisper)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

# `pasu cloud serve`'s default --config: every ServerConfig field at its default, with its comment.
DEFAULT_CONFIG = Path(__file__).with_name("server.yaml")


def register(sub: argparse._SubParsersAction) -> None:
    cloud = sub.add_parser(
        "cloud", help="the cloud server devices offload to",
        description="The cloud side of PASU: a gRPC server (pasu.v1.SpeechUnderstanding) that finishes the "
                    "utterances devices offload, with a larger model and a wider beam.",
        epilog="Example: pasu cloud serve --model models/shipped/cloud --port 50051")
    commands = cloud.add_subparsers(dest="cloud_command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve", help="serve a model folder over gRPC (pasu.v1.SpeechUnderstanding)",
        description="Serve SpeechUnderstanding over gRPC with micro-batching, admission control, deadlines,\n"
                    "optional TLS/mTLS and bearer tokens, gRPC health and reflection, and Prometheus metrics.\n"
                    "SIGTERM stops it gracefully: in-flight requests finish, new ones are refused.\n\n"
                    "Settings come from --config, then from the flags given. The default config,\n"
                    f"  {DEFAULT_CONFIG}\n"
                    "lists every field at its default with its comment: copy it, keep what you change.",
        epilog="Examples:\n"
               "  pasu cloud serve --model models/shipped/cloud --port 50051\n"
               "  pasu cloud serve --model models/shipped/cloud --text-intent exp/text_intent  # another classifier\n"
               "  pasu cloud serve --model models/shipped/device --lm models/shipped/lm --lm-weight 0.3  # with an LM\n"
               "  pasu cloud serve --model models/shipped/cloud --config my-server.yaml --host 0.0.0.0 \\\n"
               "      --tls-cert server.pem --tls-key server.key --token-file tokens.txt\n"
               "  grpcurl -plaintext 127.0.0.1:50051 list            # reflection\n"
               "  curl -s 127.0.0.1:9464/metrics | grep pasu_cloud_  # metrics",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--model", type=Path, required=True, help="model folder: a `pasu package` output, or a Whisper folder with whisper.yaml "
                            "(models/shipped/cloud, the shipped cloud model)")
    serve.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                       help="server YAML, any subset of ServerConfig's fields (default: %(default)s)")
    serve.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="gRPC port (default 50051; 0: any free port)")
    serve.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (default 9464)")
    serve.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    serve.add_argument("--max-batch-size", type=int, default=None, help="utterances per model call")
    serve.add_argument("--max-batch-wait-ms", type=float, default=None, help="wait for a batch to fill")
    serve.add_argument("--max-queue", type=int, default=None, help="waiting requests before RESOURCE_EXHAUSTED")
    serve.add_argument("--max-audio-seconds", type=float, default=None, help="longest utterance accepted")
    serve.add_argument("--max-streams-per-client", type=int, default=None,
                       help="concurrent calls of one client (token, certificate or IP) before RESOURCE_EXHAUSTED")
    serve.add_argument("--tls-cert", default=None, help="server certificate (PEM); needs --tls-key")
    serve.add_argument("--tls-key", default=None, help="server private key (PEM)")
    serve.add_argument("--tls-client-ca", default=None, help="require client certificates signed by this CA")
    serve.add_argument("--token-file", default=None, help="accepted bearer tokens, one per line")
    serve.add_argument("--beam-size", type=int, default=None, help="beam search width")
    serve.add_argument("--ctc-weight", type=float, default=None, help="CTC weight in joint decoding")
    serve.add_argument("--threads", type=int, default=None, help="torch threads for inference")
    serve.add_argument("--lm", default=None, metavar="DIR",
                       help="shallow fusion with this `pasu lm train` folder (over the model's token list)")
    serve.add_argument("--lm-weight", type=float, default=None, help="LM weight in joint decoding (default 0.3)")
    serve.add_argument("--grace", type=float, default=None, help="seconds in-flight requests get on SIGTERM")
    serve.add_argument("--log-content", action="store_true", help="log transcripts (debug only)")
    serve.add_argument("--text-intent", default=None, metavar="DIR",
                       help="second pass: this `pasu text-intent train` folder re-reads each transcript and answers "
                            "the intent (default: models/shipped/text_intent when it exists)")
    serve.add_argument("--no-text-intent", action="store_true", help="no text second pass: the recognizer's intent")
    serve.set_defaults(run=_serve)
    _register_gateway(commands)


def _register_gateway(commands: argparse._SubParsersAction) -> None:
    from pasu.cloud.gateway import UNDERSTAND_PATH, GatewayOptions

    defaults = GatewayOptions()
    gateway = commands.add_parser(
        "gateway", help="HTTP/JSON in front of the gRPC server: POST an audio file, get the answer as JSON",
        description="An HTTP server that forwards each uploaded audio file (WAV, FLAC, OGG, ...; any rate) to\n"
                    "`pasu cloud serve` over gRPC and answers JSON: transcript, intent, slots, confidence, model\n"
                    "id, timings. The caller's `Authorization: Bearer` header is forwarded; the server's status\n"
                    "codes become HTTP ones (400 bad audio, 401 token, 429 queue full, 503 unavailable, 504\n"
                    "deadline). GET /healthz: the gateway runs; GET /readyz: the cloud is serving.",
        epilog="Examples:\n"
               "  pasu cloud gateway --cloud 127.0.0.1:50051 --port 8080\n"
               f"  curl -s --data-binary @command.wav 'http://127.0.0.1:8080{UNDERSTAND_PATH}?utterance_id=u1'\n"
               "  pasu cloud gateway --cloud 10.0.0.5:50051,10.0.0.6:50051 --host 0.0.0.0  # two replicas",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    gateway.add_argument("--cloud", required=True,
                         help="cloud server address(es): host:port, several ip:port comma separated, or a gRPC "
                              "target such as dns:///pasu-cloud:50051")
    gateway.add_argument("--host", default=defaults.host, help="listen address (default %(default)s)")
    gateway.add_argument("--port", type=int, default=defaults.port, help="HTTP port (default %(default)s; 0: any)")
    gateway.add_argument("--deadline", type=float, default=10.0,
                         help="seconds the cloud gets per request, retries included (default %(default)s)")
    gateway.add_argument("--max-in-flight", type=int, default=defaults.max_in_flight,
                         help="requests answered at once before 429 (default %(default)s)")
    gateway.add_argument("--tls-ca", default=None,
                         help="TLS towards the cloud, its certificate signed by this CA (PEM); default plaintext")
    gateway.set_defaults(run=_gateway)


def config_from_args(args: argparse.Namespace):
    """ServerConfig: YAML (or defaults), then every flag that was given."""
    from pasu.cloud.config import TlsConfig, load_config
    from pasu.config import given

    config = load_config(args.config)
    tls = config.tls
    tls_flags = given(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
    if tls_flags:  # laid over the config's TLS settings; TlsConfig refuses an incomplete pair
        tls = TlsConfig(**{"cert": "", "key": "", **(dataclasses.asdict(tls) if tls else {}), **tls_flags})
    decoding = dataclasses.replace(config.decoding, **given(
        beam_size=args.beam_size, ctc_weight=args.ctc_weight, num_threads=args.threads, lm=args.lm,
        lm_weight=args.lm_weight))
    config = config.replace(
        host=args.host, port=args.port, metrics_port=args.metrics_port, max_batch_size=args.max_batch_size,
        max_batch_wait_ms=args.max_batch_wait_ms, max_queue=args.max_queue,
        max_audio_seconds=args.max_audio_seconds, max_streams_per_client=args.max_streams_per_client,
        auth_token_file=args.token_file, shutdown_grace_s=args.grace,
        log_content=args.log_content or None, tls=tls, decoding=decoding, text_intent=args.text_intent)
    if args.no_metrics:
        config = dataclasses.replace(config, metrics_port=None)
    if args.no_text_intent:
        config = dataclasses.replace(config, text_intent=None)
    return config


def _serve(args: argparse.Namespace) -> int:
    import warnings

    from pasu.models.recognizer import load_recognizer
    from pasu.cloud.server import configure_logging, serve

    # ESPnetASRModel.encode calls the deprecated torch.cuda.amp.autocast: not ours to fix, and not a log line.
    warnings.filterwarnings("ignore", category=FutureWarning, module="espnet2.asr.espnet_model")
    try:
        config = config_from_args(args)
        config.text_intent_folder()  # a classifier folder that is not there stops us before the model loads
    except (OSError, ValueError) as error:  # a missing file, an unknown key, a wrong value
        raise SystemExit(f"error: {error}") from None
    configure_logging(debug=args.verbose)
    try:
        recognizer = load_recognizer(args.model, config.decoding)
    except (OSError, ValueError) as error:  # e.g. no LM folder there, or an LM over another token list
        raise SystemExit(f"error: {error}") from None
    return serve(recognizer, config)


def _gateway(args: argparse.Namespace) -> int:
    import signal
    import threading

    from pasu.cloud.gateway import Gateway, GatewayOptions
    from pasu.cloud.server import configure_logging
    from pasu.device.cloud_client import ClientTls, CloudClient

    configure_logging(debug=args.verbose)
    try:
        tls = ClientTls(root_ca=args.tls_ca) if args.tls_ca else None
        client = CloudClient(args.cloud.split(","), deadline_s=args.deadline, tls=tls, client_id="pasu-gateway")
        gateway = Gateway(client, GatewayOptions(host=args.host, port=args.port, max_in_flight=args.max_in_flight))
    except (OSError, ValueError) as error:  # a port in use, a missing CA file, a bad address list
        raise SystemExit(f"error: {error}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with gateway, client:
        logging.getLogger("pasu.gateway").info("serving", extra={"fields": {"url": gateway.url,
                                                                          "cloud": client.target}})
        stop.wait()
    return 0
