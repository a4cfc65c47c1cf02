"""The run's exact archive: every step's whole output, every note, every summary and every ingested text, kept with
its step in `runs/RUN_ID/archive.sqlite` (under MINIAGI_HOME, which the sandbox hides from executed code), searched
by exact words with SQLite's FTS5 (bm25). Nothing a run has seen is lost to `recall`, however long the run: the
summary may drop a fact, the archive never does.

It also knows which items a later step replaced (`superseded`): a short line stating a value of a subject ("door
code RED-1") is replaced by a later line of the same subject with another value ("door code now BLUE-2"). See
`facts` for what counts as a subject and a value.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .excerpt import STOPWORDS, units

FILE_NAME = "archive.sqlite"
NEAR_WORDS = 6  # words apart, at most, for the query's words to count as said together ("the key of locker 4")
FACT_WORDS = 16  # at most, in a line that states a fact (a longer line is prose, not a statement of one value)
# words that say a value changed, not what the subject is
CHANGE_WORDS = frozenset("now new newer changed change updated update set reset became becomes is are was were "
                         "equals equal currently current latest from".split())
# words that say a line replaces an earlier value
CHANGE_CUES = frozenset("now changed updated new newer longer instead became becomes reset moved renamed corrected "
                        "replaced replaces".split())
FLAG_VALUES = frozenset("on off true false enabled disabled locked unlocked".split())
TOKEN = re.compile(r"[^\s,;:()\[\]{}<>\"'`=]+")
QUERY_WORD = re.compile(r"[\w][\w.\-/]*[\w]|\w", re.UNICODE)


@dataclass(frozen=True)
class Archived:
    """An item as the archive keeps it."""

    id: str
    run: str
    kind: str  # step, note, summary, document, answer, objective, search, …
    step: int
    text: str
    source: str = ""
    superseded_by: int = 0  # the newest step that replaced a fact this item states (0: none)
    score: float = 0.0  # bm25 of the search that found it: lower is better


class Archive:
    """One run's archive. Writes are small and synchronous (WAL, no fsync per write); reads may come from any
    thread."""

    def __init__(self, path: Path, run: str, workdir: str = "", redact: Callable[[str], str] = lambda text: text,
                 read_only: bool = False):
        self.path, self.run, self.workdir, self.redact = Path(path), run, workdir, redact
        self.read_only = read_only
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            if self.read_only:
                self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, check_same_thread=False)
                self._db.executescript(SCHEMA)
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('run', ?), ('workdir', ?)",
                                 (self.run, self.workdir))
                self._db.commit()
        return self._db

    def add(self, items: Iterable[tuple[str, str, int, str, str]]) -> None:
        """Keep (id, kind, step, text, source) items, each replacing one of its id; facts they state replace the
        same subjects' values stated at earlier steps."""
        with self._lock:
            db = self.db
            for item_id, kind, step, text, source in items:
                text = self.redact(text)
                if not text.strip():
                    continue
                old = db.execute("SELECT rowid FROM items WHERE id = ?", (item_id,)).fetchone()
                if old:
                    db.execute("DELETE FROM items WHERE rowid = ?", old)
                    db.execute("DELETE FROM facts WHERE id = ?", (item_id,))
                db.execute("INSERT INTO items (id, kind, step, source, text, label) VALUES (?, ?, ?, ?, ?, ?)",
                           (item_id, kind, step, source, text, searchable_label(kind, step, source)))
                if kind in FACT_KINDS:
                    self._state_facts(db, kind, item_id, step, fact_text(kind, text))
            db.commit()

    @staticmethod
    def _state_facts(db: sqlite3.Connection, kind: str, item_id: str, step: int, text: str) -> None:
        """Record the facts an item states. A fact in a note, or in a line that says it changed ("now", "updated"),
        replaces the other values of its subject stated at earlier steps (a line of output of the same shape as an
        earlier one, without such a word, is another record: "row 0 of part 2" does not replace "row 0 of part 1").
        Items may come out of order (a resume stores again): a fact is also replaced by those stated later."""
        for subject, head, value, unit in facts(text):
            replaces = kind == "note" or bool(CHANGE_CUES & set(unit.lower().split()))
            later = db.execute("SELECT MAX(step) FROM facts WHERE subject = ? AND head = ? AND value != ? AND step > ? "
                               "AND replaces", (subject, head, value, step)).fetchone()[0] or 0
            db.execute("INSERT INTO facts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (subject, head, value, item_id, step, unit, later, replaces))
            replaced = []
            if replaces:
                replaced = db.execute("SELECT DISTINCT id FROM facts WHERE subject = ? AND head = ? AND value != ? AND "
                                      "step < ?", (subject, head, value, step)).fetchall()
                db.execute("UPDATE facts SET by = MAX(by, ?) WHERE subject = ? AND head = ? AND value != ? AND "
                           "step < ?", (step, subject, head, value, step))
            for (other,) in replaced + ([(item_id,)] if later else []):
                db.execute("UPDATE items SET superseded_by = (SELECT MAX(by) FROM facts WHERE id = ?) WHERE id = ?",
                           (other, other))

    def search(self, query: str, limit: int = 8, through: int | None = None,
               skip: tuple[str, ...] = ()) -> list[Archived]:
        """The items holding the query's words, best first: first those with one line that holds the most of them
        (a step or a note before a summary, which restates them), then those holding all of them close together
        (as written: "RED-1" as one phrase), then all anywhere, then some; within each, by bm25 (rare words weigh
        more, a short item more than a long one). `through`: items of that step or before only; `skip`: kinds left
        out (in the search, before its limit: a run's many short summaries would otherwise fill it)."""
        phrases = query_phrases(query)
        if not phrases or not self.path.exists():
            return []
        found: dict[str, tuple[int, Archived]] = {}
        tiers = ((f"NEAR({' '.join(phrases)}, {NEAR_WORDS})", " AND ".join(phrases), " OR ".join(phrases))
                 if len(phrases) > 1 else (phrases[0],))
        for tier, match in enumerate(tiers):
            for item in self._match(match, limit * 3, through, skip):
                found.setdefault(item.id, (tier, item))
            if len(found) >= limit * 3:
                break
        wanted = [words_of(phrase) for phrase in phrases]
        # a summary restates what steps and notes said: at equal coverage, they come first
        ranked = sorted(found.values(), key=lambda pair: (-line_coverage(pair[1].text, wanted),
                                                          pair[1].kind == "summary", pair[0], pair[1].score))
        return [item for _, item in ranked[:limit]]

    def _match(self, match: str, limit: int, through: int | None = None, skip: tuple[str, ...] = ()) -> list[Archived]:
        with self._lock:
            try:
                rows = self.db.execute(
                    "SELECT items.id, items.kind, items.step, items.text, items.source, items.superseded_by, "
                    "bm25(words) FROM words JOIN items ON items.rowid = words.rowid WHERE words MATCH ? "
                    f"AND items.step <= ? AND items.kind NOT IN ({','.join('?' * len(skip))}) "
                    "ORDER BY bm25(words) LIMIT ?",
                    (match, 2**62 if through is None else through, *skip, limit)).fetchall()
            except sqlite3.Error:
                return []
        return [Archived(row[0], self.run, row[1], row[2], row[3], row[4], row[5], row[6]) for row in rows]

    def forget(self, source: str) -> None:
        """Drop a source's parts (ingested again: its new parts replace them)."""
        with self._lock:
            self.db.execute("DELETE FROM items WHERE kind = 'document' AND source = ?", (source,))
            self.db.commit()

    def get(self, item_id: str) -> Archived | None:
        with self._lock:
            row = self.db.execute("SELECT id, kind, step, text, source, superseded_by FROM items WHERE id = ?",
                                  (item_id,)).fetchone()
        return Archived(row[0], self.run, row[1], row[2], row[3], row[4], row[5]) if row else None

    def superseded(self, ids: Iterable[str]) -> dict[str, int]:
        """Of these items, those a later step replaced, and the newest such step."""
        ids = list(ids)
        if not ids or not self.path.exists():
            return {}
        with self._lock:
            rows = self.db.execute(f"SELECT id, superseded_by FROM items WHERE superseded_by > 0 AND id IN "
                                   f"({','.join('?' * len(ids))})", ids).fetchall()
        return dict(rows)

    def stale(self, item_id: str) -> list[tuple[str, int]]:
        """The lines of an item that a later step replaced, with the newest such step."""
        with self._lock:
            return self.db.execute("SELECT unit, MAX(by) FROM facts WHERE id = ? AND by > 0 GROUP BY unit",
                                   (item_id,)).fetchall()

    def count(self) -> int:
        with self._lock:
            return self.db.execute("SELECT count(*) FROM items").fetchone()[0]

    def common(self, phrases: list[str], share: float, at_least: int) -> set[str]:
        """Of these phrases, those that more than `share` of the items (and `at_least` of them) hold: words the run
        says all the time (its objective's, its own vocabulary) tell no item apart (bm25's reasoning, for a bar)."""
        if not phrases or not self.path.exists():
            return set()
        with self._lock:
            try:
                total = self.db.execute("SELECT count(*) FROM items").fetchone()[0]
                floor = max(at_least, int(total * share))
                return {phrase for phrase in phrases
                        if self.db.execute("SELECT count(*) FROM words WHERE words MATCH ?", (phrase,)).fetchone()[0]
                        > floor}
            except sqlite3.Error:
                return set()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


SCHEMA = """
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS items (rowid INTEGER PRIMARY KEY, id TEXT UNIQUE, kind TEXT, step INTEGER, source TEXT,
                                  text TEXT, superseded_by INTEGER DEFAULT 0, label TEXT);
CREATE VIRTUAL TABLE IF NOT EXISTS words USING fts5(text, label, content='items', content_rowid='rowid');
CREATE TRIGGER IF NOT EXISTS items_in AFTER INSERT ON items BEGIN
  INSERT INTO words (rowid, text, label) VALUES (new.rowid, new.text, new.label);
END;
CREATE TRIGGER IF NOT EXISTS items_out AFTER DELETE ON items BEGIN
  INSERT INTO words (words, rowid, text, label) VALUES ('delete', old.rowid, old.text, old.label);
END;
CREATE TABLE IF NOT EXISTS facts (subject TEXT, head TEXT, value TEXT, id TEXT, step INTEGER, unit TEXT,
                                  by INTEGER DEFAULT 0, replaces INTEGER);
CREATE INDEX IF NOT EXISTS facts_subject ON facts (subject, head);
CREATE INDEX IF NOT EXISTS facts_id ON facts (id);
"""
FACT_KINDS = frozenset({"step", "note", "summary"})  # what states facts a later step may replace
RESULT_MARK = "\nResult:\n"  # in a step's text: what follows is its output
# lines every run prints again and again with another value: not a fact a later step replaces
FRAMING = frozenset({"exit code", "exited code", "killed signal exit code", "noted memory"})


def fact_text(kind: str, text: str) -> str:
    """What of an item states facts: a step's output (not its thought or command line), a note whole."""
    return text.partition(RESULT_MARK)[2] if kind == "step" and RESULT_MARK in text else text


def query_phrases(query: str) -> list[str]:
    """The words of `query` as FTS5 phrases: each word or code as written ("RED-1", "main.py", "12"); stop words
    are left out unless nothing else is asked."""
    words = QUERY_WORD.findall(query)
    kept = [w for w in words if w.lower() not in STOPWORDS] or words
    phrases = []
    for word in kept:
        phrase = '"' + word.replace('"', "") + '"'
        if phrase not in phrases:
            phrases.append(phrase)
    return phrases[:32]


def words_of(text: str) -> tuple[str, ...]:
    """Words as the index splits them (unicode61: letters and digits), lower case."""
    return tuple(word.lower() for word in re.findall(r"[^\W_]+", text))


def line_coverage(text: str, wanted: list[tuple[str, ...]]) -> int:
    """How many of the query's words (each a phrase of index words) one line of the text holds, at most."""
    best = 0
    for line in text.split("\n"):
        words = words_of(line)
        if not words:
            continue
        joined = " " + " ".join(words) + " "
        best = max(best, sum(1 for phrase in wanted if phrase and f" {' '.join(phrase)} " in joined))
    return best


def is_value(token: str) -> bool:
    """A value rather than a subject's word: holds a digit, is a code in capitals (RED, BLUE-2, ON), or a flag."""
    bare = token.strip(".!?")
    if not bare:
        return False
    return (any(c.isdigit() for c in bare) or (len(bare) >= 2 and bare.isupper() and bare.isalpha())
            or bare.isupper() and any(c in "-_" for c in bare) or bare.lower() in FLAG_VALUES)


def facts(text: str) -> list[tuple[str, str, str, str]]:
    """The facts a text states: (subject, head, value, line) for each short line or sentence that names a subject in
    words and gives it values. The subject is the line's words less its values and the words that say a change ("now",
    "changed to"); the head is every value but the last (what tells records of one shape apart: "bay 3" in "bay 3
    runs at 4111 rpm"), the value is the last. "door code RED-1" and "door code now BLUE-2" state one subject;
    "bay 3 … 4111 rpm" and "bay 4 … 4148 rpm" do not (their heads differ)."""
    found = []
    for unit in units(text):
        tokens = TOKEN.findall(unit)
        if not tokens or len(tokens) > FACT_WORDS:
            continue
        values = [t.strip(".!?") for t in tokens if is_value(t)]
        subject = [t.lower().strip(".!?") for t in tokens if not is_value(t)]
        subject = [w for w in subject if w and w not in STOPWORDS and w not in CHANGE_WORDS and w.isalpha()]
        if not values or not subject or " ".join(subject) in FRAMING:
            continue
        found.append((" ".join(subject), " ".join(v.lower() for v in values[:-1]), values[-1].lower(), unit.strip()))
    return found


def searchable_label(kind: str, step: int, source: str) -> str:
    """What an item is, searched beside its text: "step 12 note" finds the note of step 12 ("note 12")."""
    if kind == "document":
        return f"document {source} part {step + 1}"
    return f"step {step} {kind}" if kind != "step" else f"step {step}"


def archive_path(run_dir: Path) -> Path:
    return Path(run_dir) / FILE_NAME


def earlier_archives(runs_root: Path, run: str, workdir: str | None, limit: int = 50) -> list[Archive]:
    """The archives of earlier runs (newest first, at most `limit`), of this work directory (None: of any)."""
    if not runs_root.is_dir():
        return []
    found = []
    for folder in sorted((p for p in runs_root.iterdir() if p.name != run), key=lambda p: p.name, reverse=True):
        path = folder / FILE_NAME
        if not path.is_file():
            continue
        archive = Archive(path, folder.name, read_only=True)
        try:
            with archive._lock:
                row = archive.db.execute("SELECT value FROM meta WHERE key = 'workdir'").fetchone()
        except sqlite3.Error:
            archive.close()
            continue
        archive.workdir = row[0] if row else ""
        if workdir is None or archive.workdir == workdir:
            found.append(archive)
            if len(found) >= limit:
                break
        else:
            archive.close()
    return found
