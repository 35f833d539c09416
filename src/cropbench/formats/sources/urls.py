"""Plate URLs: which strings are URLs, their parts, where their requests go, and their credentials
masked in every message."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from cropbench.config import StoreConfig
from cropbench.errors import ConfigError

#: URL schemes a plate may be given as.
REMOTE_SCHEMES = ("s3", "http", "https")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")


def redact(url: str) -> str:
    """``url`` with the credentials of its user part replaced by ``***`` (for every message and log line)."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match[2].partition(":")
        return f"{match[1]}{user}:***@" if colon else f"{match[1]}***@"

    return _USERINFO.sub(hide, url, count=1)


def without_credentials(url: str) -> str:
    """``url`` without its user part: where requests go (urllib3 never sent a URL's user part anyway, and a
    SigV4 signature over a host that carries it would put the password into a header)."""
    return _USERINFO.sub(r"\1", url, count=1)


def is_url(plate: str | Path) -> bool:
    """Whether ``plate`` names an object-store location rather than a local path (a malformed URL of
    such a scheme is a :class:`ConfigError`, not a local path)."""
    if not isinstance(plate, str):
        return False
    scheme = _SCHEME.match(plate)
    if scheme is None or scheme[1].lower() not in REMOTE_SCHEMES:
        return False
    split_url(plate)
    return True


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket or host, prefix without slashes) of a plate URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here, not at the first request
    except ValueError as error:  # "Invalid IPv6 URL", a port out of range or not a number
        raise ConfigError(
            f"plate URL {redact(url)!r} is not s3://bucket/prefix or http(s)://host/path: {error}"
        ) from None
    if parts.scheme not in REMOTE_SCHEMES or not parts.netloc:
        raise ConfigError(f"plate URL {redact(url)!r} is not s3://bucket/prefix or http(s)://host/path")
    return parts.scheme, parts.netloc, parts.path.strip("/")


def s3_endpoint(config: StoreConfig) -> str:
    """The S3 endpoint requests go to: the config's, else ``AWS_ENDPOINT_URL``, else AWS ("")."""
    return config.endpoint or os.environ.get("AWS_ENDPOINT_URL", "")


def http_url(url: str, config: StoreConfig) -> str:
    """An HTTP plate URL with the config's endpoint (scheme and host) in place of its own."""
    if not config.endpoint:
        return url
    _, _, prefix = split_url(url)
    return f"{config.endpoint.rstrip('/')}/{prefix}"


def scrub_credentials(text: str, url: str) -> str:
    """``text`` (a client library's message) with the user part of ``url``, if any, masked wherever it appears."""
    userinfo = urlsplit(url).netloc.rpartition("@")[0] if "@" in url else ""
    return text.replace(userinfo, redact(f"x://{userinfo}@")[4:-1]) if userinfo else text
