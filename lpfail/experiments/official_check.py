"""Which arithmetic each preset reproduces: our reference against the paper's official attention, run both ways
(chapter 4, "Rounding", section "Which arithmetic each preset reproduces").

The official code (github.com/ucker/why-low-precision-training-fails, ``attention.py``) is public but not ours:
it is never copied into this repository. This module loads it from the folder named by the environment
variable ``LPFAIL_OFFICIAL_DIR`` (or a path given explicitly) and raises `OfficialCodeMissing`, whose message
says how to fetch it, when it is not there::

    git clone https://github.com/ucker/why-low-precision-training-fails /some/dir
    LPFAIL_OFFICIAL_DIR=/some/dir python -m lpfail run official_check        # on a CUDA machine

Two ways of running that code:

``eager``     forward and backward both under ``torch.autocast(dtype=bfloat16)``, no compilation: what
              ``PAPER_BF16`` (and ``PAPER_BF16_OFFICIAL_FIX`` against ``STABLE=1``) reproduces bit for bit.
``compiled``  what the official ``train.py`` does: ``torch.compile`` (inductor, ``compile = True`` by default),
              the forward under autocast, ``loss.backward()`` outside it. Eagerly the backward cannot run that
              way (its einsum mixes the FP32 P with the BF16 dO); compiled it runs, because AOTAutograd traces
              the backward together with the forward, inside the forward's autocast. Inductor then computes
              each fused kernel in FP32 and rounds only what it stores, which skips some of the eager BF16
              roundings: ``PAPER_BF16_COMPILED`` names the ones it skips (see `lpfail.precision`; read from
              inductor's Triton code for the H200, notes/official_check.md).
``compiled_emulate``  the same with ``torch._inductor.config.emulate_precision_casts = True``, inductor's switch
              that keeps eager's intermediate roundings (a control: it should agree with ``eager``).

On a CPU, autocast has other rules than on CUDA (exp, log and sum stay BF16 there), so the official code run
under CPU autocast computes something the paper's GPUs never did. `cuda_autocast_rules` emulates CUDA's rules
for the ops the official code uses (einsum → BF16 matmul already holds on CPU; exp, log and sum → FP32) by
registering autocast kernels for them; with it, the eager official code agrees with PAPER_BF16 bit for bit on
CPU too (tests/test_official_check.py). Inductor's CPU backend (C++) fuses differently from its GPU backend
(Triton), so what the compiled code computes on a CPU is evidence about the GPU, not a measurement of it.

The experiment ``official_check`` (GPU): per case (shape, q scale) the percentage of elements of O, dQ, dK, dV
whose bits agree, for every policy in the config against every way of running the official code, without and
with the fix (``STABLE=1``); and the tied-row mean error of O (chapter 4's rows, `lpfail.experiments.rounding`)
for our presets and for the official code run both ways.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lpfail import attention as attn
from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci
from lpfail.precision import Precision
from lpfail.results import experiment

ENV = "LPFAIL_OFFICIAL_DIR"
REPO_URL = "https://github.com/ucker/why-low-precision-training-fails"
MODES = ("eager", "compiled", "compiled_emulate")
GRADS = ("O", "dQ", "dK", "dV")
_MODULE_NAME = "lpfail_official_attention"  # the name the loaded file gets in sys.modules (dynamo imports it)


class OfficialCodeMissing(RuntimeError):
    """The official attention.py is not where LPFAIL_OFFICIAL_DIR (or the given path) points."""


def official_dir(path: str | os.PathLike | None = None) -> Path:
    """The folder holding the official ``attention.py``: `path`, else $LPFAIL_OFFICIAL_DIR."""
    where = path if path is not None else os.environ.get(ENV)
    how = (f"fetch it with `git clone {REPO_URL} DIR` and set {ENV}=DIR (the code is public but not ours: it is "
           "never copied into this repository)")
    if not where:
        raise OfficialCodeMissing(f"the paper's official attention.py is needed here and {ENV} is not set: {how}")
    folder = Path(where).expanduser()
    if not (folder / "attention.py").is_file():
        raise OfficialCodeMissing(f"{ENV}={str(folder)!r} holds no attention.py: {how}")
    return folder


def load_official(path: str | os.PathLike | None = None) -> types.ModuleType:
    """Import the official ``attention.py`` (its ``FlashAttentionFunction``). It imports einops, which it uses
    only for 2-D masks; where einops is not installed a stand-in that refuses to be called is provided."""
    file = official_dir(path) / "attention.py"
    if "einops" not in sys.modules and importlib.util.find_spec("einops") is None:
        stub = types.ModuleType("einops")

        def rearrange(*args, **kwargs):
            raise RuntimeError("einops is not installed; the official code needs it only for 2-D masks, which "
                               "official_check does not use")

        stub.rearrange = rearrange
        sys.modules["einops"] = stub
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module  # dynamo re-imports the function's module by name while tracing
    spec.loader.exec_module(module)
    if not hasattr(module, "FlashAttentionFunction"):
        raise OfficialCodeMissing(f"{file} defines no FlashAttentionFunction: not the paper's attention.py")
    return module


# -- CUDA autocast's rules on a CPU ---------------------------------------------------------------------
#: The ops of the official code that CUDA autocast runs in FP32 and CPU autocast does not.
_FP32_OPS = {"exp": torch.ops.aten.exp.default, "log": torch.ops.aten.log.default,
             "sum": torch.ops.aten.sum.default, "sum.dim_IntList": torch.ops.aten.sum.dim_IntList}


@contextlib.contextmanager
def cuda_autocast_rules(device_type: str = "cpu"):
    """Within the block, CPU autocast casts the BF16/FP16 inputs of exp, log and sum to FP32 (CUDA autocast's
    "fp32" list), as it does on a GPU. A no-op for device_type "cuda". Eager and traced (torch.compile) calls
    both go through it: AOTAutograd records autocast's casts into the graph."""
    if device_type == "cuda":
        yield
        return
    if device_type != "cpu":
        raise ValueError(f"cuda_autocast_rules: device_type must be 'cpu' or 'cuda' (got {device_type!r})")
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    lib = torch.library.Library("aten", "IMPL")

    def fp32_rule(op):
        def kernel(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(keys):
                args = [a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16)
                        else a for a in args]
                return op(*args, **kwargs)
        return kernel

    try:
        for name, op in _FP32_OPS.items():
            lib.impl(name, fp32_rule(op), "AutocastCPU")
        yield
    finally:
        lib._destroy()


# -- running both codes -------------------------------------------------------------------------------
def make_case(batch: int, heads: int, seq: int, head_dim: int, q_scale: float, seed: int,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """q, k, v, dO in BF16, N(0, 1) (q multiplied by `q_scale` before rounding: sharper attention)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq, head_dim)
    q = (torch.randn(shape, generator=g) * q_scale).bfloat16()
    k, v, do = (torch.randn(shape, generator=g).bfloat16() for _ in range(3))
    return tuple(t.to(device) for t in (q, k, v, do))


@contextlib.contextmanager
def _stable(on: bool):
    """The official code reads STABLE=1 (its fix) from the environment at every forward."""
    old = os.environ.get("STABLE")
    os.environ["STABLE"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STABLE", None)
        else:
            os.environ["STABLE"] = old


def official_fn(module: types.ModuleType, mode: str, causal: bool = True):
    """A callable (q, k, v) -> O running the official FlashAttentionFunction with 512 × 512 tiles: plain for
    "eager", wrapped in a fresh torch.compile (static shapes) for "compiled" and "compiled_emulate"."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (got {mode!r})")

    def fn(q, k, v):
        return module.FlashAttentionFunction.apply(q, k, v, None, causal, 512, 512)

    if mode == "eager":
        return fn
    torch._dynamo.reset()  # the official code reads STABLE while tracing: never reuse another setting's graph
    return torch.compile(fn, dynamic=False)


def run_official(fn, q, k, v, do, mode: str, stable: bool = False) -> tuple[torch.Tensor, ...]:
    """(O, dQ, dK, dV) of the official code. "eager": forward and backward under BF16 autocast (the backward
    cannot run outside it eagerly). "compiled*": the forward under autocast, the backward outside it, as the
    official train.py does. On a CPU, CUDA autocast's rules are emulated (`cuda_autocast_rules`). `do` None:
    the forward only, (O,)."""
    import torch._inductor.config as inductor_config

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (got {mode!r})")
    dev = q.device.type
    grad = do is not None
    qq, kk, vv = (t.detach().clone().requires_grad_(grad) for t in (q, k, v))
    emulate = mode == "compiled_emulate"
    with _stable(stable), cuda_autocast_rules(dev), inductor_config.patch(emulate_precision_casts=emulate):
        with torch.autocast(dev, dtype=torch.bfloat16):
            o = fn(qq, kk, vv)
            if grad and mode == "eager":
                o.backward(do)
        if grad and mode != "eager":
            o.backward(do)
    return (o.detach(), qq.grad, kk.grad, vv.grad) if grad else (o.detach(),)


def run_policy(policy: Precision, q, k, v, do, causal: bool = True) -> tuple[torch.Tensor, ...]:
    """(O, dQ, dK, dV) of our reference `lpfail.attention` under `policy`."""
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = attn.attention(qq, kk, vv, policy, causal=causal)
    o.backward(do)
    return o.detach(), qq.grad, kk.grad, vv.grad


def bit_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Percentage of elements whose bits are equal (same shape and dtype required)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"bit_agreement needs equal shapes and dtypes; got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    if a.element_size() == 2:
        eq = a.view(torch.int16) == b.view(torch.int16)
    elif a.element_size() == 4:
        eq = a.view(torch.int32) == b.view(torch.int32)
    else:
        eq = a.view(torch.int64) == b.view(torch.int64)
    return 100.0 * eq.double().mean().item()


def agreement(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> np.ndarray:
    """Bit agreement (%) of O, dQ, dK, dV."""
    return np.array([bit_agreement(a, b) for a, b in zip(ours, theirs)])


def tile_agreement(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...], n_tiles: int,
                   block: int = 512) -> np.ndarray:
    """Bit agreement (%) of O and dQ per 512-row query tile: (2, n_tiles), NaN past the last tile. Inductor's
    roundings can differ from one query tile to the next (where its kernel boundaries fall)."""
    out = np.full((2, n_tiles), np.nan)
    seq = ours[0].shape[-2]
    for t in range(min(n_tiles, math.ceil(seq / block))):
        rows = slice(t * block, min(seq, (t + 1) * block))
        for g in range(2):
            out[g, t] = bit_agreement(ours[g][..., rows, :], theirs[g][..., rows, :])
    return out


# -- tied rows through the official code ----------------------------------------------------------------
#: q·kᵀ·α must equal chapter 4's scores exactly: keys are one-hot rows of a 1024-wide head (α = 1/32, a power
#: of two) and q holds 32·s (exact in BF16). V's first `spec.head_dim` columns are chapter 4's V, the rest 0.
_TIED_HEAD = 1024


def tied_case(spec: RowSpec, n_rows: int, seed: int, device: str | torch.device = "cpu"):
    """Chapter 4's rows (`make_rows`) as a non-causal attention call: q (n_rows, 1, 1, 1024), k and v
    (n_rows, 1, n_keys, 1024) in BF16, such that α·QKᵀ is exactly the rows' scores; also the exact output
    O (n_rows, head_dim) in float64."""
    if spec.n_keys > _TIED_HEAD:
        raise ValueError(f"tied_case needs n_keys <= {_TIED_HEAD} (got {spec.n_keys})")
    if spec.head_dim > _TIED_HEAD:
        raise ValueError(f"tied_case needs head_dim <= {_TIED_HEAD} (got {spec.head_dim})")
    s, v, _ = make_rows(spec, n_rows, seed)                   # (rows, 1, n_keys), (rows, n_keys, d)
    scale = _TIED_HEAD ** 0.5                                 # 32
    q = torch.zeros(n_rows, 1, 1, _TIED_HEAD)
    q[:, 0, 0, : spec.n_keys] = s[:, 0, :] * scale
    k = torch.zeros(n_rows, 1, spec.n_keys, _TIED_HEAD)
    k[:, 0, torch.arange(spec.n_keys), torch.arange(spec.n_keys)] = 1.0
    vv = torch.zeros(n_rows, 1, spec.n_keys, _TIED_HEAD)
    vv[:, 0, :, : spec.head_dim] = v
    truth = (torch.softmax(s.double(), dim=-1) @ v.double())[:, 0, :]  # (rows, d)
    q, k, vv = (t.bfloat16() for t in (q, k, vv))
    # checked on the CPU, before the move: s (make_rows) lives there (a CUDA product compared with it would stop
    # the check: the devices differ)
    assert torch.equal((q.double() @ k.double().transpose(-1, -2))[:, 0] / scale, s.double()), "scores not exact"
    return q.to(device), k.to(device), vv.to(device), truth


def tied_error(o: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """Mean signed error of the stored O over rows and features, and its 95 % CI half-width over rows."""
    d = truth.shape[-1]
    err = (o[:, 0, 0, :d].double().cpu() - truth).mean(dim=-1).numpy()
    return mean_ci(err)


# -- the experiment ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OfficialCheckConfig:
    shapes: tuple = ((2, 4, 512, 64), (2, 4, 1024, 64), (2, 4, 1024, 128))  # (batch, heads, T, head_dim)
    q_scales: tuple = (1.0, 4.0)
    seed: int = 0
    #: our policies compared without the fix (against STABLE=0) ... Each variant of PAPER_BF16_COMPILED undoes
    #: one thing read from inductor's Triton code (notes/official_check.md): the last query tile's BF16 ℓ
    #: (l_div_last=none: every tile divides by the FP32 ℓ; l_div=bf16: every tile by the BF16 one), the BF16
    #: maxima of the rescale factor (m_rescale=none), the FP32 m of S − m (m_acc=bf16: the CPU backend's BF16
    #: maximum), the BF16 stored ℓ, m (l_store=none), S, δ's products and Ō in FP32 (scores, delta_prod, o_acc)
    policies: tuple = ("PAPER_BF16", "PAPER_BF16_COMPILED", "PAPER_BF16_COMPILED,l_div_last=none",
                       "PAPER_BF16_COMPILED,l_div=bf16", "PAPER_BF16_COMPILED,m_rescale=none",
                       "PAPER_BF16_COMPILED,m_acc=bf16", "PAPER_BF16_COMPILED,l_store=none",
                       "PAPER_BF16_COMPILED,scores=bf16", "PAPER_BF16_COMPILED,delta_prod=bf16",
                       "PAPER_BF16_COMPILED,o_acc=bf16")
    #: ... and with it (against STABLE=1): the fix's preset rescales with the FP32 maxima and rounds the running m,
    #: ℓ and Ō·a to BF16 in the update of the fully masked key tile (masked_carry); the variants drop that rounding
    #: (masked_carry=none), put back the preset of before it (every tile divides by the BF16 ℓ), and put back the
    #: unfixed code's BF16 maxima in the rescale factor
    fix_policies: tuple = ("PAPER_BF16_OFFICIAL_FIX", "PAPER_BF16_COMPILED_OFFICIAL_FIX",
                           "PAPER_BF16_COMPILED_OFFICIAL_FIX,masked_carry=none",
                           "PAPER_BF16_COMPILED_OFFICIAL_FIX,masked_carry=none,l_div=bf16,l_div_last=none",
                           "PAPER_BF16_COMPILED_OFFICIAL_FIX,m_rescale=bf16")
    modes: tuple = MODES
    emulate_shapes: tuple = (0,)          # indices of the shapes on which "compiled_emulate" runs (a control)
    tied_rows: int = 256                  # chapter 4's default rows (RowSpec()), one query each
    tied_seed: int = 0
    official_dir: str = ""                # "" = $LPFAIL_OFFICIAL_DIR (not part of the result's meaning)

    def __post_init__(self):
        for shape in self.shapes:
            if not (len(shape) == 4 and all(isinstance(x, int) and x > 0 for x in shape)):
                raise ValueError(f"OfficialCheckConfig.shapes: each must be 4 positive ints (got {shape!r})")
        bad = [m for m in self.modes if m not in MODES]
        if bad or "eager" not in self.modes:
            raise ValueError(f"OfficialCheckConfig.modes must include 'eager' and come from {MODES} (got {self.modes!r})")
        if not all(isinstance(i, int) and 0 <= i < len(self.shapes) for i in self.emulate_shapes):
            raise ValueError(f"OfficialCheckConfig.emulate_shapes must index shapes (got {self.emulate_shapes!r})")
        for p in (*self.policies, *self.fix_policies):
            Precision.parse(p)  # raises on an unknown preset or knob


def _cases(cfg: OfficialCheckConfig):
    for i, shape in enumerate(cfg.shapes):
        for j, q_scale in enumerate(cfg.q_scales):
            yield i, j, shape, q_scale, cfg.seed + 100 * i + j


@experiment("official_check", config=OfficialCheckConfig, gpu=True,
            description="bit agreement of PAPER_BF16 / PAPER_BF16_COMPILED with the official code, eager and compiled")
def official_check(cfg: OfficialCheckConfig) -> dict:
    """Keys: ``agree_{fix}_{mode}`` (policies × cases × 4) in % for fix in nofix / fix and mode in cfg.modes,
    ``agree_tiles_{fix}_{mode}`` (policies × cases × (O, dQ) × query tiles),
    with ``policies_{fix}`` and ``cases`` (rows "B×H×T×D q×s") naming the axes; ``official_{mode}_vs_eager_{fix}``
    (cases × 4); ``tied_{name}`` = (mean, CI) of O's signed error on chapter 4's tied rows for each of our
    policies (``tied_policy_names``) and ``tied_official_{mode}``; ``seconds_{mode}`` wall time per mode."""
    module = load_official(cfg.official_dir or None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":  # the official train.py turns TF32 off; our reference refuses TF32 anyway
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cases = list(_cases(cfg))
    import torch._inductor.config as ic

    flags = {name: repr(getattr(ic, name, "absent")) for name in
             ("emulate_precision_casts", "emulate_precision_casts_on_saved_tensors")}
    flags["eager_numerics.division_rounding"] = repr(getattr(getattr(ic, "eager_numerics", None),
                                                             "division_rounding", "absent"))
    out: dict = {"inductor_flags": ", ".join(f"{k}={v}" for k, v in flags.items()),
                 "cases": np.array([f"{b}x{h}x{t}x{d} q*{s:g}" for _, _, (b, h, t, d), s, _ in cases]),
                 "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                 "torch": torch.__version__}
    seconds = {m: 0.0 for m in cfg.modes}
    n_tiles = max(math.ceil(shape[2] / 512) for shape in cfg.shapes)
    modes = ("eager", *[m for m in cfg.modes if m != "eager"])     # eager first: the others compare to it
    for fix, names in (("nofix", cfg.policies), ("fix", cfg.fix_policies)):
        policies = [Precision.parse(p) for p in names]
        out[f"policies_{fix}"] = np.array(names)
        theirs: dict = {}                                            # (mode, case) -> (O, dQ, dK, dV)
        for mode in modes:              # one compilation per (mode, shape), reused across q scales
            for i, shape in enumerate(cfg.shapes):
                if mode == "compiled_emulate" and i not in cfg.emulate_shapes:
                    continue
                fn = official_fn(module, mode)
                for c, (ci, j, _, q_scale, seed) in enumerate(cases):
                    if ci != i:
                        continue
                    q, k, v, do = make_case(*shape, q_scale, seed, device)
                    t0 = time.perf_counter()
                    theirs[mode, c] = run_official(fn, q, k, v, do, mode, stable=fix == "fix")
                    seconds[mode] += time.perf_counter() - t0
        agree = {m: np.full((len(policies), len(cases), 4), np.nan) for m in modes}
        tiles = {m: np.full((len(policies), len(cases), 2, n_tiles), np.nan) for m in modes}
        vs_eager = {m: np.full((len(cases), 4), np.nan) for m in modes}
        for c, (i, j, shape, q_scale, seed) in enumerate(cases):
            q, k, v, do = make_case(*shape, q_scale, seed, device)
            ours = [run_policy(policy, q, k, v, do) for policy in policies]
            for mode in modes:
                if (mode, c) not in theirs:
                    continue
                vs_eager[mode][c] = agreement(theirs[mode, c], theirs["eager", c])
                for p in range(len(policies)):
                    agree[mode][p, c] = agreement(ours[p], theirs[mode, c])
                    tiles[mode][p, c] = tile_agreement(ours[p], theirs[mode, c], n_tiles)
        for mode in modes:
            out[f"agree_{fix}_{mode}"] = agree[mode]
            out[f"agree_tiles_{fix}_{mode}"] = tiles[mode]
            out[f"official_{mode}_vs_eager_{fix}"] = vs_eager[mode]
        del theirs
    # tied rows (chapter 4's default RowSpec): mean signed error of the stored O
    spec = RowSpec()
    q, k, v, truth = tied_case(spec, cfg.tied_rows, cfg.tied_seed, device)
    tied_names = list(dict.fromkeys(("PAPER_BF16", "PAPER_BF16_COMPILED", *cfg.policies[:2])))
    out["tied_policy_names"] = np.array(tied_names)
    for n, name in enumerate(tied_names):
        o = attn.attention(q, k, v, Precision.parse(name), causal=False)
        out[f"tied_policy_{n}"] = np.array(tied_error(o, truth))
    for mode in modes:
        fn = official_fn(module, mode, causal=False)
        o = run_official(fn, q, k, v, torch.zeros_like(q), mode)[0]  # with a backward: the training graph
        out[f"tied_official_{mode}"] = np.array(tied_error(o, truth))
    for mode, s in seconds.items():
        out[f"seconds_{mode}"] = s
    return out


# -- reading the stored result ---------------------------------------------------------------------------
def table(res: dict) -> str:
    """The bit-agreement table as text: one line per (fix, mode, policy), the minimum over cases of O, dQ, dK,
    dV (%), then the tied-row errors. Every number comes from the stored result `res`."""
    lines = [f"official_check on {res.get('device_name', '?')} (torch {res.get('torch', '?')}); cases: "
             f"{', '.join(map(str, res['cases']))}",
             f"inductor defaults: {res.get('inductor_flags', '?')}",
             f"{'':7s}{'official run':18s}{'our policy':50s}{'min over cases: O':>18s}{'dQ':>8s}{'dK':>8s}{'dV':>8s}"]
    for fix in ("nofix", "fix"):
        for mode in MODES:
            key = f"agree_{fix}_{mode}"
            if key not in res:
                continue
            for name, row in zip(res[f"policies_{fix}"], np.asarray(res[key])):
                worst = np.nanmin(row, axis=0)
                lines.append(f"{fix:7s}{mode:18s}{str(name):50s}{worst[0]:18.3f}{worst[1]:8.3f}{worst[2]:8.3f}"
                             f"{worst[3]:8.3f}")
    lines.append("tied rows (chapter 4's RowSpec()), mean signed error of O ± 95 % CI:")
    for n, name in enumerate(res.get("tied_policy_names", [])):
        m, ci = res[f"tied_policy_{n}"]
        lines.append(f"  ours {str(name):40s} {m:+.4e} ± {ci:.1e}")
    for mode in MODES:
        if f"tied_official_{mode}" in res:
            m, ci = res[f"tied_official_{mode}"]
            lines.append(f"  official {mode:36s} {m:+.4e} ± {ci:.1e}")
    return "\n".join(lines)


#: The criterion for a compiled preset: bit agreement with the compiled official code in at least this
#: many per cent of the elements of O, dQ, dK and dV, on every case.
CONFIRM_PCT = 99.9


def preset_confirmed(res, policy: str = "PAPER_BF16_COMPILED", fix: str = "nofix", mode: str = "compiled",
                     threshold: float = CONFIRM_PCT) -> tuple[bool, str]:
    """Does the stored result confirm `policy` against the official code run in `mode`: the minimum over cases
    of each of O, dQ, dK, dV ≥ `threshold` %? Returns (verdict, one line saying why). A policy or mode the
    result does not hold, or a NaN, is not a confirmation."""
    key = f"agree_{fix}_{mode}"
    names = [str(x) for x in res.get(f"policies_{fix}", [])]
    if key not in res or policy not in names:
        return False, f"{policy} against {mode} ({fix}) is not in the result"
    row = np.asarray(res[key])[names.index(policy)]                # (cases, 4)
    worst = np.min(row, axis=0) if not np.isnan(row).any() else np.full(4, np.nan)
    ok = bool(np.all(worst >= threshold))
    parts = ", ".join(f"{g} {w:.3f}" for g, w in zip(("O", "dQ", "dK", "dV"), worst))
    return ok, (f"{policy} vs {mode} ({fix}), minimum over {row.shape[0]} cases: {parts} % "
                f"({'≥' if ok else 'not all ≥'} {threshold} %)")


def _main(argv=None) -> int:
    import argparse

    from lpfail import results

    parser = argparse.ArgumentParser(prog="python -m lpfail.experiments.official_check",
                                     description="print the stored official_check table, or check (exit 0 / 1) "
                                                 "that it confirms a compiled preset (≥ 99.9 % of the bits of O, "
                                                 "dQ, dK and dV on every case)")
    parser.add_argument("what", choices=["table", "confirmed"])
    parser.add_argument("--policy", default="PAPER_BF16_COMPILED")
    parser.add_argument("--fix", default="nofix", choices=["nofix", "fix"])
    args = parser.parse_args(argv)
    try:
        res = results.load("official_check")
    except results.ResultError as e:
        print(f"no usable official_check result: {e}")
        return 1
    if args.what == "confirmed":
        ok, why = preset_confirmed(res, args.policy, args.fix)
        print(why)
        return 0 if ok else 1
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
