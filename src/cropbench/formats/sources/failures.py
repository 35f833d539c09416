"""What a failed store request means, as one line naming the object's URL: from a client library's
error, or from an HTTP status and S3's error code."""

from __future__ import annotations

import contextlib
from xml.etree import ElementTree

from cropbench.errors import StoreError
from cropbench.formats.sources.urls import redact, scrub_credentials


def store_error(url: str, key: str, error: BaseException) -> StoreError:
    """One line naming the object's URL and what went wrong, from any obstore or fsspec error."""
    location = redact(f"{url.rstrip('/')}/{key}" if key else url)
    kind = type(error).__name__
    full = scrub_credentials(str(error), url)
    text = " ".join(full.split("Debug source")[0].split())  # obstore appends a multi-line debug dump
    hints = {
        "NotFoundError": "no such bucket or key",
        "FileNotFoundError": "no such bucket or key",
        "PermissionDeniedError": "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        "PermissionError": "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        "UnauthenticatedError": "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    }
    hint = hints.get(kind)
    lowered, details = text.lower(), " ".join(full.split()).lower()
    if hint is not None:
        pass
    elif "nosuchbucket" in lowered or "not found" in lowered or " 404" in lowered:
        hint = "no such bucket or key"
    elif any(word in lowered for word in ("access denied", "accessdenied", "signature", "forbidden", " 403")):
        hint = "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    elif "invalidaccesskeyid" in lowered or " 401" in lowered:
        hint = "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    elif "kind: connect" in details or "connection refused" in details or "dns error" in details:
        hint = "cannot connect: is the endpoint up (AWS_ENDPOINT_URL)?"
    elif "kind: timeout" in details or "timed out" in details or isinstance(error, TimeoutError):
        hint = "timed out (timeout_s, --timeout)"
    elif "connection" in details or "error sending request" in lowered:
        hint = "the connection failed (server gone?)"
    else:
        hint = "store request failed"
    return StoreError(f"{location}: {hint} ({kind}: {text[:160]})")


def status_error(url: str, key: str, status: int, body: bytes) -> StoreError:
    """A non-success HTTP status as one line: the URL, what it means, and the server's error code."""
    location = redact(f"{url.rstrip('/')}/{key}" if key else url)
    code = ""
    with contextlib.suppress(ElementTree.ParseError, ValueError):
        code = ElementTree.fromstring(body).findtext("Code") or "" if body.startswith(b"<") else ""
    meaning = {
        403: "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        401: "not authenticated: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        404: "no such bucket or key",
    }.get(status, "store request failed")
    if code == "NoSuchBucket":
        meaning = "no such bucket"
    elif code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
        meaning = "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    return StoreError(f"{location}: {meaning} (HTTP {status}{' ' + code if code else ''})")
