"""The commands the model can use: plain functions registered in one table.

The system prompt's command list is generated from COMMANDS, so adding a command is writing one function.
A command returns its observation as text; `done` ends the run by raising Submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .agent import Workspace


class Submitted(Exception):
    """The model said `done`: the argument is the run's final answer."""

    def __init__(self, answer: str):
        super().__init__(answer)
        self.answer = answer


@dataclass(frozen=True)
class Command:
    name: str
    arg: str  # what the argument is, as the prompt tells the model
    doc: str  # what the command does and what comes back
    run: Callable[["Workspace", str], str]
    needs_approval: bool = False  # runs code on the user's machine: ask first unless -y


COMMANDS: dict[str, Command] = {}


def command(name: str, arg: str, doc: str, needs_approval: bool = False):
    def register(function: Callable[["Workspace", str], str]):
        COMMANDS[name] = Command(name, arg, doc, function, needs_approval)
        return function

    return register


def describe_commands() -> str:
    return "\n".join(f"- {c.name}: {c.doc} Argument: {c.arg}." for c in COMMANDS.values())


@command("memorize_thoughts", "free text",
         "Keep a note (a plan, a fact, an intermediate result) that stays in your memory for the rest of the run.")
def memorize_thoughts(workspace: "Workspace", text: str) -> str:
    # the run keeps every memorized text from its recorded actions (RunState.add_action), so resume has them too
    return "Noted: it is in your memory now."


@command("execute_python", "Python source (no fence needed)",
         "Run Python in a persistent session, like a notebook: variables, imports and functions stay defined "
         "for later steps. You see stdout, stderr, the traceback on error and the value of a trailing expression.",
         needs_approval=True)
def execute_python(workspace: "Workspace", code: str) -> str:
    return workspace.python.run(code).observation()


@command("execute_shell", "one shell command line",
         "Run a shell command in the working directory, with no input available (interactive programs fail). "
         "You see its exit code and output.", needs_approval=True)
def execute_shell(workspace: "Workspace", command_line: str) -> str:
    return workspace.shell(command_line).observation()


@command("talk_to_user", "a message or question",
         "Tell the user something or ask them a question; their reply comes back. Use it only when you cannot "
         "go on without them.")
def talk_to_user(workspace: "Workspace", message: str) -> str:
    return workspace.ask_user(message)


@command("done", "the final answer",
         "Finish: the argument is the final answer, all the user will see, so make it complete.")
def done(workspace: "Workspace", answer: str) -> str:
    raise Submitted(answer)
