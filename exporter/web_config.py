"""`--web.config.file`: TLS and basic auth in the format of Prometheus' exporter-toolkit.

The same file node_exporter and the other Go exporters read::

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      # client_ca_file: ca.crt     # with client_auth_type: verify client certificates
      # client_auth_type: RequireAndVerifyClientCert
      # min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...       # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')

Keys of the toolkit that this exporter does not implement (cipher suites, curve
preferences, HTTP/2 and header settings, allowed SANs) are rejected rather than
ignored, so a file never seems to protect more than it does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import ssl
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from config.settings import ConfigError, format_validation_errors, read_yaml

# The toolkit's RequestClientCert and RequireAnyClientCert accept unverified certificates,
# which Python's ssl module cannot do; they are rejected.
ClientAuthType = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]
TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# A valid hash of a random password, checked for unknown users so that a wrong user name
# takes as long as a wrong password (the toolkit does the same).
_DUMMY_HASH = b"$2b$10$/gw2jGJ4.j5.7gBOjPS9ROmVvodVv0SNsanwcxkZhiBYeLiU4lx.a"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    """`tls_server_config`: the server certificate and, optionally, client verification."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: ClientAuthType = "NoClientCert"
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"


class WebConfig(_Strict):
    """The whole web configuration file; both sections are optional."""

    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        import bcrypt

        for user, hashed in (value or {}).items():
            if ":" in user:
                raise ValueError(f"user {user!r}: a user name cannot contain ':'")
            try:
                # Checking an empty password proves the hash is well-formed bcrypt.
                bcrypt.checkpw(b"", hashed.encode())
            except ValueError:
                raise ValueError(f"user {user!r}: not a bcrypt hash") from None
        return value


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes.

    bcrypt is deliberately slow (tens of ms), so a successful check is remembered by a
    SHA-256 of the credentials and runs off the event loop; a scrape every few seconds
    then costs a dictionary lookup.
    """

    def __init__(self, users: dict[str, str]):
        self.users = {user: hashed.encode() for user, hashed in users.items()}
        self._good: set[bytes] = set()

    async def allows(self, header: str | None) -> bool:
        """True when the header carries a configured user and its password."""
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user, sep, password = (
                base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        if key in self._good:
            return True
        hashed = self.users.get(user)
        ok = await asyncio.to_thread(_checkpw, password.encode(), hashed or _DUMMY_HASH)
        if ok and hashed is not None:
            self._good.add(key)
            return True
        return False


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    return bool(bcrypt.checkpw(password, hashed))


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web configuration file; raise ConfigError listing every problem."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: (top level): must be a mapping of keys to values"])
    try:
        config = WebConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"{path}: {e}" for e in format_validation_errors(exc, data)]) from None
    tls = config.tls_server_config
    if tls is not None:
        # As in the toolkit, relative paths are relative to the web config file.
        base = path.parent
        tls = tls.model_copy(
            update={
                "cert_file": base / tls.cert_file,
                "key_file": base / tls.key_file,
                "client_ca_file": None if tls.client_ca_file is None else base / tls.client_ca_file,
            }
        )
        config = config.model_copy(update={"tls_server_config": tls})
        ssl_context(config)  # an unreadable certificate is a configuration error
    return config


def ssl_context(config: WebConfig) -> ssl.SSLContext | None:
    """The server TLS context of a web configuration, None without `tls_server_config`."""
    tls = config.tls_server_config
    if tls is None:
        return None
    errors = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        errors.append(f"tls_server_config: cannot load cert_file/key_file: {_reason(exc)}")
    needs_ca = tls.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            errors.append(f"tls_server_config.client_ca_file: cannot load: {_reason(exc)}")
    elif needs_ca:
        errors.append(
            f"tls_server_config: client_auth_type {tls.client_auth_type} needs client_ca_file"
        )
    if tls.client_auth_type == "RequireAndVerifyClientCert":
        context.verify_mode = ssl.CERT_REQUIRED
    elif tls.client_auth_type == "VerifyClientCertIfGiven":
        context.verify_mode = ssl.CERT_OPTIONAL
    if errors:
        raise ConfigError(errors)
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


def describe(config: WebConfig) -> str:
    """One line for the startup log: what protects the endpoint."""
    parts = []
    if config.tls_server_config is not None:
        parts.append("TLS")
    if config.basic_auth_users:
        parts.append(f"basic auth ({len(config.basic_auth_users)} users)")
    return " + ".join(parts) or "no TLS, no auth"
