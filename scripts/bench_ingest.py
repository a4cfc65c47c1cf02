"""A large source: `ingest_data` and `process_data` of a 45 MB text file by a real `miniagi` process, with the
local offline embedder and an instant scripted model. Prints the wall time, the peak RSS of the agent process
(its own and its children's high-water marks, from wait4) and what the observation said.

    python scripts/bench_ingest.py [--mb 45]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT  # noqa: F401  (puts the checkout on sys.path)

from tests.fake_llm import FakeLLM

PARAGRAPH = ("Line {i}: the maintenance crew checked valve {i} and logged a pressure of {p} kPa before moving to "
             "the next station along the northern pipeline. ")


def make_file(path: Path, megabytes: float) -> None:
    with open(path, "w") as out:
        i = 0
        while out.tell() < megabytes * 1_000_000:
            out.write(PARAGRAPH.format(i=i, p=90 + i % 40) * 3 + "\n\n")
            i += 1


def run(command: str, arg: str, workdir: Path, home: Path, llm: FakeLLM) -> tuple[float, float, dict]:
    llm.script = [f"<r>read it</r><c>{command}</c>\n{arg}", "<r>done</r><c>done</c>\nok"]
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="bench", MINIAGI_HOME=str(home),
               MINIAGI_SUMMARIZER_MODEL="reader", MINIAGI_MAX_COST="0")
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "--unattended", "--json", "read the file"],
                               cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate()
    elapsed = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err[-500:]}
    return elapsed, peak_kb / 1024, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=45.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeLLM() as llm:
        llm.responder = lambda request: "A maintenance log of valve pressures." if request["model"] == "reader" \
            else None
        work, home = Path(tmp) / "work", Path(tmp) / "home"
        work.mkdir()
        make_file(work / "big.txt", args.mb)
        size = (work / "big.txt").stat().st_size
        print(f"source: {size / 1e6:.1f} MB of text")
        for command, arg in (("ingest_data", "big.txt"), ("process_data", "Which valve had the highest pressure?"
                                                                          "|big.txt")):
            elapsed, peak_mb, result = run(command, arg, work, home, llm)
            runs = sorted((home / "runs").iterdir())
            trace = [json.loads(line) for line in (runs[-1] / "trace.jsonl").read_text().splitlines()]
            observation = next(e["text"] for e in trace if e["type"] == "observation")
            said = [line for line in observation.splitlines() if "Stored" in line or "only the first" in line]
            print(f"{command}: {elapsed:.1f} s wall, peak RSS (largest process so far) {peak_mb:.0f} MB, "
                  f"status {result.get('status')}, {result.get('llm_calls')} model calls")
            print(f"  observation: {' / '.join(said)[:300]}")


if __name__ == "__main__":
    main()
