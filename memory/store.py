"""Persistent vector memory in chromadb: $MINIAGI_HOME/memory.

Items are steps (thought, command, observation), memorized notes, objectives, final answers and ingested
documents, each with metadata {run, step, kind, time, source?}. We embed ourselves (see embeddings.py) and hand
chromadb the vectors, so chromadb never loads or downloads an embedding model of its own.
"""

from __future__ import annotations

import json
import os
import queue
import re
import stat
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .jsonl import json_lines

if TYPE_CHECKING:
    from .embeddings import Embedder

KEY_CHARS = 240  # what is embedded of a key or a query (~60 tokens): the cost grows with length, meaning hardly
WRITE_BATCH = 16
WRITE_LINGER_S = 1.0  # the writer waits this long for a batch to fill: a chromadb write costs ~15 ms however small
# (meanwhile its items are searched in this process, see search_by: recall never waits for a write)
WRITE_QUEUE = 64  # items waiting for the writer before add_later waits (back-pressure)


@dataclass(frozen=True)
class MemoryItem:
    id: str
    text: str
    run: str
    kind: str
    step: int = 0
    source: str = ""
    key: str = ""  # the text to embed, when not the start of `text`
    workdir: str = ""  # where the run worked: recall keeps to the current work directory unless asked
    at: float = 0.0  # when it was remembered (0: when it is stored)

    @property
    def embed_text(self) -> str:
        """A key is cut to KEY_CHARS; a text without one (a document part, sized for the model) is embedded whole."""
        return self.key[:KEY_CHARS] if self.key else self.text

    def metadata(self) -> dict:
        data = {"run": self.run, "kind": self.kind, "step": self.step, "time": self.at or time.time()}
        if self.source:
            data["source"] = self.source
        if self.workdir:
            data["workdir"] = self.workdir
        return data


@dataclass(frozen=True)
class Hit:
    id: str
    text: str
    metadata: dict
    distance: float

    @property
    def run(self) -> str:
        return self.metadata.get("run", "")

    @property
    def step(self) -> int:
        return int(self.metadata.get("step", 0))

    @property
    def kind(self) -> str:
        return self.metadata.get("kind", "")


class VectorMemory:
    """chromadb opened on first use: runs and commands that never touch memory do not pay for it.

    `add` stores at once; `add_later` hands items to a background writer that embeds and stores them in batches
    (one chromadb write costs ~15 ms however few items it holds), so the agent's step does not wait for it. Until an
    item is written, `search_by` finds it here, in the process, beside the store's hits (embedded by then through
    `embed_pending`, or by the search itself): a search never waits for a write."""

    def __init__(self, path: Path, embedder: "Embedder", url: str | None = None,
                 redact: Callable[[str], str] = lambda text: text, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only  # a viewer (the web UI): opening stores no journal and makes no collection
        self.redact = redact  # nothing is stored (or embedded) before it has passed the secret gate
        self.url = url  # a chromadb server instead of the local folder: one memory for many machines
        self.embedder = embedder
        self._collection = None
        self._open_lock = threading.RLock()  # opening stores the journals, which asks for the collection
        self._queue: queue.Queue = queue.Queue(maxsize=WRITE_QUEUE)
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        self._flushing = threading.Event()
        self._vectors: dict[str, object] = {}  # objective → vector
        self._pending: dict[str, MemoryItem] = {}  # queued and not stored yet, by id (the newest version)
        self._ready: dict[str, tuple[MemoryItem, MemoryItem, object]] = {}  # id → (pending item, as stored, vector)
        self._pending_lock = threading.Lock()

    @property
    def collection(self):
        with self._open_lock:
            return self._open()

    def _open(self):
        if self._collection is None:
            from .embeddings import IMPORTS

            with IMPORTS:  # (it imports numpy: see embeddings.IMPORTS)
                import chromadb

            settings = chromadb.Settings(anonymized_telemetry=False)
            if self.url:
                from urllib.parse import urlsplit

                server = urlsplit(self.url)
                client = chromadb.HttpClient(host=server.hostname or "localhost", port=server.port or 8000,
                                             ssl=server.scheme == "https", settings=settings)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                client = chromadb.PersistentClient(path=str(self.path), settings=settings)
            # one collection per embedding space: vectors of different models must not be compared
            name = f"memories-{self.embedder.name}"
            if self.read_only:
                self._collection = client.get_collection(name, embedding_function=None)
                return self._collection
            self._collection = client.get_or_create_collection(
                name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}})
            self._ingest_journals()
        return self._collection

    def warm(self) -> None:
        """Load the embedder and open the store (from a thread, while the caller goes on with other work); a
        failure is left for the caller's own use of them to meet and report."""
        try:
            self.embedder.embed(["warm"])
            with self._open_lock:
                self._open()
        except Exception:
            pass

    # --- the journal: what short runs remembered, stored by the next process that opens the store ----------------
    # A run that ends before chromadb and the embedder have loaded (~1 s; a one-step run against a fast model) does
    # not wait for them: its items go to a journal file, written whole (a temporary file renamed), and whoever opens
    # the store next (a run, `memory search`, `memory clear`) stores them first. Ids make storing twice harmless.
    @property
    def _journal(self) -> Path:
        return self.path / "journal"

    def _write_journal(self, items: list[MemoryItem]) -> None:
        self._journal.mkdir(parents=True, exist_ok=True)
        name = f"{time.time():.6f}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        partial = self._journal / f".{name}.tmp"
        lines = [json.dumps(asdict(replace(item, text=self.redact(item.text), key=self.redact(item.key),
                                           at=item.at or time.time())), ensure_ascii=False) for item in items]
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | getattr(os, "O_CLOEXEC", 0), 0o600)  # a new file, never through a link
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        os.replace(partial, self._journal / f"{name}.jsonl")
        self._mark(items)

    def journal(self, items: list[MemoryItem]) -> None:
        """Items for the store, written to its journal (whoever opens the store next stores them): a run that never
        needed the store does not load it to store them."""
        if self.url:  # a server has no journal: stored now
            self.add(items)
        elif items:
            self._write_journal(items)

    def _ingest_journals(self) -> None:
        """Store the items of every journal, in one write (each journal claimed first by renaming it, so two
        processes opening the store at once do not both store it; a claim whose process died is taken over)."""
        if self.url or not self._journal.is_dir():
            return
        claimed, items = [], []
        workdirs: dict[str, str | None] = {}
        for path in sorted(self._journal.iterdir()):
            if path.name.startswith("."):
                continue
            if path.suffix == ".jsonl":
                name = path.stem
            elif ".claimed-" in path.name and not _alive(path.name.rsplit("-", 1)[1]):
                name = path.name.split(".claimed-")[0]
            else:
                continue
            mine = path.with_name(f"{name}.claimed-{os.getpid()}")
            try:
                os.replace(path, mine)
            except FileNotFoundError:  # another process claimed it first
                continue
            claimed.append(mine)
            try:
                lines = _read_regular(mine, JOURNAL_MAX_BYTES).decode("utf-8", "replace").split("\n")
            except OSError:  # not a regular file (a FIFO, a link), or too large: not a journal this store wrote
                continue
            for value in json_lines(lines):  # split on "\n" only: U+2028 may sit in a note
                try:
                    item = MemoryItem(**value)
                except TypeError:  # a value that is not an item (a newer format): skipped
                    continue
                trusted = self._as_recorded(item, workdirs)
                if trusted is not None:
                    items.append(trusted)
        if items:
            self._write(items, [None] * len(items))
        for path in claimed:
            path.unlink(missing_ok=True)

    def _as_recorded(self, item: MemoryItem, workdirs: dict[str, str | None]) -> MemoryItem | None:
        """A journal's item as it may be stored: through the secret gate again (whatever wrote the file), and under
        the work directory its own run recorded (the run's trace, in the home beside this store), whatever it says;
        an item of no run this home knows is not stored."""
        if not isinstance(item.run, str) or not RUN_NAME.fullmatch(item.run):
            return None
        if item.run not in workdirs:
            workdirs[item.run] = _recorded_workdir(self.path.parent / "runs" / item.run / "trace.jsonl")
        workdir = workdirs[item.run]
        if workdir is None:
            return None
        return replace(item, text=self.redact(str(item.text)), key=self.redact(str(item.key)),
                       source=self.redact(str(item.source)), workdir=workdir)

    # --- what the store holds, known without opening it --------------------------------------------------------
    # Opening chromadb and loading the embedder costs a second or more; a run's first step need not pay for it when
    # the store can hold nothing for it. A marker file per work directory records that items of it were stored.
    @property
    def _markers(self) -> Path:
        return self.path / "holds"

    def _marker(self, workdir: str) -> Path:
        import hashlib

        return self._markers / hashlib.sha256(workdir.encode("utf-8", "surrogatepass")).hexdigest()[:24]

    def might_hold(self, where: dict | None = None) -> bool:
        """False only when the store surely holds nothing matching `where` (a {"workdir"} or {"run"} filter, or
        None for anything), its journal included: then recall can skip opening it. A server, or a store from before
        the markers, might."""
        if self.url or self._collection is not None:
            return True
        if not self._markers.is_dir():
            return (self.path / "chroma.sqlite3").exists()  # none, or written before markers existed: unknown
        if where and "workdir" in where:
            return self._marker(where["workdir"]).exists()
        if where and "run" in where:
            return self._marker("run:" + where["run"]).exists()
        return any(self._markers.iterdir())

    def _mark(self, items: list[MemoryItem]) -> None:
        if self.url:
            return
        for name in {item.workdir for item in items if item.workdir} | {"run:" + item.run for item in items}:
            marker = self._marker(name)
            if not marker.exists():
                self._markers.mkdir(parents=True, exist_ok=True)
                marker.touch()

    def embed_one(self, text: str):
        """The vector of a key or query (cut to KEY_CHARS), through the secret gate first: a query is made of the
        objective and the model's thought, and an endpoint's embedder is a request like any other."""
        return self.embedder.embed([self.redact(text)[:KEY_CHARS]])[0]

    def add_later(self, items: Iterable[MemoryItem], vectors: list | None = None) -> None:
        """Queue items (with their vectors, when already known) for the background writer; raises the writer's
        error, if it met one."""
        if self._writer_error is not None:
            raise self._writer_error
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_forever, name="memory-writer", daemon=True)
            self._writer.start()
        items = [item if item.at else replace(item, at=time.time()) for item in items]
        with self._pending_lock:
            for item in items:
                self._pending[item.id] = item
                self._ready.pop(item.id, None)  # made for an older version
        for item, vector in zip(items, vectors or [None] * len(items)):
            self._queue.put((item, vector))

    def pending(self, ids: Iterable[str]) -> bool:
        """Whether any of these items is still waiting for the background writer."""
        with self._pending_lock:
            return not self._pending.keys().isdisjoint(ids)

    def finish(self) -> None:
        """At the end of a run: every queued item stored, or, while chromadb is still loading, written to the
        journal instead of waited for (the writer goes on in this process, if it lives on)."""
        if self._writer is None or self.url or self._collection is not None:
            self.flush()
            return
        if self._writer_error is not None:
            raise self._writer_error
        with self._pending_lock:
            waiting = list(self._pending.values())
        if waiting:
            self._write_journal(waiting)

    def flush(self) -> None:
        """Wait until every queued item is stored."""
        if self._writer is not None:
            self._flushing.set()  # no lingering for a fuller batch
            try:
                # what is still queued is stored here, at the caller's priority: the writer runs niced, and on
                # a busy machine a niced thread can wait a long time for the CPU (an interrupted run must end)
                batch = []
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    if batch and self._writer_error is None:
                        self._store([item for item, _ in batch], [vector for _, vector in batch])
                finally:
                    for _ in batch:
                        self._queue.task_done()
                self._queue.join()  # the writer's batch in flight
            finally:
                self._flushing.clear()
        if self._writer_error is not None:
            raise self._writer_error

    def _write_forever(self) -> None:
        try:  # background work yields the CPU to the agent's own step (Linux: per-thread niceness)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            batch = [self._queue.get()]
            self._ready_soon(batch[-1])
            deadline = time.monotonic() + WRITE_LINGER_S
            while len(batch) < WRITE_BATCH and not self._flushing.is_set():  # a flush ends the wait at once
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(self._queue.get(timeout=min(left, 0.05)))
                except queue.Empty:
                    continue
                self._ready_soon(batch[-1])
            try:
                if self._writer_error is None:
                    self._store([item for item, _ in batch], [vector for _, vector in batch])
            except BaseException as exc:  # reported to the agent by the next add_later / flush
                self._writer_error = exc
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _ready_soon(self, queued: tuple[MemoryItem, object]) -> None:
        """(The writer.) An item is embedded as it comes, while the batch it joins fills: its CPU time spread over
        the steps (niced) rather than taken in one go, and a search finds it ready."""
        if self._writer_error is None and not self._flushing.is_set():
            try:
                self._prepare([queued])
            except Exception:  # met again, and reported, when the batch is stored
                pass

    def add(self, items: Iterable[MemoryItem]) -> int:
        """Store (or replace, by id) items now; returns how many."""
        items = list(items)
        return self._store(items, [None] * len(items))

    def _store(self, items: list[MemoryItem], known: list) -> int:
        """Embed what has no vector yet, in one batch, and write everything in as few calls as chromadb allows."""
        try:
            return self._write(items, known)
        finally:
            with self._pending_lock:
                for item in items:
                    if self._pending.get(item.id) is item:  # a newer version queued since stays pending
                        del self._pending[item.id]
                        self._ready.pop(item.id, None)

    def _prepare(self, batch: list[tuple[MemoryItem, object]]) -> list[tuple[MemoryItem, object]]:
        """Each item as it is stored (through the secret gate; blank ones left out) with its vector, embedded in one
        call for those that have none yet; kept for search while the item is pending."""
        with self._pending_lock:
            ready = {item.id: self._ready[item.id] for item, _ in batch if self._is_ready(item)}
        pairs, missing = [], []
        for item, vector in batch:
            if item.id in ready:
                pairs.append((ready[item.id][1], ready[item.id][2]))
                continue
            if not item.text.strip():
                continue
            stored = replace(item, text=self.redact(item.text), key=self.redact(item.key))
            if vector is None:
                missing.append(len(pairs))
            pairs.append((stored, vector))
        if missing:
            fresh = self.embedder.embed([pairs[i][0].embed_text for i in missing])
            for index, vector in zip(missing, fresh):
                pairs[index] = (pairs[index][0], vector)
        originals = {item.id: item for item, _ in batch}
        with self._pending_lock:
            for stored, vector in pairs:
                if self._pending.get(stored.id) is originals.get(stored.id):
                    self._ready[stored.id] = (originals[stored.id], stored, vector)
        return pairs

    def _write(self, items: list[MemoryItem], known: list) -> int:
        return self._put(self._prepare(list(zip(items, known))))

    def _put(self, pairs: list[tuple[MemoryItem, object]]) -> int:
        if not pairs:
            return 0
        items = [item for item, _ in pairs]
        vectors = [vector for _, vector in pairs]
        self._mark(items)
        for start in range(0, len(items), 4000):  # chromadb caps one write's size
            part = items[start:start + 4000]
            self.collection.upsert(ids=[i.id for i in part], documents=[i.text for i in part],
                                   metadatas=[i.metadata() for i in part], embeddings=vectors[start:start + 4000])
        return len(items)

    def search(self, query: str, limit: int = 5, where: dict | None = None) -> list[Hit]:
        """The items nearest to query, best first."""
        if not query.strip() or limit < 1:
            return []
        return self.search_by([self.embed_one(query)], limit, where)

    def search_by(self, vectors: list, limit: int, where: dict | None = None,
                  unwanted: Callable[[MemoryItem], bool] | None = None) -> list[Hit]:
        """The items nearest to any of the vectors, best first: those stored, and those still waiting for the
        background writer (compared here, by the store's own distance), as if they were stored. `unwanted`: items
        waiting that the caller would drop from the hits anyway (a run's steps still in its view), left out of the
        search (they would not be there either, had the writer not written them yet)."""
        waiting = self._waiting(where, unwanted)
        if waiting is None:  # a filter this process cannot apply: what is pending is stored first
            self.flush()
            waiting = []
        rows = self._query(vectors, limit, where)
        shadowed = {item.id for item, _ in waiting}  # stored before, replaced by what is pending
        if waiting and any(hit.id in shadowed for row in rows for hit in row):
            rows = self._query(vectors, limit + len(waiting), where)
        local = _cosine_distances(vectors, [vector for _, vector in waiting]) if waiting else None
        hits: dict[str, Hit] = {}
        for r, row in enumerate(rows):
            found = [hit for hit in row if hit.id not in shadowed]
            if local is not None:
                found += [Hit(id=item.id, text=item.text, metadata=item.metadata(), distance=float(local[r][i]))
                          for i, (item, _) in enumerate(waiting)]
            for hit in sorted(found, key=lambda hit: hit.distance)[:limit]:
                if hit.id not in hits or hit.distance < hits[hit.id].distance:
                    hits[hit.id] = hit
        return sorted(hits.values(), key=lambda hit: hit.distance)

    def _query(self, vectors: list, limit: int, where: dict | None) -> list[list[Hit]]:
        try:
            found = self.collection.query(query_embeddings=vectors, n_results=limit, where=where,
                                          include=["documents", "metadatas", "distances"])
        except Exception:
            if self.collection.count() == 0:  # older chromadb versions raise on an empty collection
                return [[] for _ in vectors]
            raise
        return [[Hit(id=i, text=doc or "", metadata=meta or {}, distance=dist)
                 for i, doc, meta, dist in zip(found["ids"][row], found["documents"][row], found["metadatas"][row],
                                               found["distances"][row])]
                for row in range(len(vectors))]

    def embed_pending(self, unwanted: Callable[[MemoryItem], bool] | None = None) -> None:
        """Embed what waits for the writer and has no vector yet (a searcher's thread, at its priority: the writer
        runs niced and may wait long for the CPU), so that a search finds it ready; `unwanted`: items a search
        would leave out, left to the writer."""
        with self._pending_lock:
            unready = self._unready(unwanted)
        if unready:
            self._prepare([(item, None) for item in unready])

    def pending_beyond(self, unwanted: Callable[[MemoryItem], bool]) -> bool:
        """Whether anything waits for the writer, unembedded, that is not `unwanted` (known without embedding)."""
        with self._pending_lock:
            return bool(self._unready(unwanted))

    def _unready(self, unwanted: Callable[[MemoryItem], bool] | None) -> list[MemoryItem]:
        """(Under the pending lock.) The items waiting for the writer that have no vector yet, less `unwanted`."""
        return [item for item in self._pending.values()
                if not self._is_ready(item) and (unwanted is None or not unwanted(item))]

    def _is_ready(self, item: MemoryItem) -> bool:
        """(Under the pending lock.) Whether this version of the item has its vector (and text as stored) made."""
        return item.id in self._ready and self._ready[item.id][0] is item

    def _waiting(self, where: dict | None,
                 unwanted: Callable[[MemoryItem], bool] | None = None) -> list[tuple[MemoryItem, object]] | None:
        """The items waiting for the writer that match `where`, as stored, with their vectors (those the writer
        has not embedded yet are embedded here); None when `where` is beyond what `_matches` can tell."""
        with self._pending_lock:
            if not self._pending:
                return []
            pending = [item for item in self._pending.values() if unwanted is None or not unwanted(item)]
            ready = {item.id: self._ready[item.id] for item in pending if self._is_ready(item)}
        unready = [item for item in pending if item.id not in ready]
        made = {stored.id: (stored, vector) for stored, vector in self._prepare([(item, None) for item in unready])}
        waiting = []
        for item in pending:
            if item.id in made:
                stored, vector = made[item.id]
            elif item.id in ready:
                stored, vector = ready[item.id][1], ready[item.id][2]
            else:
                continue  # blank: never stored
            try:
                if _matches(stored.metadata(), where):
                    waiting.append((stored, vector))
            except ValueError:
                return None
        return waiting

    def objective_vector(self, objective: str):
        """The objective's vector, embedded once: recall asks about it all run long."""
        vector = self._vectors.get(objective)
        if vector is None:
            vector = self._vectors[objective] = self.embed_one(objective)
        return vector

    def count(self, where: dict | None = None) -> int:
        """How many items match where (all of them when None)."""
        if where is None:
            return self.collection.count()
        return len(self.collection.get(where=where, include=[])["ids"])

    def delete(self, where: dict | None = None) -> int:
        """Delete the items matching where (everything when None); returns how many."""
        collection = self.collection
        if where is None:  # empty now, for every folder and run
            for marker in self._markers.iterdir() if self._markers.is_dir() else ():
                marker.unlink(missing_ok=True)
            self._markers.mkdir(parents=True, exist_ok=True)
        ids = collection.get(where=where, include=[])["ids"]
        for start in range(0, len(ids), 4000):
            collection.delete(ids=ids[start:start + 4000])
        return len(ids)

    def stats(self) -> dict:
        collection = self.collection
        metadatas = collection.get(include=["metadatas"])["metadatas"] or []
        kinds: dict[str, int] = {}
        runs = set()
        for meta in metadatas:
            kinds[meta.get("kind", "?")] = kinds.get(meta.get("kind", "?"), 0) + 1
            runs.add(meta.get("run"))
        return {"path": self.url or str(self.path), "embedder": self.embedder.name, "items": len(metadatas),
                "kinds": kinds,
                "runs": len(runs - {None})}


def _cosine_distances(queries: list, vectors: list):
    """What chromadb's cosine space measures between each query and each vector: 1 - cos."""
    from .embeddings import numpy

    np = numpy()

    a = np.asarray(queries, dtype=np.float32)
    b = np.asarray(vectors, dtype=np.float32)
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-30)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-30)
    return 1.0 - a @ b.T


_COMPARE = {"$eq": lambda a, b: a == b, "$ne": lambda a, b: a != b,
            "$gt": lambda a, b: a is not None and a > b, "$gte": lambda a, b: a is not None and a >= b,
            "$lt": lambda a, b: a is not None and a < b, "$lte": lambda a, b: a is not None and a <= b,
            "$in": lambda a, b: a in b, "$nin": lambda a, b: a not in b}


def _matches(metadata: dict, where: dict | None) -> bool:
    """Whether metadata passes a chromadb `where` filter; ValueError for an operator not known here."""
    if not where:
        return True
    for key, condition in where.items():
        if key in ("$and", "$or"):
            results = [_matches(metadata, part) for part in condition]
            if not (all(results) if key == "$and" else any(results)):
                return False
            continue
        if key.startswith("$"):
            raise ValueError(key)
        value = metadata.get(key)
        if not isinstance(condition, dict):
            condition = {"$eq": condition}
        for operator, operand in condition.items():
            if operator not in _COMPARE:
                raise ValueError(operator)
            if key not in metadata:
                if operator in ("$ne", "$nin"):  # how chromadb treats a missing field there: not guessed
                    raise ValueError(operator)
                return False
            try:
                if not _COMPARE[operator](value, operand):
                    return False
            except TypeError:
                return False
    return True


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a run id: a name under runs/, never a path
JOURNAL_MAX_BYTES = 64 * 2**20
TRACE_HEAD_BYTES = 1 << 20  # a run_start event (settings, objective) is far smaller


def _read_regular(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes, never through a link, never waiting on a FIFO; OSError past max_bytes."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise OSError(f"{path} is not a regular file of at most {max_bytes} bytes")
        return handle.read(max_bytes)


def _recorded_workdir(trace: Path) -> str | None:
    """The work directory a run recorded at its start ("" for a run from before work directories were recorded);
    None when there is no such run."""
    try:
        descriptor = os.open(trace, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        first = handle.read(TRACE_HEAD_BYTES).split(b"\n", 1)[0]
    try:
        start = json.loads(first)
    except ValueError:
        return None
    if not isinstance(start, dict) or start.get("type") not in (None, "run_start"):
        return None
    settings = start.get("settings")
    workdir = settings.get("workdir") if isinstance(settings, dict) else None
    return workdir if isinstance(workdir, str) and os.path.isabs(workdir) else ""


def _alive(pid: str) -> bool:
    """Whether the process of a journal's claim is still running (a name that is no pid: not)."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
