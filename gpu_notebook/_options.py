"""Option dataclasses grouped by concern, and the flat keywords that map onto them (``Cluster``, ``Checkpointer``).

One object takes a frozen dataclass per group (``resources=Resources(...)``) or the groups' fields as flat
keywords (``workers=2``); each group is made from its keywords unless given whole, and a setting given both ways
is refused, as is a group given something other than its dataclass.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["combine", "near_miss"]


def near_miss(names: Iterable[str], name: str) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, else ``""``."""
    near = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def combine(
    owner: str,
    classes: Mapping[str, type],
    given: Mapping[str, Any],
    flat: Mapping[str, dict[str, Any]],
    given_as_keywords: Mapping[str, Iterable[str]],
) -> dict[str, Any]:
    """Each group's dataclass: as given (checked), else made from its flat keywords ``flat[group]``.

    Raises
    ------
    TypeError
        A group given something other than its dataclass, or with some of its settings also given as keywords.
    """
    made: dict[str, Any] = {}
    for group, cls in classes.items():
        value = given.get(group)
        if value is None:
            made[group] = cls(**flat[group])
            continue
        if not isinstance(value, cls):
            raise TypeError(f"{owner}({group}=...) takes a {cls.__name__}, not {type(value).__name__}")
        twice = sorted(given_as_keywords[group])
        if twice:
            raise TypeError(
                f"{owner}() got {', '.join(twice)} both as a keyword and in {group}={cls.__name__}(...), "
                f"which holds every {group} setting: give {'it' if len(twice) == 1 else 'them'} in one place"
            )
        made[group] = value
    return made
