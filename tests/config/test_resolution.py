"""``resolve_settings``: the layers in order, and where each setting came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from titan.config.overrides import Override
from titan.config.resolution import resolve_settings, upstream_flag
from titan.config.summary import shown_url
from titan.errors import ConfigError


def test_each_layer_wins_over_the_one_before_and_is_named_as_the_origin(tmp_path: Path):
    file = tmp_path / "titan.yaml"
    file.write_text("server: {port: 8101, host: 127.0.0.2}\nstorage: memory://\n")
    environ = {"TITAN_SERVER__PORT": "8102", "TITAN_API_KEY": "k-env"}
    flags = [Override(("storage",), "sqlite:///x.db", "--storage")]
    settings = resolve_settings(config_file=file, flags=flags, environ=environ)
    config = settings.config
    assert (config.server.host, config.server.port, config.storage) == (
        "127.0.0.2", 8102, "sqlite:///x.db")  # fmt: skip
    assert settings.origin("server", "host") == str(file)
    assert settings.origin("server", "port") == "environment variable TITAN_SERVER__PORT"
    assert settings.origin("storage") == "--storage"
    assert settings.origin("server", "log_level") == "default"
    assert settings.origin("server") == str(file)  # set below: the file
    rows = {key: (value, origin) for key, value, origin in settings.explained()}
    assert rows["client.api_key"] == ("***", "environment variable TITAN_API_KEY")
    assert set(rows) == {"server.host", "server.port", "storage", "client.api_key"}


def test_no_file_no_variables_nothing_is_explained():
    settings = resolve_settings(environ={})
    assert settings.explained() == [] and settings.origin("storage") == "default"


def test_a_flag_that_replaces_a_subtree_takes_its_origins(tmp_path: Path):
    file = tmp_path / "titan.yaml"
    file.write_text("models: [{name: a, deployments: [{backend: simulated}]}]\n")
    environ = {"TITAN_UPSTREAM_API_KEY": "s"}
    upstream = upstream_flag("http://u:8000/v1", None, None, environ=environ)
    settings = resolve_settings(flags=[upstream], environ={})
    assert settings.origin("models", 0, "name") == "--upstream"
    assert settings.config.models[0].deployments[0].api_key.get_secret_value() == "s"
    with pytest.raises(ConfigError, match="cannot be combined"):
        resolve_settings(config_file=file, document=({}, "doc"), environ={})


def test_a_document_stands_for_the_file_and_names_itself():
    with pytest.raises(ConfigError, match=r"^scenario: titan.config: server.port: "):
        resolve_settings(document=({"server": {"port": -1}}, "scenario: titan.config"), environ={})


def test_shown_urls_mask_passwords_and_expand_the_home():
    assert shown_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert shown_url("rediss://u:pw@h:1/0") == "rediss://u:***@h:1/0"
    assert shown_url("redis://h:1/0") == "redis://h:1/0"
    assert shown_url("sqlite:///~/t.db") == f"sqlite:///{Path.home()}/t.db"
    assert shown_url("sqlite:///rel.db") == "sqlite:///rel.db"
    assert shown_url("not a url [") == "not a url ["
