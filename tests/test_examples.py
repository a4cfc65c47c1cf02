"""The example suite (examples/suite.jsonl): every objective's check passes with a scripted correct solution and
fails with a scripted wrong one — each a real batch against the scripted endpoint, one for all the right answers and
one for all the wrong ones."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from .conftest import act

SUITE = Path(__file__).resolve().parent.parent / "examples" / "suite.jsonl"
LINES = [json.loads(line) for line in SUITE.read_text(encoding="utf-8").splitlines() if line.strip()]

WRITE_REVENUE = """import csv
from collections import defaultdict
totals = defaultdict(float)
for row in csv.DictReader(open('orders.csv')):
    totals[row['region']] += int(row['units']) * {price}
with open('revenue.csv', 'w', newline='') as out:
    writer = csv.writer(out, lineterminator='\\n')
    writer.writerow(['region', 'revenue'])
    for region, value in sorted(totals.items(), key=lambda item: -item[1]):
        writer.writerow([region, f'{{value:.2f}}'])
print(open('revenue.csv').read())"""

DAYS = {1: "Stavanger 54, Bergen 11", 2: "Stavanger 2, Bergen 28, Tromsø 9", 3: "Tromsø 15, Stavanger 13, Bergen 12",
        4: "Oslo 16, Stavanger 23, Bergen 11", 5: "Oslo 5, Bergen 45", 6: "Stavanger 31, Bergen 54"}


def tally(totals: dict) -> list[str]:
    steps = []
    for day, figures in DAYS.items():
        steps += [act("execute_shell", f"grep SHIPPED day{day}.log"), act("memorize_thoughts", f"day {day}: {figures}")]
    return steps + [act("execute_python", "import json\njson.dump(" + repr(totals) + ", open('tally.json', 'w', "
                        "encoding='utf-8'), ensure_ascii=False)"), act("done", "tally.json written")]


SOLD_OUT = """import re
html = open('catalog.html', encoding='utf-8').read()
names = re.findall(r'<td>([^<]+)</td><td>[^<]+</td><td class="sold-out">0</td>', html)
open('sold_out.txt', 'w').write(''.join(name + '\\n' for name in {order}))"""

BY_CITY = """import json
people = json.load(open('people.json'))
cities = {{}}
for person in people:
    if person['joined'] >= {year}:
        cities.setdefault(person['city'], []).append(person['name'])
json.dump({{city: sorted(names) for city, names in cities.items()}}, open('by_city.json', 'w'))"""

PRIMES = """numbers = [int(n) for n in open('numbers.txt').read().split()]
primes = [n for n in numbers if n > 1 and all(n % d for d in range(2, int(n ** 0.5){plus}))]
open('primes.txt', 'w').write(f'{{len(primes)}} {{max(primes)}}\\n')"""

CONFIG = """lines = open('settings.ini').read().split('\\n')
section = None
for i, line in enumerate(lines):
    if line.startswith('['):
        section = line
    elif section == '[server]' and line.startswith('port ='):
        lines[i] = 'port = 8081'
    elif section == '[logging]' and line.startswith('debug ='):
        lines[i] = 'debug = false'
open('settings.ini', 'w').write('\\n'.join(lines))"""

PHOTOS = ("for f in IMG_*.jpg; do d=$(echo \"$f\" | sed -E 's/IMG_([0-9]{{4}})([0-9]{{2}}).*/\\1{sep}\\2/'); "
          "mkdir -p \"$d\" && mv \"$f\" \"$d/\"; done; find . -type f | sort")

RIGHT = {
    "csv-revenue": [act("execute_python", WRITE_REVENUE.format(price="float(row['unit_price'])")),
                    act("done", "revenue.csv holds the revenue per region")],
    "fix-the-code": [act("execute_python", "source = open('slug.py').read()\n"
                         "open('slug.py', 'w').write(source.replace('\", title)', '\", title.lower())'))"),
                     act("execute_shell", "python3 -m unittest -q test_slug"),
                     act("done", "slugify lower-cases first")],
    "handbook": [act("execute_shell", "cat *.md"),
                 act("done", "1: 10 working days\n2: room B214\n3: the duty safety officer (extension 4400)")],
    "shipment-tally": tally({"Bergen": 161, "Oslo": 21, "Stavanger": 123, "Tromsø": 24}),
    "sold-out": [act("execute_python", SOLD_OUT.format(order="sorted(names)")), act("done", "3 products sold out")],
    "big-logs": [act("execute_shell", "find logs -name '*.log' -size +2000c | sort > big_logs.txt; cat big_logs.txt"),
                 act("done", "2 big logs")],
    "nobody-home": [act("talk_to_user", "Should the welcome note be formal or casual?"),
                    act("execute_shell", "printf 'Dear Ada Quill,\\n\\nWelcome! Room 12 is ready for you.\\n' "
                                         "> welcome.txt"),
                    act("done", "No one replied, so welcome.txt is formal.")],
    "by-city": [act("execute_python", BY_CITY.format(year=2024)), act("done", "by_city.json written")],
    "primes": [act("execute_python", PRIMES.format(plus=" + 1")), act("done", "9 primes, the largest 317")],
    "config-edit": [act("execute_python", CONFIG), act("done", "port 8081, debug off")],
    "photo-folders": [act("execute_shell", PHOTOS.format(sep="-")), act("done", "photos sorted by month")],
}

WRONG = {  # each a plausible mistake
    "csv-revenue": [act("execute_python", WRITE_REVENUE.format(price="1")),  # units, not revenue
                    act("done", "revenue.csv written")],
    "fix-the-code": [act("execute_python", "test = open('test_slug.py').read()\n"  # "fixed" by changing the test
                         "open('test_slug.py', 'w').write(test.replace('\"hello-world\"', '\"ello-orld\"')"
                         ".replace('\"top-10-tips\"', '\"op-10-ips\"'))"),
                     act("execute_shell", "python3 -m unittest -q test_slug"), act("done", "the tests pass")],
    "handbook": [act("done", "1: 30 days\n2: room A102\n3: call 112")],
    "shipment-tally": tally({"Bergen": 107, "Oslo": 21, "Stavanger": 123, "Tromsø": 24}),  # a day's Bergen lost
    "sold-out": [act("execute_python", SOLD_OUT.format(order="names")), act("done", "3 products")],  # page order
    "big-logs": [act("execute_shell", "find logs -name '*.log' -size +1999c | sort > big_logs.txt"),  # 2000 too
                 act("done", "3 big logs")],
    "nobody-home": [act("execute_shell", "printf 'Hi Ada!\\n' > welcome.txt"),
                    act("done", "The user asked for a casual note.")],
    "by-city": [act("execute_python", BY_CITY.format(year=2023)), act("done", "by_city.json written")],
    "primes": [act("execute_python", PRIMES.format(plus="")), act("done", "11 primes")],  # 9 and 169 "prime"
    "config-edit": [act("execute_shell", "sed -i -e 's/^port = .*/port = 8081/' -e 's/^debug = true/debug = false/'"
                                         " settings.ini"), act("done", "done")],  # the cache's port too
    "photo-folders": [act("execute_shell", PHOTOS.format(sep="/")), act("done", "sorted")],  # YYYY/MM
}


class Solver:
    """Plays each objective's script, a step per agent request, counted per work directory (one per attempt).
    Anything else asked (a summary of folded steps) gets a short summary."""

    def __init__(self, scripts: dict):
        self.by_objective = {line["objective"]: scripts[line["id"]] for line in LINES}
        self.steps: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request):
        system = request["messages"][0]["content"]
        if not system.startswith("You are MiniAGI"):
            return "Summary: the steps so far read logs and noted each day's figures."
        workdir = re.search(r"working directory is (/\S+?)[;.,]?\s", system).group(1)
        briefing = next(m["content"] for m in request["messages"] if m["content"].startswith("OBJECTIVE:"))
        script = next(s for text, s in self.by_objective.items() if text in briefing)
        with self.lock:
            step = self.steps[workdir] = self.steps.get(workdir, 0) + 1
        return script[min(step, len(script)) - 1]


def run_suite(cli, llm, isolated, scripts, name):
    llm.responder = Solver(scripts)
    out = isolated.work / name
    proc = cli("batch", str(SUITE), "--out", str(out), "--workers", "3", "-y", timeout=600)
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text(encoding="utf-8").splitlines())}
    assert set(records) == {line["id"] for line in LINES}
    return proc, records


def test_the_suite_has_what_it_promises():
    assert len(LINES) >= 10
    for line in LINES:
        assert line.get("check") or line.get("expect"), line["id"]
        assert line.get("setup"), line["id"]
    assert set(RIGHT) == set(WRONG) == {line["id"] for line in LINES}
    notes = next(line for line in LINES if line["id"] == "shipment-tally")
    assert notes["max_context_tokens"] <= 3000  # notes must carry the figures: the logs do not fit together


def test_every_example_passes_with_a_correct_solution(cli, llm, isolated):
    proc, records = run_suite(cli, llm, isolated, RIGHT, "right")
    assert proc.returncode == 0, proc.stderr
    for id_, record in records.items():
        assert (record["status"], record["check"]) == ("done", "pass"), (id_, record)
    assert "11/11 passed (100%)" in proc.stderr and "per passed objective" in proc.stderr
    work = isolated.work / "right" / "work"
    assert (work / "csv-revenue" / "orders.csv").is_file() and not (work / "csv-revenue" / "big_logs.txt").exists()
    if os.environ.get("SUITE_SUMMARY"):  # the table as printed, for the record
        Path(os.environ["SUITE_SUMMARY"]).write_text(proc.stderr[proc.stderr.index("batch summary"):])


def test_every_example_fails_with_a_wrong_solution(cli, llm, isolated):
    proc, records = run_suite(cli, llm, isolated, WRONG, "wrong")
    assert proc.returncode == 3
    for id_, record in records.items():
        assert (record["status"], record["check"]) == ("done", "fail"), (id_, record)
    assert "0/11 passed (0%)" in proc.stderr
