"""Storage tests: real RocksDB and real files under tmp_path."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    # schemathesis' pytest plugin imports this lazily inside the first test it runs, where
    # jsonschema's DeprecationWarning would be an error (filterwarnings = error); import it
    # here, outside any test, so this directory also passes when run on its own.
    warnings.simplefilter("ignore")
    import schemathesis._hypothesis  # noqa: F401
