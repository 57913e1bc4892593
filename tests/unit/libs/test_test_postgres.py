"""cutylib.testing.postgres: the test PostgreSQL is chosen explicitly (CUTY_TEST_PG), and a container
gets the local cluster's settings. No Docker engine runs here: the container's command is checked as
built, and asking for a container without an engine fails with a message instead of falling back."""
import pytest

from cutylib.pgcluster import PostgresUnavailable, server_settings
from cutylib.testing import postgres


def test_the_choice_is_local_unless_a_container_is_asked_for(monkeypatch):
    monkeypatch.delenv("CUTY_TEST_PG", raising=False)
    assert postgres.choice() == "local"
    monkeypatch.setenv("CUTY_TEST_PG", " Container ")
    assert postgres.choice() == "container"
    monkeypatch.setenv("CUTY_TEST_PG", "docker")
    with pytest.raises(ValueError, match="CUTY_TEST_PG must be local or container, got 'docker'"):
        postgres.choice()


def test_the_container_runs_the_server_with_the_local_clusters_settings():
    command = postgres.container_command()
    assert command[0] == "postgres"
    flags, settings = command[1::2], command[2::2]
    assert set(flags) == {"-c"}
    assert settings == server_settings(postgres.MAX_CONNECTIONS, fast_unsafe=True)
    assert {"max_connections=600", "fsync=off", "synchronous_commit=off", "full_page_writes=off"} <= set(settings)


def test_a_container_without_a_docker_engine_fails_clearly(monkeypatch):
    monkeypatch.delenv("CUTY_TEST_DSN", raising=False)
    monkeypatch.setenv("CUTY_TEST_PG", "container")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(PostgresUnavailable) as e:
        postgres.start_test_postgres()
    message = str(e.value)
    assert "CUTY_TEST_PG=container needs a Docker engine, and none answers" in message
    assert "CUTY_TEST_PG=local" in message


def test_the_container_is_started_with_that_command(monkeypatch):
    import testcontainers.community.postgres as tc

    started = {}

    class FakeContainer:
        def __init__(self, image, **kwargs):
            started.update(image=image, kwargs=kwargs)

        def with_command(self, command):
            started["command"] = command
            return self

        def start(self):
            started["started"] = True
            return self

        def get_connection_url(self):
            return "postgresql://test:test@127.0.0.1:1/test"

    monkeypatch.delenv("CUTY_TEST_DSN", raising=False)
    monkeypatch.setenv("CUTY_TEST_PG", "container")
    monkeypatch.setattr(postgres, "_docker_engine", lambda: None)
    monkeypatch.setattr(tc, "PostgresContainer", FakeContainer)
    monkeypatch.setattr(postgres, "service_roles", lambda dsn: started.setdefault("roles_on", dsn))
    pg = postgres.start_test_postgres()
    assert pg.dsn == "postgresql://test:test@127.0.0.1:1/test" and pg.cluster is None
    assert started["image"] == postgres.IMAGE and started["kwargs"]["driver"] is None
    assert started["command"] == postgres.container_command() and started["started"]
    assert started["roles_on"] == pg.dsn  # the services' roles are made on the container too
