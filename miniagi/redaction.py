"""Secrets: how they are recognised, the one gate that removes them from every text we pass on, and the
environment that executed code is allowed to see.

A secret is recognised three ways:
- by NAME: an environment variable or an assignment (`SMTP_PASS=…`, `"api_key": "…"`, `password: …`) whose name
  says key / token / secret / password / credential / auth / webhook / cookie / private / dsn;
- by SHAPE: text that looks like a credential wherever it appears (a URL with a password, `sk-…`, `sk_live_…`,
  `ghp_…`, `xox…`, AWS access keys, JWTs, Slack/Discord webhooks, private key blocks, bearer tokens);
- by VALUE: every value of the environment and of ./.env judged secret by name or shape is replaced wherever it
  appears, also inside longer text, and so are its base64, hex and rot13 spellings.

`Redactor` is that gate. The agent passes every text through it before the text reaches a model request, the
trace, result.json, the vector store, the terminal or a batch log.
"""

from __future__ import annotations

import base64
import codecs
import os
import re
from typing import Callable, Iterable, Mapping

REDACTED = "[REDACTED]"

# parts of a variable name (split at _ . -) that mark it as a secret, or that a part may end with ("PGPASSWORD")
_SECRET_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "PWD", "CREDENTIAL",
                 "CREDENTIALS", "AUTH", "COOKIE", "PRIVATE", "WEBHOOK", "DSN", "SIGNATURE", "APIKEY")
_SECRET_ENDINGS = ("APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")
_NOT_SECRET_NAMES = {"PWD", "OLDPWD", "PATH", "KEYBOARD", "XAUTHORITY", "SSH_AUTH_SOCK"}
# the model endpoint's own settings are no business of executed code (its URL is no secret, its key is)
_ENDPOINT_PREFIXES = ("OPENAI_",)

# names of variables executed code may see; HOME is set to the work directory separately
ALLOWED_ENV = frozenset({
    "PATH", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "COLUMNS", "LINES",
    "http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY", "NO_PROXY",
})
ALLOWED_ENV_PREFIXES = ("LC_",)

# Each pattern begins with its literal (the regex engine then jumps from one occurrence of it to the next, ~50 times
# faster than trying every position), and says after it that no word character comes before: the same matches as
# `\b` in front (a look-behind that repeats the literal).
SHAPES: tuple[re.Pattern, ...] = tuple(re.compile(p) for p in (
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    r"sk(?<!\wsk)-(?:proj-|ant-|or-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic, OpenRouter
    r"[rs](?<!\w[rs])k_(?:live|test)_[A-Za-z0-9]{8,}",  # Stripe
    r"gh(?<!\wgh)[pousr]_[A-Za-z0-9]{20,}",  # GitHub
    r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{20,}",
    r"xox(?<!\wxox)[abposre]-[A-Za-z0-9-]{10,}",  # Slack
    r"A(?<!\wA)(?:KIA|SIA)[0-9A-Z]{16}\b",  # AWS access key id
    r"AIza(?<!\wAIza)[0-9A-Za-z_\-]{30,}",  # Google API key
    r"hf_(?<!\whf_)[A-Za-z0-9]{30,}",  # Hugging Face
    r"glpat-(?<!\wglpat-)[A-Za-z0-9_\-]{20,}",  # GitLab
    r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]+",
    r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_\-]+",
    r"https://[a-z0-9.-]*webhook\.office\.com/[^\s\"'<>]+",
    r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/\-]{16,}=*",
))
BEARER = SHAPES[-1]  # the one shape with no literal to begin with: looked for only in a text that says "bearer "
# Every pattern is linear in the text's length: a pattern whose first part repeats a character class starts only
# where a run of that class starts (the look-behind), never inside it, or `a.a.a…` would be scanned once per letter.
# a password inside a URL: scheme://user:PASSWORD@host
URL_PASSWORD = re.compile(r"(?<![a-zA-Z0-9+.\-])([a-zA-Z0-9+.\-]+://[^\s:/@\"'<>]*:)([^\s@/\"'<>]+)(@)")
# NAME=value, NAME: value, "name": "value" — redacted when the name says it is a secret
ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z0-9_.\-]+)(?P<quote1>[\"']?)(?P<sep>\s*[=:]\s*)(?P<quote>[\"']?)"
    r"(?P<value>[^\s\"',;{}()\[\]<>\x00]{4,})")
# a password in the files and command lines that hold one with no name to say so, each pattern run only on a text
# holding its word (the `when`), its value redacted only where it has a credential's mix (see credential_like):
# ~/.netrc's `machine H login U password P` and `password P` on a line of its own, ~/.pgpass's host:port:db:user:pw
# lines, `mysql -pPW`, `curl -u user:pw`, `sshpass -p PW` (each command's scan bounded: linear in the text)
CREDENTIAL_FORMS: tuple[tuple[str, re.Pattern], ...] = tuple((when, re.compile(pattern)) for when, pattern in (
    ("password", r"\bmachine[ \t]+\S+[ \t]+login[ \t]+\S+[ \t]+password[ \t]+(?P<value>\S+)"),
    ("password", r"(?m)^[ \t]*password[ \t]+(?P<value>\S+)[ \t]*$"),
    (":", r"(?m)^[^\s:#][^\s:]*:(?:[0-9]+|\*):[^\s:]+:[^\s:]+:(?P<value>\S+)$"),
    ("mysql", r"\bmysql[a-z]*\b[^\n|;&]{0,200}?[ \t]-p['\"]?(?P<value>[^\s'\"]+)"),
    ("curl", r"\bcurl\b[^\n|;&]{0,200}?[ \t](?:-u[ \t]*|--user[ \t=]+)['\"]?[^\s:'\"]+:(?P<value>[^\s'\"]+)"),
    ("sshpass", r"\bsshpass[ \t]+-p[ \t]*['\"]?(?P<value>[^\s'\"]+)"),
))
# every name is_secret_name accepts holds one of these (any case): a text without them has no secret assignment
_NAME_MARKS = ("key", "token", "secret", "pass", "pwd", "credential", "auth", "cookie", "private", "webhook", "dsn",
               "signature")


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    if upper.startswith(_ENDPOINT_PREFIXES) and upper.endswith(("KEY", "TOKEN")):
        return True
    parts = [part for part in re.split(r"[_.\-]", upper) if part]
    return any(part in _SECRET_PARTS or part.endswith(_SECRET_ENDINGS) for part in parts)


def looks_like_secret(value: str) -> bool:
    """Whether a value, whatever its name, has a credential's shape."""
    return bool(URL_PASSWORD.search(value) or any(shape.search(value) for shape in SHAPES))


def credential_like(value: str) -> bool:
    """A value with a credential's mix: 6 characters or more, a letter, and a digit or a sign that words do not
    hold (prose, numbers and words like well-known or don't never have it)."""
    return (len(value) >= 6 and any(c.isalpha() for c in value)
            and any(c.isdigit() or not (c.isalpha() or c in "-'.,") for c in value))


def _credential_form(match: re.Match) -> str:
    value = match.group("value")
    if value == REDACTED or not credential_like(value):
        return match.group(0)
    return match.group(0)[:match.start("value") - match.start(0)] + REDACTED + match.group(0)[match.end("value")
                                                                                             - match.start(0):]


def _literal_value(value: str, name_is_upper: bool, quoted: bool) -> bool:
    """An assignment's value worth redacting: not an expression or a plain word (`token = tokens`)."""
    if quoted or name_is_upper:
        return True
    kinds = sum(bool(re.search(p, value)) for p in (r"[0-9]", r"[A-Z]", r"[a-z]", r"[^A-Za-z0-9]"))
    return len(value) >= 6 and kinds >= 2


def _spellings(value: str) -> list[str]:
    """The value and the encodings a careless snippet most often prints it in."""
    raw = value.encode()
    found = [value, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
             raw.hex(), codecs.encode(value, "rot13")]
    return [spelling for spelling in dict.fromkeys(found) if len(spelling) >= Redactor.MIN_LENGTH]


class Redactor:
    """The gate: replaces secrets (by value, shape and name) in any text."""

    MIN_LENGTH = 6  # shorter values would redact ordinary words

    def __init__(self, *sources: Mapping[str, str], values: Iterable[str] = ()):
        secret_values = set(values)
        for source in sources:
            for name, value in source.items():
                value = (value or "").strip()
                if len(value) >= self.MIN_LENGTH and (is_secret_name(name) or looks_like_secret(value)):
                    secret_values.add(value)
                    # a URL's password alone is a secret too (it may be printed without the rest)
                    secret_values.update(m.group(2) for m in URL_PASSWORD.finditer(value)
                                         if len(m.group(2)) >= self.MIN_LENGTH)
        spellings = sorted({s for v in secret_values for s in _spellings(v)}, key=len, reverse=True)
        self.values = spellings
        self._seen: dict[str, str] = {}  # the last prompt's message texts → redacted
        self._literal = re.compile("|".join(map(re.escape, spellings))) if spellings else None

    def include(self, *sources: Mapping[str, str]) -> None:
        """Secrets learned after start-up (an MCP server's env and credentials) join those it hides already."""
        added = set(Redactor(*sources).values) - set(self.values)
        if added:
            self.values = sorted({*self.values, *added}, key=len, reverse=True)
            self._literal = re.compile("|".join(map(re.escape, self.values)))
            self._seen.clear()

    def __call__(self, text: str) -> str:
        if not text:
            return text
        # a URL's password first: a URL holding one then still reads as a URL (http://bob:[REDACTED]@host)
        if "://" in text and "@" in text:
            text = URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
        if self._literal is not None:
            text = self._literal.sub(REDACTED, text)
        lower = text.lower()  # (the patterns that cannot match a text are not run: most texts hold no secret)
        for shape in SHAPES:
            if shape is not BEARER or "bearer " in lower:
                text = shape.sub(REDACTED, text)
        for when, form in CREDENTIAL_FORMS:
            if when in text:
                text = form.sub(_credential_form, text)
        if not any(mark in lower for mark in _NAME_MARKS):
            return text
        return ASSIGNMENT.sub(self._assignment, text)

    @staticmethod
    def _assignment(match: re.Match) -> str:
        name, value = match.group("name"), match.group("value")
        if (value == REDACTED or not is_secret_name(name)
                or not _literal_value(value, name.isupper(), bool(match.group("quote")))):
            return match.group(0)
        return match.group(0)[:match.start("value") - match.start(0)] + REDACTED

    def messages(self, messages: list[dict]) -> list[dict]:
        """A prompt's messages, redacted. Prompts grow by appending, so all but the newest messages were seen
        the step before: their redacted text is kept, not worked out again."""
        seen, self._seen = self._seen, {}

        def clean(text: str) -> str:
            result = seen.get(text)
            if result is None:
                result = self(text)
            self._seen[text] = result
            return result

        redacted = []
        for message in messages:
            if message.get("tool_calls"):  # a native tool call's arguments are text the model sees, like content
                message = dict(message, tool_calls=redact_data(clean, message["tool_calls"]))
            if isinstance(message.get("content"), str):
                message = dict(message, content=clean(message["content"]))
            redacted.append(message)
        return redacted


def redact_data(redact: Callable[[str], str], data):
    """A redaction over every string inside JSON-like data (a trace event, a result), before it is serialized:
    a secret with a quote or a backslash in it would not match once JSON-escaped."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, dict):
        return {key: redact_data(redact, value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_data(redact, value) for value in data]
    return data


def child_environment(environ: Mapping[str, str] | None = None, pass_env: Iterable[str] = ()) -> dict[str, str]:
    """What executed code sees: an allow-list of harmless variables, plus the ones the user named with
    --pass-env. Everything else — keys, tokens, database URLs, whatever their name — stays out. A proxy variable
    goes through without its user:password@ (named with --pass-env, it goes through whole)."""
    environ = os.environ if environ is None else environ
    passed = set(pass_env)
    return {name: value if name in passed or not name.lower().endswith("_proxy") else without_credentials(value)
            for name, value in environ.items()
            if name in ALLOWED_ENV or name.startswith(ALLOWED_ENV_PREFIXES) or name in passed}


def without_credentials(url: str) -> str:
    """A URL (or a bare host:port) without the user:password@ before its host."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return scheme + separator + authority.rpartition("@")[2] + slash + path

