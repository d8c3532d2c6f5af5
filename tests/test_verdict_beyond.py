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


def _cures_grid():
    """A stored-like ``cures`` result: three seeds, R, A_sr and A_hp judged by K2, R with one non-finite run."""
    k2 = lambda p, v: {"point": p, "ci": [p - 0.02, p + 0.02], "verdict": v}  # noqa: E731
    cures = {v: {"where": "forward", "K1": k2(0.01, "inconclusive"), "K2": k2(0.05, "refuted")}
             for v in ("R", "A_sr", "A_hp")}
    status = np.zeros((3, 6, 3), dtype=int)
    status[0, 5, 2] = 1
    return {"cures_analysis": {"cures": cures}, "small_variants": np.array(["R", "A_sr", "A_hp"]),
            "small_status": status, "seeds": np.array([0, 1, 2])}


def _conf(**words):
    claims = {h: {"estimate": 0.04, "ci": [0.015, 0.064], "n": 10, "p_adjusted": 0.095, "verdict": w}
              for h, w in words.items()}
    return {"analysis": {"claims": claims}}


def test_cures_table_shows_the_ten_seed_test_where_there_is_one_and_says_three_seeds_elsewhere():
    """Chapter 6's cures table: the robust fix's and stochastic rounding's rows carry the confirmation grid's
    ten-seed HR and H2 (statistic, word, Holm p) instead of the three-seed K2; rows without a ten-seed test keep K2
    and say on how many seeds; without the confirmation grid every row is K2 on three seeds."""
    table = BR.cures_summary_table(_cures_grid(), "bias", conf=_conf(HR="inconclusive", H2="inconclusive"))
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    r = next(v for k, v in rows.items() if "(R)" in k)
    sr = next(v for k, v in rows.items() if "(A_sr)" in k)
    hp = next(v for k, v in rows.items() if "(A_hp)" in k)
    for row, hyp in ((r, "HR"), (sr, "H2")):
        assert f"10 seeds, {hyp}" in row and "**inconclusive** (Holm p 0.095)" in row and "refuted" not in row
        assert "0.040" in row and "0.015" in row
    assert "3 seeds, K2" in hp and "**refuted**" in hp
    assert "not stored" in next(v for k, v in rows.items() if "(B′)" in k)
    bare = BR.cures_summary_table(_cures_grid(), "bias")
    assert "10 seeds" not in bare and bare.count("3 seeds, K2") == 3 and "3 seeds, K2; 1 run non-finite" in bare
    only_hr = BR.cures_summary_table(_cures_grid(), "bias", conf=_conf(HR="inconclusive"))
    assert only_hr.count("10 seeds") == 1 and only_hr.count("3 seeds, K2") == 2


def test_hp_sentence_scopes_the_paper_comparison_to_its_seeds():
    """δ from an FP32 output against the paper's Sec. 3: the K2 number and word on three seeds, said to be fewer
    than ten, with the verdict page's word; on ten seeds the scope clause goes."""
    s = BR.hp_sentence(_cures_grid())
    assert s.startswith("On 3 seeds, fewer than the ten a verdict on training rests on,")
    assert "+0.050 [+0.030, +0.070], **refuted**" in s and "against the paper's Sec. 3" in s
    assert f"*{BR.judge_cure(_cures_grid(), 'A_hp').verdict}*" in s and "disagrees" not in s
    ten = {**_cures_grid(), "seeds": np.arange(10)}
    assert "fewer than" not in BR.hp_sentence(ten) and "not yet tested" not in BR.hp_sentence(ten)


def test_chapter4_sentence_quotes_chapter4_and_computes_the_overlap():
    from lpfail import results
    pk_res, rnd = results.load("prod_kernels"), dict(results.load("rounding"))
    s = BR.chapter4_sentence(pk_res, rnd)
    want = f"{float(rnd['default_nofix_out_signed']) * 1e4:+.2f}"
    assert want in s and "intervals overlap" in s
    rnd["default_nofix_out_signed"] = 0.01                 # far from −13.95 ×10⁻⁴: the word must change
    assert "do not overlap" in BR.chapter4_sentence(pk_res, rnd)
