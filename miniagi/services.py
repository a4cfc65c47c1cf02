"""What a run works with, made once by its `Agent` and shared by every run of it: a `Run` is built from these (and
its record, state and workspace) and never sees the agent itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from memory.budget import Budget
    from memory.context import ContextBuilder
    from memory.store import VectorMemory
    from memory.tokens import TokenCounter

    from .commands import CommandTable
    from .config import Settings
    from .mcp_tools import McpTools
    from .model import Model, PriceTable
    from .protocols import ReplyFormat
    from .redaction import Redactor
    from .terminal import Terminal
    from .trust import DotenvGuard
    from .websearch import SearchBackend


@dataclass(frozen=True)
class Services:
    settings: Settings
    ui: Terminal  # the terminal: progress, warnings, approvals, the person's replies
    # the model and what its calls cost (a replay's model has no prices: it costs nothing)
    model: Model
    prices: PriceTable
    commands: CommandTable  # the built-in commands and the agent's MCP tools: what the model and code may call
    protocol: ReplyFormat  # the reply format, offering those: what a request adds, how a reply is read and shown
    # the token budget, the prompt builder within it and the token counters of each role's model
    budget: Budget
    contexts: ContextBuilder
    counter: TokenCounter
    critic_counter: TokenCounter
    summarizer_counter: TokenCounter
    system: str  # the system prompt
    # vector memory (None when off); whether a run's end waits for the store to take its last memories
    vectors: VectorMemory | None
    wait_for_memory: bool
    redact: Redactor  # the gate every text crosses before a request, the run's files, the store or the terminal
    environ: Mapping[str, str]
    search_backend: SearchBackend
    offline: bool  # a replay's: the agent's own commands reach no network
    dotenv: DotenvGuard  # says when a .env changed during a run
    mcp: McpTools | None = None  # the MCP servers whose tools are commands (miniagi/mcp_tools.py)
