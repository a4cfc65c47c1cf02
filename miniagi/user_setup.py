"""`miniagi setup`: the endpoint, key and model asked for once, checked with one request, and kept in
~/.miniagi/.env (mode 0600), which every later start reads from any folder (after the environment and ./.env).

Questions go to stderr and answers come from stdin (a terminal, or lines piped in: the same answers in order); the
key is read without echo in a terminal. Nothing is written until the request has been answered."""

from __future__ import annotations

import getpass
import os
import sys
import time
from pathlib import Path

from .config import ConfigError, Endpoint, user_dotenv_path

OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
NOT_CHAT = ("embed", "tts", "whisper", "dall-e", "moderation", "transcribe", "davinci", "babbage", "image",
            "realtime", "audio", "search", "rerank")  # what a /models list holds besides chat models
MAX_LISTED = 30
KEPT = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "MINIAGI_MODEL")  # what setup writes; other lines are left as they are


class Stopped(Exception):
    """The person ended the input (Ctrl-D) before setup was through."""


def run_setup() -> int:
    path = user_dotenv_path()
    current = _read(path)
    _say(f"miniagi setup: the model endpoint, key and model, kept in {path} for every folder (the environment and "
         "a ./.env still win over it). Ctrl-C stops; nothing is written before a request has worked.")
    try:
        base_url, key, model = _ask_until_it_works(current)
    except Stopped:
        _say("setup stopped: nothing was written")
        return 1
    values = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "MINIAGI_MODEL": model}
    _write(path, values)
    _say(f"wrote {path} (readable by you only): " + ", ".join(name for name, value in values.items() if value))
    shadowed = [name for name in KEPT if os.environ.get(name, "").strip()]
    if shadowed:
        _say(f"note: {', '.join(shadowed)} set in the environment win over the file: unset them to use it")
    _say('try it: miniagi "What is 17 * 23?"')
    return 0


def _ask_until_it_works(current: dict[str, str]) -> tuple[str | None, str | None, str]:
    from .endpoint import base_url_problem

    while True:
        _say("The endpoint: OpenAI, or the URL of an OpenAI-compatible server (Ollama: http://localhost:11434/v1, "
             "LM Studio: http://localhost:1234/v1, vLLM or llama.cpp: http://HOST:PORT/v1).")
        shown = f"Enter for {current['OPENAI_BASE_URL']}, 'openai'" if current.get("OPENAI_BASE_URL") else "Enter"
        answer = _ask(f"Endpoint ({shown} for OpenAI, or a URL): ")
        base_url = current.get("OPENAI_BASE_URL") if not answer else None if answer.lower() == "openai" else answer
        problem = base_url_problem(base_url)
        if problem:
            _say(problem.replace("set OPENAI_BASE_URL=", "give ").replace("e.g. OPENAI_BASE_URL=", "e.g. "))
            continue
        key = _ask_key(current.get("OPENAI_API_KEY"), needed=base_url is None)
        model = _connect(base_url, key)
        if model is None:
            continue
        chosen = _ask_model(model, current.get("MINIAGI_MODEL"))
        if _check(model, chosen, base_url):
            return base_url, key, chosen
        current = {"OPENAI_BASE_URL": base_url or "", "OPENAI_API_KEY": key or "", "MINIAGI_MODEL": chosen}


def _ask_key(current: str | None, needed: bool) -> str | None:
    keep = "Enter keeps the current one" if current else "Enter for none: a local server" if not needed else ""
    while True:
        key = _ask(f"API key (hidden as you type{'; ' + keep if keep else ''}): ", secret=True)
        if key:
            return key
        if current:
            return current
        if not needed:
            return None
        _say("OpenAI needs a key: https://platform.openai.com/api-keys")


def _connect(base_url: str | None, key: str | None):
    """The endpoint as a run would use it, once something listens there (else the problem said, and None)."""
    from .endpoint import OpenAIModel
    from .retry import Backoff

    try:
        model = OpenAIModel(Endpoint(api_key=key, base_url=base_url), backoff=Backoff(attempts=1),
                            request_timeout_s=60)
        model.check_reachable()
    except ConfigError as error:
        _say(_redacted(str(error), key))
        return None
    return model


def _ask_model(endpoint, current: str | None) -> str:
    served = [name for name in endpoint.served_models() if not any(word in name.lower() for word in NOT_CHAT)]
    default = current if current and (not served or current in served) else \
        DEFAULT_MODEL if not served or DEFAULT_MODEL in served else served[0]
    if served:
        listed = served[:MAX_LISTED]
        more = f" (and {len(served) - len(listed)} more)" if len(served) > len(listed) else ""
        _say("The endpoint serves" + more + ":\n" + "\n".join(f"  {i}. {name}" for i, name in enumerate(listed, 1)))
    else:
        listed = []
        _say("The endpoint does not list its models: give the name it serves")
    while True:
        answer = _ask(f"Model (a number or a name; Enter for {default}): ")
        if not answer:
            return default
        if answer.isdigit():
            if 1 <= int(answer) <= len(listed):
                return listed[int(answer) - 1]
            _say(f"{answer} is not one of the numbers above")
            continue
        return answer


def _check(endpoint, model: str, base_url: str | None) -> bool:
    """One short request with the chosen model: the problem said when it fails."""
    from .model import ModelError, ModelUnavailable

    where = base_url or "OpenAI"
    _say(f"checking {model} at {where} with one short request…")
    started = time.monotonic()
    try:
        completion = endpoint.complete([{"role": "user", "content": "Reply with the word OK."}], model=model,
                                       max_tokens=16)
    except (ConfigError, ModelError, ModelUnavailable) as error:
        _say(f"that did not work: {_redacted(str(error), endpoint.endpoint.api_key)}. Let's try again.")
        return False
    reply = " ".join(completion.text.split())[:60]
    _say(f"it works: {model} answered {reply!r} in {time.monotonic() - started:.1f} s")
    return True


def _ask(prompt: str, secret: bool = False) -> str:
    """One answer; Ctrl-D stops setup."""
    if secret and sys.stdin is not None and sys.stdin.isatty():
        try:
            return getpass.getpass(prompt, stream=sys.stderr).strip()
        except EOFError:
            raise Stopped from None
    print(prompt, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        print(file=sys.stderr)
        raise Stopped
    return line.strip()


def _say(text: str) -> None:
    """A message, each of its lines wrapped at the terminal's width (whole lines into a pipe)."""
    import shutil
    import textwrap

    from .terminal import visible

    if sys.stderr.isatty():
        width = shutil.get_terminal_size().columns - 1
        text = "\n".join(textwrap.fill(line, width, subsequent_indent=" " * (len(line) - len(line.lstrip())))
                         for line in text.split("\n"))
    print(visible(text), file=sys.stderr, flush=True)


def _redacted(text: str, key: str | None) -> str:
    from .redaction import Redactor

    return Redactor({"OPENAI_API_KEY": key}, {})(text) if key else text


def _read(path: Path) -> dict[str, str]:
    from dotenv import dotenv_values

    if not path.is_file():
        return {}
    try:
        return {k: v for k, v in dotenv_values(path, encoding="utf-8", interpolate=False).items() if v}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _write(path: Path, values: dict[str, str | None]) -> None:
    """The file with these settings (a value None: its line removed), its other lines kept, replaced at once and
    readable by its owner only (it holds the key)."""
    from .safefs import open_dir, replace_file

    lines = []
    if path.is_file():
        lines = [line for line in path.read_text(encoding="utf-8").splitlines()
                 if line.split("=", 1)[0].strip().removeprefix("export ").strip() not in values]
    lines += [f'{name}="{_quoted(value)}"' for name, value in values.items() if value]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = open_dir(path.parent)
    try:
        replace_file(folder, path.name, ("\n".join(lines) + "\n").encode("utf-8"), 0o600)
    finally:
        os.close(folder)


def _quoted(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ConfigError("a setting cannot span lines")
    return value.replace("\\", "\\\\").replace('"', '\\"')
