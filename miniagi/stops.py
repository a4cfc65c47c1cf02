"""How a run ends: the exceptions that stop the loop, and what each ending means for the user (status, message,
exit code). Everything that can end a run is mapped here, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from memory.context import ContextOverflow

from .config import ConfigError
from .model import ModelError, ModelUnavailable

EXIT_CODES = {"done": 0, "error": 1, "limit": 3, "format_error": 4, "stuck": 5, "interrupted": 130}


class Submitted(Exception):
    """The final answer is accepted: the run is done."""

    def __init__(self, answer: str):
        super().__init__(answer)
        self.answer = answer


class Stop(Exception):
    """The run ends without an answer; carries the status and what to tell the user."""

    status = "error"

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = EXIT_CODES[self.status] if exit_code is None else exit_code


class LimitReached(Stop):
    status = "limit"


class TooManyFormatErrors(Stop):
    status = "format_error"


class Stuck(Stop):
    status = "stuck"


@dataclass
class Ending:
    status: str
    message: str
    exit_code: int
    discard: bool = False  # refused before the first model call: no run is left behind
    internal: bool = False  # a bug of ours: the traceback goes to the trace


def ending_for(exc: BaseException, run_id: str, *, first_call_made: bool, resume: str = "") -> Ending:
    """What a run that stopped with `exc` tells the user; `resume`: the exact command that continues it."""
    command = resume or f"miniagi resume {run_id}"
    resume = f"`{command}` continues it"
    if isinstance(exc, Stop):
        return Ending(exc.status, str(exc), exc.exit_code)
    if isinstance(exc, ModelError) and not first_call_made:  # the request itself is refused: resuming would too
        return Ending("error", f"{exc} (refused at the first request: run {run_id} was not kept)", 2, discard=True)
    if isinstance(exc, (ModelUnavailable, ModelError)):  # the endpoint down, hung, or refusing the request
        return Ending("error", f"{exc}. The run is saved: {resume}.", 2)
    if isinstance(exc, ConfigError):  # the endpoint refused us (bad key, unknown model)
        kept = "" if first_call_made else f" (nothing was done: run {run_id} was not kept)"
        return Ending("error", f"{exc}{kept}", 2, discard=not first_call_made)
    if isinstance(exc, KeyboardInterrupt):
        return Ending("interrupted", f"interrupted; `{command}` continues the run",
                      EXIT_CODES["interrupted"])
    if isinstance(exc, ContextOverflow):  # the fixed parts of the prompt grew past the budget mid-run
        return Ending("error", f"{exc}. The run is saved: {resume} (give a larger --max-context-tokens).", 1)
    if isinstance(exc, OSError):  # most likely the disk: full, or a file size limit
        return Ending("error", f"cannot write the run's files ({exc.strerror or exc}). Nothing completed is lost: free "
                               f"some space, then `{command}` continues from the last completed step.", 1)
    return Ending("error", f"internal error: {type(exc).__name__}: {exc}. The run is saved: {resume}.", 1,
                  internal=True)
