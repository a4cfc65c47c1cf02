"""The secret gate and the HTML extractor on pathological input: the time of one pass over texts built to make a
backtracking pattern scan from every position, and over deeply nested HTML. Linear code takes about as long as for
ordinary text of the same size.

    python scripts/bench_redaction.py [--kb 32] [--divs 100000]
"""

from __future__ import annotations

import argparse
import time

from benchlib import ROOT  # noqa: F401  (puts the checkout on sys.path)

from miniagi.redaction import Redactor
from miniagi.sources import html_to_text

UNITS = ["a.", "a-", "-eyJ", "x://", "a=", "a ", "\"a\":"]


def timed(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=32, help="size of each text")
    parser.add_argument("--divs", type=int, default=100_000, help="nesting depth of the HTML")
    args = parser.parse_args()
    size = args.kb * 1024
    redact = Redactor({"SMTP_PASS": "correct-horse-battery"})
    prose = ("The quick brown fox jumps over the lazy dog; see https://example.com/a?b=c for more. " * size)[:size]
    print(f"redaction, {args.kb} KB per text, one pass:")
    print(f"  {'ordinary prose':<16} {timed(redact, prose) * 1000:8.1f} ms")
    for unit in UNITS:
        text = (unit * (size // len(unit) + 1))[:size]
        print(f"  {unit * 3:<16} {timed(redact, text) * 1000:8.1f} ms")
    html = "<html><body>" + "<div>x" * args.divs + "</div>" * args.divs + "<p>after</p></body></html>"
    started = time.perf_counter()
    _, text, note = html_to_text(html)
    print(f"HTML: {args.divs:,} nested <div>s ({len(html) / 1e6:.1f} MB) → {len(text):,} characters of text in "
          f"{time.perf_counter() - started:.2f} s" + (f" ({note})" if note else ""))


if __name__ == "__main__":
    main()
