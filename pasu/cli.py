"""The `pasu` command: one entry point, a subcommand per component."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

# Each component registers its own subcommand; the CLI only composes them.
Register = Callable[[argparse._SubParsersAction], None]


def _registrars() -> list[Register]:
    from pasu.bench.cli import register as bench
    from pasu.cloud.cli import register as cloud
    from pasu.corpus.cli import register as corpus
    from pasu.demo import register as demo
    from pasu.device.cli import register as device
    from pasu.device.offramp_cli import register as offramp
    from pasu.models.cli import register as models

    return [demo, corpus, models, device, offramp, cloud, bench]


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


class _QuietEspnet2Modules(logging.Filter):
    """Drops the INFO and DEBUG records of ESPnet's espnet2 modules, which log through the root logger
    (`logging.info`, e.g. "Gradient checkpoint layers: []" for every model built), so no logger level reaches them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}espnet2{os.sep}" not in record.pathname


_QUIET_ESPNET2 = _QuietEspnet2Modules()


def configure_logging(verbose: bool) -> None:
    """INFO (DEBUG with -v) on stderr for every command."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # ESPnet's beam search logs every best hypothesis at INFO: that is user speech, which stays out of the
    # logs unless debug logging is asked for (-v); so does the chatter of building its models.
    logging.getLogger("espnet").setLevel(logging.DEBUG if verbose else logging.WARNING)
    root = logging.getLogger()
    root.removeFilter(_QUIET_ESPNET2)
    if not verbose:
        root.addFilter(_QUIET_ESPNET2)


def _quiet_espnet_import() -> str:
    """Import ESPnet, returning what it printed: "Failed to import Flash Attention" goes to stdout, which is for
    results (--json), and on a CPU, where flash attention never runs, the notice only reads like an error."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as notice:
        import espnet.nets.pytorch_backend.transformer.attention  # noqa: F401
    return notice.getvalue().strip()


def main(argv: Sequence[str] | None = None) -> int:
    notice = _quiet_espnet_import()
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    if notice:
        logging.getLogger(__name__).debug("importing ESPnet: %s", notice)  # shown with -v
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except FileNotFoundError as error:  # a path the user gave (a config, a corpus split): which, not a traceback
        if args.verbose:
            raise
        where = f"{error.filename}: {error.strerror}" if error.filename else str(error)
        print(f"error: {where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
