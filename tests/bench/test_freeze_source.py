"""bench.peers.run --hourglass-rev: the frozen server copy runs the same compiled hot path as
the working tree when it was built from the same source (git archive holds no build
products)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.peers.run import NATIVE_LAYERS, REPO, freeze_source, frozen_unbuilt

PROBE = "from storage.native import native; import storage; print(native is not None, " \
        "storage.__file__)"


def test_frozen_copy_takes_the_built_extension_along(tmp_path: Path) -> None:
    built = sorted((REPO / "storage").glob("_native.*.so"))
    dest, commit = freeze_source("HEAD", tmp_path)
    assert len(commit) == 40 and (dest / "storage" / "native.py").is_file()
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=dest, check=True, text=True,
                         capture_output=True, env={"PYTHONPATH": str(dest)}).stdout.split()
    assert out[1] == str(dest / "storage" / "__init__.py")  # the frozen code, not the tree's
    assert out[0] == str(bool(built))  # compiled when the working tree has it built


LAYERS_PROBE = ("from storage.native import native as s; from scheduler.native import native as c; "
                "from api.native import native as a; print(s is not None, c is not None, "
                "a is not None)")


def test_frozen_copy_takes_every_layers_extension_along(tmp_path: Path) -> None:
    """The compiled hot paths are one extension per layer (setup.py): each goes along when
    the working tree built it from the frozen sources."""
    built = [bool(sorted((REPO / layer).glob("_native.*.so")))
             for layer in ("storage", "scheduler", "api")]
    dest, _ = freeze_source("HEAD", tmp_path)
    out = subprocess.run([sys.executable, "-c", LAYERS_PROBE], cwd=dest, check=True, text=True,
                         capture_output=True, env={"PYTHONPATH": str(dest)}).stdout.split()
    assert out == [str(b) for b in built]


def test_a_layer_left_unbuilt_in_the_frozen_copy_is_named(tmp_path: Path) -> None:
    """A layer without its own compiled module in the frozen copy would import the working
    tree's (the editable install maps it): the harness must run the pure twins instead."""
    dest, _ = freeze_source("HEAD", tmp_path)
    built = {layer for layer in NATIVE_LAYERS if sorted((REPO / layer).glob("_native.*.so"))}
    assert frozen_unbuilt(dest) == [layer for layer in NATIVE_LAYERS if layer not in built]
    for so in (dest / "api").glob("_native.*.so"):
        so.unlink()
    assert "api" in frozen_unbuilt(dest)
