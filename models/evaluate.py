"""`pasu eval`: decode corpus splits with a packaged model and score WER, intent accuracy and SLU-F1."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from pasu.metrics import SluResult, evaluate_slu, mean_rtf, word_errors
from pasu.models.data import Utterance, dev_subset, load_split, read_audio
from pasu.models.recognizer import (
    DecodingOptions,
    Recognition,
    Recognizer,
    TextIntentPass,
    is_model_folder,
    load_recognizer,
)
from pasu.processes import map_in_processes


@dataclass(frozen=True)
class EvalOptions:
    splits: tuple[str, ...] = ("test", "test_unseen")
    # utterances per split, a fixed random subset (0: the whole split)
    limit: int = 0
    # the paper's full decode: beam 5, CTC weight 0.3
    decoding: DecodingOptions = DecodingOptions(beam_size=5, ctc_weight=0.3)
    # a `pasu text-intent train` folder: its classifier re-reads each transcript for the intent (the cloud's
    # second pass); None: the recognizer's own intent
    text_intent: str | None = None
    # decode as the device agent answers on its local route (a device model folder): its own search and, when
    # MODEL/offramp holds one, its intent reader weighed into the intent (`device.agent.LocalAnswers`); False:
    # ESPnet's beam search and the decoder's own intent
    as_agent: bool = False
    # processes decoding at once, one torch thread each (the recognizer must pickle: not a Whisper folder)
    jobs: int = 1
    # a JSON-lines file to write every utterance's answer to, beside its reference (`answer_rows`); None: none
    hyps: str | None = None


def decode_split(recognizer: Recognizer, utterances: Sequence[Utterance], desc: str = "",
                 jobs: int = 1) -> list[tuple[Recognition, float]]:
    """Each utterance's recognition and the seconds it took, one utterance at a time; `jobs` > 1 spreads them over
    that many processes with one core and one torch thread each (pasu.processes; the recognizer is pickled)."""
    with tqdm(total=len(utterances), desc=desc, unit="utt", dynamic_ncols=True) as bar:
        return map_in_processes(_decode, recognizer, utterances, jobs, lambda done, total: bar.update(1))


def _decode(recognizer: Recognizer, utterance: Utterance) -> tuple[Recognition, float]:
    audio = read_audio(utterance.audio)
    started = time.perf_counter()
    recognition = recognizer.recognize_batch([audio])[0]
    return recognition, time.perf_counter() - started


def score_split(utterances: Sequence[Utterance], decoded: Sequence[tuple[Recognition, float]]) -> dict:
    """WER, intent, SLU-F1 and decode speed of `decode_split`'s output against the manifest labels."""
    hyps, seconds = [h for h, _ in decoded], [t for _, t in decoded]
    refs = [SluResult(u.text, u.intent, u.slots or ()) for u in utterances]
    scores = asdict(evaluate_slu(refs, [SluResult(h.text, h.intent, h.slots) for h in hyps]))
    scores["decode_rtf"] = mean_rtf(seconds, [u.duration for u in utterances])
    scores["decode_seconds_p50"] = float(np.median(seconds))
    return scores


def answer_rows(split: str, utterances: Sequence[Utterance], decoded: Sequence[tuple[Recognition, float]]
                ) -> list[dict]:
    """One record per utterance for error analysis: reference and answer, the word errors, the decode time."""
    rows = []
    for u, (h, seconds) in zip(utterances, decoded, strict=True):
        errors = word_errors(u.text, h.text)
        rows.append({"split": split, "id": u.id, "ref": u.text, "hyp": h.text, "ref_intent": u.intent,
                     "hyp_intent": h.intent, "ref_slots": [list(s) for s in u.slots or ()],
                     "hyp_slots": [list(s) for s in h.slots], "substitutions": errors.substitutions,
                     "deletions": errors.deletions, "insertions": errors.insertions,
                     "ref_words": errors.ref_words, "seconds": round(seconds, 4)})
    return rows


def evaluate_model(model_dir: str | Path, corpus_dir: str | Path, opts: EvalOptions = EvalOptions()) -> dict:
    """{split: scores} for a packaged model folder."""
    # every split is read before decoding starts: a missing one fails at once, not after minutes of decoding
    splits = {split: load_split(corpus_dir, split) for split in opts.splits}
    recognizer = _agent(model_dir, opts.decoding) if opts.as_agent else load_recognizer(model_dir, opts.decoding)
    if opts.text_intent:
        from pasu.models.text_intent import TextIntentClassifier

        recognizer = TextIntentPass(recognizer, TextIntentClassifier.load(opts.text_intent))
    if opts.jobs > 1:
        _check_picklable(recognizer, opts.jobs)
    held_out: set[str] = set()  # splits the agent's intent reader learned: read by fold readers
    if opts.as_agent:
        from pasu.device.held_out_reader import model_reader_learned

        held_out = {split for split in splits if model_reader_learned(recognizer.model, corpus_dir, split)}
    results, rows = {}, []
    for split, utterances in splits.items():
        if opts.limit:
            utterances = dev_subset(utterances, opts.limit)
        if split in held_out:
            decoded = _decode_held_out(recognizer, corpus_dir, split, utterances, opts.jobs)
            results[split] = {**score_split(utterances, decoded), "intent_reader": "held out by sentence fold"}
        else:
            decoded = decode_split(recognizer, utterances, split, opts.jobs)
            results[split] = score_split(utterances, decoded)
        if opts.hyps:
            rows += answer_rows(split, utterances, decoded)
    if opts.hyps:
        Path(opts.hyps).write_text("".join(json.dumps(row) + "\n" for row in rows))
    results["decoding"] = asdict(opts.decoding)
    results["as_agent"] = opts.as_agent  # how the model card (pasu package --eval) says they were decoded
    results["jobs"] = opts.jobs  # decode_seconds were timed by this many processes side by side
    results["model_id"] = recognizer.model_id
    results["corpus"] = str(corpus_dir)
    return results


def _check_picklable(recognizer: Recognizer, jobs: int) -> None:
    """ValueError now, rather than a broken process pool later, when `recognizer` cannot go to other processes."""
    import pickle

    try:
        pickle.dumps(recognizer)
    except (TypeError, AttributeError, pickle.PicklingError) as e:
        raise ValueError(f"--jobs {jobs}: this model's recognizer cannot be sent to other processes ({e}); "
                         "decode it with --jobs 1 (and --threads for more cores)") from None


def _decode_held_out(agent: Recognizer, corpus_dir: str | Path, split: str,
                     utterances: Sequence[Utterance], jobs: int = 1) -> list[tuple[Recognition, float]]:
    """`decode_split` for a split the agent's intent reader learned (`pasu offramp train --reader-learns-split`):
    each utterance read by the reader refitted without its sentence's fold, as on sentences it never saw."""
    from pasu.device.held_out_reader import read_by_fold, readers_without

    readers = readers_without(agent.model.intent_mixture.reader, corpus_dir, split)
    return read_by_fold(agent.model, readers, [u.text for u in utterances],
                        lambda fold, positions: decode_split(agent, [utterances[i] for i in positions],
                                                             f"{split} fold {fold}", jobs))


def _agent(model_dir: str | Path, decoding: DecodingOptions) -> Recognizer:
    """The device agent's local answers with `decoding`'s beam, CTC weight, length bonus, threads and LM."""
    import torch
    from pasu.device.agent import AgentOptions, LocalAnswers, use_lm_of
    from pasu.device.decoding.search import SearchOptions
    from pasu.device.offramp_train import load_device_model
    from pasu.models.whisper_recognizer import is_whisper_folder

    if not is_model_folder(model_dir) or is_whisper_folder(model_dir):
        raise ValueError(f"--as-agent decodes a device model folder (config.yaml, model.pt); {model_dir} is not "
                         "one (a Whisper folder is a cloud model, an LM folder no recognizer)")
    if decoding.num_threads is not None:
        torch.set_num_threads(decoding.num_threads)
    model = load_device_model(model_dir)
    final = SearchOptions(beam_size=decoding.beam_size, ctc_weight=decoding.ctc_weight, stop_when_decided=True,
                          length_bonus=decoding.length_bonus, lm_weight=decoding.lm_weight if decoding.lm else 0.0)
    options = AgentOptions(final_search=final, lm=decoding.lm or "")
    use_lm_of(model, options)
    return LocalAnswers(model, options)


def write_results(results: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(results, indent=2))
