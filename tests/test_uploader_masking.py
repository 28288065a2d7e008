"""Secrets stay out of text; proxy URLs get their credentials percent-encoded."""

from __future__ import annotations

import pytest

from uploader.masking import authorization_secrets, mask_authorization, mask_url_password, redact
from uploader.proxy import proxy_url_with_credentials, requests_proxies


def test_mask_authorization_keeps_the_scheme_word():
    assert mask_authorization("AppKey abc.def") == "AppKey ***"
    assert mask_authorization("Bearer x") == "Bearer ***"
    assert mask_authorization("rawtoken") == "***"
    assert mask_authorization("") == ""


def test_mask_url_password():
    assert mask_url_password("http://u:p%40ss@proxy:3128") == "http://u:***@proxy:3128"
    assert mask_url_password("http://proxy:3128") == "http://proxy:3128"
    assert mask_url_password(None) is None


def test_redact_covers_plain_and_percent_encoded_forms():
    text = "header AppKey k3y-value-1 url http://u:p%40ss%2Fw0rd@h pw p@ss/w0rd"
    out = redact(text, [*authorization_secrets("AppKey k3y-value-1"), "p@ss/w0rd", None, "ab"])
    assert "k3y-value-1" not in out and "p@ss/w0rd" not in out and "p%40ss%2Fw0rd" not in out
    assert "ab" in redact("ab", ["ab"])  # too short to redact safely


def test_proxy_credentials_are_percent_encoded():
    url = proxy_url_with_credentials("http://proxy.corp:3128", "dom\\user", "p@ss:w/rd")
    assert url == "http://dom%5Cuser:p%40ss%3Aw%2Frd@proxy.corp:3128"


def test_explicit_proxy_credentials_replace_those_in_the_url():
    assert proxy_url_with_credentials("http://old:old@[::1]:3128", "new", "pw") == "http://new:pw@[::1]:3128"
    assert proxy_url_with_credentials("http://me@proxy:1", None, "pw") == "http://me:pw@proxy:1"
    assert proxy_url_with_credentials("http://a:b@proxy:1", None, None) == "http://a:b@proxy:1"


@pytest.mark.parametrize("url", ["ftp://proxy:21", "proxy:3128", "http://", "socks4://proxy:1080"])
def test_bad_proxy_urls_are_rejected(url):
    with pytest.raises(ValueError, match="SINK_EMS_PROXY_URL"):
        proxy_url_with_credentials(url, None, None)


def test_requests_proxies_cover_both_schemes():
    assert requests_proxies("http://p:1") == {"http": "http://p:1", "https": "http://p:1"}
