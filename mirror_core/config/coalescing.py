"""How large coalesced batches may be (``--coalesce-small-batches``, a backfill's ``coalesce_small_batches``): the
default size, the smallest allowed, and the check every entry point runs. What coalescing does is in
:mod:`mirror_core.codec.batch_coalesce`."""

from __future__ import annotations

from mirror_core.errors import ConfigError

DEFAULT_COALESCE_BYTES = 64 * 1024  # well under the 1 MB topic default of max.message.bytes
MIN_COALESCE_BYTES = 1024           # below this, no run of small batches is worth a re-encode
# above this nothing is gained (a request per MiB is no longer what limits a copy), while a compressed run holds its
# decompressed records and their re-encoding in memory while it is merged: the size bounds that memory too
MAX_COALESCE_BYTES = 1024 * 1024


def checked_coalesce_bytes(value: int, what: str = "coalesce_bytes") -> int:
    """``value`` if it is 0 (off) or within [:data:`MIN_COALESCE_BYTES`, :data:`MAX_COALESCE_BYTES`]; else
    :class:`ConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or \
            (value and not MIN_COALESCE_BYTES <= value <= MAX_COALESCE_BYTES):
        raise ConfigError(f"{what} must be 0 (off) or between {MIN_COALESCE_BYTES} and {MAX_COALESCE_BYTES} "
                          f"bytes, not {value!r}")
    return value
