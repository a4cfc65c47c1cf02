"""Checkpoints as a user meets them: a real run changes files, its trace and terminal say what each step changed,
`miniagi diff` shows it and `miniagi undo` puts the work directory back — for a resumed run, a follow-up and a batch
objective too — and never overwrites what changed since outside the run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from .conftest import act, one_line, run_dirs


def tree(root) -> dict[str, tuple]:
    """Every path under root (ignored folders included) → what it is, byte for byte, modes included."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                found[relative] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[relative] = ("folder", info.st_mode & 0o7777)
            else:
                with open(path, "rb") as handle:
                    found[relative] = ("file", info.st_mode & 0o7777, hashlib.sha256(handle.read()).hexdigest())
        folders[:] = [f for f in folders if not os.path.islink(os.path.join(folder, f))]
    return found


def observations(home) -> dict[int, dict]:
    directory = run_dirs(home)[-1]
    events = [json.loads(line) for line in (directory / "trace.jsonl").read_text().splitlines()]
    return {e["step"]: e for e in events if e["type"] == "observation"}


def test_each_step_says_what_it_changed_and_undo_puts_everything_back(cli, llm, isolated):
    work = isolated.work
    (work / "a.txt").write_text("one\n")
    (work / "keep").mkdir()
    (work / "keep" / "b.txt").write_text("b\n")
    (work / "gone.txt").write_text("to be deleted\n")
    before = tree(work)
    llm.add(act("execute_shell", "echo two >> a.txt && echo new > d.txt"),
            act("execute_shell", "rm -rf keep gone.txt && chmod 755 a.txt && printf '\\000\\001' > blob.bin"),
            act("memorize_thoughts", "nothing on disk"),
            act("done", "ok"))
    proc = cli("-y", "--unattended", "change files")
    assert proc.returncode == 0, proc.stderr
    seen = observations(isolated.home)
    assert seen[1]["files"] == {"a.txt": "modified", "d.txt": "added"}
    assert seen[2]["files"] == {"a.txt": "modified", "blob.bin": "added", "gone.txt": "deleted", "keep/": "deleted",
                                "keep/b.txt": "deleted"}
    assert seen[3]["files"] == {}
    assert "2 files changed: a.txt, d.txt (new)" in proc.stderr
    assert "4 files changed: a.txt, blob.bin (new), gone.txt (deleted), keep/ (deleted)" in proc.stderr

    run_id = run_dirs(isolated.home)[-1].name
    shown = cli("show", run_id).stdout
    assert f"files: 2 files changed: a.txt, d.txt (new) (miniagi diff {run_id} --step 1)" in shown
    diff = cli("diff", run_id, "--step", "1")
    assert diff.returncode == 0, diff.stderr
    assert "+++ b/a.txt" in diff.stdout and "+two" in diff.stdout and "+new" in diff.stdout
    whole = cli("diff", run_id)
    assert "Binary file blob.bin changed" in whole.stdout and "\x01" not in whole.stdout
    assert "-to be deleted" in whole.stdout and "old mode 644" in whole.stdout

    refused = cli("undo", run_id)  # no terminal, no -y: it shows what it would do and changes nothing
    assert refused.returncode == 2 and "confirm with -y" in refused.stderr
    assert (work / "d.txt").exists()
    undone = cli("undo", run_id, "-y")
    assert undone.returncode == 0, undone.stderr
    assert tree(work) == before


def test_undo_to_a_step_and_back_again(cli, llm, isolated):
    work = isolated.work
    llm.add(act("execute_shell", "mkdir -p src && echo v1 > src/m.py"),
            act("execute_shell", "echo v2 > src/m.py && ln -s src/m.py link"),
            act("execute_shell", "rm -r src"),
            act("done", "ok"))
    assert cli("-y", "--unattended", "files").returncode == 0
    run_id = run_dirs(isolated.home)[-1].name
    assert cli("undo", run_id, "--to-step", "2", "-y").returncode == 0
    assert (work / "src" / "m.py").read_text() == "v2\n" and os.readlink(work / "link") == "src/m.py"
    assert cli("undo", run_id, "--to-step", "1", "-y").returncode == 0
    assert (work / "src" / "m.py").read_text() == "v1\n" and not os.path.lexists(work / "link")
    assert cli("undo", run_id, "--to-step", "3", "-y").returncode == 0  # forward again: as after step 3
    assert sorted(os.listdir(work)) == ["link"]


def test_undo_never_overwrites_a_file_changed_outside_the_run(cli, llm, isolated):
    work = isolated.work
    (work / "notes.txt").write_text("mine\n")
    llm.add(act("execute_shell", "echo agent > notes.txt && echo x > other.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "edit").returncode == 0
    (work / "notes.txt").write_text("edited by me after the run\n")
    run_id = run_dirs(isolated.home)[-1].name
    proc = cli("undo", run_id, "-y")
    assert proc.returncode == 1
    assert "left as it is: notes.txt (changed since, outside the run)" in proc.stderr
    assert "undone in part: 1 of 1 path put back as they were before the run; 1 path left as they are" in proc.stderr
    assert (work / "notes.txt").read_text() == "edited by me after the run\n"
    assert not (work / "other.txt").exists()  # the rest was undone


def test_no_checkpoints_means_no_files_and_nothing_to_undo(cli, llm, isolated):
    llm.add(act("execute_shell", "echo x > f.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "--no-checkpoints", "go").returncode == 0
    assert "files" not in observations(isolated.home)[1]
    run_id = run_dirs(isolated.home)[-1].name
    proc = cli("undo", run_id, "-y")
    assert proc.returncode == 2 and "no checkpoints" in proc.stderr


def test_a_git_work_directory_is_left_untouched(cli, llm, isolated):
    work = isolated.work
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    (work / "tracked.txt").write_text("v1\n")
    subprocess.run([*git, "add", "tracked.txt"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=work, check=True)
    hook = work / ".git" / "hooks" / "pre-commit"  # a hook that would leave a mark if anything ran it
    hook.write_text(f"#!/bin/sh\ntouch {isolated.home.parent / 'hook-ran'}\n")
    hook.chmod(0o755)
    git_before = tree(work / ".git")
    before = tree(work)
    llm.add(act("execute_shell", "echo v2 > tracked.txt && echo new > untracked.txt"), act("done", "ok"))
    proc = cli("-y", "--unattended", "edit")
    assert proc.returncode == 0, proc.stderr
    assert ".git/ (a folder never kept)" in proc.stderr
    assert tree(work / ".git") == git_before  # no commit, no index change
    run_id = run_dirs(isolated.home)[-1].name
    assert cli("undo", run_id, "-y").returncode == 0
    assert tree(work) == before and tree(work / ".git") == git_before
    assert not (isolated.home.parent / "hook-ran").exists()


@pytest.mark.parametrize("kind", ["bwrap", "namespace"])
def test_executed_code_cannot_read_or_rewrite_the_checkpoints(cli, llm, isolated, kind):
    """Code must not rewrite the history it will be undone to: the run's folder, with its checkpoints, is out of
    its sight under both sandbox kinds (bwrap's view leaves $MINIAGI_HOME out; the namespace lays a tmpfs over it)."""
    work, runs = isolated.work, isolated.home / "runs"
    (work / "precious.txt").write_text("the user's work\n")
    attack = (f"for f in {runs}/*/checkpoints/log.jsonl {runs}/*/checkpoints/blobs; do "
              f"cat $f; echo tampered >> $f; done; ls {runs}; touch {runs}/planted; "
              "echo 'overwritten by code' > precious.txt")
    llm.add(act("execute_shell", attack), act("done", "ok"))
    proc = cli("-y", "--unattended", "--sandbox", kind, "try it")
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(isolated.home)
    output = observations(isolated.home)[1]["text"]
    assert "the user's work" not in output  # the kept content was not readable
    assert (work / "precious.txt").read_text() == "overwritten by code\n"
    for name in ("log.jsonl", "blobs"):
        assert b"tampered" not in (run_dir / "checkpoints" / name).read_bytes()
    assert not (runs / "planted").exists()
    assert cli("undo", run_dir.name, "-y").returncode == 0
    assert (work / "precious.txt").read_text() == "the user's work\n"


def test_undo_of_a_resumed_run_covers_both_parts_and_leaves_what_changed_between(cli, llm, isolated):
    work = isolated.work
    (work / "report.txt").write_text("draft\n")
    before = tree(work)
    llm.add(act("execute_shell", "echo part1 >> report.txt"), act("execute_shell", "echo x > one.txt"),
            act("execute_shell", "echo part2 >> report.txt && rm one.txt && echo y > two.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "--max-steps", "2", "write").returncode == 3
    run_id = run_dirs(isolated.home)[-1].name
    (work / "mine.txt").write_text("written by me while the run stood still\n")
    assert cli("resume", run_id, "-y", "--unattended", "--max-steps", "10").returncode == 0
    assert observations(isolated.home)[3]["files"] == {"one.txt": "deleted", "report.txt": "modified",
                                                       "two.txt": "added"}
    assert cli("undo", run_id, "--to-step", "2", "-y").returncode == 0
    assert (work / "report.txt").read_text() == "draft\npart1\n" and (work / "one.txt").exists()
    assert cli("undo", run_id, "-y").returncode == 0
    mine = work / "mine.txt"
    assert mine.read_text() == "written by me while the run stood still\n"  # not the run's: left as it is
    mine.unlink()
    assert tree(work) == before


def test_undo_of_a_follow_up_and_then_of_the_run_before_it(cli, llm, isolated):
    work = isolated.work
    llm.add(act("execute_shell", "echo first > a.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "start").returncode == 0
    first = run_dirs(isolated.home)[-1].name
    llm.add(act("execute_shell", "echo second >> a.txt && echo b > b.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "-c", "go on").returncode == 0
    follow_up = run_dirs(isolated.home)[-1].name
    assert follow_up != first
    blocked = cli("undo", first, "-y")  # the follow-up changed a.txt since: the first run's undo leaves it
    assert blocked.returncode == 1 and "a.txt (changed since, outside the run)" in blocked.stderr
    assert cli("undo", follow_up, "-y").returncode == 0
    assert (work / "a.txt").read_text() == "first\n" and not (work / "b.txt").exists()
    assert cli("undo", first, "-y").returncode == 0
    assert os.listdir(work) == []


def test_undo_of_a_batch_objective_in_its_own_work_directory(cli, llm, isolated):
    from .test_batch_replay import Scripted, write_batch

    seed = isolated.work / "seed"
    seed.mkdir()
    (seed / "n.txt").write_text("21\n")
    llm.responder = Scripted({"Double the number": [act("execute_shell", "echo 42 > n.txt && touch made.txt"),
                                                    act("done", "doubled")]})
    write_batch(isolated.work / "jobs.jsonl", [{"id": "double", "objective": "Double the number", "setup": "seed"}])
    out = isolated.work / "out"
    assert cli("batch", "jobs.jsonl", "--out", str(out), "-y").returncode == 0
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    objective_dir = out / "work" / "double"
    assert (objective_dir / "n.txt").read_text() == "42\n"
    assert cli("undo", record["run_id"], "-y").returncode == 0
    assert tree(objective_dir) == tree(seed)


def test_large_files_and_ignored_folders_are_left_out_and_said_once(cli, llm, isolated):
    work = isolated.work
    (work / "node_modules" / "pkg").mkdir(parents=True)
    (work / "node_modules" / "pkg" / "index.js").write_text("module.exports = 1\n")
    (work / "env").mkdir()
    (work / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a virtual environment, whatever its name
    llm.add(act("execute_shell", "head -c 3000000 /dev/zero > big.bin && echo s > small.txt"),
            act("execute_shell", "head -c 2500000 /dev/zero > big2.bin && rm -r node_modules"), act("done", "ok"))
    proc = cli("-y", "--unattended", "--checkpoint-max-file", "2", "big files")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("checkpoints: not kept") == 1
    said = next(line for line in proc.stderr.splitlines() if "checkpoints: not kept" in line)
    assert "node_modules/ (a folder never kept)" in said and "env/ (a folder never kept)" in said
    seen = observations(isolated.home)
    assert seen[1]["files"] == {"big.bin": "added", "small.txt": "added"}
    assert seen[2]["files"] == {"big2.bin": "added"}  # an ignored folder's changes are not the run's record
    run_id = run_dirs(isolated.home)[-1].name
    blobs = run_dirs(isolated.home)[-1] / "checkpoints" / "blobs"
    assert blobs.stat().st_size < 100_000  # the big files' bytes were not kept
    diff = cli("diff", run_id)
    assert "big.bin: content not kept (over 2 MB), 3,000,000 bytes" in diff.stdout
    assert cli("undo", run_id, "-y").returncode == 0
    assert sorted(os.listdir(work)) == ["env"]  # what the run made is gone; node_modules was never the run's


def test_undo_does_not_write_through_a_link_planted_in_place_of_a_folder(cli, llm, isolated, tmp_path):
    work, elsewhere = isolated.work, tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / "docs").mkdir()
    (work / "docs" / "guide.txt").write_text("guide\n")
    llm.add(act("execute_shell", "rm -r docs"), act("done", "ok"))
    assert cli("-y", "--unattended", "clean").returncode == 0
    os.symlink(elsewhere, work / "docs")  # planted after the run, where the folder was
    proc = cli("undo", run_dirs(isolated.home)[-1].name, "-y")
    assert proc.returncode == 1 and "docs (changed since, outside the run)" in proc.stderr
    assert os.listdir(elsewhere) == []


def test_the_web_ui_shows_each_steps_line_with_its_diff_one_click_away(cli, llm, isolated):
    from .test_ui import serve_ui

    (isolated.work / "a.txt").write_text("old line\n")
    llm.add(act("execute_shell", "echo '<b>new</b> line' > a.txt && echo x > d.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "edit").returncode == 0
    run_id = run_dirs(isolated.home)[-1].name
    with serve_ui(isolated.home) as ui:
        page = ui.client.get(f"{ui}/runs/{run_id}").text
        link = f'<a href="/runs/{run_id}/diff?step=1">2 files changed: a.txt, d.txt (new)</a>'
        assert link in page
        diff = ui.client.get(f"{ui}/runs/{run_id}/diff", params={"step": 1})
        assert diff.status_code == 200
        assert "-old line" in diff.text and "+&lt;b&gt;new&lt;/b&gt; line" in diff.text  # shown as text
        assert ui.client.get(f"{ui}/runs/{run_id}/diff", params={"step": 9}).status_code == 404


def test_a_work_directory_too_large_to_keep_turns_checkpoints_off_and_says_so(cli, llm, isolated, monkeypatch):
    from miniagi.checkpoints import tree as checkpoint_tree

    monkeypatch.setattr(checkpoint_tree, "MAX_PATHS", 20)
    for n in range(30):
        (isolated.work / f"f{n}.txt").write_text("x\n")
    llm.add(act("execute_shell", "echo y > new.txt"), act("done", "ok"))
    proc = cli("-y", "--unattended", "too many")
    assert proc.returncode == 0, proc.stderr  # the run goes on without them
    assert "checkpoints are off for the rest of this run: the work directory holds over 20 files and folders" \
        in proc.stderr
    assert "files" not in observations(isolated.home)[1]  # not known, so not said
    assert cli("undo", run_dirs(isolated.home)[-1].name, "-y").returncode == 2


def test_what_changes_between_steps_without_the_run_is_kept_apart_and_never_undone(cli, llm, isolated):
    work = isolated.work
    (work / "shared.txt").write_text("v1\n")
    agent_requests = []

    def person_edits_while_the_model_thinks(request):
        if request["messages"][0]["role"] == "system":
            agent_requests.append(request)
            if len(agent_requests) == 2:  # between step 1 and step 2
                (work / "shared.txt").write_text("edited by the person\n")
                (work / "theirs.txt").write_text("made by the person\n")
        return None

    llm.responder = person_edits_while_the_model_thinks
    llm.add(act("execute_shell", "echo v2 > shared.txt && echo r > run.txt"),
            act("execute_shell", "echo v3 >> shared.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "edit").returncode == 0
    seen = observations(isolated.home)
    assert seen[1]["files"] == {"run.txt": "added", "shared.txt": "modified"}
    assert seen[2]["files"] == {"shared.txt": "modified"}  # the person's new file is not the step's
    run_id = run_dirs(isolated.home)[-1].name
    step_2 = cli("diff", run_id, "--step", "2").stdout
    assert "\n edited by the person\n+v3\n" in step_2  # the step's own change, from what it found
    proc = cli("undo", run_id, "-y")
    assert proc.returncode == 1
    assert "shared.txt (changed outside the run while it ran, after step 0)" in proc.stderr
    assert (work / "shared.txt").read_text() == "edited by the person\nv3\n"
    assert (work / "theirs.txt").exists() and not (work / "run.txt").exists()


def test_undo_in_a_terminal_shows_the_diff_and_asks_first(cli, llm, isolated):
    from .test_interactive import run_in_terminal

    (isolated.work / "a.txt").write_text("mine\n")
    llm.add(act("execute_shell", "echo theirs > a.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "edit").returncode == 0
    run_id = run_dirs(isolated.home)[-1].name
    declined = run_in_terminal(llm, isolated, "n\n", "undo", run_id)
    assert declined.returncode == 1 and "-theirs" in declined.stdout and "+mine" in declined.stdout
    assert f"Put {isolated.work} back as it was before the run (1 path to change)?" in declined.stdout
    assert "nothing was changed" in declined.stderr
    assert (isolated.work / "a.txt").read_text() == "theirs\n"
    accepted = run_in_terminal(llm, isolated, "y\n", "undo", run_id)
    assert accepted.returncode == 0, accepted.stderr
    assert f"undone: {isolated.work} is back as it was before the run (1 path changed)" in accepted.stderr
    assert (isolated.work / "a.txt").read_text() == "mine\n"


def test_a_damaged_store_is_said_in_one_line_never_restored_from(cli, llm, isolated):
    (isolated.work / "a.txt").write_text("original\n")
    llm.add(act("execute_shell", "echo changed > a.txt"), act("done", "ok"))
    assert cli("-y", "--unattended", "edit").returncode == 0
    run_dir = run_dirs(isolated.home)[-1]
    blobs = run_dir / "checkpoints" / "blobs"
    blobs.write_bytes(blobs.read_bytes().replace(b"original", b"tampered"))
    diff = cli("diff", run_dir.name)
    assert diff.returncode == 2 and one_line(diff.stderr) and "is damaged" in diff.stderr
    assert cli("undo", run_dir.name, "-y").returncode == 2
    assert (isolated.work / "a.txt").read_text() == "changed\n"


def test_a_work_directory_that_holds_the_home_does_not_keep_the_home(cli, llm, isolated):
    """`miniagi` run in ~ with the default home ~/.miniagi: the checkpoints must not keep themselves (nor the
    memory, nor other runs)."""
    home = isolated.work / ".miniagi"
    llm.add(act("execute_shell", "echo x > a.txt"), act("execute_shell", "echo y > b.txt"), act("done", "ok"))
    proc = cli("-y", "--unattended", "--sandbox", "namespace", "work at home", env={"MINIAGI_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(home)
    events = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    assert [e["files"] for e in events if e["type"] == "observation"][:2] == [{"a.txt": "added"}, {"b.txt": "added"}]
    assert b"run_start" not in (run_dir / "checkpoints" / "blobs").read_bytes()  # no trace of its own kept
    assert cli("undo", run_dir.name, "-y", env={"MINIAGI_HOME": str(home)}).returncode == 0
    assert os.listdir(isolated.work) == [".miniagi"]
