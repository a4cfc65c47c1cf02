"""Everything the agent remembers: token counting and the context budget, the rolling summary, vector recall."""
