"""Settings precedence (flag > environment > .env > default), MiniAGI aliases and value parsing."""

from __future__ import annotations

import json

import pytest

from miniagi.config import ConfigError, Endpoint, Settings, parse_bool, resolve_settings

from .conftest import act, run_dirs


def test_defaults_when_nothing_is_set():
    settings = resolve_settings({}, environ={}, dotenv={})
    assert settings == Settings()
    assert settings.model_for("summarizer") == settings.model and settings.model_for("critic") == settings.model


def test_flag_beats_environment_beats_dotenv_beats_default():
    dotenv = {"MINIAGI_MODEL": "from-dotenv", "MINIAGI_MAX_STEPS": "7", "MINIAGI_EXEC_TIMEOUT": "9"}
    environ = {"MINIAGI_MODEL": "from-env", "MINIAGI_MAX_STEPS": "8"}
    settings = resolve_settings({"model": "from-flag"}, environ=environ, dotenv=dotenv)
    assert settings.model == "from-flag"
    assert settings.max_steps == 8
    assert settings.exec_timeout == 9.0
    assert settings.max_cost == Settings().max_cost


def test_miniagi_env_file_works_unchanged():
    dotenv = {"MODEL": "gpt-4", "SUMMARIZER_MODEL": "gpt-3.5-turbo", "ENABLE_CRITIC": "True", "PROMPT_USER": "false",
              "MAX_CONTEXT_SIZE": "4000", "MAX_MEMORY_ITEM_SIZE": "2000", "WORK_DIR": "/tmp/agent-work",
              "DEBUG": "false"}
    settings = resolve_settings({}, environ={}, dotenv=dotenv)
    assert (settings.model, settings.summarizer_model) == ("gpt-4", "gpt-3.5-turbo")
    assert settings.critic is True and settings.yes is True and settings.debug is False
    assert (settings.max_context_tokens, settings.max_memory_item_tokens) == (4000, 2000)
    assert settings.workdir == "/tmp/agent-work"
    assert settings.model_for("summarizer") == "gpt-3.5-turbo" and settings.model_for("critic") == "gpt-4"


def test_primary_name_beats_alias_in_the_same_layer():
    settings = resolve_settings({}, environ={"MINIAGI_MODEL": "primary", "MODEL": "alias"}, dotenv={})
    assert settings.model == "primary"


@pytest.mark.parametrize("word,value", [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True),
                                        ("false", False), ("False", False), ("0", False), ("no", False),
                                        ("NO", False)])
def test_booleans_accept_common_words_in_any_case(word, value):
    assert parse_bool(word) is value
    assert resolve_settings({}, environ={"MINIAGI_CRITIC": word}, dotenv={}).critic is value
    assert resolve_settings({}, environ={"PROMPT_USER": word}, dotenv={}).yes is (not value)


@pytest.mark.parametrize("environ,mentions", [({"MINIAGI_MAX_STEPS": "ten"}, "MINIAGI_MAX_STEPS"),
                                              ({"MINIAGI_MAX_STEPS": "0"}, "at least 1"),
                                              ({"MINIAGI_MAX_COST": "-1"}, "negative"),
                                              ({"DEBUG": "sometimes"}, "DEBUG")])
def test_bad_values_name_their_source(environ, mentions):
    with pytest.raises(ConfigError, match=mentions):
        resolve_settings({}, environ=environ, dotenv={})


def test_endpoint_from_environment_or_dotenv():
    assert Endpoint.from_environment({}, {"OPENAI_API_KEY": "k1"}).api_key == "k1"
    assert Endpoint.from_environment({"OPENAI_API_KEY": "k2"}, {"OPENAI_API_KEY": "k1"}).api_key == "k2"
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Endpoint.from_environment({}, {}).check()
    Endpoint.from_environment({"OPENAI_BASE_URL": "http://localhost:11434/v1"}, {}).check()  # a local server


def test_cli_reads_dotenv_in_the_current_directory_and_flags_win(cli, llm, isolated):
    (isolated.work / ".env").write_text(f"MODEL=dotenv-model\nMAX_CONTEXT_SIZE=5000\nPROMPT_USER=false\n"
                                        f"OPENAI_BASE_URL={llm.url}\n")
    llm.add(act("execute_shell", "echo ran"), act("done", "ok"))
    proc = cli("--max-steps", "9", "check settings", env={"MINIAGI_MAX_COST": "3.5", "OPENAI_BASE_URL": None})
    assert proc.returncode == 0, proc.stderr
    (directory,) = run_dirs(isolated.home)
    start = json.loads((directory / "trace.jsonl").read_text().splitlines()[0])
    recorded = start["settings"]
    assert recorded["model"] == "dotenv-model" and recorded["max_context_tokens"] == 5000
    assert recorded["yes"] is True and recorded["max_steps"] == 9 and recorded["max_cost"] == 3.5
    assert llm.requests[0]["model"] == "dotenv-model"
    assert "exit code 0" in (directory / "trace.jsonl").read_text()  # PROMPT_USER=false let the command run


def test_miniagi_settings_that_are_ignored_are_said_once(capsys):
    from miniagi import config

    config._told.clear()
    resolve_settings({}, environ={"SUMMARIZER_CHUNK_SIZE": "3000"}, dotenv={"CLEAR_DB_ON_START": "true"})
    resolve_settings({}, environ={"SUMMARIZER_CHUNK_SIZE": "3000"}, dotenv={})
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("(a MiniAGI setting) is ignored" in line for line in lines)
    assert any("SUMMARIZER_CHUNK_SIZE" in line and "--max-context-tokens" in line for line in lines)
