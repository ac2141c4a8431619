"""TLS and basic auth from a web configuration file, in the format of the Prometheus exporter-toolkit.

The same file a node_exporter takes with ``--web.config.file`` works here::

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12           # optional: TLS12 or TLS13
    basic_auth_users:
      prometheus: $2y$10$...       # bcrypt hash, e.g. from `htpasswd -nBC 10 "" | tr -d ':'`

Unknown keys are errors, as in the exporter-toolkit: a misspelt key must not silently turn TLS off.
Checking a bcrypt hash costs tens of milliseconds by design, so a credential that passed once is
remembered (as a SHA-256 of user and password, never the password) and later scrapes skip bcrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

_TOP_KEYS = {"tls_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        import bcrypt  # only where basic auth is configured: the GPU nodes' image may lack it

        self._bcrypt = bcrypt
        self._users = dict(users)
        # Checked against for unknown users too, so that a reply's timing does not tell which users exist.
        self._decoy = next(iter(self._users.values()))
        self._passed: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        digest = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if digest in self._passed:
                return True
        hashed = self._users.get(user)
        ok = self._bcrypt.checkpw(password.encode(), hashed or self._decoy) and hashed is not None
        if ok:
            with self._lock:
                self._passed.add(digest)
        return ok


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None


def load_web_config(path: str) -> WebConfig:
    """Read and check the file; raises :class:`.errors.ConfigError` with the reason if unusable."""
    if not path:
        return WebConfig()
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"--web.config.file {path}: reading it needs PyYAML (pip install pyyaml)") from None
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--web.config.file {path}: {_one_line(exc)}") from None
    try:
        return _build(document if document is not None else {}, Path(path).resolve().parent)
    except (ValueError, OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--web.config.file {path}: {_one_line(exc)}") from None


def _build(document: Any, base: Path) -> WebConfig:
    _check_keys(document, _TOP_KEYS, "the file")
    tls = document.get("tls_server_config")
    users = document.get("basic_auth_users")
    return WebConfig(
        ssl_context=_ssl_context(tls, base) if tls is not None else None,
        auth=BasicAuth(_users(users)) if users else None,
    )


def _ssl_context(tls: Any, base: Path) -> ssl.SSLContext:
    _check_keys(tls, _TLS_KEYS, "tls_server_config")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise ValueError("tls_server_config needs both cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _choice(tls.get("min_version", "TLS12"), _TLS_VERSIONS, "min_version")
    context.load_cert_chain(base / tls["cert_file"], base / tls["key_file"])
    context.verify_mode = _choice(
        tls.get("client_auth_type", "NoClientCert"), _CLIENT_AUTH, "client_auth_type"
    )
    if context.verify_mode == ssl.CERT_REQUIRED:
        if not tls.get("client_ca_file"):
            raise ValueError("client_auth_type RequireAndVerifyClientCert needs client_ca_file")
        context.load_verify_locations(base / tls["client_ca_file"])
    return context


def _users(users: Any) -> dict[str, bytes]:
    if not isinstance(users, dict):
        raise ValueError("basic_auth_users must map user names to bcrypt hashes")
    out = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES) or len(hashed) != 60:
            raise ValueError(f"basic_auth_users: the password of {user!r} is not a bcrypt hash")
        out[str(user)] = hashed.encode()
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise ValueError(
            "basic_auth_users needs the bcrypt package (pip install 'inferwatch[exporter]')"
        ) from None
    return out


def _check_keys(section: Any, allowed: set[str], where: str) -> None:
    if not isinstance(section, dict):
        raise ValueError(f"{where} must be a mapping")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) in {where}: {', '.join(map(str, unknown))} (known: {', '.join(sorted(allowed))})"
        )


def _choice(value: Any, choices: Mapping[str, Any], key: str) -> Any:
    if value not in choices:
        raise ValueError(f"{key} {value!r} is not one of {', '.join(choices)}")
    return choices[value]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
