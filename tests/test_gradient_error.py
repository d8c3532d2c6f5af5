"""Chapter 3: the paper's Eq. 1–3 checked against autograd (lpfail.gradient_error, issue 12)."""
import numpy as np
import pytest
import torch

from lpfail.gradient_error import TOL, _heads, capture_layer, delta_lp, derivation_check, synthetic_inputs
from lpfail.precision import FP64, PAPER_BF16


def _check(policy=PAPER_BF16, **kw):
    inp = synthetic_inputs(b=1, t=64, c=32, n_head=2, **kw)
    return derivation_check(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], policy, n_head=2)


def test_eq1_and_eq2_match_autograd_on_large_logits():
    r = _check(logit_scale=2.0)
    assert r["max_logit"] > 50  # the regime of the paper: large logits
    assert max(r["eq1_rel_err"] + r["eq2_rel_err"]) < TOL
    assert min(r["dd_abs_mean"]) > 1e-6  # A's δ really differs from the exact one: the check is not 0 = 0
    assert all(np.isfinite(r["eq3_rel_err"])) and all(-1 <= c <= 1 for c in r["eq3_cos_mean"])
    assert r["dd"].shape == (1, 2, 64)


def test_the_check_would_see_a_wrong_formula():
    """Eq. 1 with the sign of Δδ flipped (the error a sign slip in the derivation makes) is far off autograd:
    the same comparison the check makes, so the check can fail."""
    inp = synthetic_inputs(b=1, t=32, c=16, n_head=1, logit_scale=2.0)
    r = derivation_check(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], PAPER_BF16)
    x, wq, wk, wv, do = (inp[k] for k in ("x", "w_q", "w_k", "w_v", "do"))
    q, k, v = (_heads(x, w, 1).to(torch.bfloat16).double() for w in (wq, wk, wv))
    from lpfail.attention import flash_forward
    o = flash_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), PAPER_BF16).o
    mask = torch.ones(32, 32, dtype=torch.bool).tril()
    p = torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~mask, -torch.inf), -1)
    do = do.bfloat16().double()  # both δ's read the same dO (the one the attention's backward receives)
    dd = delta_lp(do.bfloat16(), o, PAPER_BF16).double() - (do * (p @ v)).sum(-1, keepdim=True)
    assert torch.allclose(dd[..., 0].float(), r["dd"], rtol=1e-6, atol=1e-9)  # the same Δδ
    assert r["eq1_rel_err"][0] < TOL
    # the correct sign is what matches: recompute the left side with autograd here, compare with ±formula
    qq = q.clone().requires_grad_()
    s = (qq @ k.transpose(-1, -2) / 4).masked_fill(~mask, -torch.inf)
    f_hp = (torch.softmax(s, -1) @ v * do).sum()
    (g_hp,) = torch.autograd.grad(f_hp, qq, retain_graph=True)
    (g_lp,) = torch.autograd.grad(f_hp - (dd[..., 0] * torch.logsumexp(s, -1)).sum(), qq)
    rhs = dd * (p @ k) / 4
    assert torch.allclose(g_hp - g_lp, rhs, rtol=1e-9, atol=1e-15)
    assert not torch.allclose(g_hp - g_lp, -rhs, rtol=1e-3, atol=0)


def test_fp64_policy_has_no_delta_error():
    r = _check(FP64, logit_scale=0.5)
    assert max(r["dd_abs_mean"]) < 1e-12


def test_capture_layer_gives_the_layers_tensors():
    from lpfail.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16))
    m.set_attention("reference", PAPER_BF16)
    idx = torch.randint(0, 32, (3, 16))
    cap = capture_layer(m, idx, idx, 1)
    q, k, v = cap["qkv"]
    assert torch.equal(_heads(cap["x"], cap["w_q"], 2), q) and torch.equal(_heads(cap["x"], cap["w_v"], 2), v)
    assert cap["do"].shape == (3, 2, 16, 8) and cap["do"].abs().sum() > 0
    assert all(p.grad is None for p in m.parameters())  # the model's gradients are left alone
    r = derivation_check(cap["x"], cap["w_q"], cap["w_k"], cap["w_v"], cap["do"], PAPER_BF16, n_head=2,
                         qkv=cap["qkv"])
    assert max(r["eq1_rel_err"] + r["eq2_rel_err"]) < TOL


def test_bad_inputs_are_named():
    inp = synthetic_inputs(b=1, t=16, c=16, n_head=2)
    with pytest.raises(ValueError, match="do must be"):
        derivation_check(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"][:, :1], n_head=2)
    with pytest.raises(ValueError, match="w_q, w_k, w_v"):
        derivation_check(inp["x"], inp["w_q"][:8], inp["w_k"], inp["w_v"], inp["do"], n_head=2)


def test_check_run_on_a_tiny_cpu_run(tmp_path):
    from lpfail.experiments.gradient_error import GradientErrorConfig, check_run, train_cpu_model

    c = GradientErrorConfig(n_layer=1, n_embd=32, block_size=32, batch_size=4, max_steps=8, steps=(4,))
    run = train_cpu_model(c, tmp_path / "run")
    recs = check_run(run, c.steps, rows=2, input_dtype=torch.float32, log=lambda *_: None)
    assert len(recs) == 1 and recs[0]["step"] == 4 and max(recs[0]["eq2_rel_err"]) < TOL
    with pytest.raises(ValueError, match="outside"):
        check_run(run, (8,))


def test_accumulation_toy_growth_laws():
    from lpfail.gradient_error import accumulation_toy

    biased = accumulation_toy(bias=0.5, steps=200, d=8, reps=64)
    unbiased = accumulation_toy(bias=0.0, steps=200, d=8, reps=64)
    assert 0.9 < biased["exponent"] < 1.1  # ∝ K
    assert 0.3 < unbiased["exponent"] < 0.7  # ∝ √K (a random walk)
    assert biased["norm"][-1] > 5 * unbiased["norm"][-1]
    with pytest.raises(ValueError):
        accumulation_toy(steps=5)


def test_tied_rows_and_the_split_of_the_delta_sum():
    from lpfail.gradient_error import tied_rows

    q = torch.zeros(1, 1, 3, 2, dtype=torch.bfloat16)
    k = torch.tensor([[[[1.0, 0.0], [1.0, 0.0], [2.0, 0.0]]]], dtype=torch.bfloat16)
    q[..., 0] = 1.0
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    # row 0 sees key 0 only (no tie); row 1 sees keys 0, 1 with equal scores (tie); row 2's max is key 2 alone
    assert tied_rows(q, k, 1.0, mask).tolist() == [[[False, True, False]]]
    r = _check(logit_scale=2.0)
    for h in range(2):
        assert r["sum_dd_tied"][h] + r["sum_dd_untied"][h] == pytest.approx(r["sum_dd"][h], rel=1e-9, abs=1e-15)
        assert 0 < r["frac_tied"][h] < 1  # the synthetic inputs repeat rows: some ties, not all


def test_sketches_keep_cosines():
    from lpfail.gradient_error import SKETCH_DIM, _sketch, sketch_cos, sketch_matrix

    g = torch.Generator().manual_seed(1)
    a = torch.randn(32, 64, generator=g, dtype=torch.float64)
    b = a + 0.5 * torch.randn(32, 64, generator=g, dtype=torch.float64)
    c = torch.randn(32, 64, generator=g, dtype=torch.float64)
    proj = sketch_matrix(a.numel())
    true = float((a * b).sum() / (a.norm() * b.norm()))
    assert abs(sketch_cos(_sketch(a, proj), _sketch(b, proj)) - true) < 4 / SKETCH_DIM ** 0.5
    assert abs(sketch_cos(_sketch(a, proj), _sketch(c, proj))) < 4 / SKETCH_DIM ** 0.5
    assert sketch_cos(_sketch(a, proj), _sketch(-a, proj)) == pytest.approx(-1.0)
    r = _check(logit_scale=2.0)
    assert len(r["sketch_rbar"]) == 2 and len(r["sketch_rbar"][0]) == SKETCH_DIM
    with pytest.raises(ValueError):
        sketch_matrix(0)


def test_gpu_report_on_fabricated_records():
    from lpfail.book import gradient_report as R

    def rec(step, layer, sums, cos, err):
        return {"step": step, "layer": layer, "max_logit": 1e4, "eq1_rel_err": [1e-13], "eq2_rel_err": [1e-13],
                "eq3_cos_mean": [cos, cos], "sum_dd": sums, "dd_abs_mean": [1e-3, 1e-3], "frac_dd_pos": [0.5, 0.5],
                "dw_err_norm": [err, err], "dd_rows": [0.0] * 128}
    res = {"gpu": {"records": [rec(300, 0, [0.1, -0.1], 0.2, 5.0), rec(300, 1, [0.0, 0.2], 0.8, 1.0)],
                   "max_rel_err": 1e-13, "tol": 1e-9, "passed": True}}
    s = R.gpu_summary(res)
    assert s["worst_layer"] == 0 and s["n_pos"] == 2 and s["n_sums"] == 4 and s["median_cos"] == pytest.approx(0.5)
    assert not s["has_ties"] and not s["has_sketches"]
    # N = 8 × 128 rows; σ from mean |Δδ|: 0.1 / (32 · 1e-3 · √(π/2)) ≈ 2.49
    assert R.bias_z(res["gpu"]["records"][0])[0] == pytest.approx(0.1 / (32 * 1e-3 * (np.pi / 2) ** 0.5))
    assert len(R.gpu_rows(res)) == 2


def test_gpu_records_provenance(tmp_path):
    import json

    from lpfail.experiments.gradient_error import _call_provenance

    assert _call_provenance(tmp_path) is None
    (tmp_path / "substitution_parts").mkdir()
    (tmp_path / "substitution_parts" / "part-20261201T075045-1.json").write_text(json.dumps(
        {"device": "NVIDIA H200", "git": "abc", "created": "2026-12-01T07:50:45+00:00", "runs": {}}))
    p = _call_provenance(tmp_path)
    assert p["device"] == "NVIDIA H200" and p["created"].startswith("2026-12-01")


def test_delta_term_is_derivation_checks_delta_term():
    from lpfail.gradient_error import _sketch, delta_term, sketch_matrix

    inp = synthetic_inputs(b=1, t=64, c=32, n_head=2, logit_scale=2.0)
    r = derivation_check(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], PAPER_BF16, n_head=2)
    t = delta_term(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], PAPER_BF16, n_head=2)
    proj = sketch_matrix(16 * 32)
    for h in range(2):
        assert _sketch(t["term"][h], proj) == pytest.approx(r["sketch_dterm"][h], abs=1e-9)
        assert t["sum_dd"][h] == pytest.approx(r["sum_dd"][h], rel=1e-9)
    z = delta_term(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"], FP64, n_head=2)
    assert float(z["term"].abs().max()) < 1e-12 * float(t["term"].abs().max())  # exact δ: no error term
    with pytest.raises(ValueError):
        delta_term(inp["x"], inp["w_q"], inp["w_k"], inp["w_v"], inp["do"][:, :1], PAPER_BF16, n_head=2)


def test_accumulation_run_on_a_tiny_cpu_run(tmp_path):
    from lpfail.experiments.gradient_error import GradientErrorConfig, accumulation_run, train_cpu_model

    c = GradientErrorConfig(n_layer=1, n_embd=32, block_size=32, batch_size=4, max_steps=16, steps=(4,))
    run = train_cpu_model(c, tmp_path / "run")
    out = accumulation_run(run, 4, 10, 0, policies={"A": "PAPER_BF16", "exact": "FP64"}, rows=2,
                           log=lambda *_: None)
    assert out["status"] == "completed" and out["k"] == 10
    assert out["on_run_bit_exact"]  # the window keeps the run's schedule: it is the run, bit for bit
    a, e = out["by_policy"]["A"], out["by_policy"]["exact"]
    assert len(a["norm"]) == 10 and len(a["norm"][0]) == c.n_head and len(a["exponent"]) == c.n_head
    assert len(a["sum_dd"]) == 10 and all(np.isfinite(a["exponent"] + a["exponent_signs"]))
    each = np.asarray(a["norm_signs_each"])                                   # (K, n_signs, H)
    assert each.shape == (10, 16, c.n_head)
    assert np.sqrt((each ** 2).mean(axis=1)) == pytest.approx(np.asarray(a["norm_signs"]), rel=1e-9)
    assert max(max(n) for n in e["norm"]) < 1e-12 * max(max(n) for n in a["norm"])
    with pytest.raises(ValueError, match="window"):
        accumulation_run(run, 8, 10, 0)


def _fabricated_accumulation(k=100, dim=50, n_signs=16, seed=0):
    """What accumulation_run stores, for terms t_k of growing size: head 0 along one direction with one sign
    (biased), head 1 along random directions (incoherent)."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(dim)
    u /= np.linalg.norm(u)
    v = rng.standard_normal((k, dim))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    sizes = np.arange(1, k + 1, dtype=float)
    terms = np.stack([sizes[:, None] * u, sizes[:, None] * v], axis=1)           # (K, H, dim)
    signs = rng.choice((-1.0, 1.0), size=(k, n_signs))
    e = np.cumsum(terms, axis=0)
    es = np.cumsum(signs[:, :, None, None] * terms[:, None], axis=0)             # (K, n_signs, H, dim)
    norm = np.linalg.norm(e, axis=2)
    norm_signs = np.sqrt((np.linalg.norm(es, axis=3) ** 2).mean(axis=1))
    return norm, norm_signs


def test_coherence_ratio_separates_a_shared_direction_from_growth():
    from lpfail.gradient_error import coherence_exponent, coherence_null, coherence_ratio, coherent_ratio

    norm, ns = _fabricated_accumulation()
    ks = np.arange(1, 101)
    raw = [np.polyfit(np.log(ks[10:]), np.log(norm[10:, h]), 1)[0] for h in range(2)]
    assert raw[0] > 1.5 and raw[1] > 1.2  # the raw exponent exceeds 1 for both: it cannot tell them apart
    rho = coherence_ratio(norm, ns)
    coh = coherent_ratio(ns)
    lo, hi = coherence_null(ns, reps=500)
    assert rho[-1, 0] > 2 * hi[-1, 0] and rho[-1, 0] == pytest.approx(coh[-1, 0], rel=0.35)
    assert lo[-1, 1] < rho[-1, 1] < hi[-1, 1] and 0.5 < rho[-1, 1] < 2
    ex = coherence_exponent(rho)
    assert ex[0] > 0.3 and abs(ex[1]) < 0.2
    # equal sizes along one direction: Σa/√Σa² = √K exactly
    equal = np.sqrt(np.arange(1, 51))[:, None] * np.ones((1, 2))
    assert coherent_ratio(equal)[-1] == pytest.approx([np.sqrt(50)] * 2, rel=1e-6)
    with pytest.raises(ValueError):
        coherence_ratio(norm, ns[:, :1])
    with pytest.raises(ValueError):
        coherence_ratio(norm, np.zeros_like(ns))
    with pytest.raises(ValueError):
        coherence_exponent(rho[:5])


def test_coherence_report_tied_rows_and_cross_step_on_fabricated_records():
    from lpfail.book import gradient_report as R

    norm, ns = _fabricated_accumulation()
    acc = {"by_policy": {"A": {"norm": norm.tolist(), "norm_signs": ns.tolist(), "exponent": [1.9, 1.5],
                               "exponent_signs": [1.5, 1.5]}}}
    s = R.coherence_summary(acc, reps=200)
    assert s["A"]["outside"] == [True, False]
    assert len(R.coherence_rows(s)) == 1 and len(R.coherence_rows(s)[0]) == len(R.COHERENCE_HEADER)
    assert "signs_lo" not in s["A"]
    each = np.stack([ns * 0.5, ns * 1.5], axis=1)                                   # (K, 2 draws, H)
    acc["by_policy"]["A"]["norm_signs_each"] = each.tolist()
    s2 = R.coherence_summary(acc, reps=200)
    assert s2["A"]["signs_lo"] == pytest.approx(np.full_like(ns, 0.5)) and s2["A"]["signs_hi"][-1] == pytest.approx(1.5)
    R.coherence_figure(s2)
    with pytest.raises(ValueError):
        R.coherence_summary({"norm": []})

    def rec(step, sk, tied, untied):
        return {"step": step, "layer": 0, "sum_dd_tied": tied, "sum_dd_untied": untied, "frac_tied": [0.1, 0.1],
                "sketch_rbar": sk, "sketch_dterm": [list(-np.asarray(x)) for x in sk] if step > 300 else sk}
    sk = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    res = {"gpu": {"records": [rec(300, sk, [0.3, -0.1], [0.1, -0.3]), rec(600, sk, [0.0, 0.2], [0.0, 0.2])]}}
    assert R.tied_share(res["gpu"]["records"][0]) == pytest.approx([0.75, 0.25])
    assert np.isnan(R.tied_share(res["gpu"]["records"][1])[0])
    assert R.cross_step(res, "sketch_rbar")[0]["cos"] == pytest.approx([1.0, 1.0])
    assert R.cross_step(res, "sketch_dterm")[0]["cos"] == pytest.approx([-1.0, -1.0])
    cs = R.cross_step_summary(res)
    assert cs["rbar"]["median"] == pytest.approx(1.0) and cs["dterm"]["n_neg"] == 2
    with pytest.raises(ValueError, match="sum_dd_tied"):
        R.tied_share({"sum_dd": [0.1]})
