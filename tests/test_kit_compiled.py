"""The monitor on compiled models, every way people compile them: ``torch.compile(model)`` given to the monitor or
made after attaching it, ``model.compile()`` before or after attaching, a compiled submodule, inductor's modes.
On a sampled step the forward runs eagerly (dynamo's force_eager stance, held from the step before), so the
records are the eager model's; on the other steps the compiled code runs.

The fast tests compile with a counting backend (dynamo's graphs, run as captured, each run counted): it tells
which steps ran compiled code. The slow ones compile with inductor, which drops BF16 round trips from the code it
compiles, so that statistics computed inside a compiled graph would differ from eager's."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import transformers

from lpfail.model import GPT, GPTConfig
from lpfail.monitor import Monitor, MonitorError, Thresholds, cuda_graph_modules

transformers.logging.set_verbosity_error()
QUIET = Thresholds(max_logit=None, tied_frac=None)
STATS = ("max_logit", "tied_frac", "wq", "wqk")
RUNS = [0]   # graph runs of the counting backend


def counting(gm, example_inputs):
    def run(*args):
        RUNS[0] += 1
        return gm.forward(*args)
    return run


def _reset_dynamo():
    import importlib
    importlib.import_module("torch._dynamo").reset()


def _gpt(seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():   # large query weights: BF16 ties in the logits from the first step
        for block in model.transformer.h:
            block.attn.c_attn.weight[:16] *= 12
    return model


def _hf_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                  attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():   # no position embedding: a repeated token's keys are equal, its logits tie
        model.transformer.wpe.weight.zero_()
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, :32] *= 8    # Conv1D: (in, out), the query's and key's outputs first
    return model


def _loss(model, idx):
    out = model(idx, idx) if isinstance(model, GPT) or getattr(model, "_orig_mod", None).__class__ is GPT \
        else model(idx, labels=idx)
    return out[1] if isinstance(out, tuple) else out.loss


HOW = ["torch.compile(model)", "model.compile() before attaching", "model.compile() after attaching",
       "torch.compile(model) after attaching", "a compiled submodule", "a submodule compiled after attaching"]


def _watch(make, how, steps=4, backend=counting, grad=True, **compile_kw):
    """`steps` SGD steps of a fresh model compiled `how`, watched by a Monitor (every=2): its records and,
    per step, how many compiled graphs ran."""
    model = make()
    kw = {"backend": backend, **compile_kw} if backend is not None else compile_kw
    blocks = model.transformer.h
    run, watched = model, model

    def compile_now():
        nonlocal run
        if how.startswith("model.compile()"):
            model.compile(**kw)
        elif how == "torch.compile(model) after attaching":
            run = torch.compile(model, **kw)
        else:
            blocks[1].compile(**kw)

    if how == "torch.compile(model)":
        run = watched = torch.compile(model, **kw)
    elif how in ("model.compile() before attaching", "a compiled submodule"):
        compile_now()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    ran = []
    with Monitor(watched, every=2, window=2, sample_batch=2, thresholds=QUIET) as mon:
        if how.endswith("after attaching"):
            compile_now()
        for _ in range(steps):
            idx = torch.randint(0, 32, (2, 16), generator=g)
            before = RUNS[0]
            with torch.set_grad_enabled(grad):
                loss = _loss(run, idx)
                if grad:
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            ran.append(RUNS[0] - before)
            mon.step()
    return mon.records, ran


@pytest.fixture(scope="module")
def eager_gpt():
    return _watch(_gpt, "eager", backend=None)[0]


@pytest.mark.parametrize("how", HOW)
def test_records_are_eager_and_sampled_steps_run_no_compiled_graph(how, eager_gpt):
    _reset_dynamo()
    records, ran = _watch(_gpt, how)
    assert ran[1] > 0 and ran[3] > 0, f"the compiled code did not run on unsampled steps: {ran}"
    assert ran[0] == ran[2] == 0, f"compiled graphs ran on the sampled steps 0 and 2: {ran}"
    assert np.max(eager_gpt[0]["tied_frac"]) > 0                 # ties to get right
    for r, c in zip(eager_gpt, records, strict=True):
        assert all(r[k] == c[k] for k in STATS), (r["step"], {k: (r[k], c[k]) for k in STATS if r[k] != c[k]})


@pytest.fixture(scope="module")
def eager_hf():
    return _watch(_hf_gpt2, "eager", backend=None)[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["model.compile() before attaching", "torch.compile(model) after attaching"])
def test_a_hugging_face_model_compiled(how, eager_hf):
    eager = eager_hf
    _reset_dynamo()
    records, ran = _watch(_hf_gpt2, how)
    assert ran[1] > 0 and ran[0] == ran[2] == 0, ran
    assert np.max(eager[0]["tied_frac"]) > 0
    for r, c in zip(eager, records, strict=True):
        assert all(r[k] == c[k] for k in STATS), r["step"]


def test_paused_forwards_run_compiled_on_a_sampled_step():
    _reset_dynamo()
    model = _gpt()
    model.compile(backend=counting)
    idx = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(idx)                                             # compiled once, outside the monitor
    with Monitor(model, every=2, window=2, thresholds=QUIET) as mon, torch.no_grad():
        before = RUNS[0]
        with mon.paused():
            model(idx)                                         # step 0 is sampled, but this forward is not watched
        assert RUNS[0] > before
        before = RUNS[0]
        model(idx)
        assert RUNS[0] == before
        mon.step()
    assert len(mon.records) == 1


# -- inductor (forwards only: a compiled training step changes the weights' low bits, and so every later record;
# the step between the two sampled ones runs compiled) ---------------------------------------------------------
@pytest.fixture(scope="module")
def eager_forwards():
    return _watch(_gpt, "eager", steps=3, backend=None, grad=False)[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["model.compile() before attaching", "model.compile() after attaching",
                                 "torch.compile(model) after attaching"])
def test_inductor_records_are_the_eager_ones(how, eager_forwards):
    _reset_dynamo()
    records, _ = _watch(_gpt, how, steps=3, backend="inductor", grad=False)
    assert np.max(eager_forwards[0]["tied_frac"]) > 0
    for r, c in zip(eager_forwards, records, strict=True):
        assert all(r[k] == c[k] for k in STATS), (r["step"], {k: (r[k], c[k]) for k in STATS if r[k] != c[k]})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_inductor_modes_on_a_cpu(mode, eager_forwards):
    # on a CPU inductor makes no CUDA graph: these modes are monitored like the default one
    _reset_dynamo()
    records, _ = _watch(_gpt, "model.compile() before attaching", steps=3, backend=None, grad=False, mode=mode)
    for r, c in zip(eager_forwards, records, strict=True):
        assert all(r[k] == c[k] for k in STATS), r["step"]


# -- CUDA graphs ---------------------------------------------------------------------------------------------
def test_cuda_graph_modes_are_found_however_compiled():
    def found(mode, how):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        if how == "torch.compile":
            return cuda_graph_modules(nn.ModuleList([torch.compile(model, mode=mode)]))
        if how == "module.compile":
            model.compile(mode=mode)
        else:
            model[1].compile(mode=mode)
        return cuda_graph_modules(model)
    for how in ("torch.compile", "module.compile", "submodule"):
        assert found("reduce-overhead", how) and found("max-autotune", how), how
        assert found("max-autotune-no-cudagraphs", how) == [] and found(None, how) == [], how
    model = nn.Linear(4, 4)
    model.compile(options={"triton.cudagraphs": True})
    assert cuda_graph_modules(model) == [""]


@pytest.mark.gpu
def test_cuda_graphs_on_a_gpu_are_refused():
    model = _gpt().cuda()
    model.compile(mode="reduce-overhead")
    with pytest.raises(MonitorError, match="max-autotune-no-cudagraphs"):
        Monitor(model).attach()
    model = _gpt().cuda()
    with Monitor(model, every=1, thresholds=QUIET):
        model.compile(mode="max-autotune")
        with pytest.raises(MonitorError, match="CUDA graphs"):
            model(torch.zeros(1, 16, dtype=torch.long, device="cuda"))
