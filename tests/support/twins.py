"""The contract every compiled hot path keeps with its pure-Python twin, written once; the
three layers' suites (tests/storage/test_native.py, tests/scheduler/test_native.py,
tests/api/test_native.py) hold each pair to it, and tests/app/test_native_extensions.py
checks that the three extensions are built.

The contract: where the compiled function takes an input, its answer is the twin's, byte for
byte; what it does not recognise exactly it answers None, leaving it to the twin (which then
decides, and raises where it must). It never answers anything else. Where an assertion does
not need the other twin (an independent expectation: sorted order, the offsets written in a
receipt, counts per second), ``both`` runs the same test against each twin."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from api.native import native as api_native
from scheduler.native import native as scheduler_native
from storage.errors import HourglassError
from storage.native import native as storage_native

#: each layer's compiled module (None: not built, or HOURGLASS_PURE_PYTHON set)
LAYERS: dict[str, ModuleType | None] = {
    "storage": storage_native, "scheduler": scheduler_native, "api": api_native}


def needs_native(layer: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(LAYERS[layer] is None, reason=f"{layer}/_native is not built")


def both(layer: str, compiled: str | Callable[..., Any],
         twin: Callable[..., Any]) -> list[Any]:
    """The pair as two parameters, ``pure`` and ``compiled`` (skipped where ``layer``'s
    extension is not built): ``compiled`` names the function in the extension, or is the
    caller's entry point into it."""
    module = LAYERS[layer]
    if isinstance(compiled, str):
        compiled = getattr(module, compiled) if module is not None else twin
    return [pytest.param(twin, id="pure"),
            pytest.param(compiled, id="compiled", marks=needs_native(layer))]


def or_none(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None where it raises HourglassError (the twin refusing an input)."""
    try:
        return fn(*args)
    except HourglassError:
        return None


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """What ``fn`` returns, or the type of what it raises (an overflow, a refusal)."""
    try:
        return fn(*args)
    except (OverflowError, HourglassError) as exc:
        return type(exc)


def holds(compiled: object, twin: object, *, takes: bool | None) -> None:
    """The contract for one input. ``takes``: the compiled side must take it (its answer is
    the twin's, which is not None); False: it must leave it (None); None: either (damaged
    bytes it may or may not see as such), but never an answer other than the twin's."""
    if takes is True:
        assert compiled == twin
        assert compiled is not None
    elif takes is False:
        assert compiled is None
    elif compiled is not None:
        assert compiled == twin
