"""Chapter 4's and the appendix's official_check tables (lpfail.book.official_report) on a fabricated result."""
from __future__ import annotations

import numpy as np

from lpfail.book import official_report as o
from lpfail.results import Result


def _res(fix_dq=99.85):
    nan = np.full(4, np.nan)
    full = lambda x: np.tile(np.asarray(x, dtype=float), (6, 1))
    two = lambda x: np.stack([np.asarray(x, dtype=float)] * 2 + [nan] * 4)
    data = {"cases": np.array(["c"] * 6), "policies_nofix": np.array(["PAPER_BF16", "PAPER_BF16_COMPILED",
                                                                         "PAPER_BF16_COMPILED,l_store=none"]),
            "policies_fix": np.array(["PAPER_BF16_OFFICIAL_FIX", "PAPER_BF16_COMPILED_OFFICIAL_FIX"]),
            "agree_nofix_eager": np.stack([full([100] * 4), full([20] * 4), full([21] * 4)]),
            "agree_nofix_compiled": np.stack([full([20] * 4), full([99.99, 99.95, 99.92, 99.99]), full([50] * 4)]),
            "official_compiled_vs_eager_nofix": full([20] * 4),
            "agree_nofix_compiled_emulate": np.stack([two([100] * 4), two([56] * 4), two([55] * 4)]),
            "agree_fix_eager": np.stack([full([100] * 4), full([22] * 4)]),
            "agree_fix_compiled": np.stack([full([22] * 4), full([99.96, fix_dq, 99.9, 99.98])]),
            "tied_policy_names": np.array(["PAPER_BF16", "PAPER_BF16_COMPILED"]),
            "tied_policy_0": np.array([-1.37e-3, 3.4e-5]), "tied_policy_1": np.array([-1.37e-3, 3.4e-5]),
            "tied_official_eager": np.array([-1.37e-3, 3.4e-5]), "tied_official_compiled": np.array([-1.2e-3, 3e-5])}
    return Result(data, {"name": "official_check"})


def test_agreement_rows_presets_only_with_case_counts_and_the_criterion():
    rows = o.agreement_rows(_res())
    assert all("," not in r[2] for r in rows)                    # the one-knob variants only with extra=True
    comp = [r for r in rows if r[0].startswith("torch.compile (") and r[2] == "PAPER_BF16_COMPILED"][0]
    assert comp[3:] == ["6", "99.990", "99.950", "99.920", "99.990", "yes"]
    emu = [r for r in rows if "emulate" in r[0] and r[2] == "PAPER_BF16"][0]
    assert emu[3] == "2" and emu[4] == "100.000"                 # NaN cases left out, not propagated
    assert any(r[2].startswith("— (the eager") and r[-1] == "—" for r in rows)
    assert len(o.agreement_rows(_res(), extra=True)) == len(rows) + 3


def test_preset_verdict_and_tied_rows():
    v = o.preset_verdict(_res())
    assert v["compiled"] and v["eager"] and not v["compiled_fix"]
    assert v["worst"]["PAPER_BF16_COMPILED_OFFICIAL_FIX"] == ("dQ", 99.85)
    assert o.preset_verdict(_res(fix_dq=99.95))["compiled_fix"]
    t = o.tied_rows(_res())
    assert [r[0] for r in t][:2] == ["ours, PAPER_BF16", "ours, PAPER_BF16_COMPILED"] and len(t) == 4
    assert t[3][1] == "-1.2000e-03 ± 3.0e-05"


def test_tied_same_compares_the_point_estimates():
    assert not o.tied_same(_res())                                # -1.2e-3 against -1.37e-3
    r = _res()
    r._data["tied_official_compiled"] = np.array([-1.37e-3, 3e-5])
    assert o.tied_same(r)
