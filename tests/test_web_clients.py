"""Trusted hosts and proxies, quotas' settings, and a socket's one writer (docs/deployment.md: "Budgets").

- ``TRUSTED_HOSTS``: outside production only loopback names are served (a DNS-rebinding page gets 400
  ``untrusted_host`` for every route, the upgrade included); in production the hosts of ``ALLOWED_ORIGINS``.
- The quotas take their production defaults only in production (0, no limit, elsewhere) unless set.
- The quota counters, socket leases and stats script work on one Redis and on a Redis Cluster.
- A peer that stops reading while its frames still fit the queue is dropped when one write takes longer
  than ``WS_SEND_TIMEOUT_SECONDS``; the app's other sockets are served meanwhile (a real server, real sockets).
"""

from __future__ import annotations

import json
import logging
import secrets
import socket

import pytest
import websocket

from app.settings import QUOTA_DEFAULTS, ConfigError, Settings
from app.store.keys import ThreadKeys
from app.store.quotas import client_of
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient
from chat_support.polling import wait_until


@pytest.mark.parametrize("host, served", [
    ("localhost", True), ("localhost:5000", True), ("127.0.0.1:5000", True), ("[::1]:5000", True),
    ("LOCALHOST:5000", True), ("rebind.example", False), ("rebind.example:5000", False),
    ("localhost.rebind.example", False), ("127.0.0.1.rebind.example:5000", False), ("", False),
])
def test_outside_production_only_loopback_hosts_are_served(host, served):
    assert Settings().host_allowed(host) is served


def test_trusted_hosts_in_production():
    production = Settings(env="production", secret_key="x" * 40)
    assert production.host_allowed("anything.example")  # none configured: the router decides
    by_origin = production.with_overrides(allowed_origins=("https://chat.example.com",))
    assert by_origin.host_allowed("chat.example.com") and not by_origin.host_allowed("evil.example")
    listed = production.with_overrides(trusted_hosts=".example.com,other.test")
    assert listed.trusted_hosts == (".example.com", "other.test")
    assert all(listed.host_allowed(h) for h in ("example.com", "a.example.com", "other.test:443"))
    assert not any(listed.host_allowed(h) for h in ("badexample.com", "sub.other.test"))


@pytest.mark.parametrize("address, prefix, client", [
    ("198.51.100.7", 64, "198.51.100.7"),
    ("::ffff:198.51.100.7", 64, "198.51.100.7"),
    ("::ffff:c633:6407", 64, "198.51.100.7"),
    ("0:0:0:0:0:FFFF:C633:6407", 64, "198.51.100.7"),
    ("[::ffff:198.51.100.7]", 64, "198.51.100.7"),
    ("2001:db8:1:2:aaaa::1", 64, "2001:db8:1:2::/64"),
    ("2001:0DB8:0001:0002:ffff:ffff:ffff:ffff", 64, "2001:db8:1:2::/64"),
    ("[2001:db8:1:2::9]", 64, "2001:db8:1:2::/64"),
    ("fe80::1%eth0", 64, "fe80::/64"),
    ("2001:db8:1:2::9", 48, "2001:db8:1::/48"),
    ("2001:db8:1:2::9", 128, "2001:db8:1:2::9/128"),
    ("not an address", 64, "not an address"),
    ("", 64, "unknown"),
    (None, 64, "unknown"),
])
def test_an_address_counts_as_its_client(address, prefix, client):
    assert client_of(address, prefix) == client


def test_the_ipv6_prefix_is_a_bounded_setting():
    assert Settings().client_ipv6_prefix == 64
    assert Settings.from_env({"CLIENT_IPV6_PREFIX": "56"}).client_ipv6_prefix == 56
    with pytest.raises(ConfigError):
        Settings.from_env({"CLIENT_IPV6_PREFIX": "129"})


def test_quotas_take_their_defaults_in_production_only():
    production = Settings(env="production", secret_key="x" * 40)
    assert vars(production.client_quotas) == QUOTA_DEFAULTS and production.proxies_trusted == 1
    assert set(vars(Settings().client_quotas).values()) == {0} and Settings().proxies_trusted == 0
    assert production.with_overrides(ws_max_per_client=0).client_quotas.ws_max_per_client == 0
    assert Settings(ws_new_per_minute=5, trusted_proxies=2).client_quotas.ws_new_per_minute == 5
    assert Settings.from_env({"WS_MAX_PER_CLIENT": "3", "TRUSTED_HOSTS": "a.test"}).client_quotas.ws_max_per_client == 3


@pytest.mark.parametrize("method, path", [("GET", "/"), ("GET", "/api/chat/thread"), ("DELETE", "/api/chat/thread"),
                                          ("GET", "/healthz"), ("GET", "/ws/chat")])
def test_a_rebinding_page_is_refused_on_every_route(web, method, path):
    response = web.open(path, method=method, headers={"Host": "rebind.example:5000",
                                                      "Origin": "http://rebind.example:5000"})
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "untrusted_host"
    assert "chat_session" not in response.headers.get("Set-Cookie", "")


def test_refusals_are_counted(web):
    web.get("/api/chat/thread", headers={"Host": "rebind.example"})
    metrics = web.get("/metrics").get_data(as_text=True)
    assert 'chat_client_refusals_total{budget="untrusted_host"}' in metrics


def test_a_loopback_page_is_served(web):
    assert web.delete("/api/chat/thread", headers={"Host": "127.0.0.1:5000",
                                                   "Origin": "http://127.0.0.1:5000"}).status_code == 204


def test_a_write_that_takes_too_long_drops_the_socket_and_no_one_else_waits(make_live_app, app_settings, fake_llm,
                                                                           caplog):
    caplog.set_level(logging.INFO, logger="app.chat.connection")
    server = make_live_app(app_settings.with_overrides(ws_send_timeout=1.0, ws_send_queue_bytes=64 << 20))
    fake_llm.default = lambda body: (Reply(tokens=[" " + "z" * 4000] * 3000)
                                     if "never read" in body["messages"][-1]["content"] else Reply(text="fine"))
    stuck = ChatClient(server)
    stuck.thread()
    stuck.ws = websocket.create_connection(server.ws_url, origin=server.url, cookie=stuck.cookie_header(),
                                           sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)], timeout=10)
    stuck.ws.send(json.dumps({"type": "message", "text": "a long answer, never read"}))
    wait_until(lambda: "websocket dropped: send_timeout" in caplog.text, timeout=30)
    other = ChatClient(server).connect()
    assert other.turn("still served")[-1]["status"] == "completed"
    other.close()
    stuck.ws.close()


@pytest.mark.parametrize("store", ["one", "cluster"])
def test_the_quotas_count_in_one_redis_and_in_a_cluster(store, redis_url, request):
    from app.store.errors import ErrorGuard
    from app.store.quotas import Quotas
    from app.store.redis_client import make_redis
    from app.store.socket_leases import LeaseOwner, SocketLeases

    url = redis_url if store == "one" else request.getfixturevalue("cluster_url")
    client = make_redis(url, cluster=store == "cluster")
    quotas = Quotas(client, redis_url=url, cluster=store == "cluster")
    who = f"192.0.2.{secrets.randbelow(250)}-{secrets.token_hex(4)}"
    assert [quotas.hit("test", who, "3/minute") for _ in range(4)] == [True, True, True, False]
    assert 1 <= quotas.retry_after("test", who, "3/minute") <= 61
    assert quotas.hit("test", who, "0") and quotas.hit("test", who, "")
    leases, owner = SocketLeases(client, ErrorGuard()), LeaseOwner.client(who)
    assert [leases.claim(owner, s, most=2, lease_seconds=60) for s in "abc"] == [True, True, False]
    leases.release(owner, "a")
    assert leases.claim(owner, "c", most=2, lease_seconds=60)
    thread_id = "chat:" + secrets.token_hex(32)
    assert quotas.record_turn_stats(thread_id, "{}", most=5, ttl_seconds=60) is False
    assert not quotas.thread_exists(thread_id) and client.exists(ThreadKeys(thread_id).stats) == 0
    client.hset(ThreadKeys(thread_id).state, "v", 1)
    assert quotas.record_turn_stats(thread_id, "{}", most=5, ttl_seconds=60) is True
    assert client.lrange(ThreadKeys(thread_id).stats, 0, -1) == ["{}"]
    fraction = quotas.used_memory_fraction()
    assert fraction is None or 0 < fraction
