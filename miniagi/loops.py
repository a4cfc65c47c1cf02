"""Noticing when the agent goes round in circles: the same action again and again, or the same failure."""

from __future__ import annotations

from dataclasses import dataclass

WARN_AFTER = 3  # identical steps in a row before the model is warned
STOP_AFTER = 5  # identical steps in a row before the run is stopped as stuck


def _key(text: str) -> str:
    return " ".join(text.split())[:2000]


@dataclass
class LoopDetector:
    last_action: str = ""
    action_repeats: int = 0
    last_observation: str = ""
    observation_repeats: int = 0

    def observe(self, command: str, arg: str, observation: str) -> int:
        """Record one step; returns how many times in a row the agent has now done or seen the same thing."""
        action = f"{command}\0{_key(arg)}"
        self.action_repeats = self.action_repeats + 1 if action == self.last_action else 1
        self.last_action = action
        seen = _key(observation)
        self.observation_repeats = self.observation_repeats + 1 if seen == self.last_observation else 1
        self.last_observation = seen
        return max(self.action_repeats, self.observation_repeats)

    def warning(self, repeats: int) -> str:
        what = ("the same action" if self.action_repeats >= self.observation_repeats
                else "actions that all produce the same result")
        return (f"WARNING: you have repeated {what} {repeats} times in a row without progress. Do not repeat it "
                f"again: step back, reconsider the approach, and try something different. The run is stopped "
                f"after {STOP_AFTER} repeats.")
