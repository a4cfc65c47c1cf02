"""Reading sources for ingest_data and process_data: local files and http(s) URLs, as readable text.

Files: text, Markdown, CSV, JSON, HTML, source code, PDF. URLs: redirects, timeouts, a size cap, the charset from
the headers or sniffed, the content type from the headers or sniffed. HTML becomes Markdown (beautifulsoup4 with
lxml's parser, after a streamed first pass that bounds its time, size and depth): scripts, styles, navigation and
boilerplate dropped; headings, paragraphs, lists, tables and links ([text](absolute URL), each once, capped) kept.
A source that cannot be read raises SourceError with a message meant for the model.
"""

from __future__ import annotations

import io
import os
import re
import stat
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Callable

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


def read_source(spec: str, workdir: Path, timeout_s: float = URL_TIMEOUT_S * 4,
                allow: Callable[[Path, Path], None] | None = None) -> Document:
    """The text of a file or URL; within timeout_s in all for a URL (a server that trickles is cut off). A file is
    opened, then `allow(path as named, path of what was opened)` may refuse it (SourceError)."""
    spec = spec.strip().strip("'\"<>")
    if not spec:
        raise SourceError("no source given: name a file path or an http(s) URL")
    if is_url(spec):
        return read_url(spec, timeout_s)
    if re.match(r"^[a-z][a-z0-9+.-]*://", spec, re.I):
        raise SourceError(f"{spec!r}: only http:// and https:// URLs can be read")
    return read_file(spec, workdir, allow)


# --- files ------------------------------------------------------------------------------------------------------
def read_file(spec: str, workdir: Path, allow: Callable[[Path, Path], None] | None = None) -> Document:
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
        # judged by what was opened, not by a name that a link can change meanwhile (code flipping a link between
        # /proc/self/environ and a plain file got the agent's own /proc files past a check of the name)
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            opened = Path(os.path.realpath(path))
        if allow is not None:
            allow(path, opened)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{spec} is not a regular file ({_file_kind(info.st_mode)}): only files with "
                              "contents can be read")
        if any(opened.is_relative_to(system) for system in SYSTEM_DIRS):
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
                      type_label=mime or "unknown type", base_url=final_url)
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
           type_label: str = "", base_url: str | None = None) -> Document:
    """A source's bytes as a Document; `base_url`: where a page's relative links point from."""
    if kind == "pdf" or data[:5] == b"%PDF-":
        return Document(source, pdf_text(data, source), kind="pdf")
    if b"\x00" in data[:8192]:
        raise SourceError(f"{source} is binary ({type_label}), not text: it cannot be read as a document")
    text = to_text(data, charset)
    if kind == "html" or (kind is None and re.match(r"\s*(<!doctype html|<html)", text[:1000], re.I)):
        title, body, note = html_to_text(text, base_url=base_url)
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
HTML_TIME_S = 30.0  # the most time the first pass over one page may take
FEED_CHARS = 64 * 1024  # how much HTML the first pass gets between two looks at the clock
MAX_SOUP_ELEMENTS = 100_000  # the most elements beautifulsoup4 builds a tree of (a few seconds)
MAX_LINKS = 60  # links kept as [text](URL) per page; after that, their text alone
SKIPPED_TAGS = {"script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
KEPT_ATTRIBUTES = ("href", "class", "id", "role")
ROLES_DROPPED = {"navigation", "banner", "contentinfo", "search", "complementary"}
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
CAPTURED = HEADINGS | {"li", "p", "pre", "table"}  # read whole, as one block


def html_to_text(html: str, time_limit_s: float = HTML_TIME_S, base_url: str | None = None) -> tuple[str, str, str]:
    """(title, readable text as Markdown, note) of an HTML page.

    Two passes. First the page streams through lxml's parser into `_Bounded`, which writes it out again without
    scripts and styles and with nothing nested deeper than MAX_HTML_DEPTH (deeper elements are read as the text of
    the one at that depth): no tree is built, nothing recurses, and the clock is looked at every FEED_CHARS, so
    100,000 nested <div>s take about a second and no page takes more than `time_limit_s`. Then beautifulsoup4
    (lxml's parser) reads what is left, at most MAX_SOUP_ELEMENTS, as a tree: boilerplate is dropped, the <main> or
    <article> with the most text is kept (else the body), links become [text](absolute URL) against `base_url`,
    and the blocks are written out iteratively (headings, paragraphs, list items, tables, preformatted text). The
    note says what was cut or flattened."""
    bounded, notes, flattened = _bounded_html(html, time_limit_s)
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(bounded, "lxml")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    for element in soup.find_all(_boilerplate):
        if not element.decomposed:
            element.decompose()
    candidates = soup.find_all(["main", "article"])
    root = max(candidates, key=lambda tag: len(tag.get_text())) if candidates else soup.body or soup
    _links_as_markdown(root, base_url)
    if flattened:
        notes.append(f"Elements nested deeper than {MAX_HTML_DEPTH} levels were read as plain text.")
    return title, _markdown(root), " ".join(notes)


def _bounded_html(html: str, time_limit_s: float) -> tuple[str, list[str], bool]:
    """The page written out again by the first pass; the notes on what was cut; whether anything was flattened."""
    from lxml import etree

    writer = _Bounded()
    parser = etree.HTMLParser(target=writer, huge_tree=True)
    deadline = time.monotonic() + time_limit_s
    notes = []
    for offset in range(0, len(html), FEED_CHARS):
        if time.monotonic() > deadline:
            notes.append(f"Only the first {100 * offset // len(html)}% of this page was read: turning its HTML into "
                         f"text took over {time_limit_s:g} s.")
            break
        if writer.elements > MAX_SOUP_ELEMENTS:
            notes.append(f"Only the first {100 * offset // len(html)}% of this page was read: it has over "
                         f"{MAX_SOUP_ELEMENTS:,} elements.")
            break
        parser.feed(html[offset:offset + FEED_CHARS])
    try:
        parser.close()
    except etree.LxmlError:  # nothing parseable at all (an empty page)
        pass
    return "".join(writer.out), notes, writer.flattened


class _Bounded:
    """lxml parser target that writes the page out again as HTML, bounded: scripts, styles and the like left out
    whole, comments and attributes other than KEPT_ATTRIBUTES dropped, and elements nested deeper than
    MAX_HTML_DEPTH left out with their text kept (it joins the element at that depth)."""

    SKIPPED, TOO_DEEP = 0, 1  # what an element that was not written is, on the stack of open ones

    def __init__(self):
        self.out: list[str] = []
        self.elements = 0  # written
        self.open: list[str | int] = []  # per element entered: its name when written, else SKIPPED or TOO_DEEP
        self.depth = 0  # elements written and open
        self.skipped = 0  # nesting inside a skipped element
        self.flattened = False

    def start(self, tag, attrib) -> None:
        tag = tag.lower() if isinstance(tag, str) else ""
        if self.skipped or tag in SKIPPED_TAGS or not tag:
            self.skipped += 1
            self.open.append(self.SKIPPED)
        elif self.depth >= MAX_HTML_DEPTH:
            self.flattened = True
            self.open.append(self.TOO_DEEP)
        else:
            kept = "".join(f' {name}="{escape(str(attrib[name]), quote=True)}"' for name in KEPT_ATTRIBUTES
                           if name in attrib)
            self.out.append(f"<{tag}{kept}>")
            self.open.append(tag)
            self.depth += 1
            self.elements += 1

    def end(self, tag) -> None:
        if not self.open:
            return
        name = self.open.pop()
        if name == self.SKIPPED:
            self.skipped -= 1
        elif name != self.TOO_DEEP:
            self.depth -= 1
            if name not in VOID_TAGS:
                self.out.append(f"</{name}>")

    def data(self, text: str) -> None:
        if not self.skipped:
            self.out.append(escape(text, quote=False))

    def close(self) -> None:
        pass


def _boilerplate(tag) -> bool:
    """Navigation, banners, sidebars, footers, forms and the like, by their tag, role, class or id."""
    name = tag.name
    if name in DROP_TAGS or tag.get("role") in ROLES_DROPPED:
        return True
    if name in ("html", "body", "main", "article", "table") or name in HEADINGS:
        return False
    classes = tag.get("class") or []
    return bool(BOILERPLATE.search(f"{' '.join(classes) if isinstance(classes, list) else classes} "
                                   f"{tag.get('id', '')}"))


def _links_as_markdown(root, base_url: str | None) -> None:
    """Each link with text as [text](absolute URL): once per URL, MAX_LINKS in all (the rest read as their text),
    so a menu that survived the boilerplate cut does not crowd out the page. Anchors on the page itself and
    javascript: links read as their text."""
    from urllib.parse import urljoin, urlsplit

    seen: set[str] = set()
    page = (base_url or "").split("#", 1)[0]
    for link in root.find_all("a"):
        text = " ".join(link.get_text(" ").split())
        href = str(link.get("href") or "").strip()
        url = urljoin(base_url, href) if base_url and href else href
        scheme = urlsplit(url).scheme.lower()
        if (not text or not href or href.startswith("#") or scheme not in ("http", "https", "")
                or url.split("#", 1)[0] == page or url in seen or len(seen) >= MAX_LINKS):
            _replace_inline(link, text)
            continue
        seen.add(url)
        _replace_inline(link, f"[{text.replace(']', '')}]({url.replace(' ', '%20').replace(')', '%29')})")


def _replace_inline(element, text: str) -> None:
    """`element` replaced by `text`, joined with the plain text on either side (so that "(<a>x</a>)" reads "(x)")."""
    from bs4 import NavigableString

    before, after = element.previous_sibling, element.next_sibling
    if type(before) is NavigableString:
        text = str(before) + text
        before.extract()
    if type(after) is NavigableString:
        text += str(after)
        after.extract()
    element.replace_with(NavigableString(text))


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _markdown(root) -> str:
    """The blocks of `root` as Markdown, walked with a stack of its own (no recursion, whatever the depth)."""
    from bs4 import NavigableString, Tag
    from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

    blocks: list[str] = []
    loose: list[str] = []

    def flush() -> None:
        text = _collapse("".join(loose))
        if text:
            blocks.append(text)
        loose.clear()

    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        if isinstance(node, NavigableString):
            if not isinstance(node, (Comment, Declaration, Doctype, ProcessingInstruction)):
                loose.append(str(node))
            continue
        if not isinstance(node, Tag):
            continue
        name = node.name
        if leaving:
            if name in BLOCK_TAGS or name in ("ul", "ol", "main", "article"):
                flush()
            else:
                loose.append(" ")  # an inline element ends: its text stays apart from what follows
            continue
        if name in CAPTURED:
            flush()
            blocks.append(_block(node))
            continue
        if name == "br":
            loose.append("\n")
            continue
        if name in BLOCK_TAGS or name in ("ul", "ol", "main", "article"):
            flush()
        elif node is not root:
            loose.append(" ")
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.contents))
    flush()
    text = "\n\n".join(block for block in blocks if block.strip())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _block(tag) -> str:
    """An element read whole: a heading, a list item, a paragraph, preformatted text or a table."""
    name = tag.name
    if name in HEADINGS:
        text = _collapse(tag.get_text(" "))
        return "#" * int(name[1]) + " " + text if text else ""
    if name == "li":
        return "- " + _collapse(tag.get_text(" "))
    if name == "pre":
        return tag.get_text()
    if name == "table":
        rows = [[_collapse(cell.get_text(" ")) for cell in row.find_all(["td", "th"])] for row in tag.find_all("tr")]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in rows if any(cells))
    return _collapse(tag.get_text(" "))
