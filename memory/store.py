"""Persistent vector memory in chromadb: $MINIAGI_HOME/memory.

Items are steps (thought, command, observation), memorized notes, objectives, final answers and ingested
documents, each with metadata {run, step, kind, time, source?}. We embed ourselves (see embeddings.py) and hand
chromadb the vectors, so chromadb never loads or downloads an embedding model of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .embeddings import Embedder

KINDS = ("step", "note", "objective", "answer", "document")


@dataclass(frozen=True)
class MemoryItem:
    id: str
    text: str
    run: str
    kind: str
    step: int = 0
    source: str = ""

    def metadata(self) -> dict:
        data = {"run": self.run, "kind": self.kind, "step": self.step, "time": time.time()}
        if self.source:
            data["source"] = self.source
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
    """chromadb opened on first use: runs and commands that never touch memory do not pay for it."""

    def __init__(self, path: Path, embedder: "Embedder"):
        self.path = Path(path)
        self.embedder = embedder
        self._collection = None

    @property
    def collection(self):
        if self._collection is None:
            import chromadb

            self.path.mkdir(parents=True, exist_ok=True)
            client = chromadb.PersistentClient(path=str(self.path),
                                               settings=chromadb.Settings(anonymized_telemetry=False))
            # one collection per embedding space: vectors of different models must not be compared
            self._collection = client.get_or_create_collection(
                f"memories-{self.embedder.name}", embedding_function=None,
                configuration={"hnsw": {"space": "cosine"}})
        return self._collection

    def add(self, items: Iterable[MemoryItem]) -> int:
        """Store (or replace, by id) items; returns how many."""
        items = [item for item in items if item.text.strip()]
        if not items:
            return 0
        vectors = self.embedder.embed([item.text for item in items])
        for start in range(0, len(items), 4000):  # chromadb caps one write's size
            part = items[start:start + 4000]
            self.collection.upsert(ids=[i.id for i in part], documents=[i.text for i in part],
                                   metadatas=[i.metadata() for i in part], embeddings=vectors[start:start + 4000])
        return len(items)

    def search(self, query: str, limit: int = 5, where: dict | None = None) -> list[Hit]:
        if not query.strip() or limit < 1:
            return []
        collection = self.collection
        if collection.count() == 0:
            return []
        found = collection.query(query_embeddings=self.embedder.embed([query]), n_results=limit, where=where,
                                 include=["documents", "metadatas", "distances"])
        return [Hit(id=i, text=doc or "", metadata=meta or {}, distance=dist) for i, doc, meta, dist in
                zip(found["ids"][0], found["documents"][0], found["metadatas"][0], found["distances"][0])]

    def has(self, where: dict) -> bool:
        return bool(self.collection.get(where=where, limit=1, include=[])["ids"])

    def delete(self, where: dict | None = None) -> int:
        """Delete the items matching where (everything when None); returns how many."""
        collection = self.collection
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
        return {"path": str(self.path), "embedder": self.embedder.name, "items": len(metadatas), "kinds": kinds,
                "runs": len(runs - {None})}
