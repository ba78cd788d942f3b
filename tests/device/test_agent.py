"""The device agent end to end: virtual-clock replay, the live feed/end API, routing to a real cloud server."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pasu.cloud.config import ServerConfig
from pasu.cloud.server import ServerThread
from pasu.device.agent import (
    AgentOptions,
    DeviceAgent,
    LocalAnswers,
    PilotOptions,
    Session,
    VirtualClock,
    espnet_search_for,
    play_realtime,
    replay,
)
from pasu.device.audio import AudioError
from pasu.device.cloud_client import CloudClient
from pasu.device.decoding.search import SearchOptions
from pasu.device.offramp_train import OFFRAMP_DIR, load_device_model
from pasu.device.routing import AllOffload, OfframpPolicy, OnDevice, PerplexityOfframp
from pasu.device.runtime import DeviceModel
from pasu.device.timeline import Timeline, plot_timeline
from pasu.device.vad import VadOptions

NO_PILOTS = AgentOptions(pilot=PilotOptions(enabled=False), final_search=SearchOptions())
SCHEDULED = AgentOptions(pilot=PilotOptions(at_pause=False))  # the paper's pilots: none in the endpointer's wait


def test_replay_runs_pilots_during_ingestion_and_times_what_follows_end_of_speech(tiny_model, speech_like, tmp_path):
    paper = PilotOptions(interval_seconds=0.5, at_pause=False)  # the replay's endpointer an oracle (module doc)
    result = replay(tiny_model, speech_like(2.8, seed=1), AgentOptions(pilot=paper))
    assert result.pilots >= 2
    assert result.route == "local" and result.latency > 0
    kinds = {e.kind for e in result.timeline.events}
    assert {"ingest", "pilot", "encode", "decode"} <= kinds
    pilots = [e for e in result.timeline.events if e.kind == "pilot"]
    assert all(p.start >= 1.5 for p in pilots)  # no pilot before T_s of audio has arrived
    assert result.timeline.end_of_speech == pytest.approx(2.8, abs=0.01)
    assert result.latency == pytest.approx(result.timeline.result_at - result.timeline.end_of_speech)
    result.timeline.save(tmp_path / "t.json")
    again = Timeline.load(tmp_path / "t.json")
    assert again.events == result.timeline.events
    assert plot_timeline(again, tmp_path / "t.png").stat().st_size > 1000


def test_replay_idles_for_real_only_before_the_last_chunk(tiny_model, speech_like):
    import time

    start = time.perf_counter()
    result = replay(tiny_model, speech_like(3.0, seed=2), NO_PILOTS)
    wall = time.perf_counter() - start
    computing = sum(e.end - e.start for e in result.timeline.events)
    ingest = [e for e in result.timeline.events if e.kind == "ingest"]
    last_gap = 3.0 - ingest[-2].end  # the last chunk is due at 3.0 s; the one before was done by then
    assert last_gap > 0.05 and wall - computing >= last_gap - 0.005  # that wait was slept ...
    assert wall < 1.5  # ... and only that one: 3 s of audio replays in far less than real time


def test_the_virtual_clock_jumps_and_idles_forward_never_back():
    import time

    clock = VirtualClock()
    clock.wait_until(5.0)
    assert 5.0 <= clock.now() < 5.05
    start = time.perf_counter()
    clock.idle_until(5.1)
    assert time.perf_counter() - start >= 0.09 and 5.1 <= clock.now() < 5.15
    clock.idle_until(1.0)
    assert clock.now() >= 5.1


def test_without_pilots_our_search_answers_as_espnets(tiny_model, speech_like):
    wave = speech_like(1.4, seed=2)
    ours = replay(tiny_model, wave, NO_PILOTS)
    espnet = replay(tiny_model, wave, AgentOptions(pilot=PilotOptions(enabled=False), decoder="espnet_batch"))
    assert ours.tokens == espnet.tokens and ours.text == espnet.text


def test_local_answers_are_the_agents_on_its_local_route(tmp_path, cloud_support, small_reader, speech_like):
    """What `pasu eval --as-agent` scores: the agent's answer with pilots and its intent reader, utterance by
    utterance, without replaying the audio's timing."""
    folder = cloud_support.write_model_folder(tmp_path / "model")
    small_reader.save(folder / OFFRAMP_DIR)
    model = load_device_model(folder)
    waves = [speech_like(1.3, seed=6), speech_like(2.1, seed=7)]
    local = LocalAnswers(model)
    answers = local.recognize_batch(waves)
    for wave, answer in zip(waves, answers):
        agent = replay(model, wave, AgentOptions(pilot=PilotOptions(start_seconds=0.5, interval_seconds=0.4)))
        assert agent.pilots >= 1 and agent.route == "local"
        assert (answer.text, answer.intent, answer.slots) == (agent.text, agent.intent, agent.slots)
        assert answer.confidence == pytest.approx(agent.confidence)
    assert local.model_id == f"{model.weights_id}+intent-reader@{model.intent_mixture.digest()}"
    decoder_alone = LocalAnswers(DeviceModel.from_folder(folder))  # no reader attached
    assert decoder_alone.model_id == model.weights_id
    for read, heard in zip(answers, decoder_alone.recognize_batch(waves)):
        assert read.text == heard.text  # the reader weighs in on the intent only ...
        assert read.intent in small_reader.classes and read.intent != heard.intent  # ... and overrules a clueless decoder


def test_live_agent_gives_the_replay_answer(tiny_model, speech_like):
    wave = speech_like(1.2, seed=3)
    agent = DeviceAgent(tiny_model, NO_PILOTS)
    for i in range(0, len(wave), 1600):
        agent.feed(wave[i : i + 1600])
    live = agent.end()
    assert live.tokens == replay(tiny_model, wave, NO_PILOTS).tokens
    assert live.audio_seconds == pytest.approx(1.2)


def test_realtime_pacing_with_pilots_returns_one_result(tiny_model, speech_like):
    scheduled = PilotOptions(start_seconds=0.5, interval_seconds=0.3, at_pause=False)  # an oracle endpointer
    agent = DeviceAgent(tiny_model, AgentOptions(pilot=scheduled))
    result = play_realtime(agent, speech_like(1.2, seed=4))
    assert result.pilots >= 1
    assert result.timeline.end_of_speech == pytest.approx(1.2, abs=0.3)


def test_a_pilot_overtaken_by_end_of_speech_is_abandoned(tiny_model, speech_like):
    session = Session(tiny_model, AgentOptions(), VirtualClock())
    session.ingest(speech_like(2.0, seed=5))
    session.run_pilot(lambda: True)
    assert session.last_pilot is None and session.pilots == 0
    assert [e.kind for e in session.timeline.events][-1] == "pilot_abandoned"


def test_bad_audio_gets_a_clear_error(tiny_model):
    agent = DeviceAgent(tiny_model, NO_PILOTS)
    with pytest.raises(AudioError, match="before any audio"):
        agent.end()
    with pytest.raises(AudioError, match="NaN"):
        agent.feed(np.array([0.0, np.nan], dtype=np.float32))
    agent.feed(np.zeros(800, dtype=np.float32))
    with pytest.raises(AudioError, match="too short"):
        agent.end()
    with pytest.raises(AudioError, match="zero samples"):
        replay(tiny_model, np.zeros(0, dtype=np.float32), NO_PILOTS)


@pytest.fixture(scope="module")
def cloud(cloud_support):
    config = ServerConfig(port=0, metrics_port=None, text_intent=None)  # the recognizer's own answers
    server = ServerThread(cloud_support.tiny_recognizer("cloud-tiny"), config)
    server.start()
    client = CloudClient(f"127.0.0.1:{server.port}", deadline_s=5.0)
    yield server, client
    client.close()
    server.stop(grace=0)


def test_offloaded_utterances_are_answered_by_the_cloud(tiny_model, speech_like, cloud):
    _, client = cloud
    result = replay(tiny_model, speech_like(2.2, seed=6), AgentOptions(), policy=AllOffload(), cloud=client)
    assert result.route == "cloud" and "cloud-tiny" in result.reason
    assert [e.kind for e in result.timeline.events if e.kind in ("cloud", "decode")] == ["cloud"]


def test_a_low_threshold_offloads_and_a_high_one_keeps_it_local(tiny_model, speech_like, cloud):
    _, client = cloud
    wave = speech_like(2.2, seed=7)
    low = replay(tiny_model, wave, AgentOptions(), OfframpPolicy(PerplexityOfframp(), 0.0), client)
    high = replay(tiny_model, wave, AgentOptions(), OfframpPolicy(PerplexityOfframp(), 1e9), client)
    assert low.route == "cloud" and high.route == "local"
    assert "score" in high.reason
    assert high.offramp_score > 0 and f"{high.offramp_score:.3g}" in high.reason  # what the threshold met
    on_device = replay(tiny_model, wave, AgentOptions(), OnDevice(), client)
    assert on_device.offramp_score is None  # a policy without a score


def test_the_policy_is_told_how_long_the_speech_was(tiny_model, speech_like):
    """The offramp weighs its score by the utterance's length: the agent must hand over the seconds heard."""
    heard = []

    class Recording(OnDevice):
        def decide(self, hypothesis, speech_seconds):
            heard.append(speech_seconds)
            return super().decide(hypothesis, speech_seconds)

    replay(tiny_model, speech_like(2.2, seed=9), AgentOptions(), policy=Recording())
    assert heard == [pytest.approx(2.2, abs=0.01)]


def test_an_unreachable_cloud_falls_back_to_the_local_answer(tiny_model, speech_like):
    client = CloudClient("127.0.0.1:9", deadline_s=0.5)  # nothing listens on the discard port
    try:
        result = replay(tiny_model, speech_like(1.0, seed=8), NO_PILOTS, policy=AllOffload(), cloud=client)
    finally:
        client.close()
    assert result.route == "fallback" and result.reason.startswith("all-offload policy")  # why it offloaded ...
    assert "cloud failed (unavailable" in result.reason  # ... and why the cloud did not answer
    assert result.tokens  # the local decode answered
    on_device = replay(tiny_model, speech_like(1.0, seed=8), NO_PILOTS, policy=OnDevice())
    assert on_device.route == "local" and on_device.tokens == result.tokens


def test_with_an_lm_the_final_decode_answers_as_espnets_with_it(with_lm, speech_like):
    wave = speech_like(1.6, seed=4)
    fused = replace(AgentOptions().final_search, lm_weight=0.5)
    ours = replay(with_lm, wave, AgentOptions(final_search=fused))  # pilots on, as shipped
    espnet = replay(with_lm, wave, AgentOptions(pilot=PilotOptions(enabled=False), decoder="espnet_batch",
                                                final_search=fused))
    assert ours.tokens == espnet.tokens and ours.text == espnet.text
    assert ours.tokens != replay(with_lm, wave, AgentOptions()).tokens  # the LM had a say


def test_with_a_length_bonus_the_final_decode_answers_as_espnets_with_its_penalty(tiny_model, speech_like):
    wave = speech_like(1.6, seed=4)
    # 1.0 keeps this untrained model's answers short of the frame count, where ESPnet appends a second <eos>
    longer = AgentOptions(final_search=replace(AgentOptions().final_search, length_bonus=1.0))
    espnet = replace(longer, pilot=PilotOptions(enabled=False), decoder="espnet_batch")
    assert espnet_search_for(tiny_model, espnet).weights["length_bonus"] == 1.0  # ESPnet's `penalty`
    ours = replay(tiny_model, wave, longer)  # pilots on, as shipped
    assert ours.tokens == replay(tiny_model, wave, espnet).tokens


def test_the_late_policy_judges_the_full_decode_and_the_early_one_the_last_pilot(tiny_model, speech_like):
    """ppl-late (the paper's deciding-late baseline) decides after the local decode; ppl before it, from a pilot."""
    from pasu.device.routing import RoutingOptions

    def stages(policy: str) -> list[str]:
        result = replay(tiny_model, speech_like(2.6, seed=11), AgentOptions(),
                        RoutingOptions(policy=policy, threshold=1e9).make_policy())
        assert result.route == "local" and result.pilots > 0
        return [e.kind for e in result.timeline.events if e.kind in ("offramp", "decode")]

    assert stages("ppl") == ["offramp", "decode"]
    assert stages("ppl-late") == ["decode", "offramp"]


def test_the_end_policy_judges_the_end_of_speech_pilot_and_decodes_on_the_same_encoding(tiny_model, speech_like, cloud):
    """ppl-end decides after the whole input's encode, on the CTC's best path over it, and offloads from there."""
    from pasu.device.routing import RoutingOptions

    _, client = cloud
    wave = speech_like(2.6, seed=11)
    judged = []

    class Recording(OfframpPolicy):
        def decide(self, hypothesis, speech_seconds):
            judged.append(hypothesis)
            return super().decide(hypothesis, speech_seconds)

    kept = replay(tiny_model, wave, AgentOptions(), Recording(PerplexityOfframp(), 1e9, "End-PPL", judges="end"))
    assert kept.route == "local" and kept.pilots > 0
    kinds = [e.kind for e in kept.timeline.events if e.kind in ("encode", "end_pilot", "offramp", "decode")]
    assert kinds == ["encode", "end_pilot", "offramp", "decode"]  # one encode serves the pilot and the decode
    ended = tiny_model.open_stream()
    ended.accept(wave)
    expected = tiny_model.search.ctc_greedy(ended.encode())
    assert judged[0].tokens == expected.tokens and judged[0].ended  # the whole input's pilot, not the last one
    sent = replay(tiny_model, wave, AgentOptions(), RoutingOptions(policy="ppl-end", threshold=0.0).make_policy(),
                  client)
    assert sent.route == "cloud" and "End-PPL score" in sent.reason
    assert [e.kind for e in sent.timeline.events if e.kind in ("end_pilot", "cloud", "decode")] == ["end_pilot", "cloud"]


PAUSE_PILOT = AgentOptions()  # the agent as shipped


def test_the_pause_pilot_hears_all_the_speech_inside_the_endpointers_silence(tiny_model, speech_like):
    """With at_pause the last pilot, which the offramp judges, is one on the whole input, run after the pause is
    heard and before the endpointer declares the end; latency counts from that declaration."""
    wave = speech_like(2.65, seed=11)
    judged = []

    class Recording(OnDevice):
        judges = "pilot"

        def decide(self, hypothesis, speech_seconds):
            judged.append((hypothesis, speech_seconds))
            return super().decide(hypothesis, speech_seconds)

    result = replay(tiny_model, wave, PAUSE_PILOT, Recording())
    scheduled = replay(tiny_model, wave, SCHEDULED)
    pilots = [e for e in result.timeline.events if e.kind == "pilot"]
    assert result.pilots == scheduled.pilots + 1
    assert pilots[-1].info["audio"] == pytest.approx(2.65, abs=0.01)  # scheduled ones heard 1.5 and 2.5 s
    assert pilots[-1].start >= 2.65 + PAUSE_PILOT.pilot.pause_seconds - 1e-6  # not before the pause was heard
    declared = 2.65 + VadOptions().trailing_silence_s
    assert result.timeline.end_of_speech == pytest.approx(declared, abs=0.01) and pilots[-1].end < declared
    assert result.latency == pytest.approx(result.timeline.result_at - declared)
    assert len(judged[0][0].tokens) == pilots[-1].info["tokens"]  # the offramp's input is the pause pilot ...
    assert result.pilot_text == pilots[-1].info["text"]
    assert judged[0][1] == pytest.approx(2.65, abs=0.01)  # ... and the seconds are the speech's, not the silence's
    assert result.tokens == scheduled.tokens  # the final decode reads the same audio and answers the same


def test_a_pause_pilot_that_outlasts_the_endpointers_silence_is_abandoned(tiny_model, speech_like):
    slow = AgentOptions(pilot=PilotOptions(at_pause=True, pause_seconds=0.6))  # no silence is left for it
    result = replay(tiny_model, speech_like(2.65, seed=11), slow)
    abandoned = [e for e in result.timeline.events if e.kind == "pilot_abandoned"]
    assert [e.info["audio"] for e in abandoned] == [pytest.approx(2.65, abs=0.01)]
    assert result.pilots == replay(tiny_model, speech_like(2.65, seed=11), SCHEDULED).pilots


def test_realtime_pacing_models_the_endpointer_as_the_replay_does(tiny_model, speech_like):
    """play_realtime (the demo, `pasu device run --realtime`) with the pause pilot: the last pilot hears all the
    audio with no chunk after it, and the end is declared the VAD's silence after the speech, as in a replay."""
    wave = speech_like(1.2, seed=3)  # short of T_s: the pause pilot is the only one
    result = play_realtime(DeviceAgent(tiny_model, PAUSE_PILOT), wave)
    assert result.pilots == replay(tiny_model, wave, PAUSE_PILOT).pilots == 1
    assert result.timeline.end_of_speech == pytest.approx(1.2 + VadOptions().trailing_silence_s, abs=0.3)
    assert play_realtime(DeviceAgent(tiny_model, SCHEDULED), wave).pilots == 0


def test_the_live_agent_runs_a_pilot_when_told_the_speaker_paused(tiny_model, speech_like):
    wave = speech_like(1.2, seed=3)

    def pilots(options: AgentOptions) -> int:
        agent = DeviceAgent(tiny_model, options)
        for i in range(0, len(wave), 1600):
            agent.feed(wave[i : i + 1600])
        agent.pause()  # what the endpointer says on the first silence
        for _ in range(2):  # 1.4 s in all: no scheduled pilot (T_s 1.5 s)
            agent.feed(np.zeros(1600, np.float32))  # the microphone goes on delivering the silence
        import time

        time.sleep(0.5)
        return agent.end().pilots

    assert pilots(PAUSE_PILOT) == 1
    assert pilots(SCHEDULED) == 0
