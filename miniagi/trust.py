"""What a run can write is not trusted later without the user's say. One rule, kept here (`TrustRecord.judge`),
for every file miniagi takes a setting or a program from — `.env`, the work directory's `.mcp.json` and the scripts
it names, the trust record itself, the home `miniagi ui` runs under — whichever entry point reads it (the CLI, the
UI, a batch, the Python API, MCP): a file is trusted only if executed code could not have written it or what it
points to, or the user said yes to its exact current content at its own path. See docs/security.md.

- The record of those yeses is `~/.miniagi/trusted-env.json`, and only that one: `~/.miniagi` (the user's own
  folder, `user_home`) is hidden from executed code under bwrap whatever --home and the work directory are, and no
  record elsewhere (a run's home, a work directory) is ever read. A file under `~/.miniagi` is the user's own.
- Code could have written a file when it lies in a work directory where code has run (the record keeps their list)
  or in this run's, or when it is a link to such a place. A link is judged at its own path, with what it points to.
- `.env` is read once, at start-up (config.read_dotenv), without expanding ${VAR} from the environment. Its
  sensitive settings (all but `HARMLESS`: which model is asked and how) are remembered per file, as a hash of each
  value; a change is any change of them, a line removed or emptied included. A changed file is asked about at the
  terminal; with no one to ask, the run is refused (exit 2). A file miniagi has never used, out of code's reach, is
  trusted as it is and remembered. A `.env` changed during a run is reported at its end.
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

from .config import ENDPOINT_ENV, OPTIONS_BY_NAME, ConfigError, Settings, _from_layer, read_dotenv, user_home

ENDPOINT_NAMES = ENDPOINT_ENV  # where requests go, with which key: every name config.Endpoint reads
# where data goes, what executed code sees or may reach, whether a person approves, where runs are kept
# (mcp_config: the servers it names are programs run outside the sandbox)
WIDENING = tuple(name for name in ("pass_env", "memory_url", "embedding_model", "prices", "yes", "home", "sandbox",
                                   "sandbox_allow", "no_network", "mcp_config")
                 if name in {f.name for f in fields(Settings)})
LIMITS = ("max_cost", "max_calls", "exec_timeout", "exec_memory", "exec_disk")  # 0 means no limit (max_cost)
SANDBOX_STRENGTH = {"none": 0, "namespace": 1, "bwrap": 2, "auto": 2}  # auto: the strongest that works
# what a .env may set without the user's yes: which model is asked, and how — all of it at the endpoint and within
# the limits the user has (max_cost, max_calls, max_steps need a yes). Nothing here chooses where data or files go,
# what code sees or may do, what is kept, or how long or how much a run may go on — but a model with no known price,
# which --max-cost cannot count, so it is judged as the sensitive settings are (unpriced_models).
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
    used.update(unpriced_models(dotenv, environ, settings))
    return used


def unpriced_models(dotenv: Mapping[str, str], environ: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The models this start takes from the .env that --max-cost cannot count (no known price: they cost 0 to it):
    harmless otherwise, they would let a run go on past the user's spending limit, so they are judged as sensitive
    settings are. None when there is no cost limit."""
    if not settings.max_cost:
        return {}
    from .prices import PriceTable

    try:
        prices = PriceTable(settings.prices)
    except ConfigError:
        prices = PriceTable()
    found = {}
    for name in ("model", "summarizer_model", "critic_model"):
        option = OPTIONS_BY_NAME[name]
        present = [env for env in option.env_names if str(dotenv.get(env) or "").strip()]
        value = getattr(settings, name)
        if present and value and not any(env in environ for env in option.env_names) \
                and _from_layer(option, dotenv) == value and not any(prices.price(value)):
            found.update({env: dotenv[env] for env in present})
    return found


def own_path(path) -> Path:
    """A file's own path: its folder resolved, its name kept (a link is judged where it is, not where it leads)."""
    path = Path(path).expanduser().absolute()
    return Path(os.path.realpath(path.parent)) / path.name


REMOVED = "(removed)"  # in a file's record: a sensitive setting the file had and no longer has


class TrustRecord:
    """The one rule of what miniagi trusts, and the record of the user's yeses it reads (~/.miniagi's, no other).

    `judge(path, facts)` says which of a file's facts (name → digest of its current content) the user has not said
    yes to; `remember` keeps the yes. Every file that gives a setting or starts a program goes through it."""

    def __init__(self):
        self.path = user_home() / TRUST_FILE
        self.data = _load(self.path)
        self.code_dirs = sorted(_listed(self.data.get(CODE_DIRS)))  # where executed code has run, so may have written

    def in_reach(self, path) -> bool:
        """Whether code could have written this path (as it is: resolve it first). ~/.miniagi never is."""
        path = str(path)
        return not _under(path, str(user_home())) and any(_under(path, place) for place in self.code_dirs)

    def writable_by_code(self, path) -> bool:
        """Whether code could have written the file at this path, or, for a link, what it points to."""
        own = own_path(path)
        return self.in_reach(own) or (own.is_symlink() and self.in_reach(os.path.realpath(own)))

    def entry(self, path) -> dict | None:
        known = self.data.get(str(own_path(path)))
        return known if isinstance(known, dict) else None

    def judge(self, path, facts: Mapping[str, str], *, new_is_trusted: bool = True) -> list[str]:
        """The facts of the file at `path` not trusted: those that differ from what the user said yes to at this
        path. A file under ~/.miniagi is the user's own; a file never seen is trusted as it is (when
        `new_is_trusted`) only where code could not have written it."""
        own = own_path(path)
        if _under(str(own), str(user_home())) and not own.is_symlink():
            return []
        known = self.entry(own)
        if known is None:
            if new_is_trusted and not self.writable_by_code(own):
                return []
            known = {}
        return sorted(name for name, value in facts.items() if known.get(name) != value)

    def remember(self, path, facts: Mapping[str, str]) -> None:
        self.data[str(own_path(path))] = {**(self.entry(path) or {}), **facts}

    def ran_code_in(self, workdir: Path) -> None:
        self.code_dirs = _code_dirs_with(self.code_dirs, os.path.realpath(workdir))
        self.data[CODE_DIRS] = self.code_dirs

    def save(self) -> None:
        _save(self.path, self.data)


class DotenvGuard:
    """The start-up check of the .env (`check`), and what a run reports of .env files changed while it ran."""

    def __init__(self, settings: Settings, environ: Mapping[str, str]):
        self.settings, self.environ = settings, environ
        self.path = Path.cwd().resolve() / ".env"  # the file read_dotenv reads
        self.watched = {path: _file_digest(path) for path in {self.path, settings.workdir_path / ".env"}}

    def check(self, ui) -> None:
        dotenv = read_dotenv()
        used = sensitive_values(dotenv, self.environ, self.settings)
        record = TrustRecord()
        known = record.entry(self.path) or {}
        for name in known:  # a sensitive line removed or emptied since: as much a change as a new value
            if name not in used and name != TARGET and (name in ENDPOINT_NAMES or _sensitive_name(name)) \
                    and not str(dotenv.get(name) or "").strip() and not self._given_elsewhere(name):
                used[name] = REMOVED
        if self.path.is_symlink():  # a linked .env is judged with what it points to, and remembered with it
            used[TARGET] = os.path.realpath(self.path)
        elif TARGET in known:
            used[TARGET] = "(not a link)"
        facts = {name: value if value == REMOVED else _digest(value) for name, value in used.items()}
        changed = record.judge(self.path, facts)
        if changed:
            unpriced = unpriced_models(dotenv, self.environ, self.settings)
            shown = ", ".join(f"a link to {used[name]}" if name == TARGET else f"{name} removed"
                              if used[name] == REMOVED else f"{name}={_shown(name, used[name])}"
                              + (" (no known price: --max-cost cannot count its calls)" if name in unpriced else "")
                              for name in changed)
            what = (f"{self.path}: {shown} — new or changed since miniagi last used this file, and code that a "
                    "run executes can write it")
            if not getattr(ui, "interactive", False):
                raise ConfigError(f"{what}. Confirm it by running miniagi in a terminal, or give the setting in the "
                                  "environment or as an option (they take precedence over .env)")
            if not ui.confirm(f"{what}. Use it?"):
                raise ConfigError(f"{self.path} was not used: edit it, or give the setting in the environment or as "
                                  "an option")
        record.remember(self.path, facts)
        record.ran_code_in(self.settings.workdir_path)
        workdir_env = self.settings.workdir_path / ".env"
        if record.entry(workdir_env) is None:  # code will run beside it: from now on, what it holds is what was seen
            from dotenv import dotenv_values

            try:
                values = (dotenv_values(workdir_env, encoding="utf-8", interpolate=False)
                          if workdir_env.is_file() else {})
            except (OSError, UnicodeDecodeError):
                values = {}
            record.remember(workdir_env, {name: _digest(value) for name, value in values.items()
                                          if value and (name in ENDPOINT_NAMES or _sensitive_name(name))})
        record.save()

    def _given_elsewhere(self, name: str) -> bool:
        """Whether the environment or an option gives this setting (then its .env line is not used, nor missed):
        the option's value is not its default."""
        if name in ENDPOINT_NAMES:
            return bool(self.environ.get(name))
        option = next(OPTIONS_BY_NAME[option] for option in SENSITIVE if name in OPTIONS_BY_NAME[option].env_names)
        return any(env in self.environ for env in option.env_names) or \
            getattr(self.settings, option.name) != option.default

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
    if name.endswith("API_KEY"):
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


def recorded_workdir(path: str, identity, hint: str = "") -> None:
    """The work directory a run recorded (resolved, at its start) is still that folder: no name on its path is now
    a link, and it is the same folder (`identity`, [st_dev, st_ino], when recorded). Code of a run working above it
    could have swapped a folder on the way for a link to anywhere; resume, replay and undo then refuse, in one
    line, rather than write there."""
    import stat

    from .safefs import open_path_dir

    try:
        folder = open_path_dir(path)
    except OSError as exc:
        if not os.path.lexists(path):
            raise ConfigError(f"the run's work directory {path} is gone") from None
        raise ConfigError(f"the run's work directory {path} cannot be used as recorded: a folder on its path is now "
                          f"a link (or no folder: {exc.strerror}){hint}") from None
    try:
        found = os.fstat(folder)
    finally:
        os.close(folder)
    if isinstance(identity, list) and len(identity) == 2 and stat.S_ISDIR(found.st_mode) \
            and [found.st_dev, found.st_ino] != identity:
        raise ConfigError(f"the run's work directory {path} is no longer the folder the run worked in (it was "
                          f"replaced since){hint}")


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
