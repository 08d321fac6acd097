"""The words a boolean setting takes, in a module that imports nothing of the server: read by
app/settings.py and, before the server's modules are imported, by app/malloc.py."""

from __future__ import annotations

from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"expected true or false, got {value!r}")
