"""The CPU tables that pages read from the results cache instead of computing them live (their third digit moves
with the order of a sum, tools/cpu_invariance.py): `fix_gallery` (chapter 5's twin) and `beyond_cpu` (lab 6)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lpfail import results
from lpfail.experiments import beyond_cpu as B
from lpfail.experiments import fix_gallery as G


def test_the_stored_gallery_is_fix_state_of_every_case():
    res = results.load("fix_gallery")
    got = G.states(res)
    assert [t for t, _, _ in got] == [c[0] for c in G.GALLERY]
    title, params, sts = got[0]
    again = G.fix_state(*params)
    assert [s["policy"] for s in sts] == [s["policy"] for s in again] == list(G.fix_policies(2.0, 1e-3))
    for a, b in zip(sts, again):
        for f in ("m", "pbar", "l", "nonfinite"):
            assert a[f] == pytest.approx(b[f], rel=1e-6, nan_ok=True)
        assert a["bias"] == pytest.approx(b["bias"], rel=0.05, abs=2e-5)   # its third digit may move: the reason
    # Algorithm 3 at r_m = 100 is non-finite in every row (case 2), the robust fix never
    nonfinite = {s["policy"]: s["nonfinite"] for s in got[1][2]}
    assert nonfinite["Algorithm 3"] == 1.0 and nonfinite["robust"] == 0.0


def test_the_twin_reads_the_stored_gallery():
    from lpfail.book import fix_widgets

    html = fix_widgets.fix_twin()._repr_html_()
    assert html.count("<table") == len(G.GALLERY) and "non-finite" in html


def test_beyond_cpu_tables_from_a_small_run():
    cfg = dataclasses.replace(B.BeyondCPUConfig(), knob_rows=16, cures=("A: PAPER_BF16", "C: FP32"), cure_seeds=(0,))
    out = B.beyond_cpu(cfg)
    assert out["knob_away"].shape == (len(B.KNOBS), 2) and np.isfinite(out["knob_away"]).all()
    assert out["cure_errors"].shape == (2, 3)
    a, c = out["cure_errors"]
    assert (c < a).all() and (a > 1e-3).all()                   # FP32 attention closer to float64 than the paper
    rows = B.knob_rows(out)
    assert rows[0][0] == "`FA2_BF16`" and " ± " in rows[0][1] and len(B.cure_rows(out)) == 2
    stored = results.load("beyond_cpu")
    assert [str(n) for n in stored["knobs"]] == list(B.KNOBS) and [str(n) for n in stored["cures"]] == list(B.CURES)
