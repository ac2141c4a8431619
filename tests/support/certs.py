"""Test credentials made on the spot: a self-signed certificate (openssl CLI) and bcrypt hashes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import bcrypt


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 and its key, valid for a day."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


def bcrypt_hash(password: str) -> str:
    """In the ``$2y$`` spelling htpasswd writes, which exporter-toolkit configs usually hold."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return "$2y$" + hashed[4:]
