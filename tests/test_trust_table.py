"""docs/security.md's table of what executed code can write and what miniagi trusts, checked against each other and
against the code: the sandbox's rules (what bwrap lets code write) and the one trust rule (trust.TrustRecord)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from miniagi.config import Settings
from miniagi.execution.runner import sandbox_policy, users_own_folder
from miniagi.execution.sandbox import _rules, _under, hidden_from_code
from miniagi.trust import TrustRecord, narrowed

DOCS = Path(__file__).resolve().parent.parent / "docs" / "security.md"
HEADING = "## What code can write, and what miniagi trusts"


def rows() -> list[list[str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index(HEADING):]
    table = [line for line in section.split("\n\n", 3)[2].splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]


def code_writes(policy, path: Path) -> bool:
    """Whether bwrap's view lets code write this path: its most specific rule binds it read-write."""
    rules = _rules(policy)
    enclosing = [p for p in rules if _under(path, p)]
    return bool(enclosing) and rules[max(enclosing, key=lambda p: len(p.parts))][1] == "rw"


def test_the_tables_places_are_what_the_sandbox_and_the_trust_rule_say(isolated, tmp_path):
    home, work = Path.home(), isolated.work
    places = {"WORK": str(work), "HOME": str(isolated.home), "~": str(home)}
    for folder in (isolated.home / "runs" / "RUN", home / ".ssh", home / "projA"):
        folder.mkdir(parents=True, exist_ok=True)
    settings = Settings(workdir=str(work), home=str(isolated.home))
    policy = sandbox_policy(settings, users_own_folder(work), os.environ)
    # and a run whose work directory is the user's home (what is hidden must stay hidden there too)
    at_home = sandbox_policy(Settings(workdir=str(home), home=str(isolated.home)), users_own_folder(home), os.environ)
    record = TrustRecord()
    record.ran_code_in(work)  # a work directory where code has run
    found = rows()
    assert len(found) >= 7, found
    for place, examples, writes, trusted in found:
        paths = []
        for example in re.findall(r"`([^`]+)`", examples):
            path = Path(re.sub(r"^(WORK|HOME|~)", lambda m: places[m.group(1)], example))
            if not example.startswith("/"):  # a place of the test's own: made (the system's are there)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("x")
            paths.append(path)
        if "→" in examples:  # a link: the first path, leading to the second
            link, target = paths
            link.unlink()
            link.symlink_to(target)
            paths = [link]
        # what code can write, as the sandbox's rules have it
        for path in paths:
            if writes.startswith("yes"):
                assert code_writes(policy, path), (place, path)
            elif writes.startswith("a private one"):
                assert hidden_from_code(policy, path) and not code_writes(policy, path), (place, path)
            else:
                assert writes.startswith("no") and not code_writes(policy, path), (place, path)
                assert not code_writes(at_home, path), (place, path, "with the home as the work directory")
        # what miniagi takes as the user's word, as the one rule has it
        if writes.startswith("yes"):
            assert trusted.startswith("no"), f"{place}: code can write it, and it is trusted"
        if trusted.startswith("yes"):
            assert all(record.judge(path, {"content": "digest"}) == [] for path in paths), place
        elif trusted.startswith("no, for anything that widens"):  # a trace: resume and replay take nothing wider
            wider = Settings(pass_env=("AWS_SECRET_ACCESS_KEY",), sandbox="none", yes=True)
            assert narrowed(wider, Settings())[0] == Settings(), place
        elif trusted.startswith("no"):
            assert all(record.judge(path, {"content": "digest"}) for path in paths), place
        else:
            assert trusted == "—", place
