"""How a profile's key reaches the vendor (`auth_scheme`): a header, a query
parameter, or a JWT (HS256) signed from an access key and a secret.

The JWT is small enough to write here (RFC 7519 with RFC 7515's HS256):
base64url(header) "." base64url(claims) "." base64url(HMAC-SHA256). A
token is kept and re-signed once less than `RESIGN_SHARE` of its life is
left, so no request leaves with a token about to expire on the wire.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass

from dispatcher.logs import redact
from dispatcher.profiles import ApiSpec

RESIGN_SHARE = 0.25  # re-sign when a quarter of the token's life is left
NOT_BEFORE_SLACK_S = 5  # vendors' clocks run a little behind ours


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_hs256(claims: dict[str, object], secret: str) -> str:
    """A compact JWT of `claims`, signed with HMAC-SHA256."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{body}".encode("ascii")
    signature = hmac.new(secret.encode("utf-8"), signing_input, hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


@dataclass(frozen=True)
class Token:
    value: str
    expires_at: float  # epoch seconds
    ttl_s: float
    issuer: str

    def fresh(self, now: float, issuer: str) -> bool:
        return issuer == self.issuer and self.expires_at - now > self.ttl_s * RESIGN_SHARE


def new_token(issuer: str, secret: str, now: float, ttl_s: float) -> Token:
    exp = int(now + ttl_s)
    claims: dict[str, object] = {"iss": issuer, "exp": exp, "nbf": int(now) - NOT_BEFORE_SLACK_S}
    return Token(sign_hs256(claims, secret), float(exp), ttl_s, issuer)


@dataclass(frozen=True)
class Credentials:
    headers: dict[str, str]
    query: dict[str, str]


class KeyRing:
    """One per provider: reads the key variables at each call (a key set
    while the service runs is used at once) and keeps the signed JWT."""

    def __init__(self) -> None:
        self._token: Token | None = None

    def credentials(self, api: ApiSpec, now: float) -> Credentials:
        key = os.environ.get(api.auth_env) if api.auth_env else None
        if not key:
            return Credentials({}, {})
        if api.auth_scheme == "query":
            return Credentials({}, {api.auth_query: key})
        if api.auth_scheme == "jwt-hs256":
            secret = os.environ.get(api.auth_secret_env or "")
            if not secret:
                return Credentials({}, {})
            redact(secret)
            if self._token is None or not self._token.fresh(now, key):
                self._token = new_token(key, secret, now, api.auth_ttl_s)
                redact(self._token.value)
            return Credentials({api.auth_header: f"{api.auth_prefix}{self._token.value}"}, {})
        return Credentials({api.auth_header: f"{api.auth_prefix}{key}"}, {})
