"""`miniagi ui`: the HTTP endpoints with a real server on 127.0.0.1, over runs the suite makes; and what a person
sees in a real headless Chromium (the system's, driven by Selenium)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from .conftest import MEMORY_ON, act, run_dirs

HOSTILE = "<script>window.pwned=1</script>"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Served(str):
    """The UI's address; `.token` its token, `.client` an HTTP client that holds it (as a cookie), `.app` the app."""

    token: str
    client: httpx.Client
    app: object


@contextlib.contextmanager
def serve_ui(home, **options):
    """The web app over `home`, served by uvicorn on 127.0.0.1 (`options` go to create_app)."""
    import uvicorn

    from miniagi.webui.app import create_app

    port = free_port()
    app = create_app(home, **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the UI server did not start")
        time.sleep(0.02)
    url = Served(f"http://127.0.0.1:{port}")
    url.token, url.app = app.token, app
    with httpx.Client(timeout=60, follow_redirects=True) as client:
        assert client.get(f"{url}/?token={app.token}").status_code == 200  # the URL it prints: sets the cookie
        url.client = client
        try:
            yield url
        finally:
            server.should_exit = True
            thread.join()
            app.workbench.close()


@pytest.fixture
def ui(isolated):
    with serve_ui(isolated.home) as url:
        yield url


def make_run(cli, llm, objective="Count the files", thought=f"look at {HOSTILE} first", env=None):
    llm.add(act("execute_python", "print('observed-' * 3)", thought), act("done", "There are 3 files."))
    proc = cli("-y", "--unattended", objective, env=env)
    assert proc.returncode == 0, proc.stderr


def test_the_endpoints_list_show_and_follow_runs(cli, llm, isolated, ui):
    make_run(cli, llm)
    llm.add(act("done", "other"))
    assert cli("-y", "--unattended", "Another objective entirely").returncode == 0
    first, second = run_dirs(isolated.home)
    listing = ui.client.get(ui + "/").text
    assert first.name in listing and "Count the files" in listing and "Another objective entirely" in listing
    filtered = ui.client.get(ui + "/", params={"q": "another"}).text
    assert second.name in filtered and first.name not in filtered
    assert first.name not in ui.client.get(ui + "/", params={"status": "error"}).text
    page = ui.client.get(f"{ui}/runs/{first.name}").text
    assert "observed-observed-observed-" in page and "There are 3 files." in page and "execute_python" in page
    assert HOSTILE not in page and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page  # shown as text
    assert "<svg" in page  # the tokens / cost chart
    assert page.count("first token ") == 2  # each streamed reply's wait for its first token…
    assert " tokens/s" not in page  # …and no rate from a reply the fake server sends at once: it would mean nothing
    events = ui.client.get(f"{ui}/runs/{first.name}/events", params={"after": 2}).json()
    total = len((first / "trace.jsonl").read_text().strip().split("\n"))
    assert events["count"] == total and events["status"] == "done" and HOSTILE not in events["html"]
    missing = ui.client.get(f"{ui}/runs/no-such-run")
    assert missing.status_code == 404 and "no run" in missing.text  # honest: not a 200 that says so
    for malformed in ("..%2F..", "a%20b", "%2E%2E"):
        assert ui.client.get(f"{ui}/runs/{malformed}").status_code == 404
    assert [r["run_id"] for r in ui.client.get(ui + "/api/runs").json()] == [second.name, first.name]
    # where, when, how long: the list and the page say the folder, the start (local time) and the duration
    result = json.loads((first / "result.json").read_text())
    from miniagi.report import started, took
    row = listing[listing.index(first.name):].split("</tr>")[0]
    assert f'<td class="folder">{isolated.work}</td>' in row and started(result) in row
    assert f'<td class="took">{took(result)}</td>' in row and took(result).endswith(" s")
    assert f'folder <span class="folder">{isolated.work}</span>' in page and f"started {started(result)}" in page
    assert f'took <span class="took">{took(result)}</span>' in page and "running for" not in page


def test_the_batch_and_memory_pages(cli, llm, isolated, ui, tmp_path):
    from miniagi.batch_report import register_batch

    make_run(cli, llm, env=MEMORY_ON)
    cli("memory", "stats", env=MEMORY_ON)  # a first run in a new home journals its items; a memory command stores them
    (run,) = run_dirs(isolated.home)
    results = tmp_path / "jobs-jsonl-results" / "results.jsonl"
    results.parent.mkdir()
    first = [{"id": "1", "objective": "Count the files", "status": "error", "message": "endpoint down"},
             {"id": "2", "objective": f"bad {HOSTILE}", "status": "error", "message": f"it said {HOSTILE}"},
             {"id": "3", "objective": "Write a file", "status": "done", "run_id": run.name, "cost_usd": 0.01,
              "steps": 2, "check": "fail", "check_output": "AssertionError: nothing written"}]
    rerun = [{**first[0], "status": "done", "run_id": run.name, "cost_usd": 0.01, "steps": 4, "answer": "3 files",
              "message": ""},
             {**first[2], "check": "pass", "check_output": "", "steps": 2}]
    results.write_text("".join(json.dumps(r) + "\n" for r in first + rerun) + "{torn by a cra")
    register_batch(isolated.home, tmp_path / "jobs.jsonl", results, 3, 1)
    listing = ui.client.get(ui + "/batch").text  # the batches this home ran
    assert str(tmp_path / "jobs.jsonl") in listing and "2/3" in listing and "67%" in listing
    (key,) = [p.stem for p in (isolated.home / "batches").glob("*.json")]
    page = ui.client.get(f"{ui}/batch/{key}").text
    assert "3 objectives: 2/3 done · 2/3 passed (67%)" in page  # each id's latest result, not every line
    assert f'href="/runs/{run.name}"' in page and "3 files" in page and "endpoint down" not in page
    assert "it said" in page and HOSTILE not in page and "nothing written" not in page  # the message, escaped
    # the pages take no path from the request: only recorded batches, and only a results.jsonl
    (isolated.home / "batches" / "0123456789ab.json").write_text(json.dumps({"results": "/etc/passwd"}))
    assert "root:" not in ui.client.get(f"{ui}/batch/0123456789ab").text
    assert "not a batch" in ui.client.get(f"{ui}/batch/0123456789ab").text
    assert "root:" not in ui.client.get(f"{ui}/batch/..%2F..%2Fetc%2Fpasswd").text
    assert "no batch" in ui.client.get(f"{ui}/batch/{'f' * 12}").text
    assert "root:" not in ui.client.get(f"{ui}/batch", params={"file": "/etc/passwd"}).text  # the old way: ignored
    memory = ui.client.get(ui + "/memory", params={"q": "how many files are there"}, timeout=60).text
    assert "There are 3 files." in memory and f'href="/runs/{run.name}"' in memory  # each hit says where it is from
    assert HOSTILE not in memory


@pytest.mark.own_network  # it listens on every interface: here loopback is the only one
def test_ui_warns_when_it_listens_beyond_this_machine(cli):
    with socket.socket() as taken:  # a port in use: the server cannot start, so the command ends at once
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        proc = cli("ui", "--host", "0.0.0.0", "--port", str(taken.getsockname()[1]), timeout=60)
    assert "anyone who can reach this machine" in proc.stderr and proc.returncode == 2
    assert "has the URL" in proc.stderr and "run code" in proc.stderr  # the UI starts runs


def hold_the_second_request(llm) -> tuple[threading.Event, list]:
    """The model's second request waits (the run is held at step 2) until the event returned is set; the list
    grows by one item a request."""
    gate, asked = threading.Event(), []

    def hold(request):
        asked.append(1)
        if len(asked) == 2:
            gate.wait(120)
        return None

    llm.responder = hold
    return gate, asked


def test_a_running_runs_header_counts_the_steps_and_cost_shown_below(llm, isolated, ui):
    """The run saves its result when a step ends; the header counts what the trace already holds."""
    gate, asked = hold_the_second_request(llm)
    llm.add(act("execute_python", "print('first-step-output')"), act("done", "finished"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off",
               MINIAGI_MODEL="gpt-4o-mini")  # a priced model: the cost is not 0
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "--unattended", "Watch the header"],
                               cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(asked) < 2 or not run_dirs(isolated.home):
            assert time.monotonic() < deadline and process.poll() is None, "the run reaches its second step"
            time.sleep(0.05)
        (run,) = run_dirs(isolated.home)
        while "first-step-output" not in (run / "trace.jsonl").read_text():
            assert time.monotonic() < deadline, "step 1 observed"
            time.sleep(0.05)
        calls = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
        cost = sum(c.get("cost_usd", 0) for c in calls if c.get("type") == "llm_call")
        assert cost > 0
        page = ui.client.get(f"{ui}/runs/{run.name}").text
        polled = ui.client.get(f"{ui}/runs/{run.name}/events", params={"after": 0}).json()
        assert polled["status"] == "running"
        for header in (page, polled["meta"]):
            assert '<span id="steps">1 step</span>' in header and "1 model call" in header
            assert f'<span id="cost">${cost:.4f}</span>' in header
            assert f'folder <span class="folder">{isolated.work}</span>' in header and "running for" in header
        listing = ui.client.get(ui + "/").text
        assert f'<td class="folder">{isolated.work}</td>' in listing
    finally:
        gate.set()
        process.wait(timeout=120)
    assert process.returncode == 0, process.stderr.read()
    polled = ui.client.get(f"{ui}/runs/{run.name}/events", params={"after": 0}).json()
    assert '<span id="steps">2 steps</span>' in polled["meta"] and "took" in polled["meta"]


# --- a real browser -------------------------------------------------------------------------------------------
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium/chromedriver: apt-get install chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1600"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def wait_for(condition, what: str):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a live page swaps parts of itself: an element found a moment ago may be gone; look again
    return WebDriverWait(None, 60, poll_frequency=0.1, ignored_exceptions=(
        StaleElementReferenceException, NoSuchElementException)).until(lambda _: condition(), message=what)


def test_in_a_browser_a_running_run_gains_steps_without_reloading(cli, llm, isolated, ui, browser, tmp_path):
    from selenium.webdriver.common.by import By

    gate, asked = hold_the_second_request(llm)
    llm.add(act("execute_python", "print('first-step-output')", f"start with {HOSTILE}"),
            act("execute_shell", "echo second-step-output"), act("done", "finished"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "--unattended", "Watch me work"],
                               cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(asked) >= 2, "the run reaches its second step")
        (run,) = run_dirs(isolated.home)

        browser.get(f"{ui}/?token={ui.token}")
        link = browser.find_element(By.LINK_TEXT, run.name)
        assert "running" in browser.find_element(By.ID, "runs").text
        link.click()
        wait_for(lambda: "first-step-output" in browser.find_element(By.ID, "events").text, "step 1 shown")
        wait_for(lambda: browser.find_element(By.ID, "steps").text == "1 step", "the header counts step 1")
        text = browser.find_element(By.ID, "events").text
        assert f"start with {HOSTILE}" in text  # the reply's script is text on the page…
        assert browser.execute_script("return window.pwned === undefined")  # …and did not run
        browser.execute_script("window.stillTheSamePage = true")
        gate.set()
        wait_for(lambda: "second-step-output" in browser.find_element(By.ID, "events").text, "step 2 appears live")
        wait_for(lambda: browser.find_element(By.ID, "status").text == "done", "the run is shown done")
        assert browser.execute_script("return window.stillTheSamePage === true")  # no reload happened
        assert browser.execute_script("return window.pwned === undefined")
        browser.save_screenshot(str(tmp_path / "run-page.png"))
        if os.environ.get("UI_SCREENSHOT"):
            shutil.copy(tmp_path / "run-page.png", os.environ["UI_SCREENSHOT"])
    finally:
        gate.set()
        process.wait(timeout=120)
