"""The drop-in kernel: ``lpfail.flash_attention(q, k, v, is_causal=False, scale=None, enable_gqa=False, fix=...)``
against PyTorch's scaled_dot_product_attention (CPU: Triton's interpreter, FP32; GPU-marked: BF16): SDPA's defaults
and keywords, and clear refusals of what the kernels do not support."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lpfail.precision import FA2_BF16, BoundedMax, DynamicMax
from tests.kernel_env import DEVICE, load_kernels

kernels = load_kernels()


def qkv(n=96, d=64, dtype=torch.float32, seed=0, heads=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, n, d, generator=g).to(device=DEVICE, dtype=dtype) for _ in range(4)]


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("fix", [None, "robust", "alg3"])
def test_matches_sdpa_in_fp32(is_causal, fix):
    q, k, v, do = qkv()
    got = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=is_causal, fix=fix), q, k, v, do)
    ref = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=is_causal), q, k, v, do)
    for name, x, y in zip(("O", "dQ", "dK", "dV"), got, ref):
        assert x.dtype == torch.float32
        assert ((x - y).norm() / y.norm()).item() < 1e-5, name


def test_scale_and_default_causal():
    """SDPA's defaults: full attention unless is_causal=True (until issue 25 the drop-in defaulted to causal), and
    any scale; the policy style stays causal by default, as lpfail.attention.attention."""
    q, k, v, _ = qkv(n=70, d=32)
    o = kernels.flash_attention(q, k, v, scale=0.3)
    r = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert ((o - r).norm() / r.norm()).item() < 1e-5
    assert ((o - causal).norm() / causal.norm()).item() > 1e-2        # the default is not the causal result
    o_c = kernels.flash_attention(q, k, v, is_causal=True, scale=0.3)
    assert ((o_c - causal).norm() / causal.norm()).item() < 1e-5
    o_p = kernels.flash_attention(q, k, v, kernels.policy_for(torch.float32), scale=0.3)
    assert torch.equal(o_p, o_c)


@pytest.mark.parametrize("is_causal", [True, False])
def test_enable_gqa_matches_sdpa(is_causal):
    """Grouped-query attention as SDPA computes it (query head h reads key/value head h // 3 here), O and the
    gradients of q, k, v (k's and v's summed over their query heads)."""
    g = torch.Generator().manual_seed(4)
    q, do = (torch.randn(1, 6, 80, 32, generator=g).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 80, 32, generator=g).to(DEVICE) for _ in range(2))
    got = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=is_causal, enable_gqa=True), q, k, v, do)
    ref = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=is_causal, enable_gqa=True),
                q, k, v, do)
    for name, x, y in zip(("O", "dQ", "dK", "dV"), got, ref):
        assert x.shape == y.shape and ((x - y).norm() / y.norm()).item() < 1e-5, name
    with pytest.raises(ValueError, match="one head count that divides q's"):
        kernels.flash_attention(q, k[:, :1], v, enable_gqa=True)
    with pytest.raises(ValueError, match="one shape"):                      # without enable_gqa, as SDPA
        kernels.flash_attention(q, k, v)


@pytest.mark.parametrize("mask", [torch.ones(96, 96, dtype=torch.bool).tril(), torch.zeros(96, 96)],
                         ids=["bool", "float"])
def test_masks_are_refused_naming_what_is_supported(mask):
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match=r"takes no attn_mask \(got a Tensor of torch\.(bool|float32)\).*is_causal="
                                         r"True.*enable_gqa=True"):
        kernels.flash_attention(q, k, v, attn_mask=mask)
    with pytest.raises(TypeError, match="4th positional argument.*Precision policy, not SDPA's attn_mask"):
        kernels.flash_attention(q, k, v, mask)


def test_robust_fix_stays_finite_where_algorithm_3_does_not():
    q = torch.zeros(1, 1, 64, 64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 64, 64)
    k[..., 0] = -1000.0 * 8                                          # every score −1000: rows of ties
    v = torch.randn(1, 1, 64, 64)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    assert torch.isfinite(kernels.flash_attention(q, k, v, is_causal=True, fix="robust")).all()
    assert not torch.isfinite(kernels.flash_attention(q, k, v, is_causal=True, fix="alg3")).all()


def test_policy_for():
    assert kernels.policy_for(torch.bfloat16) == FA2_BF16
    assert kernels.policy_for(torch.bfloat16, "robust").fix == BoundedMax()
    assert kernels.policy_for(torch.float16, "alg3").fix == DynamicMax() and kernels.policy_for(torch.float16).out == "fp16"
    assert kernels.policy_for(torch.float32).matmul == "fp32"


@pytest.mark.parametrize("kwargs, match", [
    (dict(attn_mask=torch.ones(96, 96, dtype=torch.bool)), "attn_mask"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(fix="beta2"), "fix must be"),
    (dict(causal=True, is_causal=False), "disagree"),
])
def test_clear_errors(kwargs, match):
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match=match):
        kernels.flash_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("args", [(None, 0.0, True), (None, 0.1), (None, 0.0, False, 0.5)])
def test_positional_arguments_in_sdpa_order_are_a_type_error(args):
    """SDPA's positional order (attn_mask, dropout_p, is_causal, scale) is refused, not read as causal= / scale=:
    only the policy may follow q, k, v positionally (once, (q, k, v, None, 0.0, True) ran full attention with
    scale 1.0, and (q, k, v, None, 0.1) causal attention)."""
    q, k, v, _ = qkv(n=16, d=16)
    with pytest.raises(TypeError, match="positional argument"):
        kernels.flash_attention(q, k, v, *args)


@pytest.mark.parametrize("scale", ["a", 0, -0.5, float("nan"), float("inf"), [1.0]])
def test_a_scale_that_is_not_a_positive_number_is_named(scale):
    q, k, v, _ = qkv(n=16, d=16)
    with pytest.raises(ValueError, match=r"scale must be a positive number, got "):
        kernels.flash_attention(q, k, v, scale=scale)
    with pytest.raises(ValueError, match=r"scale must be a positive number, got "):
        kernels.flash_attention(q, k, v, FA2_BF16, scale=scale)


def test_clear_errors_for_dtype_head_dim_and_policy_mix():
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        kernels.flash_attention(q.double(), k.double(), v.double())
    q2, k2, v2, _ = qkv(d=40)   # not a multiple of 16 (48 is a head dim the kernels take)
    with pytest.raises(ValueError, match="head_dim"):
        kernels.flash_attention(q2, k2, v2)
    with pytest.raises(ValueError, match="not both"):
        kernels.flash_attention(q, k, v, FA2_BF16, fix="robust")


@pytest.mark.parametrize("style", ["sdpa", "policy"])
def test_error_without_gpu_names_the_reference_call_that_computes_the_same(monkeypatch, style):
    """With no GPU and no interpreter the error offers the pure-PyTorch reference: the function
    lpfail.attention.attention with its own keywords (causal=, not SDPA's is_causal=) and this call's policy, causal
    and scale. Run as written, that call gives what the kernels give (FP32: to rounding)."""
    import re

    import lpfail
    import lpfail.attention  # noqa: F401  (the call names it as lpfail.attention.attention)

    q, k, v, _ = qkv(n=40)
    policy = kernels.policy_for(torch.float32, "robust")
    args, kwargs = ((), dict(is_causal=False, fix="robust", scale=0.3)) if style == "sdpa" else \
        ((policy,), dict(causal=False, scale=0.3))
    expected = kernels.flash_attention(q, k, v, *args, **kwargs).cpu()
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    monkeypatch.setattr(kernels.runtime, "interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU") as err:
        kernels.flash_attention(q, k, v, *args, **kwargs)
    call = re.search(r"computes the same: (lpfail\.attention\.attention\(.*\))\. ", str(err.value)).group(1)
    assert "is_causal" not in call and "causal=False" in call and "scale=0.3" in call
    got = eval(call, {"lpfail": lpfail, "q": q, "k": k, "v": v, "policy": policy})
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"repeat_interleave"):   # grouped heads: k and v repeated first
        kernels.flash_attention(q, k[:, :1], v[:, :1], is_causal=True, enable_gqa=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fix", [None, "robust"])
def test_bf16_close_to_sdpa_on_the_gpu(fix):
    q, k, v, do = qkv(n=1024, d=128, dtype=torch.bfloat16)
    got = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix=fix), q, k, v, do)
    ref = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v, do)
    for name, x, y in zip(("O", "dQ", "dK", "dV"), got, ref):
        assert x.dtype == torch.bfloat16
        assert ((x.float() - y.float()).norm() / y.float().norm()).item() < 2e-2, name


def test_sdpa_style_runs_as_a_custom_op_with_the_same_numbers():
    q, k, v, do = qkv(n=80, d=32)
    policy = kernels.policy_for(torch.float32, "robust")
    via_op = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust"), q, k, v, do)
    via_fn = grads(lambda a, b, c: kernels.flash_attention(a, b, c, policy, causal=True), q, k, v, do)
    for x, y in zip(via_op, via_fn):
        assert torch.equal(x, y)
    torch.library.opcheck(torch.ops.lpfail.flash_attention_fwd, (q[:1, :1, :32], k[:1, :1, :32], v[:1, :1, :32],
                                                                str(policy), True, 0.25))


def test_torch_compile_traces_through_without_a_graph_break():
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward without generating code
    (the CPU machine has the interpreter, not a GPU compiler). On the GPU the same holds for inductor."""
    q, k, v, do = qkv(n=64, d=32)

    def block(a, b, c):
        return kernels.flash_attention(a * 1.0, b, c, is_causal=True, fix="robust").sum(-1)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    got = grads(compiled, q, k, v, do[..., 0])
    ref = grads(block, q, k, v, do[..., 0])
    for x, y in zip(got, ref):
        assert torch.allclose(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_inductor_keeps_the_kernel_in_one_graph_on_the_gpu():
    q, k, v, do = qkv(n=512, d=64, dtype=torch.bfloat16)

    def block(a, b, c):
        return kernels.flash_attention(a * 1.0, b, c, is_causal=True, fix="robust")

    compiled = torch.compile(block, fullgraph=True)
    got = grads(compiled, q, k, v, do)
    ref = grads(block, q, k, v, do)
    for x, y in zip(got, ref):
        assert torch.equal(x, y) or ((x.float() - y.float()).norm() / y.float().norm()).item() < 1e-2


def test_eager_call_equals_the_custom_op_bit_for_bit():
    """Called eagerly on plain tensors, the drop-in runs the custom op's implementation without its dispatch
    (host time, issue 13); O and the gradients must be the op's, bit for bit, with and without autograd; inside
    a dispatch mode (as under tracing) the call still goes through the op."""
    import math

    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v, do = qkv(n=70, d=32)
    for fix in (None, "robust"):
        text = kernels.SDPA_POLICIES[(torch.float32, fix)][1]
        eager = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix=fix), q, k, v, do)
        op = grads(lambda a, b, c: torch.ops.lpfail.flash_attention_fwd(a, b, c, text, True, 1 / math.sqrt(32))[0],
                   q, k, v, do)
        assert all(torch.equal(x, y) for x, y in zip(eager, op))
        with torch.no_grad():
            assert torch.equal(kernels.flash_attention(q, k, v, is_causal=True, fix=fix), op[0])

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as seen:
        traced = kernels.flash_attention(q, k, v, is_causal=True, fix="robust")   # the loop's last fix
    assert any("lpfail.flash_attention_fwd" in name for name in seen.ops)
    assert torch.equal(traced, op[0])


def test_tuning_travels_through_the_custom_op():
    """A Tuning reaches the kernels through the custom op (as its string) and through torch.compile: the same bits
    as the eager call with it, forward and gradients."""
    import math

    q, k, v, do = qkv(n=70, d=32)
    t = kernels.Tuning(order="lpt", tie="count")   # deterministic levers (the atomic dQ is not, on a GPU)
    text = kernels.SDPA_POLICIES[(torch.float32, "robust")][1]
    eager = grads(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust", tuning=t), q, k, v, do)
    op = grads(lambda a, b, c: torch.ops.lpfail.flash_attention_fwd(a, b, c, text, True, 1 / math.sqrt(32), str(t))[0],
               q, k, v, do)
    compiled = torch.compile(lambda a, b, c: kernels.flash_attention(a, b, c, is_causal=True, fix="robust", tuning=t),
                             backend="aot_eager", fullgraph=True)
    for x, y, z in zip(eager, op, grads(compiled, q, k, v, do)):
        assert torch.equal(x, y) and torch.equal(x, z)
