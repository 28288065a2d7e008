"""Proxy URL handling: validate early and put credentials where requests/urllib3 will use them.

The Celonis connector accepted a proxy host and never applied it; here the URL built below is
passed on every request, so a wrong proxy fails loudly instead of being silently bypassed.
"""

from __future__ import annotations

import importlib.util
from urllib.parse import quote, urlsplit, urlunsplit

PROXY_SETTING = "SINK_EMS_PROXY_URL"
SUPPORTED_SCHEMES = ("http", "https", "socks5", "socks5h")


def proxy_url_with_credentials(url: str, username: str | None, password: str | None) -> str:
    """Return `url` with percent-encoded credentials; explicit ones replace any inside the URL.

    Raises ValueError naming the setting, so misconfiguration surfaces at startup, not per upload.
    """
    parts = urlsplit(url)
    if parts.scheme not in SUPPORTED_SCHEMES or not parts.hostname:
        raise ValueError(
            f"{PROXY_SETTING} must look like http://host:port (also https://, socks5://, socks5h://)"
            f"; got a URL with scheme {parts.scheme!r}"
        )
    if parts.scheme.startswith("socks") and importlib.util.find_spec("socks") is None:
        raise ValueError(f"{PROXY_SETTING} uses {parts.scheme}:// but PySocks is not installed")
    if username is None and password is None:
        return url
    # urlsplit leaves a user name from the URL percent-encoded as written, so only encode ours.
    username = parts.username or "" if username is None else quote(username, safe="")
    credentials = username if password is None else f"{username}:{quote(password, safe='')}"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{host}"))


def requests_proxies(url: str) -> dict[str, str]:
    """Same proxy for both schemes: the endpoint is https, but tests and local EMS use http."""
    return {"http": url, "https": url}
