"""Process-wide settings of the `pasu` command."""

from __future__ import annotations

import argparse
import logging
import shlex

import pytest

from pasu.cli import build_parser, configure_logging


@pytest.fixture
def espnet_level():
    logger = logging.getLogger("espnet")
    before = logger.level
    yield
    logger.setLevel(before)


def test_decoded_hypotheses_stay_out_of_info_logs(espnet_level):
    beam_search = logging.getLogger("espnet.nets.beam_search")  # logs "best hypo: <transcript>" at INFO
    configure_logging(verbose=False)
    assert not beam_search.isEnabledFor(logging.INFO)
    configure_logging(verbose=True)
    assert beam_search.isEnabledFor(logging.INFO)


def test_espnet2s_model_building_notes_stay_out_of_info_logs(espnet_level):
    """espnet2 logs through the root logger ("Gradient checkpoint layers: []" for every model built)."""
    import os

    def passes(level: int, module: str) -> bool:
        path = os.path.join("site-packages", *module.split("/"))
        return bool(logging.getLogger().filter(logging.LogRecord("root", level, path, 1, "note", None, None)))

    try:
        configure_logging(verbose=False)
        assert not passes(logging.INFO, "espnet2/asr/decoder/transformer_decoder.py")
        assert passes(logging.WARNING, "espnet2/asr/decoder/transformer_decoder.py")
        assert passes(logging.INFO, "pasu/device/agent.py")  # ours stay
        configure_logging(verbose=True)
        assert passes(logging.INFO, "espnet2/asr/decoder/transformer_decoder.py")
    finally:
        configure_logging(verbose=False)


# --- Help: every command says what it does and shows how --------------------------------------------------


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser, help line) of every subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name)
                yield from _commands(sub, (*path, name))


def _examples(help_text: str) -> list[list[str]]:
    """The `pasu ...` command lines after the first `Example:` / `Examples:` (continuations joined)."""
    _, found, examples = help_text.partition("\nExample")
    assert found, "no Example: line"
    lines = examples.replace("\\\n", " ").splitlines()
    lines[0] = lines[0].partition(":")[2]
    return [shlex.split(line, comments=True) for line in lines if line.strip().startswith("pasu ")]


COMMANDS = list(_commands(build_parser()))


def test_the_tree_is_walked():
    names = {" ".join(path) for path, _, _ in COMMANDS}
    assert {"device", "device run", "cloud serve", "bench report", "corpus build", "train"} <= names


@pytest.mark.parametrize("path, parser, help_line", COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_every_command_has_help_and_a_working_example(path, parser, help_line, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the terminal width help is wrapped to
    assert help_line, "no help line in the parent's command list"
    options = [action for action in parser._actions if not isinstance(action, argparse._SubParsersAction)]
    assert [action.dest for action in options if not action.help] == [], "options without help"
    examples = _examples(parser.format_help())
    assert any(example[1 : 1 + len(path)] == list(path) for example in examples), f"no `pasu {' '.join(path)}` example"
    for example in examples:
        try:
            build_parser().parse_args(example[1:])  # the example is a valid command line
        except SystemExit:
            pytest.fail(f"example does not parse: {shlex.join(example)}")


def test_pasu_help_has_an_example():
    assert _examples(build_parser().format_help())


@pytest.mark.parametrize("argv, said", [
    (["train", "--config", "{tmp}/missing.yaml", "--corpus", "{tmp}", "--out", "{tmp}/exp"],
     "error: {tmp}/missing.yaml: No such file or directory"),
    (["lm", "train", "--model", "{tmp}", "--corpus", "{tmp}/no-corpus", "--exp", "{tmp}/e", "--out", "{tmp}/lm"],
     "error: {tmp}/no-corpus: no such corpus folder, sentence file or text file"),
    (["offramp", "train", "{tmp}/model", "--corpus", "{tmp}", "--limit", "2"],
     "render it with `pasu corpus build --splits dev`"),
])
def test_a_missing_input_is_one_line_not_a_traceback(argv, said, tmp_path, capsys, cloud_support):
    from pasu.cli import main

    cloud_support.write_model_folder(tmp_path / "model")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert said.format(tmp=tmp_path) in err and "Traceback" not in err
