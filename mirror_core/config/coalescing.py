"""How large coalesced batches may be (``--coalesce-small-batches``, a backfill's ``coalesce_small_batches``): the
default size, the smallest allowed, and the check every entry point runs. What coalescing does is in
:mod:`mirror_core.codec.batch_coalesce`."""

from __future__ import annotations

from mirror_core.errors import ConfigError

DEFAULT_COALESCE_BYTES = 64 * 1024  # well under the 1 MB topic default of max.message.bytes
MIN_COALESCE_BYTES = 1024           # below this, no run of small batches is worth a re-encode


def checked_coalesce_bytes(value: int, what: str = "coalesce_bytes") -> int:
    """``value`` if it is 0 (off) or at least :data:`MIN_COALESCE_BYTES`; else :class:`ConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or (value and value < MIN_COALESCE_BYTES) or value < 0:
        raise ConfigError(f"{what} must be 0 (off) or at least {MIN_COALESCE_BYTES}, not {value!r}")
    return value
