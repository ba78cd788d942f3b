"""`pasu device`: run the device agent on a file or the microphone, and draw its timelines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pasu.config import given
from pasu.settings import SHIPPED_LM_WEIGHT, shipped_model

# routing.PolicyName's values, written out: importing routing here would load torch for every `pasu` command
POLICIES = ("on-device", "all", "naive", "ppl", "ppl-end", "ppl-late", "bilstm", "bilstm-end", "bilstm-late",
            "intent", "ppl+intent", "bilstm+intent")

if TYPE_CHECKING:
    from pasu.device.agent import AgentOptions
    from pasu.device.cloud_client import ClientTls
    from pasu.device.config import DeviceConfig
    from pasu.device.runtime import DeviceModel

# `pasu device run`'s default --config: every DeviceConfig field at its default, with its comment.
DEFAULT_CONFIG = Path(__file__).with_name("agent.yaml")


def register(sub: argparse._SubParsersAction) -> None:
    device = sub.add_parser("device", help="run the device agent (pilot decoding, offloading) on audio",
                            description="The device agent: streaming ingestion, pilot inference while the "
                                        "user speaks, and at end of speech a local answer or an offload.",
                            epilog="Example: pasu device run --audio sample.wav")
    commands = device.add_subparsers(dest="device_command", metavar="COMMAND", required=True)
    _add_run(commands)
    _add_timeline(commands)


def add_lm_flags(parser: argparse.ArgumentParser, note: str = "") -> None:
    """--lm and --lm-weight: a token LM fused into the device agent's final local decode (resolved by
    pasu.device.agent.fusing_lm: --lm alone fuses at the config's weight, else the shipped LM's); `note` ends --lm's
    help."""
    parser.add_argument("--lm", default=None, metavar="DIR",
                        help="token LM folder (`pasu lm train`, e.g. models/shipped/lm) fused into the final local "
                             f"decode{note}")
    parser.add_argument("--lm-weight", type=float, default=None,
                        help="the LM's weight in the final decode (default with --lm: the agent config's where it "
                             f"sets one, else the shipped LM's {SHIPPED_LM_WEIGHT})")


def add_pilot_flags(parser: argparse.ArgumentParser, tau_note: str = "", pilots_note: str = "",
                    pause_note: str = "") -> None:
    """--tau, --pilots / --no-pilots and --pause-pilot: when the device agent runs pilots (laid over its options
    by pasu.device.agent.with_pilots); the notes end each flag's help."""
    parser.add_argument("--tau", type=float, default=None,
                        help=f"seconds of audio between pilots{tau_note}; default 1.0")
    parser.add_argument("--pilots", action=argparse.BooleanOptionalAction, default=None,
                        help=f"pilot inference while the user speaks{pilots_note}; default on; --no-pilots: a plain "
                             "decode at the end, whose hypothesis the offramps then judge")
    parser.add_argument("--pause-pilot", action=argparse.BooleanOptionalAction, default=None,
                        help=f"one more pilot, on all the audio, when the endpointer hears the speaker pause, inside "
                             f"the silence it waits before declaring the end of speech{pause_note}; a replay of a "
                             "file models the shipped VAD after the file's end; default on (--no-pause-pilot: the paper's "
                             "schedule alone)")


def add_replay_flags(parser: argparse.ArgumentParser, lm_note: str) -> None:
    """The agent's flags that change what a replay of it answers and judges: the LM and the pilots' schedule
    (read back by replay_options); and how many processes replay."""
    add_lm_flags(parser, lm_note)
    add_pilot_flags(parser)
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes replaying utterances at once, one torch thread each (default 1): the same "
                             "answers in half the time with 2 on 2 cores. Replays time their stages, so give each a "
                             "core, and compare latencies between runs with the same --jobs (on the build machine 2 "
                             "measured 0.8-0.9x the latencies of 1)")


def replay_options(model: DeviceModel, args: argparse.Namespace) -> AgentOptions:
    """The agent's default options with add_replay_flags' flags laid over them, the LM loaded into `model`."""
    from pasu.device.agent import agent_with_lm, with_pilots

    return with_pilots(agent_with_lm(model, args.lm, args.lm_weight), args.pilots, args.tau, args.pause_pilot)


def _add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run", help="understand audio files (or the microphone) and print the results",
        description="Feed audio to the device agent and print the transcript, intent, slots and route.\n\n"
                    "Settings come from --config, then from the flags given. The default config,\n"
                    f"  {DEFAULT_CONFIG}\n"
                    "lists every field at its default with its comment: copy it, keep what you change.",
        epilog="Examples:\n"
               "  pasu device run --audio sample.wav\n"
               "  pasu device run --audio a.wav b.wav c.flac --json   # one model load, a JSON line each\n"
               "  pasu device run --audio sample.flac --realtime --timeline t.json --plot t.png\n"
               "  pasu device run --audio sample.wav --cloud 127.0.0.1:50051\n"
               "  pasu device run --audio sample.wav --cloud 127.0.0.1:50051 --policy ppl --threshold 3.0\n"
               "  pasu device run --audio sample.wav --cloud cloud.example:443 --tls-ca ca.pem "
               "--tls-cert device.pem --tls-key device.key\n"
               "  pasu device run --audio sample.wav --config my-agent.yaml --tau 0.5\n"
               "  pasu device run --audio sample.wav --lm models/shipped/lm --lm-weight 0.2\n"
               "  pasu device run --mic            # needs the 'mic' extra (sounddevice)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--audio", type=Path, nargs="+",
                        help="audio file(s) (WAV, FLAC, OGG, ...; any rate, mono or stereo), answered in turn by "
                             "one agent; with --json one line each (JSONL)")
    source.add_argument("--mic", action="store_true", help="live microphone; prints pilot hypotheses as they come")
    run.add_argument("--model", type=Path, default=shipped_model("device"),
                     help="device model: a packaged folder, or an ordinary ESPnet checkpoint "
                          "(exp/asr_*/valid.acc.ave.pth, read with the config.yaml beside it); default: %(default)s")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                     help="agent YAML, any subset of DeviceConfig's fields (default: %(default)s)")
    run.add_argument("--realtime", action="store_true",
                     help="feed the file at real-time pace (default: replay on a virtual clock, same rules)")
    run.add_argument("--vad", action="store_true", help="end the utterance at the VAD's end of speech")
    add_pilot_flags(run, " (agent.pilot.interval_seconds)", " (agent.pilot.enabled)", " (agent.pilot.at_pause)")
    run.add_argument("--cloud", default=None,
                     help="cloud server address(es), comma separated host:port (routing.cloud; default: none)")
    run.add_argument("--token", default=None, help="bearer token for the cloud server (overrides routing.token_file)")
    run.add_argument("--tls", action="store_true",
                     help="TLS towards the cloud with the system's root certificates (routing.tls; the other "
                          "--tls-* flags turn it on too)")
    run.add_argument("--tls-ca", default=None, help="CA (PEM) that signed the cloud's certificate (routing.tls.root_ca)")
    run.add_argument("--tls-cert", default=None,
                     help="client certificate (PEM) for mutual TLS; needs --tls-key (routing.tls.cert)")
    run.add_argument("--tls-key", default=None, help="the client certificate's private key (PEM; routing.tls.key)")
    run.add_argument("--tls-server-name", default=None,
                     help="name to verify in the cloud's certificate instead of the address's host "
                          "(routing.tls.server_name)")
    run.add_argument("--policy", choices=POLICIES, default=None,
                     help="offloading policy when there is a cloud (routing.policy; default ppl+intent; the ones "
                          "with intent read routing.intent_threshold; naive offloads a random routing.naive_share; "
                          "-end judges the end-of-speech pilot, a few ms after the whole input's encode; -late the "
                          "full local decode, as the paper's deciding-late baseline)")
    run.add_argument("--threshold", type=float, default=None,
                     help="the word check's score x speech seconds above which ppl, bilstm and their +intent "
                          "policies offload: the last pilot's perplexity, or the BiLSTM's P(local WER > 0.1) "
                          "(routing.threshold; default: the model's, calibrated at --level, MODEL/offramp)")
    run.add_argument("--intent-threshold", type=float, default=None,
                     help="the intent check's P(the device's intent is wrong) for the last pilot (not weighed by "
                          "length) above which intent and the +intent policies offload (routing.intent_threshold; "
                          "default: the model's, calibrated at --level)")
    run.add_argument("--level", choices=("L", "M", "H"), default=None,
                     help="the calibrated operating point for the thresholds not given: the paper's Offload-L, -M "
                          "or -H, which offloaded 25%%, 47%% or 63%% of the model's dev calibration utterances "
                          "(routing.level; default M)")
    add_lm_flags(run, " (agent.lm; its weight: agent.final_search.lm_weight)")
    run.add_argument("--length-bonus", type=float, default=None, metavar="B",
                     help="added per token in the final local decode (agent.final_search.length_bonus, ESPnet's "
                          "`penalty`; default 0): 1.0 answers more accurately and about 20 ms later at the median, "
                          "as any B > 0 turns the decided stop off (README: \"Accuracy for time, opt-in\")")
    # float32 is left out: twice pcm16's bytes for no accuracy a microphone's 16 bits do not already give
    run.add_argument("--encoding", choices=("pcm16", "flac", "opus"), default=None,
                     help="how the waveform is uploaded (routing.encoding; opus for slow uplinks)")
    run.add_argument("--timeline", type=Path, default=None, help="write the event timeline as JSON")
    run.add_argument("--plot", type=Path, default=None, help="draw the timeline as a PNG")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.set_defaults(run=_run)


def _add_timeline(commands: argparse._SubParsersAction) -> None:
    timeline = commands.add_parser("timeline", help="draw a timeline JSON (from `run --timeline`) as a PNG",
                                   epilog="Example: pasu device timeline t.json --out t.png")
    timeline.add_argument("path", type=Path, help="timeline JSON")
    timeline.add_argument("--out", type=Path, default=None, help="PNG to write (default: PATH with .png)")
    timeline.set_defaults(run=_timeline)


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    """DeviceConfig: YAML (or defaults), then every flag that was given."""
    from dataclasses import replace

    from pasu.device.agent import fusing_lm, with_pilots
    from pasu.device.config import load_config

    config = load_config(args.config)
    cloud = tuple(args.cloud.split(",")) if args.cloud is not None else None
    routing = replace(config.routing, **given(cloud=cloud, policy=args.policy, threshold=args.threshold,
                                              intent_threshold=args.intent_threshold, level=args.level,
                                              encoding=args.encoding,
                                              tls=_tls(args, config.routing.tls)))
    agent = fusing_lm(with_pilots(config.agent, args.pilots, args.tau, args.pause_pilot), args.lm, args.lm_weight)
    if args.length_bonus is not None:
        agent = replace(agent, final_search=replace(agent.final_search, length_bonus=args.length_bonus))
    return replace(config, agent=agent, routing=routing)


def _tls(args: argparse.Namespace, base: ClientTls | None) -> ClientTls | None:
    """The config's TLS settings with the --tls* flags given laid over them (any of them turns TLS on)."""
    from dataclasses import replace

    from pasu.device.cloud_client import ClientTls

    tls_flags = given(root_ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name)
    if not (tls_flags or args.tls):
        return base
    return replace(base or ClientTls(), **tls_flags)


def _run(args: argparse.Namespace) -> int:
    from pasu.device.assemble import open_agent
    from pasu.device.audio import AudioError

    several = args.audio is not None and len(args.audio) > 1
    if several and (args.timeline or args.plot):
        print("error: --timeline and --plot draw one utterance: give one --audio file", file=sys.stderr)
        return 2
    try:
        # no model, offramps the policy needs and the model lacks, a threshold neither set nor calibrated, an LM
        # that does not fit: each says what to do
        agent = open_agent(args.model, config_from_args(args), args.token)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = 0
    with agent:
        for audio_file in args.audio or [None]:
            try:
                result = _from_microphone(agent, args) if args.mic else _answer_file(agent, audio_file, args)
            except AudioError as error:  # one bad file among many costs only its own answer
                print(f"error: {audio_file}: {error}" if several else f"error: {error}", file=sys.stderr)
                failed += 1
                continue
            _report(result, args, audio_file if several else None)
    return 2 if failed else 0


def _answer_file(agent, audio_file: Path, args: argparse.Namespace):
    from pasu.device.agent import play_realtime, replay
    from pasu.device.audio import load_audio

    audio = load_audio(audio_file)
    if args.vad:
        audio = _until_end_of_speech(audio, agent.options.pilot.at_pause)
    if args.realtime:
        return play_realtime(agent, audio, str(audio_file))
    return replay(agent.model, audio, agent.options, agent.policy, agent.cloud, utterance_id=str(audio_file))


def _until_end_of_speech(audio, speech_only: bool = False):
    """The audio up to where the VAD declares end of speech (all of it when it never does); `speech_only`: up to
    where its speech ended, since a replay with the pause pilot models the endpointer's silence after the audio."""
    from pasu.device.audio import SAMPLE_RATE
    from pasu.device.vad import Endpointer

    endpointer = Endpointer()
    step = SAMPLE_RATE // 10
    for i in range(0, len(audio), step):
        if endpointer.accept(audio[i : i + step]):
            return audio[: round(endpointer.last_speech_end * SAMPLE_RATE)] if speech_only else audio[: i + step]
    return audio


def _from_microphone(agent, args: argparse.Namespace):
    """Feed the microphone until the VAD says the speaker is done, printing pilot hypotheses on the way."""
    try:
        import sounddevice
    except ImportError:
        raise SystemExit("error: --mic needs the 'mic' extra: pip install 'pasu[mic]' (sounddevice)") from None
    import queue

    from pasu.device.audio import SAMPLE_RATE
    from pasu.device.vad import Endpointer

    chunks: queue.Queue = queue.Queue()
    endpointer = Endpointer()
    pause_seconds = agent.options.pilot.pause_seconds
    shown, paused = "", False
    print("listening... (speak; it ends after 0.6 s of silence)", file=sys.stderr)
    with sounddevice.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32",
                                 blocksize=SAMPLE_RATE // 10, callback=lambda data, *_: chunks.put(data[:, 0].copy())):
        while True:
            chunk = chunks.get()
            agent.feed(chunk)
            if agent.partial() != shown:
                shown = agent.partial()
                print(f"  pilot @ {agent.seconds:.1f}s: {shown}", file=sys.stderr)
            if endpointer.accept(chunk):
                return agent.end()
            # the pause pilot (agent.pilot.at_pause) on the first silence long enough, once per pause
            if endpointer.speech_s and endpointer.silence_s >= pause_seconds and not paused:
                agent.pause()
            paused = endpointer.silence_s >= pause_seconds


def _report(result, args: argparse.Namespace, audio_file: Path | None = None) -> None:
    """Print one answer; `audio_file` (one of several): a JSON line naming it, or the text under its name."""
    from pasu.device.timeline import plot_timeline

    if args.timeline:
        result.timeline.save(args.timeline)
    if args.plot:
        plot_timeline(result.timeline, args.plot, title=result.text)
    if args.json:
        fields = {"text": result.text, "intent": result.intent, "slots": [list(s) for s in result.slots],
                  "confidence": result.confidence, "route": result.route, "reason": result.reason,
                  "offramp_score": result.offramp_score,
                  "latency_ms": 1000 * result.latency, "audio_seconds": result.audio_seconds,
                  "pilots": result.pilots, "pilot_text": result.pilot_text,
                  "timings_ms": {k: 1000 * v for k, v in result.timings.items()}}
        if audio_file is None:
            print(json.dumps(fields, indent=1))
        else:
            print(json.dumps({"audio": str(audio_file), **fields}), flush=True)
        return
    slots = ", ".join(f"{s[0]}={s[1]}" for s in result.slots) or "-"
    print(f"== {audio_file}\n" if audio_file is not None else "", end="")
    print(f"transcript : {result.text}\nintent     : {result.intent}\nslots      : {slots}\n"
          f"confidence : {result.confidence:.2f}\nroute      : {result.route} ({result.reason})\n"
          f"latency    : {1000 * result.latency:.0f} ms after end of speech "
          f"({result.audio_seconds:.2f} s of audio, {result.pilots} pilots; last pilot: {result.pilot_text!r})",
          flush=True)


def _timeline(args: argparse.Namespace) -> int:
    from pasu.device.timeline import Timeline, plot_timeline

    out = plot_timeline(Timeline.load(args.path), args.out or args.path.with_suffix(".png"))
    print(f"wrote {out}")
    return 0
