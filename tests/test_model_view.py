"""What the model saw, made visible: every agent prompt is kept (redacted, each distinct message once) with what its
parts cover, and `miniagi show RUN_ID --prompt N` prints exactly the messages sent for step N."""

from __future__ import annotations

import json

from .conftest import MEMORY_ON, act, run_dirs

SECRET = "sk-live-abcdefghijklmnop1234567890"


def _reports(llm) -> list:
    """A run whose steps leave the view: eight long reports, then an answer. The agent's prompts, as sent."""
    sent = []

    def respond(request):
        if request["model"] == "summarizer-model":
            return "The agent printed long reports of rows."
        sent.append(request["messages"])
        return None

    llm.responder = respond
    code = "for i in range(60):\n    print(f'report {n}, row {{i}}: the pump at bay {{i}} runs at {{4000 + i}} rpm')"
    llm.add(act("memorize_thoughts", "the pumps run near 4000 rpm", "keep it"),
            *[act("execute_python", code.format(n=n), f"read report {n}") for n in range(1, 8)], act("done", "read"))
    return sent


def test_show_prompt_prints_the_messages_sent_for_a_step_and_what_each_part_covers(cli, llm, isolated):
    sent = _reports(llm)
    done = cli("-y", "--max-context-tokens", "2500", "--summarizer-model", "summarizer-model", "Read the reports")
    assert done.returncode == 0, done.stderr
    (run,) = run_dirs(isolated.home)
    folded = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()
              if json.loads(line)["type"] == "summary"]
    assert folded, "steps never left the view"
    last = len(sent)  # the step of the last agent call (one call per step here)
    shown = cli("show", run.name, "--prompt", str(last))
    assert shown.returncode == 0, shown.stderr
    for message in sent[-1]:  # every message, exactly as sent
        assert message["content"] in shown.stdout
    through = folded[-1]["through_step"]
    assert f"the summary of steps 1-{through}" in shown.stdout
    view = [n for n in range(through + 1, last)]
    assert f"step {view[0]}: its reply" in shown.stdout and f"step {view[-1]}: its observation" in shown.stdout
    assert "the notes of step 1" in shown.stdout  # the note of step 1, out of view, is in the head
    assert "the system prompt" in shown.stdout

    as_json = json.loads(cli("show", run.name, "--prompt", str(last), "--json").stdout)
    assert [{"role": p["role"], "content": p["content"]} for p in as_json[0]["parts"]] == \
        [{"role": m["role"], "content": m["content"]} for m in sent[-1]]
    assert as_json[0]["covers"]["summary_through"] == through

    # cheap on disk: each distinct message once, so the file grows with the run, not with the square of it
    kept = (run / "prompts.jsonl").read_text()
    lines = [json.loads(line) for line in kept.splitlines()]
    assert [line["message"]["role"] for line in lines if "message" in line].count("system") == 1
    distinct = {json.dumps(m, sort_keys=True) for messages in sent for m in messages}
    assert len([line for line in lines if "message" in line]) == len(distinct)
    assert len([line for line in lines if "step" in line]) == len(sent)

    missing = cli("show", run.name, "--prompt", "99")
    assert missing.returncode == 1 and "kept no prompt for step 99" in missing.stderr


def test_a_recalled_item_and_a_secret_in_the_model_view(cli, llm, isolated):
    """Recalled items are listed with their labels; a secret in what the model was sent is redacted on disk too."""
    llm.add(act("execute_shell", "echo the vault code is 4417-ZETA", "find the code"), act("done", "4417-ZETA"))
    assert cli("-y", "Find the vault code", env=MEMORY_ON).returncode == 0
    llm.add(act("done", "It was 4417-ZETA."))
    assert cli("-y", f"What was the vault code? my key is {SECRET}", env={**MEMORY_ON, "MY_API_KEY": SECRET}
               ).returncode == 0
    second = sorted(run_dirs(isolated.home))[-1]
    shown = cli("show", second.name, "--prompt", "1", env=MEMORY_ON)
    assert shown.returncode == 0, shown.stderr
    recalled = [line for line in shown.stdout.splitlines() if "recalled item" in line]
    assert recalled and "run " in recalled[0], shown.stdout  # labelled with the run it came from
    assert SECRET not in (second / "prompts.jsonl").read_text()
