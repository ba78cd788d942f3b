"""Fit and calibrate the offramps of a packaged device model; the result lives in MODEL/offramp/.

Thresholds are set on out-of-fold BiLSTM and CNN scores (k-fold cross-fitting on the dev replays): scores of a
network on its own training data are over-confident, and thresholds placed on them would offload less than asked
on new data. The networks that ship are then fitted on every dev replay. Perplexity needs no training, only
thresholds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pasu.device import cnn_offramp
from pasu.device.bilstm_offramp import BiLstmOfframp, EndBiLstmOfframp, LateBiLstmOfframp
from pasu.device.cnn_offramp import CNN_TRAINING, CnnOfframp
from pasu.device.calibration import (
    OFFLOAD_LEVELS,
    Calibration,
    for_ratio,
    for_wer,
    naive_probability,
    offload_curve,
    selectivity,
    wer_targets,
)
from pasu.device.intent_offramp import IntentErrorModel, IntentEvidence, IntentMixture, IntentOfframp
from pasu.models.intent_reader import READER_FILES, IntentReader
from pasu.device.agent import PilotOptions
from pasu.device.offramp_data import BAD_WER, OfframpSample
from pasu.device.offramp_net import Fitter, LearnedOfframp, TrainOptions
from pasu.device.routing import (
    EitherPolicy,
    Judged,
    perplexity_offramp,
    token_count,
    weigh,
    weigh_by_length,
    weighing_for,
)
from pasu.models.checkpoints import count_parameters
from pasu.metrics import SluResult
from sklearn.model_selection import KFold, StratifiedKFold

if TYPE_CHECKING:
    from pasu.device.decoding.search import Hypothesis
    from pasu.device.routing import Policy, RoutingOptions
    from pasu.device.runtime import DeviceModel

log = logging.getLogger(__name__)
Evidence = Callable[["Hypothesis"], np.ndarray]  # a hypothesis -> what the intent check reads (IntentEvidence)

OFFRAMP_DIR = "offramp"  # inside the packaged model folder
THRESHOLDS = "offramp.json"
# Units of the thresholds in offramp.json; older reports are refused, as their thresholds would mean something
# else to the policy. 1: per hypothesis; 2: PPL and BiLSTM weighed by speech seconds; 3: the intent check too;
# 4: the intent check judges the decoder/reader mixture (intent_offramp.IntentMixture), and replays answer with it;
# 5: the intent check is a fitted P(intent wrong) (intent_offramp.IntentOfframp), not weighed by length; 6: the
# checks of a hypothesis of the whole input (the full decode's: ppl_late, bilstm_late) are weighed by its tokens,
# the PPL one in log units (routing.weighing_for, perplexity_offramp); 7: the last pilot's PPL is in log units too,
# over its words without <eos> (routing.perplexity_offramp), so the ppl and ppl_intent thresholds moved; 8: the
# pilot's BiLSTM reads its words without <eos> too (bilstm_offramp.pilot_features); 9: pilots run to 30 tokens,
# not 15 (agent.PilotOptions), so the pilot's checks judge whole hypotheses where they judged prefixes.
CALIBRATION_VERSION = 9


@dataclass(frozen=True)
class OfframpTrainOptions:
    """What `pasu offramp train` does besides replaying."""

    bilstm: TrainOptions = field(default_factory=TrainOptions)  # fitting the BiLSTM (its bad_wer: every label)
    # networks of the BiLSTMs judging the end-of-speech pilot and the full decode (bilstm.networks: the last
    # pilot's): one, as their seed's sway is not measured and each network adds ~6 minutes to the shipped recipe
    whole_input_networks: int = 1
    cnn: TrainOptions = CNN_TRAINING  # fitting the CNN over encoder output (its bad_wer is the BiLSTM's)
    folds: int = 5  # cross-fitting folds for the out-of-fold scores the thresholds are placed on
    levels: tuple[tuple[str, float], ...] = tuple(OFFLOAD_LEVELS.items())  # (name, offload ratio) to calibrate


def ppl_scores(samples: Sequence[OfframpSample], judges: Judged = "pilot") -> np.ndarray:
    """The perplexity check's score (routing.perplexity_offramp), not yet weighed, of the hypothesis each sample's
    policy judging `judges` decides on; inf when there is none."""
    offramp = perplexity_offramp(judges)
    return np.array([offramp.score(h.hypothesis()) if (h := s.judged(judges)) else np.inf for s in samples])


def weighed_scores(scores: np.ndarray, samples: Sequence[OfframpSample], judges: Judged) -> np.ndarray:
    """Scores of the hypotheses of `samples` that a policy judging `judges` decides on (each replay missing it
    lending its pilot, as the networks do), weighed as that policy weighs them (routing.weighing_for)."""
    hypotheses = [s.judged(judges) or s.early for s in samples]
    tokens = np.array([token_count(h) if h else 1 for h in hypotheses])
    return weigh(scores, weighing_for(judges), np.array([s.duration for s in samples]), tokens)


@dataclass(frozen=True)
class TrainedOfframps:
    """What `fit_offramps` makes and MODEL/offramp/ holds."""

    bilstm: BiLstmOfframp
    report: dict[str, Any]  # offramp.json: thresholds, selectivity, training facts
    cnn: CnnOfframp | None = None  # None: the replays kept no encoder outputs (or a folder from before the CNN)
    intent: IntentErrorModel | None = None  # the intent check's model; None: fitted without the intent reader
    # the BiLSTM fitted on full decodes, for the decision after one; None: a folder from before stop 65, whose
    # late thresholds were placed on the pilots' network's scores of full decodes (`late_network` then gives that)
    bilstm_late: LateBiLstmOfframp | None = None
    # the BiLSTM fitted on end-of-speech pilots, for the decision on one; None: a folder from before stop 68
    bilstm_end: EndBiLstmOfframp | None = None

    def late_network(self) -> BiLstmOfframp:
        """The BiLSTM that the decision after the full decode reads."""
        return self.bilstm_late or self.bilstm

    def save(self, folder: str | Path) -> Path:
        """bilstm.pt + bilstm.json, bilstm_late.*, bilstm_end.*, cnn.* (the networks), intent_errors.json and
        offramp.json."""
        folder = self.bilstm.save(folder)
        for part in (self.bilstm_late, self.bilstm_end, self.cnn, self.intent):
            if part is not None:
                part.save(folder)
        (folder / THRESHOLDS).write_text(json.dumps(self.report, indent=2))
        return folder


def out_of_fold_scores(sequences: list[np.ndarray], labels: np.ndarray, options: OfframpTrainOptions,
                       fitter: Fitter) -> np.ndarray:
    """Scores of each sample from a network (`fitter(sequences, labels)`) that never saw it; folds keep the share
    of local WERs above the bar (soft labels included)."""
    strata = labels > options.bilstm.bad_wer
    minority = int(min(strata.sum(), len(strata) - strata.sum()))
    folds = min(options.folds, len(labels))
    if folds < 2:
        raise ValueError("cross-fitting needs at least two samples")
    splitter = StratifiedKFold(folds, shuffle=True, random_state=options.bilstm.seed) if minority >= folds else \
        KFold(folds, shuffle=True, random_state=options.bilstm.seed)  # too few of one class to stratify
    scores = np.zeros(len(labels))
    for fit, held in splitter.split(np.zeros(len(labels)), strata):
        offramp = fitter([sequences[i] for i in fit], labels[fit])
        scores[held] = offramp.probabilities([sequences[i] for i in held])
    return scores


def calibrate(name: str, scores: np.ndarray, samples: Sequence[OfframpSample], levels: Sequence[tuple[str, float]],
              cloud_edits: Sequence[int] | None, bad_wer: float = BAD_WER) -> dict[str, Any]:
    """Thresholds for each offload level and, with cloud edits, for WER targets between device and cloud; the
    selectivity is how well the scores rank local WER above `bad_wer`."""
    labels = [s.bad(bad_wer) for s in samples]
    local = [s.local_edits for s in samples]
    words = [s.ref_words for s in samples]
    curve = offload_curve(scores, local, cloud_edits, words) if cloud_edits is not None else offload_curve(scores)
    result: dict[str, Any] = {"selectivity": selectivity(scores, labels),
                              "levels": {lvl: asdict(for_ratio(curve, r)) for lvl, r in levels}}
    if cloud_edits is not None:
        total = float(sum(words))
        targets = wer_targets(sum(local) / total, sum(cloud_edits) / total)
        found: list[Calibration | None] = [for_wer(curve, t) for t in targets]
        result["wer_targets"] = {f"{t:g}": asdict(c) if c else None for t, c in zip(targets, found)}
    log.info("%s offramp: %s", name, json.dumps(result["selectivity"]))
    return result


def answer_intent_accuracy(samples: Sequence[OfframpSample], read: Callable[[Sequence[int]], SluResult]) -> dict:
    """Intent accuracy of the replays' answers (the decoder/reader mixture, when a reader was attached) beside
    that of the decoder's own intent (`read`, DeviceModel.read, of the full decode's tokens)."""
    def right(answer: SluResult, sample: OfframpSample) -> bool:
        return answer.intent == sample.reference.intent

    decoder = [right(read(s.final.tokens) if s.final else s.local, s) for s in samples]
    return {"utterances": len(samples), "answers": float(np.mean([right(s.local, s) for s in samples])),
            "decoder": float(np.mean(decoder))}


def fit_offramps(samples: Sequence[OfframpSample], options: OfframpTrainOptions = OfframpTrainOptions(),
                 cloud_edits: Sequence[int] | None = None, intent: Evidence | None = None,
                 fit_samples: Sequence[OfframpSample] | None = None,
                 intent_by_replay: Callable[[OfframpSample], Evidence] | None = None) -> TrainedOfframps:
    """The BiLSTM (and, when the replays kept their encoder outputs, the CNN) fitted on `fit_samples` (default:
    `samples`; it must include them), and the report with the offramps' thresholds calibrated on `samples`
    (with `intent`, the device's intent evidence (`intent_evidence`), the intent check fitted and calibrated
    too, and PPL or BiLSTM combined with it; `intent_by_replay`: the evidence each replay is judged by instead,
    when replays were read by readers that did not learn their sentences); the word checks' scores are weighed by
    the speech's length."""
    kept = [s for s in samples if s.early is not None]  # no hypothesis: every policy offloads or none can judge
    if cloud_edits is not None:
        cloud_edits = [e for e, s in zip(cloud_edits, samples) if s.early is not None]
    fit = kept if fit_samples is None else [s for s in fit_samples if s.early is not None]
    bad_wer = options.bilstm.bad_wer
    bilstm, oof = _fit_learned(BiLstmOfframp, BiLstmOfframp.train, options.bilstm, fit, kept, options)
    # the decision after the full decode gets a network of its own, fitted on full decodes
    whole_input = replace(options.bilstm, networks=options.whole_input_networks)
    bilstm_late, oof_late = _fit_learned(LateBiLstmOfframp, LateBiLstmOfframp.train, whole_input, fit, kept,
                                         options)
    # and so does the decision on the end-of-speech pilot, where the replays made them (from stop 68 on)
    with_end = all(s.end_decision_at is not None for s in fit)
    bilstm_end, oof_end = _fit_learned(EndBiLstmOfframp, EndBiLstmOfframp.train, whole_input, fit, kept,
                                       options) if with_end else (None, None)

    def calibrated(name: str, scores: np.ndarray, judges: Judged = "pilot") -> dict[str, Any]:
        return calibrate(name, weighed_scores(scores, kept, judges), kept, options.levels, cloud_edits, bad_wer)

    ppl = ppl_scores(kept)
    report = {
        "samples": len(kept), "bad_share": float(np.mean([s.bad(bad_wer) for s in kept])),
        "calibration_version": CALIBRATION_VERSION,
        "bilstm": {**_network_facts(bilstm, options.bilstm, fit), **calibrated("BiLSTM", oof)},
        "ppl": calibrated("PPL", ppl),
        # the late decisions judge the full decode, whose scores sit elsewhere: their own thresholds
        "ppl_late": calibrated("PPL (full decode)", ppl_scores(kept, "final"), "final"),
        "bilstm_late": {**_network_facts(bilstm_late, whole_input, fit),
                        **calibrated("BiLSTM (full decode)", oof_late, "final")},
    }
    if bilstm_end is not None:
        report["ppl_end"] = calibrated("PPL (end-of-speech pilot)", ppl_scores(kept, "end"), "end")
        report["bilstm_end"] = {**_network_facts(bilstm_end, whole_input, fit),
                                **calibrated("BiLSTM (end-of-speech pilot)", oof_end, "end")}
    cnn = None
    if cnn_offramp.has_encodings(fit):  # the CNN learns the BiLSTM's label
        cnn_options = replace(options.cnn, bad_wer=bad_wer, label=options.bilstm.label)
        cnn, cnn_oof = _fit_learned(CnnOfframp, cnn_offramp.train, cnn_options, fit, kept, options)
        report["cnn"] = {**_network_facts(cnn, cnn_options, fit), **calibrated("CNN", cnn_oof)}
    intent_model = None
    if intent is not None and len({s.local.intent == s.reference.intent for s in fit}) < 2:
        # nothing to tell apart (an untrained model, a tiny split): the other offramps are still worth saving
        log.warning("intent check not fitted: the device's intent is right on all or on none of %d replays", len(fit))
        report["intent_skipped"] = "the device's intent was right on all or on none of the replays"
    elif intent is not None:
        intent_model, wrong_scores = _fit_intent(intent_by_replay or (lambda _: intent), fit, kept)
        wrong = [s.local.intent != s.reference.intent for s in kept]
        report["intent"] = {"evidence": list(intent_model.names), "fitted_on": len(fit),
                            "selectivity_intent": selectivity(wrong_scores, wrong),  # of the intent errors
                            **calibrate("Intent", wrong_scores, kept, options.levels, cloud_edits, bad_wer)}
        # words or intent: each check at its own Offload-M threshold counts as 1 (routing.EitherPolicy)
        for words, scores in (("ppl", ppl), ("bilstm", oof)):
            scales = {words: threshold(report, words, "M"), "intent": threshold(report, "intent", "M")}
            either = EitherPolicy.combine([weighed_scores(scores, kept, "pilot"), wrong_scores],
                                          list(scales.values()))
            report[f"{words}_intent"] = {"scales": scales, **calibrate(f"{words} or intent", either, kept,
                                                                       options.levels, cloud_edits, bad_wer)}
    if cloud_edits is not None:
        report["yardsticks"] = yardsticks(kept, cloud_edits, bad_wer)
    return TrainedOfframps(bilstm, report, cnn, intent_model, bilstm_late, bilstm_end)


def _fit_intent(evidence: Callable[[OfframpSample], Evidence], fit: Sequence[OfframpSample],
                kept: Sequence[OfframpSample]) -> tuple[IntentErrorModel, np.ndarray]:
    """The intent check's model fitted on every `fit` sample to tell the device's wrong intents, and its scores
    of the `kept` ones, where its thresholds are placed. Its own scores, not out-of-fold ones as the networks':
    nine weights fitted on a split's replays are hardly over-confident on them (on the shipped model's 2,033 dev
    replays the out-of-fold and the fitted scores put Offload-M's threshold within a hundredth)."""
    rows = [evidence(s)(s.early.hypothesis()) for s in fit]
    model = IntentErrorModel.fit(rows, np.array([s.local.intent != s.reference.intent for s in fit], float))
    return model, calibration_scores(model.probabilities(rows), fit, kept)


def _fit_learned(kind: type[LearnedOfframp], train: Callable[..., LearnedOfframp], train_options: TrainOptions,
                 fit: Sequence[OfframpSample], kept: Sequence[OfframpSample],
                 options: OfframpTrainOptions) -> tuple[LearnedOfframp, np.ndarray]:
    """A learned offramp of `kind` fitted by `train(sequences, labels, train_options)` on every `fit` sample (the
    hypotheses it judges), and the out-of-fold scores of the `kept` ones, where its thresholds are placed."""
    sequences, labels = kind.training_set(fit, train_options)
    log.info("fitting %s on %d replays: %d times out of fold, then on all", kind.__name__, len(sequences),
             options.folds)
    oof = out_of_fold_scores(sequences, labels, options, lambda x, y: train(x, y, train_options))
    return train(sequences, labels, train_options), calibration_scores(oof, fit, kept)


def _network_facts(offramp: LearnedOfframp, train_options: TrainOptions,
                   fit: Sequence[OfframpSample]) -> dict[str, Any]:
    # parameters: of one network (train["networks"] of them are averaged)
    return {"parameters": count_parameters(offramp.nets[0]), "train": asdict(train_options), "fitted_on": len(fit)}


def yardsticks(samples: Sequence[OfframpSample], cloud_edits: Sequence[int],
               bad_wer: float = BAD_WER) -> dict[str, dict[str, float | None]]:
    """{ranking: {WER target: offload ratio}} for rankings no offramp has, to judge the offramps by: NaiveHybrid
    (random); the speech's length alone (where every offramp's length-weighed score starts: what an offramp adds
    is its distance from this); a perfect classifier of the BiLSTM's label weighed by length as the offramps are
    (how much the label itself tells: a network's soft scores can rank a little better); one that knows the
    device's word edits (a perfect offramp, blind to the cloud's errors); and one that knows both answers' edits
    (the floor)."""
    local, cloud = np.array([s.local_edits for s in samples], float), np.asarray(cloud_edits, float)
    words = np.array([s.ref_words for s in samples], float)
    seconds = np.array([s.duration for s in samples])
    order = np.arange(len(samples)) * 1e-9  # breaks ties, so that no group of equal scores must go together
    rankings = {"length": seconds - order,
                "label_oracle": weigh_by_length(np.array([s.bad(bad_wer) for s in samples], float), seconds) - order,
                "edits_oracle": local - order,
                "gain_oracle": local - cloud - order}
    targets = wer_targets(local.sum() / words.sum(), cloud.sum() / words.sum())
    table = {"NaiveHybrid": {f"{t:g}": naive_probability(local.sum(), cloud.sum(), words.sum(), t) for t in targets}}
    for name, scores in rankings.items():
        curve = offload_curve(scores, local, cloud, words)
        table[name] = {f"{t:g}": c.offload_ratio if (c := for_wer(curve, t)) else None for t in targets}
    return table


def calibration_scores(oof: np.ndarray, fit: Sequence[OfframpSample], kept: Sequence[OfframpSample]) -> np.ndarray:
    """The scores of the calibration samples (out of fold, for the networks) among those of the fitted ones, which
    must include them."""
    index = {s.id: i for i, s in enumerate(fit)}
    missing = [s.id for s in kept if s.id not in index]
    if missing:
        raise ValueError(f"{len(missing)} calibration utterances (e.g. {missing[0]}) are not among the BiLSTM's "
                         "training utterances, so they have no out-of-fold score")
    return oof[[index[s.id] for s in kept]]


def load_offramps(folder: str | Path) -> TrainedOfframps:
    """MODEL/offramp/'s networks and report (the CNN when the folder has one)."""
    folder = Path(folder)
    report = load_thresholds(folder)
    cnn = CnnOfframp.load(folder) if CnnOfframp.exists(folder) else None
    intent = IntentErrorModel.load(folder) if IntentErrorModel.exists(folder) else None
    late = LateBiLstmOfframp.load(folder) if LateBiLstmOfframp.exists(folder) else None
    end = EndBiLstmOfframp.load(folder) if EndBiLstmOfframp.exists(folder) else None
    return TrainedOfframps(BiLstmOfframp.load(folder), report, cnn, intent, late, end)


def load_bilstm(folder: str | Path, judges: Judged = "pilot") -> BiLstmOfframp:
    """The BiLSTM of an offramp folder that a policy judging `judges` reads: the one fitted on full decodes for
    "final", where the folder has one (else the pilots' one, on whose scores of full decodes older folders placed
    the late thresholds); the one fitted on end-of-speech pilots for "end" (FileNotFoundError without one)."""
    if judges == "end":
        if not EndBiLstmOfframp.exists(folder):
            raise FileNotFoundError(f"{folder}: no {EndBiLstmOfframp.weights_file}; run `pasu offramp train` again "
                                    "for the bilstm-end policy")
        return EndBiLstmOfframp.load(folder)
    if judges == "final" and LateBiLstmOfframp.exists(folder):
        return LateBiLstmOfframp.load(folder)
    return BiLstmOfframp.load(folder)


def load_device_model(path: str | Path, offramp_folder: str | Path | None = None) -> DeviceModel:
    """A device model as the agent runs it (a packaged folder, or an ESPnet checkpoint: DeviceModel.load): its
    unknown words corrected when its folder ships a word trigram (pasu.device.spelling), with the intent reader of
    its offramp folder (default FOLDER/offramp) weighed into its answers when that folder has one."""
    from pasu.device.runtime import DeviceModel, model_folder
    from pasu.device.spelling import WORDS_FILE

    model, folder = DeviceModel.load(path), model_folder(path)
    if (folder / WORDS_FILE).is_file():
        model.use_speller(folder / WORDS_FILE)
    reader_folder = Path(offramp_folder) if offramp_folder is not None else folder / OFFRAMP_DIR
    if (reader_folder / READER_FILES[0]).is_file():
        model.intent_mixture = IntentMixture(IntentReader.load(reader_folder))
    return model


def intent_evidence(model: DeviceModel) -> IntentEvidence:
    """What a model with its intent reader attached shows about its intent (FileNotFoundError without one)."""
    if model.intent_mixture is None:
        raise FileNotFoundError(f"{model.model_id} has no intent reader (MODEL/{OFFRAMP_DIR}/{READER_FILES[0]}: "
                                "`pasu offramp train`)")
    return IntentEvidence(model.intent_mixture, model.read)


def intent_offramp(model: DeviceModel, folder: str | Path, errors: IntentErrorModel | None = None) -> IntentOfframp:
    """The intent check of a model from `load_device_model` whose offramps are in `folder` (MODEL/offramp;
    FileNotFoundError without its reader or its fitted model); `errors`: that fitted model, when already loaded
    (`load_offramps`)."""
    evidence = intent_evidence(model)
    if errors is None and not IntentErrorModel.exists(folder):
        raise FileNotFoundError(f"{folder}: no {IntentErrorModel.FILE}; run `pasu offramp train` first")
    return IntentOfframp(evidence, errors or IntentErrorModel.load(folder))


def model_policy(routing: RoutingOptions, model: DeviceModel, folder: str | Path) -> Policy:
    """`routing`'s policy for a model from `load_device_model` whose offramps are in `folder` (MODEL/offramp):
    thresholds left unset at its calibrated `level` (`calibrated_routing`); the policies with the intent check
    read the model's intent reader, the bilstm ones its BiLSTM (FileNotFoundError without them)."""
    routing = calibrated_routing(routing, folder)
    bilstm = load_bilstm(folder, routing.judges) if routing.word_check == "bilstm" else None
    return routing.make_policy(intent_offramp(model, folder) if routing.reads_intent else None, bilstm)


def calibrated_routing(routing: RoutingOptions, folder: str | Path) -> RoutingOptions:
    """`routing` with each threshold it leaves unset (None) at the level (Offload-L/M/H, `routing.level`) that
    `pasu offramp train` calibrated for its policy in `folder`; as it is where nothing was calibrated (the policy
    then names what is missing).

    Thresholds belong to the model: each retrained model moves them, so the agent reads them from its model
    rather than from a number in its config that the next training run would make stale."""
    if not routing.unset_thresholds:
        return routing
    try:
        report = load_thresholds(folder)
    except FileNotFoundError:
        return routing
    def key(name: str) -> str:  # a policy's name in the report: ppl+intent -> ppl_intent, ppl-late -> ppl_late
        return name.replace("+", "_").replace("-", "_")

    if "+" in routing.policy and key(routing.policy) in report:
        # the pair that offloads the level's share together
        parts = either_thresholds(report, key(routing.policy), routing.level)
    else:  # one check, or a report without the combined one: each part at its own level
        parts = {part: threshold(report, key(part), routing.level) for part in routing.policy.split("+")
                 if key(part) in report}
    calibrated = {"threshold": parts.get(routing.word_part), "intent_threshold": parts.get("intent")}
    return replace(routing, **{name: calibrated[name] for name in routing.unset_thresholds
                               if calibrated[name] is not None})


# The pilot schedule of a calibration whose report does not name one (reports before `--tau` came in): the
# paper's, then the agent's only one
PAPER_PILOTS = PilotOptions(at_pause=False)


def calibrated_pilots(report: dict[str, Any]) -> PilotOptions:
    """The pilot schedule of the replays a calibration report's thresholds were placed on."""
    # a schedule names the pause pilot only when it is on (PilotOptions.schedule)
    pilots = report.get("pilots")
    return PilotOptions(**{"at_pause": False, **pilots}) if pilots else PAPER_PILOTS


def schedule_mismatch(routing: RoutingOptions, pilot: PilotOptions, folder: str | Path) -> str | None:
    """Why `routing`'s calibrated thresholds from `folder` do not fit an agent whose pilots run as `pilot`, or None.

    The offramps judge the last pilot, and a schedule that ends it elsewhere (without the pause pilot, say) gives
    other scores: the calibrated Offload-M then offloads another share than it was placed for. Thresholds set by
    hand, and checks that read no pilot (the end-of-speech pilot's, the full decode's), are left alone."""
    reads_pilots = routing.reads_intent or (routing.word_check is not None and routing.judges == "pilot")
    if not (routing.unset_thresholds and reads_pilots):
        return None
    try:
        calibrated = calibrated_pilots(load_thresholds(folder))
    except FileNotFoundError:
        return None
    if calibrated.schedule() == pilot.schedule():
        return None
    return (f"{folder}: the {routing.policy} thresholds were calibrated with pilots {calibrated.describe()}, but "
            f"the agent runs them {pilot.describe()}, so they offload another share than calibrated: run the agent "
            "with the folder's schedule, or recalibrate with `pasu offramp train` and the agent's pilot options")


def load_thresholds(folder: str | Path) -> dict[str, Any]:
    """The calibration report (offramp.json) of an offramp folder; FileNotFoundError without one."""
    path = Path(folder) / THRESHOLDS
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {THRESHOLDS}; run `pasu offramp train` first")
    report = json.loads(path.read_text())
    if report.get("calibration_version", 1) < CALIBRATION_VERSION:  # thresholds in other units than the policy's
        raise ValueError(f"{path}: calibrated by an older PASU, whose offramp scores meant something else; run "
                         "`pasu offramp train` again")
    return report


def threshold(report: dict[str, Any], offramp: str, level: str) -> float:
    """A calibrated threshold: offramp "ppl", "bilstm", "ppl_end", "bilstm_end", "ppl_late", "bilstm_late",
    "intent", "ppl_intent" or "bilstm_intent", level "L"/"M"/"H"."""
    return float(report[offramp]["levels"][level]["threshold"])


def either_thresholds(report: dict[str, Any], offramp: str, level: str) -> dict[str, float]:
    """The parts' own thresholds at which a combined offramp ("ppl_intent", "bilstm_intent") offloads as at
    `level`: {"ppl": ..., "intent": ...}, what routing's ppl+intent policy takes as threshold and intent_threshold."""
    scale = threshold(report, offramp, level)
    return {part: scale * value for part, value in report[offramp]["scales"].items()}
