"""Chapter 6's verdict rules on fabricated results."""
import numpy as np
import pytest

from lpfail.book import verdict as V
from lpfail.book import beyond_report as BR


def _pk(away=5e-4, ci=1e-4, p_one=0.05, pbar_one=1.0, available=True):
    gaps, ties = np.array([8.0, 16.0]), np.array([1.0, 2.0])
    g = lambda x: np.full((2, 2), x)  # noqa: E731
    res = {"gaps": gaps, "ties": ties, "device_used": "cuda", "available_sdpa_flash": available,
           "available_mimic_exp2_fma": True, "grid_mimic_exp2_fma_p_one": g(p_one),
           "grid_mimic_exp2_fma_pbar_one": g(pbar_one)}
    if available:
        res.update({"grid_sdpa_flash_away": g(away), "grid_sdpa_flash_away_ci": g(ci)})
    else:
        res["unavailable_sdpa_flash"] = "RuntimeError: no flash here"
    return res


@pytest.mark.parametrize("away,ci,want", [(5e-4, 1e-4, V.REPRODUCED), (-5e-4, 1e-4, V.CONTRADICTED),
                                          (1e-5, 1e-4, V.NOT_REPRODUCED)])
def test_backend_bias(away, ci, want):
    v = BR.judge_backend_bias(_pk(away, ci), "sdpa_flash")
    assert v.verdict == want and "×10⁻⁴" in v.evidence


def test_backend_not_available_is_not_tested():
    v = BR.judge_backend_bias(_pk(available=False), "sdpa_flash")
    assert v.verdict == V.NOT_TESTED and "no flash here" in v.evidence


@pytest.mark.parametrize("p_one,pbar_one,want", [(0.05, 1.0, V.CONTRADICTED), (0.0, 0.3, V.REPRODUCED),
                                                 (0.9, 0.95, V.PARTLY)])
def test_fma_pbar(p_one, pbar_one, want):
    assert BR.judge_fma_pbar(_pk(p_one=p_one, pbar_one=pbar_one)).verdict == want


def _cures(k1, k2):
    return {"cures_analysis": {"cures": {"A_res": {"K1": {"point": -0.1, "ci": [-0.2, -0.05], "verdict": k1},
                                                   "K2": {"point": -0.05, "ci": [-0.1, -0.01], "verdict": k2}},
                                         "C": {"label": "C"}}}}


@pytest.mark.parametrize("k1,k2,want", [("supported", "supported", V.REPRODUCED),
                                        ("supported", "refuted", V.PARTLY),
                                        ("refuted", "refuted", V.CONTRADICTED),
                                        ("inconclusive", "inconclusive", V.NOT_REPRODUCED),
                                        ("inconclusive", "no gap to close", V.NOT_TESTED)])
def test_cure_rule(k1, k2, want):
    assert BR.judge_cure(_cures(k1, k2), "A_res").verdict == want


def test_cure_without_runs_and_beyond_rows_without_results():
    assert BR.judge_cure(_cures("supported", "supported"), "A_ds").verdict == V.NOT_TESTED
    from lpfail.results import ResultMissing

    def load(name):
        raise ResultMissing(name)

    rows = BR.claims(load)
    assert rows and all(r.verdict == V.NOT_TESTED for r in rows)


def test_beyond_rows_read_stored_results():
    def load(name):
        if name == "prod_kernels_cpu":
            return _pk()
        from lpfail.results import ResultMissing
        raise ResultMissing(name)

    rows = {r.claim: r for r in BR.claims(load)}
    assert rows["K-bias:sdpa_flash"].verdict == V.REPRODUCED
    assert rows["K-fma"].verdict == V.CONTRADICTED


def test_normaliser_facts_from_the_stored_measurement():
    """Chapter 6's sentence on ℓ from P̄ (flash-attention PR 2721): the largest change at the base rows and its
    largest share of a production back end's error, from results/prod_normaliser, recomputed here by hand."""
    import math

    from lpfail import results
    from lpfail.book import beyond_report as br

    res = results.load("prod_normaliser")
    f = br.normaliser_facts(res)
    gi = [i for i, (g, t) in enumerate(zip(res["gaps"], res["ties"])) if g == 16.0 and t == 2][0]
    pairs = [p for p in br.pk.NORMALISER_PAIRS if bool(res[f"available_{p[0]}"]) and bool(res[f"available_{p[1]}"])]
    part = max(abs(float(res[f"{a}_away"][gi]) - float(res[f"{b}_away"][gi])) for a, b in pairs)
    backends = [k[len("available_"):] for k in res if k.startswith("available_sdpa_") and bool(res[k])]
    share = max(abs(float(res[f"{a}_away"][gi]) - float(res[f"{b}_away"][gi])) / abs(float(res[f"{be}_away"][gi]))
                for a, b in pairs for be in backends)
    assert f["norm_part"] == f"{part * 1e4:.2f}" and f["norm_pairs"] == str(len(pairs)) == "4"
    assert f["norm_share"] == f"{100 * share:.0f} %" and math.isfinite(share)
    assert f["norm_card"] == "NVIDIA H200"
