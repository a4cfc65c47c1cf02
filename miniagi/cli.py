"""The command line. `miniagi "objective"` is `miniagi run "objective"`; the other commands inspect and continue
runs. Usage and configuration problems print one line and exit 2."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sys

from . import __version__
from .config import OPTIONS, OPTIONS_BY_NAME, ConfigError, Option, forget_dotenv, read_settings_files, resolve_settings
from .run_store import STATUSES, WHOLE_RUN_ID

COMMAND_HELP = {
    "run": "work on an objective (the default command)",
    "resume": "continue an interrupted or limit-stopped run",
    "runs": "list runs, newest first",
    "show": "show a run step by step",
    "memory": "inspect the persistent memory: search \"QUERY\" | stats | clear",
    "batch": "run the objectives of a file unattended, in parallel",
    "replay": "re-drive a recorded run with its recorded model replies: no model calls",
    "ui": "start, watch and steer runs in a browser (pip install \"miniagi[ui]\")",
    "chat": "an interactive session: each line is the next objective; Python state, memory and summary carry over",
    "diff": "show what a run (or one of its steps) changed in its work directory, as a unified diff",
    "undo": "put a run's work directory back as it was before the run (or after one of its steps)",
    "setup": "ask for the model endpoint, key and model, check them, and keep them in ~/.miniagi/.env",
    "tools": "list the commands a run here would offer: the built-in ones and the MCP servers' tools",
}

# a single word given as the objective that is surely meant as a command: what it likely meant
MEANT = {"help": "miniagi --help", "version": "miniagi --version", "list": "miniagi runs", "ls": "miniagi runs",
         "ps": "miniagi runs", "status": "miniagi runs", "history": "miniagi runs", "logs": "miniagi show last",
         "log": "miniagi show last", "last": "miniagi show last", "config": "miniagi setup",
         "configure": "miniagi setup", "settings": "miniagi setup", "init": "miniagi setup", "login": "miniagi setup",
         "mcp": "miniagi tools", "commands": "miniagi tools", "web": "miniagi ui", "serve": "miniagi ui",
         "continue": "miniagi resume last", "undo": "miniagi undo last", "diff": "miniagi diff last"}


class Parser(argparse.ArgumentParser):
    """Whole option names only (`--max-step` is an error, not `--max-steps`), and an unknown option is told the
    closest known one. Subcommands' parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if self._subparsers is not None and args[:2] == ["batch", "report"]:
            args[:2] = ["batch-report"]  # `miniagi batch report DIR…`: a command of its own (no batch FILE is "report")
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """A usage error is one line (not the whole usage first), and says where the usage is."""
        hint = "" if "--help" in message else f" (`{self.prog} --help` shows the usage)"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")

    def unknown(self, extras: list[str]) -> None:
        import difflib

        known = [name for action in self._actions for name in action.option_strings]
        problems = []
        for extra in extras:
            name = extra.split("=", 1)[0]
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) if name.startswith("-") else []
            problems.append(f"{extra} (did you mean {close[0]}?)" if close else extra)
        what = "option" if len(extras) == 1 and extras[0].startswith("-") else "arguments"
        self.error(f"unknown {what}: {', '.join(problems)} — "
                   f"`{self.prog} --help` lists them")


def _add_option(group, option: Option) -> None:
    """One option as it is declared: its flags, environment names, default and help."""
    env = ", ".join(option.env_names)
    if option.negated_alias:
        env += f"; {option.negated_alias}=false means the same, as in MiniAGI"
        env = env.replace(f", {option.negated_alias};", ";")
    default = f" (default: {option.default_text})" if option.default_text and not option.boolean else ""
    if option.boolean:
        action = argparse.BooleanOptionalAction if option.negatable else "store_const"
        extra = {} if option.negatable else {"const": True}
        group.add_argument(*option.flags, dest=option.name, action=action, default=None,
                           help=f"{option.help} [{env}]", **extra)
    else:
        group.add_argument(*option.flags, dest=option.name, metavar=option.metavar, default=None,
                           action="append" if option.repeatable else "store", help=f"{option.help}{default} [{env}]")


def _add_options(parser: argparse.ArgumentParser, *names: str) -> None:
    """Run options another command takes too (--home), as they are declared."""
    for name in names:
        _add_option(parser, OPTIONS_BY_NAME[name])


def _add_run_options(parser: argparse.ArgumentParser, with_json: bool = True) -> None:
    group = parser.add_argument_group("options (each also an environment variable; flag > env > ./.env > default)")
    for option in OPTIONS:
        _add_option(group, option)
    if with_json:
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _add_follow_options(parser: argparse.ArgumentParser, what: str) -> None:
    follow = parser.add_mutually_exclusive_group()
    follow.add_argument("-c", "--continue", dest="follow_newest", action="store_true",
                        help=f"{what} the newest run of this work directory: its objective, answer, summary and "
                             "notes are in context")
    follow.add_argument("--cid", default=None, metavar="RUN_ID", help=f"{what} the given run (an id, a unique prefix, "
                        "or last: the newest of this work directory)")


# the options most runs use, shown by `miniagi --help` (`miniagi run --help` lists them all)
MAIN_RUN_OPTIONS = ("model", "yes", "max_steps", "max_cost", "workdir", "protocol", "critic", "debug")


def _main_options() -> str:
    """The main run options for the top-level help, wrapped to the terminal (as argparse wraps its own parts)."""
    import shutil
    import textwrap

    width = min(100, max(60, shutil.get_terminal_size().columns - 2))
    lines = textwrap.wrap("main run options (`miniagi run --help` lists them all, each also an environment "
                          "variable):", width)
    for name in MAIN_RUN_OPTIONS:
        option = OPTIONS_BY_NAME[name]
        flags = ", ".join(option.flags) + (f" {option.metavar}" if option.metavar and not option.boolean else "")
        default = f" (default: {option.default_text})" if option.default_text and not option.boolean else ""
        lines.append(textwrap.fill(f"{option.help}{default}", width, initial_indent=f"  {flags:<24}",
                                   subsequent_indent=" " * 26, break_on_hyphens=False))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="miniagi",
        usage='miniagi [OPTIONS] "OBJECTIVE"  |  miniagi COMMAND ...',
        description="An autonomous agent: give it an objective, it works in short steps until done.",
        epilog=_main_options() + '\n\nexamples:\n  miniagi setup      (first: the model endpoint, key and model)\n'
               '  miniagi -y -m gpt-4o "Find the largest file in this folder"\n'
               "  miniagi runs      miniagi show last      miniagi resume last      miniagi chat",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"miniagi {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", prog="miniagi")

    run = commands.add_parser("run", help=COMMAND_HELP["run"], description=COMMAND_HELP["run"])
    run.add_argument("objective", nargs="+", help="what the agent should achieve (- reads it from stdin)")
    _add_follow_options(run, "a follow-up of")
    _add_run_options(run)
    _add_control_option(run)

    chat = commands.add_parser("chat", help=COMMAND_HELP["chat"], description=COMMAND_HELP["chat"] + ". Every "
                               "objective is a run of its own, linked to the one before. Ctrl-D (or an end of "
                               "input) ends the session.")
    _add_follow_options(chat, "start as a follow-up of")
    _add_run_options(chat)
    _add_control_option(chat)

    resume = commands.add_parser("resume", help=COMMAND_HELP["resume"],
                                 description=COMMAND_HELP["resume"] + ". It runs with the settings it was started "
                                 "with, none wider than your current ones (--pass-env, -y, a higher --max-cost: give "
                                 "them again); options given here override them (raise --max-steps or --max-cost to "
                                 "go on past a limit).")
    resume.add_argument("run_id", help="the run's id, a unique prefix of it, or last (the newest run)")
    _add_run_options(resume)
    _add_control_option(resume)

    runs = commands.add_parser("runs", help=COMMAND_HELP["runs"], description=COMMAND_HELP["runs"])
    runs.add_argument("--status", choices=STATUSES, help="only runs with this status")
    runs.add_argument("--json", action="store_true", help="print a JSON array of the runs' results")
    _add_options(runs, "home")

    show = commands.add_parser("show", help=COMMAND_HELP["show"], description=COMMAND_HELP["show"])
    show.add_argument("run_id", help="the run's id, a unique prefix of it, or last (the newest run)")
    show.add_argument("--raw", action="store_true", help="also print the raw model responses (and the prompts, kept "
                      "with --debug)")
    show.add_argument("--json", action="store_true", help="print the result and every trace event as JSON")
    show.add_argument("--prompt", type=int, default=None, metavar="N",
                      help="the messages the model was sent for step N (redacted), with what each part covers")
    _add_options(show, "home")

    batch = commands.add_parser("batch", help=COMMAND_HELP["batch"], description=COMMAND_HELP["batch"] + ". FILE is "
                                "a .txt (one objective per line) or a .jsonl ({\"id\", \"objective\", optionally "
                                "\"check\" (a shell command run in the work directory after the run: exit 0 is a "
                                "pass), \"expect\" (a regular expression the answer must match), \"setup\" (a folder "
                                "or a command that prepares a fresh work directory), and run options by their long "
                                "names with underscores}; see docs/batch.md). Running the same command again "
                                "skips the objectives already done and retries the rest. Exit 0 when every objective "
                                "ended done (and passed its check), else 3. `miniagi batch report DIR [DIR…]` sums "
                                "up results folders.")
    batch.add_argument("file", help="the objectives: .txt or .jsonl")
    batch.add_argument("--workers", type=int, default=2, help="objectives run at once (default 2)")
    batch.add_argument("--out", default=None, metavar="DIR", help="where results.jsonl and logs/ go (default: "
                       "jobs.txt → jobs-txt-results); each objective works in a fresh folder of its own, DIR/work/ID, "
                       "unless --workdir (or its line's workdir) names one")
    batch.add_argument("--max-batch-cost", type=float, default=None, metavar="USD",
                       help="start no new objective once the batch has spent this much")
    batch.add_argument("--timeout", type=float, default=None, metavar="S", help="stop an objective after S seconds")
    batch.add_argument("--repeat", type=int, default=1, metavar="N", help="run every objective N times (default 1)")
    batch.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="spread the objectives over a Ray cluster: 'auto' or ray://HOST:PORT joins one, "
                            "no address starts one on this machine (pip install 'miniagi[distributed]')")
    _add_run_options(batch, with_json=False)
    # `miniagi batch report DIR…` (Parser.parse_known_args turns it into this unlisted command)
    report = commands.add_parser("batch-report", prog="miniagi batch report",
                                 description="the summary of a batch's results folder, or several side by side: "
                                 "pass rate, cost, steps and model calls, per objective and in all")
    report.add_argument("folders", nargs="+", metavar="DIR", help="a results folder (or its results.jsonl)")
    report.add_argument("--json", action="store_true", help="print the figures as one JSON object")

    replay = commands.add_parser("replay", help=COMMAND_HELP["replay"], description=COMMAND_HELP["replay"] + ", "
                                 "commands executed again; reports the first step whose observation differs from "
                                 "the recording. Exit 0 when the replay reproduces the run, 1 when it differs.")
    replay.add_argument("source", help="a run id (a unique prefix, or last), or the path of a trace.jsonl")
    replay.add_argument("-y", "--yes", dest="yes", action="store_const", const=True, default=None,
                        help="run commands without asking for approval")
    replay.add_argument("--workdir", default=None, help="run the commands here instead of the recorded workdir")
    _add_options(replay, "home")
    replay.add_argument("--json", action="store_true", help="print the report as one JSON object")

    ui = commands.add_parser("ui", help=COMMAND_HELP["ui"], description=COMMAND_HELP["ui"] + ": start a run or a chat, "
                             "approve its commands, answer it, stop, resume and follow up; the runs step by step "
                             "(live), batches and the memory. Locked by a token printed in its URL.")
    ui.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=8765, help="default 8765")
    ui.add_argument("--open", action="store_true", help="open it in the browser")
    _add_options(ui, "home")
    ui.add_argument("--workdir", action="append", default=None, metavar="DIR",
                    help="a work directory runs started from the browser may use, besides this folder (repeatable)")

    diff = commands.add_parser("diff", help=COMMAND_HELP["diff"], description=COMMAND_HELP["diff"] + " (binary "
                               "files are named, not shown). Needs the run's checkpoints (on by default).")
    diff.add_argument("run_id", help="the run's id, a unique prefix of it, or last (the newest run)")
    diff.add_argument("--step", type=int, default=None, metavar="N", help="only what step N changed")
    _add_options(diff, "home")

    undo = commands.add_parser("undo", help=COMMAND_HELP["undo"], description=COMMAND_HELP["undo"] + ", byte for "
                               "byte, modes included: files it modified restored, files it made removed, files and "
                               "folders it deleted back. Shows the diff and asks first (-y: not). A path changed "
                               "since outside the run is left as it is, and named. Exit 0 when everything was put "
                               "back, 1 when something was left.")
    undo.add_argument("run_id", help="the run's id, a unique prefix of it, or last (the newest run)")
    undo.add_argument("--to-step", type=int, default=None, metavar="N", help="back to the files as they were after "
                      "step N (default: before the run)")
    undo.add_argument("-y", "--yes", action="store_true", help="undo without asking")
    _add_options(undo, "home")

    memory = commands.add_parser("memory", help=COMMAND_HELP["memory"], description=COMMAND_HELP["memory"])
    memory.add_argument("action", choices=("search", "stats", "clear"))
    memory.add_argument("query", nargs="*", help="what to look for (search)")
    memory.add_argument("--limit", type=int, default=10, help="at most this many results (search; default 10)")
    memory.add_argument("--all", action="store_true", help="also show results below the relevance cut-off (search)")
    memory.add_argument("--run", default=None, help="only this run's memories (search, clear)")
    memory.add_argument("--json", action="store_true", help="print JSON")
    _add_options(memory, "home", "embedding_model", "memory_url")
    memory.add_argument("-y", "--yes", action="store_true", help="clear without asking (clear)")

    commands.add_parser("setup", help=COMMAND_HELP["setup"], description=COMMAND_HELP["setup"] + " (mode 0600). "
                        "It asks for the endpoint (OpenAI, or the URL of an OpenAI-compatible server), the key and "
                        "the model (offering those the endpoint lists), and checks them with one short request "
                        "before it writes anything. Every later start reads that file, from any folder: after the "
                        "environment and ./.env, before the defaults.")

    tools = commands.add_parser("tools", help=COMMAND_HELP["tools"], description=COMMAND_HELP["tools"] + ", each "
                                "with its arguments. MCP servers (of --mcp-config, and of ./.mcp.json once you said "
                                "yes to it) are started to list their tools, then stopped; no run starts.")
    _add_options(tools, "mcp_config", "workdir", "home")
    tools.add_argument("--json", action="store_true", help="print the commands as a JSON array")
    parser.commands = commands.choices  # each subcommand's own parser, for its own usage errors
    return parser


def _add_control_option(parser: argparse.ArgumentParser) -> None:
    # not listed: how `miniagi ui` steers a run it started (approvals and questions as files in DIR)
    parser.add_argument("--control", default=None, metavar="DIR", help=argparse.SUPPRESS)


def _control_ui(args: argparse.Namespace, settings):
    """With --control DIR, the run asks `miniagi ui` (webui/control.py) instead of the terminal."""
    if not getattr(args, "control", None):
        return None
    from pathlib import Path

    from .webui.control import Channel, ControlledTerminal

    return ControlledTerminal(Channel(Path(args.control)), debug=settings.debug)


def _flags(args: argparse.Namespace) -> dict:
    return {option.name: getattr(args, option.name, None) for option in OPTIONS}


def _finish(result, as_json: bool) -> int:
    from .terminal import visible, visible_json

    if as_json:
        print(visible_json(result.summary))
    elif result.answer is not None:
        print(visible(result.answer))
    sys.stdout.flush()
    return result.exit_code


def _starting():
    """A sign of life while the agent's libraries load (a second or two) — in a terminal only."""
    from .terminal import make_console

    console = make_console(stderr=True)
    return console.status("starting…", spinner="dots") if console.is_terminal else contextlib.nullcontext()


def cmd_run(args: argparse.Namespace) -> int:
    from .endpoint import preload

    preload()  # the openai SDK is imported in a thread while the settings, .env and run directory are prepared
    settings = resolve_settings(_flags(args))
    objective = " ".join(args.objective)
    if objective == "-":  # from stdin: any size, any text (this is how batch hands objectives over)
        objective = sys.stdin.read()
    with _starting():
        from .agent import Agent
    # after the spinner: a question about ./.env is asked on a line of its own, the answer echoed
    agent = Agent(settings, ui=_control_ui(args, settings), wait_for_memory=False)  # the process ends after it
    try:
        result = agent.run(objective, follows=_followed(args, agent.store, settings.workdir_path))
    finally:
        agent.close()
    return _finish(result, args.json)


def _followed(args: argparse.Namespace, store, workdir) -> str | None:
    """The run a follow-up continues: -c (or --cid last) the newest of this work directory, --cid the given one."""
    if args.cid and args.cid.strip() != "last":
        return store.open(args.cid).run_id
    if args.follow_newest or args.cid:
        here = str(workdir)
        newest = store.results()
        for result in newest:
            if (result.get("workdir") or store.open(result["run_id"]).workdir()) == here:
                return result["run_id"]
        elsewhere = f"; the newest run anywhere is {newest[0]['run_id']}: `--cid {newest[0]['run_id']}` continues " \
                    "it" if newest else ""
        raise ConfigError(f"{'-c' if args.follow_newest else '--cid last'} continues the newest run of this work "
                          f"directory ({here}), and there is none under {store.root}{elsewhere}")
    return None


CHAT_EXIT = {"exit", "quit", "/exit", "/quit", "/q", ":q", "bye"}
CHAT_HELP_WORDS = {"help", "/help", "?", "/?"}
CHAT_HELP = ("Type an objective and press Enter; /help for help; exit, quit or Ctrl-D to leave.\n"
             "Each objective is a run of its own that follows the one before: Python variables, memory and the "
             "summary carry over.\n`miniagi runs` lists the runs afterwards, `miniagi show last` shows the newest.")


def cmd_chat(args: argparse.Namespace) -> int:
    """Objectives one line at a time; each is a run that follows the one before and shares its Python session."""
    settings = resolve_settings(_flags(args))
    with _starting():
        from .agent import Agent
    # after the spinner: it may ask about ./.env
    agent = Agent(settings, ui=_control_ui(args, settings), wait_for_memory=False)  # the process ends after it
    workspace, code = None, 0
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        from rich.markup import escape

        from .terminal import visible

        agent.services.ui.echo_objective = False  # the person just typed it
        agent.services.ui.say(f"[bold]miniagi chat[/] · model {escape(visible(settings.model))} · folder "
                     f"{escape(visible(str(settings.workdir_path)))}\n[dim]{CHAT_HELP.splitlines()[0]}[/]")
    try:
        previous = _followed(args, agent.store, settings.workdir_path)
        while True:
            if interactive:
                print("› ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:  # Ctrl-D, or the end of the piped input
                break
            objective = line.strip()
            if not objective:
                continue
            if objective.lower() in CHAT_EXIT:
                break
            if objective.lower() in CHAT_HELP_WORDS:
                print(CHAT_HELP, file=sys.stderr)
                continue
            # the session's Python goes on to the next objective: the workspace is closed at the end
            run = agent.start(objective, follows=previous, workspace=workspace, keep_workspace=True)
            workspace = run.workspace
            result = run.drive()
            code = _finish(result, args.json)
            previous = result.run_id
    finally:
        if workspace is not None:
            workspace.close()
        agent.close()
    return code


def cmd_resume(args: argparse.Namespace) -> int:
    from .endpoint import preload

    preload()
    from .agent import Agent, recorded_settings
    from .trust import narrowed, recorded_workdir, resume_flags

    flags = _flags(args)
    store = _store(args)
    overrides = {name: value for name, value in flags.items() if value is not None}
    # the recorded settings, none wider than the user's current ones (code the run executed could have rewritten
    # the trace), with what was given now on top; runs stay where they were found
    recorded = recorded_settings(store, args.run_id)
    if not overrides.get("workdir") and store.open(args.run_id).workdir():  # where it worked, unless told otherwise
        recorded_workdir(recorded.workdir, store.open(args.run_id).workdir_identity(), "; give --workdir to choose one")
    settings, differences = narrowed(recorded, resolve_settings(flags))
    settings = settings.with_overrides({**overrides, "home": str(store.root.parent)})
    agent = Agent(settings, ui=_control_ui(args, settings), wait_for_memory=False)  # the process ends after it
    said = [name for name in differences if name not in overrides and name != "home"]
    if said:
        again = resume_flags(recorded, leave=tuple(name for name in recorded.__dataclass_fields__
                                                   if name not in said))
        agent.services.ui.warn("not taken from the run's trace: " + "; ".join(differences[name] for name in said)
                      + f". To run with them, add `{again.strip()}` to the command")
    try:
        result = agent.resume(args.run_id)
    finally:
        agent.close()
    return _finish(result, args.json)


def cmd_runs(args: argparse.Namespace) -> int:
    from .report import print_runs

    print_runs(_store(args), status=args.status, as_json=args.json)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from .report import print_prompt, print_run

    if args.prompt is not None:
        return print_prompt(_store(args).open(args.run_id), args.prompt, as_json=args.json)
    print_run(_store(args).open(args.run_id), raw=args.raw, as_json=args.json)
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .batch import Batch, judge_lines, read_objectives

    path = Path(args.file)
    objectives = read_objectives(path)
    if args.workers < 1 or args.repeat < 1:
        raise ConfigError("--workers and --repeat must be at least 1")
    options = {name: value for name, value in _flags(args).items() if value is not None}
    settings = resolve_settings(options)  # a bad option fails here, once, not in every worker
    check_dotenv(settings)  # its checks run with the sandbox and limits of ./.env, and its results go to its home
    objectives = judge_lines(path, objectives, settings, _person())  # a line code wrote widens nothing unasked
    # from the whole file name: jobs.txt and jobs.jsonl beside each other keep their results apart
    out = Path(args.out) if args.out else path.with_name(path.name.replace(".", "-") + "-results")
    cluster = None
    if args.ray:
        from .batch import RayCluster

        cluster = RayCluster(args.ray)
    try:
        return Batch(objectives, out, workers=args.workers, options=options, max_batch_cost=args.max_batch_cost,
                     timeout_s=args.timeout, repeat=args.repeat, home=settings.home_path, source=path,
                     cluster=cluster).run()
    finally:
        if cluster is not None:
            cluster.close()


def cmd_batch_report(args: argparse.Namespace) -> int:
    from .batch_report import report

    return report(args.folders, as_json=args.json, home=resolve_settings({}).home_path)


def cmd_replay(args: argparse.Namespace) -> int:
    from .replay import replay
    from .terminal import Terminal, visible, visible_json

    settings = resolve_settings({"home": args.home})
    ui = Terminal(interactive=sys.stdin is not None and sys.stdin.isatty())
    report = replay(args.source, settings, {"yes": args.yes, "workdir": args.workdir}, ui=ui)
    if args.json:
        print(visible_json(report.to_dict()))
        return 0 if report.reproduced else 1
    lines = [f"replayed run {report.original} as run {report.replay_run}: {report.steps} steps, "
             f"{report.replayed_responses} recorded responses, {report.model_calls} model calls"]
    if report.reproduced:
        lines.append(f"reproduced: every observation matches the recording (status {report.status})")
    elif report.first_difference:
        first = report.first_difference
        lines += [f"first difference at step {first['step']} ({first['command']}), {len(report.differences)} "
                  f"differing steps in all", f"--- recorded:\n{first['recorded']}\n--- replayed:\n{first['replayed']}"]
    else:
        lines.append(f"the run ended {report.status}; the recording ended {report.recorded_status}")
    print(visible("\n".join(lines)))  # the recording's texts are the model's and executed code's
    return 0 if report.reproduced else 1


def cmd_diff(args: argparse.Namespace) -> int:
    from .checkpoints.history import print_diff

    print_diff(_store(args).open(args.run_id), args.step)
    return 0


def cmd_undo(args: argparse.Namespace) -> int:
    from .checkpoints.history import undo

    return undo(_store(args, checked=True).open(args.run_id), args.to_step, yes=args.yes)


class MemoryUnavailable(Exception):
    """The vector memory cannot be opened or reached: one line, exit 1."""


def cmd_memory(args: argparse.Namespace) -> int:
    from .agent import open_vector_memory
    from .config import read_settings_files
    from .redaction import Redactor

    settings = resolve_settings({"home": args.home, "embedding_model": args.embedding_model,
                                 "memory_url": args.memory_url})
    checked_when_from_dotenv(settings, "home", "embedding_model", "memory_url")
    redact = Redactor(os.environ, read_settings_files())  # memories stored before the secret gate existed, too
    # (and the journals opening the store stores pass the gate again)
    vectors = open_vector_memory(settings.with_overrides({"memory_scope": "global"}), os.environ, None, redact)
    if args.run:
        args.run = _memory_run(settings, args.run)
    where = {"run": args.run} if args.run else None
    try:
        return _memory_action(args, vectors, settings, where, redact)
    except (ConfigError, OSError):
        raise
    except Exception as exc:  # chromadb: a server that is not there, a store it cannot open
        raise MemoryUnavailable(f"the memory at {settings.memory_url or settings.home_path / 'memory'} cannot be "
                                f"used: {type(exc).__name__}: {exc}") from None


def _memory_run(settings, run_id: str) -> str:
    """--run takes an id as every command does (a unique prefix, or last); memories outlive a run's folder, so an
    id that no run folder starts with is taken as it is."""
    from .run_store import RUN_ID, RunStore

    store = RunStore(settings.home_path)
    names = [p.name for p in store.root.iterdir()] if store.root.is_dir() else []
    if run_id != "last" and RUN_ID.fullmatch(run_id) and not any(name.startswith(run_id) for name in names):
        return run_id
    return store.open(run_id).run_id


def _memory_action(args: argparse.Namespace, vectors, settings, where, redact) -> int:
    from .report import print_memory_hits, print_memory_stats

    if args.action == "search":
        query = " ".join(args.query).strip()
        if not query:
            raise ConfigError('memory search needs a query: miniagi memory search "what to look for"')
        hits = vectors.search(query, max(1, args.limit), where=where)
        cut = getattr(vectors.embedder, "relevant_distance", None)
        relevant = [hit for hit in hits if args.all or cut is None or hit.distance <= cut]
        print_memory_hits(relevant, as_json=args.json, redact=redact, left_out=len(hits) - len(relevant))
    elif args.action == "stats":
        print_memory_stats(vectors.stats(), as_json=args.json)
    else:
        _clear_memory(args, vectors, settings, where)
    return 0


def _clear_memory(args: argparse.Namespace, vectors, settings, where) -> None:
    """Deleting memories is never done unasked: a terminal asks, anything else needs --yes."""
    from .text import plural

    count = vectors.count(where)
    what = f"the {count} memories of run {args.run}" if args.run else f"ALL {count} memories (every run's)"
    place = settings.memory_url or settings.home_path / "memory"
    if args.run and not count:
        raise ConfigError(f"no memories of run {args.run!r} in {place}: `miniagi memory stats` shows how many "
                          "runs it holds, `miniagi runs` lists the runs")
    if count and not args.yes:
        if sys.stdin is None or not sys.stdin.isatty():
            raise ConfigError(f"memory clear would delete {what} in {place}; without a terminal to ask in, "
                              "confirm with --yes")
        answer = input(f"Delete {what} in {place}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing was deleted")
            raise SystemExit(1)
    removed = vectors.delete(where) if count else 0
    print(json.dumps({"removed": removed}) if args.json else
          f"removed {plural(removed, 'memory', 'memories')}{f' of run {args.run}' if args.run else ''}")


def check_dotenv(settings) -> None:
    """The .env check a run makes (trust.py's one rule), for a command that takes settings from ./.env without
    starting a run of its own first: `ui` (its home), `batch` (its home, and the sandbox its checks run in). A
    .env that code of a run could have written is asked about, or refused with no terminal."""
    from .trust import DotenvGuard

    DotenvGuard(settings, os.environ).check(_person())


def _person():
    """The terminal to ask the person at, when stdin is one."""
    from .terminal import Terminal

    return Terminal(interactive=sys.stdin is not None and sys.stdin.isatty())


def cmd_setup(args: argparse.Namespace) -> int:
    from .user_setup import run_setup

    return run_setup()


def cmd_tools(args: argparse.Namespace) -> int:
    """The commands a run with these settings would offer; MCP servers started only to list theirs."""
    from .commands import CommandTable
    from .mcp_tools import McpTools
    from .redaction import Redactor
    from .terminal import Terminal, visible, visible_json

    settings = resolve_settings({"mcp_config": args.mcp_config, "workdir": args.workdir, "home": args.home})
    check_dotenv(settings)  # its servers may come from ./.env (MINIAGI_MCP_CONFIG)
    ui = Terminal(interactive=sys.stdin is not None and sys.stdin.isatty())
    redact = Redactor(os.environ, read_settings_files())
    ui.serve(redact)
    mcp = McpTools.configured(settings, ui)
    redact.include(*(spec.secrets() for spec in mcp.specs))
    try:
        with _starting():
            mcp.start()
        listed = [command.listing() for command in CommandTable(mcp.commands).actions()]
    finally:
        mcp.close()
    if args.json:
        print(visible_json(listed))
        return 0
    built_in = [c for c in listed if "server" not in c]
    from_servers = [c for c in listed if "server" in c]
    servers = ", ".join(dict.fromkeys(c["server"] for c in from_servers))
    lines = [f"{len(built_in)} built-in commands:", *_described(built_in), "",
             f"{len(from_servers)} MCP tools (servers: {servers}):" if from_servers else
             "no MCP tools: --mcp-config FILE (or ./.mcp.json) names servers (see docs/mcp.md)",
             *_described(from_servers)]
    print(visible(redact("\n".join(lines))))
    return 0


def _described(commands: list[dict]) -> list[str]:
    return [line for c in commands for line in (f"  {c['name']} {c['arguments']}", f"      {c['doc']}")]


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        from .webui.app import listen, serve
        from .webui.auth import new_token
    except ImportError as exc:
        raise ConfigError(f"the web UI needs its extra: pip install \"miniagi[ui]\" ({exc.name} is missing)") from None
    from pathlib import Path

    from .config import read_settings_files
    from .redaction import Redactor

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"miniagi: warning: the UI listens on {args.host}: anyone who can reach this machine on port "
              f"{args.port} and has the URL below can read every run and run code as you", file=sys.stderr)
    settings = resolve_settings({"home": args.home})
    check_dotenv(settings)  # its home may come from ./.env
    home = settings.home_path
    workdirs = [Path(d).expanduser().resolve() for d in [".", *(args.workdir or [])]]
    missing = [str(d) for d in workdirs if not d.is_dir()]
    if missing:
        raise ConfigError(f"--workdir {missing[0]}: no such folder")
    sock = listen(args.host, args.port)
    token = new_token()  # in this process's memory only: never in a file, nor in the runs' environment
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"miniagi ui: http://{host}:{args.port}/?token={token}\n  (runs under {home}; work directories: "
          f"{', '.join(map(str, dict.fromkeys(workdirs)))}; Ctrl-C stops it)", file=sys.stderr, flush=True)
    serve(sock, home, args.host, args.port, args.open, Redactor(os.environ, read_settings_files()), token,
          list(dict.fromkeys(workdirs)))
    return 0


def _store(args: argparse.Namespace, checked: bool = False):
    """The runs under the home the settings name; `checked`: for a command that changes or starts something (undo),
    the home taken from ./.env only after the .env check a run makes."""
    from .run_store import RunStore

    settings = resolve_settings({"home": args.home})
    if checked:
        check_dotenv(settings)
    else:
        checked_when_from_dotenv(settings, "home")
    return RunStore(settings.home_path)


def checked_when_from_dotenv(settings, *names: str) -> None:
    """The .env check a run makes, when one of these settings comes from ./.env: a home, a memory store or server
    that code of a run could have named there is not opened (nor written) before the user's yes to that file."""
    from .config import read_dotenv
    from .trust import sensitive_values

    used = sensitive_values(read_dotenv(), os.environ, settings)
    if any(env in used for name in names for env in OPTIONS_BY_NAME[name].env_names):
        check_dotenv(settings)


# a home that cannot be used is a configuration problem; anything else that fails to write is the disk
UNUSABLE_PLACE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR}

HANDLERS = {"run": cmd_run, "resume": cmd_resume, "runs": cmd_runs, "show": cmd_show, "memory": cmd_memory,
            "batch": cmd_batch, "batch-report": cmd_batch_report, "replay": cmd_replay, "chat": cmd_chat,
            "ui": cmd_ui, "diff": cmd_diff, "undo": cmd_undo, "setup": cmd_setup, "tools": cmd_tools}


def compact_malloc() -> None:
    """Ask glibc to give freed memory back and keep few arenas: the embedder allocates and frees buffers of many
    sizes from two threads, and by default that fragments the heap by ~100 MB over a few hundred steps."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    forget_dotenv()  # .env is read once per start: a file changed since the last start (in-process calls) is new
    compact_malloc()
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    implied = argv[0] not in HANDLERS and argv[0] not in ("-h", "--help", "--version")
    if implied:
        argv.insert(0, "run")  # the default command: `miniagi "objective"`
    extras: list[str] = []
    try:
        # a usage error prints the usage and one line, and exits 2
        args, extras = parser.parse_known_args(argv)
        if extras:
            parser.commands[args.command].unknown(extras)
    except SystemExit as stop:
        mistyped = bool(extras) and extras[0].startswith("-")  # an option (and its value), not an objective
        if stop.code == 2 and argv[0] in HANDLERS and argv[0] != "run" and argv[:2] != ["batch", "report"] \
                and not mistyped:
            _objective_hint(argv)
        raise
    if implied and len(args.objective) == 1 and re.fullmatch(r"[\w-]+", args.objective[0]):
        meant = _meant(args.objective[0])
        if meant:  # `miniagi ls`: a command mistyped or guessed, not a paid run
            _complain(f"{args.objective[0]!r} is not a miniagi command: did you mean {meant}? (a one-word objective: "
                      f"miniagi run {args.objective[0]})")
            return 2
    try:
        return HANDLERS[args.command](args)
    except ConfigError as error:
        _complain(str(error))
        if str(error).startswith("no run ") and argv[0] in ("show", "resume", "replay") and len(argv) > 1 \
                and not any(WHOLE_RUN_ID.fullmatch(word) for word in argv[1:]):  # words, not an id: an objective?
            _objective_hint(argv)
        return 2
    except KeyboardInterrupt:
        print("miniagi: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `miniagi runs | head`
        return 0
    except MemoryUnavailable as error:
        _complain(str(error))
        return 1
    except OSError as error:  # the home or the disk: unwritable, full, a file where a folder should be
        where = f" {error.filename}" if error.filename else ""
        _complain(f"cannot use{where}: {error.strerror or error}{_home_hint(args, error)}")
        return 2 if error.errno in UNUSABLE_PLACE else 1  # else: the disk (full, failing)


def _home_hint(args: argparse.Namespace, error: OSError) -> str:
    """When the place that cannot be used is the home, say how to choose another."""
    home = getattr(args, "home", None) or os.environ.get("MINIAGI_HOME") or "~/.miniagi"
    home_path = os.path.realpath(os.path.expanduser(home))
    filename = os.path.realpath(str(error.filename)) if error.filename else ""
    if error.errno not in UNUSABLE_PLACE or not (filename == home_path or filename.startswith(home_path + os.sep)):
        return ""
    return f" (runs and memory live in {home_path}: give --home DIR or set MINIAGI_HOME to a writable folder)"


def _complain(text: str) -> None:
    """An error line: no secret on it (a URL it names may hold a password), nothing that drives the terminal."""
    from .config import read_settings_files
    from .redaction import Redactor
    from .terminal import visible

    try:
        dotenv = read_settings_files()
    except ConfigError:  # the .env itself is what is wrong
        dotenv = {}
    print(f"miniagi: {visible(Redactor(os.environ, dotenv)(text))}", file=sys.stderr)


def _meant(word: str) -> str:
    """The command a lone word most likely meant ("" for a word that may well be a one-word objective)."""
    import difflib

    word = word.strip().lower()
    names = [name for name in HANDLERS if name not in ("run", "batch-report")] + list(MEANT)
    close = [word] if word in MEANT else difflib.get_close_matches(word, names, n=2, cutoff=0.75)
    return " or ".join(dict.fromkeys(MEANT.get(name, f"miniagi {name}") for name in close))


def _objective_hint(argv: list[str]) -> None:
    """`miniagi show me the largest file` meant an objective that starts with a command's name."""
    words = " ".join(argv)
    print(f"miniagi: {argv[0]!r} is a miniagi command; if \"{words}\" is an objective, quote it or say run first: "
          f"miniagi run \"{words}\"", file=sys.stderr)


class ReaderMayLeave:
    """stdout or stderr whose reader may go away (`miniagi … | head -3`): once a write finds the pipe closed, what
    follows is dropped, so the run goes on to its end and records it rather than dying of the first line it shows."""

    def __init__(self, stream):
        self.stream, self.gone = stream, False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except (BrokenPipeError, ValueError):  # a closed pipe; a closed stream
                self.gone = True
            except OSError as error:
                if error.errno != errno.EPIPE:
                    raise
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            self.write("")
            try:
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                self.gone = True

    def __getattr__(self, name: str):  # isatty, fileno, encoding…: the stream's own
        return getattr(self.stream, name)


def entry() -> None:
    """The `miniagi` command. Everything is written and closed by the time main() returns, so the process ends
    at once: interpreter finalization can abort in native thread pools (onnxruntime, chromadb) that are still
    winding down, turning a finished run's exit code into SIGABRT."""
    import signal

    # SIGINT is how a run is stopped with its state saved (Ctrl-C, a batch stopping its objectives, a snippet's
    # timeout reaching the Python worker). A process started in the background by a shell without job control
    # inherits it ignored, and so would every process it starts: take it back, so the interrupt always works.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdout, sys.stderr = ReaderMayLeave(sys.stdout), ReaderMayLeave(sys.stderr)
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
