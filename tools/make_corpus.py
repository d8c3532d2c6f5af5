#!/usr/bin/env python3
"""Build lpfail/corpus/pydocs.txt.xz: the plain text of the Python 3.11 documentation (PSF licence).

The source is Debian's `python3.11-doc` package (the HTML documentation built by Sphinx), downloaded but not
installed. Deterministic: the same .deb gives the same bytes, on any machine.

    apt-get download python3.11-doc=3.11.2-6+deb12u9      # 12.6 MB; its sha256 is checked below
    python tools/make_corpus.py python3.11-doc_3.11.2-6+deb12u9_all.deb lpfail/corpus/pydocs.txt.xz

What it keeps: every page's main content (Sphinx's `<div class="body" role="main">`) of every .html file
under usr/share/doc/python3.11/html, in sorted path order, pages separated by a blank line. What it drops:
the generated index pages (genindex*, py-modindex, search) and
the table of contents (contents.html: every heading again), navigation, sidebars, scripts and styles, and
Sphinx's "¶" header links. Text outside <pre> has its whitespace collapsed and one line per block element;
<pre> (code examples) is kept verbatim. HTML entities are decoded (once). The output is UTF-8, xz-compressed
(preset 9 | extreme, CRC64; xz streams carry no timestamp), and prints its sha256 and size for
lpfail/corpus/README.md and lpfail/data.py's CORPORA.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import re
import subprocess
import sys
import tarfile
import tempfile
from html.parser import HTMLParser
from pathlib import Path

DEB_SHA256 = {"python3.11-doc_3.11.2-6+deb12u9_all.deb":
              "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be"}
HTML_ROOT = "usr/share/doc/python3.11/html/"
SKIP = re.compile(r"(^|/)(genindex[^/]*|py-modindex|search|contents|_sources/.*|_static/.*|_downloads/.*|_images/.*)"
                  r"\.html$")
BLOCK = {"p", "div", "section", "pre", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
         "table", "tr", "blockquote", "br", "hr", "figure", "figcaption", "caption", "aside", "details", "summary"}
DROP = {"script", "style", "nav", "head", "title", "button", "form"}
VOID = {"br", "hr", "img", "input", "meta", "link", "wbr", "col", "area", "base", "embed", "param", "source",
        "track"}


class MainText(HTMLParser):
    """Collects the text inside <div class="body" role="main">, as lines."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []  # open tags inside the main div (the div itself first)
        self.inside = False
        self.drop = 0  # depth inside dropped elements
        self.pre = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if not self.inside:
            if tag == "div" and a.get("role") == "main":
                self.inside, self.stack = True, ["div"]
            return
        if tag in VOID:
            if tag in BLOCK:
                self.parts.append("\n")
            return
        self.stack.append(tag)
        cls = a.get("class") or ""
        if self.drop or tag in DROP or "headerlink" in cls.split():
            self.drop += 1
            return
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_endtag(self, tag):
        if not self.inside or tag in VOID:
            return
        # pop to the matching tag (HTML from Sphinx is well formed; be lenient anyway)
        if tag not in self.stack:
            return
        while self.stack:
            t = self.stack.pop()
            if self.drop:
                self.drop -= 1
            else:
                if t == "pre":
                    self.pre -= 1
                if t in BLOCK:
                    self.parts.append("\n")
            if t == tag:
                break
        if not self.stack:
            self.inside = False

    def handle_data(self, data):
        if not self.inside or self.drop:
            return
        if self.pre:
            self.parts.append("\x00" + data.replace("\n", "\x01") + "\x00")  # verbatim, protected
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = "".join(self.parts)
        out = []
        for line in raw.split("\n"):
            # protected <pre> runs keep their spaces and newlines; elsewhere strip and collapse
            chunks = re.split(r"\x00", line)
            s = "".join(c.replace("\x01", "\n") if i % 2 else re.sub(r" +", " ", c) for i, c in enumerate(chunks))
            out.append(s.strip(" ") if "\x01" not in line else s.rstrip())
        text = "\n".join(out)
        text = re.sub(r"[ \t]+\n", "\n", text)
        text = re.sub(r"\n{3,}", "\n\n", text)
        return text.strip("\n")


def page_text(data: bytes) -> str:
    p = MainText()
    p.feed(data.decode("utf-8"))
    p.close()
    return p.text()  # entities are already decoded (convert_charrefs)


def html_members(deb: Path) -> list[tuple[str, bytes]]:
    """(path under the HTML root, bytes) of every .html page in the .deb, sorted by path."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True,
                       stdout=open(Path(tmp) / "data.tar", "wb"))
        with tarfile.open(Path(tmp) / "data.tar") as tf:
            out = []
            for m in tf.getmembers():
                name = m.name.lstrip("./")
                if m.isfile() and name.startswith(HTML_ROOT) and name.endswith(".html"):
                    rel = name[len(HTML_ROOT):]
                    if not SKIP.search(rel):
                        out.append((rel, tf.extractfile(m).read()))
    return sorted(out)


def build(deb: Path) -> tuple[bytes, int]:
    pages = html_members(deb)
    texts = [t for _, data in pages if (t := page_text(data))]
    return ("\n\n".join(texts) + "\n").encode("utf-8"), len(pages)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deb", type=Path, help="python3.11-doc_*.deb (apt-get download python3.11-doc)")
    ap.add_argument("out", type=Path, help="output .txt.xz")
    args = ap.parse_args(argv)
    digest = hashlib.sha256(args.deb.read_bytes()).hexdigest()
    want = DEB_SHA256.get(args.deb.name)
    if want is None:
        print(f"warning: {args.deb.name} is not the recorded package version {list(DEB_SHA256)}; "
              "the corpus will differ from the shipped one", file=sys.stderr)
    elif digest != want:
        print(f"error: {args.deb} has sha256 {digest}, expected {want}", file=sys.stderr)
        return 2
    text, n_pages = build(args.deb)
    xz = lzma.compress(text, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9 | lzma.PRESET_EXTREME)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name("." + args.out.name + ".tmp")
    tmp.write_bytes(xz)
    tmp.replace(args.out)
    print(f"deb sha256 {digest}")
    print(f"pages {n_pages}; text {len(text):,} bytes (sha256 {hashlib.sha256(text).hexdigest()}); "
          f"xz {len(xz):,} bytes (sha256 {hashlib.sha256(xz).hexdigest()}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
