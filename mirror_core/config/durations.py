"""Durations as users write them in flags, pipeline files and Airflow settings: ``90``, ``90s``, ``15m``, ``2h``,
``1d``, ``1w`` (pure parsing; a bad one is a ConfigError naming the setting).
"""

from __future__ import annotations

import re
from typing import Any

from mirror_core.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: Any, *, what: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``, ``1w`` → seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"{what} {text!r} is not a duration like 90s, 15m, 2h or 1d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]
