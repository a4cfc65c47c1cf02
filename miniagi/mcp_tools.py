"""MCP servers' tools as commands (see docs/mcp.md).

Servers are configured in the format the ecosystem uses, `{"mcpServers": {"NAME": {"command", "args", "env"}}}` for
a program spoken to over stdio, `{"NAME": {"url"}}` for streamable HTTP: files given with --mcp-config (or
MINIAGI_MCP_CONFIG), and the work directory's `.mcp.json` once the user said yes to it and to the scripts it names
(it starts programs outside the sandbox, and code a run executes can write it: trust.py's one rule judges it, at its
own path). A server starts in an empty folder of its own, never the work directory, a relative command or script
path is taken from the configuration file's own folder, and a Python server runs isolated (`python -I`): nothing
code wrote where it works is imported by a program that runs outside the sandbox.

Each tool of a server becomes a command `SERVER__TOOL`: its description is the server's, its arguments one JSON
object (its input schema is the tools format's schema), and inside execute_python a function with keyword
arguments. A call asks for approval like execute_*; its result (text; a note for images and resources) is an
observation fenced as untrusted; a tool error, a timeout or a server that died is an observation too.

The official SDK is asynchronous: `McpTools` runs it on an event loop of its own, in a background thread, and gives
the loop a plain blocking `call`. Every call's result is recorded in the trace (an `mcp_call` event), so `replay`
starts no server and answers each call with its recorded result (`RecordedMcp`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import keyword
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .commands import COMMANDS, Command, Outcome, Parameter, untrusted
from .config import ConfigError

START_TIMEOUT_S = 60.0  # a server that has not listed its tools by then is left out
STOP_TIMEOUT_S = 10.0
MAX_RESULT_CHARS = 200_000  # what one result may hold before the observation's own bound (cap_text)
WORKDIR_FILE = ".mcp.json"
TRUST_KEY = "mcpServers"
BAD_ARGUMENTS = "<text>"  # the key under which a text that is not a JSON object is kept (see McpCommand.missing)
PYTHON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
                "object": "dict"}


# --- configuration ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerSpec:
    name: str
    source: str  # the file it came from
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    url: str | None = None
    headers: dict = field(default_factory=dict)
    copies: tuple[tuple[int, bytes], ...] = ()  # (index in args, the script's bytes judged): run from a copy of them

    @property
    def prefix(self) -> str:
        return slug(self.name)

    def secrets(self) -> dict[str, str]:
        """What the redactor should hide: its env (secret by name or shape) and the credential of an
        Authorization header or a header named like a secret."""
        credentials = {f"MCP_{name.upper()}_TOKEN": value.split()[-1] for name, value in self.headers.items()
                       if value.split() and (name.lower() in ("authorization", "proxy-authorization")
                                             or re.search(r"key|token|secret|auth", name, re.I))}
        return {**self.env, **credentials}


def slug(name: str) -> str:
    """A name as a command may have it: lower case, letters, digits and _ (check_command lower-cases names)."""
    text = re.sub(r"[^a-z0-9_]+", "_", name.strip().lower()).strip("_") or "x"
    return f"_{text}" if text[0].isdigit() else text


def read_config(path: Path) -> list[ServerSpec]:
    """The servers a file configures; a ConfigError (one line) for a file that cannot be used."""
    return parse_config(path, _read_bytes(path))


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"MCP configuration {path}: {exc.strerror or exc}") from None


def parse_config(path: Path, raw: bytes) -> list[ServerSpec]:
    """The servers these bytes of the file at `path` configure (the bytes judged are the bytes used)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ConfigError(f"MCP configuration {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"MCP configuration {path} must hold a JSON object ({{\"mcpServers\": {{…}}}})")
    servers = data.get("mcpServers", data)
    if not isinstance(servers, dict):
        raise ConfigError(f"MCP configuration {path}: mcpServers must be an object of servers by name")
    specs = []
    for name, entry in servers.items():
        where = f"MCP configuration {path}, server {name!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object with a command or a url")
        kind = str(entry.get("type") or entry.get("transport") or "").lower()
        if kind == "sse":
            raise ConfigError(f"{where}: the SSE transport is not supported; use its streamable HTTP url")
        args, env, headers = entry.get("args", []), entry.get("env", {}) or {}, entry.get("headers", {}) or {}
        if not (isinstance(args, list) and all(isinstance(a, (str, int, float)) for a in args)):
            raise ConfigError(f"{where}: args must be a list of strings")
        if not (isinstance(env, dict) and isinstance(headers, dict)):
            raise ConfigError(f"{where}: env and headers must be objects of strings")
        if isinstance(entry.get("url"), str) and entry["url"].strip():
            url = entry["url"].strip()
            if not re.match(r"https?://", url):
                raise ConfigError(f"{where}: url must start with http:// or https://")
            specs.append(ServerSpec(str(name), str(path), url=url,
                                    headers={str(k): str(v) for k, v in headers.items()}))
        elif isinstance(entry.get("command"), str) and entry["command"].strip():
            command, args = _anchored(path.parent, entry["command"].strip(), [str(a) for a in args])
            specs.append(ServerSpec(str(name), str(path), command=command, args=tuple(args),
                                    env={str(k): str(v) for k, v in env.items()}))
        else:
            raise ConfigError(f"{where}: needs a \"command\" (a program spoken to over stdio) or a \"url\" "
                              "(streamable HTTP)")
    return specs


PYTHON = re.compile(r"python[0-9.]*$")


def _anchored(folder: Path, command: str, args: list[str]) -> tuple[str, list[str]]:
    """A server's command line with its relative command and script paths taken from the configuration file's own
    folder (never the current one, where code may have written), and a Python command isolated (-I: no current
    folder, script folder, PYTHON* variable or user site on its import path)."""
    def anchored(part: str) -> str:
        return str(folder / part) if not os.path.isabs(part) and os.path.exists(folder / part) else part

    command = str(folder / command) if "/" in command and not os.path.isabs(command) else command
    args = [arg if arg.startswith("-") else anchored(arg) for arg in args]
    if PYTHON.match(os.path.basename(command)) and args[:1] != ["-I"]:
        args = ["-I", *args]
    return command, args


def configured_servers(settings, ui) -> list[ServerSpec]:
    """The servers of the --mcp-config files, and of the work directory's .mcp.json once trusted: each file, and the
    scripts it names, judged by trust.py's one rule wherever code could have written them."""
    from .trust import own_path

    given = [own_path(p) for p in settings.mcp_config]
    named_now = set(given) - _from_environment()  # a path named now (an option, the API) is the user's yes
    specs = [spec for path in given for spec in _judged(path, ui, local=False, named=path in named_now)]
    local = own_path(settings.workdir_path / WORKDIR_FILE)
    if local.is_file() and local not in given:
        specs += _judged(local, ui, local=True, named=False)
    seen: dict[str, ServerSpec] = {}
    for spec in specs:  # a name given twice: the later file wins, as in the ecosystem's merged configurations
        seen[spec.prefix] = spec
    return list(seen.values())


def _from_environment() -> set[Path]:
    """The configuration files MINIAGI_MCP_CONFIG names (the environment's, or a .env's): a value that outlives the
    command, so no yes to what the files hold now."""
    from .config import OPTIONS_BY_NAME, _from_layer, read_settings_files
    from .trust import own_path

    option = OPTIONS_BY_NAME["mcp_config"]
    found = set()
    for layer in (os.environ, read_settings_files()):
        try:
            found |= {own_path(p) for p in _from_layer(option, layer) or ()}
        except ConfigError:
            pass
    return found


def _judged(path: Path, ui, *, local: bool, named: bool) -> list[ServerSpec]:
    """The servers of one configuration file, read once: the bytes judged are the bytes parsed, and a script in
    code's reach that a Python server runs is run from a copy of the bytes judged (no swap between the two).

    A file in code's reach (the work directory's .mcp.json always), or one naming a script there, is used only as
    the user said yes to it: at the terminal, or by naming it on the command line now. A server whose program lies
    where code has run, or that runs a script there with a program that may load what lies beside it (not
    `python -I`), loads files no hash covers: it is asked about at every start, and not started with no terminal."""
    from .trust import TARGET, TrustRecord

    record = TrustRecord()
    try:
        raw = _read_bytes(path)
    except ConfigError as exc:
        if not local:
            raise
        ui.warn(f"{path} was not used: {exc}")
        return []
    specs = parse_config(path, raw)
    facts = {TRUST_KEY: hashlib.sha256(raw).hexdigest()}
    pinned, unbounded = [], []
    in_reach = local or record.writable_by_code(path)
    for spec in specs:
        pinned.append(_pinned(spec, path, in_reach, record, facts, unbounded) if spec.command else spec)
    if path.is_symlink():
        facts[TARGET] = os.path.realpath(path)
    judged = in_reach or any(name != TRUST_KEY for name in facts)
    changed = record.judge(path, facts, new_is_trusted=False) if judged else []
    if named and changed and not unbounded:  # named on the command line now: a yes to these bytes
        record.remember(path, facts)
        _save(record, ui, path)
        return pinned
    if not changed and not unbounded:
        return pinned
    what = (f"{path} asks to start MCP servers: programs that run outside the sandbox, and code that a run executes "
            "can write " + ("this file" if in_reach else "what it runs")
            + (f" (a link to {facts[TARGET]})" if TARGET in facts else ""))
    loads = ("; ".join(unbounded) + ": a yes cannot cover what it loads from there, so it is asked at every start"
             if unbounded else "")
    if not getattr(ui, "interactive", False):
        hint = (f"; give it with --mcp-config {path} to use it" if not unbounded
                else "; move the server out of the folders code has run in")
        ui.warn(f"{path} was not used: it starts programs outside the sandbox and there is no terminal to confirm "
                f"it{' (' + loads + ')' if loads else ''}{hint}")
        return []
    if not ui.confirm(f"{what}:\n{_listed(specs)}\n" + (f"{loads}.\n" if loads else "") + "Start them?"):
        ui.warn(f"{path} was not used")
        return []
    record.remember(path, facts)
    _save(record, ui, path)
    return pinned


def _pinned(spec: ServerSpec, config: Path, config_in_reach: bool, record, facts: dict, unbounded: list) -> ServerSpec:
    """A stdio server as it will start: its program found once, the scripts in code's reach it runs hashed into
    `facts` (a Python server's then run from a copy); what no hash covers is added to `unbounded`."""
    program = _program(spec.command)
    python = PYTHON.match(os.path.basename(spec.command)) is not None and spec.args[:1] == ("-I",)
    if program and record.writable_by_code(program):  # (a venv's python is a link out: its own path counts)
        unbounded.append(f"{spec.name} runs {program}, where code has run")
    copies = []
    for index, part in enumerate(spec.args):
        if not (os.path.isabs(part) and os.path.isfile(part)) or part == program or not (
                (config_in_reach and part.startswith(str(config.parent) + os.sep)) or record.writable_by_code(part)):
            continue
        try:
            content = Path(part).read_bytes()
        except OSError:
            continue
        facts[f"file {part}"] = hashlib.sha256(content).hexdigest()
        if python:
            copies.append((index, content))
        else:
            unbounded.append(f"{spec.name} runs {part} with {os.path.basename(spec.command)}, which may load the "
                             "files beside it")
    return ServerSpec(spec.name, spec.source, program or spec.command, spec.args, spec.env, copies=tuple(copies))


def _program(command: str) -> str | None:
    """The file a command names, found once (the same one starts): an absolute path, or the first match in the PATH's
    folders code cannot have planted it in (as the sandbox finds bwrap); else the PATH's first match, which lies
    where code has run (a relative folder, one in the work directory) and so is judged as such."""
    if os.path.isabs(command):
        return command if os.path.isfile(command) else None
    from .execution.sandbox import find_program

    safe = find_program(command, os.environ.get("PATH"))
    if safe:
        return safe
    anywhere = shutil.which(command)
    return os.path.abspath(anywhere) if anywhere else None


def _save(record, ui, path: Path) -> None:
    try:
        record.save()
    except OSError:
        ui.warn(f"the yes to {path} could not be remembered: it will be asked about again")


def _listed(specs: list[ServerSpec]) -> str:
    """Each server and what it starts: its command line (with the names of the variables it sets), or its URL."""
    import shlex

    lines = []
    for spec in specs:
        started = spec.url if spec.url else shlex.join([spec.command or "", *spec.args])
        env = f" (with {', '.join(sorted(spec.env))} set)" if spec.env else ""
        lines.append(f"  {spec.name}: {started}{env}")
    return "\n".join(lines)


# --- tools as commands --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McpCommand(Command):
    """A server's tool: one JSON object of arguments, described by the tool's own input schema."""

    server: str = ""
    tool: str = ""
    input_schema: dict = field(default_factory=dict, compare=False)

    @property
    def properties(self) -> dict:
        props = self.input_schema.get("properties")
        return props if isinstance(props, dict) else {}

    @property
    def required(self) -> list[str]:
        required = self.input_schema.get("required")
        return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []

    def _ordered(self) -> list[tuple[str, bool]]:
        """The properties, required first (as Python wants them): (name, required)."""
        required = [name for name in self.required if name in self.properties]
        return [(name, True) for name in required] + [(n, False) for n in self.properties if n not in required]

    def signature(self, returns: bool = True) -> str:
        parts = []
        for name, needed in self._ordered():
            kind = _python_type(self.properties[name])
            default = self.properties[name].get("default") if isinstance(self.properties[name], dict) else None
            parts.append(f"{name}: {kind}" if needed else f"{name}: {kind} = {default!r}")
        return f"{self.name}({', '.join(parts)})" + (" -> str" if returns else "")

    def schema(self) -> dict:
        """The tool's input schema, less its titles (a label per property that the names say already: tokens sent
        with every request of the tools format)."""
        schema = {k: v for k, v in self.input_schema.items() if k != "title"}
        schema["type"] = "object"
        schema["properties"] = {name: {k: v for k, v in spec.items() if k != "title"}
                                if isinstance(spec, dict) else spec for name, spec in self.properties.items()}
        return schema

    def python_signature(self) -> str:
        return ""  # its keys are in its help: one sentence of the system prompt says how code calls a tool

    # its argument is one JSON object, written and read as JSON (by every format, the tags' too)
    def placeholders(self) -> dict:
        return {name: _placeholder(self.properties[name]) for name, needed in self._ordered() if needed}

    def help_argument(self) -> str:
        optional = [name for name, needed in self._ordered() if not needed]
        return (json.dumps(self.placeholders(), ensure_ascii=False)
                + (f" (optional: {', '.join(optional)})" if optional else ""))

    def listing(self) -> dict:
        """Its arguments as the help writes them, and where it comes from: its server and input schema."""
        return {**super().listing(), "arguments": self.help_argument(), "server": self.server,
                "input_schema": self.schema()}

    def python_spec(self) -> dict:
        """Its function for the worker: a keyword argument per property; a property whose name Python cannot take
        as one ("repo-path", "class") is given through **more."""
        params, more = [], False
        for name, needed in self._ordered():
            if not name.isidentifier() or keyword.iskeyword(name):
                more = True
                continue
            spec = self.properties[name] if isinstance(self.properties[name], dict) else {}
            params.append([name, _python_type(spec), needed, spec.get("default")])
        return {"name": self.name, "params": params, "returns": "str", "doc": self.doc, "json": True, "more": more}

    def text(self, args: dict) -> str:
        if BAD_ARGUMENTS in args:
            return str(args[BAD_ARGUMENTS])
        return json.dumps(args, ensure_ascii=False)

    def parse(self, text: str) -> dict:
        text = text.strip()
        if not text:
            return {}
        try:
            values = json.loads(text)
        except ValueError:
            values = None
        if isinstance(values, dict):
            return self.arguments(values)
        strings = [name for name, spec in self.properties.items()
                   if isinstance(spec, dict) and spec.get("type") == "string"]
        sole = self.required or list(self.properties)
        if len(sole) == 1 and sole[0] in strings:  # a lone text argument needs no JSON around it
            return {sole[0]: text}
        return {BAD_ARGUMENTS: text}

    def arguments(self, values) -> dict:
        if not isinstance(values, dict):
            return self.parse(values if isinstance(values, str) else json.dumps(values, ensure_ascii=False))
        if values and not values.keys() & self.properties.keys() and len(values) == 1:
            inner = next(iter(values.values()))  # {"arguments": {…}} or the older json format's {"arg": "…"}
            if isinstance(inner, dict):
                return self.arguments(inner)
            if isinstance(inner, str) and inner.strip().startswith("{"):
                return self.parse(inner)
        return {key: value for key, value in values.items() if value is not None}

    def missing(self, args: dict) -> list[str]:
        if BAD_ARGUMENTS in args:
            return ["its arguments as one JSON object"]
        return [name for name in self.required if name not in args]

    def __call__(self, workspace, args: dict) -> Outcome:
        return self.run(self, args)


def python_note(tools: Sequence[McpCommand]) -> str:
    """What the system prompt says of an agent's MCP tools inside execute_python (they are not listed one by one
    there: each one's keys are in its help)."""
    if not tools:
        return ""
    example = next((c for c in tools if c.placeholders()), tools[0])
    arguments = ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}"
                          for name, value in example.placeholders().items())
    return (f"; and each MCP tool (the SERVER__TOOL commands), its JSON keys as keyword arguments, returning the "
            f"result's text, e.g. {example.name}({arguments})")


def _python_type(spec) -> str:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, list):  # ["string", "null"]
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and isinstance(spec, dict) and isinstance(spec.get("anyOf"), list):
        kinds = [s.get("type") for s in spec["anyOf"] if isinstance(s, dict) and s.get("type") != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return PYTHON_TYPES.get(kind, "object") if isinstance(kind, str) else "object"


def _placeholder(spec):
    kind = _python_type(spec)
    return {"int": 0, "float": 0, "bool": False, "list": ["…"], "dict": {}}.get(kind, "…")


def make_commands(definitions: list[dict], call: Callable[[McpCommand, dict], Outcome],
                  needs_approval: bool = True, warn: Callable[[str], None] = lambda text: None) -> list[McpCommand]:
    """Commands for tool definitions ({server, prefix, tool, description, input_schema})."""
    commands: dict[str, McpCommand] = {}
    for definition in definitions:
        name = f"{definition['prefix']}__{slug(definition['tool'])}"[:64]
        if name in commands or name in COMMANDS:
            warn(f"MCP server {definition['server']}: tool {definition['tool']} is left out: its command name {name} "
                 "is taken")
            continue
        schema = definition.get("input_schema") if isinstance(definition.get("input_schema"), dict) else {}
        doc = " ".join(str(definition.get("description") or f"the {definition['tool']} tool").split())
        doc = f"[MCP server {definition['server']}] {doc}"
        parameters = tuple(Parameter(p, "str") for p in (schema.get("properties") or {}))
        commands[name] = McpCommand(name, doc, parameters, call, needs_approval=needs_approval, python=True,
                                    server=definition["server"], tool=definition["tool"], input_schema=schema)
    return list(commands.values())


# --- results --------------------------------------------------------------------------------------------------------
def result_text(result) -> str:
    """What a tool's result says, as text: its text parts, a note for each image, audio or binary resource."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data or "") * 3 // 4
            parts.append(f"[{'an image' if kind == 'image' else 'audio'} ({block.mime_type}, about {size:,} bytes): "
                         "not shown]")
        elif kind == "resource":
            resource = block.resource
            if getattr(resource, "text", None) is not None:
                parts.append(f"[resource {resource.uri}]\n{resource.text}")
            else:
                parts.append(f"[resource {resource.uri} ({resource.mime_type or 'binary'}): binary, not shown]")
        elif kind == "resource_link":
            parts.append(f"[a link to the resource {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        else:
            parts.append(f"[a {kind or 'content'} block: not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, indent=1))
    return "\n".join(parts)


def outcome(command: McpCommand, text: str, ok: bool, own: bool = False) -> Outcome:
    """A call's observation: the server's words fenced as untrusted data; a failure said as one (`own`: the words
    are miniagi's, not the server's: a timeout, a server gone)."""
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[… {len(text) - MAX_RESULT_CHARS:,} more characters not shown]"
    label = f"result of {command.tool} from the MCP server {command.server}"
    if ok:
        fenced = untrusted(label, text or "(the tool returned nothing)")
        head, _, rest = untrusted(label, text).partition("\n")
        tail = rest.rpartition("\n")[2]
        # code gets the text itself; printed, it shows between the fence's lines (as read(source) does)
        return Outcome(fenced, data={"text": text, "fence": [head + "\n", "\n" + tail]})
    said = text if own else untrusted(f"error of {command.tool} from the MCP server {command.server}", text) \
        if text else "no reason given"
    # code that called the tool gets an exception (ToolError) with these words
    return Outcome(f"{command.name} failed: {said}", data={"error": f"{command.name} failed: {said}"})


def _failure(exc: BaseException) -> str:
    """One line for an exception the SDK raised (an exception group's first real cause)."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # an exception group
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the live servers ------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Server:
    spec: ServerSpec
    ready: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    session: Any = None
    stop: Any = None  # an asyncio.Event of the loop
    done: concurrent.futures.Future | None = None  # the task that holds the connection
    gone: str = ""  # why it is no longer there
    log: Any = None


class McpTools:
    """The run's MCP servers: started (`start`) on a loop of their own, their tools registered as commands, and
    stopped (`close`). `record(command, arguments, text, ok)`, when set, hears of every call."""

    def __init__(self, specs: list[ServerSpec] = (), timeout_s: float = 120.0,
                 warn: Callable[[str], None] = lambda text: None):
        self.specs, self.timeout_s, self.warn = list(specs), timeout_s, warn
        self.folder: str | None = None  # the servers' current folder: empty, made for them, never the work directory
        self.servers: dict[str, _Server] = {}
        self.commands: list[McpCommand] = []
        self.definitions: list[dict] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.record: Callable[[McpCommand, dict, str, bool, bool], None] | None = None

    @classmethod
    def configured(cls, settings, ui) -> "McpTools":
        return cls(configured_servers(settings, ui), timeout_s=settings.exec_timeout, warn=ui.warn)

    def _folder(self) -> str:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="miniagi-mcp-")
        return self.folder

    def _args(self, spec: ServerSpec) -> list[str]:
        """The server's arguments, each script judged replaced by a copy of the bytes judged, in a folder of its
        own in the servers' private folder (the name kept: a script may say what it is by it)."""
        args = list(spec.args)
        for index, content in spec.copies:
            folder = tempfile.mkdtemp(prefix=f"{spec.prefix}-", dir=self._folder())
            copy = os.path.join(folder, os.path.basename(args[index]))
            with open(copy, "xb") as handle:
                handle.write(content)
            args[index] = copy
        return args

    @property
    def running(self) -> bool:
        return self.loop is not None

    def start(self) -> None:
        """Start every server and register its tools; a server that fails is left out, said in one line."""
        if self.running or not self.specs:
            return
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp", daemon=True)
        self.thread.start()
        try:
            self._start()
        except BaseException:  # interrupted while the servers start: none is left running
            self.close()
            raise

    def _start(self) -> None:
        self.servers = {spec.prefix: _Server(spec) for spec in self.specs}
        for server in self.servers.values():
            server.log = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
            server.done = asyncio.run_coroutine_threadsafe(self._serve(server), self.loop)
        self.definitions = []
        for server in self.servers.values():
            try:
                tools = server.ready.result(START_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                self.warn(f"MCP server {server.spec.name} did not start within {START_TIMEOUT_S:g} s"
                          f"{self._last_words(server)}: its tools are not available")
                self._stop(server)
                continue
            except BaseException as exc:  # noqa: BLE001 -- whatever the SDK raised, the run goes on without it
                self.warn(f"MCP server {server.spec.name} could not start ({_failure(exc)}{self._last_words(server)})"
                          ": its tools are not available")
                continue
            self.definitions += [{"server": server.spec.name, "prefix": server.spec.prefix, "tool": tool.name,
                                  "description": tool.description or "", "input_schema": tool.input_schema}
                                 for tool in tools]
        self.commands = make_commands(self.definitions, self.call, warn=self.warn)

    async def _serve(self, server: _Server) -> None:
        """Hold one server's connection until told to stop (the SDK's contexts open and close in one task)."""
        from contextlib import AsyncExitStack

        from mcp import ClientSession

        server.stop = asyncio.Event()
        spec = server.spec
        try:
            async with AsyncExitStack() as stack:
                if spec.url:
                    from mcp.client.streamable_http import streamable_http_client
                    from mcp.shared._httpx_utils import create_mcp_http_client

                    client = await stack.enter_async_context(create_mcp_http_client(headers=spec.headers or None))
                    streams = await stack.enter_async_context(streamable_http_client(spec.url, http_client=client))
                else:
                    from mcp import StdioServerParameters
                    from mcp.client.stdio import get_default_environment, stdio_client

                    parameters = StdioServerParameters(command=spec.command, args=self._args(spec),
                                                       env={**get_default_environment(), **spec.env},
                                                       cwd=self._folder())
                    streams = await stack.enter_async_context(stdio_client(parameters, errlog=server.log))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await asyncio.wait_for(session.initialize(), START_TIMEOUT_S)
                tools, cursor = [], None
                while True:
                    from mcp.types import PaginatedRequestParams

                    listed = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools += listed.tools
                    cursor = listed.next_cursor
                    if not cursor:
                        break
                server.session = session
                server.ready.set_result(tools)
                await server.stop.wait()
        except BaseException as exc:  # noqa: BLE001 -- told to the caller: at start, or on the next call
            server.gone = server.gone or _failure(exc)
            if not server.ready.done():
                server.ready.set_exception(exc)
        finally:
            server.gone = server.gone or "it was stopped"
            server.session = None

    def _last_words(self, server: _Server) -> str:
        """The last line the server wrote on its stderr, if any."""
        try:
            server.log.flush()
            server.log.seek(0)
            lines = [line.strip() for line in server.log.read()[-4000:].splitlines() if line.strip()]
        except (OSError, ValueError, AttributeError):
            return ""
        return f"; it said: {lines[-1][:200]}" if lines else ""

    def call(self, command: McpCommand, args: dict) -> Outcome:
        """Call a tool and wait for its result, at most --exec-timeout: an observation whatever happens."""
        text, ok, own = self._call(command, args)
        if self.record is not None:
            self.record(command, args, text, ok, own)
        return outcome(command, text, ok, own)

    def _call(self, command: McpCommand, args: dict) -> tuple[str, bool, bool]:
        """(what came back, whether the call succeeded, whether the text is miniagi's own rather than the server's)"""
        server = self.servers.get(slug(command.server))
        if server is None or self.loop is None or server.session is None:
            why = server.gone if server is not None and server.gone else "it is not running"
            return f"the MCP server {command.server} is not available ({why}).", False, True
        timeout = (f"no answer from the MCP server {command.server} within {self.timeout_s:g} s (the --exec-timeout "
                   "limit); the call was abandoned.")
        future = asyncio.run_coroutine_threadsafe(
            server.session.call_tool(command.tool, args, read_timeout_seconds=self.timeout_s), self.loop)
        try:
            result = future.result(self.timeout_s + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return timeout, False, True
        except Exception as exc:  # noqa: BLE001 -- whatever the SDK raised is the observation
            failure = _failure(exc)
            if "timed out" in failure.lower():
                return timeout, False, True
            if "connection closed" in failure.lower() or (server.done is not None and server.done.done()):
                server.gone = "its connection closed: the server exited"
                server.session = None
                self._stop(server)
                return (f"the MCP server {command.server} is gone ({server.gone}); its tools cannot be used for the "
                        "rest of this run.", False, True)
            return f"the call failed: {failure}", False, True
        finally:
            future.cancel()
        if not hasattr(result, "content"):
            kind = getattr(result, "result_type", type(result).__name__)
            return f"the server answered with a {kind} result, which miniagi cannot use.", False, True
        return result_text(result), not getattr(result, "is_error", False), False

    def _stop(self, server: _Server) -> None:
        if self.loop is not None and server.stop is not None:
            self.loop.call_soon_threadsafe(server.stop.set)

    def close(self) -> None:
        """Stop every server (each ends its connection and its process). Their commands stay in the agent's table:
        a call of one finds its server again once `start` has started them again."""
        if self.loop is None:
            return
        for server in self.servers.values():
            self._stop(server)
        for server in self.servers.values():
            if server.done is not None:
                try:
                    server.done.result(STOP_TIMEOUT_S)
                except BaseException:  # noqa: BLE001 -- stopping: what went wrong was said when it did
                    server.done.cancel()
            if server.log is not None:
                server.log.close()
        loop, self.loop = self.loop, None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        loop.call_soon_threadsafe(loop.stop)
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT_S)
        if not loop.is_running():
            loop.close()


class RecordedMcp:
    """The MCP tools of a recorded run, for `replay`: no server is started; each call gets the result recorded for
    the same command, in order (so no approval is asked: nothing acts outside)."""

    def __init__(self, definitions: list[dict], calls: list[dict]):
        self.definitions = [d for d in definitions if isinstance(d, dict) and {"server", "prefix", "tool"} <= d.keys()]
        self.calls: dict[str, list[dict]] = {}
        for call in calls:
            self.calls.setdefault(str(call.get("command")), []).append(call)
        self.commands: list[McpCommand] = []
        self.record = None

    @property
    def running(self) -> bool:
        return bool(self.commands)

    def start(self) -> None:
        if not self.commands and self.definitions:
            self.commands = make_commands(self.definitions, self.call, needs_approval=False)

    def call(self, command: McpCommand, args: dict) -> Outcome:
        queue = self.calls.get(command.name)
        if not queue:
            text, ok, own = "replay: the recording holds no result for this call.", False, True
        else:
            recorded = queue.pop(0)
            text, ok, own = str(recorded.get("result", "")), bool(recorded.get("ok")), bool(recorded.get("own"))
        if self.record is not None:
            self.record(command, args, text, ok, own)
        return outcome(command, text, ok, own)

    def close(self) -> None:
        pass  # no server was started
