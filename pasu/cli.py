"""The `pasu` command: one entry point, a subcommand per component."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

# Each component registers its own subcommand; the CLI only composes them.
Register = Callable[[argparse._SubParsersAction], None]


def _registrars() -> list[Register]:
    from pasu.bench.cli import register as bench
    from pasu.cloud.cli import register as cloud
    from pasu.corpus.cli import register as corpus
    from pasu.device.offramp_cli import register as offramp
    from pasu.models.cli import register as models

    return [corpus, models, offramp, cloud, bench]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pasu",
        description="PASU: pilot-assisted speech understanding on the edge, offloading to the cloud when unsure.",
        epilog="Example: pasu corpus build --preset tiny --out data/corpus-tiny",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
