"""What an `Agent` holds, made once and shared by every run of it, in two parts by who reads them:

- `Services`: what a `Run` works with (each field is read by the loop). A run is handed these, with its record, its
  state, and the workspace and memory its agent made for it; it never sees the agent itself.
- `Makings`: what the agent alone reads, to make each run's workspace and memory (and the MCP servers it starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from memory.budget import Budget
    from memory.context import ContextBuilder
    from memory.store import VectorMemory
    from memory.tokens import TokenCounter

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
    # the reply format, offering the agent's commands (`protocol.commands`: the built-in ones and its MCP tools):
    # what a request adds, how a reply is read and shown, what the model and code may call
    protocol: ReplyFormat
    # the token budget and the token counters the loop measures with (the agent's model's, the critic's)
    budget: Budget
    counter: TokenCounter
    critic_counter: TokenCounter
    system: str  # the system prompt
    redact: Redactor  # the gate every text crosses before a request, the run's files, the store or the terminal
    dotenv: DotenvGuard  # says when a .env changed during a run
    wait_for_memory: bool  # whether a run's end waits for the vector store to take its last memories


@dataclass(frozen=True)
class Makings:
    # a run's memory: the prompt builder within the budget, the summarizer's token counter, the vector memory (None
    # when off)
    contexts: ContextBuilder
    summarizer_counter: TokenCounter
    vectors: VectorMemory | None
    # a run's workspace: the environment code and commands see, web search, whether they reach no network (a replay)
    environ: Mapping[str, str]
    search_backend: SearchBackend
    offline: bool
    mcp: McpTools  # the MCP servers whose tools are commands (miniagi/mcp_tools.py): a workspace's while it lives
