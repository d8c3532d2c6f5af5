"""Chapter 2's knobs (m and ℓ apart from the accumulator, per-layer / per-head policies), the substitution
experiment's grid and rule, and the replay-and-branch function (issue 12)."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from lpfail.attention import attention, flash_forward
from lpfail import sweep
from lpfail.experiments import lr_sweep, substitution as sub
from lpfail.sweep import stats
from lpfail.precision import FA2_BF16, FP32, PAPER_BF16, PRESETS, Precision
from lpfail.train import TrainConfig, train


def _qkv(seed=0, b=1, h=2, t=96, d=32, scale=6.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    return (q * scale).to(dtype), (k * scale / 2).to(dtype), v.to(dtype)


def _grads(policy, q, k, v, do, block=None):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    o = attention(q, k, v, policy)
    o.backward(do)
    return [o.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]


# -- the knobs -----------------------------------------------------------------------------------------------------
def test_l_alone_is_the_running_row_sum():
    """Row l: acc=fp32 with Ō (o_acc) and m (m_acc) kept BF16 holds ℓ alone in FP32 (and ℓ before the division
    and as stored for the backward, which follow acc); with more than one key tile it changes ℓ and O, not m."""
    q, k, v = _qkv(t=640)  # more than one 512-key tile: m and ℓ are rescaled across tiles
    base = flash_forward(q, k, v, PAPER_BF16)
    l32 = flash_forward(q, k, v, sub.row_policy([r for r in sub.ROWS if r.name == "l"][0]))
    assert l32.o_unnorm.dtype == torch.bfloat16
    assert not torch.equal(l32.o.float(), base.o.float())
    assert torch.equal(l32.m.float(), base.m.float())  # ℓ alone leaves m untouched


def test_m_alone_matters_only_with_fp32_scores():
    q, k, v = _qkv(t=640)
    base = flash_forward(q, k, v, PAPER_BF16)
    m32 = flash_forward(q, k, v, PAPER_BF16.replace(m_acc="fp32"))
    assert torch.equal(m32.o, base.o)  # a maximum of BF16 scores is a BF16 number
    s32 = PAPER_BF16.replace(qk_out="fp32", scores="fp32")
    assert not torch.equal(flash_forward(q, k, v, s32.replace(m_acc="fp32")).o, flash_forward(q, k, v, s32).o)


def test_every_a_d_difference_switches_alone_and_all_together_give_d():
    knobs = sub.a_d_knobs()
    assert set(knobs) == {"scores", "pv_out", "acc", "block_q", "block_k", "qk_out", "exp_in", "dp", "delta_prod",
                          "grad_acc", "o_acc", "m_acc", "l_div", "l_store"}  # Ō, m, ℓ apart
    # every knob where they differ is covered by a row (block by tiles_fa2, acc by obar + m + l)
    changed = set()
    for r in sub.ROWS:
        if r.kind == "policy":
            p = sub.row_policy(r)
            changed |= {f.name for f in dataclasses.fields(Precision) if getattr(p, f.name) != getattr(PAPER_BF16, f.name)}
    # tiles_fa2 changes the blocks; l_div and l_store follow acc in row l (ℓ everywhere)
    assert set(knobs) - {"block_q", "block_k", "l_div", "l_store"} <= changed
    assert sub.row_policy([r for r in sub.ROWS if r.name == "tiles_fa2"][0]).block_k == FA2_BF16.block_k
    # A with all of D's values is D, bit for bit
    q, k, v = _qkv(t=160, h=1)
    do = torch.randn_like(q.float()).to(q.dtype)
    all_d = PAPER_BF16.replace(**{n: d for n, (_, d) in knobs.items() if n not in ("o_acc", "m_acc", "l_div", "l_store")})
    for x, y in zip(_grads(all_d, q, k, v, do), _grads(FA2_BF16, q, k, v, do)):
        assert torch.equal(x, y)


def test_same_as_a_changes_are_a_at_the_sweeps_shape():
    """Each change in SAME_AS_A gives A's output and gradients bit for bit on BF16 inputs of the sweep's shape
    (T 256, head size 64), and each run row does not (so no run row is A in disguise)."""
    q, k, v = _qkv(t=256, h=2, d=64, scale=4.0)
    # a seeded dO: torch's global seed is random per process here, and for a few draws of dO the row grad_acc
    # (FP32 dQ/dK/dV accumulators, which see one product per tile at T = 256) happens to round like A
    do = (torch.randn(q.shape, generator=torch.Generator().manual_seed(0)) * 1e-2).to(q.dtype)
    base = _grads(PAPER_BF16, q, k, v, do)
    assert lr_sweep.LRSweepConfig().block_size <= PAPER_BF16.block_k
    for name, (changes, why) in sub.SAME_AS_A.items():
        for x, y in zip(base, _grads(Precision.parse(f"PAPER_BF16,{changes}"), q, k, v, do)):
            assert torch.equal(x, y), name
    for r in sub.ROWS:
        if r.kind == "policy":
            assert not all(torch.equal(x, y) for x, y in zip(base, _grads(sub.row_policy(r), q, k, v, do))), r.name


def test_per_layer_and_per_head_policies_in_the_model():
    from lpfail.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=32))
    x = torch.randint(0, 64, (2, 32))
    m.set_attention("reference", FP32)
    full = m(x)[0].detach()
    m.set_attention("reference", PAPER_BF16, layers=[1], heads=[0, 2])
    specs = m.attention_specs()
    assert [s.policy.name for s in specs[1]] == ["PAPER_BF16", "FP32", "PAPER_BF16", "FP32"]
    assert all(s.policy == FP32 for s in specs[0])
    mixed = m(x)[0].detach()
    assert not torch.equal(mixed, full)


# -- the grid ------------------------------------------------------------------------------------------------------
def test_baselines_are_lr_sweeps_runs():
    c = sub.SubstitutionConfig()
    for lr in sub.LRS:
        for s in sub.SEEDS:
            p = sub.Point("A", lr, s)
            assert sub.train_config(c, p, "") == lr_sweep.train_config(lr_sweep.LRSweepConfig(), p.baseline(), "")
    # the stored lr_sweep parts hold these runs under the same hash, so they are reused, not rerun
    runs, _ = lr_sweep.STORE.load()
    if not runs:
        pytest.skip("no lr_sweep parts in results/")
    for b in ("A", "C"):
        for lr in sub.LRS:
            for s in sub.SEEDS:
                p = sub.Point(b, lr, s)
                assert runs[p.baseline().key]["run_hash"] == sweep.run_hash(sub.train_config(c, p, ""))


def _fake_lr_sweep():
    wq = np.full((1, 2, 3, 2, 4, 4), 10.0)
    wq[0, 1, 0, -1, 2] = [5, 40, 7, 30]  # seed 0: layer 2 holds the largest head (1), then head 3
    wq[0, 1, 1, -1, 0] = [50, 1, 2, 3]
    wq[0, 1, 2, -1, 3] = [1, 2, 60, 59]
    return {"small_variants": np.array(["A"]), "lrs": np.array([1.6e-2, 3.2e-2]), "seeds": np.array([0, 1, 2]),
            "small_wq": wq}


def test_row_configs():
    c = sub.SubstitutionConfig()
    fake = _fake_lr_sweep()
    tcs = {r.name: sub.train_config(c, sub.Point(r.name, 3.2e-2, 0), "", fake) for r in sub.ROWS}
    a = sub.train_config(c, sub.Point("A", 3.2e-2, 0), "")
    for name, tc in tcs.items():  # only the attention differs from A
        d = {k for k in tc.to_dict() if tc.to_dict()[k] != a.to_dict()[k]}
        assert d <= {"attention", "overrides"}, (name, d)
        tc.attention_table()  # parses
    assert sub.row_policy([r for r in sub.ROWS if r.name == "l"][0]) == PAPER_BF16.replace(acc="fp32", o_acc="bf16",
                                                                                          m_acc="bf16")
    assert tcs["l"].attention_table()[0][2].policy.o_acc == "bf16"
    assert tcs["layer1_a"].attention == "reference(FP32)" and tcs["layer1_a"].overrides == ("1:reference(PAPER_BF16)",)
    assert tcs["layer2_c"].attention == a.attention and tcs["layer2_c"].overrides == ("2:reference(FP32)",)
    assert tcs["heads_top"].overrides == ("2/1,3:reference(PAPER_BF16)",)
    assert tcs["heads_rest"].overrides == ("2/0,2:reference(PAPER_BF16)",)
    assert sub.head_choice(fake, 3.2e-2, 1) == (0, (0, 3)) and sub.head_choice(fake, 3.2e-2, 2) == (3, (2, 3))
    with pytest.raises(ValueError, match="no run of A"):
        sub.head_choice(fake, 1e-3, 0)
    assert len({run_hash for run_hash in (sweep.run_hash(t) for t in tcs.values())}) == len(tcs)


def test_plan_size_and_order():
    c = sub.SubstitutionConfig()
    pts = sub.plan(c)
    rows = [p for p in pts if p.row not in ("A", "C")]
    assert len(rows) == 13 * 2 * 3 + 10 * 3  # knob rows at both lrs, layer and head rows at 3.2e-2
    assert rows[0].row == "scores" and rows[-1].row == "heads_rest"
    assert len({p.key for p in pts}) == len(pts)
    with pytest.raises(ValueError, match="unknown row"):
        sub.SubstitutionConfig(rows=("nope",))
    with pytest.raises(ValueError, match="lr_sweep learning rates"):
        sub.SubstitutionConfig(lrs=(5e-2,))


def test_rule_on_fabricated_losses():
    a, c = np.array([3.2, 3.3, 3.6]), np.array([2.9, 2.9, 2.88])
    closes = sub.judge_row(np.array([2.91, 2.92, 2.9]), a, c)
    assert closes["verdict"] == "closes the gap" and closes["fraction_closed"] > 0.9
    same = sub.judge_row(a + 0.01, a, c)
    assert same["verdict"] == "does not close it" and same["fraction_closed"] < 0
    assert sub.judge_row(np.array([3.0, 3.3, 2.9]), a, c)["verdict"] == "inconclusive"
    nogap = sub.judge_row(c, c + np.array([0.1, -0.1, 0.0]), c)
    assert nogap["verdict"] == "no gap to close"
    assert sub.judge_row(np.array([np.nan, 1, 1]), a, c)["verdict"].startswith("not measured")
    with pytest.raises(ValueError):
        sub.judge_row(a[:2], a, c)


def test_analyse_and_parts_on_fabricated_runs(tmp_path):
    c = sub.SubstitutionConfig(rows=("l", "obar"), lrs=(3.2e-2,), check_baseline=True)
    rng = np.random.default_rng(0)

    def summ(key, final):
        return {"key": key, "run_hash": "x", "status": "completed", "val_step": [0, 1000], "val_loss": [5.5, final],
                "loss_curve": [1.0]}
    have = {}
    for s in c.seeds:
        have[sub.Point("A", 3.2e-2, s).key] = summ("", 3.3 + 0.05 * rng.random())
        have[sub.Point("C", 3.2e-2, s).key] = summ("", 2.9 + 0.01 * rng.random())
        have[sub.Point("l", 3.2e-2, s).key] = summ("", 2.9 + 0.01 * rng.random())
        have[sub.Point("obar", 3.2e-2, s).key] = summ("", 3.3 + 0.05 * rng.random())
    out = sub.analyse(c, have, check=have[sub.Point("A", 3.2e-2, 0).key])
    assert out["rows"]["l"]["by_lr"]["0.032"]["verdict"] == "closes the gap"
    assert out["rows"]["obar"]["by_lr"]["0.032"]["verdict"] in ("does not close it", "inconclusive")
    assert out["baseline_reproduced"] is True and out["preregistered_on"] == "2026-12-01"
    part = sub.STORE.part(tmp_path)
    part.add({"key": "m/lr0.032/s0", "run_hash": "h"})
    runs, metas = sub.STORE.load(tmp_path)
    assert runs == {"m/lr0.032/s0": {"key": "m/lr0.032/s0", "run_hash": "h"}} and metas[0]["runs"] == 1
    (tmp_path / "substitution_parts" / "part-bad.json").write_text("{")
    with pytest.raises(Exception, match="corrupt"):
        sub.STORE.load(tmp_path)


# -- replay and branch -------------------------------------------------------------------------------------------
def test_replay_branch_is_bit_exact_and_a_branch_differs(tmp_path):
    cfg = TrainConfig.preset("tiny", max_steps=12, checkpoint_every=4, keep_checkpoints=0,
                             attention="reference(PAPER_BF16)", out_dir=str(tmp_path / "run"), diag_every=0)
    train(cfg)
    out = sub.replay_branch(tmp_path / "run", 4, {"fp32": {"attention": "reference(FP32)"},
                                                  "m": {"attention": "reference(PAPER_BF16,m_acc=fp32)"}},
                            out_root=tmp_path / "branches")
    assert out["replay"]["equal"] and len(out["replay"]["losses"]) == 8
    assert out["fp32"]["first_diff"] is not None and out["fp32"]["first_diff"] >= 4  # another arithmetic
    assert out["m"]["first_diff"] is None  # m alone in FP32 is A (SAME_AS_A): the branch is the run itself
    assert out["m"]["losses"] == out["replay"]["losses"]
    assert json.loads((tmp_path / "branches" / "fp32" / "config.json").read_text())["start_step"] == 4
    # a window that stops before the run's end keeps the run's learning-rate schedule (the GPU call of
    # 2026-12-01 10:52 UTC failed here: max_steps moved the cosine's end)
    part = sub.replay_branch(tmp_path / "run", 4, {}, max_steps=9)
    assert part["replay"]["equal"] and part["replay"]["losses"] == out["replay"]["losses"][:5]
    with pytest.raises(FileNotFoundError, match="ckpt_0000003"):
        sub.replay_branch(tmp_path / "run", 3, {})
    # a tampered record is caught: the replay must reproduce the run
    log = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    rec = json.loads(log[6])
    rec["loss"] = rec["loss"] + 1e-3
    log[6] = json.dumps(rec)
    (tmp_path / "run" / "log.jsonl").write_text("\n".join(log) + "\n")
    with pytest.raises(ValueError, match="bit for bit"):
        sub.replay_branch(tmp_path / "run", 4, {})


def test_store_from_parts_needs_every_point_and_stores_the_verdicts(tmp_path, monkeypatch):
    """The collect step on fabricated parts: the baselines from lr_sweep's parts, the rows from ours, matched
    by TrainConfig hash; a missing point is an error naming it."""
    from lpfail import results

    c = sub.SubstitutionConfig(rows=("l",), lrs=(3.2e-2,))
    lr_dir = tmp_path / "lr_sweep_parts"
    lr_dir.mkdir()
    rng = np.random.default_rng(1)

    def summ(p, final):
        return {"key": p.key, "run_hash": sweep.run_hash(sub.train_config(c, p, "")), "status": "completed",
                "val_step": [0, 1000], "val_loss": [5.5, final], "loss_curve": [1.0]}
    base = {}
    for s in c.seeds:
        for b, mu in (("A", 3.3), ("C", 2.9)):
            p = sub.Point(b, 3.2e-2, s)
            base[p.baseline().key] = summ(p, mu + 0.01 * rng.random()) | {"key": p.baseline().key}
    (lr_dir / "part-1.json").write_text(json.dumps({"format": lr_sweep.STORE.fmt, "runs": base}))
    grid = sub.SubstitutionGrid(dataclasses.replace(c, check_baseline=False))
    with pytest.raises(sweep.SweepIncomplete, match="l/lr0.032"):
        sweep.collect(grid, tmp_path)
    part = sub.STORE.part(tmp_path)
    for s in c.seeds:
        part.add(summ(sub.Point("l", 3.2e-2, s), 2.9 + 0.01 * rng.random()))
    res = sweep.collect(grid, tmp_path)
    assert res["analysis"]["rows"]["l"]["by_lr"]["0.032"]["verdict"] == "closes the gap"
    assert results.load("substitution", grid.config, directory=tmp_path)["complete"] is True
    assert {m["file"] for m in res["parts"]} == {"part-1.json", part.name}  # the baselines' part too


@pytest.mark.gpu
def test_graph_checks_on_the_gpu(tmp_path):
    out = sweep.graph_checks(sub.substitution_grid(), tmp_path, groups=("delta_dPP", "l"), steps=10)
    assert out["ok"], out


def test_report_tables():
    from lpfail.book import substitution_report as SR

    rows = SR.results_rows(None)
    assert len(rows) == len(sub.ROWS) and rows[0][0].startswith("tiles_fa2")
    assert all(cell in ("pending (GPU)", "not run at this lr") for r in rows for cell in r[1:-1])
    assert [r.group for r in SR.paper_order(sub.ROWS)][-1] == "backward"
    assert len(SR.rows_table()) == len(sub.ROWS)


def test_fp32_scores_with_a_bf16_max_overflow_at_large_logits():
    """Why the rows `scores` and `score_path` broke on the GPU: with FP32 scores, a max (or a stored m) in BF16
    overflows exp at logits in the tens of thousands; m and ℓ stored in FP32 (as D has them) do not."""
    from lpfail.book import substitution_report as SR

    got = {p: f for p, _, f in SR.overflow_check(scale=100.0)}
    assert all(got["PAPER_BF16"]) and all(got["FA2_BF16"])
    assert not any(got["PAPER_BF16,qk_out=fp32,scores=fp32"])
    assert got["PAPER_BF16,qk_out=fp32,scores=fp32,m_acc=fp32,exp_in=fp32"] == [True, False, False, False]
    assert all(got["PAPER_BF16,qk_out=fp32,scores=fp32,m_acc=fp32,exp_in=fp32,l_store=fp32"])
    small = {p: f for p, _, f in SR.overflow_check(scale=4.0)}  # logits in the tens: no overflow anywhere
    assert all(all(f) for f in small.values())


def test_replay_report_on_a_fabricated_replay():
    from lpfail.book import substitution_report as SR

    rec = [3.0] * 100 + [3.2] * 100
    rep = {"step": 100, "replay": {"losses": rec, "equal": True},
           "delta_dPP": {"losses": [3.0] * 100 + [3.1] * 100, "first_diff": 101},
           "out": {"losses": [3.0] * 100 + [3.3] * 100, "first_diff": 100},
           "scores": {"losses": [3.0, float("nan")], "first_diff": 100}, "wall_s": 1.0}
    rows = SR.replay_rows(rep)
    assert rows[0] == ["replay (no change)", "none: bit-exact", "200", "3.0000", "3.2000", "0"]
    assert rows[1][1:] == ["101", "200", "3.0000", "3.1000", "-0.1000"]
    assert rows[2][-1] == "+0.1000" and rows[3][4] == "non-finite at step 101"
    assert all(len(r) == len(SR.REPLAY_HEADER) for r in rows)
    sm = SR.replay_summary(rep)
    assert (sm["start"], sm["end"]) == (100, 300) and sm["below"] == ["delta_dPP"]
    assert sm["diff_range"] == pytest.approx((-0.1, 0.1))
    assert sm["branches"]["scores"]["nonfinite_step"] == 101
    with pytest.raises(ValueError):
        SR.replay_rows({"l": {}})
    with pytest.raises(ValueError, match="200"):
        SR.replay_summary({"step": 0, "replay": {"losses": [3.0] * 150, "equal": True}})
    fig = SR.replay_figure(rep, departure=(250, 500))
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 3  # two finite branches and the zero line


def test_heldout_and_amendment_outcome():
    from lpfail.book import substitution_report as SR

    def run(v):
        return {"val_step": [0, 250, 500], "val_loss": v}
    have = {sub.Point("A", 3.2e-2, 0).key: run([5.5, 3.0, 3.1]), sub.Point("C", 3.2e-2, 0).key: run([5.5, 3.1, 3.0])}
    assert SR.heldout(have, [250, 500, 750]) == {"A": [3.0, 3.1, None], "C": [3.1, 3.0, None]}
    with pytest.raises(KeyError):
        SR.heldout(have, [250], lr=1.6e-2)
    d = {"verdict": "closes the gap", "point": -0.1, "ci": [-0.2, -0.01], "fraction_closed": 0.9}
    out = SR.amendment_outcome({"rows": {"score_path_l": {"by_lr": {"0.016": d}}}})
    assert out["score_path_l"]["0.016"] == "closes the gap (90 % of the gap closed, -0.100 [-0.200, -0.010])"
    assert out["score_path_l"]["0.032"] == "pending (GPU)" and set(out) == {"score_path_l", "scores_l"}


def test_outcome_lines_from_the_stored_result():
    from lpfail import results
    from lpfail.book import substitution_report as SR

    try:
        res = results.load("substitution")
    except results.ResultError:
        pytest.skip("substitution not stored")
    lines = SR.outcome_lines(res["analysis"])
    assert len(lines) == len(sub.ROWS) and not any("pending" in x for x in lines)
    assert res["analysis"]["baseline_reproduced"] is True  # the rerun of A (3.2e-2, seed 0) was bit-equal


def test_replay_run_matches(tmp_path):
    import json

    from lpfail.book import substitution_report as SR

    have = {"A/lr0.032/s0": {"val_step": [0, 1000], "val_loss": [5.5, 3.1]}}
    assert SR.replay_run_matches(have, tmp_path) is None
    (tmp_path / "substitution_gpu").mkdir()
    f = tmp_path / "substitution_gpu" / "a_val.jsonl"
    f.write_text('{"step": 0, "val_loss": 5.5}\n{"step": 1000, "val_loss": 3.1}\n')
    assert SR.replay_run_matches(have, tmp_path) is True
    f.write_text(json.dumps({"step": 0, "val_loss": 5.5}) + "\n" + json.dumps({"step": 1000, "val_loss": 3.1000001}))
    assert SR.replay_run_matches(have, tmp_path) is False


def test_departure_of_a_from_c():
    from lpfail.book import substitution_report as SR

    def have(a, c):
        return {"A/lr0.032/s0": {"val_step": [0, 250, 500, 750], "val_loss": a},
                "C/lr0.032/s0": {"val_step": [0, 250, 500, 750], "val_loss": c}}
    assert SR.departure(have([5.5, 3.0, 3.1, 3.2], [5.5, 3.1, 3.0, 2.9])) == (250, 500)
    assert SR.departure(have([5.5, 3.2, 2.9, 3.2], [5.5, 3.1, 3.0, 2.9])) == (500, 750)  # must stay above
    assert SR.departure(have([5.5, 3.2, 3.1, 2.8], [5.5, 3.1, 3.0, 2.9])) is None  # ends below C
    assert SR.departure({}) is None


# -- the amendment of 2026-12-01 (rows score_path_l, scores_l; experiment substitution_amendment) ----------------------
#: The config hash of the grid stored on 2026-12-01 (results/substitution.json, 120 runs): the amendment must not move it.
STORED_GRID_HASH = "1b956f271ec18071"


def test_amendment_leaves_the_grid_and_its_stored_hash_as_they_were():
    from lpfail import results

    assert results.config_hash(sub.SubstitutionConfig()) == STORED_GRID_HASH
    stored = json.loads((results.REPO_ROOT / "results" / "substitution.json").read_text())
    assert stored["config_hash"] == STORED_GRID_HASH and results.status("substitution") == "fresh"
    assert len(sub.ROWS) == 23 and {"scores", "score_path"} <= {r.name for r in sub.ROWS}  # the broken rows stay
    assert not {r.name for r in sub.AMENDED_ROWS} & {r.name for r in sub.ROWS}
    with pytest.raises(ValueError, match="unknown row"):
        sub.SubstitutionConfig(rows=("scores_l",))  # an amended row is not a row of the grid
    ac = sub.AmendmentConfig()
    assert ac.rows == ("score_path_l", "scores_l") and ac.lrs == sub.LRS and ac.seeds == sub.SEEDS
    assert ac.amended_on == "2026-12-01" and results.config_hash(ac) != STORED_GRID_HASH
    with pytest.raises(ValueError, match="amended rows"):
        sub.AmendmentConfig(rows=("scores",))
    with pytest.raises(ValueError, match="lr_sweep learning rates"):
        sub.AmendmentConfig(lrs=(5e-2,))
    assert results.get("substitution_amendment").config is sub.AmendmentConfig


def test_amended_rows_are_the_broken_rows_with_m_and_the_stored_l_in_fp32():
    pol = {r.name: sub.row_policy(r) for r in sub.AMENDED_ROWS}
    assert pol["score_path_l"] == PAPER_BF16.replace(qk_out="fp32", scores="fp32", m_acc="fp32", exp_in="fp32",
                                                     l_store="fp32")
    assert pol["scores_l"] == PAPER_BF16.replace(qk_out="fp32", scores="fp32", m_acc="fp32", l_store="fp32")
    for r in sub.AMENDED_ROWS:
        broken = sub.row_policy(sub.row_by_name(r.amends))
        diff = {f.name for f in dataclasses.fields(Precision) if getattr(broken, f.name) != getattr(pol[r.name], f.name)}
        assert diff <= {"m_acc", "l_store"} and "l_store" in diff, (r.name, diff)
    c = sub.SubstitutionConfig()
    grid_hashes = {sweep.run_hash(sub.train_config(c, p, "", _fake_lr_sweep())) for p in sub.plan(c)}
    for p in sub.plan(sub.AmendmentConfig(), baselines=False):
        tc = sub.train_config(sub.AmendmentConfig(), p, "")
        a = sub.train_config(c, sub.Point("A", p.lr, p.seed), "")  # the same seeds and batches as A's run
        assert {k for k in tc.to_dict() if tc.to_dict()[k] != a.to_dict()[k]} == {"attention"}
        assert tc.attention == f"reference({pol[p.row].name})"
        assert sweep.run_hash(tc) not in grid_hashes  # never one of the stored runs
    with pytest.raises(ValueError, match="unknown row"):
        sub.row_by_name("nope")


def test_amended_rows_are_finite_where_the_broken_rows_overflow_and_are_not_a():
    from lpfail.book import substitution_report as SR

    got = {p: f for p, _, f in SR.overflow_check(scale=100.0)}
    for r in sub.AMENDED_ROWS:
        assert all(got[f"PAPER_BF16,{r.changes}"]), r.name
        assert not all(got[f"PAPER_BF16,{sub.row_by_name(r.amends).changes}"]), r.amends
    q, k, v = _qkv(t=256, h=2, d=64, scale=4.0)
    do = (torch.randn(q.shape, generator=torch.Generator().manual_seed(0)) * 1e-2).to(q.dtype)
    base = _grads(PAPER_BF16, q, k, v, do)
    g = {r.name: _grads(sub.row_policy(r), q, k, v, do) for r in sub.AMENDED_ROWS}
    for name, out in g.items():
        assert not all(torch.equal(x, y) for x, y in zip(base, out)), name
    assert not all(torch.equal(x, y) for x, y in zip(g["score_path_l"], g["scores_l"]))


def test_stored_runs_are_read_with_the_lr_sweep_of_the_folder_given(tmp_path, monkeypatch):
    """`stored_for(c, directory)` builds the heads rows from the lr_sweep in `directory`, as `lookup` does, not from
    ``$LPFAIL_RESULTS_DIR`` (here an empty folder)."""
    from lpfail import results

    runs, _ = sub.STORE.load()
    if not runs:
        pytest.skip("no substitution parts in results/")
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))
    have, missing = sub.stored_for(sub.SubstitutionConfig(), results.REPO_ROOT / "results")
    assert len(have) == 120 and missing == []


def test_amendment_status_counts_on_the_stored_parts(capsys):
    """With the repository's part files the grid has all its 120 runs and the amendment all its 12 (stored by the
    GPU call of 2026-12-01, 10:47 UTC): nothing is missing, and the amendment's runs are none of the grid's."""
    runs, _ = sub.STORE.load()
    if not runs:
        pytest.skip("no substitution parts in results/")
    have, missing = sub.stored_for(sub.SubstitutionConfig())
    assert len(have) == 120 and missing == []
    a_have, a_missing = sub.stored_for(sub.AmendmentConfig(), baselines=False)
    assert len(a_have) == 12 and a_missing == [] and not set(a_have) & set(have)
    assert {k.split("/")[0] for k in a_have} == {"score_path_l", "scores_l"}
    b_have, b_missing = sub.stored_for(sub.AmendmentConfig())
    assert len(b_have) == 24 and b_missing == []  # with A, C: the grid's baselines
    assert set(b_have) - set(a_have) <= set(have)
    # the grid's own runs, the baseline check (A rerun at 3.2e-2, seed 0) among them
    assert sweep.status_text(sub.substitution_grid()).splitlines()[0] == "substitution: 121 of 121 runs stored"
    assert sweep.status_text(sub.amendment_grid()).startswith("substitution_amendment: 24 of 24 runs stored")
    assert sub.main(["plan"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 121 and all("\tstored\t" in ln for ln in lines)


def _copy_results(tmp_path):
    """The repository's stored grid and its parts, without the amendment's, in a scratch results folder
    (lr_sweep's parts linked)."""
    import shutil

    from lpfail import results

    src = results.REPO_ROOT / "results"
    if not sweep.part_files(src / "substitution_parts"):
        pytest.skip("no substitution parts in results/")
    # the grid's parts only: a part holding only amended rows (the amendment's own call) is left out, so that
    # the scratch folder is the state before the amendment ran
    amended = {r.name for r in sub.AMENDED_ROWS}
    (tmp_path / "substitution_parts").mkdir()
    for f in sweep.part_files(src / "substitution_parts"):
        if not {k.split("/")[0] for k in sweep.read_part(f)["runs"]} <= amended:
            shutil.copy(f, tmp_path / "substitution_parts" / f.name)
    (tmp_path / "lr_sweep_parts").symlink_to(src / "lr_sweep_parts")
    for f in ("substitution.json", "substitution.npz", "lr_sweep.json", "lr_sweep.npz"):
        shutil.copy(src / f, tmp_path / f)


def _write_part(tmp_path, name, runs):
    (tmp_path / "substitution_parts" / name).write_text(json.dumps(
        {"format": sub.STORE.fmt, "version": 1, "git": "test", "device": "test device", "versions": {},
         "host": "h", "created": "2026-12-02T00:00:00+00:00", "wall_s": 1.0, "runs": runs}))


def test_collect_refuses_the_amendment_while_missing_then_judges_it_by_the_same_rule(tmp_path, monkeypatch):
    from lpfail import results

    _copy_results(tmp_path)
    monkeypatch.setenv("LPFAIL_RESULTS_DIR", str(tmp_path))
    grid = sub.amendment_grid()
    with pytest.raises(sweep.SweepIncomplete, match=r"12 of 24 runs are not stored yet .*first: "
                                                    r"score_path_l/lr0.016/s0\); nothing stored"):
        sweep.collect(grid)
    assert not (tmp_path / "substitution_amendment.json").exists()
    assert results.status("substitution_amendment") == "missing"

    # fabricated runs of the amended rows: score_path_l ends at C's loss (closes the gap), scores_l above A's
    ac = sub.AmendmentConfig()
    have, _ = sub.stored_for(ac)
    runs = {}
    for p in sub.plan(ac, baselines=False):
        ref = have[sub.Point("C" if p.row == "score_path_l" else "A", p.lr, p.seed).key]
        vl = list(ref["val_loss"])
        if p.row == "scores_l":
            vl[-1] = vl[-1] + 0.01
        runs[p.key] = {"key": p.key, "run_hash": sweep.run_hash(sub.train_config(ac, p, "")), "status": "completed",
                       "val_step": list(ref["val_step"]), "val_loss": vl, "loss_curve": [1.0]}
    last = sub.Point("scores_l", 3.2e-2, 2).key
    _write_part(tmp_path, "part-20261202T000000-1.json", {k: r for k, r in runs.items() if k != last})
    with pytest.raises(sweep.SweepIncomplete, match=f"1 of 24 runs .*first: {last}"):  # 11 of 12: nothing half-done
        sweep.collect(grid)
    assert not (tmp_path / "substitution_amendment.json").exists()
    _write_part(tmp_path, "part-20261202T000001-1.json", {last: runs[last]})
    assert sweep.collect(grid) is not None
    res = results.load("substitution_amendment")
    an = res["analysis"]
    assert an["amended_on"] == "2026-12-01" and an["rule"] == sub.RULE
    assert set(an["rows"]) == {"score_path_l", "scores_l"} and an["rows"]["scores_l"]["amends"] == "scores"
    have, missing = sub.stored_for(ac)
    assert missing == []
    idx = stats.bootstrap_seed_indices(len(ac.seeds))
    for lr in ac.lrs:
        base = sub.final_losses(ac, have, ["A", "C"], lr)
        for r in ac.rows:
            want = sub.judge_row(sub.final_losses(ac, have, [r], lr)[0], base[0], base[1], idx)
            assert an["rows"][r]["by_lr"][f"{lr:g}"] == want
        assert an["rows"]["score_path_l"]["by_lr"][f"{lr:g}"]["verdict"] == "closes the gap"
        assert an["rows"]["scores_l"]["by_lr"][f"{lr:g}"]["verdict"] == "does not close it"
    assert "test device" in res.meta["device"]
    assert sweep.status_text(grid).startswith("substitution_amendment: 24 of 24 runs stored")


def test_amendment_report_pending_and_stored():
    from lpfail.book import substitution_report as SR

    state = {"state": "missing", "analysis": None, "n_stored": 1, "n_runs": 12,
             "stored": {"score_path_l": {"0.016": 1, "0.032": 0}, "scores_l": {"0.016": 0, "0.032": 0}}}
    rows = SR.amendment_rows(state)
    assert [r[0].split(":")[0] for r in rows] == ["score_path_l", "scores_l"] and rows[0][2] == "score_path"
    assert rows[0][3:] == ["pending (GPU): 1 of 3 runs stored", "pending (GPU): 0 of 3 runs stored"]
    assert len(SR.amendment_header()) == len(rows[0])
    text = SR.amendment_lines(state)
    assert "Runs stored: 1 of 12" in text[1] and "pending" in text[1]
    assert any(sub.AMENDMENT_PREDICTIONS["scores_l"] in t for t in text)
    d = {"verdict": "closes the gap", "point": -0.1, "ci": [-0.2, -0.01], "fraction_closed": 0.9}
    state = dict(state, state="fresh", analysis={"rows": {"score_path_l": {"by_lr": {"0.032": d}}}})
    assert SR.amendment_rows(state)[0][4].startswith("<b>closes the gap</b>")
    live = SR.amendment_state()
    assert live["n_runs"] == 12 and set(live["stored"]) == {"score_path_l", "scores_l"}


def test_replay_branches_are_policy_rows_without_the_broken_ones():
    from lpfail.book import substitution_report as SR

    assert len(sub.REPLAY_ROWS) == 7 and not {"scores", "score_path"} & set(sub.REPLAY_ROWS)
    assert {"scores_l", "score_path_l"} <= set(sub.REPLAY_ROWS)
    for n in sub.REPLAY_ROWS:
        sub.row_policy(sub.row_by_name(n))
    rep = {"step": 100, "replay": {"losses": [3.0] * 200, "equal": True},
           "scores_l": {"losses": [2.9] * 200, "first_diff": 100}}
    assert SR.replay_rows(rep)[1][0] == "scores_l: " + sub.row_by_name("scores_l").label
