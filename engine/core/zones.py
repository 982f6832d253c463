"""Loading IANA time zones by name, with errors a person can act on."""

from __future__ import annotations

import functools
import zoneinfo
from typing import Final

from engine.errors import UnknownTimeZone

_HOST_DEPENDENT: Final = frozenset({"localtime", "Factory"})


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _HOST_DEPENDENT


@functools.lru_cache(maxsize=1024)
def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone called ``name`` (``Europe/Paris``, ``UTC``); :class:`UnknownTimeZone` if none.

    Only names in the IANA database are accepted: ``localtime`` would make a schedule's
    meaning depend on the host it runs on, and file paths are never opened.
    """
    if name not in _known_zones():
        hint = ""
        lowered = name.lower()
        close = sorted(zone for zone in _known_zones() if zone.lower() == lowered)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
        raise UnknownTimeZone(
            f"unknown time zone {name!r}{hint}; use an IANA name such as 'UTC', "
            "'Europe/Paris' or 'America/New_York'"
        )
    return zoneinfo.ZoneInfo(name)
