"""The workbench, part two, in a real headless Chromium against real `python -m miniagi` processes and the fake model:
what running code prints is on the page as it prints (and stays after Stop); a reply streaming in shows no format
markup; a follow-up reads as one conversation with the run before it; each step opens what the model saw.

With MINIAGI_SCREENSHOTS=1 the screenshots of the conversation and of the model's view are saved into docs/img/."""

from __future__ import annotations

import os
import threading

import pytest

from .conftest import act
from .fake_llm import Stream, Wait
from .test_ui import serve_ui, wait_for
from .test_workbench import (
    DOCS_IMG,
    SCREENSHOTS,
    browser,
    button,
    main_text,
    on_run_page,
    present,
    start,
    status,
    text_of,
    type_into,
)

__all__ = ["browser"]  # the suite's headless Chromium (a fixture)

MARKUP = ("<r>", "</r>", "<c>", "</c>", '{"thought"', '"command":')


def screenshot(driver, name: str) -> None:
    if SCREENSHOTS:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(DOCS_IMG / f"workbench-{name}.png"))


def _bench(isolated, llm, **env):
    environ = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                   MINIAGI_MEMORY_SCOPE="off", **env)
    return serve_ui(isolated.home, workdirs=[isolated.work], environ=environ)


@pytest.fixture
def bench(isolated, llm):
    with _bench(isolated, llm) as url:
        yield url


def test_what_running_code_prints_is_on_the_page_as_it_prints_and_stays_after_stop(llm, isolated, bench, browser):
    # it never ends by itself: each line is there before the code ends
    gauge = "import itertools, time\nfor i in itertools.count():\n    print(f'gauge reading {i}')\n    time.sleep(0.3)"
    llm.add(act("execute_python", gauge, "watch the gauge"))
    browser.get(f"{bench}/?token={bench.token}")
    run_id = start(browser, bench, "Watch the gauge", yes=True)
    wait_for(lambda: "gauge reading 2" in text_of(browser, "output"), "printed lines show as the code prints them")
    assert "running ·" in text_of(browser, "output") and status(browser) == "running"
    assert "observation" not in text_of(browser, "events")  # the step has not ended
    shown = text_of(browser, "output")
    browser.set_window_size(1280, 900)
    browser.execute_script("document.getElementById('output').scrollIntoView({block: 'end'})")
    screenshot(browser, "running")
    button(browser, "Stop").click()
    wait_for(lambda: status(browser) == "interrupted", "the run is stopped")
    wait_for(lambda: "stopped: what it printed until then" in text_of(browser, "output"), "the lines stay")
    after = text_of(browser, "output")
    for line in shown.splitlines()[1:]:  # every line shown while it ran is still shown
        assert line in after
    browser.get(f"{bench}/runs/{run_id}")  # and after a reload
    assert "gauge reading 2" in text_of(browser, "output")
    with serve_ui(isolated.home, workdirs=[isolated.work], environ=bench.app.workbench.environ) as later:
        assert "gauge reading 2" in later.client.get(f"{later}/runs/{run_id}").text  # and in a UI started later

    # Resume comes first, with the run's own "run without asking"; the step begun again is shown once
    assert browser.execute_script(
        "const f = [...document.querySelectorAll('#control form')]; return f.length && "
        "f[0].classList.contains('resume-run')")
    assert browser.find_element("css selector", "form.resume-run input[name=yes]").is_selected()
    llm.add(act("execute_python", "print('read once more')", "one more reading"), act("done", "The gauge reads fine."))
    button(browser, "Resume").click()
    # the step's code was cut off: the resume says so and offers the recorded reply; asked anew here
    wait_for(lambda: "code was interrupted after" in browser.page_source and "anew" in browser.page_source,
             "the resume says the step's code was cut off and offers to ask the model anew")
    button(browser, "Approve").click()
    wait_for(lambda: on_run_page(browser) == run_id and status(browser) == "done", "the run resumes and ends")
    headers = browser.execute_script("return [...document.querySelectorAll('#events section.step h3')]"
                                     ".map(h => h.innerText)")
    assert len([h for h in headers if h.startswith("step 1 ")]) == 1, headers
    assert "The gauge reads fine." in text_of(browser, "answer")


@pytest.mark.parametrize("protocol", ["tags", "json"])
def test_a_reply_streaming_in_shows_no_format_markup(llm, isolated, bench, browser, protocol):
    from selenium.webdriver.support.ui import Select

    held = threading.Event()
    pieces = (["<r>Looking ", "at the **folder** first", "</r><c>exec", "ute_shell</c>\nls ", "-la", Wait(held),
               "\n"] if protocol == "tags" else
              ['{"thought": "Looking ', 'at the **folder** first", "comm', 'and": "execute_shell", "args": ',
               '{"command_line": "ls ', '-la', Wait(held), '"}}'])
    llm.add(Stream(pieces), act("done", "listed") if protocol == "tags" else
            '{"thought": "ok", "command": "done", "args": {"answer": "listed"}}')
    browser.get(f"{bench}/?token={bench.token}")
    type_into(browser, "objective", "List the folder")
    Select(browser.find_element("name", "protocol")).select_by_value(protocol)
    browser.find_element("css selector", "form#start input[name=yes]").click()
    button(browser, "Start").click()
    on_run_page(browser)
    wait_for(lambda: "ls -la" in text_of(browser, "stream"), "the argument streams in")
    streaming = text_of(browser, "stream")
    assert "Looking at the folder first" in streaming and "execute_shell" in streaming  # Markdown rendered
    page = main_text(browser)
    assert not [mark for mark in MARKUP if mark in page], page
    assert present(browser, "//section[@id='stream']//strong[normalize-space()='folder']")
    held.set()
    wait_for(lambda: status(browser) == "done", "the run ends")
    assert not [mark for mark in MARKUP if mark in main_text(browser)]


def test_a_follow_up_reads_as_one_conversation(llm, isolated, bench, browser):
    llm.add(act("execute_python", "print(6 * 7)", "compute it"),
            act("done", "The answer is **42**.\n\n- six\n- seven\n\n<script>document.title='owned'</script>"))
    browser.set_window_size(1280, 1000)
    browser.get(f"{bench}/?token={bench.token}")
    first = start(browser, bench, "What is six times seven?", yes=True)
    wait_for(lambda: status(browser) == "done", "the first run ends")
    # the status and the answer come in one poll's reply; under load the page may still be laying it out
    wait_for(lambda: "The answer is" in text_of(browser, "answer"), "the answer shows")
    answer = text_of(browser, "answer")
    assert "The answer is 42." in answer and answer.count("The answer is") == 1, (
        browser.execute_script("return document.getElementById('answer').outerHTML"),
        bench.client.get(f"{bench}/runs/{first}/events?after=0").json()["answer"])
    assert present(browser, "//section[@id='answer']//strong[normalize-space()='42']")
    assert "<script>" in answer and browser.title != "owned"  # the model's HTML is text, never run
    assert main_text(browser).count("The answer is 42.") == 1  # the done step does not repeat it
    llm.add(act("done", "Times two it is 84."))
    wait_for(lambda: present(browser, "//textarea[@name='followup']"), "a finished run offers a follow-up")
    type_into(browser, "followup", "And twice that?")
    button(browser, "Follow up").click()
    wait_for(lambda: "/runs/" in browser.current_url and not browser.current_url.endswith(first), "the follow-up")
    second = on_run_page(browser)
    wait_for(lambda: status(browser) == "done", "the follow-up ends")
    # the follow-up box at the end, once its process has gone (until then the run is still driven from here)
    wait_for(lambda: present(browser, "//textarea[@name='followup']"), "the follow-up is offered")
    earlier = text_of(browser, "earlier")
    assert "What is six times seven?" in earlier and "The answer is 42." in earlier  # the first objective and answer
    page = main_text(browser)
    assert page.index("What is six times seven?") < page.index("And twice that?") < page.index("Times two it is 84.")
    assert page.index("Times two it is 84.") < page.index("follow up")
    assert "stopped" not in page and not present(browser, "//*[@id='output']")  # nothing was stopped
    browser.set_window_size(1280, 1500)
    screenshot(browser, "conversation")
    browser.get(f"{bench}/runs/{first}")  # the first run's page shows the rest of the conversation, and is followed
    assert "Times two it is 84." in text_of(browser, "later")  # up from its newest run
    assert not present(browser, "//textarea[@name='followup']") and second in text_of(browser, "control")
    browser.set_window_size(1280, 900)  # the runs table at 1280 px: no id wraps
    browser.get(f"{bench}/")
    assert browser.execute_script("return [...document.querySelectorAll('table.runs td:first-child a')]"
                                  ".every(a => a.getClientRects().length === 1)")
    screenshot(browser, "runs-1280")


def test_each_step_opens_what_the_model_saw(llm, isolated, browser):
    from selenium.webdriver.common.by import By

    llm.responder = lambda request: ("The agent printed long reports of rows." if request["model"] == "summarizer"
                                     else None)
    code = "for i in range(60):\n    print(f'report {n}, row {{i}}: the pump at bay {{i}} runs at {{4000 + i}} rpm')"
    llm.add(act("memorize_thoughts", "pumps run near 4000 rpm", "keep it"),
            *[act("execute_python", code.format(n=n), f"read report {n}") for n in range(1, 7)], act("done", "read"))
    with _bench(isolated, llm, MINIAGI_MAX_CONTEXT_TOKENS="2500", MINIAGI_SUMMARIZER_MODEL="summarizer") as url:
        browser.set_window_size(1280, 1100)
        browser.get(f"{url}/?token={url.token}")
        start(browser, url, "Read the reports", yes=True)
        wait_for(lambda: status(browser) == "done", "the run ends")
        links = browser.find_elements(By.LINK_TEXT, "what the model saw")
        assert len(links) == 8  # one per step
        links[-1].click()  # the last step: the summary covers the first steps by now
        wait_for(lambda: "What the model saw · step 8" in main_text(browser), "the model's view of step 8")
        page = main_text(browser)
        assert "the summary of steps 1-" in page and "the notes of step 1" in page
        assert "SUMMARY OF STEPS 1-" in page  # the message itself, as sent
        assert "its observation" in page and "the request for the next action" in page
        screenshot(browser, "model-view")


def test_the_start_form_names_the_model_and_offers_those_the_endpoint_lists(isolated, tmp_path):
    """An endpoint that lists its models (GET /v1/models): the form names the model a run would use and offers
    the listed ones; without any endpoint it says so at once, with `miniagi setup`."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from .test_ui import free_port

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "llama-3.1-8b", "object": "model"},
                                                          {"id": "qwen2.5-coder", "object": "model"}]}).encode()
            self.send_response(200 if self.path.endswith("/models") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    environ = {"PATH": os.environ["PATH"], "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
               "MINIAGI_MODEL": "llama-3.1-8b"}
    try:
        with serve_ui(isolated.home, workdirs=[isolated.work], environ=environ) as url:
            page = url.client.get(url + "/").text
            assert "model: llama-3.1-8b" in page and "miniagi setup" not in page
            wait_for(lambda: '<option value="qwen2.5-coder">' in url.client.get(url + "/").text,
                     "the models the endpoint lists are offered")
        with serve_ui(isolated.home, workdirs=[isolated.work], environ={"PATH": os.environ["PATH"]}) as url:
            page = url.client.get(url + "/").text
            assert "No model to run with yet" in page and "miniagi setup" in page and "model: gpt-4o-mini" in page
    finally:
        server.shutdown()
        server.server_close()


def test_a_tokens_per_second_figure_only_where_it_means_something(cli, llm, isolated):
    """A reply generated over a second has its rate; one the server sent at once has none (its "rate" would be
    thousands of tokens a second)."""
    from .conftest import run_dirs

    words = [f"word{i} " for i in range(12)]
    llm.add(Stream(["<r>", *words, "</r><c>execute_python</c>\nprint(1)"], every=0.1), act("done", "one"))
    assert cli("-y", "count slowly").returncode == 0
    (run,) = run_dirs(isolated.home)
    with serve_ui(isolated.home) as url:
        page = url.client.get(f"{url}/runs/{run.name}").text
    assert page.count(" tokens/s") == 1 and page.count("first token ") == 2


def test_each_step_is_shown_once_whatever_the_trace():
    """Generated traces: a step may be begun again (a resume after an interrupted command) any number of times; the
    page shows each step's last attempt only, with its own replies, and every other event."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from miniagi import events as ev
    from miniagi.webui.conversation import once_per_step

    def attempt(step: int, n: int, observed: bool) -> list:
        shown = [ev.Action(step=step, command="execute_python", arg=f"attempt {n}"),
                 ev.ModelCall(step=step, response=f"reply {n}")]
        return shown + ([ev.Observation(step=step, text=f"seen {n}")] if observed else [ev.Resume(step=step)])

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    def check(attempts):
        events, n = [], 0
        for step, tries in enumerate(attempts, 1):
            for t in range(tries):
                n += 1
                events += attempt(step, n, observed=t == tries - 1)
        shown = once_per_step(events)
        actions = [e for e in shown if isinstance(e, ev.Action)]
        assert [e.step for e in actions] == list(range(1, len(attempts) + 1))  # each step once, in order
        for action in actions:  # its last attempt, and that attempt's reply
            last = max(int(e.arg.split()[-1]) for e in events if isinstance(e, ev.Action) and e.step == action.step)
            assert action.arg == f"attempt {last}"
            replies = [e.response for e in shown if isinstance(e, ev.ModelCall) and e.step == action.step]
            assert replies == [f"reply {last}"]
        assert [e for e in shown if not isinstance(e, (ev.Action, ev.ModelCall))] == \
            [e for e in events if not isinstance(e, (ev.Action, ev.ModelCall))]

    check()
