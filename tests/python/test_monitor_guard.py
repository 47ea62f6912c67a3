"""The API guard (relax_straggler/monitor/guard.py) in process: Host names, default lists,
the token's sources and its constant-time comparison."""

from __future__ import annotations

import hmac
import socket

import pytest

from relax_straggler.monitor import guard as guard_module
from relax_straggler.monitor.guard import TOKEN_ENV, ApiGuard, default_hosts, read_token


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("localhost:8000", True), ("LOCALHOST.", True), ("127.0.0.1:1", True),
    ("[::1]:8000", True), ("::1", True), ("localhost.attacker.example", False), ("127.0.0.2", False),
    ("attacker.example:8000", False), ("", False), (None, False), ("[::1", False),
])
def test_default_guard_serves_localhost_names_only(host, ok):
    assert ApiGuard().host_allowed(host) is ok


@pytest.mark.parametrize("host", [
    "localhost:80@evil.com", "localhost@evil.com", "localhost:80/evil", "localhost:8x", "localhost:80:80",
    "evil.com#localhost", "localhost evil.com", "[::1]:80@evil.com", "[::1]x", "[localhost]:80",
    "localhost:123456", "local%68ost", "::1:80@evil",
])
def test_a_host_header_that_is_not_a_name_and_port_is_refused(host):
    # a URL's user info ("localhost:80@evil.com") names evil.com for a proxy or a browser; served, it bypassed the list
    assert ApiGuard().host_allowed(host) is False
    assert ApiGuard(allowed_hosts=frozenset({"localhost", "evil.com"}), allow_ip_hosts=True).host_allowed(host) is False


def test_a_wildcard_bind_serves_this_machine_and_ip_addresses():
    hosts, ip_hosts = default_hosts("0.0.0.0")
    g = ApiGuard(allowed_hosts=hosts, allow_ip_hosts=ip_hosts)
    assert g.host_allowed(f"{socket.gethostname()}:8000") and g.host_allowed("10.1.2.3:8000")
    assert g.host_allowed("[fe80::1]:8000") and not g.host_allowed("attacker.example")
    hosts, ip_hosts = default_hosts("10.1.2.3")
    g = ApiGuard(allowed_hosts=hosts, allow_ip_hosts=ip_hosts)
    assert g.host_allowed("10.1.2.3:8000") and not g.host_allowed("10.1.2.4:8000")
    assert ApiGuard(allowed_hosts=frozenset({"*"})).host_allowed("anything.example")


def test_token_sources(tmp_path):
    f = tmp_path / "token"
    f.write_text("  abc123\n")
    assert read_token(str(f), {TOKEN_ENV: "ignored"}) == "abc123"  # the file wins
    assert read_token(None, {TOKEN_ENV: "from-env"}) == "from-env"
    assert read_token(None, {}) is None
    with pytest.raises(ValueError, match=f"{TOKEN_ENV}: the token is empty"):
        read_token(None, {TOKEN_ENV: " "})
    f.write_text("two words")
    with pytest.raises(ValueError, match="--token-file .*: the token must be one word"):
        read_token(str(f), {})
    with pytest.raises(ValueError, match="--token-file .*missing.*: cannot read it"):
        read_token(str(tmp_path / "missing"), {})


def test_the_token_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(guard_module.hmac, "compare_digest", spy)
    g = ApiGuard(token="t0ken")
    assert g.token_ok("Bearer t0ken") and g.token_ok("bearer t0ken")
    assert not g.token_ok("Bearer t0ke") and not g.token_ok("t0ken") and not g.token_ok(None)
    assert calls[0] == (b"t0ken", b"t0ken") and len(calls) == 3  # no digest for a header without the scheme
    assert ApiGuard().token_ok(None)  # no token set: every call is allowed
