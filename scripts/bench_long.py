"""Can the model rely on its memory over a long run? Measured from the requests a scripted OpenAI-compatible server
on 127.0.0.1 received from a real `miniagi` process (vector memory on, the local embedder).

The scripted run: 36 steps. Most steps read a log part of ~1,200 characters that holds one FACT (at its start, in its
middle or at its end); every fourth step memorizes a NOTE; the last step says done. The summarizer is faithful: it
repeats every fact and note it is shown, whole, and nothing else. Whatever the agent's prompts then lack, the memory
design lost.

From each agent request the server received it counts:
- (request, earlier note) pairs where the note is visible whole (from the step after the note on);
- (request, earlier fact) pairs where the fact is visible whole, and the most facts missing from one prompt;
- recalled items cut inside their fact (an item of a step, or a note, that shows part of it but not all);
- the fixed prompt: the first request (system prompt, objective, the request for an action, and with tools the tool
  schemas), as the budget counts;
- model calls per agent step, all roles;
- prefix reuse: the share of each agent prompt (o200k tokens of the rendered messages) that repeats the previous
  agent prompt's beginning, as scripts/bench_cache.py measures it;
- the largest prompt against the budget (as the budget counts: messages plus their overhead, and tool schemas);
- summary lag: steps out of view that neither the summary nor the steps in brief stand for (the most in one prompt,
  and in the last), and the most steps in brief awaiting the summary;
- summarizer calls, and the prompt tokens of all calls (every role, as the budget counts).

With --steps N the run is N steps long and ends with questions: --ask facts, spread over steps 1-N, each asked for
through the `recall` command (query: "pump in bay K rpm"); exact recall is the share of those whose recall showed
the fact whole. Every tenth step's output also says "The door code is now DOOR-K." (a value a later step replaces),
and the summarizer keeps to the words it is told (the newest facts first, then a line saying what it moved out).
Automatic recall is measured item by item: a duplicate shows a fact or note the request holds elsewhere already; a
stale item shows a door code a later step replaced, unlabelled. --warm measures a second run of the scenario in the
same home, whose recall searches the store's vectors (a first run in a new home recalls by words). --price measures
memory on against memory off over the same 30 steps: the run's CPU time and peak RSS (os.wait4 on the child
process). The summarizer is a model of its own unless --summarizer agent (miniagi's default: the agent's model, whose
folds end the agent's own prompt).

    python scripts/bench_long.py                               # budgets 3000 and 8000, the tags protocol
    python scripts/bench_long.py --steps 300 --protocols tags,json
    python scripts/bench_long.py --price
    python scripts/bench_long.py --summarizer agent --budgets 3000,2500 --shapes all
    python scripts/bench_long.py --budgets 2500 --protocols tags,tools,json
    python scripts/bench_long.py --before 0f15e96              # and the same for an earlier commit
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, checkout, common_prefix

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, message_text
from memory.tokens import counter_for
from tests.fake_llm import Calls, FakeLLM, rendered_prompt, summarizing

STEPS = 36  # the last one says done (--steps)
ASKED: list[int] = []  # the fact steps asked for through recall at the end (--steps, --ask)
DOOR_EVERY = 10  # every this many steps, an output also says the door code, a value the next such step replaces
AGENT_MODEL, SUMMARIZER_MODEL = "gpt-4o-mini", "summarizer-model"
COUNTER = counter_for(AGENT_MODEL)  # how the agent's budget counts
ENCODING = counter_for("gpt-4o").encoding  # how bench_cache counts prefix reuse
OBJECTIVE = "Read the plant's log parts one by one and keep what matters, then report"
FILLER = ("Routine entry: the line ran as scheduled, no alarms were raised, and the operators logged nothing of "
          "note for this interval. ")


def fact(step: int) -> str:
    return f"FACT {step:02d}: the pump in bay {step} runs at {4000 + 37 * step} rpm."


def note(step: int) -> str:
    if step % 12 == 0:  # a longer note now and then
        return (f"NOTE {step:02d}: pumps so far run between 4000 and {4000 + 37 * step} rpm; bay {step - 1} is the "
                f"fastest yet. Check the manifold limits before the report, and compare bays {step - 3} and "
                f"{step - 2} with the spec sheet.")
    return f"NOTE {step:02d}: parts 1-{step} read; bay {step - 1} looks normal, keep comparing rpm."


def is_note_step(step: int) -> bool:
    return step % 4 == 0


WORDS = ("amber basil cedar delta ember fjord gamma hazel indigo juniper kestrel lumen maple nectar onyx pewter "
         "quartz russet sable topaz umber violet willow xenon yarrow zephyr").split()
SHAPES = ("prose", "longline", "json", "table", "traceback", "numbers", "blob", "nonascii")
SIZE = 450  # tokens of one output, about (--size)


def _word(step: int, i: int) -> str:
    return WORDS[(step * 7 + i * 3) % len(WORDS)]


def _units(shape: str, step: int, count: int) -> list[str]:
    """`count` pieces of an output of this shape, with no fact in them."""
    if shape == "prose":
        return [FILLER] * count
    if shape == "longline":  # one long line of words, no sentence end
        return [" ".join(_word(step, i + j) for j in range(12)) + " " for i in range(count)]
    if shape == "json":
        return [json.dumps({"id": step * 1000 + i, "name": f"{_word(step, i)}-{i}", "ok": i % 3 != 0,
                            "tags": [_word(step, i + 1), _word(step, i + 2)]}) + ",\n" for i in range(count)]
    if shape == "table":
        return [f"| {i:4d} | {_word(step, i):<8} | {(step * 31 + i * 17) % 1000:6d} | {_word(step, i + 5):<8} |\n"
                for i in range(count)]
    if shape == "traceback":
        return [f'  File "/srv/app/{_word(step, i)}/module_{i}.py", line {10 + i * 7}, in handler_{i}\n'
                f"    result = {_word(step, i + 1)}_call(payload, retries={i % 5})\n" for i in range(count)]
    if shape == "numbers":
        return [" ".join(str((step * 7919 + i * 104729 + j * 31) % 100000) for j in range(10)) + "\n"
                for i in range(count)]
    if shape == "blob":  # long unbroken tokens
        return ["".join(f"{(step * 2654435761 + i * 40503 + j) % 4294967296:08x}" for j in range(12)) + "\n"
                for i in range(count)]
    if shape == "nonascii":
        return [f"Journal n°{i} — l'équipe a vérifié la pompe ; 温度は正常です、圧力も安定。Ωμέγα {i} ✓ "
                for i in range(count)]
    raise ValueError(shape)


def log_part(step: int, shape: str = "prose", size: int = 0) -> str:
    """An output of the given shape, of about `size` tokens (prose: ~1,200 characters when size is 0), with the
    step's fact at its start, middle or end, on a line of its own (in the json shape: a string value)."""
    units = _units(shape, step, 400)
    if size or shape != "prose":
        body, taken = [], 0
        for unit in units:
            if taken >= (size or SIZE):
                break
            body.append(unit)
            taken += COUNTER.count(unit)
    else:
        body = units[:10]
    line = fact(step)
    if shape == "json":
        line = json.dumps({"finding": line}) + ",\n"
    elif shape == "traceback":
        line = f"RuntimeError: {line}\n"
    elif shape in ("prose", "nonascii", "longline"):
        line = line + (" " if shape == "prose" else "\n")
    else:
        line = line + "\n"
    body.insert((0, len(body) // 2, len(body))[step % 3], line)
    if step % DOOR_EVERY == 0 and shape in ("prose", "nonascii", "longline", "numbers", "table", "blob"):
        body.append(("\n" if shape != "prose" else "") + door(step) + "\n")
    text = "".join(body)
    if shape == "json":
        text = "[\n" + text.rstrip(",\n") + "\n]"
    elif shape == "traceback":
        text = "Traceback (most recent call last):\n" + text
    return text


def door(step: int) -> str:
    return f"The door code is now DOOR-{step}."


def action(step: int) -> tuple[str, str, str]:
    if step >= STEPS + len(ASKED):
        return "all parts are read", "done", "Report: every pump's rpm is recorded in my memory."
    if step >= STEPS:
        return "look up a pump read long ago", "recall", f"pump in bay {ASKED[step - STEPS]} rpm"
    if is_note_step(step):
        return f"keep what parts 1-{step} showed", "memorize_thoughts", note(step)
    return f"read log part {step}", "execute_python", f"print(open('logs/part{step:02d}.txt').read())"


def reply(step: int, protocol: str):
    thought, command, arg = action(step)
    if protocol == "tools":
        name = {"done": "answer", "memorize_thoughts": "text", "execute_python": "code", "recall": "query"}[command]
        return Calls([(command, json.dumps({name: arg}))], thought)
    if protocol == "json":
        name = {"done": "answer", "memorize_thoughts": "text", "execute_python": "code", "recall": "query"}[command]
        return json.dumps({"thought": thought, "command": command, "args": {name: arg}})
    return f"<r>{thought}</r><c>{command}</c>\n{arg}"


def request_text(request: dict) -> str:
    """Everything the model reads in a request: contents and tool-call arguments, JSON strings decoded."""
    parts = []
    for message in request.get("messages", []):
        content = message.get("content") or ""
        parts.append(content)
        encoded = [call["function"]["arguments"] for call in message.get("tool_calls") or []]
        if message.get("role") == "assistant" and content.startswith("{"):  # the json protocol's reply
            encoded.append(content)
        for text in encoded:
            try:
                parts.extend(str(value) for value in json.loads(text).values())
            except (ValueError, AttributeError):
                pass
    return "\n".join(parts)


def faithful_summary(request: dict) -> str:
    """Every fact and note the prompt shows whole, and nothing else, within the words it is told ("at most N words"):
    the newest first; what does not fit is named in a last line, as the prompt asks. A fold in the agent's prompt
    repeats no note (they stay in view, as it is told), and a part to append repeats nothing of the head."""
    appending = "to follow the SUMMARY" in (request["messages"][-1].get("content") or "")
    text = request_text(dict(request, messages=request["messages"][2:]) if appending else request)
    if request["messages"][0].get("role") == "system":  # a fold in the agent's prompt: its notes stay in view apart
        text = "\n".join(line for line in text.split("\n") if "NOTE " not in line)
    told = re.search(r"at most (\d+) words", text)
    words = int(told.group(1)) if told else 10**6
    kept = [fact(s) for s in range(1, STEPS) if fact(s) in text] + [note(s) for s in range(1, STEPS) if note(s) in text]
    doors = [s for s in range(1, STEPS) if door(s) in text]
    kept += [door(doors[-1])] if doors else []
    kept.sort(key=lambda item: -int(re.search(r"\d+", item).group()))  # newest first
    shown, used, moved = [], 4, []
    for item in kept:
        if used + len(item.split()) + 12 > words:
            moved.append(int(re.search(r"\d+", item).group()))
            continue
        shown.append(item)
        used += len(item.split())
    ending = (f" Moved out: facts and notes of steps {min(moved)}-{max(moved)}: use recall." if moved else "")
    return "The agent read log parts. " + " ".join(reversed(shown)) + ending


def measure(budget: int, protocol: str, package_root: Path, shape: str = "prose", size: int = 0,
            memory: str = "global", warm: bool = False, own_summarizer: bool = True) -> dict:
    agent_requests: list[dict] = []

    def respond(request):
        if request["model"] != AGENT_MODEL or summarizing(request):
            return faithful_summary(request)
        agent_requests.append(request)
        return reply(len(agent_requests), protocol)

    with tempfile.TemporaryDirectory() as tmp, FakeLLM(responder=respond) as llm:
        work = Path(tmp) / "work"
        (work / "logs").mkdir(parents=True)
        for step in range(1, STEPS):
            (work / "logs" / f"part{step:02d}.txt").write_text(log_part(step, shape, size))
        env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="bench", MINIAGI_HOME=str(Path(tmp) / "home"),
                   MINIAGI_MODEL=AGENT_MODEL, MINIAGI_SUMMARIZER_MODEL=SUMMARIZER_MODEL,
                   MINIAGI_MAX_CONTEXT_TOKENS=str(budget), MINIAGI_MAX_STEPS=str(STEPS + len(ASKED) + 5),
                   MINIAGI_MAX_COST="0", MINIAGI_MAX_CALLS=str(10 * (STEPS + len(ASKED))), MINIAGI_PROTOCOL=protocol,
                   MINIAGI_MEMORY_SCOPE=memory, PYTHONPATH=str(package_root))
        if not own_summarizer:  # the default: the agent's model summarizes, at the end of the agent's prompt
            del env["MINIAGI_SUMMARIZER_MODEL"]
        if warm:  # the same run once before, in the same home: this one recalls from a store that holds it
            subprocess.run([sys.executable, "-m", "miniagi", "-y", "--unattended", OBJECTIVE], cwd=work, env=env,
                           capture_output=True, check=True)
            agent_requests.clear()
            llm.requests.clear()
        with open(Path(tmp) / "stderr", "w+") as stderr:
            child = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "--unattended", OBJECTIVE], cwd=work,
                                     env=env, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own CPU time and peak RSS
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode != 0:
                stderr.seek(0)
                raise SystemExit(f"the run failed ({child.returncode}): {stderr.read()[-1500:]}")
        calls = list(llm.requests)
    calls_of = {id(r) for r in agent_requests}
    return dict(figures(agent_requests, calls, budget, [r for r in calls if id(r) not in calls_of]),
                cpu=usage.ru_utime + usage.ru_stime,
                rss_mb=usage.ru_maxrss / 1024)


def lag(request: dict) -> tuple[int, int]:
    """Steps before the oldest step in view that neither the summary nor the steps in brief stand for, and those that
    only the steps in brief stand for (until the summary takes them in)."""
    text = request_text(dict(request, messages=request["messages"][1:]))  # the system prompt's example is no step
    shown = [int(n) for n in re.findall(r"Observation \(step (\d+)\)", text)]
    summary = re.findall(r"SUMMARY OF STEPS? (?:1-)?(\d+)", text)  # a part appended later: the last label
    brief = re.search(r"STEPS (\d+)-(\d+) IN BRIEF", text)
    if not shown:
        return 0, 0
    covered = max(map(int, summary), default=0)
    briefed = int(brief.group(2)) - covered if brief else 0
    return max(0, min(shown) - 1 - covered - briefed), briefed


def figures(requests: list[dict], all_calls: list[dict], budget: int, summarizer_calls: list[dict]) -> dict:
    calls = len(all_calls)
    notes = fact_pairs = missing_most = 0
    note_seen = fact_seen = 0
    recalled = cut = with_fact = duplicates = with_door = stale = exact = 0
    for number, request in enumerate(requests, start=1):
        if number > STEPS and number - 1 - STEPS < len(ASKED):  # the observation of a recall step
            exact += fact(ASKED[number - 1 - STEPS]) in message_text(request["messages"][-1])
        text = request_text(request)
        earlier = range(1, min(number, STEPS))
        shown_notes = [note(s) in text for s in earlier if is_note_step(s)]
        shown_facts = [fact(s) in text for s in earlier if not is_note_step(s)]
        notes, note_seen = notes + len(shown_notes), note_seen + sum(shown_notes)
        fact_pairs, fact_seen = fact_pairs + len(shown_facts), fact_seen + sum(shown_facts)
        missing_most = max(missing_most, shown_facts.count(False))
        elsewhere = " ".join(re.sub(r"<<<UNTRUSTED DATA: recalled memories.*?<<<END UNTRUSTED DATA>>>", "", text,
                                    flags=re.S).split())
        for item in recalled_items(request):
            recalled += 1
            cut += cut_inside(item)
            flat = " ".join(item.split())
            held = [whole for s in range(1, STEPS) for whole in (fact(s), note(s)) if whole in flat]
            with_fact += bool(held)
            duplicates += bool(held) and all(whole in elsewhere for whole in held)
            doors = [s for s in range(DOOR_EVERY, STEPS, DOOR_EVERY) if door(s) in flat]
            with_door += bool(doors)
            newer = [s for s in range(DOOR_EVERY, min(number, STEPS), DOOR_EVERY) if doors and s > max(doors)]
            stale += bool(newer) and "superseded by step" not in item.split("\n")[0]
    prompts = [ENCODING.encode(rendered_prompt(r), disallowed_special=()) for r in requests]
    sent = sum(len(p) for p in prompts)
    reused = sum(common_prefix(a, b) for a, b in zip(prompts, prompts[1:]))
    sizes = [prompt_tokens(r) for r in requests]
    return {"steps": len(requests), "calls": calls, "notes": (note_seen, notes), "facts": (fact_seen, fact_pairs),
            "missing_most": missing_most, "recalled": recalled, "cut": cut, "fixed": sizes[0],
            "reuse": reused / sent, "largest": max(sizes), "budget": budget,
            "lag": (max(lag(r)[0] for r in requests), lag(requests[-1])[0], max(lag(r)[1] for r in requests)),
            "summarizer": len(summarizer_calls),
            "recall": (exact, len(ASKED)), "with_fact": with_fact, "duplicates": duplicates,
            "with_door": with_door, "stale": stale,
            "prompt_tokens": sum(prompt_tokens(r) for r in all_calls)}


def recalled_items(request: dict) -> list[str]:
    """The recalled memories of the request's newest message, one per item (each begins with "- (")."""
    last = message_text(request["messages"][-1])
    match = re.search(r"<<<UNTRUSTED DATA: recalled memories[^>]*>>>\n(.*?)\n<<<END UNTRUSTED DATA>>>", last, re.S)
    if not match:
        return []
    return [item for item in re.split(r"\n(?=- \()", match.group(1)) if item.strip()]


def cut_inside(item: str) -> bool:
    """An item that shows part of a fact or note but not all of it, or an item of a step that held a fact and
    does not show it whole."""
    flat = " ".join(item.split())
    for step in range(1, STEPS):
        whole = note(step) if is_note_step(step) else fact(step)
        marker = whole.split(":")[0]  # "FACT 07", "NOTE 08"
        if marker in flat and whole not in flat:
            return True
    label = re.match(r"- \(([^)]*)\)", item)
    step = re.search(r"step (\d+)", label.group(1)) if label else None
    if step and 0 < int(step.group(1)) < STEPS and not is_note_step(int(step.group(1))):
        return fact(int(step.group(1))) not in flat
    return False


def prompt_tokens(request: dict) -> int:
    """As the budget counts it: the messages, their overhead, and the tool schemas sent with them (tools)."""
    schemas = COUNTER.count(json.dumps(request["tools"])) if request.get("tools") else 0
    return (sum(COUNTER.count(message_text(m)) + MESSAGE_OVERHEAD for m in request["messages"]) + REPLY_PRIMING
            + schemas)


def report(label: str, f: dict) -> None:
    share = lambda seen, total: f"{100 * seen / total:.1f} %" if total else "-"  # noqa: E731
    print(f"  {label}: {f['steps']} steps, {f['calls']} model calls")
    print(f"    notes visible whole: {share(*f['notes'])} of {f['notes'][1]} (request, earlier note) pairs")
    print(f"    facts visible whole: {share(*f['facts'])} of {f['facts'][1]} pairs; at most {f['missing_most']} "
          f"missing from one prompt")
    print(f"    recalled items cut inside their fact: {f['cut']} of {f['recalled']}")
    print(f"    fixed prompt: {f['fixed']} tokens ({100 * f['fixed'] / f['budget']:.0f} % of the budget)")
    print(f"    calls per step: {f['calls'] / f['steps']:.2f}")
    print(f"    prefix reuse: {100 * f['reuse']:.0f} %")
    print(f"    largest prompt: {f['largest']:,} of {f['budget']:,}")
    print(f"    summary lag: at most {f['lag'][0]} steps out of view in neither the summary nor brief "
          f"({f['lag'][1]} in the last prompt); at most {f['lag'][2]} in brief, awaiting the summary")
    print(f"    summarizer calls: {f['summarizer']}; prompt tokens, all calls: {f['prompt_tokens']:,}")
    if f["recall"][1]:
        print(f"    recall command, exact: {share(*f['recall'])} of {f['recall'][1]} facts asked for at the end")
    print(f"    automatic recall: {f['recalled']} items, {f['with_fact']} with a fact or note; duplicates of the "
          f"prompt {f['duplicates']} ({share(f['duplicates'], f['recalled'])} of items); stale (a replaced door "
          f"code, unlabelled) {f['stale']} of {f['with_door']} with a door code")
    print(f"    run's CPU {f['cpu']:.1f} s, peak RSS {f['rss_mb']:.0f} MB")


def row(label: str, f: dict) -> str:
    share = lambda seen, total: f"{100 * seen / total:5.1f} %" if total else "    -"  # noqa: E731
    return (f"  {label:<22} facts {share(*f['facts'])}  notes {share(*f['notes'])}  worst {f['missing_most']:2d} "
            f"missing  calls/step {f['calls'] / f['steps']:.2f}  reuse {100 * f['reuse']:3.0f} %  "
            f"largest {f['largest']:,}/{f['budget']:,}  summarizer {f['summarizer']}  recalled {f['recalled']} "
            f"dup {f['duplicates']} stale {f['stale']}" + (f"  recall exact {share(*f['recall'])}" if f["recall"][1]
                                                           else ""))


def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="3000,8000", help="comma-separated --max-context-tokens values")
    parser.add_argument("--protocols", default="tags", help="comma-separated: tags, tools, json")
    parser.add_argument("--shapes", default="prose",
                        help=f"comma-separated output shapes ({', '.join(SHAPES)}), or 'all'; one line each")
    parser.add_argument("--size", type=int, default=0,
                        help=f"tokens of one output, about (default: ~1,200 characters of prose, {SIZE} for others)")
    parser.add_argument("--before", metavar="REV", help="also measure this earlier commit, for comparison")
    parser.add_argument("--root", metavar="DIR", help="measure the package in this directory instead of this one")
    parser.add_argument("--jsonl", metavar="FILE", help="append each measure's figures to this file")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps of reading (default {STEPS})")
    parser.add_argument("--ask", type=int, default=60,
                        help="with --steps: facts asked for through recall at the end, spread over the run (60)")
    parser.add_argument("--warm", action="store_true",
                        help="measure a second run of the scenario in the same home (recall from the store's vectors)")
    parser.add_argument("--summarizer", choices=("own", "agent"), default="own",
                        help="a summarizer model of its own (default), or the agent's model (miniagi's default)")
    parser.add_argument("--price", action="store_true",
                        help="memory on vs off over the same 30 steps: the run's CPU time and peak RSS")
    args = parser.parse_args()
    if args.price:
        STEPS = 30
        for scope, warm in (("off", False), ("global", False), ("global", True)):  # on: a new home, a second run
            f = measure(8000, "tags", ROOT, memory=scope, warm=warm)
            print(f"memory {scope:>6}{', second run' if warm else ''}: CPU {f['cpu']:.2f} s, peak RSS "
                  f"{f['rss_mb']:.0f} MB ({f['steps']} steps)", flush=True)
        return
    if args.steps != STEPS:
        STEPS = args.steps
        facts = [s for s in range(1, STEPS) if not is_note_step(s)]
        ASKED[:] = [facts[round(i * (len(facts) - 1) / max(1, args.ask - 1))] for i in range(min(args.ask, len(facts)))]
    shapes = SHAPES if args.shapes == "all" else tuple(args.shapes.split(","))
    print("targets: notes 100 %, facts >= 98 %, 0 cut items, fixed part <= 750 tokens at 3,000, <= 1.25 calls per "
          "step, reuse >= 60 % at 3,000 (>= 75 % at 8,000), every prompt within the budget")
    with checkout(args.before) as worktree:
        versions = [(f"before ({args.before})", worktree)] if worktree else []
        versions.append(("now", Path(args.root) if args.root else ROOT))
        for budget in (int(b) for b in args.budgets.split(",")):
            for protocol in args.protocols.split(","):
                print(f"budget {budget:,}, protocol {protocol}:", flush=True)
                for shape in shapes:
                    for label, root in versions:
                        f = measure(budget, protocol, root, shape, args.size, warm=args.warm,
                                    own_summarizer=args.summarizer == "own")
                        if len(shapes) == 1 and shape == "prose":
                            report(label, f)
                        else:
                            print(row(f"{shape} ({label})", f), flush=True)
                        if args.jsonl:
                            with open(args.jsonl, "a") as out:
                                out.write(json.dumps(dict(f, shape=shape, protocol=protocol, version=label,
                                                          root=str(root), size=args.size)) + "\n")


if __name__ == "__main__":
    main()
