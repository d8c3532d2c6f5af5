"""Open every page of the built book in headless Chromium and check what a reader would see.

    python tools/browser_check.py [_build/html] [--screenshots DIR] [--no-screenshots] [--source .]

For each HTML page (served from a local HTTP server on 127.0.0.1, so the pages are same-origin) it fails on:

* console errors (Chromium's SEVERE log level: uncaught JavaScript errors, failed loads);
* off-site resources: any script, style sheet, font or image loaded from another origin (the book must read
  offline; MathJax is vendored by sphinx-mathjax-offline), and any resource answered with HTTP >= 400;
* broken internal links: a same-origin <a href> whose file does not exist, or whose #fragment names no id in
  the target page (links to other sites are not followed: CI has no network);
* images that did not load (not complete, or naturalWidth 0);
* math that MathJax left untypeset or marked as an error;
* widgets that neither render nor have a visible static twin: a page whose notebook (book/X.ipynb next to
  book/X.html's source) has a widget output, or whose HTML holds a widget view, must show a rendered widget
  or one visible ``[data-lpfail-twin]`` per widget; every twin's <select> is exercised (each choice must show
  exactly its own state);
* notebook output that must be scrolled sideways to be read: at 1280 px, any output box (``.cell_output``, not
  an input cell) whose content (the largest ``scrollWidth`` of the box and everything in it, with every choice
  of a static twin's <select> tried) is wider than the text column (``article.bd-article``'s content box) by
  more than ``OVERFLOW_TOLERANCE_PX``;
* a page that scrolls sideways as a whole at a phone's width (``PHONE_WIDTH`` = 400 px): the window can be
  scrolled to the right by more than ``OVERFLOW_TOLERANCE_PX`` (the widest elements past the edge are named);
* a word broken inside a table cell at 1280 px: a word of a cell that the browser laid out on more than one line
  (a column too narrow for its longest word, or CSS that breaks anywhere), except a line break right after a
  hyphen, a dash, a slash or a zero-width space; a number never breaks;
* figure text too small on a phone: at 400 px, a figure's panel (an ``img`` in a figure, an output or an
  ``.lp-fig``) whose legend text would be shown smaller than ``MIN_LEGEND_PX`` or whose smallest text smaller
  than ``MIN_TEXT_PX``, from the sizes the panel carries (``data-lp-legend-pt``, ``data-lp-text-pt``, its width
  ``data-lp-width-in``; `lpfail.book.plots.figure_html` writes them) and the width the page gives it; a panel
  without them is an error too (its text size cannot be known). Hidden states of a static twin count, at the
  width they would be shown at.

Unless told not to (``--no-screenshots``: the checks alone, as `make test` runs them), it writes a screenshot of
every page whole, top to bottom, at both widths (``X.png`` at 1280 px, ``X.w400.png``
at 400 px), and report.json to the screenshots folder, prints one line per page, and exits 1 when any page has
an error. A screenshot is stitched from one capture per viewport height, each scrolled as a reader scrolls
(so the page keeps the layout it has in a 900 px tall window); the strip hidden under a sticky top bar is
taken from the next capture, which overlaps the previous one by the bar's height. Chromium and chromedriver come from Debian
(`apt-get install chromium chromium-driver`); set CHROMIUM / CHROMEDRIVER to use others.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import http.server
import json
import os
import re
import shutil
import sys
import threading
import time
import urllib.parse
from pathlib import Path

SKIP_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
DESKTOP = (1280, 900)
PHONE_WIDTH = 400
# A box (or the page) is "too wide" when its content exceeds the width it has by more than this. Widths are
# whole CSS pixels but sub-pixel layout (borders, rounded font metrics, a table's 0.5 px border) can add one or
# two; anything a reader would have to scroll for is far wider (the smallest real overflow found was ~20 px).
OVERFLOW_TOLERANCE_PX = 2
#: Figure text at a phone's width, in CSS pixels: legends at least this tall, any other text at least MIN_TEXT_PX.
MIN_LEGEND_PX = 9.0
MIN_TEXT_PX = 8.0


@dataclasses.dataclass
class PageResult:
    page: str
    errors: list[str] = dataclasses.field(default_factory=list)
    links: int = 0
    images: int = 0
    widgets: int = 0
    twins: int = 0
    math: int = 0
    screenshot: str = ""
    screenshot_phone: str = ""
    outputs: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    def line(self) -> str:
        head = "OK  " if self.ok else "FAIL"
        info = (f"{self.links} internal links, {self.images} images, {self.math} math, "
                f"{self.widgets} widgets / {self.twins} twins, {self.outputs} outputs, {self.seconds:.1f} s")
        return "\n".join([f"{head} {self.page:<32} {info}"] + [f"     - {e}" for e in self.errors])


# -- a quiet local server ------------------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(root: Path):
    handler = functools.partial(_Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


# -- the browser ---------------------------------------------------------------------------------------------
def find_browser() -> tuple[str, str]:
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or ""
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or ""
    return chromium, driver


def browser_available() -> bool:
    chromium, driver = find_browser()
    return bool(chromium and driver)


def make_driver(width: int = 1280, height: int = 900):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = find_browser()
    if not (chromium and driver):
        raise RuntimeError("headless Chromium not found: `apt-get install chromium chromium-driver` "
                           "(or set CHROMIUM and CHROMEDRIVER)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


_COLLECT_JS = r"""
const origin = location.origin;
const links = Array.from(document.querySelectorAll('a[href]')).map(a => a.href);
const imgs = Array.from(document.images).map(i => ({src: i.currentSrc || i.src, complete: i.complete,
                                                      w: i.naturalWidth}));
const res = performance.getEntriesByType('resource').map(r => ({name: r.name, status: r.responseStatus || 0,
                                                                type: r.initiatorType}));
const visible = el => !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length);
const widgetViews = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
const rendered = Array.from(document.querySelectorAll('.jupyter-widgets')).filter(visible).length;
const twins = Array.from(document.querySelectorAll('[data-lpfail-twin]'));
const math = document.querySelectorAll('.math, mjx-container').length;
return {origin, links, imgs, res, widgetViews, rendered,
        twins: twins.filter(visible).length, twinNames: twins.map(t => t.getAttribute('data-lpfail-twin')),
        mjx: document.querySelectorAll('mjx-container').length,
        rawMath: Array.from(document.querySelectorAll('.math')).filter(
            m => !m.querySelector('mjx-container') && /\\\(|\\\[|\$/.test(m.textContent)).length,
        merror: document.querySelectorAll('mjx-merror').length,
        hasMathJax: !!window.MathJax, math, height: document.documentElement.scrollHeight};
"""

_TWIN_JS = r"""
const out = [];
document.querySelectorAll('[data-lpfail-twin]').forEach(t => {
  const sel = t.querySelector('select');
  if (!sel) { out.push(t.getAttribute('data-lpfail-twin') + ': no <select>'); return; }
  for (let i = 0; i < sel.options.length; i++) {
    sel.selectedIndex = i;
    sel.dispatchEvent(new Event('change'));
    const shown = Array.from(t.querySelectorAll('[data-case]')).filter(d => !d.hidden);
    if (shown.length !== 1 || shown[0].getAttribute('data-case') !== sel.options[i].value ||
        !shown[0].offsetHeight)
      out.push(t.getAttribute('data-lpfail-twin') + ': choice ' + i + ' shows ' + shown.length + ' states');
  }
  sel.selectedIndex = 0; sel.dispatchEvent(new Event('change'));
});
return out;
"""

_MATHJAX_WAIT_JS = """
const done = arguments[arguments.length - 1];
if (window.MathJax && MathJax.startup && MathJax.startup.promise)
  MathJax.startup.promise.then(() => done('typeset'), e => done('error: ' + e));
else done('none');
"""


# Output boxes wider than the text column (at the desktop width). The column is the article's content box;
# pages without one (the test fixtures may have it or not) fall back to <main> or <body>. A box's content width
# is the largest scrollWidth of the box or anything in it: a <pre> or a table wrapper with overflow:auto keeps
# its overflow inside (its scrollWidth grows), a box with overflow:visible lets it grow past its edge (its own
# scrollWidth grows). Twins are measured in every state of their <select>.
_OVERFLOW_JS = r"""
const tol = arguments[0];
const col = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
const cs = getComputedStyle(col);
const colWidth = col.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
// A <select> is measured by its box: its options' text lies in a popup, and Chromium 150 reports the longest
// option's text width as the option's scrollWidth (2026-12-02: 813 px for a select 688 px wide at most).
const widest = box => {
  let w = box.scrollWidth;
  box.querySelectorAll('*').forEach(e => {
    if (e.closest('select') && e.tagName !== 'SELECT') return;
    const ew = e.tagName === 'SELECT' ? Math.ceil(e.getBoundingClientRect().width) : e.scrollWidth;
    if (ew > w) w = ew;
  });
  return w;
};
const boxes = Array.from(document.querySelectorAll('.cell_output'));
const out = [];
boxes.forEach((box, i) => {
  let w = widest(box), where = '';
  box.querySelectorAll('[data-lpfail-twin] select').forEach(sel => {
    const keep = sel.selectedIndex;
    for (let k = 0; k < sel.options.length; k++) {
      sel.selectedIndex = k; sel.dispatchEvent(new Event('change'));
      const wk = widest(box);
      if (wk > w) { w = wk; where = ' (twin choice "' + sel.options[k].text.trim().slice(0, 40) + '")'; }
    }
    sel.selectedIndex = keep; sel.dispatchEvent(new Event('change'));
  });
  if (w > colWidth + tol)
    out.push({box: i + 1, width: w, text: box.textContent.replace(/\s+/g, ' ').trim().slice(0, 70) + where});
});
return {colWidth: Math.round(colWidth), boxes: boxes.length, wide: out};
"""

# At a phone's width: can the window itself be scrolled sideways, and which elements stick out past its right
# edge (outside any box that clips or scrolls its own overflow)?
_PHONE_JS = r"""
const tol = arguments[0];
const vw = window.innerWidth;
window.scrollTo(1e6, window.scrollY);
const sx = window.scrollX;
window.scrollTo(0, window.scrollY);
const out = [];
if (sx > tol) {
  const clipped = e => {
    for (let a = e.parentElement; a && a !== document.body && a !== document.documentElement; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== 'visible') return true;
    return false;
  };
  const far = Array.from(document.body.querySelectorAll('*')).filter(e => {
    const r = e.getBoundingClientRect();
    return r.width && r.right > vw + tol && !clipped(e);
  });
  // name the outermost ones: an element whose parent also sticks out is covered by the parent's entry
  far.filter(e => !far.includes(e.parentElement)).slice(0, 3).forEach(e => {
    const cls = (e.className && e.className.baseVal === undefined ? '.' + e.className.trim().split(/\s+/).join('.') : '');
    out.push(e.tagName.toLowerCase() + (cls === '.' ? '' : cls) + ' to x=' + Math.round(e.getBoundingClientRect().right)
             + ': ' + e.textContent.replace(/\s+/g, ' ').trim().slice(0, 50));
  });
}
return {width: vw, scroll: sx, pageWidth: document.documentElement.scrollWidth, culprits: out};
"""

# Words broken inside table cells (at the desktop width): every word of two or more characters of every visible
# cell is laid out as a range; more than one line box (distinct tops) means the browser broke it.
_BROKEN_WORDS_JS = r"""
const out = [];
const root = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
const numeric = /^[\[(]?[-+−±]?\d[\d.,]*(e[-+]?\d+)?[%×\]),;]*$/;
const topOf = (node, i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
                              const b = Array.from(r.getClientRects()).filter(x => x.width > 0)[0];
                              return b ? Math.round(b.top) : null; };
root.querySelectorAll('td, th').forEach(cell => {
  if (!cell.offsetWidth) return;
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent, re = /\S{2,}/g; let m;
    while ((m = re.exec(text)) !== null) {
      let prev = null;
      for (let i = m.index; i < m.index + m[0].length; i++) {
        const t = topOf(node, i);
        if (t === null) continue;
        // a new line inside the word: allowed only after a hyphen, a dash, a slash or a zero-width space (the
        // break points lpfail.book.text.breakable inserts), and never inside a number
        if (prev !== null && t !== prev && (numeric.test(m[0]) || !/[-–\/\u200b]/.test(text[i - 1]))) {
          if (out.length < 20) out.push(m[0].replace(/\u200b/g, '').slice(0, 40));
          break;
        }
        prev = t;
      }
    }
  }
});
return out;
"""

# Figure text at the phone width: each panel's text sizes (points, at its width in inches) scaled to the width the
# page shows it at: its CSS width, at most the width of the box it sits in (max-width: 100 %).
_FIGURE_TEXT_JS = r"""
const minLegend = arguments[0], minText = arguments[1];
const out = [];
const imgs = Array.from(document.querySelectorAll('figure img, .cell_output img, .lp-fig img'));
imgs.forEach((img, k) => {
  const name = (img.getAttribute('alt') || img.src.split('/').pop() || 'image').slice(0, 60);
  const win = parseFloat(img.getAttribute('data-lp-width-in'));
  if (!win) { out.push('figure panel without its text sizes (data-lp-width-in): ' + name); return; }
  let box = img.parentElement;
  while (box && !box.clientWidth) box = box.parentElement;  // a hidden twin state: the width it would get
  const avail = box ? box.clientWidth : window.innerWidth;
  const own = parseFloat(img.style.width) || img.naturalWidth;
  const shown = Math.min(own, avail);
  const px = pt => pt * shown / (72 * win);
  const leg = parseFloat(img.getAttribute('data-lp-legend-pt')), txt = parseFloat(img.getAttribute('data-lp-text-pt'));
  if (leg && px(leg) < minLegend)
    out.push('legend text ' + px(leg).toFixed(1) + ' px tall (at least ' + minLegend + ') in ' + name);
  if (txt && px(txt) < minText)
    out.push('figure text ' + px(txt).toFixed(1) + ' px tall (at least ' + minText + ') in ' + name);
});
return out;
"""


# One viewport-height capture at a time: where the window is scrolled to, how tall the document and the window
# are, and the bottom edge of any sticky or fixed bar across the top (its strip is covered in every capture).
_SCROLL_JS = r"""
window.scrollTo(0, arguments[0]);
if (!document.getElementById('lpfail-shot-style')) {  // the theme's floating 'Back to top' button
  const st = document.createElement('style');
  st.id = 'lpfail-shot-style';
  st.textContent = '#pst-back-to-top { display: none !important; }';
  document.head.appendChild(st);
}
let cover = 0;
if (window.scrollY > 0)
  document.querySelectorAll('body *').forEach(e => {
    const p = getComputedStyle(e).position;
    if (p !== 'sticky' && p !== 'fixed') return;
    const r = e.getBoundingClientRect();
    if (r.top <= 1 && r.bottom > 0 && r.width >= window.innerWidth / 2 && r.bottom < window.innerHeight / 2)
      cover = Math.max(cover, Math.ceil(r.bottom));
  });
return {y: window.scrollY, height: document.documentElement.scrollHeight, view: window.innerHeight, cover};
"""


def full_page_screenshot(driver, path: Path, max_captures: int = 200) -> None:
    """The page whole, stitched from captures one viewport height apart (see the module's docstring)."""
    import io

    from PIL import Image

    tiles = []
    bar = 0  # the sticky top bar's height, once the page is scrolled (0 at the very top)
    want = 0
    for _ in range(max_captures):
        pos = driver.execute_script(_SCROLL_JS, want)
        if pos["cover"] > bar and tiles:  # a bar appeared on scrolling: step back so the captures overlap by it
            bar = pos["cover"]
            want = tiles[-1][0]["y"] + tiles[-1][0]["view"] - bar
            pos = driver.execute_script(_SCROLL_JS, want)
        time.sleep(0.05)
        tiles.append((pos, Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")))
        if pos["y"] + pos["view"] >= pos["height"] or pos["y"] < want:  # at the bottom
            break
        want = pos["y"] + pos["view"] - bar
    height = max(p["y"] + p["view"] for p, _ in tiles)
    width = tiles[0][1].width
    sheet = Image.new("RGB", (width, height), "white")
    for k, (pos, im) in enumerate(tiles):
        top = 0 if k == 0 else pos["cover"]
        sheet.paste(im.crop((0, top, width, im.height)), (0, pos["y"] + top))
    driver.execute_script("window.scrollTo(0, 0)")
    sheet.save(path, optimize=False)


class Site:
    """The built HTML: which files exist and which ids each page defines (for #fragment links)."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self._ids: dict[Path, set[str]] = {}

    def pages(self) -> list[str]:
        out = []
        for p in sorted(self.root.rglob("*.html")):
            rel = p.relative_to(self.root)
            if not (set(rel.parts[:-1]) & SKIP_DIRS):
                out.append(rel.as_posix())
        return out

    def file_for(self, url_path: str) -> Path | None:
        p = (self.root / urllib.parse.unquote(url_path).lstrip("/")).resolve()
        if p.is_dir():
            p = p / "index.html"
        return p if p.is_file() and (p == self.root or self.root in p.parents) else None

    def ids(self, path: Path) -> set[str]:
        if path not in self._ids:
            text = path.read_text(errors="replace")
            self._ids[path] = set(re.findall(r'\b(?:id|name)\s*=\s*["\']([^"\']+)["\']', text))
        return self._ids[path]


def source_widgets(page: str, source: Path | None) -> int:
    """Widget outputs in the notebook this page was built from (0 when there is none)."""
    if source is None:
        return 0
    nb = source / (page[:-len(".html")] + ".ipynb")
    if not nb.is_file():
        return 0
    cells = json.loads(nb.read_text()).get("cells", [])
    return sum(1 for c in cells for o in c.get("outputs", []) if WIDGET_MIME in o.get("data", {}))


#: The book's first page, and the height of the first screen it must answer on at 1280 px.
FIRST_PAGE = "book/intro.html"
FIRST_SCREEN_PX = 800
#: Where the answer and the advice end, in page pixels: the paragraph that starts with "The answer." and the last
#: item of the list under the heading "What to do"; the tops of everything else that is not the title, its
#: subtitle or those two, in document order (for the phone: nothing may come before them).
_FIRST_SCREEN_JS = r"""
const art = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
const y = e => e.getBoundingClientRect().top + window.scrollY;
const bottom = e => e.getBoundingClientRect().bottom + window.scrollY;
const thesis = Array.from(art.querySelectorAll('p')).find(p => p.textContent.trim().startsWith('The answer.'));
const todo = Array.from(art.querySelectorAll('h2')).find(h => h.textContent.trim().startsWith('What to do'));
const sec = todo ? (todo.closest('section') || todo.parentElement) : null;
const items = sec ? Array.from(sec.querySelectorAll('li')) : [];
const before = [];
if (thesis && todo) {
  const t = y(thesis);
  for (const el of art.querySelectorAll('h2, h3, img, figure, table, div.cell_output, ol, ul')) {
    if (el === todo || sec && sec.contains(el) || thesis.contains(el)) continue;
    if (y(el) < t) before.push((el.tagName + ' ' + el.textContent.trim()).slice(0, 60));
  }
}
return {thesis: thesis ? bottom(thesis) : null, thesisTop: thesis ? y(thesis) : null,
        todo: todo ? y(todo) : null, end: items.length ? bottom(items[items.length - 1]) : null,
        items: items.length, before: before};
"""


def first_screen_errors(info: dict, width: int) -> list[str]:
    """What `_FIRST_SCREEN_JS` found, judged: at 1280 px the answer and the whole of "What to do" end within the first
    `FIRST_SCREEN_PX` pixels; at every width they come before anything else on the page."""
    out = []
    if info["thesis"] is None:
        return ["the first page has no paragraph starting 'The answer.'"]
    if info["todo"] is None or not info["items"]:
        return ["the first page has no 'What to do' list"]
    if info["todo"] < info["thesisTop"]:
        out.append("'What to do' comes before the answer")
    if width >= DESKTOP[0] and max(info["thesis"], info["end"]) > FIRST_SCREEN_PX:
        out.append(f"the answer and 'What to do' end at {max(info['thesis'], info['end']):.0f} px, below the first "
                   f"{FIRST_SCREEN_PX} px at {width} px")
    out += [f"at {width} px, before the answer: {b}" for b in info["before"]]
    return out


def check_page(driver, base: str, site: Site, page: str, shots: Path | None, source: Path | None,
               timeout: float = 20.0) -> PageResult:
    from selenium.common.exceptions import TimeoutException

    r = PageResult(page)
    t0 = time.time()
    driver.get_log("browser")  # drop what earlier pages left
    driver.set_window_size(*DESKTOP)
    driver.get(f"{base}/{page}")
    end = time.time() + timeout
    while driver.execute_script("return document.readyState") != "complete" and time.time() < end:
        time.sleep(0.05)
    driver.set_script_timeout(timeout)
    try:
        mj = driver.execute_async_script(_MATHJAX_WAIT_JS)
    except TimeoutException:
        mj = "timeout"
    if mj.startswith("error") or mj == "timeout":
        r.errors.append(f"MathJax did not finish: {mj}")
    # images may be lazy: make them eager and wait until each has finished (or failed)
    driver.execute_script("document.querySelectorAll('img').forEach(i => i.loading = 'eager')")
    while time.time() < end and not driver.execute_script(
            "return Array.from(document.images).every(i => i.complete)"):
        time.sleep(0.1)
    info = driver.execute_script(_COLLECT_JS)
    origin = info["origin"]

    for e in driver.get_log("browser"):
        if e.get("level") == "SEVERE":
            r.errors.append(f"console error: {e.get('message', '')[:300]}")
    for res in info["res"]:
        if not res["name"].startswith(origin + "/") and not res["name"].startswith("data:"):
            r.errors.append(f"off-site {res['type']} resource: {res['name']}")
        elif res["status"] >= 400:
            r.errors.append(f"HTTP {res['status']} for {res['type']} resource {res['name']}")
    seen = set()
    for href in info["links"]:
        u = urllib.parse.urlsplit(href)
        if u.scheme not in ("http", "https") or f"{u.scheme}://{u.netloc}" != origin or href in seen:
            continue
        seen.add(href)
        r.links += 1
        target = site.file_for(u.path)
        if target is None:
            r.errors.append(f"broken link: {u.path}" + (f"#{u.fragment}" if u.fragment else ""))
        elif u.fragment and target.suffix == ".html" and \
                urllib.parse.unquote(u.fragment) not in site.ids(target):
            r.errors.append(f"broken anchor: {u.path}#{u.fragment}")
    for img in info["imgs"]:
        r.images += 1
        if not img["complete"] or img["w"] == 0:
            r.errors.append(f"image not loaded (naturalWidth {img['w']}): {img['src']}")
    r.math = info["mjx"]
    if info["rawMath"]:
        r.errors.append(f"{info['rawMath']} math elements left untypeset"
                        + ("" if info["hasMathJax"] else " (MathJax not loaded)"))
    if info["merror"]:
        r.errors.append(f"{info['merror']} MathJax errors (mjx-merror)")
    r.widgets = max(info["widgetViews"], source_widgets(page, source))
    r.twins = info["twins"]
    if r.widgets and not info["rendered"] and info["twins"] < r.widgets:
        r.errors.append(f"{r.widgets} widget(s) neither rendered nor shown by a static twin "
                        f"({info['twins']} visible twin(s))")
    r.errors += [f"static twin broken: {m}" for m in driver.execute_script(_TWIN_JS)]
    wide = driver.execute_script(_OVERFLOW_JS, OVERFLOW_TOLERANCE_PX)
    r.outputs = wide["boxes"]
    for b in wide["wide"]:
        r.errors.append(f"output box {b['box']} is {b['width']} px wide, the text column {wide['colWidth']} px "
                        f"at {DESKTOP[0]} px: {b['text']}")
    r.errors += [f"word broken inside a table cell at {DESKTOP[0]} px: {w!r}"
                 for w in driver.execute_script(_BROKEN_WORDS_JS)]
    if page == FIRST_PAGE:
        driver.execute_script("window.scrollTo(0, 0)")
        r.errors += first_screen_errors(driver.execute_script(_FIRST_SCREEN_JS), DESKTOP[0])
    stem = page[:-len(".html")].replace("/", "__")
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        path = shots / (stem + ".png")
        full_page_screenshot(driver, path)
        r.screenshot = str(path)
    driver.set_window_size(PHONE_WIDTH, DESKTOP[1])
    time.sleep(0.2)
    phone = driver.execute_script(_PHONE_JS, OVERFLOW_TOLERANCE_PX)
    r.errors += [f"at {PHONE_WIDTH} px: {m}" for m in driver.execute_script(_FIGURE_TEXT_JS, MIN_LEGEND_PX,
                                                                              MIN_TEXT_PX)]
    if page == FIRST_PAGE:
        r.errors += first_screen_errors(driver.execute_script(_FIRST_SCREEN_JS), PHONE_WIDTH)
    if phone["scroll"] > OVERFLOW_TOLERANCE_PX:
        r.errors.append(f"the page scrolls sideways at {phone['width']} px (by {phone['scroll']} px, "
                        f"{phone['pageWidth']} px wide)" + "".join(f"; {c}" for c in phone["culprits"]))
    if shots is not None:
        path = shots / f"{stem}.w{PHONE_WIDTH}.png"
        full_page_screenshot(driver, path)
        r.screenshot_phone = str(path)
    driver.set_window_size(*DESKTOP)
    r.seconds = time.time() - t0
    return r


def check_site(root: str | Path, screenshots: str | Path | None = None, source: str | Path | None = None,
               pages: list[str] | None = None) -> list[PageResult]:
    site = Site(Path(root))
    if not site.root.is_dir():
        raise FileNotFoundError(f"{root}: no built HTML here (run `make book` first)")
    httpd, base = serve(site.root)
    driver = make_driver()
    try:
        return [check_page(driver, base, site, p, Path(screenshots) if screenshots else None,
                           Path(source) if source else None)
                for p in (pages or site.pages())]
    finally:
        driver.quit()
        httpd.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", nargs="?", default="_build/html")
    ap.add_argument("--screenshots", default="_build/screenshots")
    ap.add_argument("--no-screenshots", action="store_true",
                    help="check every page without taking its screenshots (report.json is still written there)")
    ap.add_argument("--source", default=".", help="where book/X.ipynb sources live (for widget outputs)")
    a = ap.parse_args(argv)
    t0 = time.time()
    results = check_site(a.html, None if a.no_screenshots else a.screenshots, a.source)
    for r in results:
        print(r.line())
    Path(a.screenshots).mkdir(parents=True, exist_ok=True)
    (Path(a.screenshots) / "report.json").write_text(
        json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    bad = [r for r in results if not r.ok]
    print(f"browser check: {len(results) - len(bad)} pages passed, {len(bad)} failed "
          f"({time.time() - t0:.0f} s; {'no screenshots' if a.no_screenshots else 'screenshots'} in "
          f"{a.screenshots}/)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
