"""TLS, basic auth and response headers from a web configuration file, in the exporter-toolkit's format.

The file a node_exporter takes with ``--web.config.file`` works here::

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12           # optional: TLS10 to TLS13; max_version likewise
    http_server_config:
      headers:                     # optional, added to every response
        X-Content-Type-Options: nosniff
    basic_auth_users:
      prometheus: $2y$10$...       # bcrypt hash, e.g. from `htpasswd -nBC 10 "" | tr -d ':'`

Keys of the toolkit's format that inferwatch does not implement come in two kinds. Those that only tune
what is already safe (``cipher_suites``, ``prefer_server_cipher_suites``, ``curve_preferences``,
``http2``, ``rate_limit``) are accepted and ignored with a warning, so a node_exporter's file works. Those
whose absence would let in a client the file means to keep out, or leave TLS without a certificate
(``client_allowed_sans``, inline ``cert``/``key``/``client_ca``, the client-auth types Python's TLS
cannot express), are refused. Any other key is a misspelling and refused too: it must not silently turn
TLS off. Every refusal is a :class:`ConfigError`. Both endpoints take this file: the exporter's
``--web.config.file`` and the instrumentation endpoint's ``INFERWATCH_WEB_CONFIG_FILE``.

An empty file is refused too: a ConfigMap is briefly empty while it is updated, and "no TLS, no auth"
is never what such a file means. A file that would serve with less than the one in use (TLS off, basic
auth off, client certificates no longer required) is refused on reload (:func:`check_reload`): turning
security off takes a restart, so that a truncated file cannot do it silently.

Checking a bcrypt hash costs tens of milliseconds by design, so a credential that passed once is
remembered (as a SHA-256 of user and password, never the password) and later scrapes skip bcrypt; a
reload keeps what was remembered for every user whose hash did not change.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_HTTP_KEYS = {"headers"}
# Accepted and ignored with a warning: without them TLS is Python's default, which is safe.
_IGNORED = {
    "": {"rate_limit"},
    "tls_server_config": {"cipher_suites", "prefer_server_cipher_suites", "curve_preferences"},
    "http_server_config": {"http2"},
}
_REFUSED = {
    "cert": "inline certificates are not supported: use cert_file",
    "key": "inline keys are not supported: use key_file",
    "client_ca": "an inline client CA is not supported: use client_ca_file",
    "client_allowed_sans": "client_allowed_sans is not supported (ignoring it would let in clients the "
    "file keeps out)",
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The toolkit's headers, with the values it allows where it restricts them (None: any string).
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT_HASH = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
# bcrypt reads at most 72 bytes of a password; a longer one cannot be the password of any hash here.
_BCRYPT_MAX_PASSWORD = 72

Credentials = tuple[str, bytes]


class ConfigError(ValueError):
    """A flag, environment variable or web configuration file is unusable; the message names it."""


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes; thread-safe."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        import bcrypt  # only where basic auth is configured: the GPU nodes' image may lack it

        self._bcrypt = bcrypt
        self._users = dict(users)
        # Checked against for unknown users too, so that a reply's timing does not tell which users exist.
        self._decoy = next(iter(self._users.values()))
        self._passed: set[tuple[str, bytes]] = set()  # (user, digest of user and password)
        self._lock = threading.Lock()

    def keep_remembered(self, previous: BasicAuth) -> None:
        """Remember what ``previous`` remembered for users whose hash is the same here: a reload that
        leaves the users as they were must not send every scraper through bcrypt at once."""
        same = {user for user, hashed in self._users.items() if previous._users.get(user) == hashed}
        with previous._lock:
            kept = {entry for entry in previous._passed if entry[0] in same}
        with self._lock:
            self._passed |= kept

    @staticmethod
    def credentials(header: str | None) -> Credentials | None:
        """User and password from an ``Authorization`` header (the scheme in any case, RFC 9110 11.1)."""
        scheme, _, token = (header or "").strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        return (user, password.encode()) if sep else None

    def remembered(self, credentials: Credentials) -> bool:
        """Whether these credentials passed bcrypt before (microseconds, no bcrypt)."""
        with self._lock:
            return (credentials[0], _digest(credentials)) in self._passed

    def verify(self, credentials: Credentials) -> bool:
        """bcrypt's answer (tens of milliseconds), remembered when it is yes."""
        user, password = credentials
        if len(password) > _BCRYPT_MAX_PASSWORD:
            return False
        hashed = self._users.get(user)
        ok = self._bcrypt.checkpw(password, hashed or self._decoy) and hashed is not None
        if ok:
            with self._lock:
                self._passed.add((user, _digest(credentials)))
        return ok

    def check(self, header: str | None) -> bool:
        credentials = self.credentials(header)
        return credentials is not None and (self.remembered(credentials) or self.verify(credentials))


def _digest(credentials: Credentials) -> bytes:
    user, password = credentials
    return hashlib.sha256(user.encode() + b"\0" + password).digest()


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: tuple[tuple[str, str], ...] = ()


def load_web_config(path: str) -> WebConfig:
    """Read and check the file; raises :class:`ConfigError` with the reason if unusable. Keys
    that are ignored are logged as warnings."""
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
    if document is None:
        raise ConfigError(
            f"--web.config.file {path}: the file is empty (write {{}} for a file that sets nothing)"
        )
    try:
        return _build(document, Path(path).resolve().parent, path)
    except (ValueError, OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--web.config.file {path}: {_one_line(exc)}") from None


def check_reload(previous: WebConfig, new: WebConfig, path: str) -> None:
    """Raise :class:`ConfigError` if serving ``new`` instead of ``previous`` would turn TLS, basic
    auth or a client-certificate requirement off; the message names each."""
    lost = []
    before, after = previous.ssl_context, new.ssl_context
    if before is not None and after is None:
        lost.append("TLS")
    elif before is not None and after is not None and after.verify_mode < before.verify_mode:
        lost.append("the client-certificate requirement")
    if previous.auth is not None and new.auth is None:
        lost.append("basic auth")
    if lost:
        raise ConfigError(
            f"--web.config.file {path}: the new file turns {' and '.join(lost)} off; "
            "that takes a restart, not a reload"
        )


def _build(document: Any, base: Path, path: str) -> WebConfig:
    _check_keys(document, _TOP_KEYS, "", path)
    tls = document.get("tls_server_config")
    users = document.get("basic_auth_users")
    http = document.get("http_server_config")
    if http is not None:
        _check_keys(http, _HTTP_KEYS, "http_server_config", path)
    return WebConfig(
        ssl_context=_ssl_context(tls, base, path) if tls is not None else None,
        auth=BasicAuth(_users(users)) if users else None,
        headers=_headers((http or {}).get("headers")),
    )


def _ssl_context(tls: Any, base: Path, path: str) -> ssl.SSLContext:
    _check_keys(tls, _TLS_KEYS, "tls_server_config", path)
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise ValueError("tls_server_config needs both cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _choice(tls.get("min_version", "TLS12"), _TLS_VERSIONS, "min_version")
    context.maximum_version = _choice(tls.get("max_version", "TLS13"), _TLS_VERSIONS, "max_version")
    if context.minimum_version > context.maximum_version:
        raise ValueError("min_version is above max_version")
    verify_mode = _choice(tls.get("client_auth_type", "NoClientCert"), _CLIENT_AUTH, "client_auth_type")
    context.load_cert_chain(base / tls["cert_file"], base / tls["key_file"])
    context.verify_mode = verify_mode
    if context.verify_mode != ssl.CERT_NONE:
        if not tls.get("client_ca_file"):
            raise ValueError(f"client_auth_type {tls['client_auth_type']} needs client_ca_file")
        context.load_verify_locations(base / tls["client_ca_file"])
    return context


def _users(users: Any) -> dict[str, bytes]:
    if not isinstance(users, dict):
        raise ValueError("basic_auth_users must map user names to bcrypt hashes")
    try:
        import bcrypt
    except ImportError:
        raise ValueError("basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    out = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            raise ValueError(f"basic_auth_users: the password of {user!r} is not a bcrypt hash")
        try:
            # bcrypt parses the cost and salt as it checks: a hash it cannot use fails now, not per request.
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError as exc:
            raise ValueError(f"basic_auth_users: the bcrypt hash of {user!r} is unusable: {exc}") from None
        out[str(user)] = hashed.encode()
    return out


def _headers(headers: Any) -> tuple[tuple[str, str], ...]:
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise ValueError("http_server_config.headers must map header names to values")
    out = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise ValueError(f"http_server_config.headers: {name!r} is not one of {', '.join(_HEADERS)}")
        allowed = _HEADERS[name]
        if not isinstance(value, str) or (allowed is not None and value.lower() not in allowed):
            wanted = f"one of {', '.join(allowed)}" if allowed else "a string"
            raise ValueError(f"http_server_config.headers: {name} must be {wanted}, got {value!r}")
        if value:  # blank means unset, as in the toolkit
            out.append((name, value))
    return tuple(out)


def _check_keys(section: Any, allowed: set[str], where: str, path: str) -> None:
    named = where or "the file"
    if not isinstance(section, dict):
        raise ValueError(f"{named} must be a mapping")
    ignored = _IGNORED.get(where, set())
    for key in sorted(map(str, section)):
        if key in _REFUSED and where == "tls_server_config":
            raise ValueError(f"tls_server_config: {_REFUSED[key]}")
        if key in ignored:
            log.warning(
                "--web.config.file %s: %s%s is not supported by inferwatch and is ignored",
                path,
                f"{where}." if where else "",
                key,
            )
    unknown = sorted(set(map(str, section)) - allowed - ignored)
    if unknown:
        raise ValueError(
            f"unknown key(s) in {named}: {', '.join(unknown)} (known: {', '.join(sorted(allowed | ignored))})"
        )


def _choice(value: Any, choices: Mapping[str, Any], key: str) -> Any:
    if value not in choices:
        raise ValueError(f"{key} {value!r} is not one of {', '.join(choices)}")
    return choices[value]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
