"""Every byte on loopback: the suite's own process refuses to reach beyond it, and a test that tried fails even when
the code it ran took the refusal in its stride (the guard is in tests/conftest.py). Only documentation addresses
(TEST-NET-2 and -3) are tried, and the guard refuses them before a packet is made."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .conftest import LeftLoopback, beyond_loopback, only_loopback, reached_beyond

ROOT = Path(__file__).resolve().parent.parent

TESTS_THAT_REACH_OUT = '''
import socket


def test_connects_to_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname()).close()
        socket.create_connection(("localhost", server.getsockname()[1])).close()


def test_talks_over_a_unix_socket(tmp_path):
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(str(tmp_path / "s"))
        server.listen()
        client.connect(str(tmp_path / "s"))


def test_connects_beyond_and_takes_the_error_in_its_stride():
    try:
        socket.create_connection(("203.0.113.7", 9), timeout=5)
    except OSError:
        pass


def test_tries_in_the_background_with_connect_ex():
    import threading

    def reach_out():
        with socket.socket() as sock:
            try:
                sock.connect_ex(("198.51.100.7", 9))
            except OSError:
                pass

    thread = threading.Thread(target=reach_out)
    thread.start()
    thread.join()


def test_sends_a_datagram_beyond():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(b"hello", ("198.51.100.9", 9))
        except OSError:
            pass


def test_looks_up_a_name():
    try:
        socket.getaddrinfo("miniagi.example", 443)
    except OSError:
        pass


def test_listens_on_every_interface():
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", 0))
        except OSError:
            pass
'''


def test_a_test_that_reaches_beyond_loopback_fails_even_when_it_swallowed_the_error(tmp_path):
    (tmp_path / "test_reaching_out.py").write_text(TESTS_THAT_REACH_OUT)
    report = tmp_path / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--junitxml={report}", "test_reaching_out.py"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        trouble = case.find("error") if case.find("error") is not None else case.find("failure")
        outcomes[case.get("name")] = "ok" if trouble is None else trouble.get("message", "")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert outcomes.pop("test_connects_to_loopback") == "ok" and outcomes.pop("test_talks_over_a_unix_socket") == "ok"
    said = {
        "test_connects_beyond_and_takes_the_error_in_its_stride": "connect to 203.0.113.7 port 9",
        "test_tries_in_the_background_with_connect_ex": "connect_ex to 198.51.100.7 port 9",
        "test_sends_a_datagram_beyond": "sendto to 198.51.100.9 port 9",
        "test_looks_up_a_name": "looking up miniagi.example",
        "test_listens_on_every_interface": "bind to 0.0.0.0 port 0",
    }
    if only_loopback():  # a network of nothing but loopback (the suite run in a namespace): every interface is loopback
        assert outcomes.pop("test_listens_on_every_interface") == "ok"
        del said["test_listens_on_every_interface"]
    assert set(outcomes) == set(said), outcomes
    for name, what in said.items():
        assert f"this test reached beyond loopback: {what}" in outcomes[name], (name, outcomes[name])


def test_the_guard_refuses_before_the_socket_is_used():
    with socket.socket() as sock:
        with pytest.raises(LeftLoopback, match="connect to 203.0.113.7 port 9: tests keep to loopback"):
            sock.connect(("203.0.113.7", 9))
        with pytest.raises(OSError) as not_connected:
            sock.getpeername()  # the refusal came before the kernel was asked: no connection was ever begun
        assert not_connected.value.errno == 107  # ENOTCONN
    assert reached_beyond == ["connect to 203.0.113.7 port 9"]
    reached_beyond.clear()  # this test's own attempt was the point: it must not fail the test


@given(st.ip_addresses())
def test_only_loopback_addresses_count_as_loopback(address):
    loopback = address.is_loopback or (address.version == 6 and bool(address.ipv4_mapped)
                                       and address.ipv4_mapped.is_loopback)
    assert beyond_loopback(str(address)) is not loopback
    assert beyond_loopback(str(address).encode()) is not loopback


@given(st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True))
def test_a_name_is_loopback_only_when_it_is_localhost(name):
    assert beyond_loopback(name) is not (name == "localhost" or name.endswith(".localhost"))
    assert not beyond_loopback("LocalHost.") and beyond_loopback("") and beyond_loopback("::")
    assert not beyond_loopback(str(ipaddress.ip_address("::ffff:127.0.0.9")))


EMBED_AND_SAY_WHAT_ONNXRUNTIME_SAW = '''
import os
import sys

seen = []
sys.addaudithook(lambda event, args: seen.append(os.environ.get("ORT_DISABLE_TELEMETRY"))
                 if event == "import" and args[0] == "onnxruntime" and not seen else None)
from memory.embeddings import MiniLMEmbedder

assert MiniLMEmbedder().embed(["hello"]).shape == (1, 384)
print(seen)
'''


def test_the_embedder_loads_onnxruntime_with_its_telemetry_off():
    """ONNX Runtime 1.29+ uploads telemetry on Linux (it looks up mobile.events.data.microsoft.com seconds after its
    import, from C, where the guard above cannot see): the embedder opts out before the import, which is when ORT
    reads ORT_DISABLE_TELEMETRY."""
    env = {name: value for name, value in os.environ.items() if name != "ORT_DISABLE_TELEMETRY"}
    proc = subprocess.run([sys.executable, "-c", EMBED_AND_SAY_WHAT_ONNXRUNTIME_SAW], cwd=ROOT, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['1']"
