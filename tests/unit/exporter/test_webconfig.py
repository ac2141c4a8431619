"""The web config file: what it accepts, what it rejects (one line each), and basic-auth checking."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from inferwatch.exporter.errors import ConfigError
from inferwatch.exporter.webconfig import BasicAuth, load_web_config

from tests.unit.exporter.certs import bcrypt_hash, self_signed_certificate


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def test_tls_and_users_relative_to_the_file(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    (tmp_path / cert.name).write_bytes(cert.read_bytes())
    (tmp_path / key.name).write_bytes(key.read_bytes())
    config = load_web_config(
        write(
            tmp_path,
            f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n  min_version: TLS13\n"
            f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret')}'\n",
        )
    )
    assert config.ssl_context is not None
    assert config.auth is not None and config.auth.check(basic("prometheus", "s3cret"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  certfile: c\n", "unknown key.*certfile"),
        ("tls_server_confg: {}\n", "unknown key.*tls_server_confg"),
        ("tls_server_config:\n  cert_file: a.crt\n", "needs both cert_file and key_file"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "No such file"),
        ("basic_auth_users:\n  alice: plaintext\n", "not a bcrypt hash"),
        ("basic_auth_users: [alice]\n", "must map user names"),
        ("tls_server_config: [\n", "web.yml"),
    ],
)
def test_unusable_files_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_web_config(write(tmp_path, text))
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nothing\.yml"):
        load_web_config(str(tmp_path / "nothing.yml"))


def test_basic_auth_accepts_only_the_right_password_and_remembers_it() -> None:
    auth = BasicAuth({"alice": bcrypt_hash("right").encode()})
    for header in (None, "Bearer x", "Basic !!!", basic("alice", "wrong"), basic("bob", "right")):
        assert not auth.check(header), header
    started = time.perf_counter()
    assert auth.check(basic("alice", "right"))
    first = time.perf_counter() - started
    started = time.perf_counter()
    assert auth.check(basic("alice", "right"))
    assert time.perf_counter() - started < first / 5  # no second bcrypt round
