"""Keep credentials out of reprs, logs and error messages.

Error text often quotes what the server or a library saw (an echoed header, a proxy URL), so
redaction is applied to any text that came from outside, not only to our own formatting.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from urllib.parse import quote

MASK = "***"
_MIN_SECRET_LEN = 4  # shorter strings would blank out ordinary words
# `scheme://userinfo@`: up to the last "@" before the path, as urlsplit reads it, so an unencoded
# "@" inside a password cannot leave its tail visible.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def mask_authorization(value: str) -> str:
    """Keep the scheme word ("AppKey", "Bearer") because it is the usual thing to get wrong."""
    if not value:
        return ""
    scheme, sep, _ = value.strip().partition(" ")
    return f"{scheme} {MASK}" if sep else MASK


def mask_userinfo(text: str, mask: str = MASK) -> str:
    """Hide every credential written into a URL, keeping scheme, host and port: http://***@proxy:3128.

    The whole userinfo goes, not only the password: `https://<token>@host` carries its secret in the
    user part.
    """
    return _URL_USERINFO.sub(lambda match: f"{match['scheme']}{mask}@", text)


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """Replace each secret, and its percent-encoded form, wherever it appears in `text`; mask URL userinfo."""
    for secret in secrets:
        if not secret or len(secret) < _MIN_SECRET_LEN:
            continue
        for form in {secret, quote(secret, safe="")}:
            text = text.replace(form, MASK)
    return mask_userinfo(text)


def authorization_secrets(value: str) -> tuple[str, ...]:
    """The whole header and its credential part, so either spelling is redacted."""
    credential = value.strip().partition(" ")[2].strip()
    return tuple(s for s in (value, value.strip(), credential) if s)


def settings_repr(settings: object) -> str:
    """A settings dataclass as `Name(field=value, …)` with the credentials in `endpoint_url` masked."""
    shown = []
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if f.name == "endpoint_url" and value:
            value = mask_userinfo(value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(settings).__name__}({', '.join(shown)})"
