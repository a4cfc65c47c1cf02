"""The README and docs/ say what is true: the options table is the one generated from the option declarations,
every `miniagi` invocation in a shell example parses with the real argument parser, and every relative link leads
to a file (and heading) that exists."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from miniagi.cli import build_parser
from miniagi.config import options_table

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "console")
OPERATORS = {"|", "||", "&&", ";", "&", "(", ")"}


# ---- reading the Markdown ------------------------------------------------------------------------------------

def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) of every shell example: the lines of ```bash / ```sh / ```console blocks (in a
    console block only the `$ ` lines), continuations joined, here-document bodies left out."""
    found: list[tuple[int, str]] = []
    fence, heredoc_end, pending, pending_line = None, None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"\s*```+\s*(\w*)", line)
            if match:
                fence = match.group(1).lower() or "text"
            continue
        if stripped.startswith("```"):
            fence, heredoc_end = None, None
            continue
        if fence not in SHELL_FENCES:
            continue
        if heredoc_end is not None:
            if stripped == heredoc_end:
                heredoc_end = None
            continue
        if fence == "console":
            if not pending and not stripped.startswith("$ "):
                continue  # output, not a command
            if not pending:
                line = stripped[2:]
        if not pending:
            pending_line = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = pending + line
        pending = ""
        heredoc = re.search(r"<<-?\s*(['\"]?)(\w+)\1", command)
        if heredoc:
            heredoc_end = heredoc.group(2)
            command = command[:heredoc.start()]
        found.append((pending_line, command))
    return found


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a word outside quotes (as the shell reads it: `a#b` is one word)."""
    quote, index = None, 0
    while index < len(line):
        char = line[index]
        if char == "\\" and quote != "'":
            index += 1  # the next character is escaped
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
        index += 1
    return line


def _substitutions(word: str) -> tuple[str, list[str]]:
    """A word with each `$(…)` replaced by a placeholder, and the commands inside them."""
    inner: list[str] = []
    while "$(" in word:
        start = word.index("$(")
        depth, end = 0, None
        for index in range(start + 1, len(word)):
            if word[index] == "(":
                depth += 1
            elif word[index] == ")":
                depth -= 1
                if depth == 0:
                    end = index
                    break
        if end is None:
            raise ValueError("unbalanced $(")
        inner.append(word[start + 2:end])
        word = word[:start] + "SUBSTITUTED" + word[end + 1:]
    return word, inner


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, each a list of words: split at pipes, `&&`, `||`, `;` and `$(…)` (whose
    inside is a command of its own), without redirections, comments or leading NAME=value assignments."""
    line, inner = _substitutions(re.sub(r"(?<=\s)\d(?=>)", "", _without_comment(line)))  # `2> f` → `> f`
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in OPERATORS:
            commands.append([])
        elif set(token) <= set("<>&"):
            skip_next = True  # a redirection and its target
        elif not commands[-1] and re.fullmatch(r"[A-Za-z_]\w*=.*", token):
            continue  # an environment assignment before the command
        else:
            commands[-1].append(token)
    result = [command for command in commands if command]
    for text in inner:
        result += simple_commands(text)
    return result


def miniagi_arguments(command: list[str]) -> list[str] | None:
    """The arguments of a `miniagi …` (or `python -m miniagi …`) command; None for any other command."""
    if command[0] == "miniagi":
        return command[1:]
    if re.fullmatch(r"(\S*/)?python3?", command[0]) and command[1:3] == ["-m", "miniagi"]:
        return command[3:]
    return None


def parse_problem(arguments: list[str]) -> str | None:
    """What the real parser says is wrong with these arguments (as `miniagi` itself routes them), or None."""
    parser = build_parser()
    argv = list(arguments)
    if argv and argv[0] not in parser.commands and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "run")  # the default command, as cli.main does
    if not argv:
        return "no arguments: miniagi prints its usage and exits 2"
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            args, extras = parser.parse_known_args(argv)
            if extras:
                parser.commands[args.command].unknown(extras)  # names the closest option, as cli.main does
    except SystemExit as stop:
        return None if stop.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


def invocations(path: Path) -> list[tuple[int, list[str]]]:
    found = []
    for number, line in shell_lines(path.read_text()):
        try:
            commands = simple_commands(line)
        except ValueError as error:  # unbalanced quotes or $(
            raise AssertionError(f"{path.relative_to(ROOT)}:{number}: cannot read {line!r}: {error}") from None
        for command in commands:
            arguments = miniagi_arguments(command)
            if arguments is not None:
                found.append((number, arguments))
    return found


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", _without_code(text), re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def _without_code(text: str) -> str:
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _without_code(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{path.relative_to(root)}: link to {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{path.relative_to(root)}: link to {target}: no heading with that anchor")
    return problems


# ---- the checks ------------------------------------------------------------------------------------------------

def test_the_readme_options_table_is_the_generated_one():
    readme = ROOT.joinpath("README.md").read_text().splitlines()
    header = "| option | environment | default | meaning |"
    assert header in readme, "README.md has no options table: paste the output of python scripts/options_table.py"
    start = readme.index(header)
    end = start
    while end < len(readme) and readme[end].startswith("|"):
        end += 1
    table = "\n".join(readme[start:end]) + "\n"
    assert table == options_table(), ("README.md's options table differs from the option declarations in "
                                      "miniagi/config.py: replace it with the output of python scripts/options_table.py")


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_miniagi_example_parses(path):
    problems = [f"{path.relative_to(ROOT)}:{number}: miniagi {shlex.join(arguments)}: {problem}"
                for number, arguments in invocations(path)
                if (problem := parse_problem(arguments))]
    assert not problems, "\n".join(problems)


def test_the_examples_cover_every_command():
    """The check above reads real examples: the README and docs run every miniagi command somewhere."""
    used = {arguments[0] for path in DOCS for _, arguments in invocations(path) if arguments}
    assert set(build_parser().commands) - {"run"} <= used, set(build_parser().commands) - used


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_lead_somewhere(path):
    problems = broken_links(path)
    assert not problems, "\n".join(problems)


def test_the_example_reader_finds_miniagi_in_any_shell_shape():
    text = "\n".join([
        "Some prose: miniagi --not-checked here.",
        "```bash",
        'pip install . && miniagi "Find the files" # the agent\'s a#b comment: miniagi --nonsense',
        "MINIAGI_MODEL=llama3.1 OPENAI_BASE_URL=http://x/v1 miniagi --max-step 3 'quoted \"objective\"'",
        'miniagi show $(miniagi runs --json --bogus | python3 -c "import json") --raw',
        'echo "$(miniagi memory stats --wrong)" | head -1 > out.txt 2> err.txt',
        "miniagi batch jobs.txt \\",
        "    --workers 4 --wat",
        "python -m miniagi runs --status nope",
        "cat > Dockerfile <<'EOF'",
        "miniagi --inside-a-heredoc",
        "EOF",
        "```",
        "```console",
        "$ miniagi replay last --json",
        "miniagi --output-line-not-a-command",
        "```",
        "```python",
        "miniagi --python-not-shell",
        "```",
    ])
    found = []
    for number, line in shell_lines(text):
        for command in simple_commands(line):
            arguments = miniagi_arguments(command)
            if arguments is not None:
                found.append((number, arguments, parse_problem(arguments)))
    assert [(number, arguments) for number, arguments, _ in found] == [
        (3, ["Find the files"]),
        (4, ["--max-step", "3", 'quoted "objective"']),
        (5, ["show", "SUBSTITUTED", "--raw"]),
        (5, ["runs", "--json", "--bogus"]),
        (6, ["memory", "stats", "--wrong"]),
        (7, ["batch", "jobs.txt", "--workers", "4", "--wat"]),
        (9, ["runs", "--status", "nope"]),
        (15, ["replay", "last", "--json"]),
    ]
    problems = [problem for _, _, problem in found]
    assert problems[0] is None and problems[2] is None and problems[7] is None
    assert "--max-step" in problems[1]  # whole option names only: not taken as --max-steps
    assert "--bogus" in problems[3] and "--wrong" in problems[4] and "--wat" in problems[5]
    assert "nope" in problems[6]


def test_a_broken_link_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title `x` — here\n\n## Two\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#title-x--here) [ok](#top) [web](https://example.org/x)\n"
                    "[gone](docs/missing.md) [bad anchor](docs/a.md#three)\n\n# Top\n"
                    "```bash\n[not a link](nowhere.md)\n```\n")
    assert broken_links(page, tmp_path) == ["README.md: link to docs/missing.md: no such file",
                                  "README.md: link to docs/a.md#three: no heading with that anchor"]
