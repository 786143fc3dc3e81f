"""Topic selection and naming, shared by the daemon and the backfill planner and owned by neither: which source
topics a pipeline's ``include`` / ``exclude`` patterns select, and what each is called on the target.

- **Selection**: ``include`` / ``exclude`` are regular expressions matched against the *whole* topic name; a comma
  also means "or", like classic MirrorMaker whitelists (``orders,payments\\..*``), except inside ``[...]``,
  ``{...}``, ``(...)`` or after a backslash. An alternative that is a plain topic name names that topic explicitly
  (:attr:`TopicPattern.named`): the planner refuses it when it does not exist, and internal topics (``__…``) are
  selected only when an include alternative names them literally
  (:func:`~mirror_core.model.planner.select_topics`).
- **Naming**: identity, a prefix (``dr.``) or an explicit map; partitions map one to one, so a work unit's lane
  is ``<target_topic>-<partition>`` and two units never share a lane. A target name must be a valid Kafka topic
  name (:func:`is_valid_topic_name`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mirror_core.errors import ConfigError

MAX_TOPIC_NAME = 249
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")


def is_valid_topic_name(name: str) -> bool:
    """What Kafka accepts as a topic name: letters, digits, ``.``, ``_`` and ``-``, at most 249, not ``.``/``..``."""
    return bool(_TOPIC_CHARS.fullmatch(name)) and name not in (".", "..") and len(name) <= MAX_TOPIC_NAME


# -- topic selection -------------------------------------------------------------------------------------------

def split_alternatives(text: str) -> list[str]:
    """Split a pattern on commas that are not escaped and not inside ``[...]``, ``{...}`` or ``(...)``."""
    parts, current, depth, in_class, i = [], [], 0, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "({":
            depth += 1
        elif ch in ")}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


@dataclass(frozen=True)
class TopicPattern:
    """An include or exclude pattern: regex alternatives, each matched against the whole topic name."""

    text: str
    what: str = "include"
    _regexes: tuple[re.Pattern, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        alternatives = split_alternatives(self.text)
        if not alternatives:
            raise ConfigError(f"{self.what} pattern {self.text!r} is empty")
        compiled = []
        for alt in alternatives:
            try:
                compiled.append(re.compile(alt))
            except re.error as exc:
                raise ConfigError(f"{self.what} pattern {self.text!r}: {alt!r} is not a valid regular expression "
                                  f"({exc})") from None
        object.__setattr__(self, "_regexes", tuple(compiled))

    def matches(self, topic: str) -> bool:
        return any(r.fullmatch(topic) for r in self._regexes)

    @property
    def named(self) -> frozenset[str]:
        """Alternatives that are plain topic names (``\\.`` counts as a dot): they name a topic explicitly."""
        out = set()
        for r in self._regexes:
            plain = re.sub(r"\\(.)", r"\1", r.pattern)
            if _TOPIC_CHARS.fullmatch(plain) and r.fullmatch(plain):
                out.add(plain)
        return frozenset(out)



# -- target naming ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NamingPolicy:
    """How a source topic's name becomes the target's: ``identity``, ``prefix:<p>`` or ``map:<src>=<dst>,...``."""

    kind: str = "identity"
    prefix: str = ""
    mapping: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("identity", "prefix", "map"):
            raise ConfigError(f"naming policy {self.kind!r} is not identity, prefix or map")
        if self.kind == "prefix" and not _TOPIC_CHARS.fullmatch(self.prefix or ""):
            raise ConfigError(f"naming prefix {self.prefix!r} must be non-empty and use only letters, digits, "
                              "'.', '_' and '-'")
        if self.kind == "map":
            if not self.mapping:
                raise ConfigError("naming map is empty; give src=dst pairs")
            sources = [s for s, _ in self.mapping]
            dup = next((s for s in sources if sources.count(s) > 1), None)
            if dup is not None:
                raise ConfigError(f"naming map lists source topic {dup!r} twice")

    @classmethod
    def parse(cls, text: str) -> NamingPolicy:
        value = text.strip()
        if value == "identity":
            return cls()
        kind, sep, rest = value.partition(":")
        if sep and kind == "prefix":
            return cls("prefix", prefix=rest)
        if sep and kind == "map":
            pairs = []
            for item in (p.strip() for p in rest.split(",") if p.strip()):
                src, eq, dst = item.partition("=")
                if not eq or not src.strip() or not dst.strip():
                    raise ConfigError(f"naming map entry {item!r} is not src=dst")
                pairs.append((src.strip(), dst.strip()))
            return cls("map", mapping=tuple(pairs))
        raise ConfigError(f"naming policy {text!r} is not identity, prefix:<prefix> or map:<src>=<dst>,...")

    def target_for(self, topic: str) -> str:
        if self.kind == "identity":
            return topic
        if self.kind == "prefix":
            return self.prefix + topic
        target = dict(self.mapping).get(topic)
        if target is None:
            raise ConfigError(f"topic {topic!r} is selected but the naming map has no target for it; add "
                              f"{topic}=<target> or narrow the include pattern")
        return target

    def __str__(self) -> str:
        if self.kind == "prefix":
            return f"prefix:{self.prefix}"
        if self.kind == "map":
            return "map:" + ",".join(f"{s}={d}" for s, d in self.mapping)
        return "identity"

