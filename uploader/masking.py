"""Keep credentials out of reprs, logs and error messages.

Error text often quotes what the server or a library saw (an echoed header, a proxy URL), so
redaction is applied to any text that came from outside, not only to our own formatting.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote, urlsplit, urlunsplit

MASK = "***"
_MIN_SECRET_LEN = 4  # shorter strings would blank out ordinary words


def mask_authorization(value: str) -> str:
    """Keep the scheme word ("AppKey", "Bearer") because it is the usual thing to get wrong."""
    if not value:
        return ""
    scheme, sep, _ = value.strip().partition(" ")
    return f"{scheme} {MASK}" if sep else MASK


def mask_url_password(url: str | None) -> str | None:
    """Show who and where, hide the password, e.g. http://user:***@proxy:3128."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """Replace each secret, and its percent-encoded form, wherever it appears in `text`."""
    for secret in secrets:
        if not secret or len(secret) < _MIN_SECRET_LEN:
            continue
        for form in {secret, quote(secret, safe="")}:
            text = text.replace(form, MASK)
    return text


def authorization_secrets(value: str) -> tuple[str, ...]:
    """The whole header and its credential part, so either spelling is redacted."""
    credential = value.strip().partition(" ")[2].strip()
    return tuple(s for s in (value, value.strip(), credential) if s)
