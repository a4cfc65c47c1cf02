"""Reading sources for ingest_data and process_data: local files and http(s) URLs, as readable text.

Files: text, Markdown, CSV, JSON, HTML, source code, PDF. URLs: redirects, timeouts, a size cap, the charset from
the headers or sniffed, the content type from the headers or sniffed. HTML becomes readable text (beautifulsoup4 +
lxml): scripts, styles, navigation and boilerplate dropped; headings, paragraphs, lists and tables kept.
A source that cannot be read raises SourceError with a message meant for the model.
"""

from __future__ import annotations

import io
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 50 * 1024 * 1024
MAX_URL_BYTES = 10 * 1024 * 1024
SYSTEM_DIRS = (Path("/proc"), Path("/sys"), Path("/dev"))  # live kernel state (the agent's own environment too)
URL_TIMEOUT_S = 15.0
USER_AGENT = "Mozilla/5.0 (compatible; miniagi/0.1; +https://github.com/miniagi)"

HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
DROP_TAGS = ["script", "style", "noscript", "template", "svg", "canvas", "iframe", "nav", "aside", "footer",
             "form", "button", "select", "input", "head"]
BOILERPLATE = re.compile(r"(^|[-_ ])(nav|navbar|menu|footer|sidebar|cookie|breadcrumbs?|banner|advert|ads|social|"
                         r"share|subscribe|popup|modal)([-_ ]|$)", re.I)
BLOCK_TAGS = {"p", "div", "section", "article", "main", "header", "blockquote", "pre", "figure", "figcaption",
              "dl", "dt", "dd", "address", "details", "summary", "ul", "ol", "table", "hr", "body"}


class SourceError(Exception):
    """A source that cannot be read; the message tells the model why and what to do instead."""


@dataclass(frozen=True)
class Document:
    source: str  # as the model named it (a URL, or the path)
    text: str
    title: str = ""
    kind: str = "text"  # text | html | pdf
    note: str = ""  # e.g. truncated at the size cap

    def header(self) -> str:
        parts = [f"Source: {self.source}"] + ([f"Title: {self.title}"] if self.title else [])
        return "\n".join(parts + ([self.note] if self.note else []))


def is_url(text: str) -> bool:
    return bool(re.match(r"https?://", text.strip(), re.I))


def read_source(spec: str, workdir: Path, timeout_s: float = URL_TIMEOUT_S * 4) -> Document:
    """The text of a file or URL; within timeout_s in all for a URL (a server that trickles is cut off)."""
    spec = spec.strip().strip("'\"<>")
    if not spec:
        raise SourceError("no source given: name a file path or an http(s) URL")
    if is_url(spec):
        return read_url(spec, timeout_s)
    if re.match(r"^[a-z][a-z0-9+.-]*://", spec, re.I):
        raise SourceError(f"{spec!r}: only http:// and https:// URLs can be read")
    return read_file(spec, workdir)


# --- files ------------------------------------------------------------------------------------------------------
def read_file(spec: str, workdir: Path) -> Document:
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else Path(workdir) / path
    if not path.exists():
        raise SourceError(f"no such file: {spec} (relative paths are read from {workdir})")
    if path.is_dir():
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:20]
        raise SourceError(f"{spec} is a directory, not a file; it holds: {', '.join(entries) or 'nothing'}")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is then read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise SourceError(f"cannot read {spec}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{spec} is not a regular file ({_file_kind(info.st_mode)}): only files with "
                              "contents can be read")
        if any(path.resolve().is_relative_to(system) for system in SYSTEM_DIRS):
            raise SourceError(f"{spec} is a system file under {', '.join(map(str, SYSTEM_DIRS))}, not a document")
        if info.st_size > MAX_FILE_BYTES:
            raise SourceError(f"{spec} is {info.st_size / 1e6:.0f} MB, over the {MAX_FILE_BYTES // 2**20} MB limit: "
                              "read a part of it instead (for example split it with execute_shell)")
        try:
            data = handle.read(MAX_FILE_BYTES + 1)  # the cap holds while reading, should the file grow
        except OSError as exc:
            raise SourceError(f"cannot read {spec}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SourceError(f"{spec} grew past the {MAX_FILE_BYTES // 2**20} MB limit while it was read")
    kind = "html" if path.suffix.lower() in HTML_SUFFIXES else None
    return decode(data, spec, kind=kind, type_label=path.suffix or "file")


# --- URLs -------------------------------------------------------------------------------------------------------
def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


def read_url(url: str, timeout_s: float = URL_TIMEOUT_S * 4) -> Document:
    """A page within timeout_s in all: the fetch runs in a thread we stop waiting for at the deadline, since a
    server can trickle even its headers a byte at a time (each read is quick, the whole is endless)."""
    import threading

    outcome: dict = {}
    fetcher = threading.Thread(target=_fetch, args=(url, time.monotonic() + timeout_s, timeout_s, outcome),
                               name="read-url", daemon=True)
    fetcher.start()
    fetcher.join(timeout_s + 2.0)
    if fetcher.is_alive() or not outcome:
        raise SourceError(f"{url} did not finish answering within {timeout_s:g} s (--read-timeout): the server is "
                          "too slow")
    if "error" in outcome:
        raise outcome["error"]
    data, total, truncated, slow = outcome["data"], outcome["total"], outcome["truncated"], outcome["slow"]
    content_type, final_url = outcome["content_type"], outcome["final_url"]
    if slow and not data.strip():
        raise SourceError(f"{url} sent almost nothing ({total} bytes) in {timeout_s:g} s (--read-timeout): the "
                          "server is too slow") from None
    mime, _, params = content_type.partition(";")
    mime = mime.strip().lower()
    charset_match = re.search(r"charset=([\w-]+)", params, re.I)
    kind = "html" if mime in ("text/html", "application/xhtml+xml") else "pdf" if mime == "application/pdf" else None
    source = url if final_url == url else f"{url} (redirected to {final_url})"
    document = decode(data, source, kind=kind, charset=charset_match.group(1) if charset_match else None,
                      type_label=mime or "unknown type")
    if truncated or slow:
        note = (f"Only the first {MAX_URL_BYTES // 2**20} MB of this page were read." if truncated else
                f"The server was too slow: only the first {total:,} bytes arrived within {timeout_s:g} s "
                "(--read-timeout), and only they were read.")
        document = Document(document.source, document.text, document.title, document.kind, note)
    return document


def _fetch(url: str, deadline: float, timeout_s: float, outcome: dict) -> None:
    import httpx

    per_read = min(URL_TIMEOUT_S, timeout_s)
    try:
        with httpx.Client(follow_redirects=True, max_redirects=8, headers={"User-Agent": USER_AGENT},
                          timeout=httpx.Timeout(per_read, connect=min(per_read, 10.0))) as client:
            with client.stream("GET", url) as response:
                if response.status_code >= 400:
                    raise SourceError(f"{url} answered HTTP {response.status_code} "
                                      f"{response.reason_phrase or ''}".rstrip())
                chunks, total, truncated, slow = [], 0, False, False
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > MAX_URL_BYTES:
                        truncated = True
                        break
                    if time.monotonic() > deadline:  # a server that trickles a byte a second
                        slow = True
                        break
                outcome.update(data=b"".join(chunks)[:MAX_URL_BYTES], total=total, truncated=truncated, slow=slow,
                               content_type=response.headers.get("content-type", ""), final_url=str(response.url))
    except SourceError as exc:
        outcome["error"] = exc
    except httpx.TimeoutException:
        outcome["error"] = SourceError(f"{url} did not answer within {per_read:g} s")
    except httpx.TooManyRedirects:
        outcome["error"] = SourceError(f"{url} redirects too many times")
    except httpx.HTTPError as exc:
        outcome["error"] = SourceError(f"cannot fetch {url}: {exc or type(exc).__name__}")


# --- bytes → text -----------------------------------------------------------------------------------------------
def decode(data: bytes, source: str, *, kind: str | None = None, charset: str | None = None,
           type_label: str = "") -> Document:
    if kind == "pdf" or data[:5] == b"%PDF-":
        return Document(source, pdf_text(data, source), kind="pdf")
    if b"\x00" in data[:8192]:
        raise SourceError(f"{source} is binary ({type_label}), not text: it cannot be read as a document")
    text = to_text(data, charset)
    if kind == "html" or (kind is None and re.match(r"\s*(<!doctype html|<html)", text[:1000], re.I)):
        title, body = html_to_text(text)
        return Document(source, body, title=title, kind="html")
    return Document(source, text)


# among encodings that read the bytes about equally well, the ones the web actually uses win (charset_normalizer
# alone can prefer a DOS code page for short Western text)
WEB_ENCODINGS = ("cp1252", "cp1251", "cp1250", "iso8859_15", "cp1253", "cp1254", "cp1256", "cp1257", "koi8_r",
                 "shift_jis", "cp932", "euc_jp", "gb18030", "gbk", "big5", "euc_kr", "iso8859_2")


def to_text(data: bytes, charset: str | None = None) -> str:
    for encoding in filter(None, (charset, "utf-8")):
        try:
            return data.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            continue
    from charset_normalizer import from_bytes

    matches = from_bytes(data)
    best = matches.best()
    if best is None:
        return data.decode("utf-8", "replace")
    close = {match.encoding: match for match in matches if match.chaos <= best.chaos + 0.1}
    chosen = next((close[name] for name in WEB_ENCODINGS if name in close), best)
    return str(chosen)


def pdf_text(data: bytes, source: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            reader.decrypt("")
        pages = [f"--- page {number} ---\n{(page.extract_text() or '').strip()}"
                 for number, page in enumerate(reader.pages, start=1)]
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{source} is a PDF that cannot be read: {exc}") from None
    text = "\n\n".join(pages)
    if not re.sub(r"--- page \d+ ---", "", text).strip():
        raise SourceError(f"{source} is a PDF with no extractable text (scanned images?)")
    return text


def html_to_text(html: str) -> tuple[str, str]:
    """(title, readable text) of an HTML page."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "lxml")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    for tag in soup(DROP_TAGS):
        tag.decompose()
    for tag in soup.find_all(attrs={"role": ["navigation", "banner", "contentinfo", "search", "complementary"]}):
        tag.decompose()
    for tag in soup.find_all(True):
        if tag.decomposed or tag.name in ("html", "body", "main", "article"):
            continue
        attrs = tag.attrs or {}
        marker = " ".join(attrs.get("class") or []) + " " + str(attrs.get("id") or "")
        if BOILERPLATE.search(marker) and tag.name not in ("table", "h1", "h2", "h3", "h4", "h5", "h6"):
            tag.decompose()
    main = max(soup.find_all(["main", "article"]), key=lambda t: len(t.get_text()), default=None)
    root = main or soup.body or soup
    blocks: list[str] = []
    _render(root, blocks)
    text = "\n\n".join(block for block in blocks if block.strip())
    return title, re.sub(r"\n{3,}", "\n\n", text).strip()


def _inline(tag) -> str:
    return " ".join(tag.get_text(" ").split())


def _render(node, blocks: list[str]) -> None:
    """Headings, paragraphs, list items, tables and preformatted text as Markdown-like blocks."""
    from bs4 import NavigableString, Tag

    loose: list[str] = []

    def flush() -> None:
        if loose:
            text = " ".join(" ".join(loose).split())
            if text:
                blocks.append(text)
            loose.clear()

    for child in node.children:
        if isinstance(child, NavigableString):
            if child.__class__.__name__ in ("Comment", "Doctype", "Declaration", "ProcessingInstruction", "CData"):
                continue
            loose.append(str(child))
            continue
        if not isinstance(child, Tag):
            continue
        name = child.name
        if name in ("h1", "h2", "h3", "h4", "h5", "h6"):
            flush()
            blocks.append("#" * int(name[1]) + " " + _inline(child))
        elif name == "li":
            flush()
            blocks.append("- " + _inline(child))
        elif name == "table":
            flush()
            rows = []
            for row in child.find_all("tr"):
                cells = [_inline(cell) for cell in row.find_all(["th", "td"])]
                if any(cells):
                    rows.append("| " + " | ".join(cells) + " |")
            if rows:
                blocks.append("\n".join(rows))
        elif name == "pre":
            flush()
            blocks.append(child.get_text())
        elif name == "br":
            loose.append("\n")
        elif name == "p":
            flush()
            blocks.append(_inline(child))
        elif name in BLOCK_TAGS or name in ("ul", "ol"):
            flush()
            _render(child, blocks)
        else:
            loose.append(child.get_text(" "))
    flush()
