"""What a run can write is not trusted later without the user's say: the `.env` files miniagi reads, and a run's
trace (resume, replay). See docs/security.md.

- `.env` is read once, at start-up (config.read_dotenv), without expanding ${VAR} from the environment. Every
  setting in it but a few harmless ones (`HARMLESS`: which model is asked and how) is remembered per file, as a hash
  of each value, in `~/.miniagi/trusted-env.json` (whatever --home says: another home cannot sidestep it; the
  run's own home keeps a copy). When one of them is new or changed since miniagi last used that file, or a linked
  `.env` points elsewhere, the person at the terminal is asked; with no one to ask, the run is refused (exit 2). A
  file miniagi has never used, nor run code in or above its folder, is trusted as it is, and remembered: a `.env`
  that appears where a run worked (its work directory or a folder code made there) is asked about.
  A `.env` changed during a run is reported at its end.
- A trace's settings are the run's own record, and code that the run executed could rewrite them. `resume` and
  `replay` take the widening settings from the user's current settings, never from the trace, and a limit only as
  low as the trace has it; every difference is said.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Mapping

from .config import OPTIONS_BY_NAME, ConfigError, Settings, _from_layer, read_dotenv

ENDPOINT_NAMES = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY")  # where requests go, with which key
# where data goes, what executed code sees or may reach, whether a person approves, where runs are kept
# (mcp_config: the servers it names are programs run outside the sandbox)
WIDENING = tuple(name for name in ("pass_env", "memory_url", "embedding_model", "prices", "yes", "home", "sandbox",
                                   "sandbox_allow", "no_network", "mcp_config")
                 if name in {f.name for f in fields(Settings)})
LIMITS = ("max_cost", "max_calls", "exec_timeout", "exec_memory", "exec_disk")  # 0 means no limit (max_cost)
SANDBOX_STRENGTH = {"none": 0, "namespace": 1, "bwrap": 2, "auto": 2}  # auto: the strongest that works
# what a .env may set without the user's yes: which model is asked, and how — all of it at the endpoint and within
# the limits the user has (max_cost, max_calls, max_steps need a yes). Nothing here chooses where data or files go,
# what code sees or may do, what is kept, or how long or how much a run may go on.
HARMLESS = ("model", "summarizer_model", "critic_model", "protocol", "temperature", "critic", "critic_every")
SENSITIVE = tuple(name for name in OPTIONS_BY_NAME if name not in HARMLESS)
TRUST_FILE = "trusted-env.json"
MAX_SIBLINGS = 20
CODE_DIRS = "code-ran-in"  # the record's list of the work directories code has run in: a .env below them is theirs
TARGET = "(target)"  # in a file's record: the hash of the file a linked .env pointed to


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read(1 << 20)).hexdigest()
    except OSError:
        return None


def sensitive_values(dotenv: Mapping[str, str], environ: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The sensitive settings this start takes from the .env: name → value (the environment or an option wins)."""
    used = {name: dotenv[name] for name in ENDPOINT_NAMES if dotenv.get(name, "").strip() and not environ.get(name)}
    for name in SENSITIVE:
        option = OPTIONS_BY_NAME[name]
        present = [env for env in option.env_names if env in dotenv]
        if not present or any(env in environ for env in option.env_names):
            continue
        try:
            taken = _from_layer(option, dotenv) == getattr(settings, name)
        except ConfigError:
            taken = False
        if taken:  # (an option given on the command line would differ: then the .env's value is not used)
            used.update({env: dotenv[env] for env in present})
    return used


def trust_records(settings: Settings, moved_home: bool = False) -> tuple[list[Path], list[dict], dict]:
    """Where the yes to a file is kept — the default home (~/.miniagi), where neither a .env nor --home can move
    it, and a copy in the run's home (not when a .env moved that home) — what each holds, and the two merged, the
    default home's entries first."""
    paths = [Path(Settings.home).expanduser() / TRUST_FILE]
    if not moved_home and settings.home_path / TRUST_FILE not in paths:
        paths.append(settings.home_path / TRUST_FILE)
    records = [_load(path) for path in paths]
    return paths, records, {**records[-1], **records[0]}


class DotenvGuard:
    """The start-up check of the .env (`check`), and what a run reports of .env files changed while it ran."""

    def __init__(self, settings: Settings, environ: Mapping[str, str]):
        self.settings, self.environ = settings, environ
        self.path = Path.cwd().resolve() / ".env"  # the file read_dotenv reads
        self.watched = {path: _file_digest(path) for path in {self.path, settings.workdir_path / ".env"}}

    def check(self, ui) -> None:
        used = sensitive_values(read_dotenv(), self.environ, self.settings)
        # the record is kept where neither this .env nor --home can move it: in the default home (~/.miniagi), and
        # a copy in the run's home; a file either knows is judged against what it knew
        moved_home = any(name in used for name in OPTIONS_BY_NAME["home"].env_names)
        record_paths, records, record = trust_records(self.settings, moved_home)
        known = record.get(str(self.path))
        code_dirs = sorted({*_listed(records[0].get(CODE_DIRS)), *_listed(records[-1].get(CODE_DIRS))})
        if known is None and any(_under(str(self.path.parent), place) for place in code_dirs):
            known = {}  # never used, but where code has run (a folder code made in its work directory): not trusted
        target = os.path.realpath(self.path) if self.path.is_symlink() else None
        if target is not None:  # a linked .env is judged by what it points to, and remembered with it
            used = {**used, TARGET: target}
        elif known is not None and TARGET in known:
            used = {**used, TARGET: "(not a link)"}
        changed = sorted(name for name, value in used.items()
                         if known is not None and known.get(name) != _digest(value))
        if changed:
            shown = ", ".join(f"{name}={_shown(name, used[name])}" if name != TARGET else f"a link to {used[name]}"
                              for name in changed)
            what = (f"{self.path} sets {shown}: new or changed since miniagi last used this file, and code that a "
                    "run executes can write it")
            if not getattr(ui, "interactive", False):
                raise ConfigError(f"{what}. Confirm it by running miniagi in a terminal, or give the setting in the "
                                  "environment or as an option (they take precedence over .env)")
            if not ui.confirm(f"{what}. Use it?"):
                raise ConfigError(f"{self.path} was not used: edit it, or give the setting in the environment or as "
                                  "an option")
        record[str(self.path)] = {**(known or {}), **{name: _digest(value) for name, value in used.items()}}
        record[CODE_DIRS] = _code_dirs_with(code_dirs, os.path.realpath(self.settings.workdir_path))
        workdir_env = str(self.settings.workdir_path / ".env")
        if workdir_env not in record:  # code will run beside it: from now on, what it holds is what was seen
            from dotenv import dotenv_values

            try:
                values = (dotenv_values(workdir_env, encoding="utf-8", interpolate=False)
                          if os.path.isfile(workdir_env) else {})
            except (OSError, UnicodeDecodeError):
                values = {}
            record[workdir_env] = {name: _digest(value) for name, value in values.items()
                                   if value and (name in ENDPOINT_NAMES or _sensitive_name(name))}
        problems = []
        for path in reversed(record_paths):  # the run's home first: a home that cannot be written is said as before
            try:
                _save(path, record)
            except OSError as exc:
                problems.append(exc)
        if len(problems) == len(record_paths):
            raise problems[0]

    def changed(self) -> list[Path]:
        """The watched .env files whose bytes changed since the last look (each change is reported once)."""
        found = []
        for path, seen in self.watched.items():
            now = _file_digest(path)
            if now != seen:
                found.append(path)
                self.watched[path] = now
        return sorted(found)


def _code_dirs_with(places: list[str], workdir: str) -> list[str]:
    """The list with this work directory; many siblings (a batch's objectives, work/1 … work/N) become their
    folder, so the record does not grow with every objective (asking about a .env there too is the cost)."""
    if any(_under(workdir, place) for place in places):
        return places
    places = [place for place in places if not _under(place, workdir)] + [workdir]
    parent = os.path.dirname(workdir)
    siblings = [place for place in places if os.path.dirname(place) == parent]
    if len(siblings) > MAX_SIBLINGS and parent != "/":
        places = [place for place in places if not _under(place, parent)] + [parent]
    return sorted(places)


def _listed(value) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _sensitive_name(name: str) -> bool:
    return any(name in OPTIONS_BY_NAME[option].env_names for option in SENSITIVE)


def _shown(name: str, value: str) -> str:
    if name == "OPENAI_API_KEY":
        return "(a different key)"
    from .redaction import REDACTED, URL_PASSWORD

    return URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), value)


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, record: dict) -> None:
    from .safefs import replace_file

    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        replace_file(folder, path.name, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode(), 0o600)
    finally:
        os.close(folder)


def narrowed(recorded: Settings, current: Settings) -> tuple[Settings, dict[str, str]]:
    """A trace's settings made safe to run again: the widening ones are the current settings' (the trace may only
    keep code off the network or in a stronger sandbox), a limit is the trace's only where it is no looser than the
    current one. Returns them, and what differs (name → said)."""
    values, differences = {}, {}
    for name in WIDENING + LIMITS:
        mine, theirs = getattr(current, name), getattr(recorded, name)
        if name in LIMITS:
            looser = (mine != 0 and (theirs == 0 or theirs > mine)) if name == "max_cost" else theirs > mine
        elif name == "no_network":  # the trace may keep code off the network, not put it back on
            looser = mine and not theirs
        elif name == "sandbox":  # nor weaken the sandbox
            looser = SANDBOX_STRENGTH.get(theirs, 0) < SANDBOX_STRENGTH.get(mine, 0)
        else:
            looser = mine != theirs
        values[name] = mine if looser else theirs
        if looser:
            flag = OPTIONS_BY_NAME[name].flag
            differences[name] = f"{flag} {_setting(name, theirs)} (now {_setting(name, mine)})"
    return replace(recorded, **values), differences


def _setting(name: str, value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if name == "max_cost" and value == 0:
        return "0: no limit"
    if isinstance(value, (tuple, list)):
        return ",".join(value) or "none"
    return "none" if value is None else str(value)


def resume_flags(settings: Settings, *, leave: tuple[str, ...] = ()) -> str:
    """The options a `miniagi resume` of a run needs to go on as it ran (the trace does not widen or loosen what the
    user gives then): the widening settings and the limits it had that are not the defaults, e.g. " -y --pass-env
    HF_TOKEN". `leave`: settings the caller gives itself (the limit to raise)."""
    import shlex

    default = Settings()
    flags = []
    for name in sorted(WIDENING + LIMITS, key=lambda name: name != "yes"):  # -y first: the one most often needed
        value = getattr(settings, name)
        if name in leave or name == "no_network" or value == getattr(default, name) \
                or (name == "home" and value == os.environ.get("MINIAGI_HOME")):  # found without the flag
            continue
        option = OPTIONS_BY_NAME[name]
        flag = option.short or option.flag
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            values = value if isinstance(value, (tuple, list)) else [value]
            flags += [f"{flag} {shlex.quote(f'{v:g}' if isinstance(v, float) else str(v))}" for v in values]
    return "".join(f" {flag}" for flag in flags)
