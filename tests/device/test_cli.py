"""`pasu device run`: --config, then the flags given."""

from __future__ import annotations

import pytest
import torch

from pasu.cli import build_parser
from pasu.device.cli import DEFAULT_CONFIG, config_from_args
from pasu.settings import SHIPPED_LM_WEIGHT
from pasu.device.config import DeviceConfig


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.fixture
def agent_yaml(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("agent: {pilot: {enabled: false, interval_seconds: 2.0}}\n"
                    "routing: {cloud: ['a:1'], policy: all, threshold: 5.0}\n")
    return path


def test_the_default_config_is_the_shipped_file(parser, capsys):
    args = parser.parse_args(["device", "run", "--audio", "x.wav"])
    assert args.config == DEFAULT_CONFIG and DEFAULT_CONFIG.is_file()
    assert config_from_args(args) == DeviceConfig()
    with pytest.raises(SystemExit):
        parser.parse_args(["device", "run", "--help"])
    assert f"  {DEFAULT_CONFIG}\n" in capsys.readouterr().out  # the help says where it is


def test_yaml_then_flags(parser, agent_yaml):
    config = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--config", str(agent_yaml)]))
    pilot, routing = config.agent.pilot, config.routing
    assert (pilot.enabled, pilot.interval_seconds) == (False, 2.0)
    assert (routing.cloud, routing.policy, routing.threshold) == (("a:1",), "all", 5.0)

    config = config_from_args(parser.parse_args(
        ["device", "run", "--audio", "x.wav", "--config", str(agent_yaml),
         "--pilots", "--tau", "0.5", "--cloud", "b:2,c:3", "--policy", "ppl+intent", "--intent-threshold", "0.4",
         "--encoding", "opus"]))
    pilot, routing = config.agent.pilot, config.routing
    assert (pilot.enabled, pilot.interval_seconds) == (True, 0.5)  # flags win
    assert (routing.cloud, routing.policy, routing.encoding) == (("b:2", "c:3"), "ppl+intent", "opus")
    assert (routing.threshold, routing.intent_threshold) == (5.0, 0.4)  # the yaml's threshold stays
    assert pilot.search == DeviceConfig().agent.pilot.search

    config = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--no-pilots"]))
    assert not config.agent.pilot.enabled


def test_a_length_bonus_reaches_the_final_decode_only(parser, agent_yaml):
    config = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--config", str(agent_yaml),
                                                 "--length-bonus", "1.0"]))
    assert config.agent.final_search.length_bonus == 1.0
    assert config.agent.pilot.search.length_bonus == 0.0 and not config.agent.pilot.enabled  # the yaml's pilots


def test_a_bad_config_fails_before_anything_runs(parser, tmp_path, capsys):
    (tmp_path / "agent.yaml").write_text("agent: {pilot: {tua: 0.5}}\n")
    args = parser.parse_args(["device", "run", "--audio", "missing.wav", "--config", str(tmp_path / "agent.yaml"),
                              "--model", str(tmp_path / "no-model")])
    assert args.run(args) == 2
    assert "agent.pilot: unknown keys ['tua']" in capsys.readouterr().err


def test_run_follows_the_config_and_the_flags(parser, tmp_path, capsys, cloud_support, speech_like):
    import json

    import soundfile

    model = cloud_support.write_model_folder(tmp_path / "model")
    # 4 s: pilots due at 1.5, 2.5 and 3.5 s, so one finishes before the end even on a machine busy with other work
    # (with 2.5 s the lone scheduled pilot was abandoned when a refit shared the cores)
    soundfile.write(tmp_path / "utt.wav", speech_like(4.0), 16000)
    (tmp_path / "agent.yaml").write_text(  # nothing listens on port 9: every offload falls back
        "agent: {cloud_deadline_s: 0.3, pilot: {enabled: false}, threads: 2}\n"
        "routing: {cloud: ['127.0.0.1:9'], policy: all}\n")
    command = ["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(model),
               "--config", str(tmp_path / "agent.yaml"), "--json"]

    def run(*flags: str) -> dict:
        args = parser.parse_args([*command, *flags])
        assert args.run(args) == 0
        return json.loads(capsys.readouterr().out)

    result = run()
    assert (result["route"], result["pilots"]) == ("fallback", 0)
    assert torch.get_num_threads() == 2  # agent.threads (the suite runs with one; conftest restores it)
    result = run("--pilots", "--policy", "on-device")
    assert result["route"] == "local" and result["pilots"] > 0


def test_several_files_are_answered_in_turn_as_json_lines_and_a_bad_one_costs_only_its_own(
        parser, tmp_path, capsys, cloud_support, speech_like):
    import json

    import soundfile

    model = cloud_support.write_model_folder(tmp_path / "model")
    for name, seconds in (("a.wav", 2.0), ("c.flac", 3.0)):
        soundfile.write(tmp_path / name, speech_like(seconds), 16000)
    (tmp_path / "b.wav").write_text("not audio")
    files = [str(tmp_path / n) for n in ("a.wav", "b.wav", "c.flac")]
    args = parser.parse_args(["device", "run", "--audio", *files, "--model", str(model), "--json"])
    assert args.run(args) == 2  # one file could not be read: said, and the exit status says so
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["audio"] for line in lines] == [files[0], files[2]]
    assert [round(line["audio_seconds"]) for line in lines] == [2, 3] and all(line["text"] is not None
                                                                              for line in lines)
    assert f"error: {files[1]}:" in captured.err

    args = parser.parse_args(["device", "run", "--audio", files[0], files[2], "--model", str(model)])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("transcript :") == 2 and f"== {files[2]}" in out
    args = parser.parse_args(["device", "run", "--audio", *files, "--model", str(model), "--plot", "t.png"])
    assert args.run(args) == 2 and "one --audio file" in capsys.readouterr().err


def test_run_pilots_an_ordinary_espnet_checkpoint(parser, tmp_path, capsys, cloud_support, speech_like):
    """A user's ESPnet training output, named by its .pth (an untrained Conformer: no streaming encoder, so each
    pilot re-encodes the audio so far)."""
    import json

    import soundfile

    _, weights, _ = cloud_support.write_espnet_run(tmp_path / "recipe")
    soundfile.write(tmp_path / "utt.wav", speech_like(4.0), 16000)
    args = parser.parse_args(["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(weights),
                              "--json"])
    assert args.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["route"] == "local" and result["pilots"] > 0


def fit_intent_check(folder):
    """The intent reader and the model of the intent check over its evidence, as `pasu offramp train` writes."""
    import numpy as np
    from pasu.device.intent_offramp import INTENT_EVIDENCE, IntentErrorModel
    from pasu.models.intent_reader import IntentReader, ReaderOptions

    IntentReader.fit(["wake me up at five", "play the radio"], ["alarm_set", "play_radio"],
                     ReaderOptions(min_df=1)).save(folder)
    rows = np.random.default_rng(0).uniform(size=(8, len(INTENT_EVIDENCE)))
    IntentErrorModel.fit(rows, np.array([0, 1] * 4)).save(folder)


def fit_bilstm(folder):
    import numpy as np
    from pasu.device import bilstm_offramp
    from pasu.device.offramp_net import TrainOptions

    sequences = [np.full((3, 2), -0.1 * i, np.float32) for i in range(4)]
    bilstm_offramp.train(sequences, np.array([0, 0, 1, 1], np.float32), TrainOptions(epochs=1)).save(folder)


@pytest.mark.parametrize("policy, threshold_flag, fit", [("intent", "--intent-threshold", fit_intent_check),
                                                         ("bilstm", "--threshold", fit_bilstm)])
def test_a_policy_reads_its_offramp_from_the_model(parser, tmp_path, capsys, cloud_support, speech_like, policy,
                                                   threshold_flag, fit):
    """Without `pasu offramp train`'s output the policy stops and says what to run; with it, it routes by the
    threshold."""
    import json

    import soundfile

    model = cloud_support.write_model_folder(tmp_path / "model")
    soundfile.write(tmp_path / "utt.wav", speech_like(2.5), 16000)

    def run(threshold: float) -> int:  # nothing listens on port 9: an offload falls back
        args = parser.parse_args(["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(model),
                                  "--cloud", "127.0.0.1:9", "--policy", policy, threshold_flag, str(threshold),
                                  "--json"])
        return args.run(args)

    def route(threshold: float) -> str:
        assert run(threshold) == 0
        return json.loads(capsys.readouterr().out)["route"]

    assert run(0.5) == 2  # no `pasu offramp train` output in the model folder yet
    assert "pasu offramp train" in capsys.readouterr().err
    fit(model / "offramp")
    # scores lie in [0, 1] (the BiLSTM's x 2.5 s): above -1 always (offload, then fall back), above 3 never (local)
    assert (route(-1.0), route(3.0)) == ("fallback", "local")


def test_the_late_bilstm_policy_reads_the_network_fitted_on_full_decodes(parser, tmp_path, capsys, cloud_support,
                                                                         speech_like):
    import json

    import soundfile
    import torch
    from pasu.device.bilstm_offramp import BiLstmNet, BiLstmOfframp, LateBiLstmOfframp

    def network(kind: type[BiLstmOfframp], bias: float) -> None:  # scores about sigmoid(bias), whatever it reads
        net = BiLstmNet()
        with torch.no_grad():
            net.head.weight.zero_()
            net.head.bias.fill_(bias)
        kind(net).save(model / "offramp")

    model = cloud_support.write_model_folder(tmp_path / "model")
    soundfile.write(tmp_path / "utt.wav", speech_like(2.5), 16000)

    def score(policy: str) -> float:  # nothing listens on port 9: an offload falls back
        args = parser.parse_args(["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(model),
                                  "--cloud", "127.0.0.1:9", "--policy", policy, "--threshold", "1.0", "--json"])
        assert args.run(args) == 0
        return json.loads(capsys.readouterr().out)["offramp_score"]

    network(BiLstmOfframp, -20.0)
    assert score("bilstm-late") == pytest.approx(0.0, abs=1e-6)  # a folder from before the late network
    network(LateBiLstmOfframp, 20.0)
    late = score("bilstm-late")  # P = 1 x the full decode's tokens (<eos> included): a hypothesis of the whole input
    assert late >= 1 and late == pytest.approx(round(late), abs=1e-3)
    assert score("bilstm") == pytest.approx(0.0, abs=1e-6)  # the pilots' network still judges the pilot


def test_thresholds_default_to_the_models_calibration(parser, tmp_path, capsys, cloud_support, speech_like):
    import json

    import soundfile
    from pasu.device.offramp_train import CALIBRATION_VERSION

    model = cloud_support.write_model_folder(tmp_path / "model")
    soundfile.write(tmp_path / "utt.wav", speech_like(2.5), 16000)
    command = ["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(model),
               "--cloud", "127.0.0.1:9", "--policy", "ppl", "--no-pilots", "--json"]
    args = parser.parse_args(command)
    assert args.run(args) == 2  # not calibrated, no --threshold: nothing to compare the perplexity with
    assert "routing.threshold" in capsys.readouterr().err

    def route(levels: tuple[float, float, float], *flags: str) -> str:
        """The route with Offload-L/M/H calibrated at these perplexity thresholds."""
        (model / "offramp").mkdir(exist_ok=True)
        report = {"calibration_version": CALIBRATION_VERSION, "ppl": cloud_support.offramp_levels(*levels)}
        (model / "offramp" / "offramp.json").write_text(json.dumps(report))
        args = parser.parse_args([*command, *flags])
        assert args.run(args) == 0  # nothing listens on port 9: an offload falls back
        return json.loads(capsys.readouterr().out)["route"]

    assert (route((9e9, -1.0, 9e9)), route((-1.0, 9e9, -1.0))) == ("fallback", "local")  # Offload-M by default
    assert (route((9e9, -1.0, 9e9), "--level", "L"), route((9e9, -1.0, 9e9), "--level", "H")) == ("local", "local")
    assert route((-1.0, 9e9, 9e9), "--level", "L") == "fallback"


def test_lm_flags(parser):
    config = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--lm", "some/lm",
                                                 "--lm-weight", "0.2"]))
    assert (config.agent.lm, config.agent.final_search.lm_weight) == ("some/lm", 0.2)
    assert config.agent.pilot.search.lm_weight == 0.0  # pilots stay as they were
    assert config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav"])).agent.lm == ""
    # --lm alone fuses the LM at the shipped one's weight, instead of loading it to weigh nothing
    alone = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--lm", "some/lm"]))
    assert alone.agent.final_search.lm_weight == SHIPPED_LM_WEIGHT > 0
    off = config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", "--lm", "some/lm",
                                              "--lm-weight", "0"]))
    assert off.agent.final_search.lm_weight == 0.0  # an explicit weight wins


def test_tls_flags_over_the_yaml(parser, tmp_path, cloud_support):
    from pasu.device.cloud_client import ClientTls

    pki = cloud_support.make_pki(tmp_path)
    (tmp_path / "agent.yaml").write_text(f"routing: {{tls: {{root_ca: {pki.ca}}}}}\n")

    def tls(*flags: str, config: str | None = None) -> ClientTls | None:
        extra = ["--config", config] if config else []
        return config_from_args(parser.parse_args(["device", "run", "--audio", "x.wav", *extra, *flags])).routing.tls

    assert tls() is None  # plaintext unless asked
    assert tls("--tls") == ClientTls()  # the system's root certificates
    assert tls(config=str(tmp_path / "agent.yaml")) == ClientTls(root_ca=str(pki.ca))
    mutual = tls("--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key), "--tls-server-name", "cloud",
                 config=str(tmp_path / "agent.yaml"))
    assert mutual == ClientTls(str(pki.ca), str(pki.client_cert), str(pki.client_key), "cloud")  # the yaml's CA stays


@pytest.mark.parametrize("flags, config, message", [
    (["--tls-cert", "{client_cert}"], "", "needs both the client certificate and its key"),
    (["--tls-ca", "{missing}"], "", "TLS root_ca: no file"),
    ([], "routing: {tls: {key: '{missing}', cert: '{client_cert}'}}", "routing.tls: TLS key: no file"),
])
def test_bad_tls_settings_fail_before_anything_runs(parser, tmp_path, capsys, cloud_support, flags, config,
                                                    message):
    pki = cloud_support.make_pki(tmp_path)

    def filled(text: str) -> str:  # not str.format: the YAML has braces of its own
        return text.replace("{client_cert}", str(pki.client_cert)).replace("{missing}", str(tmp_path / "missing.pem"))

    (tmp_path / "agent.yaml").write_text(filled(config))
    args = parser.parse_args(["device", "run", "--audio", "missing.wav", "--config", str(tmp_path / "agent.yaml"),
                              "--model", str(tmp_path / "no-model"), *map(filled, flags)])
    assert args.run(args) == 2
    assert message in capsys.readouterr().err


def test_run_offloads_over_mutual_tls(parser, tmp_path, capsys, cloud_support, speech_like, start_server):
    """The flags reach the channel: a server that asks for client certificates answers the device that shows
    one, and the device without one falls back to its own answer."""
    import json

    import soundfile
    from pasu.cloud.config import TlsConfig

    pki = cloud_support.make_pki(tmp_path)
    server = start_server(tls=TlsConfig(cert=str(pki.server_cert), key=str(pki.server_key), client_ca=str(pki.ca)))
    model = cloud_support.write_model_folder(tmp_path / "model")
    soundfile.write(tmp_path / "utt.wav", speech_like(1.0), 16000)

    def route(*tls_flags: str) -> str:
        args = parser.parse_args(["device", "run", "--audio", str(tmp_path / "utt.wav"), "--model", str(model),
                                  "--cloud", f"127.0.0.1:{server.port}", "--policy", "all", "--no-pilots", "--json",
                                  "--tls-ca", str(pki.ca), *tls_flags])
        assert args.run(args) == 0
        return json.loads(capsys.readouterr().out)["route"]

    assert route("--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)) == "cloud"
    assert route() == "fallback"  # the handshake fails without a client certificate
