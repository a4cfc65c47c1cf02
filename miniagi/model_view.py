"""What the model saw: the messages of each agent call, kept in the run's folder (prompts.jsonl), redacted, with
what each part of the prompt covers: the summary and the steps it folds, the notes, the recalled items with their
labels, the steps in view. `miniagi show RUN_ID --prompt N` and the web page's "what the model saw" read it.

Cheap on disk by construction: each prompt begins with all of the one before but its tail, so each distinct
message is written once (a line {"id", "message"}) and a call is a line naming its messages in order
({"step", "messages": [ids], "covers"}): the system prompt is written once per run, the head when steps leave the
view, and each step's reply and observation once. The newest observation goes out with the tail appended; in the
next prompt, without it, it is written as that message cut short ({"id", "cut_of": id, "chars": n}), not again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from memory.jsonl import json_lines

from .redaction import redact_data
from .run_store import open_regular

FILE = "prompts.jsonl"
MAX_BYTES = 256 * 2**20  # a larger file is not read (a run's own folder; code may have written there)


def message_id(message: dict) -> str:
    return hashlib.sha256(json.dumps(message, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:20]


class PromptLog:
    """The run's prompts.jsonl, appended to as the run asks the model (a resumed run appends to the same file)."""

    def __init__(self, folder: Path, redact=lambda text: text):
        self.path = Path(folder) / FILE
        self.redact = redact
        self.written: set[str] = set()  # message ids already in the file (this process's; a resume writes anew)
        self.tailed: tuple[str, dict] | None = None  # the last message of the prompt before, with its tail

    def add(self, step: int, messages: list[dict], covers: dict) -> None:
        lines, ids = [], []
        messages = redact_data(self.redact, messages)
        for message in messages:
            key = message_id(message)
            ids.append(key)
            if key not in self.written:
                self.written.add(key)
                lines.append(self._line(key, message))
        if ids:
            self.tailed = (ids[-1], messages[-1])
        lines.append({"step": step, "messages": ids, "covers": covers})
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                                 | getattr(os, "O_CLOEXEC", 0), 0o600)
            with os.fdopen(descriptor, "ab", buffering=0) as handle:
                handle.write(data)
        except OSError:  # only a view of the run: the run goes on without it
            pass

    def _line(self, key: str, message: dict) -> dict:
        """A message as written: whole, or as the tailed message before it cut short, when that is what it is."""
        if self.tailed is not None:
            tailed_key, tailed = self.tailed
            content, whole = str(message.get("content") or ""), str(tailed.get("content") or "")
            same = {k: v for k, v in message.items() if k != "content"} == \
                {k: v for k, v in tailed.items() if k != "content"}
            if same and content and whole.startswith(content):
                return {"id": key, "cut_of": tailed_key, "chars": len(content)}
        return {"id": key, "message": message}


@dataclass
class Part:
    """One message of a prompt, and what it covers ("the system prompt", "step 4: the reply", …)."""

    role: str
    content: str
    covers: str
    tool_calls: list | None = None


@dataclass
class Prompt:
    step: int
    call: int  # the step's agent calls counted from 1 (a step may need several: a reply cut off, a retry)
    parts: list[Part]
    covers: dict


def read_prompts(folder: Path, step: int | None = None) -> list[Prompt]:
    """The prompts the run sent (those of `step` only, when given), each message labelled with what it covers. A
    run with no prompts.jsonl (older, or not recorded) has none."""
    messages: dict[str, dict] = {}
    prompts: list[Prompt] = []
    calls: dict[int, int] = {}
    try:
        handle = open_regular(Path(folder) / FILE, MAX_BYTES)
    except OSError:
        return []
    with handle:
        for entry in json_lines(handle):  # a line torn by a crash is skipped
            if not isinstance(entry, dict):
                continue
            if "message" in entry:
                messages[str(entry.get("id"))] = entry["message"]
                continue
            if "cut_of" in entry:
                whole = messages.get(str(entry["cut_of"]))
                if whole is not None:
                    content = str(whole.get("content") or "")[:int(entry.get("chars") or 0)]
                    messages[str(entry.get("id"))] = dict(whole, content=content)
                continue
            number = int(entry.get("step") or 0)
            calls[number] = calls.get(number, 0) + 1
            if step is not None and number != step:
                continue
            sent = [messages.get(str(key), {"role": "?", "content": "(not recorded)"})
                    for key in entry.get("messages") or []]
            covers = entry.get("covers") or {}
            prompts.append(Prompt(number, calls[number], labelled(sent, covers), covers))
    return prompts


def labelled(messages: list[dict], covers: dict) -> list[Part]:
    """Each message with what it covers, from the prompt's layout (memory/context.py): the system prompt, the head
    (objective, summary, notes), a reply and an observation per step in view, the tail at the end of the last."""
    view = list(covers.get("view") or [])
    parts = []
    for index, message in enumerate(messages):
        if index == 0 and message.get("role") == "system":
            covers_text = "the system prompt: the agent's role, how to reply, the commands (the same every step)"
        elif index == 1:
            covers_text = head_covers(covers)
        else:
            pair = (index - 2) // 2
            number = view[pair] if pair < len(view) else None
            which = "its reply" if (index - 2) % 2 == 0 else "its observation"
            covers_text = f"step {number}: {which}" if number is not None else which
        if index == len(messages) - 1:
            covers_text += (", then this step's tail: " + tail_covers(covers))
        parts.append(Part(str(message.get("role")), str(message.get("content") or ""), covers_text,
                          message.get("tool_calls")))
    return parts


def head_covers(covers: dict) -> str:
    parts = ["the objective" + (" (and the run it follows)" if covers.get("background") else "")]
    through = int(covers.get("summary_through") or 0)
    if through:
        parts.append(f"the summary of steps 1-{through}" if through > 1 else "the summary of step 1")
    else:
        parts.append("no summary yet (every step is in view)")
    digest = int(covers.get("notes_digest_through") or 0)
    if digest:
        parts.append(f"a digest of the notes of steps 1-{digest}")
    notes = covers.get("notes") or []
    if notes:
        parts.append("the notes of " + steps_text(notes))
    return ", ".join(parts)


def tail_covers(covers: dict) -> str:
    recalled = covers.get("recalled") or []
    text = (f"{len(recalled)} recalled item{'' if len(recalled) == 1 else 's'} ({', '.join(recalled)})" if recalled
            else "nothing recalled")
    return text + " and the request for the next action"


def steps_text(numbers: list[int]) -> str:
    numbers = sorted(set(int(n) for n in numbers))
    return ("step " if len(numbers) == 1 else "steps ") + ", ".join(str(n) for n in numbers)
