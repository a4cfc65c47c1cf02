"""The reply parser, by example and by property (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miniagi.protocols import MalformedReply
from miniagi.protocols.tags import parse_reply

commands = st.sampled_from(["execute_python", "execute_shell", "done", "memorize_thoughts", "talk_to_user"])
plain = st.text(alphabet=st.characters(blacklist_characters="<>`", blacklist_categories=("Cs",)), min_size=1,
                max_size=80).map(str.strip).filter(bool)
argument_lines = st.lists(plain, min_size=1, max_size=5).map("\n".join)


@given(thought=plain, command=commands, arg=argument_lines)
def test_a_well_formed_reply_round_trips(thought, command, arg):
    action = parse_reply(f"<r>{thought}</r><c>{command}</c>\n{arg}")
    assert (action.thought, action.command, action.arg) == (thought, command, arg.strip())


@given(thought=plain, command=commands, arg=argument_lines, prose_before=plain, prose_after=plain,
       upper=st.booleans(), spaces=st.sampled_from(["", " ", "\n", "  \n\t"]), wrap=st.booleans(),
       fence_lang=st.sampled_from(["", "python", "py", "bash"]))
def test_real_world_variations_are_read(thought, command, arg, prose_before, prose_after, upper, spaces, wrap,
                                        fence_lang):
    r, c = ("R", "C") if upper else ("r", "c")
    reply = (f"{spaces}<{r}>{spaces}{thought}{spaces}</{r}>{spaces}<{c}>{spaces}{command}{spaces}</{c}>\n"
             f"```{fence_lang}\n{arg}\n```\n{prose_after}{spaces}")
    if wrap:
        reply = f"```\n{reply}\n```"
    else:
        reply = f"{prose_before}\n{reply}"
    action = parse_reply(reply)
    assert action.command == command
    assert action.thought == thought.strip()
    assert action.arg == arg.strip()  # fence and the prose after it are gone


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_any_text_either_parses_or_raises_malformed_reply(text):
    try:
        action = parse_reply(text)
    except MalformedReply as error:
        assert "For example:\n<r>" in str(error) and "<c>command</c>" not in str(error)
    else:
        assert action.command and action.command == action.command.lower()


@given(first=commands, second=commands, arg=plain)
def test_only_the_first_of_several_actions_is_taken_and_the_model_is_told(first, second, arg):
    action = parse_reply(f"<r>a</r><c>{first}</c>\n{arg}\n<r>b</r><c>{second}</c>\nother")
    assert action.command == first and action.arg == arg
    assert "only the first" in action.note


def test_indentation_inside_code_is_kept():
    code = "def f(x):\n    if x:\n        return 1\n    return 0\nprint(f(1))"
    assert parse_reply(f"<r>t</r><c>execute_python</c>\n```python\n{code}\n```").arg == code
    assert parse_reply(f"<r>t</r><c>execute_python</c>\n{code}").arg == code


def test_argument_on_the_same_line_and_unclosed_fence():
    assert parse_reply("<r>t</r><c>done</c> 42").arg == "42"
    assert parse_reply("<r>t</r><c>execute_python</c>\n```python\nprint(1)").arg == "print(1)"


def test_missing_closing_tags_are_tolerated():
    action = parse_reply("<r>thinking hard<c>execute_shell\nls -la")
    assert (action.thought, action.command, action.arg) == ("thinking hard", "execute_shell", "ls -la")


@pytest.mark.parametrize("reply,problem", [("", "empty"), ("   ", "empty"), ("just prose", "no command tag"),
                                           ("<r>only a thought</r>", "no command tag")])
def test_malformed_replies_explain_the_problem(reply, problem):
    with pytest.raises(MalformedReply) as caught:
        parse_reply(reply)
    assert problem in str(caught.value)
    assert "<c>execute_shell</c>\npython3 --version" in str(caught.value)  # a filled-in example
