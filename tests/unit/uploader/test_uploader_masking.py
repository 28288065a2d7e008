"""Secrets stay out of text; proxy URLs get their credentials percent-encoded."""

from __future__ import annotations

import pytest

from uploader.masking import authorization_secrets, mask_authorization, mask_userinfo, redact
from uploader.proxy import proxy_url_with_credentials, requests_proxies


def test_mask_authorization_keeps_the_scheme_word():
    assert mask_authorization("AppKey abc.def") == "AppKey ***"
    assert mask_authorization("Bearer x") == "Bearer ***"
    assert mask_authorization("rawtoken") == "***"
    assert mask_authorization("") == ""


def test_mask_userinfo_hides_the_whole_userinfo_and_keeps_where():
    assert mask_userinfo("http://u:p%40ss@proxy:3128") == "http://***@proxy:3128"
    assert mask_userinfo("https://token-only@[::1]:9000/bucket?x=a@b") == "https://***@[::1]:9000/bucket?x=a@b"
    assert mask_userinfo("http://proxy:3128/path@x") == "http://proxy:3128/path@x"
    assert mask_userinfo("k8s://https://admin:pw@api:6443", mask="*") == "k8s://https://*@api:6443"


def test_mask_userinfo_hides_an_unencoded_at_sign_in_a_password():
    # urlsplit takes the host after the last "@"; so must the mask, or "ss" would stay visible.
    assert mask_userinfo("proxy http://u:p@ss@proxy:3128 failed") == "proxy http://***@proxy:3128 failed"


def test_redact_masks_credentials_in_urls_it_was_not_told_about():
    assert redact("ProxyError('http://svc:unlisted-pw@proxy:3128')", []) == "ProxyError('http://***@proxy:3128')"


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
