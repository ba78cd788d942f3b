"""Dev evaluation during training: what the trainer relies on besides the numbers themselves."""

from pathlib import Path

import torch

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py
from pasu.models.data import Utterance, load_split, write_synthetic_corpus
from pasu.models.dev_eval import HIGHER_IS_BETTER, DevResult, evaluate, slu_results
from pasu.models.targets import encode_target
from pasu.slu import Slot


def _utterance(utt_id: str, target: str, slots: tuple[Slot, ...] | None) -> Utterance:
    return Utterance(utt_id, Path("unused.flac"), 1.0, target, "wake me up at five am", "alarm_set", slots)


def test_rows_without_gold_slots_score_no_slots_on_either_side():
    """A row whose slots were never annotated must not count the slots a model writes as wrong."""
    known, unknown = (encode_target("wake me up at five am", "alarm_set", slots)
                      for slots in ([Slot("time", "five am")], None))
    rows = [_utterance("a", known, (Slot("time", "five am"),)), _utterance("b", unknown, None)]
    hyps = {"a": "alarm_set wake me up at SLOT_time five am SLOT_END",
            "b": "alarm_set wake me up at SLOT_time five am SLOT_END"}
    refs, outs = slu_results(rows, hyps)
    assert outs[0].slots == (Slot("time", "five am"),) and refs[0].slots == (Slot("time", "five am"),)
    assert outs[1].slots == () and refs[1].slots == ()
    assert outs[1].intent == "alarm_set" and outs[1].text == "wake me up at five am"


def test_evaluation_leaves_the_training_run_as_it_found_it(tmp_path):
    """Evaluating must not draw from the training RNG (dropout and SpecAugment would depend on how often it runs)
    nor leave the model in eval mode."""
    from pasu.models.build import build_asr_model
    from pasu.models.targets import target_symbols
    from pasu.models.tokenizer import Tokenizer, TokenizerOptions

    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=4, n_dev=3)
    dev = load_split(corpus, "dev")
    symbols = target_symbols({u.intent for u in dev}, {s.type for u in dev for s in u.slots or ()})
    tokenizer = Tokenizer.train([u.text for u in dev], symbols, TokenizerOptions(vocab_size=40))
    model = build_asr_model({**support.TINY_MODEL, "token_list": tokenizer.token_list}).train()

    torch.manual_seed(0)
    result = evaluate(model, tokenizer, dev, batch_seconds=6.0)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))
    assert model.training
    assert isinstance(result, DevResult) and result.n == 3 and result.loss > 0 and result.seconds > 0
    assert set(HIGHER_IS_BETTER) <= set(DevResult.__dataclass_fields__)
