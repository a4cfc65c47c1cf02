"""The commands the model can use: plain functions registered in one table.

The system prompt's command list, the tools protocol's schemas and the functions code can call are generated from
COMMANDS, so adding a command is writing one function. A command acts through the narrow `Workspace` protocol
below (never on the agent itself) and returns its observation as text, or an `Outcome` when it also leaves notes,
memories, data or the final answer, which the loop applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from .sources import SourceError, is_url
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
    data: list | None = None  # structured results for Python code that called the command (web_search's)


class DocumentShelf(Protocol):
    """Where ingest_data keeps a source's parts: one source's parts replace those stored before."""

    def forget(self, source: str) -> int: ...

    def store(self, source: str, label: str, parts: list[str], start: int, total: int) -> None: ...


class Workspace(Protocol):
    """What a command may use: the work directory, code execution, the person, the web, sources, documents and
    the summarizer model. Implemented by miniagi.workspace.RunWorkspace."""

    workdir: Path
    counter: TokenCounter  # the summarizer model's tokens
    chunk_budget: int  # what one summarizer call may read
    answer_tokens: int  # one answer drawn from a source
    documents: DocumentShelf | None  # None when vector memory is off
    last_search: list[SearchResult]

    def run_python(self, code: str) -> str: ...

    def run_shell(self, command_line: str) -> str: ...

    def ask_user(self, message: str) -> str: ...

    def search(self, query: str, max_results: int) -> list[SearchResult]: ...

    def read(self, source: str) -> Document: ...

    def summarize(self, prompt: str) -> str: ...

    def progress(self, text: str) -> None: ...


@dataclass(frozen=True)
class Command:
    name: str
    arg: str  # what the argument is, as the prompt tells the model
    doc: str  # what the command does and what comes back
    run: Callable[[Workspace, str], "str | Outcome"]
    needs_approval: bool = False  # runs code on the user's machine: ask first unless -y
    python: tuple[str, ...] = ()  # callable from execute_python as a function of these parameters ("|"-joined)
    returns: str = "str"  # what the function returns, as its signature says

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.python)}) -> {self.returns}"

    @property
    def summary(self) -> str:
        """The doc's first sentence (a Python function's docstring, the prompt's list of functions)."""
        return self.doc.split(". ")[0].rstrip(".") + "."

    def __call__(self, workspace: Workspace, arg: str) -> Outcome:
        result = self.run(workspace, arg)
        return result if isinstance(result, Outcome) else Outcome(observation=result)


COMMANDS: dict[str, Command] = {}


def command(name: str, arg: str, doc: str, needs_approval: bool = False, python: tuple[str, ...] = (),
            returns: str = "str"):
    def register(function: Callable[[Workspace, str], "str | Outcome"]):
        COMMANDS[name] = Command(name, arg, doc, function, needs_approval, python, returns)
        return function

    return register


def python_tools() -> list[dict]:
    """The commands code can call from execute_python, for the Python worker."""
    return [{"name": c.name, "params": list(c.python), "join": "|", "doc": c.summary}
            for c in COMMANDS.values() if c.python]


def code_commands() -> frozenset[str]:
    """Commands whose argument is code run on the user's machine."""
    return frozenset(c.name for c in COMMANDS.values() if c.needs_approval)


@command("memorize_thoughts", "free text",
         "Keep a note (a plan, a fact, an intermediate result) that stays in your memory for the rest of the run.",
         python=("text",))
def memorize_thoughts(workspace: Workspace, text: str) -> Outcome:
    return Outcome("Noted: it is in your memory now.", notes=[text])


@command("execute_python", "Python source (no fence needed)",
         "Run Python in a persistent session, like a notebook: variables, imports and functions stay defined "
         "for later steps. You see stdout, stderr, the traceback on error and the value of a trailing expression.",
         needs_approval=True)
def execute_python(workspace: Workspace, code: str) -> str:
    return workspace.run_python(code)


@command("execute_shell", "one shell command line",
         "Run a shell command in the working directory, with no input available (interactive programs fail). "
         "You see its exit code and output. Background jobs stop when the command ends: start a long-running "
         "server from execute_python with subprocess.Popen.", needs_approval=True)
def execute_shell(workspace: Workspace, command_line: str) -> str:
    return workspace.run_shell(command_line)


def untrusted(label: str, text: str) -> str:
    """Outside text, fenced and labelled, so the model treats it as data (see the system prompt)."""
    from memory.context import fence_untrusted

    return fence_untrusted(label, text)


@command("web_search", "keywords",
         "Search the web. You get the top results, numbered, each with title, URL and snippet.",
         python=("query",), returns="list of results with .title, .url, .snippet")
def web_search(workspace: Workspace, query: str) -> str | Outcome:
    try:
        results = workspace.search(query, SEARCH_RESULTS)
    except SearchUnavailable as exc:
        return (f"Web search is unavailable right now ({exc}). Go on without it: use what you know, local files, "
                "or URLs you already have.")
    if not results:
        return f"No results for {query!r}. Try other keywords."
    workspace.last_search = results
    listing = "\n".join(f"[{i}] {r.title}\n    {r.url}\n    {r.snippet}" for i, r in enumerate(results, start=1))
    observation = (untrusted(f"web search results for {query!r}", listing)
                   + "\nTo read a result: ingest_data with its URL or number (ingest_data 2), or process_data "
                     "QUESTION|URL.")
    # results go to memory, so a later step can find a URL seen earlier
    return Outcome(observation, data=[{"title": r.title, "url": r.url, "snippet": r.snippet} for r in results],
                   memories=[Memory("search", f"Web search result for {query!r}: {r.title}\n{r.url}\n"
                                                           f"{r.snippet}", str(i)) for i, r in enumerate(results)])


def _source_spec(workspace: Workspace, spec: str) -> str:
    """A search result's number ("2", "[2]", "#2") stands for its URL."""
    match = re.fullmatch(r"\s*[\[#]?(\d{1,2})\]?\s*", spec)
    if match and workspace.last_search and 1 <= int(match.group(1)) <= len(workspace.last_search):
        return workspace.last_search[int(match.group(1)) - 1].url
    return spec.strip()


@command("ingest_data", "a file path or http(s) URL (or the number of a web_search result)",
         "Read a file (text, Markdown, CSV, JSON, HTML, code, PDF) or web page into your long-term memory, where "
         "later steps recall the parts they need. You get a short summary and how much was stored.",
         python=("source",))
def ingest_data(workspace: Workspace, source: str) -> str:
    from memory.condense import condense, split_by_tokens

    shelf = workspace.documents
    if shelf is None:
        return ("ingest_data stores into vector memory, which is off for this run (--memory-scope off). Use "
                "process_data QUESTION|SOURCE to ask about the source instead.")
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
    first_part = "".join(split_by_tokens(text[:workspace.chunk_budget * 16], counter, workspace.chunk_budget)[:3])
    summary = condense(first_part, workspace.summarize, counter, INGEST_SUMMARY_TOKENS,
                       chunk_tokens=workspace.chunk_budget)
    stored = (f"Stored {len(chunks)} parts ({counter.count(text):,} tokens) in memory"
              + (f", replacing the {replaced} parts stored before" if replaced else "")
              + (f"; the source holds {total_chars:,} characters and only the first {len(text):,} were "
                 "stored (split it to store the rest)" if total_chars > len(text) else "")
              + ". Later steps recall the parts relevant to them; for a precise question over the whole source, "
                "use process_data.")
    about = "Summary" if len(first_part) >= total_chars else "Summary of its beginning"
    return f"{document.header()}\n{stored}\n{about}:\n" + untrusted(f"summary of {source}", summary)


def split_process_argument(workspace: Workspace, arg: str) -> tuple[str, list[str]]:
    """"PROMPT|SOURCE[|SOURCE…]": sources are taken from the end while they look like sources, so a prompt may
    itself contain "|"."""
    parts = [part.strip() for part in arg.split("|")]
    sources: list[str] = []
    while len(parts) > 1 and _looks_like_source(workspace, parts[-1]):
        sources.insert(0, _source_spec(workspace, parts.pop()))
    prompt = "|".join(parts).strip()
    if not sources or not prompt:
        raise SourceError(
            "process_data takes PROMPT|SOURCE: the question, a | and a file path or http(s) URL (several sources "
            "may follow, each after its own |). Examples: 'List the authors|paper.pdf' or "
            "'Compare the prices|https://example.com/a|offers.csv'.")
    return prompt, sources


def _looks_like_source(workspace: Workspace, text: str) -> bool:
    if is_url(text) or re.fullmatch(r"[\[#]?\d{1,2}\]?", text) and workspace.last_search:
        return True
    path = Path(text).expanduser()
    return bool(text) and ((workspace.workdir / path).exists()
                           or bool(re.fullmatch(r"[^\s|]+\.[A-Za-z0-9]{1,5}", text)))


@command("process_data", "PROMPT|SOURCE — a question, a |, then a file path or URL (more sources may follow, "
         "each after a |)",
         "Answer a question over the WHOLE of a file or web page, however long: every part is read, so nothing on "
         "page 40 is missed. You get the answer.", python=("prompt", "source"))
def process_data(workspace: Workspace, request: str) -> str:
    from memory.condense import QUESTION_MERGE_PROMPT, answer_over

    try:
        prompt, sources = split_process_argument(workspace, request)
    except SourceError as exc:
        return str(exc)
    answers, problems = [], []
    for source in sources:
        try:
            document = workspace.read(source)
        except SourceError as exc:
            problems.append(f"Could not read {source}: {exc}")
            continue
        text = document.text[:MAX_PROCESS_CHARS]
        if len(document.text) > len(text):
            problems.append(f"{source} holds {len(document.text):,} characters; only the first {len(text):,} were "
                            "read (split it, or ask about a part, to read the rest).")
        answer = answer_over(prompt, f"{document.header()}\n\n{text}", source, workspace.summarize,
                             workspace.counter, target_tokens=workspace.answer_tokens,
                             chunk_tokens=workspace.chunk_budget,
                             progress=lambda done, total: workspace.progress(f"read part {done} of {total} of {source}"))
        answers.append((source, answer))
    found = [(source, answer) for source, answer in answers if answer]
    if len(found) > 1:
        combined = "\n\n".join(f"[from {source}]\n{answer}" for source, answer in found)
        final = workspace.summarize(QUESTION_MERGE_PROMPT.format(words=int(workspace.answer_tokens * 0.7),
                                                                 question=prompt, text=combined)).strip()
    elif found:
        final = found[0][1]
    else:
        final = ""
    parts = problems[:]
    if answers:
        body = final or "The source holds nothing that answers this question."
        parts.append(f"Answer to {prompt!r}, read over all of {', '.join(s for s, _ in answers)}:\n"
                     + untrusted(f"answer drawn from {', '.join(s for s, _ in answers)}", body))
    return "\n\n".join(parts)


@command("talk_to_user", "a message or question",
         "Tell the user something or ask them a question; their reply comes back. Use it only when you cannot "
         "go on without them.", python=("message",))
def talk_to_user(workspace: Workspace, message: str) -> str:
    return workspace.ask_user(message)


@command("done", "the final answer",
         "Finish: the argument is the final answer, all the user will see, so make it complete.")
def done(workspace: Workspace, answer: str) -> Outcome:
    return Outcome(answer=answer)
