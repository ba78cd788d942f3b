"""Proto package `pasu.v1`; importing it makes sure its generated modules exist and are current."""

from ...build import ensure_generated

_generated_dir = ensure_generated("pasu/v1/slu.proto")
if str(_generated_dir) not in __path__:
    # A read-only install generates into a cache folder: look there first, before any stale copy here.
    __path__.insert(0, str(_generated_dir))
