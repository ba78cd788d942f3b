"""`pasu bench`: one subcommand per benchmark module; each module registers its own parser."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark and print its figures",
        description="Benchmarks: each prints its figures and writes a JSON result (see `pasu bench report`).",
        epilog="Example: pasu bench local --corpus data/corpus-full --utterances 100 --out bench/local.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for register_bench in _registrars():
        register_bench(benches)


def _registrars() -> list:
    from pasu.bench.hybrid import register as hybrid
    from pasu.bench.load import register as load
    from pasu.bench.local import register as local
    from pasu.bench.report import register as report

    return [local, hybrid, load, report]
