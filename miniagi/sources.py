"""Reading sources for ingest_data and process_data: local files and http(s) URLs, as readable text.

Files: text, Markdown, CSV, JSON, HTML, source code, PDF. URLs: redirects, timeouts, a size cap, the charset from
the headers or sniffed, the content type from the headers or sniffed. HTML becomes readable text (beautifulsoup4 +
lxml): scripts, styles, navigation and boilerplate dropped; headings, paragraphs, lists and tables kept.
A source that cannot be read raises SourceError with a message meant for the model.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 50 * 1024 * 1024
MAX_URL_BYTES = 10 * 1024 * 1024
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


def read_source(spec: str, workdir: Path) -> Document:
    spec = spec.strip().strip("'\"<>")
    if not spec:
        raise SourceError("no source given: name a file path or an http(s) URL")
    if is_url(spec):
        return read_url(spec)
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
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SourceError(f"{spec} is {size / 1e6:.0f} MB, over the {MAX_FILE_BYTES // 2**20} MB limit: read a part "
                          "of it instead (for example split it with execute_shell)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {spec}: {exc.strerror or exc}") from None
    kind = "html" if path.suffix.lower() in HTML_SUFFIXES else None
    return decode(data, spec, kind=kind, type_label=path.suffix or "file")


# --- URLs -------------------------------------------------------------------------------------------------------
def read_url(url: str) -> Document:
    import httpx

    try:
        with httpx.Client(follow_redirects=True, max_redirects=8, headers={"User-Agent": USER_AGENT},
                          timeout=httpx.Timeout(URL_TIMEOUT_S, connect=min(URL_TIMEOUT_S, 10.0))) as client:
            with client.stream("GET", url) as response:
                if response.status_code >= 400:
                    raise SourceError(f"{url} answered HTTP {response.status_code} "
                                      f"{response.reason_phrase or ''}".rstrip())
                chunks, total, truncated = [], 0, False
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > MAX_URL_BYTES:
                        truncated = True
                        break
                data = b"".join(chunks)[:MAX_URL_BYTES]
                content_type = response.headers.get("content-type", "")
                final_url = str(response.url)
    except httpx.TimeoutException:
        raise SourceError(f"{url} did not answer within {URL_TIMEOUT_S:g} s") from None
    except httpx.TooManyRedirects:
        raise SourceError(f"{url} redirects too many times") from None
    except httpx.HTTPError as exc:
        raise SourceError(f"cannot fetch {url}: {exc or type(exc).__name__}") from None
    mime, _, params = content_type.partition(";")
    mime = mime.strip().lower()
    charset_match = re.search(r"charset=([\w-]+)", params, re.I)
    kind = "html" if mime in ("text/html", "application/xhtml+xml") else "pdf" if mime == "application/pdf" else None
    source = url if final_url == url else f"{url} (redirected to {final_url})"
    document = decode(data, source, kind=kind, charset=charset_match.group(1) if charset_match else None,
                      type_label=mime or "unknown type")
    if truncated:
        document = Document(document.source, document.text, document.title, document.kind,
                            f"Only the first {MAX_URL_BYTES // 2**20} MB of this page were read.")
    return document


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
