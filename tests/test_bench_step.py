"""The training-step benchmark (`lpfail.kernels.bench_step`) on a CPU with stand-ins for the drop-in: the swap of
SDPA per model and its restoration, the interleaved rounds, the step-0 check, the ratios, the targets and the table.
The drop-in itself runs only on a GPU (`python -m lpfail bench step`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lpfail.kernels import bench_step as BS

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, batch=2, rounds=3, steps_per_round=1,
            warmup=1, device="cpu", methods=("sdpa", "dropin", "dropin_robust"))
SDPA = F.scaled_dot_product_attention


def test_each_model_runs_its_own_attention_and_sdpa_is_restored():
    calls = []

    def stand_in(name, scale=1.0):
        def fn(q, k, v, **kw):
            calls.append(name)
            return SDPA(q, k, v, **kw) * scale
        return fn

    cfg = BS.BenchStepConfig(**TINY, modes=("eager",))
    res = BS.bench_step(cfg, {"sdpa": None, "dropin": stand_in("a"), "dropin_robust": stand_in("b", 1.5)})
    assert F.scaled_dot_product_attention is SDPA
    assert res["tokens_per_s"].shape == (1, 3, 3) and np.isfinite(res["tokens_per_s"]).all()
    # the same model and batch: the stand-in that is SDPA gives SDPA's loss bit for bit, the scaled one does not
    loss = res["loss_step0"]
    assert loss[0] == loss[1] and loss[0] != loss[2]
    # one attention call per layer per forward: 1 (check) + warm-up + rounds × steps per method
    assert calls.count("a") == calls.count("b") == 1 + 1 + 3
    rs = BS.ratios(res)
    assert rs[("sdpa", "eager")]["ratio"] == 1.0 and rs[("dropin", "eager")]["rounds"] == 3
    assert res["errors"] == ""


def test_a_failing_method_is_said_and_the_others_are_timed():
    def broken(q, k, v, **kw):
        if torch.is_grad_enabled():
            raise RuntimeError("no GPU here")
        return SDPA(q, k, v, **kw)

    cfg = BS.BenchStepConfig(**TINY, modes=("eager",))
    res = BS.bench_step(cfg, {"sdpa": None, "dropin": broken, "dropin_robust": None})
    assert "dropin eager warm-up: RuntimeError: no GPU here" in res["errors"]
    assert np.isnan(res["tokens_per_s"][0, 1]).all() and np.isfinite(res["tokens_per_s"][0, 2]).all()
    assert "not measured" in BS.step_markdown(res)


def test_compiled_mode_recompiles_per_method_and_restores_the_limits():
    import torch._dynamo as dynamo

    before = {nm: getattr(dynamo.config, nm) for nm in ("recompile_limit", "cache_size_limit")
              if hasattr(dynamo.config, nm)}
    seen = []

    def stand_in(q, k, v, **kw):
        seen.append(1)
        return SDPA(q, k, v, **kw)

    cfg = BS.BenchStepConfig(**{**TINY, "methods": ("sdpa", "dropin")}, modes=("compiled",), compile_backend="eager")
    res = BS.bench_step(cfg, {"sdpa": None, "dropin": stand_in})
    assert F.scaled_dot_product_attention is SDPA and np.isfinite(res["tokens_per_s"]).all(), res["errors"]
    assert seen   # the compiled model of "dropin" traced its own attention, not SDPA
    assert {nm: getattr(dynamo.config, nm) for nm in before} == before


def test_targets_and_table_from_a_stored_result():
    tps = np.array([[[100.0, 100, 100], [99.0, 97, 98], [95.0, 96, 97]],
                    [[120.0, 120, 120], [119.0, 119, 118], [float("nan")] * 3]])
    res = {"tokens_per_s": tps, "methods": np.array(["sdpa", "dropin", "dropin_robust"]),
           "modes": np.array(["eager", "compiled"])}
    t = {(x["method"], x["mode"]): x for x in BS.step_targets(res)}
    assert t[("dropin_robust", "eager")]["met"] is False and t[("dropin_robust", "eager")]["ratio"] == 0.96
    assert t[("dropin_robust", "compiled")]["met"] is None   # not measured
    md = BS.step_markdown(res).splitlines()
    assert md[0] == "| method | eager: tokens/s | eager: ÷ SDPA | compiled: tokens/s | compiled: ÷ SDPA |"
    assert md[3] == "| `dropin` | 98 | 0.980× [0.970, 0.990] | 119 | 0.992× [0.983, 0.992] |"
    assert md[4].endswith("| not measured |  |")


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="must include 'sdpa'"):
        BS.BenchStepConfig(methods=("dropin",))
    with pytest.raises(ValueError, match="modes"):
        BS.BenchStepConfig(modes=("jit",))
    assert BS.BenchStepConfig().batch * BS.BenchStepConfig().block_size == 16 * 1024   # the step


def test_step_facts_say_the_target_the_range_and_the_card():
    from lpfail.book import fix_report as FR

    class Stored(dict):
        meta = {"device": "NVIDIA H200", "created": "2026-12-07T01:32:37+00:00"}

    tps = np.full((2, 5, 4), 300e3)
    tps[:, 1:] = [[[291e3] * 4, [297e3] * 4, [288e3] * 4, [295.5e3] * 4]]
    tps[1, 2] = 291e3                                          # the robust fix misses compiled only
    res = Stored(tokens_per_s=tps, methods=np.array(list(BS.METHODS)), modes=np.array(["eager", "compiled"]))
    f = FR.step_facts(res)
    assert f["step_robust_eager"] == "0.99×" and f["step_robust_compiled"] == "0.97×"
    assert f["step_met"] == "met in one mode only" and f["step_all_range"] == "0.960×–0.990×"
    assert f["step_card"] == "NVIDIA H200" and f["step_when"] == "2026-12-07"
    assert f["step_sdpa"] == "300 k tokens/s eager and 300 k tokens/s compiled"
