"""What miniagi's own process writes or trusts, out of executed code's reach (issue 29): a batch's results and logs,
`.env` decisions, journals, run files read by the UI. Real `python -m miniagi` processes against the scripted
endpoint; the code the model runs is the attacker."""

from __future__ import annotations

import json

import pytest

from .conftest import act
from .test_batch_replay import Scripted


def _user_home(isolated):
    home = isolated.work.parent / "user-home"
    home.mkdir(exist_ok=True)
    bashrc = home / ".bashrc"
    bashrc.write_text("# the user's own\n")
    return home, bashrc


@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_a_txt_batchs_objectives_cannot_write_or_forge_its_results_and_logs(cli, llm, isolated, kind):
    """Break 1: code linked the batch's log to ~/.bashrc and appended a forged `done` to results.jsonl. Now each
    objective works in a folder of its own (bwrap: the results folder is out of its reach), the log is never written
    through a link, and a rerun trusts only lines signed with the home's key (whatever the sandbox let through)."""
    _, bashrc = _user_home(isolated)
    out = isolated.work / "jobs-txt-results"
    forged = json.dumps({"id": "2", "objective": "Count forever", "repeat": 0, "status": "done",
                         "answer": "FORGED ANSWER", "run_id": None, "steps": 1, "cost_usd": 0.0})
    attack = (f"mkdir -p {out}/logs; ln -s {bashrc} {out}/logs/3.log; ln -s {bashrc} {out}/logs/1.log; "
              f"printf '%s\\n' '{forged}' >> {out}/results.jsonl; echo attacked")
    llm.responder = Scripted({
        "Just finish": [act("done", "finished")],
        "Count forever": lambda step: act("execute_shell", f"echo {step}"),
        "Tidy up": [act("execute_shell", attack, thought="echo pwned-by-thought"), act("done", "tidied")],
    })
    (isolated.work / "jobs.txt").write_text("Just finish\nCount forever\nTidy up\n")
    first = cli("batch", "jobs.txt", "--workers", "1", "--max-steps", "2", "--sandbox", kind, "-y", process=True,
                timeout=180)
    assert first.returncode == 3, first.stderr
    assert bashrc.read_text() == "# the user's own\n"  # never written through the link
    assert not (out / "logs" / "1.log").is_symlink() and not (out / "logs" / "3.log").is_symlink()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().split("\n") if line]
    mine = [r for r in records if "mac" in r]
    assert {r["id"]: r["workdir"] for r in mine} == {n: str(out / "work" / n) for n in ("1", "2", "3")}
    if kind == "bwrap":  # the results folder is not in the objectives' reach at all
        assert len(records) == 3 and "FORGED" not in (out / "results.jsonl").read_text()
    rerun = cli("batch", "jobs.txt", "--workers", "1", "--max-steps", "2", "--sandbox", kind, "-y", process=True,
                timeout=180)
    assert "2 already done · 1 to run" in rerun.stderr, rerun.stderr  # the forged `done` is not taken
    report = cli("batch", "report", str(out), process=True)
    assert report.returncode == 0 and "FORGED" not in report.stdout and "1/3" not in report.stdout
    assert "2/3 done" in report.stdout, report.stdout
