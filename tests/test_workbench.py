"""`miniagi ui` as a workbench, in a real headless Chromium: start a run, approve a command and refuse another with
feedback, answer a question, follow up, stop and resume, a chat that keeps its Python; and the lock (token, cookie,
cross-origin POSTs). Each run the page starts is a real `python -m miniagi` process against the fake model.

With MINIAGI_SCREENSHOTS=1 the browser's screenshots are saved into docs/img/ (workbench-*.png)."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from miniagi.config import forget_dotenv

from . import test_ui
from .conftest import act, run_dirs
from .fake_llm import Hang, Stream
from .test_ui import free_port, serve_ui, wait_for

browser = test_ui.browser  # the suite's headless Chromium (a fixture)

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
SCREENSHOTS = os.environ.get("MINIAGI_SCREENSHOTS")  # read now: the tests' own environment has no MINIAGI_ names


def shot(driver, name: str) -> None:
    if SCREENSHOTS:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        # a run's page: its controls (the question, Stop, follow up) in view, at the bottom of the window
        driver.execute_script("const c = document.getElementById('control'); "
                              "if (c && c.innerText.trim()) c.scrollIntoView({block: 'end'})")
        driver.save_screenshot(str(DOCS_IMG / f"workbench-{name}.png"))


@pytest.fixture
def bench(isolated, llm):
    """The UI over the test's home, allowed to start runs in its work folder, against the fake model."""
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    with serve_ui(isolated.home, workdirs=[isolated.work], environ=env) as url:
        yield url


def button(driver, label: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.XPATH, f"//button[normalize-space()='{label}']")


def present(driver, xpath: str) -> bool:
    from selenium.webdriver.common.by import By

    return bool(driver.find_elements(By.XPATH, xpath))


def text_of(driver, element_id: str) -> str:
    """An element's text as shown, read in one go (the live page replaces parts of itself as it polls)."""
    return driver.execute_script("const e = document.getElementById(arguments[0]); return e ? e.innerText : ''",
                                 element_id)


def main_text(driver) -> str:
    """The page's <main> text, read in one go like text_of (a page may be replaced between finding and reading)."""
    return driver.execute_script("const e = document.querySelector('main'); return e ? e.innerText : ''")


def events_text(driver) -> str:
    return text_of(driver, "events")


def status(driver) -> str:
    return text_of(driver, "status")


def on_run_page(driver) -> str:
    """The run id of the page the browser is on, once it is a run's page."""
    def run_id() -> str:
        url = driver.current_url  # read once: the browser may be moving on
        return url.rsplit("/runs/", 1)[1] if "/runs/" in url else ""

    return wait_for(run_id, "the page moves on to the run")


def type_into(driver, name: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.NAME, name)
    field.clear()
    field.send_keys(text)


def start(driver, url, objective: str, *, yes: bool = False, chat: bool = False, screenshot: str = "") -> str:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/")
    type_into(driver, "objective", objective)
    for name, on in (("yes", yes), ("chat", chat)):
        if on:
            driver.find_element(By.CSS_SELECTOR, f"form#start input[name={name}]").click()
    if screenshot:
        shot(driver, screenshot)
    button(driver, "Start").click()
    return on_run_page(driver)


def prompts(llm) -> str:
    return json.dumps(llm.agent_requests())


def test_in_a_browser_start_approve_refuse_answer_and_follow_up(cli, llm, isolated, bench, browser):
    from selenium.webdriver.common.by import By

    llm.add(Stream(["<r>First I will ", "look at the folder", Hang(3), " with a shell command</r>",
                    "<c>execute_shell</c>\necho approved-output"]),
            act("execute_shell", "rm -rf precious", "then clean up"),
            act("talk_to_user", "Which colour should the report be?"),
            act("done", "A blue report."))
    browser.get(f"{bench}/?token={bench.token}")  # the URL `miniagi ui` prints
    assert "?token" not in browser.current_url  # the token leaves the address bar (it is a cookie now)
    assert browser.find_element(By.NAME, "objective").tag_name == "textarea"
    browser.set_window_size(1100, 1000)
    run_id = start(browser, bench, "Make a report", screenshot="start")
    # the thought shows as it streams in, before the step is complete
    wait_for(lambda: "look at the folder" in text_of(browser, "stream"), "the reply streams in")
    wait_for(lambda: present(browser, "//button[normalize-space()='Approve']"), "the first command waits")
    assert "echo approved-output" in text_of(browser, "control")
    assert not (isolated.work / "approved").exists()
    shot(browser, "approve")
    button(browser, "Approve").click()
    wait_for(lambda: "approved-output" in events_text(browser), "the approved command ran")
    wait_for(lambda: "rm -rf precious" in text_of(browser, "control"), "the second command waits")
    type_into(browser, "feedback", "never delete anything; list it instead")
    button(browser, "Refuse").click()
    wait_for(lambda: present(browser, "//textarea[@name='answer']"), "the question waits for an answer")
    # the question is shown once: in the step that asks it, the form under it answers it
    assert "Which colour should the report be?" in events_text(browser)
    assert main_text(browser).count("Which colour should the report be?") == 1
    assert "The user did not run this command and said: never delete anything; list it instead" in events_text(browser)
    shot(browser, "question")
    type_into(browser, "answer", "blue, please")
    button(browser, "Answer").click()
    wait_for(lambda: status(browser) == "done", "the run ends")
    assert "The user replied: blue, please" in events_text(browser)
    wait_for(lambda: "A blue report." in text_of(browser, "answer"), "the answer is shown")
    assert "approved-output" in prompts(llm) and "never delete anything" in prompts(llm)

    # a finished run can be followed up: a new run with the first in context
    wait_for(lambda: present(browser, "//textarea[@name='followup']"), "a finished run offers a follow-up")
    shot(browser, "done")
    llm.add(act("done", "Also a green one."))
    type_into(browser, "followup", "Now a green one too")
    button(browser, "Follow up").click()
    wait_for(lambda: "/runs/" in browser.current_url and not browser.current_url.endswith(run_id),
             "the follow-up's own page")
    second = on_run_page(browser)
    wait_for(lambda: status(browser) == "done", "the follow-up ends")
    assert f"follows {run_id}" in events_text(browser)
    assert "Make a report" in json.dumps(llm.agent_requests()[-1])  # the first run is in its context
    # ordinary runs: the terminal's commands see them
    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json").stdout)}
    assert listed[run_id]["status"] == "done" and listed[second]["answer"] == "Also a green one."
    assert "approved-output" in cli("show", run_id).stdout
    browser.get(f"{bench}/")
    shot(browser, "runs")


def test_in_a_browser_stop_and_resume(llm, isolated, bench, browser):
    llm.add(act("execute_python", "open('stopped-here', 'w').write('x')", "write a file"))
    browser.set_window_size(1100, 1000)
    browser.get(f"{bench}/?token={bench.token}")
    run_id = start(browser, bench, "Write two files")
    wait_for(lambda: present(browser, "//button[normalize-space()='Approve']"), "the command waits")
    button(browser, "Stop").click()  # Ctrl-C while it waits: nothing ran, the state is saved
    wait_for(lambda: status(browser) == "interrupted", "the run is stopped")
    wait_for(lambda: present(browser, "//button[normalize-space()='Resume']"), "a stopped run offers Resume")
    assert not (isolated.work / "stopped-here").exists()
    shot(browser, "stopped")
    llm.add(act("execute_python", "open('resumed-here', 'w').write('y')", "write it now"), act("done", "written"))
    browser.find_element("css selector", "form.resume-run input[name=yes]").click()  # run without asking
    button(browser, "Resume").click()
    wait_for(lambda: on_run_page(browser) == run_id and status(browser) == "done", "the same run resumes and ends")
    assert (isolated.work / "resumed-here").read_text() == "y"
    assert "resumed at" in events_text(browser)
    assert len(run_dirs(isolated.home)) == 1


def test_in_a_browser_a_chat_keeps_its_python_between_objectives(llm, isolated, bench, browser):
    llm.add(act("execute_python", "secret_number = 41", "keep a number"), act("done", "kept"))
    browser.get(f"{bench}/?token={bench.token}")
    first = start(browser, bench, "Keep the number 41", yes=True, chat=True)
    wait_for(lambda: status(browser) == "done" and present(browser, "//textarea[@name='followup']"),
             "the chat waits for its next objective")
    llm.add(act("execute_python", "print(secret_number + 1)", "use it"), act("done", "42"))
    type_into(browser, "followup", "Add one to the number")
    button(browser, "Send").click()
    wait_for(lambda: "/runs/" in browser.current_url and not browser.current_url.endswith(first),
             "the chat's next run")
    wait_for(lambda: status(browser) == "done", "the second objective ends")
    assert "42" in events_text(browser)  # the variable of the first objective was still defined
    assert f"follows {first}" in events_text(browser)
    browser.set_window_size(390, 1400)  # a phone-width window: nothing wider than the screen
    fits = "return document.documentElement.scrollWidth <= window.innerWidth + 1"
    assert browser.execute_script(fits)
    shot(browser, "phone")
    browser.get(f"{bench}/")  # the start form and the list too (a long work directory in the form)
    assert browser.execute_script(fits)
    shot(browser, "phone-start")


# --- the lock --------------------------------------------------------------------------------------------------
def test_without_the_token_nothing_is_answered(llm, isolated, bench):
    with httpx.Client(timeout=30) as stranger:  # no cookie: code in the sandbox reaching over loopback
        for path in ("/", "/api/runs", "/runs/x", "/runs/x/events", "/memory", "/batch", "/static/live.js",
                     "/sessions/x"):
            assert stranger.get(bench + path).status_code == 401, path
        assert stranger.post(bench + "/start", data={"objective": "rm -rf ~"}).status_code == 401
        assert stranger.get(f"{bench}/?token=wrong-token").status_code == 401
        assert stranger.get(bench + "/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        wrong_cookie = {"Cookie": f"miniagi_ui_{bench.rsplit(':', 1)[1]}=wrong"}
        assert stranger.get(bench + "/", headers=wrong_cookie).status_code == 401
        # a script may hold the token as a header: no cookie, so no form field is needed
        assert stranger.get(bench + "/api/runs", headers={"Authorization": f"Bearer {bench.token}"}).json() == []
    ours = bench.client  # holds the cookie: forged POSTs from another page are refused
    page = ours.get(bench + "/")  # and no other page may frame it (a decoy over the Approve button)
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    origin = {"Origin": bench}
    assert ours.post(bench + "/start", data={"objective": "x"}, headers=origin).status_code == 403  # no csrf field
    form = {"objective": "x", "csrf": bench.app.token and csrf(bench)}
    assert ours.post(bench + "/start", data=form, headers={"Origin": "http://evil.example"}).status_code == 403
    assert ours.post(bench + "/start", data=form, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert ours.post(bench + "/runs/x/stop", data=form, headers={"Origin": "http://127.0.0.1:1"}).status_code == 403
    assert not bench.app.workbench.sessions  # nothing was started
    assert ours.post(bench + "/start", data={**form, "objective": " "}, headers=origin).status_code == 400
    assert ours.post(bench + "/start", data={**form, "workdir": "/"}, headers=origin).status_code == 403
    assert ours.post(bench + "/runs/nosuch/stop", data=form, headers=origin).status_code == 404


def csrf(url) -> str:
    from miniagi.webui.auth import csrf_value

    return csrf_value(url.token)


def test_a_page_of_another_origin_cannot_start_a_run(isolated, bench, browser):
    """The browser holds the cookie; a page on another port of 127.0.0.1 (the same site) posts the start form."""
    forged = (f'<form id="f" method="post" action="{bench}/start"><input name="objective" value="rm -rf ~">'
              f'<input name="yes" value="1"><input name="csrf" value="guess"></form>'
              '<script>document.getElementById("f").submit()</script>').encode()

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(forged)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"{bench}/?token={bench.token}")  # the cookie is set
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait_for(lambda: browser.current_url.startswith(f"{bench}/start"), "the forged form was sent")
        assert "refused" in browser.page_source
        assert not bench.app.workbench.sessions and not run_dirs(isolated.home)
    finally:
        server.shutdown()
        server.server_close()


def test_executed_code_never_sees_the_token(llm, isolated, bench):
    llm.add(act("execute_shell", "env; cat /proc/$PPID/environ /proc/$PPID/cmdline 2>/dev/null | tr '\\0' '\\n'; "
                                 f"ls -R ~ 2>/dev/null | head -50; ls {isolated.home}/ui/* || echo no-control-files"),
            act("done", "looked"))
    started = httpx.post(bench + "/start", data={"objective": "look around", "yes": "1", "workdir": str(isolated.work)},
                         headers={"Authorization": f"Bearer {bench.token}"}, timeout=30)
    assert started.status_code == 303
    session = next(iter(bench.app.workbench.sessions.values()))
    session.process.wait(timeout=120)
    (run,) = run_dirs(isolated.home)
    assert json.loads((run / "result.json").read_text())["status"] == "done"
    (seen,) = [e["text"] for e in map(json.loads, (run / "trace.jsonl").read_text().splitlines())
               if e["type"] == "observation"]
    assert "PATH=" in seen  # the environment was printed…
    if json.loads((run / "result.json").read_text())["sandbox"] == "bwrap":  # the channel is out of code's reach
        assert "No such file or directory\nno-control-files" in seen and "stderr.txt" not in seen
    for place in (isolated.home, isolated.work):  # …and the token is in no file, nor in what code saw
        for path in place.rglob("*"):
            if path.is_file():
                assert bench.token not in path.read_text(errors="replace"), path


def test_the_command_prints_its_url_with_the_token(isolated, tmp_path):
    import re
    import signal
    import subprocess
    import sys

    port, other = free_port(), tmp_path / "other"
    other.mkdir()
    ui = subprocess.Popen([sys.executable, "-m", "miniagi", "ui", "--port", str(port), "--workdir", str(other)],
                          cwd=isolated.work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    try:
        line = ui.stderr.readline()
        found = re.search(rf"http://127\.0\.0\.1:{port}/\?token=([\w-]+)", line)
        assert found, line
        token = found.group(1)
        assert str(other) in ui.stderr.readline()  # the work directories runs may use
        assert httpx.get(f"http://127.0.0.1:{port}/api/runs").status_code == 401
        with httpx.Client(follow_redirects=True) as client:
            page = client.get(f"http://127.0.0.1:{port}/?token={token}")
            assert page.status_code == 200 and str(other) in page.text and "token" not in str(page.url)
        for place in (f"/proc/{ui.pid}/environ", f"/proc/{ui.pid}/cmdline"):  # what any process of the user reads
            assert token.encode() not in Path(place).read_bytes()
        assert not any(token in p.read_text(errors="replace") for p in isolated.home.rglob("*") if p.is_file())
    finally:
        ui.send_signal(signal.SIGINT)
        ui.wait(timeout=60)


def test_a_run_that_cannot_start_says_why(isolated, llm, bench):
    env_less = {**bench.app.workbench.environ}
    bench.app.workbench.environ = {k: v for k, v in env_less.items() if not k.startswith("OPENAI_")}
    # no endpoint: the page says so at once, and how to fix it; a start gives the form back as it was typed
    assert "miniagi setup" in bench.client.get(bench + "/").text
    form = {"objective": "anything at all", "csrf": csrf(bench), "model": "--yes"}  # an option-like value is a value
    refused = bench.client.post(bench + "/start", data=form, headers={"Origin": bench}, follow_redirects=False)
    assert refused.status_code == 409 and "OPENAI_API_KEY" in refused.text and "miniagi setup" in refused.text
    assert ">anything at all</textarea>" in refused.text and 'value="--yes"' in refused.text
    assert not bench.app.workbench.sessions
    # the user's own settings (`miniagi setup` writes them) are an endpoint to the page as they are to a run
    user_dotenv = Path(os.environ["HOME"]) / ".miniagi" / ".env"
    user_dotenv.parent.mkdir(parents=True, exist_ok=True)
    user_dotenv.write_text(f"OPENAI_BASE_URL={llm.url}\nMINIAGI_MODEL=set-up-model\n")
    forget_dotenv()
    try:
        page = bench.client.get(bench + "/").text
        assert "miniagi setup" not in page and "set-up-model" in page
    finally:
        user_dotenv.unlink()
        forget_dotenv()
    # a run whose process cannot start says why on its session's page
    bench.app.workbench.environ = {**env_less, "MINIAGI_MAX_STEPS": "many"}
    started = bench.client.post(bench + "/start", data=form, headers={"Origin": bench}, follow_redirects=False)
    assert started.status_code == 303
    session = next(iter(bench.app.workbench.sessions.values()))
    assert "--model=--yes" in session.process.args
    session.process.wait(timeout=60)
    page = bench.client.get(bench + started.headers["location"])
    assert "ended before starting a run (exit 2)" in page.text and "MINIAGI_MAX_STEPS" in page.text
    assert bench.client.get(bench + "/sessions/nosuch").status_code == 404
    for bad in ({"protocol": "xml"}, {"max_steps": "many"}):
        assert bench.client.post(bench + "/start", data={**form, **bad}, headers={"Origin": bench}).status_code == 400


def test_a_run_started_from_the_page_imports_nothing_of_its_work_directory(llm, isolated, bench):
    """The run's process starts in the work directory, where code may have written json.py: imported there, it
    would run outside the sandbox, as the user."""
    escaped = isolated.work.parent / "escaped.txt"
    (isolated.work / "json.py").write_text(f"open({str(escaped)!r}, 'w').write('outside')\nraise SystemExit(3)\n")
    llm.add(act("done", "fine"))
    form = {"objective": "say fine", "csrf": csrf(bench), "yes": "1"}
    started = bench.client.post(bench + "/start", data=form, headers={"Origin": bench}, follow_redirects=False)
    assert started.status_code == 303
    session = next(iter(bench.app.workbench.sessions.values()))
    assert session.process.wait(timeout=120) == 0
    assert not escaped.exists()


def test_a_changed_env_file_is_confirmed_in_the_page_before_the_run_starts(llm, isolated, bench):
    """The .env check asks before any run exists: the session's page asks it, then moves on to the run."""
    def started(objective: str):
        form = {"objective": objective, "csrf": csrf(bench), "yes": "1"}
        response = bench.client.post(bench + "/start", data=form, headers={"Origin": bench}, follow_redirects=False)
        assert response.status_code == 303
        return response.headers["location"], bench.app.workbench.sessions[response.headers["location"].split("/")[-1]]

    (isolated.work / ".env").write_text("MINIAGI_EXEC_TIMEOUT=30\n")
    llm.add(act("done", "first"))
    _, first = started("first")  # first sight of this .env: taken and remembered
    assert first.process.wait(timeout=120) == 0
    (isolated.work / ".env").write_text("MINIAGI_EXEC_TIMEOUT=600\n")  # raised since: asked about
    llm.add(act("done", "second"))
    where, second = started("second")
    wait_for(lambda: second.channel.question() is not None, "the session asks")
    page = bench.client.get(bench + where)
    assert "MINIAGI_EXEC_TIMEOUT" in page.text and ">Approve</button>" in page.text and not second.runs()
    qid = second.channel.question()["id"]
    answered = bench.client.post(f"{bench}/sessions/{second.id}/answer", headers={"Origin": bench},
                                 data={"csrf": csrf(bench), "qid": qid, "decision": "approve"})
    assert answered.status_code == 200
    assert second.process.wait(timeout=120) == 0
    assert bench.client.get(bench + where).url.path == f"/runs/{second.current()}"
    again = bench.client.post(f"{bench}/sessions/{second.id}/answer", headers={"Origin": bench},
                              data={"csrf": csrf(bench), "qid": qid, "decision": "approve"})
    assert again.status_code == 409  # answered already


def test_a_run_whose_ui_is_killed_stops_as_ctrl_c_does(llm, isolated, tmp_path):
    """Nobody is left to answer its approval: it does not wait forever, it ends interrupted, resumable."""
    import signal
    import subprocess
    import sys

    from miniagi.webui.control import Channel

    llm.add(act("execute_shell", "echo never"))
    control = isolated.home / "ui" / "orphan"
    control.mkdir(parents=True)
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    # a stand-in UI: a process that starts the run in its own session, then is killed
    starter = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-m', 'miniagi', 'run', '--control', "
        f"{str(control)!r}, 'Say never'], start_new_session=True, stdin=subprocess.DEVNULL); time.sleep(600)")],
        cwd=isolated.work, env=env)
    try:
        wait_for(lambda: Channel(control).question() is not None, "the run waits for approval")
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    (run,) = run_dirs(isolated.home)
    wait_for(lambda: json.loads((run / "result.json").read_text()).get("status") == "interrupted",
             "the run stops, its state saved")
    assert Channel(control).question() is None


def test_a_run_refused_at_its_first_request_says_on_its_page_that_it_was_not_kept(llm, isolated, bench, browser):
    """The page followed the run while it waited on its first reply; the endpoint then refused the key, and the
    run's folder went with it: the page says so, with what the process said, instead of waiting forever."""
    from .fake_llm import Fail

    gate = threading.Event()
    llm.responder = lambda request: gate.wait(60) and None  # holds the first request until the page is open
    llm.add(Fail(401, message="invalid api key"))
    browser.get(f"{bench}/?token={bench.token}")
    run_id = start(browser, bench, "hello", yes=True)
    assert status(browser) == "running" and (isolated.home / "runs" / run_id).is_dir()
    gate.set()
    wait_for(lambda: "was not kept" in events_text(browser), "the page says the run was not kept")
    assert "rejected the API key" in events_text(browser) and status(browser) == "not kept"
    assert run_dirs(isolated.home) == []
    page = bench.client.get(f"{bench}/runs/{run_id}")  # and so do a reload and the events a poll asks for
    assert page.status_code == 404 and f"run {run_id} was not kept" in page.text and "(exit 2)" in page.text
    assert "rejected the API key" in page.text
    polled = bench.client.get(f"{bench}/runs/{run_id}/events", params={"after": 0})
    assert polled.status_code == 404 and "was not kept" in polled.json()["error"]
    assert "rejected the API key" in polled.json()["log"]
    other = bench.client.get(f"{bench}/runs/20990101-000000-abcdef")  # a run this UI did not start
    assert other.status_code == 404 and "not kept" in other.text and "was not kept: it ended" not in other.text


def test_in_a_browser_a_confirmed_mcp_json_moves_on_to_the_run(llm, isolated, bench, browser):
    """A `.mcp.json` in the work directory is asked about before any run exists, in the session's page. After
    Approve the browser must not be left on that question (already answered, its form now stale): the page goes on
    to the run, whose tool call works."""
    from selenium.webdriver.common.by import By

    from .test_mcp import PROBE

    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"probe": {
        "command": sys.executable, "args": [PROBE]}}}))
    llm.add(act("probe__add", '{"a": 2, "b": 40}'), act("done", "forty-two"))
    browser.get(f"{bench}/?token={bench.token}")
    type_into(browser, "objective", "add with the probe")
    browser.find_element(By.CSS_SELECTOR, "form#start input[name=yes]").click()
    button(browser, "Start").click()
    wait_for(lambda: ".mcp.json asks to start MCP servers" in main_text(browser),
             "the session's page asks about .mcp.json")
    button(browser, "Approve").click()
    run_id = on_run_page(browser)
    wait_for(lambda: status(browser) == "done", "the run ends")
    assert "42" in events_text(browser) and run_id in {p.name for p in run_dirs(isolated.home)}
    assert not present(browser, "//button[normalize-space()='Approve']")


def test_an_answered_question_is_no_longer_offered(tmp_path):
    """Between the page's answer and the run taking it (its next look, up to POLL_S later), the question's file is
    still there: the UI must not offer it again (a page drawn then would show a stale form that answers 409)."""
    from miniagi.webui.control import Channel, write_whole

    channel = Channel(tmp_path)
    write_whole(tmp_path / "question.json", json.dumps({"id": "q1", "kind": "confirm", "run_id": "", "message": "?"}))
    assert channel.question()["id"] == "q1"
    assert channel.answer("q1", {"run": True})
    assert channel.question() is None  # answered: nothing waits for the page any more
    assert not channel.answer("q1", {"run": True})  # and answering again is refused (409 in the page)
