"""The cloud server's settings: the shipped server.yaml, YAML then flags, mistakes."""

from __future__ import annotations

import pytest

from pasu.cli import build_parser
from pasu.cloud.cli import DEFAULT_CONFIG, config_from_args
from pasu.cloud.config import ServerConfig, TlsConfig, config_from_dict, load_config
from pasu.models.recognizer import DecodingOptions


def test_shipped_yaml_is_every_default_with_its_comment(template_problems):
    assert load_config(DEFAULT_CONFIG) == ServerConfig()  # values never drift from the dataclass
    assert template_problems(DEFAULT_CONFIG, ServerConfig()) == []


def test_the_default_config_is_the_shipped_file(capsys):
    args = build_parser().parse_args(["cloud", "serve", "--model", "m"])
    assert args.config == DEFAULT_CONFIG and config_from_args(args) == ServerConfig()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cloud", "serve", "--help"])
    assert f"  {DEFAULT_CONFIG}\n" in capsys.readouterr().out  # the help says where it is


def pem_files(folder, *names):
    """Placeholder PEM files: the settings check that they exist; only the server reads them."""
    for name in names:
        (folder / name).write_text("placeholder\n")
    return [str(folder / name) for name in names]


def test_yaml_then_flags(tmp_path):
    cert, key, ca = pem_files(tmp_path, "a.pem", "a.key", "ca.pem")
    (tmp_path / "tokens").write_text("# devices\nalpha\n\nbeta\n")
    (tmp_path / "cloud.yaml").write_text(
        "port: 6000\nmax_queue: 4\ndecoding: {beam_size: 12}\n"
        f"tls: {{cert: {cert}, key: {key}}}\nauth_token_file: {tmp_path / 'tokens'}\n")
    config = load_config(tmp_path / "cloud.yaml")
    assert (config.port, config.max_queue, config.decoding.beam_size) == (6000, 4, 12)
    assert config.decoding.ctc_weight == DecodingOptions().ctc_weight  # untouched fields keep defaults
    assert config.tls == TlsConfig(cert=cert, key=key) and config.tokens() == ("alpha", "beta")

    args = build_parser().parse_args(["cloud", "serve", "--model", "m", "--config", str(tmp_path / "cloud.yaml"),
                                      "--port", "7000", "--tls-client-ca", ca, "--beam-size", "4"])
    config = config_from_args(args)
    assert (config.port, config.max_queue, config.decoding.beam_size) == (7000, 4, 4)  # flags win, rest stays
    assert config.tls == TlsConfig(cert=cert, key=key, client_ca=ca)


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert", "{cert}"], "TLS needs both the server certificate and its key"),
    (["--tls-key", "{key}"], "TLS needs both the server certificate and its key"),
    (["--tls-cert", "{cert}", "--tls-key", "{folder}/missing.key"], "TLS key: no file .*missing.key"),
    (["--tls-cert", "{cert}", "--tls-key", "{key}", "--tls-client-ca", "{folder}/ca.pem"],
     "TLS client_ca: no file .*ca.pem"),
])
def test_serve_stops_on_bad_tls_flags_before_loading_the_model(tmp_path, flags, message):
    cert, key = pem_files(tmp_path, "server.pem", "server.key")
    flags = [flag.format(cert=cert, key=key, folder=tmp_path) for flag in flags]
    args = build_parser().parse_args(["cloud", "serve", "--model", str(tmp_path / "no-model"), *flags])
    with pytest.raises(SystemExit, match=f"^error: {message}"):
        args.run(args)


@pytest.mark.parametrize("raw, message", [
    ({"max_queu": 3}, r"unknown keys \['max_queu'\]"),
    ({"decoding": {"beam": 3}}, r"decoding: unknown keys \['beam'\]"),
    ({"tls": {"cert": "a.pem"}}, r"tls: .*missing 1 required positional argument: 'key'"),
    ({"tls": {"cert": "nowhere.pem", "key": "nowhere.key"}}, r"tls: TLS cert: no file nowhere.pem"),
    ({"port": "50051"}, r"port: expected int, got '50051'"),
    ({"auth_tokens": "abc"}, r"auth_tokens: expected a list"),
])
def test_mistakes_fail_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=f"^cloud config: {message}"):
        config_from_dict(raw)
    assert config_from_dict({}) == ServerConfig()


def test_serve_stops_on_a_bad_config_before_loading_the_model(tmp_path):
    (tmp_path / "cloud.yaml").write_text("decoding: {beam: 3}\n")
    args = build_parser().parse_args(["cloud", "serve", "--model", str(tmp_path / "no-model"),
                                      "--config", str(tmp_path / "cloud.yaml")])
    with pytest.raises(SystemExit, match=r"^error: .*cloud.yaml: decoding: unknown keys \['beam'\]"):
        args.run(args)


def test_serve_names_a_folder_that_holds_no_model(tmp_path):
    args = build_parser().parse_args(["cloud", "serve", "--model", str(tmp_path / "no-model"), "--port", "0"])
    with pytest.raises(SystemExit, match=r"^error: .*no-model: no model folder there"):
        args.run(args)
