"""What commands act on, for one run: the work directory, the Python session, the shell, the person, the web,
sources, the document shelf and the summarizer model (the `Workspace` protocol of commands.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Mapping

from memory.budget import Budget
from memory.run_memory import RunMemory
from memory.tokens import TokenCounter

from .execution import CodeRunner
from .sources import Document, SourceError, is_url, read_source
from .websearch import SearchBackend, SearchResult, SearchUnavailable, search

# the agent fetches on the host's network: for code, a URL it is given would be a way out of --no-network
NO_NETWORK_FOR_CODE = ("--no-network: executed code has no network, and the agent does not search or fetch URLs "
                       "for it either (a step of your own, outside execute_python, can)")


class MemoryShelf:
    """Ingested documents in the run's vector memory: one id per source and part, so ingesting again replaces."""

    def __init__(self, memory: RunMemory):
        self.memory = memory

    def forget(self, source: str) -> int:
        self.memory.forget_document(source)
        self.memory.vectors_needed()
        return self.memory.store.delete({"source": source})

    def store(self, source: str, label: str, parts: list[str], start: int, total: int) -> None:
        prefix = f"doc:{hashlib.sha1(source.encode()).hexdigest()[:16]}"
        items = [self.memory.document_item(f"{prefix}:{i}", f"{label} [part {i + 1}/{total}]\n{part}", source, i)
                 for i, part in enumerate(parts, start=start)]
        self.memory.archive_items(items)
        self.memory.vectors_needed()
        self.memory.store.add(items)


class RunWorkspace:
    """Made with what the agent's runs share; the run using it attaches itself (`attach`): a chat's runs, one after
    another, share one workspace and its Python session."""

    def __init__(self, settings, *, ui, environ: Mapping[str, str], budget: Budget, search_backend: SearchBackend,
                 counter: TokenCounter, python_tools: list[dict], offline: bool = False):
        self.settings = settings
        self.ui = ui
        self.workdir: Path = settings.workdir_path
        # its sandbox and limits; code calls the agent's commands through tool_handler
        self.execution = CodeRunner(settings, environ, budget.item_chars, tools=python_tools,
                                    tool_handler=self._code_calls)
        # what code prints, shown as it prints it (in a terminal: elsewhere the output is not read twice)
        self.execution.on_output = ui.code_line if getattr(ui, "live", False) else None
        self.search_backend = search_backend
        self.counter = counter
        self.chunk_budget = budget.summarizer_chunk
        self.answer_tokens = budget.answer
        # what one recall shows: no more than an output kept in view, nor than a small prompt has room for beside its
        # head (shown cut, recall's answer could lose what it found)
        self.recall_tokens = min(budget.item, budget.context // 4)
        self.last_search: list[SearchResult] = []
        self.offline = offline  # a replay's: the agent's own commands reach no network
        self.memory: RunMemory | None = None
        self.summarize: Callable[[str], str] | None = None
        self.step: Callable[[], int] = lambda: 0
        # runs a command that code in execute_python called as a function
        self.tool_handler: Callable[[str, str], dict] | None = None
        self.from_code = 0  # inside a command that code called as a function
        self.hidden_read: set[Path] = set()  # hidden files the person let the model's own steps read
        self.mcp = None  # the run's MCP servers (mcp_tools.McpTools): they live as long as this workspace

    def attach(self, *, memory: RunMemory, summarize: Callable[[str], str], step: Callable[[], int],
               tool_handler: Callable[[str, str], dict]) -> None:
        """The run now using this workspace: its memory, its summarizer, its step number (for code's labels) and
        how a command that code calls is run."""
        self.memory, self.summarize, self.step, self.tool_handler = memory, summarize, step, tool_handler

    @property
    def documents(self) -> MemoryShelf | None:
        return MemoryShelf(self.memory) if self.memory.store is not None else None

    def run_python(self, code: str) -> str:
        return self.execution.run_python(code, label=f"<step {self.step()}>").observation()

    def run_shell(self, command_line: str) -> str:
        return self.execution.run_shell(command_line).observation()

    def ask_user(self, message: str) -> str:
        if not self.ui.interactive:
            return ("No user is present: this run is unattended. Decide for yourself with what you have and go on; "
                    "do not ask again.")
        reply = self.ui.ask_user(message).strip()
        return f"The user replied: {reply}" if reply else "The user gave no reply."

    def search(self, query: str, max_results: int) -> list[SearchResult]:
        if self.offline:
            raise SearchUnavailable("a replay contacts nothing")
        if self.from_code and self.settings.no_network:
            raise SearchUnavailable(NO_NETWORK_FOR_CODE)
        return search(self.search_backend, query, max_results)

    def _code_calls(self, name: str, arg: str) -> dict:
        self.from_code += 1
        try:
            return self.tool_handler(name, arg)
        finally:
            self.from_code -= 1

    def read(self, source: str) -> Document:
        if self.offline and is_url(source):
            raise SourceError("a replay contacts nothing: the recorded run's reading is in its trace")
        if self.from_code and self.settings.no_network and is_url(source):
            raise SourceError(NO_NETWORK_FOR_CODE)
        return read_source(source, self.workdir, self.settings.read_timeout, allow=self._within_code_view)

    def _within_code_view(self, path: Path, opened: Path) -> None:
        """The agent reads files outside the sandbox, so what the sandbox hides from code it does not read for
        code (a call from execute_python), nor through a link that leads from what code sees to what it does not
        (code could have planted it for a later step's ingest_data). Judged by the file opened (a link swapped
        meanwhile changes nothing) and by the name as given (its folders in the work directory are code's).
        The model's own step that names a hidden file (~/.netrc, read, then sent out in a URL) needs the person's
        yes, -y or not (-y lets commands run in the sandbox; this goes past it); with no one to ask, only
        --sandbox-allow opens it."""
        sandbox = self.execution.sandbox
        if not sandbox.hides(opened):
            return
        named, workdir = Path(os.path.abspath(path)), Path(os.path.abspath(self.workdir))
        if named.is_relative_to(workdir):
            named = Path(os.path.realpath(workdir)) / named.relative_to(workdir)
        if self.from_code or not sandbox.hides(named):
            raise SourceError(f"{path} is hidden from executed code by the sandbox, so it is not read for it (name "
                              "it with --sandbox-allow to let code see it)")
        if opened in self.hidden_read:
            return
        if not self.ui.interactive:
            raise SourceError(f"{path} is hidden from executed code by the sandbox, and reading it for the model "
                              "needs the user's yes; no user is present (the user can name it with --sandbox-allow)")
        if not self.ui.confirm(f"The model asks to read {opened}, which the sandbox hides from executed code: what "
                               "it reads reaches the model, and from there may leave. Read it?"):
            raise SourceError(f"the user did not let the agent read {path} (the sandbox hides it)")
        self.hidden_read.add(opened)

    def progress(self, text: str) -> None:
        self.ui.progress(text)

    def recall(self, query: str) -> str:
        return self.memory.recall(query, self.recall_tokens)

    def close(self) -> None:
        self.execution.close()
        if self.mcp is not None:
            self.mcp.close()
