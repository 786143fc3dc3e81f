"""The checkpoint value's formats, and the steps that read an older one.

A checkpoint value is a JSON object with ``"v"``: the format version. Each format change adds fields with a
default meaning "unknown/none" and one migration step from the previous version; a reader upgrades old values
step by step and refuses values newer than itself (a newer Shoal wrote them: guessing would lose what the new
fields say). Writers always write FORMAT_VERSION.
  2: the offset map in OffsetMap's binary encoding
  3: position_epoch (truncation check), target_topic_id (recreated target), lost_ranges (accepted losses)
  4: lane_state (a halted or retired lane and why: a restarted daemon does not reopen it); map_segments (sealed
     offset-map segments, the value's offset_map is the open tail), map_pruned_below
"""

from __future__ import annotations

from collections.abc import Collection

from mirror_core.errors import MirrorError

FORMAT_VERSION = 4


def _v2_to_v3(body: dict) -> dict:
    return {**body, "position_epoch": None, "target_topic_id": None, "lost_ranges": []}


def _v3_to_v4(body: dict) -> dict:
    return {**body, "lane_state": None,
            "map_segments": None, "map_pruned_below": None}  # the whole map was in the value


MIGRATIONS = {2: _v2_to_v3, 3: _v3_to_v4}  # version -> step to version + 1


def upgrade_checkpoint_body(body: dict, known: Collection[str]) -> dict:
    """A decoded checkpoint JSON body in today's format (without ``"v"``); refuses unknown versions and keys
    (``known``: the field names of today's :class:`~mirror_core.state.checkpoint.Checkpoint`)."""
    body = dict(body)
    version = body.pop("v", None)
    if not isinstance(version, int) or version > FORMAT_VERSION or (version < FORMAT_VERSION
                                                                     and version not in MIGRATIONS):
        raise MirrorError(f"checkpoint format {version!r} is not supported (this Shoal reads formats "
                          f"{min(MIGRATIONS)}..{FORMAT_VERSION}); a newer Shoal may have written it")
    while version < FORMAT_VERSION:
        body = MIGRATIONS[version](body)
        version += 1
    unknown = set(body) - set(known)
    if unknown:
        raise MirrorError(f"checkpoint has unknown fields {sorted(unknown)} for format {FORMAT_VERSION}")
    return body
