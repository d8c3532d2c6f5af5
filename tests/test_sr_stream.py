"""The counter-based random bits of stochastic rounding (`lpfail.sr_stream`): the hash, the keys, their use by
`round_stochastic` and the attention, and the stream the model owns and the training step advances."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lpfail.attention import attention, flash_forward
from lpfail.bf16 import round_mantissa, round_stochastic
from lpfail.model import GPT, AttentionSpec, GPTConfig
from lpfail.precision import PAPER_BF16
from lpfail.sr_stream import M32, RoundingKey, SRStream, fold, mix32

SR = PAPER_BF16.replace(rounding="sr")


def mix32_numpy(x: np.ndarray) -> np.ndarray:
    """An independent mix32: numpy's uint32 arithmetic wraps modulo 2^32 by itself."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x21F0AAAD)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x735A2D97)
        x ^= x >> np.uint32(15)
    return x


# ---------------------------------------------------------------------------------------------------
# the hash
# ---------------------------------------------------------------------------------------------------
def test_mix32_is_the_wrapping_uint32_hash_on_ints_and_tensors():
    g = np.random.default_rng(0)
    x = np.concatenate([g.integers(0, 1 << 32, 100_000, dtype=np.int64), [0, 1, M32, 1 << 31, (1 << 31) - 1]])
    want = mix32_numpy(x).astype(np.int64)
    got = mix32(torch.from_numpy(x)).numpy()
    assert np.array_equal(got, want) and got.min() >= 0 and got.max() <= M32
    assert [mix32(int(v)) for v in x[:200]] == want[:200].tolist()


def test_mix32_is_a_bijection_on_a_block():
    x = torch.arange(1 << 20, dtype=torch.int64) * 4099 + 17
    assert torch.unique(mix32(x)).numel() == x.numel()


def test_fold_checks_its_words():
    assert fold((1, 2)) != fold((2, 1)) and fold((0,)) != fold((0, 0))
    with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
        fold((-1,))


# ---------------------------------------------------------------------------------------------------
# keys and bits
# ---------------------------------------------------------------------------------------------------
def test_bits_are_a_pure_function_of_the_key():
    k = RoundingKey(7, 3, (1, 2))
    a = k.bits((4, 1000), 16)
    assert a.shape == (4, 1000) and a.dtype == torch.int64 and a.min() >= 0 and a.max() < 1 << 16
    assert torch.equal(a, RoundingKey(7, 3, (1, 2)).bits((4, 1000), 16))
    assert torch.equal(a, RoundingKey(7, torch.tensor(3), (1, 2)).bits((4, 1000), 16))  # a tensor step
    others = [RoundingKey(8, 3, (1, 2)), RoundingKey(7, 4, (1, 2)), RoundingKey(7, 3, (1, 3)), RoundingKey(7, 3, (1,)),
              RoundingKey(7, 3, (1, 2, 0)), RoundingKey(7, 3 + (1 << 32), (1, 2))]
    for o in others:
        b = o.bits((4, 1000), 16)
        assert (a == b).double().mean() < 0.01, o               # different keys: unrelated bits
    assert (a != k.bits((4, 1000), 16, draw=1)).any() and (a != k.bits((4, 1000), 16, part=1)).any()
    wide = k.bits((1000,), 62)
    assert wide.min() >= 0 and wide.max() < 1 << 62 and wide.max() > 1 << 61


def test_bits_read_the_step_tensor_when_drawn():
    step = torch.zeros((), dtype=torch.int64)
    k = RoundingKey(1, step, (5,))
    a = k.bits((500,), 20)
    step.add_(1)                                                  # in place, as the training step advances it
    b = k.bits((500,), 20)
    assert not torch.equal(a, b) and torch.equal(b, RoundingKey(1, 1, (5,)).bits((500,), 20))


def test_bits_are_uniform():
    """2^20 draws of 16 bits: each of the top 256 values and the lowest bit as often as a uniform draw makes them
    (chi-square within its 1e-6 tail, mean within 5 standard errors); over several keys."""
    for key in (RoundingKey(0), RoundingKey(123, 456, (7, 8, 9))):
        b = key.bits((1 << 20,), 16).double()
        n = b.numel()
        assert abs(b.mean().item() - (2 ** 16 - 1) / 2) < 5 * (2 ** 16 / math.sqrt(12 * n))
        counts = torch.bincount((b // 256).long(), minlength=256).double()
        chi2 = (((counts - n / 256) ** 2) / (n / 256)).sum().item()
        assert chi2 < 255 + 6 * math.sqrt(2 * 255), chi2
        assert abs((b % 2).mean().item() - 0.5) < 5 * 0.5 / math.sqrt(n)


def test_keys_validate():
    with pytest.raises(ValueError, match="seed"):
        RoundingKey(-1)
    with pytest.raises(ValueError, match="step"):
        RoundingKey(0, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="nbits"):
        RoundingKey(0).bits((3,), 63)
    assert RoundingKey(0, 0, (1,)).at(2, 3).site == (1, 2, 3)


# ---------------------------------------------------------------------------------------------------
# stochastic rounding with a key
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [7, 5, 3, 1])
def test_keyed_stochastic_rounding_is_unbiased(k):
    """Many copies of each value, each element its own bits: the mean equals the value within 4 standard
    errors of the exact Bernoulli spread, at bf16 and at fewer fraction bits, from fp32 and from fp64."""
    n = 200_000
    for dtype in (torch.float32, torch.float64):
        for i, v in enumerate([1.0 + 0.3 * 2.0 ** -k, -(3.0 + 0.7 * 2.0 ** (1 - k)), 2.0 ** -130 * 1.37, 0.1]):
            x = torch.full((n,), v, dtype=dtype)
            r = round_stochastic(x, mantissa=k, key=RoundingKey(i, 0, (k,))).double()
            lo = round_mantissa(x[:1], k, "rtz").double().item()
            vals = set(r.unique().tolist())
            assert len(vals) == 2 and lo in vals, (v, vals)
            hi = (vals - {lo}).pop()
            p = (x[0].double().item() - lo) / (hi - lo)
            sigma = abs(hi - lo) * math.sqrt(p * (1 - p) / n)
            assert abs(r.mean().item() - x[0].double().item()) < 4 * sigma, (k, dtype, v)


def test_keyed_stochastic_rounding_is_reproducible_and_leaves_torch_s_generator_alone():
    x = torch.randn(10_000, dtype=torch.float64)
    state = torch.get_rng_state()
    a = round_stochastic(x, key=RoundingKey(3, 1))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.view(torch.int16), round_stochastic(x, key=RoundingKey(3, 1)).view(torch.int16))
    assert not torch.equal(a, round_stochastic(x, key=RoundingKey(3, 2)))
    with pytest.raises(ValueError, match="either a generator or a key"):
        round_stochastic(x, generator=torch.Generator(), key=RoundingKey(0))


def test_the_same_bits_eager_and_compiled():
    """torch.compile traces the rounding with the step as a graph input: the compiled function gives the eager
    bits, also after the step was advanced in place (what a replayed CUDA graph sees)."""
    step = torch.zeros((), dtype=torch.int64)

    def f(x, step):
        return round_stochastic(x, torch.bfloat16, mantissa=5, key=RoundingKey(3, step, (1, 2)))

    g = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(2000)
    for _ in range(2):
        assert torch.equal(g(x, step).view(torch.int16), f(x, step).view(torch.int16))
        step.add_(1)


# ---------------------------------------------------------------------------------------------------
# the attention and the model
# ---------------------------------------------------------------------------------------------------
def qkv(t=96, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, t, d, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_attention_sr_follows_its_key():
    q, k, v = qkv()
    pol = SR.replace(block_q=32, block_k=32)
    a = flash_forward(q, k, v, pol, sr_key=RoundingKey(1, 5, (0,)))
    assert torch.equal(a.o.view(torch.int16), flash_forward(q, k, v, pol, sr_key=RoundingKey(1, 5, (0,))).o.view(torch.int16))
    for other in (RoundingKey(2, 5, (0,)), RoundingKey(1, 6, (0,)), RoundingKey(1, 5, (1,))):
        assert not torch.equal(a.o, flash_forward(q, k, v, pol, sr_key=other).o)
    state = torch.get_rng_state()
    attention(q, k, v, pol, sr_key=RoundingKey(1, 5, (0,)))        # a key: torch's generator is not touched
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(TypeError, match="RoundingKey"):
        attention(q, k, v, pol, sr_key=123)


def tiny_gpt(seed=0, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32, sr_seed=seed, **kw))


def test_the_model_owns_its_stream():
    m = tiny_gpt().set_attention(AttentionSpec("reference", SR))
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = m(x)[0]
        torch.manual_seed(123)                                     # torch's generator plays no part
        assert torch.equal(a, m(x)[0])
        m.sr_stream.advance()
        b = m(x)[0]
        m.sr_stream.micro = 1
        c = m(x)[0]
        d = tiny_gpt(seed=1).set_attention(AttentionSpec("reference", SR))(x)[0]
    assert not torch.equal(a, b) and not torch.equal(b, c) and not torch.equal(a, d)
    assert int(m.sr_stream.step) == 1 and m.transformer.h[1].attn.sr_stream is m.sr_stream
    assert "sr_stream.step" in m.state_dict()
    assert [n for n, _ in m.named_modules()].count("sr_stream") == 1


def test_a_state_dict_without_the_stream_still_loads():
    m = tiny_gpt()
    sd = {k: v for k, v in m.state_dict().items() if k != "sr_stream.step"}
    m.sr_stream.step.fill_(4)
    m.load_state_dict(sd)                                          # a checkpoint from before the stream
    assert int(m.sr_stream.step) == 4
    full = tiny_gpt().state_dict()
    full["sr_stream.step"] = torch.tensor(9)
    m.load_state_dict(full)
    assert int(m.sr_stream.step) == 9


def test_sr_stream_validates_its_seed():
    with pytest.raises(ValueError, match="seed"):
        SRStream(-3)
    with pytest.raises(ValueError, match="sr_seed"):
        GPTConfig(sr_seed=-1)


# ---------------------------------------------------------------------------------------------------
# training runs
# ---------------------------------------------------------------------------------------------------
SR_SPEC = "reference(PAPER_BF16,rounding=sr,sr_stream=1)"


def _train(**kw):
    from lpfail.train import TrainConfig, train

    cfg = TrainConfig.preset("tiny", **{"max_steps": 6, "diag_every": 0, "attention": SR_SPEC, **kw})
    return train(cfg, progress=False)


def test_an_sr_run_repeats_and_ignores_torch_s_generator():
    """The stream is the run's: the same config gives the same losses, and draws from torch's global
    generator in between the steps (what a captured step's generator offsets or any other code may do) change
    nothing; another init_seed gives other bits (and other weights)."""
    from lpfail.train import TrainConfig, train

    a = _train()
    cfg = TrainConfig.preset("tiny", max_steps=6, diag_every=0, attention=SR_SPEC)
    b = train(cfg, progress=False, hook=lambda step, model: torch.rand(1000))
    assert np.array_equal(a.losses, b.losses) and np.array_equal(a.grad_norms, b.grad_norms)
    rne = _train(attention="reference(PAPER_BF16)")
    assert not np.array_equal(a.losses, rne.losses)


def test_an_sr_run_resumes_bit_exactly(tmp_path):
    """The checkpoint holds the stream's step (a buffer of the model): a run continued from step 3 gives the
    uninterrupted run's losses."""
    from lpfail.train import TrainConfig, load_checkpoint, train

    cfg = TrainConfig.preset("tiny", max_steps=6, diag_every=0, attention=SR_SPEC, checkpoint_every=3,
                             out_dir=str(tmp_path / "a"))
    whole = train(cfg, progress=False)
    ck = load_checkpoint(tmp_path / "a" / "ckpt_0000003.pt")
    assert int(ck["model"]["sr_stream.step"]) == 3
    cont = train(TrainConfig.from_dict({**cfg.to_dict(), "out_dir": str(tmp_path / "b")}), progress=False,
                 resume_from=tmp_path / "a" / "ckpt_0000003.pt")
    assert np.array_equal(whole.losses, cont.losses)


# ---------------------------------------------------------------------------------------------------
# the fused kernel (`RoundingKey.round_fp32`): the PyTorch path's bits in one pass
# ---------------------------------------------------------------------------------------------------
FUSED_KEYS = [RoundingKey(0), RoundingKey(7, torch.tensor(123456789012), (1, 2, 3)), RoundingKey((1 << 64) - 1, 5, (9,)),
              RoundingKey(3, (1 << 40) + 17, (0, 11, 2, 5, 1))]


def _torch_rne(x, shift, monkeypatch):
    monkeypatch.setenv("LPFAIL_FUSED_ROUNDING", "0")
    out = round_mantissa(x, 23 - shift)
    monkeypatch.delenv("LPFAIL_FUSED_ROUNDING")
    return out.view(torch.int16)


def _torch_path(x, shift, key, monkeypatch):
    monkeypatch.setenv("LPFAIL_FUSED_ROUNDING", "0")
    out = round_stochastic(x, torch.bfloat16, mantissa=23 - shift, key=key)
    monkeypatch.delenv("LPFAIL_FUSED_ROUNDING")
    return out.view(torch.int16)


@pytest.mark.parametrize("shift", range(16, 23))
def test_the_fused_kernel_gives_the_pytorch_path_s_bits_in_the_interpreter(shift, monkeypatch):
    """Every K = 7 … 1 (shift 16 … 22), four keys (a step tensor, a seed of 2^64 − 1, a step above 2^32, sites of
    0 … 5 words), over zeros, ±inf, NaN, the largest values, subnormals and normals of every exponent, and a
    strided input: the kernel run by Triton's interpreter returns round_stochastic's bits."""
    from lpfail.fused import check_tensor

    x = check_tensor("cpu").reshape(64, 128)
    for key in FUSED_KEYS:
        for inp in (x, x.t()):  # the kernel reads the contiguous copy, as the PyTorch path does
            got = key.round_fp32(inp, shift, interpret=True)
            assert got.dtype == torch.bfloat16 and got.shape == inp.shape
            assert torch.equal(got.view(torch.int16), _torch_path(inp, shift, key, monkeypatch))


def test_the_fused_kernel_is_used_only_where_it_applies(monkeypatch):
    """None (the PyTorch path) on the CPU, for FP64 input, outside shift 16 … 22, under LPFAIL_FUSED_ROUNDING=0 and
    inside torch.compile."""
    k = FUSED_KEYS[1]
    x = torch.randn(100)
    assert k.round_fp32(x, 16) is None                       # not CUDA
    assert k.round_fp32(x.double(), 16, interpret=True) is None
    assert k.round_fp32(x, 15, interpret=True) is None and k.round_fp32(x, 23, interpret=True) is None
    assert k.round_fp32(x[:0], 16, interpret=True).numel() == 0
    monkeypatch.setenv("LPFAIL_FUSED_ROUNDING", "0")
    assert k.round_fp32(x, 16, interpret=True) is None
    monkeypatch.delenv("LPFAIL_FUSED_ROUNDING")
    seen = []

    def f(x):
        seen.append(k.round_fp32(x, 16, interpret=True))  # traced by torch.compile: the PyTorch path
        return x + 1

    torch.compile(f, backend="eager")(x)
    assert seen == [None]


def test_a_fused_kernel_that_differs_is_turned_off_with_a_warning(monkeypatch):
    """The once-per-process check (`lpfail.fused.checked`): both real kernels pass it in the interpreter; a kernel
    that returns other bits fails it, with a RuntimeWarning, and the answer is kept per kernel, device and shift."""
    from lpfail import bf16, fused, sr_stream

    monkeypatch.setattr(fused, "_CHECKED", {})
    sr, rne = fused.kernel("sr_fp32_to_bf16"), fused.kernel("rne_fp32_to_bf16")
    cpu = torch.device("cpu")
    assert fused.checked("sr_fp32_to_bf16", cpu, 18, lambda: sr_stream._compare(sr, cpu, 18))
    assert fused.checked("rne_fp32_to_bf16", cpu, 18, lambda: bf16._compare_rne(rne, cpu, 18))

    class Zeros:
        def __getitem__(self, grid):
            return lambda x, out, *args, **kw: out.zero_()

    with pytest.warns(RuntimeWarning, match="differs from the PyTorch path"):
        assert not fused.checked("rne_fp32_to_bf16", cpu, 19, lambda: bf16._compare_rne(Zeros(), cpu, 19))
    assert not sr_stream._compare(Zeros(), cpu, 19)
    assert fused._CHECKED == {("sr_fp32_to_bf16", "cpu", 18): True, ("rne_fp32_to_bf16", "cpu", 18): True,
                              ("rne_fp32_to_bf16", "cpu", 19): False}
    assert fused.checked("rne_fp32_to_bf16", cpu, 19, lambda: 1 / 0) is False  # kept: not checked again


@pytest.mark.parametrize("shift", range(16, 23))
def test_the_fused_round_to_nearest_gives_the_pytorch_path_s_bits_in_the_interpreter(shift, monkeypatch):
    """`round_mantissa`'s round to nearest even (K = 7 … 1) as the fused kernel, in Triton's interpreter: the
    PyTorch path's bits over `check_tensor`, contiguous and strided; at K = 7 also ``.to(torch.bfloat16)``'s."""
    from lpfail.bf16 import _fused_rne
    from lpfail.fused import check_tensor

    x = check_tensor("cpu").reshape(64, 128)
    for inp in (x, x.t()):
        got = _fused_rne(inp, shift, interpret=True)
        want = round_mantissa(inp, 23 - shift)  # on the CPU: the PyTorch path
        assert got.shape == inp.shape and torch.equal(got.view(torch.int16), want.view(torch.int16))
        if shift == 16:
            ref = inp.to(torch.bfloat16).view(torch.int16)
            nan = torch.isnan(inp)
            assert torch.equal(got.view(torch.int16)[~nan], ref[~nan])


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [16, 18, 20])
def test_the_fused_kernel_gives_the_same_bits_on_the_card_eager_and_captured(shift, monkeypatch):
    """On CUDA: round_stochastic with a key and round_mantissa to nearest take the fused kernels (after their
    checks) and return the PyTorch path's bits, eagerly and (stochastic) replayed from a CUDA graph whose step
    buffer advances between replays."""
    from lpfail import fused

    monkeypatch.setattr(fused, "_CHECKED", {})
    x = fused.check_tensor("cuda").reshape(64, 128)
    step = torch.zeros((), dtype=torch.int64, device="cuda")
    key = RoundingKey(11, step, (4, 2))
    assert key.round_fp32(x, shift) is not None and fused._CHECKED == {("sr_fp32_to_bf16", "cuda:0", shift): True}
    assert torch.equal(round_mantissa(x, 23 - shift).view(torch.int16), _torch_rne(x, shift, monkeypatch))
    assert fused._CHECKED[("rne_fp32_to_bf16", "cuda:0", shift)]
    for k in FUSED_KEYS[:3]:
        k = RoundingKey(k.seed, k.step.cuda() if isinstance(k.step, torch.Tensor) else k.step, k.site)
        assert torch.equal(round_stochastic(x, mantissa=23 - shift, key=k).view(torch.int16),
                           _torch_path(x, shift, k, monkeypatch))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        round_stochastic(x, mantissa=23 - shift, key=key)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = round_stochastic(x, mantissa=23 - shift, key=key)
    for n in range(3):
        step.fill_(n * 1000 + 1)
        g.replay()
        assert torch.equal(out.view(torch.int16), _torch_path(x, shift, key, monkeypatch))


@pytest.mark.gpu
def test_an_sr_run_is_the_same_with_and_without_the_fused_kernel(monkeypatch):
    """A captured stochastic-rounding training run on the card gives the same losses with the fused kernels and
    with the PyTorch path (LPFAIL_FUSED_ROUNDING=0), and the first does launch them (in its eager warm-up steps and
    while its step is captured: replays launch them without Python), the second never."""
    from lpfail import fused

    calls = []
    real = fused.launch
    # the training tensors, not the check's (check_tensor: one dimension)
    monkeypatch.setattr(fused, "launch", lambda *a, **k: calls.append(a[1].dim() > 1) or real(*a, **k))
    # on the card: the tiny preset trains on the CPU (where cuda_graph does nothing and no kernel can be taken: the
    # first version of this test counted 0 launches there, on an H100 on 2026-12-07)
    a = _train(max_steps=8, cuda_graph=True, device="cuda")
    n_fused = sum(calls)
    monkeypatch.setenv("LPFAIL_FUSED_ROUNDING", "0")
    b = _train(max_steps=8, cuda_graph=True, device="cuda")
    assert np.array_equal(a.losses, b.losses) and np.array_equal(a.grad_norms, b.grad_norms)
    assert n_fused > 0 and sum(calls) == n_fused  # the fused run took the kernels; the other did not
