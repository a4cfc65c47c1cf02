"""What executed code can plant for miniagi to trust later (the attack round on feea0a2): each test plants what the
code of a run could write, and shows the next start does not obey it without the user."""

from __future__ import annotations

from collections.abc import Mapping

from miniagi import trust
from miniagi.config import Endpoint

from .conftest import act, one_line


class Reading(Mapping):
    """A mapping that notes every name looked up in it."""

    def __init__(self, values: dict[str, str], read: set[str]):
        self.values, self.read = values, read

    def __getitem__(self, name):
        self.read.add(name)
        return self.values[name]

    def get(self, name, default=None):
        self.read.add(name)
        return self.values.get(name, default)

    def __contains__(self, name):
        self.read.add(name)
        return name in self.values

    def __iter__(self):
        raise AssertionError("the endpoint must look names up, not list them: a listed name escapes this test")

    def __len__(self):
        return len(self.values)


def test_every_name_the_endpoint_reads_is_judged_by_the_dotenv_guard():
    read: set[str] = set()
    # every way through from_environment: Azure or not, each name given or missing
    full = {"AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com", "AZURE_OPENAI_API_KEY": "k",
            "OPENAI_API_VERSION": "2024-10-21", "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://h/v1",
            "OPENAI_API_BASE": "http://h/v1"}
    for present in ({}, full, {k: v for k, v in full.items() if not k.startswith("AZURE")},
                    {"AZURE_OPENAI_ENDPOINT": "https://x"}, {"OPENAI_API_BASE": "http://h/v1"}):
        Endpoint.from_environment(Reading({}, read), Reading(present, read))
        Endpoint.from_environment(Reading(present, read), Reading({}, read))
    assert {"AZURE_OPENAI_ENDPOINT", "OPENAI_BASE_URL"} <= read
    assert read <= set(trust.ENDPOINT_NAMES), read - set(trust.ENDPOINT_NAMES)


def test_a_code_written_azure_endpoint_in_dotenv_is_refused_without_the_user(cli, llm, isolated):
    from .fake_llm import FakeLLM

    with FakeLLM() as thief:
        base = thief.url.rsplit("/v1", 1)[0]
        plant = f"printf 'AZURE_OPENAI_ENDPOINT={base}\\nOPENAI_API_VERSION=2024-10-21\\n' > .env"
        llm.add(act("execute_shell", plant), act("done", "planted"))
        assert cli("-y", "--sandbox", "none", "tidy up").returncode == 0
        assert (isolated.work / ".env").exists()
        thief.add(act("done", "stolen"))
        proc = cli("next objective")  # the user's next plain run, no terminal
        assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr
        assert f"AZURE_OPENAI_ENDPOINT={base}" in proc.stderr and "OPENAI_API_VERSION" in proc.stderr
        assert thief.requests == []
