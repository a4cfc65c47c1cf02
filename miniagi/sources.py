"""Reading sources for ingest_data and process_data: local files and http(s) URLs, as readable text.

Files: text, Markdown, CSV, JSON, HTML, source code, PDF. URLs: redirects, timeouts, a size cap, the charset from
the headers or sniffed, the content type from the headers or sniffed. HTML becomes readable text (lxml's parser,
streamed: bounded in time and depth): scripts, styles, navigation and boilerplate dropped; headings, paragraphs,
lists and tables kept.
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
        document = Document(document.source, document.text, document.title, document.kind,
                            " ".join(filter(None, (note, document.note))))
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
        title, body, note = html_to_text(text)
        return Document(source, body, title=title, kind="html", note=note)
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


MAX_HTML_DEPTH = 512  # elements nested deeper are read as text of the one at this depth
HTML_TIME_S = 30.0  # the most time turning one page into text may take
FEED_CHARS = 64 * 1024  # how much HTML the parser gets between two looks at the clock
ROLES_DROPPED = {"navigation", "banner", "contentinfo", "search", "complementary"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
CAPTURED = HEADINGS | {"li", "p", "pre", "table"}  # read whole, as one block


def html_to_text(html: str, time_limit_s: float = HTML_TIME_S) -> tuple[str, str, str]:
    """(title, readable text, note) of an HTML page. The page streams through lxml's parser into `_Readable`: no
    tree is built and nothing recurses, so time grows with the page's size alone (100,000 nested <div>s take
    about a second), and a page that still takes too long is cut off at `time_limit_s`. The note says what was
    cut or flattened."""
    from lxml import etree

    reader = _Readable()
    parser = etree.HTMLParser(target=reader, huge_tree=True)
    deadline = time.monotonic() + time_limit_s
    notes = []
    for offset in range(0, len(html), FEED_CHARS):
        if time.monotonic() > deadline:
            notes.append(f"Only the first {100 * offset // len(html)}% of this page was read: turning its HTML into "
                         f"text took over {time_limit_s:g} s.")
            break
        parser.feed(html[offset:offset + FEED_CHARS])
    try:
        parser.close()
    except etree.LxmlError:  # nothing parseable at all (an empty page)
        pass
    if reader.flattened:
        notes.append(f"Elements nested deeper than {MAX_HTML_DEPTH} levels were read as plain text.")
    return reader.title_text(), reader.text(), " ".join(notes)


def _collapse(parts: list[str]) -> str:
    return " ".join("".join(parts).split())


class _Capture:
    """An element read whole (a heading, list item, paragraph, preformatted text, table, or an inline element
    outside any of them): its text, and a table's rows of cells. Text arrives in pieces (an entity, a feed's end
    can split it); a space is put only where an element begins or ends."""

    def __init__(self, tag: str, depth: int):
        self.tag, self.depth = tag, depth
        self.parts: list[str] = []
        self.rows: list[list[list[str]]] = []

    def add(self, text: str) -> None:
        if self.tag != "table":
            self.parts.append(text)
        elif self.rows and self.rows[-1]:  # table text outside a cell is not shown
            self.rows[-1][-1].append(text)

    def boundary(self) -> None:
        """An element inside begins or ends: a space (preformatted text is kept as it is)."""
        if self.tag != "pre":
            self.add(" ")

    def block(self) -> str:
        if self.tag in HEADINGS:
            text = _collapse(self.parts)
            return "#" * int(self.tag[1]) + " " + text if text else ""
        if self.tag == "li":
            return "- " + _collapse(self.parts)
        if self.tag == "pre":
            return "".join(self.parts)
        if self.tag == "table":
            rows = [[_collapse(cell) for cell in row] for row in self.rows]
            return "\n".join("| " + " | ".join(cells) + " |" for cells in rows if any(cells))
        return _collapse(self.parts)


class _Readable:
    """lxml parser target: Markdown-like blocks (headings, paragraphs, list items, tables, preformatted text) as
    the page streams by. Scripts, styles, navigation and boilerplate are dropped whole; of the <main>/<article>
    elements, the one with the most text is kept, else the whole body."""

    def __init__(self):
        self.depth = 0  # elements open, those read as text (too deep) and dropped ones left out
        self.dropped = 0  # nesting inside a dropped element (0: not inside one)
        self.too_deep = 0  # nesting beyond MAX_HTML_DEPTH
        self.flattened = False
        self.in_title = False
        self.title: list[str] = []
        self.blocks: list[str] = []
        self.loose: list[str] = []  # text of the block being gathered (between block elements)
        self.capture: _Capture | None = None
        self.containers: list[list[int]] = []  # <main>/<article>: [first block, end block, characters of text]
        self.open: list[list[int] | None] = []  # per open element: its container entry, if it is one

    def start(self, tag, attrib) -> None:
        tag = tag.lower() if isinstance(tag, str) else ""
        if tag == "title":
            self.in_title = True
        if self.dropped:
            self.dropped += 1
        elif self._drops(tag, attrib):
            self.dropped = 1
        elif self.depth >= MAX_HTML_DEPTH:
            self.too_deep += 1
            self.flattened = True
        else:
            self.depth += 1
            self.open.append(self._enter(tag))

    def end(self, tag) -> None:
        tag = tag.lower() if isinstance(tag, str) else ""
        if tag == "title":
            self.in_title = False
        if self.dropped:
            self.dropped -= 1
        elif self.too_deep:
            self.too_deep -= 1
        elif self.depth:
            self.depth -= 1
            self._leave(tag, self.open.pop())

    def data(self, text: str) -> None:
        if self.in_title:
            self.title.append(text)
        if self.dropped:
            return
        for container in self.open:
            if container is not None:
                container[2] += len(text)
        if self.capture is not None:
            self.capture.add(text)
        else:
            self.loose.append(text)

    def close(self) -> None:
        while self.open:  # a page cut off at the time limit: close what is open
            self.depth -= 1
            self._leave("", self.open.pop())

    def _drops(self, tag: str, attrib) -> bool:
        if tag in DROP_TAGS or attrib.get("role") in ROLES_DROPPED:
            return True
        if tag in ("html", "body", "main", "article", "table") or tag in HEADINGS:
            return False
        return bool(BOILERPLATE.search(f"{attrib.get('class', '')} {attrib.get('id', '')}"))

    def _enter(self, tag: str) -> list[int] | None:
        capture = self.capture
        if capture is not None:
            if capture.tag == "table" and tag == "tr":
                capture.rows.append([])
            elif capture.tag == "table" and tag in ("td", "th") and capture.rows:
                capture.rows[-1].append([])
            capture.boundary()
            return None
        if tag in CAPTURED:
            self._flush()
            self.capture = _Capture(tag, self.depth)
        elif tag in BLOCK_TAGS or tag in ("ul", "ol", "main", "article"):
            self._flush()
            if tag in ("main", "article"):
                entry = [len(self.blocks), -1, 0]
                self.containers.append(entry)
                return entry
        elif tag == "br":
            self.loose.append("\n")
        elif tag != "html":  # an inline element: its text joins the block around it
            self.capture = _Capture("inline", self.depth)
        return None

    def _leave(self, tag: str, container: list[int] | None) -> None:
        capture = self.capture
        if capture is not None:
            if capture.depth == self.depth + 1:  # the captured element itself ends
                self.capture = None
                if capture.tag == "inline":
                    self.loose.extend((" ", *capture.parts, " "))
                else:
                    self.blocks.append(capture.block())
            else:
                capture.boundary()
            return
        if tag in BLOCK_TAGS or tag in ("ul", "ol") or container is not None:
            self._flush()
        if container is not None:
            container[1] = len(self.blocks)

    def _flush(self) -> None:
        if self.loose:
            text = _collapse(self.loose)
            if text:
                self.blocks.append(text)
            self.loose.clear()

    def title_text(self) -> str:
        return " ".join("".join(self.title).split())

    def text(self) -> str:
        self._flush()
        blocks = self.blocks
        if self.containers:
            first, end, _ = max(self.containers, key=lambda entry: entry[2])
            blocks = blocks[first:end if end >= 0 else len(blocks)]
        text = "\n\n".join(block for block in blocks if block.strip())
        return re.sub(r"\n{3,}", "\n\n", text).strip()
