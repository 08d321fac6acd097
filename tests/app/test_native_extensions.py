"""pip builds the three layers' compiled hot paths (setup.py: storage/, scheduler/, api/
``_native``); without them hourglass runs, slower, on the pure-Python twins
(tests/support/twins.py has the contract the layers' test_native.py suites hold them to)."""

from __future__ import annotations

import os

import pytest

from storage.native import PURE_PYTHON_ENV
from tests.support.twins import LAYERS


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_the_extension_is_built(layer: str) -> None:
    if os.environ.get(PURE_PYTHON_ENV):
        pytest.skip(f"{PURE_PYTHON_ENV} is set: the pure-Python twins are in use")
    assert LAYERS[layer] is not None, (
        f"{layer}/_native is not built: pip install -e . (needs a C compiler; Cython is "
        "fetched by the build)")
