"""Settings: every option of `miniagi run`, resolved flag > environment > .env > default.

Each option is declared once, on its Settings field (`option(...)`); the CLI flags, --help, the environment
variable names, the MiniAGI aliases and the README's table are all generated from that declaration.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import ConfigError  # defined apart: the model and the formats raise it without importing config

TRUE_WORDS = {"1", "true", "yes", "on", "y", "t"}
FALSE_WORDS = {"0", "false", "no", "off", "n", "f", ""}


def parse_bool(text: str) -> bool:
    word = str(text).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{text!r} is not true/false/1/0/yes/no")


def parse_positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{text!r} must be at least 1")
    return value


def parse_non_negative_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{text!r} must not be negative")
    return value


def parse_positive_float(text: str) -> float:
    value = parse_non_negative_float(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be more than 0")
    return value


def parse_memory_scope(text: str) -> str:
    value = str(text).strip().lower()
    if value not in ("workdir", "global", "run", "off"):
        raise ValueError(f"{text!r} is not one of workdir, global, run, off")
    return value


def parse_protocol(text: str) -> str:
    from .protocols import formats  # the reply formats: one module each in miniagi/protocols/

    value = str(text).strip().lower()
    if value not in formats():
        raise ValueError(f"{text!r} is not one of {', '.join(formats())}")
    return value


def parse_temperature(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 2:
        raise ValueError(f"{text!r} is not between 0 and 2")
    return value


def parse_names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in str(text).split(",") if n.strip()))
    bad = [n for n in names if not n.replace("_", "a").isalnum() or n[0].isdigit()]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an environment variable name")
    return names


def parse_sandbox(text: str) -> str:
    value = str(text).strip().lower()
    if value not in SANDBOXES:
        raise ValueError(f"{text!r} is not one of {', '.join(SANDBOXES)}")
    return value


def parse_paths(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip() for p in str(text).split(",") if p.strip()))


def parse_text(text: str) -> str:
    value = str(text).strip()
    if not value:
        raise ValueError("must not be empty")
    return value


SANDBOXES = ("auto", "bwrap", "namespace", "none")  # how executed code is contained: see docs/sandbox.md


@dataclass(frozen=True)
class Option:
    """How one setting is given: its flag, environment names, parser and help. Declared once, on its Settings field
    (see `option`); --help, the README's table, the environment, ./.env and batch keys are all read from it."""

    parse: Callable[[str], Any]
    help: str
    default: Any = None
    shown_default: str | None = None  # the default in words, where the value says too little ("the agent's")
    aliases: tuple[str, ...] = ()  # MiniAGI-style environment names
    negated_alias: str | None = None  # an alias whose truth value means the opposite (PROMPT_USER)
    metavar: str | None = None
    short: str | None = None  # a one-letter flag (-y)
    negatable: bool = False  # a boolean that also has --no-NAME
    repeatable: bool = False  # the flag may be given several times; the environment variable is comma-separated
    name: str = ""  # the Settings field, and the batch/.jsonl key: filled in from the field

    @property
    def boolean(self) -> bool:
        return self.parse is parse_bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        return ((self.short,) if self.short else ()) + (self.flag,)

    @property
    def env(self) -> str:
        return "MINIAGI_" + self.name.upper()

    @property
    def env_names(self) -> tuple[str, ...]:
        return (self.env, *self.aliases) + ((self.negated_alias,) if self.negated_alias else ())

    @property
    def default_text(self) -> str:
        """The default as --help and the README show it ("" when there is nothing worth saying)."""
        if self.shown_default is not None:
            return self.shown_default
        if self.boolean:
            return "on" if self.default else "off"
        if self.default in (None, ()):
            return ""
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


def option(default: Any, parse: Callable[[str], Any], help: str, **how: Any) -> Any:
    """A Settings field that is also a run option (flag, MINIAGI_* variable, .env entry, batch key)."""
    return field(default=default, metadata={"option": Option(parse, help, default, **how)})


@dataclass(frozen=True)
class Settings:
    model: str = option("gpt-4o-mini", parse_text, "model for the agent's actions", aliases=("MODEL",), metavar="M",
                        short="-m")
    summarizer_model: str | None = option(
        None, parse_text, "model for summaries and process_data", shown_default="the agent's",
        aliases=("SUMMARIZER_MODEL",), metavar="M")
    protocol: str = option(
        "tags", parse_protocol, "how the model states its action: tags (<r>…</r><c>…</c>, any model), tools (native "
        "tool calls) or json (one JSON object, constrained where the endpoint can)", metavar="P")
    temperature: float = option(0.2, parse_temperature, "sampling temperature sent with every request, 0-2 (left out "
                                "for a model that refuses it)", metavar="T")
    critic: bool = option(False, parse_bool, "enable the critic pass", aliases=("ENABLE_CRITIC",), negatable=True)
    critic_model: str | None = option(None, parse_text, "model for the critic", shown_default="the agent's",
                                      metavar="M")
    critic_every: int = option(5, parse_positive_int, "run the critic every N steps (and whenever a loop is "
                               "detected)", metavar="N")
    max_steps: int = option(50, parse_positive_int, "step limit (exit 3)", metavar="N")
    max_cost: float = option(2.0, parse_non_negative_float, "spending limit in USD, 0 for none (exit 3)",
                             metavar="USD")
    max_context_tokens: int = option(8000, parse_positive_int, "hard token budget for the whole prompt of one agent "
                                     "call", aliases=("MAX_CONTEXT_SIZE",), metavar="N")
    max_memory_item_tokens: int = option(1500, parse_positive_int, "an observation larger than this is condensed",
                                         aliases=("MAX_MEMORY_ITEM_SIZE",), metavar="N")
    workdir: str = option(".", parse_text, "where code and shell commands run and files are written",
                          aliases=("WORK_DIR",), metavar="DIR")
    home: str = option("~/.miniagi", parse_text, "where runs/ and the persistent memory live", metavar="DIR")
    exec_timeout: float = option(120.0, parse_positive_float, "time limit in seconds of one execute_python / "
                                 "execute_shell", metavar="S")
    exec_memory: int = option(4096, parse_positive_int, "memory limit in MB of each process that executed code "
                              "starts", metavar="MB")
    exec_disk: int = option(10240, parse_positive_int, "total MB executed code may write to disk in one run",
                            metavar="MB")
    sandbox: str = option("auto", parse_sandbox, "how executed code is contained: auto (the strongest that works "
                          "here), bwrap (bubblewrap: its own file system view), namespace (its own processes only) or "
                          "none (see docs/sandbox.md)", metavar="KIND")
    sandbox_allow: tuple[str, ...] = option(
        (), parse_paths, "a path the sandbox hides by default (~/.ssh, ~/.config, ./.env…) that executed code may "
        "read (and write, inside the work directory); repeatable, comma-separated in the environment",
        metavar="PATH", repeatable=True)
    no_network: bool = option(False, parse_bool, "executed code gets no network (the agent's own commands still "
                              "reach the model, search and URLs)")
    mcp_config: tuple[str, ...] = option(
        (), parse_paths, "a JSON file of MCP servers ({\"mcpServers\": {NAME: {command, args, env} or {url}}}) whose "
        "tools become commands (see docs/mcp.md); repeatable, comma-separated in the environment", metavar="FILE",
        repeatable=True)
    pass_env: tuple[str, ...] = option(
        (), parse_names, "an environment variable executed code may see, besides the harmless ones it always sees "
        "(PATH, LANG, LC_*, TERM, TZ, proxies); repeatable, comma-separated in the environment", metavar="NAME",
        repeatable=True)
    request_timeout: float = option(120.0, parse_positive_float, "the longest silence allowed in a model's reply, "
                                    "in seconds: before its first piece (the prompt being read) and between two "
                                    "pieces as it streams (retried once, then the run stops, resumable)", metavar="S")
    request_deadline: float | None = option(
        None, parse_positive_float, "total time allowed for one model request, however steadily it streams",
        shown_default="--request-timeout + the reply cap at 2 tokens/s", metavar="S")
    max_reply_tokens: int = option(2000, parse_positive_int, "cap on the length of each model reply (an agent's reply "
                                   "cut off there is not run; the model is told to send a shorter one)", metavar="N")
    max_calls: int = option(500, parse_positive_int, "limit on model calls in one run, every role and path counted: "
                            "summaries, critic, process_data, calls from code (exit 3)", metavar="N")
    read_timeout: float = option(60.0, parse_positive_float, "total time allowed to read one file or URL "
                                 "(ingest_data, process_data)", metavar="S")
    yes: bool = option(False, parse_bool, "run commands without asking for approval", negated_alias="PROMPT_USER",
                       short="-y")
    unattended: bool = option(False, parse_bool, "never wait for a person (implied when stdin is not a terminal)")
    debug: bool = option(False, parse_bool, "print each full context (the system prompt once) and each raw model "
                         "reply as it streams; keep full prompts in the trace", aliases=("DEBUG",))
    checkpoints: bool = option(True, parse_bool, "keep a checkpoint of the work directory's files at every step, "
                               "so that `miniagi diff` shows and `miniagi undo` reverts what a run changed",
                               negatable=True)
    checkpoint_max_file: int = option(50, parse_positive_int, "files larger than this (MB) are not kept by "
                                      "checkpoints (undo cannot bring them back; the run says which)", metavar="MB")
    memory_scope: str = option("workdir", parse_memory_scope, "what recall searches: workdir (the runs of this work "
                               "directory), global (all runs), run (this run only) or off (no vector memory)",
                               metavar="SCOPE")
    memory_url: str | None = option(None, parse_text, "a chromadb server (http://HOST:PORT, from `chroma run`) to keep "
                                    "the persistent memory in, shared by every machine that points at it",
                                    shown_default="$MINIAGI_HOME/memory", metavar="URL")
    embedding_model: str = option("local", parse_text, "embeddings for vector memory: local (offline MiniLM) or a "
                                  "model name served by the endpoint's /embeddings", metavar="M")
    prices: str | None = option(None, parse_text, "JSON file of model prices (USD per 1M tokens: {\"model\": [input, "
                                "output]})", metavar="FILE")

    @classmethod
    def from_environment(cls, **options: Any) -> "Settings":
        """The settings the CLI would use: these options over MINIAGI_* variables over ./.env over defaults.
        (Plain `Settings(...)` takes only what it is given: it reads no environment.)"""
        return resolve_settings(options)

    def model_for(self, role: str) -> str:
        """Each role has its own model setting, falling back to the agent's model."""
        chosen = {"summarizer": self.summarizer_model, "critic": self.critic_model}.get(role)
        return chosen or self.model

    @property
    def home_path(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @property
    def workdir_path(self) -> Path:
        return Path(self.workdir).expanduser().resolve()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Settings":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("pass_env", "sandbox_allow", "mcp_config"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values)

    def with_overrides(self, values: Mapping[str, Any]) -> "Settings":
        """Apply already-typed or textual overrides (CLI flags at resume, .jsonl batch keys)."""
        parsed = {}
        for name, value in values.items():
            if value is None:
                continue
            option = OPTIONS_BY_NAME.get(name)
            if option is None:
                raise ConfigError(f"unknown option {name!r}")
            parsed[name] = _parse(option, value, option.flag)
        return replace(self, **parsed)


OPTIONS: tuple[Option, ...] = tuple(replace(f.metadata["option"], name=f.name) for f in fields(Settings))
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}


def options_table() -> str:
    """The README's options table, in Markdown: made from the declarations, so it cannot drift from them."""
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        flags = ", ".join(opt.flags) + (f" / --no-{opt.flag[2:]}" if opt.negatable else "")
        flags += f" {opt.metavar}" if opt.metavar else ""
        names = f"`{opt.env}`"
        extra = [f"`{a}`" for a in opt.aliases] + ([f"`{opt.negated_alias}=false`"] if opt.negated_alias else [])
        if extra:
            names += f" ({', '.join(extra)})"
        default = opt.shown_default or (f"`{opt.default_text}`" if opt.default_text else "")
        rows.append(f"| `{flags}` | {names} | {default} | {opt.help.replace('|', '/').replace('<', '&lt;')} |")
    return "\n".join(rows) + "\n"


def _parse(option: Option, value: Any, source: str) -> Any:
    if option.repeatable and isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        if option.boolean and isinstance(value, bool):
            return value
        if not option.boolean and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        else:
            raise ConfigError(f"{source}: {value!r} is not a valid value for {option.flag}")
    try:
        return option.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


_dotenv_read: dict[str, tuple[tuple[str, str], ...]] = {}


def read_dotenv(directory: Path | None = None) -> dict[str, str]:
    """The .env of the current directory (MiniAGI keeps its settings there), as this process first read it: a .env
    that changes while miniagi runs (code that a run executes can write it) is never read again (see trust.py)."""
    path = str(((directory or Path.cwd()) / ".env").absolute())
    if path not in _dotenv_read:
        _dotenv_read[path] = _parse_dotenv(path) if os.path.isfile(path) else ()
    return dict(_dotenv_read[path])


def user_home() -> Path:
    """~/.miniagi, resolved: the user's own folder (the trust record, the user's settings), out of executed code's
    reach always (the sandbox hides it whatever the run's home)."""
    return Path(os.path.realpath(os.path.expanduser(Settings.home)))


def user_dotenv_path() -> Path:
    """The user's own settings (written by `miniagi setup`): in the default home, whatever --home says, where
    executed code never reaches (see docs/security.md)."""
    return user_home() / ".env"


def read_user_dotenv() -> dict[str, str]:
    """~/.miniagi/.env, the user's own settings (`miniagi setup`), as this process first read it."""
    user = str(user_dotenv_path().absolute())
    if user not in _dotenv_read:
        _dotenv_read[user] = _parse_dotenv(user) if os.path.isfile(user) else ()
    return dict(_dotenv_read[user])


def read_settings_files() -> dict[str, str]:
    """What the settings files give: ./.env over ~/.miniagi/.env (both under the environment and the options)."""
    return {**read_user_dotenv(), **read_dotenv()}


def forget_dotenv() -> None:
    """A new start-up (each `main()`): the next read_dotenv reads the files again."""
    _dotenv_read.clear()


def _parse_dotenv(path: str) -> tuple[tuple[str, str], ...]:
    """The file's settings: a line it cannot parse is reported, with the file's name."""
    import logging

    from dotenv import dotenv_values

    problems: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            problems.append(record.getMessage().replace("python-dotenv ", ""))

    logger = logging.getLogger("dotenv.main")
    handler, propagate = Collect(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        values = dotenv_values(path, encoding="utf-8", interpolate=False)  # ${VAR} is text: no secret comes in
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    for problem in problems:
        print(f"miniagi: {path}: {problem} (the line is ignored)", file=sys.stderr)
    return tuple((k, v) for k, v in values.items() if v is not None)


# MiniAGI settings that miniagi does not use, and why: said once, so a MiniAGI .env does not seem to be obeyed
IGNORED_MINIAGI_NAMES = {
    "SUMMARIZER_CHUNK_SIZE": "chunks are sized from --max-context-tokens",
    "CLEAR_DB_ON_START": "memory is never cleared at start; `miniagi memory clear` does it",
    "MEMORY_BACKEND": "memory is chromadb, local or a server given by --memory-url",
    "PINECONE_API_KEY": "memory is chromadb, local or a server given by --memory-url",
    "REDIS_HOST": "memory is chromadb, local or a server given by --memory-url",
}
_told: set[str] = set()


def tell_ignored(layers: Mapping[str, str], home: Path | None = None) -> None:
    """One line per MiniAGI setting found that miniagi ignores: once per process, and, with a `home`, once until
    what is ignored changes (not on every run of a MiniAGI .env left as it is)."""
    found = {name: layers[name] for name in IGNORED_MINIAGI_NAMES if name in layers and name not in _told}
    if not found:
        return
    _told.update(found)
    record, key = (home / "ignored-settings.json" if home else None), str(Path.cwd() / ".env")
    digest = hashlib.sha256(json.dumps(sorted(found.items())).encode()).hexdigest()
    try:
        told = json.loads(record.read_text(encoding="utf-8")) if record and record.is_file() else {}
        if told.get(key) == digest:
            return
        if record:  # never through a link put in the home (safefs: a new file renamed over the name)
            from .safefs import open_dir, replace_file

            folder = open_dir(record.parent)
            try:
                replace_file(folder, record.name, json.dumps({**told, key: digest}).encode(), 0o600)
            finally:
                os.close(folder)
    except (OSError, ValueError, AttributeError):  # no record kept: said every time, as before
        pass
    for name in found:
        print(f"miniagi: {name} (a MiniAGI setting) is ignored: {IGNORED_MINIAGI_NAMES[name]}", file=sys.stderr)


def resolve_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    dotenv: Mapping[str, str] | None = None,
) -> Settings:
    """flag > environment > ./.env > ~/.miniagi/.env > default, for every option of the table (`dotenv`: the files'
    settings, read when not given)."""
    environ = os.environ if environ is None else environ
    dotenv = read_settings_files() if dotenv is None else dotenv
    values: dict[str, Any] = {}
    from_files = set()
    for option in OPTIONS:
        flag_value = flags.get(option.name)
        if flag_value is not None:
            values[option.name] = _parse(option, flag_value, option.flag)
            continue
        for layer in (environ, dotenv):
            found = _from_layer(option, layer)
            if found is not None:
                values[option.name] = found
                from_files.update({option.name} if layer is dotenv else ())
                break
    settings = Settings(**values)
    # a home a .env names is not written to before that file is checked (code may have written both): said, not kept
    tell_ignored({**dotenv, **environ}, None if "home" in from_files else settings.home_path)
    return settings


def _from_layer(option: Option, layer: Mapping[str, str]) -> Any:
    """The option's value in the environment or a .env; an empty value means the default, as in MiniAGI (its
    .env_example has `WORK_DIR=`)."""
    for name in (option.env, *option.aliases):
        if str(layer.get(name) or "").strip():
            return _parse(option, layer[name], name)
    if option.negated_alias and str(layer.get(option.negated_alias) or "").strip():
        return not _parse(option, layer[option.negated_alias], option.negated_alias)
    return None


# every name Endpoint reads: where requests go and with which key. trust.ENDPOINT_NAMES is this list, so a .env
# line naming any of them is judged like the other sensitive settings; `lookup` reads no other name.
ENDPOINT_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT",
                "AZURE_OPENAI_API_KEY", "OPENAI_API_VERSION")


@dataclass(frozen=True)
class Endpoint:
    """Where the model lives. Kept apart from Settings so the key never reaches a run's files."""

    api_key: str | None
    base_url: str | None
    azure_endpoint: str | None = None  # AZURE_OPENAI_ENDPOINT: requests go to an Azure OpenAI resource
    api_version: str | None = None  # OPENAI_API_VERSION, for Azure

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         dotenv: Mapping[str, str] | None = None) -> "Endpoint":
        environ = os.environ if environ is None else environ
        dotenv = read_settings_files() if dotenv is None else dotenv

        def lookup(name: str) -> str | None:
            value = environ.get(name) or dotenv.get(name)
            return value.strip() if value and value.strip() else None

        azure = lookup("AZURE_OPENAI_ENDPOINT")
        if azure:
            return cls(api_key=lookup("AZURE_OPENAI_API_KEY") or lookup("OPENAI_API_KEY"), base_url=azure,
                       azure_endpoint=azure, api_version=lookup("OPENAI_API_VERSION"))
        return cls(api_key=lookup("OPENAI_API_KEY"), base_url=lookup("OPENAI_BASE_URL") or lookup("OPENAI_API_BASE"))

    def check(self) -> None:
        if self.azure_endpoint and not (self.api_key and self.api_version):
            raise ConfigError("AZURE_OPENAI_ENDPOINT is set: set AZURE_OPENAI_API_KEY and OPENAI_API_VERSION too "
                              "(e.g. 2024-10-21)")
        check_proxies(os.environ)
        if not self.api_key and not self.base_url:
            raise ConfigError(
                "no model endpoint: `miniagi setup` asks for one and keeps it; or set OPENAI_API_KEY (OpenAI) or "
                "OPENAI_BASE_URL (a local server such as Ollama: http://localhost:11434/v1), in the environment, "
                f"./.env or {user_dotenv_path()}"
            )


PROXY_NAMES = ("ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY")


def check_proxies(environ: Mapping[str, str]) -> None:
    """A SOCKS proxy in the environment is used as httpx uses it (socks5, socks5h, through socksio, a dependency);
    a kind it cannot use is one line, exit 2, not a traceback at the first request."""
    for name in PROXY_NAMES:
        value = (environ.get(name) or environ.get(name.lower()) or "").strip()
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if not scheme.startswith("socks"):
            continue
        if scheme not in ("socks5", "socks5h"):
            raise ConfigError(f"{name}: a {scheme} proxy cannot be used (socks5 and socks5h can, and http/https)")
        try:
            import socksio  # noqa: F401  (what httpx needs for SOCKS)
        except ImportError:
            raise ConfigError(f"{name} names a SOCKS proxy, and the socksio package is missing: "
                              "pip install 'httpx[socks]'") from None
