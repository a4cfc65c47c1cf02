"""Where recall's relevance cut-off lies for the bundled embedder (all-MiniLM-L6-v2): cosine distances of example
pairs, as recall sees them — a query (the objective, or the latest thought with a non-code command's argument) against
the stored text it would find (another run's objective, a step's key, a document part). Prints each group's range
and whether MiniLMEmbedder's cut-offs (relevant_distance, and objective_distance for objectives) separate them.

    python scripts/bench_recall_cutoff.py
"""

from __future__ import annotations

import numpy as np
from benchlib import ROOT  # noqa: F401  (puts the repository on the path)

from memory.embeddings import MiniLMEmbedder

DOCUMENT = ("Office handbook, section 4. The kitchen is cleaned on Fridays; please label food in the fridge. Parking "
            "permits are renewed in January at the front desk. Guests sign in at reception and wear a badge. The "
            "guest wifi network is called Nebula-Guest and its password is sunflower-42; it changes every quarter. "
            "Printers on floors 2 and 3 accept badge release. Fire drills are announced a day ahead. ") * 2

GROUPS = {
    # (query, stored text), as recall compares them
    "related objectives": [
        ("What is six times seven?", "What is 6*7? Compute it."),
        ("Find the staging database host", "Which host runs the staging database?"),
        ("Find out the office wifi details", "What is the office wifi password?"),
        ("Find the Orion team's build server", "Which build server does the Orion team use?"),
        ("Summarize README.md", "Give me a summary of the README file"),
        ("Count the lines of main.py", "How many lines does main.py have?")],
    "unrelated objectives": [
        ("What is six times seven?", "sleep again"),
        ("What is six times seven?", "Summarize README.md in three bullet points"),
        ("Find the staging database host", "Write a haiku about autumn"),
        ("List the python files here", "What is the capital of France?"),
        ("What is six times seven?", "Fetch the weather for Paris"),
        ("Count the lines of main.py", "sleep again")],
    "related steps": [
        ("Which host runs the staging database?", "read the memo\nThe staging database host is db-stage-17."),
        ("What is the office wifi password?", "read the note (wifi.txt)\nThe office wifi is called Nebula and its "
                                              "passphrase is sunflower-42."),
        ("Compute six times seven and answer", "Compute 6*7\n42"),
        ("Multiply the numbers", "Compute 6*7\n42")],
    "unrelated steps": [
        ("Compute six times seven and answer", "Sleep for a second again (sleep 1)\nexit code 0"),
        ("Compute six times seven and answer", "Read the notes file into memory (notes.txt)\nIngested notes.txt: "
                                               "3 parts stored. Summary: meeting notes"),
        ("Compute six times seven and answer", "print the weather\ncloudy with rain"),
        ("What is six times seven?", "list files (ls)\nexit code 0\nmain.py README.md"),
        ("Which host runs the staging database?", "print the weather\ncloudy with rain")],
    "related document parts": [
        ("What is the guest wifi password?", DOCUMENT),
        ("When are parking permits renewed?", DOCUMENT)],
}


def main() -> None:
    embedder = MiniLMEmbedder()
    relevant, objective = embedder.relevant_distance, embedder.objective_distance
    print(f"cut-offs: relevant_distance {relevant}, objective_distance {objective} (objectives of other runs)")
    for group, pairs in GROUPS.items():
        vectors = embedder.embed([text for pair in pairs for text in pair])
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        distances = [1 - float(vectors[2 * i] @ vectors[2 * i + 1]) for i in range(len(pairs))]
        cut = objective if "objectives" in group else relevant
        kept = sum(d <= cut for d in distances)
        print(f"  {group}: {min(distances):.2f}-{max(distances):.2f}; {kept} of {len(pairs)} within the cut-off "
              f"({cut}) — {' '.join(f'{d:.2f}' for d in distances)}")


if __name__ == "__main__":
    main()
