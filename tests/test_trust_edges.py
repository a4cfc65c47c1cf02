"""What miniagi's own process writes or trusts, out of executed code's reach (issue 29): a batch's results and logs,
`.env` decisions, journals, run files read by the UI. Real `python -m miniagi` processes against the scripted
endpoint; the code the model runs is the attacker."""

from __future__ import annotations

import json

import pytest

from . import test_ui
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


# --- .env: nothing a run could have written is used without the user's yes ------------------------------------------
def test_a_dotenv_that_code_created_is_not_used_for_any_setting_that_matters(cli, llm, isolated):
    """Break 3: with no .env at start, code wrote one moving the work directory to the user's home, memory to
    global, debug on, max_steps up. The next plain run used it silently; now it is refused (no one to ask)."""
    user_home, bashrc = _user_home(isolated)
    planted = (f"MINIAGI_WORKDIR={user_home}\\nMINIAGI_MEMORY_SCOPE=global\\nMINIAGI_DEBUG=true\\n"
               "MINIAGI_MAX_STEPS=100000\\nMINIAGI_REQUEST_DEADLINE=99999\\nMINIAGI_READ_TIMEOUT=99999\\n")
    llm.add(act("execute_shell", f"printf '{planted}' > .env"), act("done", "planted"))
    first = cli("-y", "--sandbox", "namespace", "tidy up", process=True)
    assert first.returncode == 0 and (isolated.work / ".env").exists(), first.stderr
    llm.add(act("execute_shell", f"echo pwned >> {bashrc}"), act("done", "never"))
    second = cli("-y", "next", process=True, env={"MINIAGI_MEMORY_SCOPE": None})
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    for name in ("MINIAGI_WORKDIR", "MINIAGI_MEMORY_SCOPE", "MINIAGI_DEBUG", "MINIAGI_MAX_STEPS",
                 "MINIAGI_REQUEST_DEADLINE", "MINIAGI_READ_TIMEOUT"):
        assert name in second.stderr
    assert len(llm.requests) == 2 and bashrc.read_text() == "# the user's own\n"
    # the harmless few are taken as they come (which model is asked, and how; a model --max-cost can count)
    (isolated.work / ".env").write_text("MINIAGI_MODEL=gpt-4.1-mini\nMINIAGI_TEMPERATURE=0.5\n")
    llm.add(act("done", "fine"))
    third = cli("-y", "harmless", process=True)
    assert third.returncode == 0, third.stderr
    assert llm.requests[-1]["model"] == "gpt-4.1-mini"


def test_a_dotenv_expands_nothing_from_the_environment(cli, llm, isolated):
    """Break 4: ${OPENAI_API_KEY} in a .env became the work directory (and the trust record's key)."""
    (isolated.work / ".env").write_text("MINIAGI_WORKDIR=./w-${OPENAI_API_KEY}\n")
    llm.add(act("execute_shell", "pwd"), act("done", "ok"))
    proc = cli("-y", "--json", "where am I", process=True)
    assert proc.returncode == 0, proc.stderr
    assert (isolated.work / "w-${OPENAI_API_KEY}").is_dir()
    seen = json.dumps(llm.requests) + proc.stdout + proc.stderr
    assert "sk-test-key-123456" not in seen and "w-${OPENAI_API_KEY}" in seen
    for record in (isolated.work.parent / "user-home" / ".miniagi").rglob("*.json"):
        assert "sk-test-key-123456" not in record.read_text()


def test_another_home_does_not_sidestep_the_trust_of_a_dotenv(cli, llm, isolated, tmp_path):
    dotenv = isolated.work / ".env"
    dotenv.write_text("MINIAGI_MAX_COST=1\n")
    llm.add(act("done", "first"))
    assert cli("-y", "first", process=True).returncode == 0  # a .env never used: taken as it is, remembered
    dotenv.write_text("MINIAGI_MAX_COST=0\n")  # no limit at all: as code of some run could have written
    for home in (str(isolated.home), str(tmp_path / "another-home")):
        proc = cli("-y", "--home", home, "next", process=True)
        assert proc.returncode == 2 and "MINIAGI_MAX_COST=0" in proc.stderr, proc.stderr
    assert len(llm.requests) == 1


def test_a_linked_dotenv_is_judged_by_what_it_points_to(cli, llm, isolated, tmp_path):
    kept, other = tmp_path / "kept", tmp_path / "other"
    kept.mkdir(), other.mkdir()
    (kept / "env").write_text("MINIAGI_MAX_COST=1\n")
    (other / "env").write_text("MINIAGI_MAX_COST=1\n")
    link = isolated.work / ".env"
    link.symlink_to(kept / "env")
    llm.add(act("done", "first"))
    assert cli("-y", "first", process=True).returncode == 0
    link.unlink()
    link.symlink_to(other / "env")  # the link swapped for one to another file
    proc = cli("-y", "next", process=True)
    assert proc.returncode == 2 and str(other / "env") in proc.stderr, proc.stderr
    link.unlink()
    link.symlink_to(kept / "env")  # back to what was trusted
    llm.add(act("done", "again"))
    assert cli("-y", "again", process=True).returncode == 0


# --- journals: what a short run left for the store, taken as what it is ----------------------------------------------
def test_a_journal_is_split_on_newlines_only_redacted_again_and_kept_to_its_runs_work_directory(cli, llm, isolated):
    from .conftest import MEMORY_ON, run_dirs

    llm.add(act("done", "ok"))
    assert cli("-y", "remember this", env=MEMORY_ON, process=True).returncode == 0
    (run,) = run_dirs(isolated.home)
    journal = isolated.home / "memory" / "journal"
    journal.mkdir(parents=True, exist_ok=True)

    def item(id_, text, run_id=run.name, workdir=str(isolated.work)):
        return json.dumps({"id": id_, "text": text, "run": run_id, "kind": "note", "step": 1, "source": "",
                           "key": "", "workdir": workdir, "at": 1.0}, ensure_ascii=False)

    (journal / "1.000000-1-abcdef01.jsonl").write_text("\n".join([
        item("j-sep", "zebra note one\u2028zebra still note one"),
        item("j-key", "zebra: the key is sk-test-key-123456"),
        item("j-far", "zebra planted elsewhere", workdir="/elsewhere"),
        item("j-none", "zebra from no run", run_id="20990101-000000-abcdef"),
        item("j-path", "zebra from a path", run_id="../../etc"),
        '["zebra", "not an item"]', "", item("j-torn", "zebra torn by a crash")[:40]]) + "\n", encoding="utf-8")
    proc = cli("memory", "search", "zebra", "--all", "--json", "--limit", "20", env=MEMORY_ON, process=True)
    assert proc.returncode == 0, proc.stderr
    hits = {hit["id"]: hit for hit in json.loads(proc.stdout)}
    assert hits["j-sep"]["text"] == "zebra note one\u2028zebra still note one"  # one item, whole
    assert hits["j-far"]["workdir"] == str(isolated.work)  # its run's own, not what it claimed
    assert "j-none" not in hits and "j-path" not in hits and "j-key" in hits
    assert not any("torn" in hit["text"] or "not an item" in hit["text"] for hit in hits.values())  # skipped
    for path in (isolated.home / "memory").rglob("*"):
        assert not path.is_file() or b"sk-test-key-123456" not in path.read_bytes(), path  # stored redacted


# --- the UI: run files read bounded, off the event loop; its views store nothing ----------------------------------
@pytest.fixture
def ui_process(isolated):
    """`miniagi ui` as a process of its own, over the test's home."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "ui", "--port", str(port)], cwd=isolated.work,
                               env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    printed = process.stderr.readline().decode()  # its URL, with the token every request needs
    url = test_ui.Served(f"http://127.0.0.1:{port}")
    url.client = httpx.Client(headers={"Authorization": f"Bearer {printed.split('?token=', 1)[1].split()[0]}"})
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.stderr.read().decode()
        try:
            httpx.get(url + "/static/", timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the UI did not start"
            time.sleep(0.05)
    yield url
    url.client.close()
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_a_fifo_a_huge_file_or_a_broken_line_in_a_run_folder_never_hangs_a_ui_page(cli, llm, isolated, ui_process):
    import os

    from .conftest import run_dirs

    llm.add(act("done", "a real answer"))
    assert cli("-y", "A real run", process=True).returncode == 0
    (real,) = run_dirs(isolated.home)
    runs = isolated.home / "runs"
    bad = {name: runs / name for name in ("20200101-000000-00000a", "20200101-000000-00000b",
                                          "20200101-000000-00000c", "20200101-000000-00000d")}
    for folder in bad.values():
        folder.mkdir()
    start = (real / "trace.jsonl").read_text().split("\n")[0]
    os.mkfifo(bad["20200101-000000-00000a"] / "result.json")  # a FIFO as result.json
    os.mkfifo(bad["20200101-000000-00000b"] / "trace.jsonl")  # …as trace.jsonl
    (bad["20200101-000000-00000b"] / "result.json").write_text((real / "result.json").read_text())
    with open(bad["20200101-000000-00000c"] / "trace.jsonl", "wb") as huge:  # 2 GB (sparse)
        huge.write(start.encode() + b"\n")
        huge.truncate(2 * 2**30)
    (bad["20200101-000000-00000d"] / "trace.jsonl").write_text(start + "\n{broken\n[1, 2]\n\"text\"\n")
    for path in ["/", "/api/runs", f"/runs/{real.name}", *(f"/runs/{name}" for name in bad),
                 *(f"/runs/{name}/events?after=0" for name in bad)]:
        response = ui_process.client.get(ui_process + path, timeout=30)
        assert response.status_code in (200, 404), (path, response.status_code)
    assert "A real run" in ui_process.client.get(ui_process + "/", timeout=30).text
    assert real.name in ui_process.client.get(ui_process + "/api/runs", timeout=30).text


def test_the_memory_page_stores_no_journal(cli, llm, isolated, ui_process):
    from .conftest import MEMORY_ON, run_dirs

    llm.add(act("memorize_thoughts", "The rocket is painted PURPLE."), act("done", "noted"))
    assert cli("-y", "remember the rocket", env=MEMORY_ON, process=True).returncode == 0
    # a first run in a new home journals its items (no model loaded for it); a memory command stores them
    assert cli("memory", "stats", env=MEMORY_ON).returncode == 0
    (run,) = run_dirs(isolated.home)
    journal = isolated.home / "memory" / "journal"
    journal.mkdir(exist_ok=True)
    waiting = journal / "1.000000-1-abcdef01.jsonl"
    waiting.write_text(json.dumps({"id": "j-1", "text": "The rocket launches at dawn.", "run": run.name,
                                   "kind": "note", "step": 1, "source": "", "key": "", "workdir": str(isolated.work),
                                   "at": 1.0}) + "\n")
    page = ui_process.client.get(ui_process + "/memory", params={"q": "rocket"}, timeout=120).text
    assert "PURPLE" in page  # the store was searched…
    assert waiting.read_text().startswith('{"id": "j-1"')  # …and the waiting journal left for a run to store
    assert "launches at dawn" not in page


# --- a SOCKS proxy ------------------------------------------------------------------------------------------------
def test_a_socks_proxy_is_used_or_said_in_one_line_never_a_traceback(cli, llm, isolated, tmp_path):
    from .conftest import one_line

    llm.add(act("done", "never reached"))
    through = cli("-y", "hi", env={"ALL_PROXY": "socks5://127.0.0.1:1"}, process=True)
    assert through.returncode == 2 and "Traceback" not in through.stderr, through.stderr
    assert "cannot reach" in through.stderr.strip().splitlines()[-1] and llm.requests == []  # the proxy is used
    blocked = tmp_path / "no-socksio" / "socksio"  # an installation without socksio
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('socksio is not installed here')\n")
    import os

    path = f"{blocked.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    for proxy, said in (("socks5://127.0.0.1:1", "httpx[socks]"), ("socks4://127.0.0.1:1", "socks4")):
        proc = cli("-y", "hi", env={"all_proxy": proxy, "PYTHONPATH": path}, process=True)
        assert proc.returncode == 2 and one_line(proc.stderr) and said in proc.stderr, (proxy, proc.stderr)
    assert llm.requests == []


def test_run_files_are_never_written_through_a_link(tmp_path):
    from miniagi.run_store import RunRecord

    target = tmp_path / "bashrc"
    target.write_text("# the user's own\n")
    folder = tmp_path / "runs" / "20200101-000000-00000a"
    folder.mkdir(parents=True)
    (folder / "result.json").symlink_to(target)
    (folder / "result.json.tmp").symlink_to(target)  # the old fixed temporary name
    record = RunRecord(folder)
    record.write_result({"status": "done"})
    assert target.read_text() == "# the user's own\n" and not (folder / "result.json").is_symlink()
    assert record.read_result() == {"status": "done"}
    (folder / "trace.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        record.append({"type": "run_start"})
    assert target.read_text() == "# the user's own\n"


def test_a_dotenv_code_wrote_in_a_folder_of_its_work_directory_is_not_trusted_as_new(cli, llm, isolated):
    """Only the work directory's own .env was remembered: code made app/.env (an endpoint of its choosing, the
    user's home as work directory), and a later plain run in app/ took it as a file never used and sent the key
    there. Now a .env in or below a folder code has run in needs the user's yes like one that changed."""
    from .fake_llm import FakeLLM

    user_home, bashrc = _user_home(isolated)
    with FakeLLM() as attacker:
        planted = f"OPENAI_BASE_URL={attacker.url}\\nMINIAGI_WORKDIR={user_home}\\n"
        llm.add(act("execute_shell", f"mkdir -p app && printf '{planted}' > app/.env"), act("done", "made"))
        first = cli("-y", "--sandbox", "bwrap", "make an app", process=True)
        assert first.returncode == 0 and (isolated.work / "app" / ".env").is_file(), first.stderr
        attacker.add(act("execute_shell", f"echo pwned >> {bashrc}"), act("done", "never"))
        second = cli("-y", "work on the app", process=True, cwd=isolated.work / "app", env={"OPENAI_BASE_URL": None})
        assert second.returncode == 2 and "OPENAI_BASE_URL" in second.stderr, second.stderr
        assert "MINIAGI_WORKDIR" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert attacker.requests == [] and bashrc.read_text() == "# the user's own\n"
    # a folder no code has run in: a .env there is still taken as it is, the first time
    fresh = isolated.work.parent / "fresh"
    fresh.mkdir()
    (fresh / ".env").write_text("MINIAGI_MAX_STEPS=7\n")
    llm.add(act("done", "fine"))
    assert cli("-y", "fresh", process=True, cwd=fresh).returncode == 0


# --- modules code planted in the work directory ---------------------------------------------------------------------
@pytest.mark.parametrize("pythonpath", ["as given", "with an empty element"])
def test_python_m_miniagi_in_a_work_directory_does_not_import_modules_planted_there(cli, llm, isolated, pythonpath):
    """Code the agent ran can write `memory/` or `json.py` into its work directory; started as `python -m miniagi`
    there, Python puts that directory first on sys.path (and an empty PYTHONPATH element, as `export
    PYTHONPATH=$PYTHONPATH:/x` leaves, puts it in too), and they would run as the user, outside the sandbox."""
    import os
    marker = isolated.work / "planted-ran"
    for planted in ("memory/__init__.py", "json.py", "rich/__init__.py"):
        path = isolated.work / planted
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"open({str(marker)!r}, 'a').write({planted!r})\nraise SystemExit('planted {planted} ran')\n")
    llm.add(act("memorize_thoughts", "the launch code is RED-1"), act("done", "noted"))
    env = {} if pythonpath == "as given" else {"PYTHONPATH": os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = cli("-y", "note the code", process=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists() and "planted" not in proc.stderr
    assert len(llm.requests) == 2  # the run went through the memory and the JSON of the real modules
