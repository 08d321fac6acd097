"""Server settings: one frozen dataclass built from defaults < TOML file < ``HOURGLASS_*`` env
< CLI flags.

Every setting has one name used everywhere: the TOML key (engine tunables under ``[engine]``),
the environment variable ``HOURGLASS_<NAME>`` and, for the four common ones, a CLI flag
(``--data-dir``, ``--host``, ``--port``, ``--config``). Inside, times are integer milliseconds
and sizes integer bytes; friendlier forms ("5s", "2h", "4MiB") are accepted only here, at the
edge. A bad value fails loudly with ``InvalidArgument`` naming where it came from.

Tokens come from the TOML file (``[[tokens]]`` tables with ``token``, ``role`` and ``topics``)
and from ``HOURGLASS_ADMIN_TOKEN``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.auth import Role, TokenSpec
from app.flags import parse_bool
from scheduler.config import EngineConfig
from storage.constants import MAX_BATCH_MESSAGES
from storage.errors import InvalidArgument

log = logging.getLogger("hourglass.settings")

ENV_PREFIX = "HOURGLASS_"
DEFAULT_PORT = 7740
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True, kw_only=True)
class Settings:
    # name                       default            meaning
    data_dir: Path = Path("data")  #                  RocksDB + CommitLog + generated token
    host: str = "127.0.0.1"  #                       listen address
    port: int = DEFAULT_PORT  #                       listen port
    log_level: str = "info"  #                       uvicorn log level
    access_log: bool = False  #                      one log line per request (costs ~10%)
    max_request_bytes: int = 32 << 20  #             bytes of one HTTP request body -> 413
    max_batch_messages: int = MAX_BATCH_MESSAGES  #      messages in one batch send (<= 1000)
    max_connections: int = 1024  #                   open HTTP connections; past it: 503 + close
    max_long_polls: int = 512  #                     pulls waiting at once (waitMs); past it: 503
    max_long_polls_per_token: int = 64  #            long polls + streams of one token; past: 429
    stream_stall_ms: int = 30_000  #                 a stream whose client takes no bytes this
    #                                                long is ended (its slot freed)
    max_header_bytes: int = 64 << 10  #              bytes of a request's line and headers -> 431
    header_timeout_ms: int = 5_000  #                ms for a request's headers to arrive; then
    #                                                the connection is closed
    metrics_require_token: bool = False  #           /metrics needs an admin token (401/403)
    malloc_huge_pages: bool = True  #                glibc malloc on transparent huge pages
    #                                                (serve re-executes itself: app/malloc.py)
    gil_switch_interval_us: int = 5000  #            sys.setswitchinterval of serve (µs)
    cluster: str = ""  #                              NATS URLs, comma-separated: cluster mode
    node_id: str = ""  #                              this node's id in the cluster (required)
    advertise: str = ""  #                            URL other nodes reach it at (http://HOST:PORT)
    cluster_lease_ms: int = 2000  #                   the leader's lease; renewed every third
    cluster_max_ready_lag_ms: int = 1000  #           /readyz of a follower: 200 while under it
    cluster_snapshot_records: int = 100_000  #        the leader keeps a snapshot every so many
    #                                                records and trims the stream (0: never)
    tokens: tuple[TokenSpec, ...] = ()  #            [[tokens]] + HOURGLASS_ADMIN_TOKEN
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(data_dir=Path("data")))
    config_file: Path | None = None  #               where the TOML layer came from

    @property
    def cluster_urls(self) -> list[str]:
        return [u.strip() for u in self.cluster.split(",") if u.strip()]

    @property
    def advertised_url(self) -> str:
        return self.advertise or f"http://{self.host}:{self.port}"

    @property
    def admin_token_file(self) -> Path:
        """Where a generated admin token is kept (mode 0600) when none is configured."""
        return self.data_dir / "admin.token"

    def with_tokens(self, tokens: tuple[TokenSpec, ...]) -> Settings:
        return dataclasses.replace(self, tokens=tokens)


# --- friendlier forms, accepted at the edge only --------------------------------------------
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*\Z")


def _with_unit(value: Any, units: Mapping[str, int], default_unit: str, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected {what}, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match:
            number, unit = match.groups()
            factor = units.get((unit or default_unit).lower())
            if factor is not None:
                result = float(number) * factor
                if result != int(result):
                    raise ValueError(f"{value!r} is not a whole number of {default_unit}")
                return int(result)
    raise ValueError(f"expected {what} like {_example(units)}, got {value!r}")


def _example(units: Mapping[str, int]) -> str:
    return '"5s", "2h" or milliseconds' if "ms" in units else '"4MiB", "512KiB" or bytes'


def parse_duration_ms(value: Any) -> int:
    """``1500``, ``"1500"``, ``"1.5s"``, ``"2h"``, ``"3d"`` -> milliseconds (units ms s m h d)."""
    return _with_unit(value, _DURATION_UNITS, "ms", "a duration")


def parse_size(value: Any) -> int:
    """``4194304``, ``"4MiB"``, ``"512KiB"``, ``"1GB"`` -> bytes."""
    return _with_unit(value, _SIZE_UNITS, "b", "a size")


def parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {value!r}")


def _ratio(value: float) -> str | None:
    return None if 0 < value <= 1 else "must be a number in (0, 1]"


def parse_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def parse_str_tuple(value: Any) -> tuple[str, ...]:
    """A TOML list of strings, or a comma-separated string (environment)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"expected a list of strings, got {value!r}")


def parse_path(value: Any) -> Path:
    text = parse_str(value)
    if not text.strip():
        raise ValueError("expected a path, got an empty string")
    return Path(text).expanduser()


Parser = Callable[[Any], Any]
Check = Callable[[Any], str | None]  # -> an error message, or None when the value is fine


def _positive(value: int) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else "must not be negative"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a TCP port (0-65535)"


def _batch(value: int) -> str | None:
    ok = 1 <= value <= MAX_BATCH_MESSAGES
    return None if ok else f"must be between 1 and {MAX_BATCH_MESSAGES}"


def _node_id(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value) else (
        "must be 1-64 characters of A-Z a-z 0-9 _ . -")


def _lease(value: int) -> str | None:
    return None if value >= 300 else "must be at least 300 ms"


def _log_level(value: str) -> str | None:
    levels = ("critical", "error", "warning", "info", "debug", "trace")
    return None if value in levels else f"must be one of {', '.join(levels)}"


def _flush_policy(value: str) -> str | None:
    return None if value in ("async", "sync") else 'must be "async" or "sync"'


@dataclass(frozen=True, kw_only=True)
class Option:
    """One setting: its parser (edge forms -> internal value) and an optional check."""

    name: str
    parse: Parser
    check: Check | None = None
    engine: bool = False  # lives in [engine] / EngineConfig

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def toml_key(self) -> str:
        return f"engine.{self.name}" if self.engine else self.name


SERVER_OPTIONS: tuple[Option, ...] = (
    Option(name="data_dir", parse=parse_path),
    Option(name="host", parse=parse_str),
    Option(name="port", parse=parse_int, check=_port),
    Option(name="log_level", parse=lambda v: parse_str(v).lower(), check=_log_level),
    Option(name="access_log", parse=parse_bool),
    Option(name="max_request_bytes", parse=parse_size, check=_positive),
    Option(name="max_batch_messages", parse=parse_int, check=_batch),
    Option(name="max_connections", parse=parse_int, check=_positive),
    Option(name="max_long_polls", parse=parse_int, check=_positive),
    Option(name="max_long_polls_per_token", parse=parse_int, check=_positive),
    Option(name="stream_stall_ms", parse=parse_duration_ms, check=_positive),
    Option(name="max_header_bytes", parse=parse_size, check=_positive),
    Option(name="header_timeout_ms", parse=parse_duration_ms, check=_positive),
    Option(name="metrics_require_token", parse=parse_bool),
    Option(name="malloc_huge_pages", parse=parse_bool),
    Option(name="gil_switch_interval_us", parse=parse_int, check=_positive),
    Option(name="cluster", parse=parse_str),
    Option(name="node_id", parse=parse_str, check=_node_id),
    Option(name="advertise", parse=parse_str),
    Option(name="cluster_lease_ms", parse=parse_duration_ms, check=_lease),
    Option(name="cluster_max_ready_lag_ms", parse=parse_duration_ms, check=_positive),
    Option(name="cluster_snapshot_records", parse=parse_int, check=_non_negative),
)

_ENGINE_CHECKS: dict[str, Check] = {"flush_policy": _flush_policy,
                                    "disk_reserve_bytes": _non_negative,
                                    "disk_clean_ratio": _ratio}


def _engine_options() -> tuple[Option, ...]:
    hints = typing.get_type_hints(EngineConfig)
    options = []
    for f in dataclasses.fields(EngineConfig):
        if f.name == "data_dir":
            continue  # follows the server's data_dir
        kind = hints[f.name]
        parse: Parser
        check: Check | None = _ENGINE_CHECKS.get(f.name)
        if typing.get_origin(kind) is tuple:
            parse = parse_str_tuple
        elif kind is bool:
            parse = parse_bool
        elif kind is float:
            parse = parse_float
        elif kind is int and f.name.endswith("_ms"):
            parse, check = parse_duration_ms, check or _non_negative
        elif kind is int and f.name.endswith(("_size", "_bytes")) and "batch" not in f.name:
            parse, check = parse_size, check or _positive
        elif kind is int:
            parse, check = parse_int, check or _positive
        else:
            parse = parse_str
        options.append(Option(name=f.name, parse=parse, check=check, engine=True))
    return tuple(options)


ENGINE_OPTIONS = _engine_options()
ALL_OPTIONS = SERVER_OPTIONS + ENGINE_OPTIONS


# --- layering -------------------------------------------------------------------------------
def _apply(option: Option, raw: Any, source: str) -> Any:
    try:
        value = option.parse(raw)
    except ValueError as exc:
        raise InvalidArgument(f"{source}: {exc}") from None
    problem = option.check(value) if option.check else None
    if problem:
        raise InvalidArgument(f"{source}: {value!r} {problem}")
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise InvalidArgument(f"config file {path} cannot be read: {exc}") from None


def _parse_tokens(raw: Any, source: str) -> list[TokenSpec]:
    if not isinstance(raw, list):
        raise InvalidArgument(f"{source}: [[tokens]] must be an array of tables")
    specs = []
    for i, entry in enumerate(raw):
        where = f"{source}: tokens[{i}]"
        if not isinstance(entry, dict):
            raise InvalidArgument(f"{where} must be a table")
        unknown = set(entry) - {"token", "role", "topics", "name"}
        if unknown:
            raise InvalidArgument(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        try:
            role = Role(str(entry.get("role")))
        except ValueError:
            raise InvalidArgument(
                f"{where}.role must be one of {', '.join(r.value for r in Role)}"
            ) from None
        topics = entry.get("topics", ["*"])
        if (not isinstance(topics, list) or not topics
                or not all(isinstance(t, str) and t for t in topics)):
            raise InvalidArgument(f"{where}.topics must be a non-empty list of glob patterns")
        specs.append(TokenSpec(
            token=_check_token(entry.get("token"), f"{where}.token"), role=role,
            topics=tuple(topics), name=str(entry.get("name") or f"tokens[{i}]"),
        ))
    return specs


def _check_token(token: Any, source: str) -> str:
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        raise InvalidArgument(
            f"{source} must be a string of at least {MIN_TOKEN_LENGTH} characters")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise InvalidArgument(f"{source} must be printable ASCII without spaces")
    return token


def load_settings(
    *,
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Build the settings: defaults < TOML ``config_file`` (or ``HOURGLASS_CONFIG``) < env < cli.

    ``cli`` maps setting names to values already given on the command line (None = not given).
    Raises InvalidArgument naming the offending source on any bad value or unknown key.
    """
    env = dict(env or {})
    values: dict[str, Any] = {}
    tokens: list[TokenSpec] = []

    path = config_file or (parse_path(env["HOURGLASS_CONFIG"]) if env.get("HOURGLASS_CONFIG")
                           else None)
    if path is not None:
        doc = _read_toml(path)
        engine_doc = doc.pop("engine", {})
        tokens_doc = doc.pop("tokens", [])
        if not isinstance(engine_doc, dict):
            raise InvalidArgument(f"{path}: [engine] must be a table")
        for section, known, entries in (
            ("", SERVER_OPTIONS, doc), ("engine.", ENGINE_OPTIONS, engine_doc),
        ):
            by_name = {o.name: o for o in known}
            for key, raw in entries.items():
                if key not in by_name:
                    raise InvalidArgument(f"{path}: unknown setting {section}{key}")
                values[key] = _apply(by_name[key], raw, f"{path}: {section}{key}")
        tokens.extend(_parse_tokens(tokens_doc, str(path)))

    for option in ALL_OPTIONS:
        if option.env in env:
            values[option.name] = _apply(option, env[option.env], option.env)
    known_env = {o.env for o in ALL_OPTIONS} | {"HOURGLASS_CONFIG", "HOURGLASS_ADMIN_TOKEN"}
    stray = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known_env)
    if stray:
        log.warning("ignoring unknown environment setting(s): %s", ", ".join(stray))
    if env.get("HOURGLASS_ADMIN_TOKEN"):
        token = _check_token(env["HOURGLASS_ADMIN_TOKEN"], "HOURGLASS_ADMIN_TOKEN")
        tokens.append(TokenSpec(token=token, role=Role.ADMIN, name="HOURGLASS_ADMIN_TOKEN"))

    by_name = {o.name: o for o in ALL_OPTIONS}
    for name, raw in (cli or {}).items():
        if raw is not None:
            values[name] = _apply(by_name[name], raw, "--" + name.replace("_", "-"))

    if len({t.token for t in tokens}) != len(tokens):
        raise InvalidArgument("the same token is configured twice")
    server = {o.name: values[o.name] for o in SERVER_OPTIONS if o.name in values}
    settings = Settings(**server, tokens=tuple(tokens), config_file=path)
    if settings.cluster and not settings.node_id:
        raise InvalidArgument("cluster mode (--cluster) needs a --node-id")
    engine = {o.name: values[o.name] for o in ENGINE_OPTIONS if o.name in values}
    return dataclasses.replace(
        settings, engine=EngineConfig(data_dir=settings.data_dir, **engine)
    )

