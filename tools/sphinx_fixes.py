"""Two fixes to the HTML that jupyter-book 1.0.4 builds, found by the browser test (tools/browser_check.py).

1. sphinx-thebe's inline `const THEBE_JS_URL = ...` script (and sphinx-togglebutton's selector) is added to
   every page twice (once with filename None, once with ""), so the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" in the
   console. We drop exact duplicates from the page's script list.
2. pydata-sphinx-theme writes `dataset.mode = localStorage.mode || "{{ default_mode }}"`, and jupyter-book
   leaves `default_mode` empty, so a first visit logs "Got invalid theme mode: ." We default it to "auto".

Loaded through `sphinx: local_extensions` in _config.yml.
"""


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        key = (str(getattr(js, "filename", js) or ""), tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept
    if not context.get("default_mode"):
        context["default_mode"] = "auto"


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
