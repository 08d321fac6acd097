"""``hourglass serve`` runs with glibc malloc's heap on transparent huge pages (app/malloc.py):
it re-executes itself once with ``glibc.malloc.hugetlb=1`` in GLIBC_TUNABLES, keeping its PID;
``malloc_huge_pages = false`` (environment or TOML) keeps it off. Seen from outside: the
environment and the huge pages of the very process the test started, serving real HTTP."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app import malloc
from bench.support.server_process import ServerProcess

TOKEN = "malloc-huge-pages-token-0123456789"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

pytestmark = pytest.mark.skipif(not malloc.supported(), reason="needs Linux with glibc >= 2.35")


def environ_of(pid: int) -> list[str]:
    """The process's environment block, NUL-separated (glibc writes a NUL between the
    tunables of GLIBC_TUNABLES once it has read them)."""
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def anon_huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages in smaps_rollup")


def thp_mode() -> str:
    """The kernel's THP mode line (``always [madvise] never``); "" without THP."""
    try:
        return THP_MODE.read_text()
    except OSError:
        return ""


def thp_usable() -> bool:
    """The kernel gives huge pages to a process that asks (``madvise``) or to all."""
    return "[madvise]" in thp_mode() or "[always]" in thp_mode()


def send_some(server: ServerProcess) -> None:
    due = int(time.time() * 1000) + 3_600_000
    with server.client(timeout_s=30.0) as c:
        for _ in range(20):  # 20 k keys into the memtables: several MiB from malloc
            r = c.post("/v1/topics/thp/messages:batch", headers={"Prefer": "return=minimal"},
                       json={"messages": [{"body": "x" * 100, "deliverAt": due}
                                          for _ in range(1000)]})
            assert r.status_code == 201, r.text


def test_serve_runs_on_huge_pages_in_the_process_it_started_as(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", token=TOKEN, log_path=tmp_path / "server.log",
                           env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    server.start()
    try:
        assert server.pid is not None
        env = environ_of(server.pid)  # the PID the test started: re-executed in place
        assert "GLIBC_TUNABLES=glibc.malloc.arena_max=4" in env  # the caller's are kept
        assert "glibc.malloc.hugetlb=1" in env
        assert f"{malloc.MARKER}=1" in env
        send_some(server)
        if thp_usable():
            assert anon_huge_kib(server.pid) > 0
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["env", "toml"])
def test_the_setting_turns_it_off(tmp_path: Path, where: str) -> None:
    env: dict[str, str] = {}
    argv = None
    if where == "env":
        env["HOURGLASS_MALLOC_HUGE_PAGES"] = "false"
    else:
        config = tmp_path / "hourglass.toml"
        config.write_text("malloc_huge_pages = false\n")
        from bench.support.server_process import serve_argv
        argv = [*serve_argv(), "--config", str(config)]
    server = ServerProcess(tmp_path / "data", token=TOKEN, log_path=tmp_path / "server.log",
                           env=env, argv=argv)
    server.start()
    try:
        assert server.pid is not None
        assert not any("glibc.malloc.hugetlb" in item for item in environ_of(server.pid))
        send_some(server)
        if "[madvise]" in thp_mode():  # (with [always] every process gets them)
            assert anon_huge_kib(server.pid) == 0  # nobody else asks for huge pages
    finally:
        server.stop()


def test_environments() -> None:
    base = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    env = malloc.early_env(base)
    assert env is not None
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert malloc.early_env(env) is None  # once
    assert malloc.early_env({**base, "HOURGLASS_MALLOC_HUGE_PAGES": "off"}) is None
    assert malloc.early_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # theirs
    assert malloc.late_env(env, wanted=True) is None
    off = malloc.late_env(env, wanted=False)
    assert off is not None and off["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert malloc.early_env(off) is None and malloc.late_env(off, wanted=False) is None
    # a tunable the caller set is not taken away
    assert malloc.late_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, wanted=False) is None
    # what a process sees of GLIBC_TUNABLES: its first tunable (glibc), kept
    seen = malloc.late_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", malloc.MARKER: "1"},
                           wanted=False)
    assert seen is not None and seen["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert "GLIBC_TUNABLES" not in malloc.without_tunable({"GLIBC_TUNABLES":
                                                            "glibc.malloc.hugetlb=1"})
