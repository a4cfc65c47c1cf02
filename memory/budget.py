"""The run's token budget in one place: how the context window is shared out, and what one item, one reply and one
summarizer call may take. Computed once from the settings and handed to the context builder, the run memory, the
critic and the commands."""

from __future__ import annotations

from dataclasses import dataclass

NOTES_SHARE = 0.15  # of the context, at most, for the notes memorized in folded steps
ALERTS_SHARE = 0.10  # … for warnings and criticism
SUMMARY_SHARE = 0.15  # … for the rolling summary of folded steps
RECALL_SHARE = 0.08  # … for the memories recalled for one step (in that prompt's tail only)
SUMMARIZER_HEADROOM = 800  # of a summarizer call's context: its instruction and its reply
OUTPUT_SHARE = 0.6  # of the context, at most, for the newest output shown whole (it follows the room, not the item cap)
CHARS_PER_TOKEN = 4  # for cheap character caps that stay above a token cap


@dataclass(frozen=True)
class Budget:
    context: int = 8000  # tokens of one whole prompt (--max-context-tokens)
    item: int = 1500  # one thought, argument or observation in the context (--max-memory-item-tokens)
    reply: int = 2000  # one reply of the agent (--max-reply-tokens)

    @classmethod
    def from_settings(cls, settings) -> "Budget":
        return cls(context=settings.max_context_tokens, item=settings.max_memory_item_tokens,
                   reply=settings.max_reply_tokens)

    @property
    def notes(self) -> int:
        return int(self.context * NOTES_SHARE)

    @property
    def alerts(self) -> int:
        return int(self.context * ALERTS_SHARE)

    @property
    def summary(self) -> int:
        return int(self.context * SUMMARY_SHARE)

    @property
    def recall(self) -> int:
        return int(self.context * RECALL_SHARE)

    @property
    def summarizer_chunk(self) -> int:
        """What one summarizer call may read of a source."""
        return max(1000, self.context - SUMMARIZER_HEADROOM)

    @property
    def answer(self) -> int:
        """One answer drawn from a source (process_data) or one summary of it (ingest_data)."""
        return min(800, self.item)

    @property
    def output(self) -> int:
        """One output (an observation) as a step keeps it: whole up to the room a prompt has for it (the item limit
        holds the thought and the argument; an output that fits the room is not cut to it). The context shows it cut
        only when the prompt, once older steps have left, still has no room for it."""
        return max(self.item, int(self.context * OUTPUT_SHARE))

    @property
    def item_chars(self) -> int:
        """A cheap character cap on an observation, well above the token cap it is cut to later (so that cut is made
        by what matters, not by position)."""
        return self.output * CHARS_PER_TOKEN * 2
