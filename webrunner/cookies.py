"""Session files an operator brings: Playwright storage state or Netscape cookies.txt.

Pure functions: text in, cookies (in the shape `BrowserContext.add_cookies`
takes) out, or a `CookieFileError` naming the line or field at fault.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from dispatcher.errors import InputError

# A cookie without an expiry lives only as long as the browser: the profile
# would lose it at the graceful close that writes it to disk. It is kept
# this long instead (a site that wants it shorter expires it server-side).
SESSION_COOKIE_KEEP_S = 30 * 24 * 3600
_SAME_SITE = {"strict": "Strict", "lax": "Lax", "none": "None"}
# The leading marker of an HttpOnly cookie in a Netscape file (curl's and
# the browser extensions' convention).
_HTTPONLY_PREFIX = "#HttpOnly_"


class CookieFileError(InputError):
    """A session file that is neither valid storage state nor cookies.txt."""


def parse_session_file(text: str, *, now: float) -> list[dict[str, Any]]:
    """Cookies from a storage-state JSON (starts with "{") or a Netscape cookies.txt."""
    if not text.strip():
        raise CookieFileError("the file is empty")
    storage_state = text.lstrip().startswith("{")
    cookies = parse_storage_state(text) if storage_state else parse_netscape(text)
    if not cookies:
        raise CookieFileError("the file holds no cookies")
    return [_persistent(c, now) for c in cookies]


def site_host(url: str) -> str:
    """The host of a web model's page (lower case), whose cookies an import keeps."""
    host = urlsplit(url).hostname
    if not host:
        raise CookieFileError(f"the model's page {url!r} names no host to keep cookies for")
    return host.lower()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def belongs_to_site(domain: str, host: str) -> bool:
    """True for a cookie of `host`: set for it, for a parent domain it is under
    (`.example.com` for chat.example.com), or for one of its subdomains.

    A single-label parent (`.com`) is not the site's, nor is anything but the
    address itself for a host that is an IP address.
    """
    name = domain.lstrip(".").lower()
    if name == host:
        return True
    if _is_ip(host) or _is_ip(name):
        return False
    parent = host.endswith("." + name) and "." in name
    return parent or name.endswith("." + host)


def site_cookies(cookies: list[dict[str, Any]], url: str) -> tuple[list[dict[str, Any]], int]:
    """The cookies that belong to the page at `url`'s site, and how many others were dropped.

    A session file exported from a browser often holds every site's cookies;
    the account's profile is for one site and must not carry another's
    (a bank's session would sit in a profile that pages of the model's site
    run in).
    """
    host = site_host(url)
    kept = [c for c in cookies if belongs_to_site(str(c["domain"]), host)]
    return kept, len(cookies) - len(kept)


def _persistent(cookie: dict[str, Any], now: float) -> dict[str, Any]:
    expires = cookie.get("expires", -1)
    if not isinstance(expires, int | float) or expires <= 0:
        return {**cookie, "expires": float(int(now) + SESSION_COOKIE_KEEP_S)}
    return cookie


def parse_storage_state(text: str) -> list[dict[str, Any]]:
    """The `cookies` of a Playwright storage state (`context.storage_state()`)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CookieFileError(f"not valid JSON: line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("cookies"), list):
        raise CookieFileError("a storage-state file needs a `cookies` list")
    cookies = []
    for i, item in enumerate(raw["cookies"]):
        where = f"cookies[{i}]"
        if not isinstance(item, dict):
            raise CookieFileError(f"{where} is not an object")
        cookie: dict[str, Any] = {}
        for key in ("name", "value", "domain"):
            value = item.get(key)
            if not isinstance(value, str) or (key != "value" and not value):
                raise CookieFileError(f"{where}.{key} must be a non-empty string")
            cookie[key] = value
        path = item.get("path", "/")
        if not isinstance(path, str) or not path.startswith("/"):
            raise CookieFileError(f"{where}.path must start with '/'")
        cookie["path"] = path
        expires = item.get("expires", -1)
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            raise CookieFileError(f"{where}.expires must be a number (epoch seconds, -1: none)")
        cookie["expires"] = float(expires)
        for flag in ("httpOnly", "secure"):
            value = item.get(flag, False)
            if not isinstance(value, bool):
                raise CookieFileError(f"{where}.{flag} must be true or false")
            cookie[flag] = value
        same_site = item.get("sameSite", "Lax")
        if not isinstance(same_site, str) or same_site.lower() not in _SAME_SITE:
            raise CookieFileError(f"{where}.sameSite must be Strict, Lax or None")
        cookie["sameSite"] = _SAME_SITE[same_site.lower()]
        cookies.append(cookie)
    return cookies


def parse_netscape(text: str) -> list[dict[str, Any]]:
    """A Netscape cookies.txt: seven tab-separated fields a line, '#' comments."""
    cookies = []
    for number, line in enumerate(text.splitlines(), start=1):
        http_only = line.startswith(_HTTPONLY_PREFIX)
        if http_only:
            line = line[len(_HTTPONLY_PREFIX) :]
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 7:
            raise CookieFileError(
                f"line {number}: {len(fields)} tab-separated fields, a cookies.txt line has 7 "
                "(domain, subdomains, path, secure, expiry, name, value)"
            )
        domain, subdomains, path, secure, expiry, name, value = fields
        if not domain or not name:
            raise CookieFileError(f"line {number}: the domain and the name must not be empty")
        flags = {"subdomains": subdomains, "secure": secure}
        for field, flag in flags.items():
            if flag.upper() not in ("TRUE", "FALSE"):
                raise CookieFileError(f"line {number}: {field} must be TRUE or FALSE, not {flag!r}")
        if not path.startswith("/"):
            raise CookieFileError(f"line {number}: the path must start with '/'")
        if not expiry.isascii() or not expiry.isdigit():
            raise CookieFileError(f"line {number}: the expiry must be epoch seconds (0: none)")
        # A leading dot is how the format says "and its subdomains".
        if subdomains.upper() == "TRUE" and not domain.startswith("."):
            domain = "." + domain
        cookies.append(
            {
                "name": name,
                "value": value,
                "domain": domain,
                "path": path,
                "expires": float(expiry) if int(expiry) > 0 else -1.0,
                "httpOnly": http_only,
                "secure": secure.upper() == "TRUE",
                "sameSite": "Lax",
            }
        )
    return cookies
