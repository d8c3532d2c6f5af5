"""The static twins' building blocks: a <select> that switches between precomputed states with no kernel
(`switcher_html`), a figure as such a state (`png_html`), and an object Jupyter shows as that HTML (`HTML`).

Every twin's outermost element carries ``data-lpfail-twin="<explorer name>"``, which the browser check
(tools/browser_check.py) looks for. The explorers themselves live in `lpfail.book.widgets` and in the chapters'
report modules; this module imports none of them.
"""
from __future__ import annotations

import html

from lpfail.book import plots

#: The inline handler of a twin's <select>: show the case whose data-case equals the selected value.
_SWITCH_JS = ("var v=this.value;this.closest('[data-lpfail-twin]').querySelectorAll('[data-case]')"
              ".forEach(function(d){d.hidden=(d.getAttribute('data-case')!==v);});")


def switcher_html(name: str, cases: list[tuple[str, str]], label: str = "example") -> str:
    """A kernel-free control: a <select> over precomputed (title, html) states, one shown at a time.
    Without JavaScript the first state shows."""
    opts = "".join(f"<option value='{i}'>{html.escape(t)}</option>" for i, (t, _) in enumerate(cases))
    body = "".join(f"<div data-case='{i}'{'' if i == 0 else ' hidden'}>{h}</div>"
                   for i, (_, h) in enumerate(cases))
    return (f"<div class='lpfail-twin' data-lpfail-twin='{html.escape(name)}'>"
            # a flex row, so the <select> may shrink below its longest option's width (an inline-block
            # label would grow to it and stick out past the text column)
            f"<label style='font-weight:bold;display:flex;align-items:center;gap:0.4em;max-width:100%'>"
            f"{html.escape(label)} "
            f"<select onchange=\"{_SWITCH_JS}\" style='min-width:0;max-width:100%;flex:0 1 auto'>{opts}"
            f"</select></label>"
            f"<div style='font-size:90%;color:#616161;margin:0.2em 0 0.5em 0'>{len(cases)} precomputed "
            f"states: choosing one needs no kernel</div>{body}</div>")


class HTML:
    """Static HTML that a notebook shows as it is (its ``_repr_html_``)."""

    def __init__(self, text):
        self.text = text

    def _repr_html_(self):
        return self.text

    def __repr__(self):
        return f"<static HTML, {len(self.text)} characters>"


#: Resolution of the twins' figures: many states on one page, so lower than a figure's (`plots.DPI`).
TWIN_DPI = 90


def png_html(fig, dpi: int = TWIN_DPI) -> str:
    """A figure as the book shows figures (`lpfail.book.plots.figure_html`: panels that stack on a phone, each
    with its text sizes for the browser check), at a twin's resolution; the figure is closed."""
    return plots.figure_html(fig, getattr(fig, "_lp_alt", "") or "run", dpi=max(int(dpi), TWIN_DPI))
