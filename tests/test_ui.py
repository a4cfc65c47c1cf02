"""`miniagi ui`: the HTTP endpoints with a real server on 127.0.0.1, over runs the suite makes; and what a person
sees in a real headless Chromium (the system's, driven by Selenium)."""

from __future__ import annotations

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


@pytest.fixture
def ui(isolated):
    """The web app over the test's MINIAGI_HOME, served by uvicorn on 127.0.0.1."""
    import uvicorn

    from miniagi.webui.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(isolated.home), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the UI server did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join()


def make_run(cli, llm, objective="Count the files", thought=f"look at {HOSTILE} first", env=None):
    llm.add(act("execute_python", "print('observed-' * 3)", thought), act("done", "There are 3 files."))
    proc = cli("-y", "--unattended", objective, env=env)
    assert proc.returncode == 0, proc.stderr


def test_the_endpoints_list_show_and_follow_runs(cli, llm, isolated, ui):
    make_run(cli, llm)
    llm.add(act("done", "other"))
    assert cli("-y", "--unattended", "Another objective entirely").returncode == 0
    first, second = run_dirs(isolated.home)
    listing = httpx.get(ui + "/").text
    assert first.name in listing and "Count the files" in listing and "Another objective entirely" in listing
    filtered = httpx.get(ui + "/", params={"q": "another"}).text
    assert second.name in filtered and first.name not in filtered
    assert first.name not in httpx.get(ui + "/", params={"status": "error"}).text
    page = httpx.get(f"{ui}/runs/{first.name}").text
    assert "observed-observed-observed-" in page and "There are 3 files." in page and "execute_python" in page
    assert HOSTILE not in page and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page  # shown as text
    assert "<svg" in page  # the tokens / cost chart
    assert page.count(" tokens/s") == 2  # each streamed reply's speed
    events = httpx.get(f"{ui}/runs/{first.name}/events", params={"after": 2}).json()
    total = len((first / "trace.jsonl").read_text().strip().split("\n"))
    assert events["count"] == total and events["status"] == "done" and HOSTILE not in events["html"]
    assert httpx.get(f"{ui}/runs/no-such-run").status_code == 200 and "no run" in httpx.get(f"{ui}/runs/x").text
    assert [r["run_id"] for r in httpx.get(ui + "/api/runs").json()] == [second.name, first.name]


def test_the_batch_and_memory_pages(cli, llm, isolated, ui, tmp_path):
    make_run(cli, llm, env=MEMORY_ON)
    (run,) = run_dirs(isolated.home)
    results = tmp_path / "jobs-txt-results" / "results.jsonl"
    results.parent.mkdir()
    results.write_text(json.dumps({"id": "1", "objective": "Count the files", "status": "done", "run_id": run.name,
                                   "cost_usd": 0.01}) + "\n"
                       + json.dumps({"id": "2", "objective": f"bad {HOSTILE}", "status": "error"}) + "\n")
    page = httpx.get(ui + "/batch", params={"file": str(results.parent)}).text
    assert "2 objectives" in page and f'href="/runs/{run.name}"' in page and HOSTILE not in page
    assert "1 done" in page and "1 error" in page
    memory = httpx.get(ui + "/memory", params={"q": "how many files are there"}, timeout=60).text
    assert "There are 3 files." in memory and f'href="/runs/{run.name}"' in memory  # each hit says where it is from
    assert HOSTILE not in memory


def test_ui_warns_when_it_listens_beyond_this_machine(cli):
    with socket.socket() as taken:  # a port in use: the server cannot start, so the command ends at once
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        proc = cli("ui", "--host", "0.0.0.0", "--port", str(taken.getsockname()[1]), timeout=60)
    assert "anyone who can reach this machine" in proc.stderr and proc.returncode != 0


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
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(None, 60, poll_frequency=0.1).until(lambda _: condition(), message=what)


def test_in_a_browser_a_running_run_gains_steps_without_reloading(cli, llm, isolated, ui, browser, tmp_path):
    from selenium.webdriver.common.by import By

    gate = threading.Event()
    asked = []

    def hold_the_second_step(request):
        asked.append(1)
        if len(asked) == 2:
            gate.wait(120)
        return None

    llm.responder = hold_the_second_step
    llm.add(act("execute_python", "print('first-step-output')", f"start with {HOSTILE}"),
            act("execute_shell", "echo second-step-output"), act("done", "finished"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "--unattended", "Watch me work"],
                               cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(asked) >= 2, "the run reaches its second step")
        (run,) = run_dirs(isolated.home)

        browser.get(ui + "/")
        link = browser.find_element(By.LINK_TEXT, run.name)
        assert "running" in browser.find_element(By.ID, "runs").text
        link.click()
        wait_for(lambda: "first-step-output" in browser.find_element(By.ID, "events").text, "step 1 shown")
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
