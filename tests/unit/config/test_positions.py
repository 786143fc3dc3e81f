"""Range specs as users type them."""

from __future__ import annotations

import pytest

from mirror_core.config.positions import PositionSpec, parse_partitions, parse_position
from mirror_core.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("earliest", PositionSpec("earliest")), ("LATEST", PositionSpec("latest")), ("42", PositionSpec("offset", 42)),
    ("2026-11-20T08:00:00Z", PositionSpec("timestamp", 1795161600000)),
    ("2026-11-20T09:00:00+01:00", PositionSpec("timestamp", 1795161600000)),
    ("2026-11-20T08:00:00", PositionSpec("timestamp", 1795161600000)),
])
def test_parse_position(text, expected):
    assert parse_position(text) == expected


@pytest.mark.parametrize("text", ["-1", "yesterday", "12abc", ""])
def test_bad_positions_name_the_argument(text):
    with pytest.raises(ConfigError, match="--from"):
        parse_position(text, what="--from")


def test_partitions():
    assert parse_partitions(None, 3, "t") == [0, 1, 2]
    assert parse_partitions("0, 2,4-6", 8, "t") == [0, 2, 4, 5, 6]
    with pytest.raises(ConfigError, match="no partition 8"):
        parse_partitions("8", 8, "t")
    with pytest.raises(ConfigError, match="'x'"):
        parse_partitions("x", 8, "t")
