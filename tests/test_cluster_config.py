"""The scale-out settings and their start-up checks (docs/scale-out.md; docs/contract.md: Configuration).

``REDIS_CLUSTER``, ``CELERY_BROKER_URL``, ``MEMORY_WAIT_REPLICAS`` and ``MEMORY_WAIT_TIMEOUT_MS``: each bad
value, and each mismatch between them and the servers they name (a seed that is no cluster node, a cluster
node without ``REDIS_CLUSTER``, a broker that is unreachable, refuses the login or is a cluster node), gives
one ``config error`` line and exit status 3 from the real entry points, never a password.  And the Celery
configuration each broker gets.
"""

from __future__ import annotations

import sys

import pytest

from app.celery_setup import celery_config
from app.settings import ConfigError, Settings
from chat_support.config_env import PASSWORD, SECRET, assert_config_error, celery, import_wsgi, production, run
from chat_support.servers import free_port

AMQP_DOWN = "amqp://guest:{password}@127.0.0.1:{port}//"


@pytest.mark.parametrize("values, line", [
    ({"REDIS_CLUSTER": "1"},
     "CELERY_BROKER_URL is not set: Celery's Redis transport cannot use a Redis Cluster, so set CELERY_BROKER_URL "
     "to amqp://... (RabbitMQ) or to a separate redis:// when REDIS_CLUSTER=1"),
    ({"REDIS_CLUSTER": "sometimes"}, "REDIS_CLUSTER must be true or false (1/0, yes/no, on/off), got 'sometimes'"),
    ({"CELERY_BROKER_URL": f"sqs://:{PASSWORD}@queue"},
     "CELERY_BROKER_URL is not a valid URL ('sqs://:***@queue'): set CELERY_BROKER_URL to a URL starting with "
     "amqp:// or amqps:// or redis:// or rediss:// that names a host"),
    ({"REDIS_CLUSTER": "1", "CELERY_BROKER_URL": "amqp://mq", "REDIS_URL": "redis://node-1:7000/2"},
     "REDIS_URL names a database other than 0: a Redis Cluster has only database 0, so drop the /<number> from "
     "REDIS_URL when REDIS_CLUSTER=1"),
    ({"MEMORY_WAIT_REPLICAS": "-1"}, "MEMORY_WAIT_REPLICAS must be at least 0, got -1"),
    ({"MEMORY_WAIT_REPLICAS": "one"}, "MEMORY_WAIT_REPLICAS must be an integer, got 'one'"),
    ({"MEMORY_WAIT_REPLICAS": "1", "MEMORY_WAIT_TIMEOUT_MS": "2000"},
     "MEMORY_WAIT_TIMEOUT_MS must be shorter than REDIS_SOCKET_TIMEOUT_SECONDS (a commit's WAIT would otherwise "
     "time out as a store failure)"),
    ({"MEMORY_WAIT_TIMEOUT_MS": "0"}, "MEMORY_WAIT_TIMEOUT_MS must be at least 1, got 0"),
])
def test_each_bad_scale_out_value_gets_its_one_line(values, line):
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"SECRET_KEY": SECRET, **values})
    assert str(error.value) == line


def test_the_defaults_keep_one_redis_for_everything():
    settings = Settings.from_env({"SECRET_KEY": SECRET, "REDIS_URL": "redis://cache:6379/0"})
    assert (settings.redis_cluster, settings.celery_broker_url, settings.broker_url) == (
        False, None, "redis://cache:6379/0")
    assert (settings.memory_wait_replicas, settings.memory_wait_timeout_ms) == (0, 100)
    clustered = Settings.from_env({"SECRET_KEY": SECRET, "REDIS_URL": "redis://node-1:7000", "REDIS_CLUSTER": "yes",
                                   "CELERY_BROKER_URL": "amqp://u:p@mq:5672/chat", "MEMORY_WAIT_REPLICAS": "1"})
    assert (clustered.redis_cluster, clustered.broker_url, clustered.memory_wait_replicas) == (
        True, "amqp://u:p@mq:5672/chat", 1)


def test_the_rabbitmq_configuration_keeps_every_delivery_guarantee():
    redis_conf = celery_config(Settings(secret_key=SECRET, redis_url="redis://cache:6379/0"))
    amqp_conf = celery_config(Settings(secret_key=SECRET, redis_url="redis://node-1:7000", redis_cluster=True,
                                       celery_broker_url="amqp://u:p@mq:5672/chat"))
    for conf in (redis_conf, amqp_conf):
        assert (conf["task_acks_late"], conf["task_reject_on_worker_lost"], conf["worker_prefetch_multiplier"]) == (
            True, True, 1)
        assert conf["task_default_queue"] == "compaction" and conf["result_backend"] is None
    assert redis_conf["broker_url"] == "redis://cache:6379/0"
    assert redis_conf["broker_transport_options"] == {"visibility_timeout": 3600}
    assert "task_queues" not in redis_conf
    assert amqp_conf["broker_url"] == "amqp://u:p@mq:5672/chat"
    assert amqp_conf["broker_transport_options"] == {"confirm_publish": True}  # no visibility timeout
    # folds and refinements each on their own durable quorum queue (docs/deployment.md: the refiner process)
    assert [(q.name, q.durable, q.queue_arguments) for q in amqp_conf["task_queues"]] == [
        ("compaction", True, {"x-queue-type": "quorum"}), ("refine", True, {"x-queue-type": "quorum"})]
    assert [(q.exchange.name, q.exchange.type, q.exchange.durable, q.routing_key) for q in amqp_conf["task_queues"]] == [
        ("compaction", "topic", True, "compaction"), ("refine", "topic", True, "refine")]


# ------------------------------------------------------------------------------ against real servers


def test_cluster_mode_without_a_broker_stops_the_worker_with_one_line(cluster_url):
    result = run(celery("worker", "-Q", "compaction", "--pool", "solo"),
                 production(cluster_url, REDIS_CLUSTER="1"))
    assert_config_error(result, "CELERY_BROKER_URL is not set: Celery's Redis transport cannot use a Redis Cluster, "
                                "so set CELERY_BROKER_URL to amqp://... (RabbitMQ) or to a separate redis:// when "
                                "REDIS_CLUSTER=1")


def test_a_seed_that_is_not_a_cluster_node(redis_url, amqp_url):
    result = import_wsgi(production(redis_url, REDIS_CLUSTER="1", CELERY_BROKER_URL=amqp_url))
    assert_config_error(result, f"REDIS_URL names a Redis that is not in cluster mode ({redis_url}): set REDIS_URL to a "
                                "node of a Redis Cluster, or unset REDIS_CLUSTER")


def test_a_cluster_node_without_redis_cluster(cluster_url):
    result = import_wsgi(production(cluster_url))
    assert_config_error(result, f"REDIS_URL names a node of a Redis Cluster ({cluster_url}): set REDIS_CLUSTER=1 and "
                                "CELERY_BROKER_URL, or set REDIS_URL to a plain Redis")


def test_an_unreachable_broker(cluster_url):
    port = free_port()
    broker = AMQP_DOWN.format(password=PASSWORD, port=port)
    result = run(celery("worker", "-Q", "compaction"), production(cluster_url, REDIS_CLUSTER="1",
                                                                 CELERY_BROKER_URL=broker))
    assert_config_error(result, f"CELERY_BROKER_URL is unreachable (amqp://guest:***@127.0.0.1:{port}//): set "
                                "CELERY_BROKER_URL to a reachable broker")


def test_a_broker_that_refuses_the_login(cluster_url, amqp_url):
    broker = amqp_url.replace("guest:guest@", f"guest:{PASSWORD}@")
    result = import_wsgi(production(cluster_url, REDIS_CLUSTER="1", CELERY_BROKER_URL=broker))
    shown = broker.replace(PASSWORD, "***")
    assert_config_error(result, f"CELERY_BROKER_URL was refused by the broker ({shown}): set CELERY_BROKER_URL with "
                                "the right user and password")


def test_a_broker_that_is_a_cluster_node(cluster_url):
    result = import_wsgi(production(cluster_url, REDIS_CLUSTER="1", CELERY_BROKER_URL=cluster_url))
    assert_config_error(result, f"CELERY_BROKER_URL names a node of a Redis Cluster ({cluster_url}): Celery's Redis "
                                "transport cannot use a cluster; set CELERY_BROKER_URL to amqp://... (RabbitMQ) or to "
                                "a plain Redis")


def test_the_release_check_names_the_cluster_and_the_broker(cluster_url, amqp_url):
    ok = run([sys.executable, "-m", "app.startup"],
             production(cluster_url, REDIS_CLUSTER="1", CELERY_BROKER_URL=amqp_url,
                        OPENAI_BASE_URL="https://llm.example/v1"))
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout == (f"config ok: APP_ENV=production, store {cluster_url} (Redis Cluster), broker "
                         f"{amqp_url.replace('guest:guest@', 'guest:***@')}, model provider https://llm.example/v1, "
                         "chat model gpt-4o-mini\n")


@pytest.mark.parametrize(("broker", "seconds", "countdown"), [
    ("amqp://guest:guest@127.0.0.1:5672//", 0.1, 1.0),   # kombu's native delayed delivery: whole seconds, >= 1
    ("amqps://u:p@host:5671/vh", 2.3, 3.0),
    ("redis://127.0.0.1:6379/0", 0.1, 0.1),               # the Redis transport keeps sub-second countdowns
    (None, 0.25, 0.25),
])
def test_a_retry_countdown_fits_the_broker(broker, seconds, countdown):
    from workers.tasks import retry_countdown_for

    assert retry_countdown_for(broker, seconds) == countdown
