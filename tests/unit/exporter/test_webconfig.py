"""The web config file: what it accepts, what it rejects (one line each), and basic-auth checking."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from inferwatch.common.webconfig import BasicAuth, WebConfig, check_reload, load_web_config
from inferwatch.exporter.errors import ConfigError
from tests.support.certs import bcrypt_hash, self_signed_certificate


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
        # The right prefix and length, but a salt bcrypt cannot decode: refused now, not at every login.
        ("basic_auth_users:\n  alice: '$2y$10$" + "!" * 53 + "'\n", "not a bcrypt hash"),
        ("basic_auth_users:\n  alice: '$2y$99$" + "a" * 53 + "'\n", "bcrypt hash of 'alice' is unusable"),
        # Keys whose absence would let in clients the file keeps out, or leave TLS without a certificate.
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
            "client_allowed_sans",
        ),
        ("tls_server_config:\n  cert: PEM\n  key: PEM\n", "inline certificates are not supported"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequestClientCert\n",
            "RequestClientCert",
        ),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allowall\n", "X-Frame-Options must be"),
        ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "'X-Powered-By' is not one of"),
        ("http_server_config:\n  http3: true\n", "unknown key.*http3"),
        ("basic_auth_users: [alice]\n", "must map user names"),
        ("tls_server_config: [\n", "web.yml"),
        # A ConfigMap briefly empty while it is updated: never "no TLS, no auth".
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
    ],
)
def test_unusable_files_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_web_config(write(tmp_path, text))
    assert "\n" not in str(caught.value)


def test_node_exporter_keys_inferwatch_lacks_are_ignored_with_a_warning(
    tmp_path: Path, certificate: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = certificate
    text = (
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  max_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n  prefer_server_cipher_suites: true\n"
        "  curve_preferences: [CurveP256]\n"
        "http_server_config:\n  http2: false\n  headers:\n    X-Content-Type-Options: nosniff\n"
        "    Strict-Transport-Security: max-age=31536000\n    Content-Security-Policy: ''\n"
        "rate_limit:\n  interval: 1s\n  burst: 10\n"
    )
    with caplog.at_level(logging.WARNING, logger="inferwatch.common.webconfig"):
        config = load_web_config(write(tmp_path, text))
    assert config.ssl_context is not None
    assert config.headers == (
        ("X-Content-Type-Options", "nosniff"),
        ("Strict-Transport-Security", "max-age=31536000"),
    )  # a blank header is unset, as in the toolkit
    ignored = sorted(r.getMessage().split(": ", 1)[1] for r in caplog.records)
    assert ignored == sorted(
        f"{key} is not supported by inferwatch and is ignored"
        for key in (
            "tls_server_config.cipher_suites",
            "tls_server_config.prefer_server_cipher_suites",
            "tls_server_config.curve_preferences",
            "http_server_config.http2",
            "rate_limit",
        )
    )


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nothing\.yml"):
        load_web_config(str(tmp_path / "nothing.yml"))


def test_basic_auth_accepts_only_the_right_password_and_remembers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import bcrypt

    auth = BasicAuth({"alice": bcrypt_hash("right").encode()})
    for header in (None, "Bearer x", "Basic !!!", basic("alice", "wrong"), basic("bob", "right")):
        assert not auth.check(header), header
    rounds = []
    checkpw = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda *args: rounds.append(args) or checkpw(*args))
    assert auth.check(basic("alice", "right"))
    assert len(rounds) == 1
    assert auth.check(basic("alice", "right"))
    assert len(rounds) == 1  # no second bcrypt round: counted, where a wall-time ratio was compared


def test_basic_auth_scheme_is_case_insensitive_and_long_passwords_are_no() -> None:
    auth = BasicAuth({"alice": bcrypt_hash("right").encode()})
    assert auth.check(basic("alice", "right").replace("Basic", "bAsIc"))
    # bcrypt reads 72 bytes: a longer password is refused, never truncated, never an exception.
    assert not auth.check(basic("alice", "right" + "x" * 100))
    assert not auth.check(basic("alice", "é" * 40))


def test_a_reload_that_turns_tls_auth_or_client_certificates_off_is_refused(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    tls = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    mutual = tls + f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {cert}\n"
    users = f"basic_auth_users:\n  alice: '{bcrypt_hash('right')}'\n"
    headers = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    cases = [
        (tls + users, headers, "turns TLS and basic auth off"),
        (tls + users, users, "turns TLS off"),
        (tls + users, tls, "turns basic auth off"),
        (mutual, tls, "turns the client-certificate requirement off"),
    ]
    for before, after, message in cases:
        previous, new = load_web_config(write(tmp_path, before)), load_web_config(write(tmp_path, after))
        with pytest.raises(ConfigError, match=message):
            check_reload(previous, new, "web.yml")
    # Anything that keeps them on, or turns them on, is a reload.
    for before, after in [(tls + users, tls + users + headers), (users, tls + users), (headers, users)]:
        check_reload(load_web_config(write(tmp_path, before)), load_web_config(write(tmp_path, after)), "x")
    check_reload(WebConfig(), WebConfig(), "x")


def test_a_reload_keeps_remembered_credentials_of_users_whose_hash_did_not_change() -> None:
    alice, bob = bcrypt_hash("right").encode(), bcrypt_hash("other").encode()
    previous = BasicAuth({"alice": alice, "bob": bob})
    assert previous.verify(("alice", b"right")) and previous.verify(("bob", b"other"))
    new = BasicAuth({"alice": alice, "bob": bcrypt_hash("other").encode()})  # bob's hash is a new one
    new.keep_remembered(previous)
    assert new.remembered(("alice", b"right"))
    assert not new.remembered(("bob", b"other"))
