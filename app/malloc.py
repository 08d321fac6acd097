"""``hourglass serve`` with glibc malloc's heap on transparent huge pages.

glibc (2.35 and later) puts the memory it hands out on transparent huge pages when the
process starts with the tunable ``glibc.malloc.hugetlb=1`` (it then ``madvise``s its heaps
``MADV_HUGEPAGE``; the kernel's default THP mode, ``madvise``, gives huge pages to no one
else). RocksDB's memtables are arenas from malloc, and a send batch inserts 2000 keys into their
skip lists at random places: with 4 KiB pages nearly every step of an insert may be a TLB
miss, and every new page a page fault, both dear in a VM that pages in software. W1's server
CPU (200 k sends over HTTP, in turns): median 0.70 against 0.97 s (4 pairs) and 0.90 against
1.03 (6 pairs, lower in 4); other sets did not resolve it (docs/performance.md, W1).

A tunable is read when the process starts, so ``serve`` re-executes itself once, very early
(``app/cli.py``: before the server's modules are imported, ~40 ms), with the tunable added to
``GLIBC_TUNABLES``; the process keeps its PID, arguments and descriptors. The setting
``malloc_huge_pages`` (app/settings.py) turns it off: from ``HOURGLASS_MALLOC_HUGE_PAGES``
before the re-exec, from the TOML file or the environment after the settings are read (a
second re-exec without the tunable, only when it was added here: ``MARKER``).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

from app.flags import FALSE_WORDS

TUNABLE = "glibc.malloc.hugetlb"
#: set in the environment of a re-executed ``serve`` (the name is not a ``HOURGLASS_*``
#: setting): the tunable in GLIBC_TUNABLES was added by ``reexec``, which runs once
MARKER = "_HOURGLASS_MALLOC_REEXEC"
SETTING_ENV = "HOURGLASS_MALLOC_HUGE_PAGES"


def supported() -> bool:
    """Linux with glibc 2.35 or later (earlier ones ignore the tunable)."""
    if not sys.platform.startswith("linux"):
        return False
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return False
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 35)


def tunable_set(environ: Mapping[str, str]) -> bool:
    """GLIBC_TUNABLES names the tunable already (whoever set it)."""
    return any(item.split("=", 1)[0] == TUNABLE
               for item in environ.get("GLIBC_TUNABLES", "").split(":"))


def with_tunable(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the tunable added to GLIBC_TUNABLES (other tunables kept) and MARKER."""
    env = dict(environ)
    current = env.get("GLIBC_TUNABLES", "")
    env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"
    env[MARKER] = "1"
    return env


def without_tunable(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the tunable (other tunables kept); MARKER stays (no loop)."""
    env = dict(environ)
    kept = [item for item in env.get("GLIBC_TUNABLES", "").split(":")
            if item and item.split("=", 1)[0] != TUNABLE]
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


def early_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-execute ``serve`` with before anything else, or None: the
    tunable is set already, was set once (MARKER), is not supported, or
    ``HOURGLASS_MALLOC_HUGE_PAGES`` says no."""
    if environ.get(MARKER) or tunable_set(environ) or not supported():
        return None
    if environ.get(SETTING_ENV, "").strip().lower() in FALSE_WORDS:
        return None
    return with_tunable(environ)


def late_env(environ: Mapping[str, str], wanted: bool) -> dict[str, str] | None:
    """After the settings are read: the environment to re-execute with when the setting
    turns off a tunable added by ``early_env`` (the TOML file said no); else None. (glibc
    cuts GLIBC_TUNABLES at its first tunable in the environment a process sees: MARKER
    says whether ours is there.)"""
    if wanted or environ.get(MARKER) != "1":
        return None
    env = without_tunable(environ)
    env[MARKER] = "0"
    return env


def reexec(env: dict[str, str]) -> None:
    """Replace this process by the same command line under ``env`` (never returns)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
