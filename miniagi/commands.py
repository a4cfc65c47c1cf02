"""The commands the model can use: one typed Python function each, registered in one table.

A command is a function `name(workspace, parameter: type, …)` with a docstring. Everything the model sees of it is
generated from that one definition: the tags help and the one text several arguments are joined into (`Command.text`
and `parse`), the tools and json schemas (one typed property per parameter), and, for the commands marked `python`,
a function of the same signature inside execute_python. Adding a command is writing one function. A command of
another shape (an MCP tool, miniagi/mcp_tools.py) overrides those methods; each agent's `CommandTable` holds the
built-in commands and its own MCP tools. The docstring's
first paragraph says what the command does; a later line `parameter: text` describes each parameter for the schemas
(required: a command with an undescribed parameter is refused when it is defined).

A command acts through the narrow `Workspace` protocol below (never on the agent itself) and returns its
observation as text, or an `Outcome` when it also leaves notes, memories, data or the final answer, which the loop
applies.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Protocol

from .sources import SourceError, is_url
from .text import plural
from .websearch import SearchUnavailable

if TYPE_CHECKING:
    from memory.tokens import TokenCounter

    from .sources import Document
    from .websearch import SearchResult

INGEST_CHUNK_TOKENS = 250  # what the embedding model reads of a text
INGEST_OVERLAP_TOKENS = 30
MAX_INGEST_CHARS = 1_000_000  # ~250k tokens, ~1,100 parts (~90 s of local embedding): what one ingest stores
MAX_PROCESS_CHARS = 2_000_000  # what one process_data reads of a source (~70 summarizer calls at 8k context)
INGEST_BATCH = 128  # parts embedded and stored at a time, so a large source is never held embedded in memory
INGEST_SUMMARY_TOKENS = 150
SEARCH_RESULTS = 5
# a parameter's annotation → its JSON schema (the types a command's parameters may have)
SCHEMAS = {"str": {"type": "string"}, "list[str]": {"type": "array", "items": {"type": "string"}}}


@dataclass
class Memory:
    """A text for the vector store, of a kind (search, note, …); `key` tells apart several of one step."""

    kind: str
    text: str
    key: str = ""


@dataclass
class Outcome:
    """What a command leaves behind; the loop applies it the same way for every command."""

    observation: str = ""
    notes: list[str] = field(default_factory=list)  # kept in the agent's context for the run, and in memory
    memories: list[Memory] = field(default_factory=list)  # stored in the vector memory
    answer: str | None = None  # the run's final answer: the run ends (after the critic's check)
    data: list | dict | None = None  # the value Python code that called the command gets (web_search's results)
    hint: str = ""  # what to do with the result, said once at the end of the step's observation however many
    #                 calls of the step gave it


class DocumentShelf(Protocol):
    """Where ingest_data keeps a source's parts: one source's parts replace those stored before."""

    def forget(self, source: str) -> int: ...

    def store(self, source: str, label: str, parts: list[str], start: int, total: int) -> None: ...


class Workspace(Protocol):
    """What a command may use: the work directory, code execution, the person, the web, sources, documents, the
    run's memory (recall) and the summarizer model. Implemented by miniagi.workspace.RunWorkspace."""

    workdir: Path
    counter: TokenCounter  # the summarizer model's tokens
    chunk_budget: int  # what one summarizer call may read
    answer_tokens: int  # one answer drawn from a source, or one source's full text shown by ingest_data
    documents: DocumentShelf | None  # None when vector memory is off
    last_search: list[SearchResult]

    def run_python(self, code: str) -> str: ...

    def run_shell(self, command_line: str) -> str: ...

    def ask_user(self, message: str) -> str: ...

    def search(self, query: str, max_results: int) -> list[SearchResult]: ...

    def read(self, source: str) -> Document: ...

    def summarize(self, prompt: str) -> str: ...

    def progress(self, text: str) -> None: ...

    def recall(self, query: str) -> str: ...


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # its annotation, a key of SCHEMAS
    doc: str = ""

    @property
    def is_list(self) -> bool:
        return self.type.startswith("list[")

    def schema(self) -> dict:
        return dict(SCHEMAS[self.type], **({"description": self.doc} if self.doc else {}))

    def value(self, given) -> str | list[str]:
        """A value from a JSON reply, as this parameter's type (a lone string for a list, a number for a text)."""
        if self.is_list:
            items = given if isinstance(given, list) else [given]
            return [item.strip() if isinstance(item, str) else _as_text(item) for item in items]
        return given.strip() if isinstance(given, str) else _as_text(given)


def _as_text(value) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Command:
    name: str
    doc: str  # what it does and what comes back: the docstring's first paragraph
    parameters: tuple[Parameter, ...]
    run: Callable[..., "str | Outcome"]
    needs_approval: bool = False  # runs code on the user's machine: ask first unless -y
    python: bool = False  # a function inside execute_python too
    action: bool = True  # offered to the model as an action (False: a function inside execute_python only)
    returns: str = "str"  # what its Python function returns

    def signature(self, returns: bool = True) -> str:
        """As Python shows it: process_data(question: str, sources: list[str]) -> str."""
        arguments = ", ".join(f"{p.name}: {p.type}" for p in self.parameters)
        return f"{self.name}({arguments})" + (f" -> {self.returns}" if returns else "")

    def python_spec(self) -> dict:
        """Its function inside execute_python, for the Python worker: name, typed parameters, return type, doc."""
        return {"name": self.name, "params": [[p.name, p.type] for p in self.parameters], "returns": self.returns,
                "doc": self.doc}

    def schema(self) -> dict:
        """Its arguments as a JSON schema: one typed property per parameter, all required."""
        return {"type": "object", "properties": {p.name: p.schema() for p in self.parameters},
                "required": [p.name for p in self.parameters], "additionalProperties": False}

    def arguments(self, values: dict) -> dict:
        """The arguments of a JSON object, as their parameters' types (a lone string for a list, a number for a
        text): only the parameters' own names, absent and empty ones left out."""
        return {p.name: p.value(values[p.name]) for p in self.parameters if values.get(p.name) not in (None, "", [])}

    def missing(self, args: dict) -> list[str]:
        return [p.name for p in self.parameters if not args.get(p.name)]

    def __call__(self, workspace: Workspace, args: dict) -> Outcome:
        result = self.run(workspace, **{p.name: args[p.name] for p in self.parameters})
        return result if isinstance(result, Outcome) else Outcome(observation=result)

    # --- how its arguments are written: a command of another shape (an MCP tool's one JSON object) overrides these
    def text(self, args: dict) -> str:
        """The arguments as one text, joined with "|" (a list's items each after its own |): the tags format's
        argument, what the terminal shows and the loop compares."""
        parts = []
        for parameter in self.parameters:
            value = args.get(parameter.name)
            if value is not None:
                parts.extend(value if isinstance(value, list) else [value])
        return "|".join(str(part) for part in parts)

    def parse(self, text: str) -> dict:
        """The arguments of a text form. One parameter takes the whole text. Several are split at "|": a closing
        list takes the trailing parts that look like paths, URLs or result numbers (at least the last part), and the
        first parameter takes whatever is left over, so it may itself contain a "|"."""
        text = text.strip()
        if not text or not self.parameters:
            return {}
        if len(self.parameters) == 1:
            return {self.parameters[0].name: self.parameters[0].value(text)}
        parts = [part.strip() for part in text.split("|")]
        *leading, last = self.parameters
        tail: list[str] = []
        if len(parts) > len(leading):
            tail.append(parts.pop())
            while last.is_list and len(parts) > len(leading) and _ITEM.fullmatch(parts[-1]):
                tail.insert(0, parts.pop())
        extra = max(0, len(parts) - len(leading))
        values = ["|".join(parts[:extra + 1]), *parts[extra + 1:]]
        args = {p.name: value for p, value in zip(leading, values) if value}
        if tail:
            args[last.name] = tail if last.is_list else tail[0]
        return args

    def placeholders(self) -> dict:
        """Its arguments as placeholders: {"question": "…", "sources": ["…"]}."""
        return {p.name: ["…"] if p.is_list else "…" for p in self.parameters}

    def help_argument(self) -> str:
        """How the tags help names its argument: QUESTION|SOURCE[|…] (a list's items each after its own |)."""
        return "|".join(f"{p.name.upper().removesuffix('S')}[|…]" if p.is_list else p.name.upper()
                        for p in self.parameters)

    def python_signature(self) -> str:
        """How the system prompt lists it among the functions inside execute_python ("": not listed)."""
        return self.signature() if self.python else ""

    def listing(self) -> dict:
        """What `miniagi tools` lists of it: its name, its arguments (typed) and what it does."""
        return {"name": self.name, "arguments": ", ".join(f"{p.name}: {p.type}" for p in self.parameters),
                "doc": self.doc}


_ITEM = re.compile(r"\S*[./:\d]\S*")  # a list item in the text form: a path, a URL, a result number

# the built-in commands, filled as this module is imported (by @command) and never changed after: an agent's own
# table (CommandTable) adds its MCP tools
COMMANDS: dict[str, Command] = {}


class CommandTable(Mapping[str, Command]):
    """An agent's commands by name: the built-in ones and its MCP servers' tools, made once and handed to its reply
    format, system prompt, Python worker and runs."""

    def __init__(self, tools: Iterable[Command] = ()):
        self.tools = tuple(tools)  # the agent's MCP servers' tools
        self._by_name = {**COMMANDS, **{c.name: c for c in self.tools}}

    def __getitem__(self, name: str) -> Command:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def actions(self) -> list[Command]:
        """The commands the model may reply with."""
        return [c for c in self._by_name.values() if c.action]

    def python_tools(self) -> list[dict]:
        """The commands code can call from execute_python, for the Python worker: name, typed parameters, return
        type and what it does."""
        return [c.python_spec() for c in self._by_name.values() if c.python]

    def code_commands(self) -> frozenset[str]:
        """Commands whose argument is code run on the user's machine."""
        return frozenset(c.name for c in self._by_name.values() if c.needs_approval)


def command(needs_approval: bool = False, python: bool = False, action: bool = True, returns: str = "str"):
    """Register a function as a command: its name, typed parameters (after the workspace) and docstring are the
    command's whole description."""

    def register(function: Callable[..., "str | Outcome"]):
        parameters = list(inspect.signature(function).parameters.values())[1:]  # after the workspace
        doc = inspect.cleandoc(function.__doc__ or "")
        summary, _, rest = doc.partition("\n\n")
        described = dict(re.findall(r"^(\w+): (.+)$", rest, re.M))
        types = [p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
                 for p in parameters]
        for parameter, kind in zip(parameters, types):
            if kind not in SCHEMAS:
                raise TypeError(f"{function.__name__}: parameter {parameter.name} needs one of the types "
                                f"{', '.join(SCHEMAS)}, not {kind!r}")
            if not described.get(parameter.name, "").strip():
                raise TypeError(f"{function.__name__}: parameter {parameter.name} needs a description: a line "
                                f"'{parameter.name}: what it is' in the docstring, after its first paragraph")
        COMMANDS[function.__name__] = Command(
            function.__name__, " ".join(summary.split()),
            tuple(Parameter(p.name, kind, described.get(p.name, "")) for p, kind in zip(parameters, types)), function,
            needs_approval=needs_approval, python=python or not action, action=action, returns=returns)
        return function

    return register


def untrusted(label: str, text: str) -> str:
    """Outside text, fenced and labelled, so the model treats it as data (see the system prompt)."""
    from memory.context import fence_untrusted

    return fence_untrusted(label, text)


RECALL_HINT = ("Later steps recall the stored parts relevant to them; for a precise question over a whole source, use "
               "process_data.")


@command(python=True)
def memorize_thoughts(workspace: Workspace, text: str) -> Outcome:
    """Keep a note (a plan, a fact, a result): it stays in view for the rest of the run.

    text: the note, whole
    """
    return Outcome("Noted: it is in your memory now.", notes=[text])


@command(needs_approval=True)
def execute_python(workspace: Workspace, code: str) -> str:
    """Run Python in a persistent session (variables, imports, functions stay); you see the output, a traceback and
    a trailing expression's value.

    code: Python source (no fence needed)
    """
    return workspace.run_python(code)


@command(needs_approval=True)
def execute_shell(workspace: Workspace, command_line: str) -> str:
    """Run one shell command line in the working directory, no input; you see its exit code and output. Start
    servers from execute_python with subprocess.Popen.

    command_line: one line for bash
    """
    return workspace.run_shell(command_line)


@command(python=True, returns="list[SearchResult]")
def web_search(workspace: Workspace, query: str) -> str | Outcome:
    """Search the web: numbered results with title, URL and snippet.

    query: keywords
    """
    try:
        results = workspace.search(query, SEARCH_RESULTS)
    except SearchUnavailable as exc:
        return (f"Web search is unavailable right now ({exc}). Go on without it: use what you know, local files, "
                "or URLs you already have.")
    if not results:
        return f"No results for {query!r}. Try other keywords."
    workspace.last_search = results
    listing = "\n".join(f"[{i}] {r.title}\n    {r.url}\n    {r.snippet}" for i, r in enumerate(results, start=1))
    # results go to memory, so a later step can find a URL seen earlier
    return Outcome(untrusted(f"web search results for {query!r}", listing),
                   data=[{"title": r.title, "url": r.url, "snippet": r.snippet} for r in results],
                   memories=[Memory("search", f"Web search result for {query!r}: {r.title}\n{r.url}\n{r.snippet}",
                                    str(i)) for i, r in enumerate(results)],
                   hint="To read a result: ingest_data with its URL or number, or process_data with a question "
                        "and its URL.")


def _source_spec(workspace: Workspace, spec: str) -> str:
    """A search result's number ("2", "[2]", "#2") stands for its URL."""
    match = re.fullmatch(r"\s*[\[#]?(\d{1,2})\]?\s*", spec)
    if match and workspace.last_search and 1 <= int(match.group(1)) <= len(workspace.last_search):
        return workspace.last_search[int(match.group(1)) - 1].url
    return spec.strip()


@command(python=True)
def ingest_data(workspace: Workspace, source: str) -> str | Outcome:
    """Read a file (text, HTML, PDF, CSV, code…) or web page: its text when short, else a summary; all of it is
    stored for recall.

    source: a file path, an http(s) URL or the number of a web_search result
    """
    from memory.condense import condense, split_by_tokens

    shelf = workspace.documents
    if shelf is None:
        return ("ingest_data stores into vector memory, which is off for this run (--memory-scope off). Ask about "
                "the source with process_data, or read it with read(source) inside execute_python.")
    source = _source_spec(workspace, source)
    try:
        document = workspace.read(source)
    except SourceError as exc:
        return f"Could not read the source: {exc}"
    key = source if is_url(source) else str((workspace.workdir / Path(source).expanduser()).resolve())
    counter = workspace.counter
    text, total_chars = document.text[:MAX_INGEST_CHARS], len(document.text)
    document = replace(document, text="")  # the rest of a huge source is not kept in memory while we work
    if total_chars > len(text):
        workspace.progress(f"{source} holds {total_chars / 1e6:.1f} MB of text; storing the first "
                           f"{MAX_INGEST_CHARS / 1e6:.0f} MB")
    chunks = split_by_tokens(text, counter, INGEST_CHUNK_TOKENS, overlap=INGEST_OVERLAP_TOKENS)
    replaced = shelf.forget(key)
    # stored at once, not in the background (the next step may ask about it), a batch at a time
    for start in range(0, len(chunks), INGEST_BATCH):
        shelf.store(key, document.title or source, chunks[start:start + INGEST_BATCH], start, len(chunks))
        if len(chunks) > INGEST_BATCH:
            workspace.progress(f"stored {min(start + INGEST_BATCH, len(chunks)):,} of {len(chunks):,} parts")
    tokens = counter.count(text)
    stored = (f"Stored {plural(len(chunks), 'part')} ({tokens:,} tokens) in memory"
              + (f", replacing the {plural(replaced, 'part')} stored before" if replaced else "")
              + (f"; the source holds {total_chars:,} characters and only the first {len(text):,} were "
                 "stored (split it to store the rest)" if total_chars > len(text) else "") + ".")
    if tokens <= workspace.answer_tokens and total_chars == len(text):  # short: the text itself, not a summary
        about, body = "Full text", text
    else:
        first_part = "".join(split_by_tokens(text[:workspace.chunk_budget * 16], counter,
                                             workspace.chunk_budget)[:3])
        about = "Summary" if len(first_part) >= total_chars else "Summary of its beginning"
        body = condense(first_part, workspace.summarize, counter, INGEST_SUMMARY_TOKENS,
                        chunk_tokens=workspace.chunk_budget)
    return Outcome(f"{document.header()}\n{stored}\n{about}:\n" + untrusted(f"{about.lower()} of {source}", body),
                   hint=RECALL_HINT)


@command(action=False)
def read(workspace: Workspace, source: str) -> str | Outcome:
    """The readable text of a file or web page, read as ingest_data reads it (printed, it shows as data).

    source: a path in the working directory or a URL
    """
    source = _source_spec(workspace, source)
    try:
        document = workspace.read(source)
    except SourceError as exc:
        return f"Could not read the source: {exc}"
    text = document.text[:MAX_INGEST_CHARS]
    fenced = untrusted(f"text of {source}", text)
    head, _, rest = fenced.partition("\n")
    body, _, tail = rest.rpartition("\n")
    cut = (f" (the first {len(text):,} of its {len(document.text):,} characters)"
           if len(document.text) > len(text) else "")
    # the code gets the text; printed, it shows between the fence's lines (see the worker's SourceText)
    return Outcome(f"Read {len(text):,} characters of {source}{cut}.",
                   data={"text": body, "fence": [head + "\n", "\n" + tail]})


@command(python=True)
def process_data(workspace: Workspace, question: str, sources: list[str]) -> str:
    """Answer a question over the WHOLE of files or web pages, however long: every part is read.

    question: what to find out
    sources: file paths, http(s) URLs or numbers of web_search results
    """
    from memory.condense import QUESTION_MERGE_PROMPT, answer_over

    answers, problems = [], []
    for source in (_source_spec(workspace, s) for s in sources):
        try:
            document = workspace.read(source)
        except SourceError as exc:
            problems.append(f"Could not read {source}: {exc}")
            continue
        text = document.text[:MAX_PROCESS_CHARS]
        if len(document.text) > len(text):
            problems.append(f"{source} holds {len(document.text):,} characters; only the first {len(text):,} were "
                            "read (split it, or ask about a part, to read the rest).")
        answer = answer_over(question, f"{document.header()}\n\n{text}", source, workspace.summarize,
                             workspace.counter, target_tokens=workspace.answer_tokens,
                             chunk_tokens=workspace.chunk_budget,
                             progress=lambda done, total, source=source: workspace.progress(
                                 f"read part {done} of {total} of {source}"))
        answers.append((source, answer))
    found = [(source, answer) for source, answer in answers if answer]
    if len(found) > 1:
        combined = "\n\n".join(f"[from {source}]\n{answer}" for source, answer in found)
        final = workspace.summarize(QUESTION_MERGE_PROMPT.format(words=int(workspace.answer_tokens * 0.7),
                                                                 question=question, text=combined)).strip()
    elif found:
        final = found[0][1]
    else:
        final = ""
    parts = problems[:]
    if answers:
        body = final or "The source holds nothing that answers this question."
        read_over = ", ".join(s for s, _ in answers)
        parts.append(f"Answer to {question!r}, read over all of {read_over}:\n"
                     + untrusted(f"answer drawn from {read_over}", body))
    return "\n\n".join(parts)


@command(python=True)
def recall(workspace: Workspace, query: str) -> str:
    """Search all you saw (outputs, notes, summaries, documents) by exact words or meaning: whole items, each with
    its step.

    query: exact words (a name, number, code, file name) or what it was about
    """
    return workspace.recall(query)


@command(python=True)
def talk_to_user(workspace: Workspace, message: str) -> str:
    """Ask or tell the user something; their reply comes back. Only when you cannot go on without them.

    message: what to ask or tell
    """
    return workspace.ask_user(message)


@command()
def done(workspace: Workspace, answer: str) -> Outcome:
    """Finish: the answer is all the user sees, so make it complete.

    answer: the complete final answer
    """
    return Outcome(answer=answer)
