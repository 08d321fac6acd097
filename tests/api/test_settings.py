"""Settings: defaults < TOML < env < CLI flags, edge forms, loud failures, token bootstrap."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from app import server
from app.settings import (
    DEFAULT_PORT,
    Role,
    Settings,
    load_settings,
    parse_duration_ms,
    parse_size,
)
from scheduler.config import TEN_YEARS_MS
from storage.errors import InvalidArgument

TOKEN = "t" * 24


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hourglass.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert s.host == "127.0.0.1"
    assert s.port == DEFAULT_PORT
    assert s.data_dir == Path("data")
    assert s.engine.data_dir == Path("data")
    assert s.engine.max_body_bytes == 4 << 20
    assert s.engine.max_delay_ms == TEN_YEARS_MS
    assert s.max_batch_messages == 1000
    assert s.tokens == ()


def test_layers_defaults_toml_env_cli(tmp_path: Path) -> None:
    config = write(tmp_path, """
        host = "0.0.0.0"
        port = 9001
        data_dir = "/from/toml"
        max_request_bytes = "8MiB"
        [engine]
        flush_interval_ms = "1s"
        max_delay_ms = "2d"
        timer_shards = 4
    """)
    s = load_settings(config_file=config, env={"HOURGLASS_PORT": "9002",
                                               "HOURGLASS_MAX_DELAY_MS": "3h"},
                      cli={"port": "9003", "host": None})
    assert s.host == "0.0.0.0"  # TOML beats the default
    assert s.port == 9003  # CLI beats env beats TOML
    assert s.max_request_bytes == 8 << 20
    assert s.engine.flush_interval_ms == 1000
    assert s.engine.max_delay_ms == 3 * 3_600_000  # env beats TOML
    assert s.engine.timer_shards == 4
    assert s.data_dir == Path("/from/toml")
    assert s.engine.data_dir == s.data_dir  # the engine follows the server's data_dir
    assert s.config_file == config


def test_config_path_from_environment(tmp_path: Path) -> None:
    config = write(tmp_path, "port = 9100\n")
    assert load_settings(env={"HOURGLASS_CONFIG": str(config)}).port == 9100


@pytest.mark.parametrize(("text", "expected"), [
    (1500, 1500), ("1500", 1500), ("250ms", 250), ("5s", 5000), ("1.5s", 1500), ("2m", 120_000),
    ("2h", 7_200_000), ("1d", 86_400_000), (" 3 H ", 10_800_000),
])
def test_durations(text: object, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    (4096, 4096), ("4MiB", 4 << 20), ("512KiB", 512 << 10), ("1GB", 10**9), ("10b", 10),
    ("1gib", 1 << 30),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"HOURGLASS_PORT": "http"}, "HOURGLASS_PORT: expected an integer"),
    ({"HOURGLASS_PORT": "70000"}, "HOURGLASS_PORT: 70000 must be a TCP port"),
    ({"HOURGLASS_MAX_DELAY_MS": "5 fortnights"}, "HOURGLASS_MAX_DELAY_MS: expected a duration"),
    ({"HOURGLASS_MAX_DELAY_MS": "1.0001ms"}, "not a whole number"),
    ({"HOURGLASS_MAX_BODY_BYTES": "-1"}, "HOURGLASS_MAX_BODY_BYTES: expected a size"),
    ({"HOURGLASS_MAX_BATCH_MESSAGES": "1001"}, "between 1 and 1000"),
    ({"HOURGLASS_SYNC_WRITES": "perhaps"}, "expected true or false"),
    ({"HOURGLASS_FLUSH_POLICY": "never"}, '"async" or "sync"'),
    ({"HOURGLASS_TIMER_SHARDS": "0"}, "must be greater than 0"),
    ({"HOURGLASS_LOG_LEVEL": "loud"}, "must be one of"),
    ({"HOURGLASS_ADMIN_TOKEN": "short"}, "at least 16 characters"),
    ({"HOURGLASS_ADMIN_TOKEN": "with a space in the token"}, "without spaces"),
])
def test_bad_environment_values_fail_loudly(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        load_settings(env=env)


@pytest.mark.parametrize(("text", "message"), [
    ("prot = 1\n", "unknown setting prot"),
    ("[engine]\nflush = 1\n", "unknown setting engine.flush"),
    ("port = \n", "not valid TOML"),
    ("engine = 3\n", r"\[engine\] must be a table"),
    ('[[tokens]]\ntoken = "' + TOKEN + '"\nrole = "root"\n', "role must be one of"),
    ('[[tokens]]\ntoken = "' + TOKEN + '"\nrole = "admin"\ntopics = []\n', "non-empty list"),
    ('[[tokens]]\ntoken = "' + TOKEN + '"\nrole = "admin"\nscope = 1\n', "unknown key"),
    ('[[tokens]]\ntoken = "' + TOKEN + '"\nrole = "admin"\n[[tokens]]\ntoken = "' + TOKEN
     + '"\nrole = "consumer"\n', "same token is configured twice"),
])
def test_bad_config_files_fail_loudly(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_settings(config_file=write(tmp_path, text))


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_settings(config_file=tmp_path / "nope.toml")


def test_tokens_from_file_and_environment(tmp_path: Path) -> None:
    config = write(tmp_path, f"""
        [[tokens]]
        name = "orders-writer"
        token = "{'p' * 20}"
        role = "producer"
        topics = ["orders.*", "audit"]
        [[tokens]]
        token = "{'c' * 20}"
        role = "consumer"
    """)
    s = load_settings(config_file=config, env={"HOURGLASS_ADMIN_TOKEN": "a" * 20})
    by_role = {t.role: t for t in s.tokens}
    assert by_role[Role.PRODUCER].topics == ("orders.*", "audit")
    assert by_role[Role.PRODUCER].name == "orders-writer"
    assert by_role[Role.CONSUMER].topics == ("*",)
    assert by_role[Role.ADMIN].token == "a" * 20
    assert "a" * 20 not in repr(s)  # tokens never show in logs of the settings


def test_list_settings_from_toml_and_environment(tmp_path: Path) -> None:
    config = write(tmp_path, '[engine]\ntransaction_callback_allowed_hosts = ["a.example"]\n')
    assert load_settings(config_file=config).engine.transaction_callback_allowed_hosts == (
        "a.example",)
    s = load_settings(env={"HOURGLASS_TRANSACTION_CALLBACK_ALLOWED_HOSTS": "a.example, b"})
    assert s.engine.transaction_callback_allowed_hosts == ("a.example", "b")


def test_serve_rejects_bad_values_with_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOURGLASS_PORT", "eighty")
    assert server.main(["--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "hourglass serve: error: HOURGLASS_PORT: expected an integer" in err
    assert not any(tmp_path.iterdir())  # nothing created


def test_serve_rejects_a_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert server.main(["--data-dir", str(tmp_path), "--port", "-5"]) == 2
    assert "--port: -5 must be a TCP port" in capsys.readouterr().err


def test_admin_token_generated_once_with_mode_0600(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    first = server.ensure_admin_token(settings)
    path = settings.admin_token_file
    (spec,) = first.tokens
    assert spec.role is Role.ADMIN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == spec.token
    assert len(spec.token) >= 40
    out = capsys.readouterr().err
    assert str(path) in out
    assert spec.token not in out  # where, never what
    again = server.ensure_admin_token(settings)
    assert again.tokens[0].token == spec.token  # reused on the next start


def test_configured_tokens_suppress_generation(tmp_path: Path) -> None:
    settings = load_settings(env={"HOURGLASS_ADMIN_TOKEN": TOKEN},
                             cli={"data_dir": str(tmp_path)})
    assert server.ensure_admin_token(settings) is settings
    assert not settings.admin_token_file.exists()


def test_a_damaged_token_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("HOURGLASS_")]:
        monkeypatch.delenv(name)
    data = tmp_path / "data"
    data.mkdir()
    (data / "admin.token").write_text("\n")
    assert server.main(["--data-dir", str(data)]) == 2
    assert "holds no valid token" in capsys.readouterr().err


def test_serve_reports_a_value_the_engine_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOURGLASS_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("HOURGLASS_MESSAGE_DELAY_LEVEL", "1s 5x")
    assert server.main(["--data-dir", str(tmp_path / "data")]) == 2
    assert "hourglass serve: error: messageDelayLevel" in capsys.readouterr().err
