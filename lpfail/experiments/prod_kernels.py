"""Do production attention kernels have the rounding bias on tied rows? Chapter 6, "Beyond the paper".

Chapter 4 (Rounding) showed that the paper's flash attention rounds Ō away from zero when a row of scores has
several tied maxima: P̄ = exp(S − m) is exactly 1 at the ties, and the sticky bits of the other terms decide
the rounding. Production kernels form S − m differently. FlashAttention-2's CUDA kernels (and PyTorch's
flash back end built from them) fold log₂e into the scale and compute exp2(S·c − m·c) with c = α·log₂e and
the subtraction fused into one multiply-add, so the tied maximum maps to the rounding error of the product
S·c instead of exactly 0, and P̄ at a tie need not be 1 (arXiv 2609.34272). Their accumulator and ℓ are FP32
and O = Ō / ℓ is divided in FP32 before the one rounding to BF16. Whether a bias remains, and its sign, is
measured here, not assumed.

Rows come from chapter 4's generator (`rounding.make_rows`: `n_ties` scores tied at `gap` above a N(0, 1)
background, V negative with probability `neg_frac`). To feed exactly those scores to a kernel that takes
q and k, each row becomes one batch entry with q = e₀ (repeated for `n_query` identical queries) and
k_j = s_j·e₀, so that q·k_j = s_j exactly, and the kernels are called with scale = 1. The stored output O is
compared with the float64 truth softmax(s)·V:

    signed   mean over features of (O − O_true), per row
    away     mean over features of (O − O_true)·sign(O_true), per row: > 0 when |O| is rounded up

each as a mean over rows with a 95 % CI, per (gap, n_ties) on a grid at the base `neg_frac`, and per
`neg_frac` at the base gap and n_ties.

Methods (`METHODS`):

* PyTorch SDPA's back ends (``torch.nn.attention.sdpa_kernel``): flash, cuDNN, memory-efficient, math, with
  BF16 inputs. A back end that is not available on the machine is recorded with the error it raised,
  never skipped silently.
* lpfail's Triton kernel with FA2_BF16, in sub and fma modes (CUDA only).
* the reference (`lpfail.attention.forward_from_scores`) under PAPER_BF16 and FA2_BF16;
* *mimics*: `mimic_forward`, FlashAttention-2's order of operations written out in PyTorch, with the knobs
  that could decide a sign — exp (α, subtract) or exp2 (c = α·log₂e), the subtraction separate or fused,
  O divided in FP32 before the BF16 rounding or rounded first and divided after — and `math_mimic`, the math
  back end's unfused order (S, P = softmax(S) and O each rounded to BF16). A mimic that reproduces a back
  end's output bit for bit (`match` fractions in the result) is evidence for the order of operations that
  explains its sign.

Also recorded: P̄ at the tied keys where it can be observed (the reference and the mimics): the fraction of
tied keys whose p = exp(S − m) is exactly 1 in FP32, and whose P̄ = bf16(p) is exactly 1. (The FMA's residual
is a rounding error of S·c, of order 2⁻²⁴·|S·c|, far below BF16's spacing 2⁻⁸ just under 1, so p ≠ 1 can
still round to P̄ = 1: what the P̄V product sees.)

The experiment `prod_kernels` runs every method on the machine it is run on (registered gpu=True: the
CUDA-only back ends are its point). On a CPU machine it still runs what the CPU has (the reference, the
mimics, the math back end and PyTorch's CPU flash kernel) and records the others as unavailable.
GPU command: ``bash tools/gpu_batch.sh prod`` (writes results/prod_kernels.{json,npz} under $OUT).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from lpfail import attention as attn
from lpfail.experiments.rounding import RowSpec, make_rows, mean_ci
from lpfail.precision import FA2_BF16, PAPER_BF16
from lpfail.results import experiment

LOG2E = math.log2(math.e)

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")
#: method name → (kind, argument). Kinds: "sdpa" (back end name), "triton" (policy), "reference" (policy),
#: "mimic" (keyword arguments of `mimic_forward`), "math_mimic".
METHODS: dict[str, tuple[str, object]] = {
    **{f"sdpa_{b}": ("sdpa", b) for b in SDPA_BACKENDS},
    "triton_sub": ("triton", FA2_BF16),
    "triton_fma": ("triton", FA2_BF16.replace(sub="fma")),
    "ref_PAPER_BF16": ("reference", PAPER_BF16),
    "ref_FA2_BF16": ("reference", FA2_BF16),
    "mimic_exp_sub": ("mimic", {"exp2": False, "fma": False}),
    "mimic_exp2_sub": ("mimic", {"exp2": True, "fma": False}),
    "mimic_exp2_fma": ("mimic", {"exp2": True, "fma": True}),
    "mimic_exp2_fma_roundfirst": ("mimic", {"exp2": True, "fma": True, "round_first": True}),
    "math_mimic": ("math_mimic", None),
}
#: The normaliser's source (flash-attention PR #2721): the Triton kernel, the reference and the
#: FlashAttention-2 mimic with ℓ summed from P̄ (as rounded for P̄V) beside their twins in METHODS, which sum the FP32
#: P. Kept out of METHODS so that `prod_kernels`' configuration (and its stored result) stays as it was.
NORMALISER_METHODS: dict[str, tuple[str, object]] = {
    "triton_sub_lpbar": ("triton", FA2_BF16.replace(l_from="pbar")),
    "triton_fma_lpbar": ("triton", FA2_BF16.replace(sub="fma", l_from="pbar")),
    "ref_FA2_BF16_lpbar": ("reference", FA2_BF16.replace(l_from="pbar")),
    "mimic_exp2_fma_lpbar": ("mimic", {"exp2": True, "fma": True, "l_pbar": True}),
}
ALL_METHODS = {**METHODS, **NORMALISER_METHODS}


# -- the mimics --------------------------------------------------------------------------------------------
def _fma32(a: torch.Tensor, b: float, c: torch.Tensor) -> torch.Tensor:
    """a·b + c with one rounding to FP32 (a, c FP32; b an FP32 number), emulated in float64: the product of
    two FP32 numbers is exact in float64, and the float64 sum rounds at most once more, which differs from a
    hardware FMA by one FP32 ulp in rare cases (as in `lpfail.attention`'s sub="fma")."""
    return (a.double() * b + c.double()).float()


def mimic_forward(s: torch.Tensor, v: torch.Tensor, exp2: bool = True, fma: bool = True, round_first: bool = False,
                  block_k: int | None = 64, alpha: float = 1.0,
                  l_pbar: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2's forward over key blocks, in FP32 with BF16 P̄ and BF16 output, with the knobs that
    could decide the sign of the output's rounding error. s (…, Tq, Tk) FP32 holding the raw products q·k,
    v (…, Tk, D) BF16 values. Per key block::

        m_new = max(m_old, rowmax(S))                      FP32, of the raw products; c = α, or α·log₂e (exp2)
        x     = S·c − m_new·c                               separate (round S·c, subtract) or fused (fma)
        p     = exp(x)  or  exp2(x)                          FP32
        a     = exp((m_old − m_new)·c) (exp2 for exp2)        FP32
        ℓ     = ℓ·a + rowsum(p)                              FP32 (rowsum(bf16(p)) with l_pbar: PR #2721)
        Ō     = Ō·a + bf16(p)·V                             FP32 accumulation
    then O = bf16(Ō / ℓ) (round_first=False) or bf16(bf16(Ō) / ℓ) (round_first=True). Returns O (…, Tq, D)
    BF16 and p (before its BF16 rounding) of every key against the final m (…, Tq, Tk) FP32, to observe P̄
    at the ties."""
    if s.dtype != torch.float32:
        raise ValueError(f"mimic_forward takes FP32 scores (got {s.dtype})")
    c = float(torch.tensor(alpha * LOG2E if exp2 else alpha, dtype=torch.float32))  # the scale, in FP32
    *lead, tq, tk = s.shape
    d = v.shape[-1]
    vf = v.to(torch.bfloat16).float()
    m = torch.full((*lead, tq, 1), -math.inf, device=s.device)
    l = torch.zeros((*lead, tq, 1), device=s.device)
    o = torch.zeros((*lead, tq, d), device=s.device)
    ex = torch.exp2 if exp2 else torch.exp
    step = tk if block_k is None else block_k

    def probs(sb, m_raw):
        m_scaled = m_raw * c                                       # FP32: the row maximum times the scale
        if fma:
            return ex(_fma32(sb, c, -m_scaled))                    # one rounding of S·c − m·c
        return ex((sb * c) - m_scaled)                             # S·c rounded to FP32, then subtracted

    for k0 in range(0, tk, step):
        sb = s[..., k0:k0 + step]                                  # (…, Tq, bk)
        m_new = torch.maximum(m, sb.amax(dim=-1, keepdim=True))    # FP32 running maximum of the raw S
        p = probs(sb, m_new)
        a = ex((m - m_new) * c)                                    # rescale of the old ℓ and Ō
        pbar = p.to(torch.bfloat16).float()                        # cast: P̄ to BF16 for the tensor-core dot
        l = l * a + (pbar if l_pbar else p).sum(dim=-1, keepdim=True)
        o = o * a + pbar @ vf[..., k0:k0 + step, :]                # FP32 accumulation (exact products)
        m = m_new
    if round_first:
        o_out = (o.to(torch.bfloat16).float() / l).to(torch.bfloat16)  # cast: Ō to BF16, then divide
    else:
        o_out = (o / l).to(torch.bfloat16)                         # cast: one rounding of Ō / ℓ
    return o_out, probs(s, m)


def math_mimic(s: torch.Tensor, v: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """The unfused order of SDPA's math back end on BF16 inputs: S = bf16(q·k·α), P = bf16(softmax(S)) with
    the softmax computed in FP32, O = bf16(P·V) with FP32 accumulation. s (…, Tq, Tk) FP32 raw products."""
    sb = (s * alpha).to(torch.bfloat16)                            # cast: S to BF16
    p = torch.softmax(sb.float(), dim=-1).to(torch.bfloat16)       # cast: P to BF16
    return (p.float() @ v.to(torch.bfloat16).float()).to(torch.bfloat16)  # cast: O to BF16


# -- running one method on a batch of rows -----------------------------------------------------------------
def _qkv(s: torch.Tensor, v: torch.Tensor, n_query: int, device) -> tuple[torch.Tensor, ...]:
    """q (rows, 1, n_query, D), k (rows, 1, Tk, D), v (rows, 1, Tk, D) in BF16 with q·k_j = s_j exactly."""
    rows, _, tk = s.shape
    d = v.shape[-1]
    q = torch.zeros(rows, 1, n_query, d, dtype=torch.bfloat16, device=device)
    q[..., 0] = 1.0
    k = torch.zeros(rows, 1, tk, d, dtype=torch.bfloat16, device=device)
    k[..., 0] = s[:, 0, :].to(torch.bfloat16).to(device)[:, None, :]  # s holds BF16 values: exact
    return q, k, v[:, None].to(torch.bfloat16).to(device)


def _sdpa(backend: str, q, k, v) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    with sdpa_kernel(which):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False, scale=1.0)


def run_method(name: str, s: torch.Tensor, v: torch.Tensor, device: str = "cpu",
               n_query: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(O (rows, D) float64 of the first query, p = exp(S − m) in FP32 before its rounding to P̄ (rows, Tk), or
    None where it cannot be observed) of one
    method on rows s (rows, 1, Tk) and v (rows, Tk, D). Raises whatever the method raises when it cannot run
    (the experiment records that as 'unavailable')."""
    if name not in ALL_METHODS:
        raise ValueError(f"unknown method {name!r}; methods: {list(ALL_METHODS)}")
    kind, arg = ALL_METHODS[name]
    if kind == "sdpa":
        q, k, vv = _qkv(s, v, n_query, device)
        return _sdpa(arg, q, k, vv)[:, 0, 0].double().cpu(), None
    if kind == "triton":
        from lpfail import kernels

        if not kernels.available(device):
            raise RuntimeError(f"the Triton kernels cannot run on {device!r} (they need CUDA)")
        q, k, vv = _qkv(s, v, s.shape[-1], device)  # the kernel takes self-attention shapes: Tq = Tk
        o = kernels.flash_attention(q, k, vv, policy=arg, causal=False, scale=1.0)
        return o[:, 0, 0].double().cpu(), None
    s, v = s.to(device), v.to(device)  # the reference and the mimics run where the kernels run
    if kind == "reference":
        res = attn.forward_from_scores(s, v, arg)
        p = attn.exp_scores(s, res.m, arg).float() if arg.sub == "sub" else None
        return res.o[:, 0].double().cpu(), (p[:, 0].cpu() if p is not None else None)
    if kind == "mimic":
        o, p = mimic_forward(s, v, **arg)
        return o[:, 0].double().cpu(), p[:, 0].cpu()
    return math_mimic(s, v)[:, 0].double().cpu(), None


def truth(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(s)·V in float64: (rows, D)."""
    return (torch.softmax(s.double(), dim=-1) @ v.double())[:, 0]


def point_stats(o: torch.Tensor, o_true: torch.Tensor, p: torch.Tensor | None, ties: torch.Tensor) -> dict:
    """Mean and CI half-width of the signed error and of the error toward larger |O|, over rows; and the
    fractions of tied keys whose p = exp(S − m) is exactly 1 in FP32 ("p_one") and whose P̄ = bf16(p) is
    exactly 1 ("pbar_one"); NaN where p is not observed."""
    err = (o - o_true).numpy()
    sign = np.sign(o_true.numpy())
    out = {"signed": mean_ci(err.mean(axis=1)), "away": mean_ci((err * sign).mean(axis=1))}
    nan = float("nan")
    out["p_one"] = float((p[ties] == 1.0).double().mean()) if p is not None else nan
    out["pbar_one"] = float((p[ties].to(torch.bfloat16) == 1.0).double().mean()) if p is not None else nan
    return out


# -- the experiment ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProdKernelsConfig:
    n_rows: int = 1000                                       # rows per point (the CI is over rows)
    seed: int = 0
    base: RowSpec = RowSpec()                                # 512 keys, 2 ties at 16, 90 % negative V, d = 64
    gaps: tuple = (8.0, 12.0, 16.0, 20.0, 24.0)
    ties: tuple = (1, 2, 3, 4)
    neg_fracs: tuple = (0.1, 0.5, 0.9)
    methods: tuple = tuple(METHODS)
    n_query: int = 16                                        # identical queries per row (kernels' tile sizes)
    device: str = "auto"                                     # "auto": CUDA when available, else CPU
    match_rows: int = 200                                    # rows at the base point for the bit-match table


STATS = ("signed", "away")
ONES = ("p_one", "pbar_one")


def _device(cfg: ProdKernelsConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def measure(cfg: ProdKernelsConfig) -> dict:
    """Every method at every point; see the module docstring. Keys: ``available_{m}`` (bool),
    ``unavailable_{m}`` (the error, where not available); for each available method m and stat in
    STATS: ``grid_{m}_{stat}`` and ``_ci`` (len(gaps), len(ties)), ``neg_{m}_{stat}`` and ``_ci``
    (len(neg_fracs),), ``grid_{m}_p_one`` and ``grid_{m}_pbar_one`` (and ``neg_…``); ``match_{a}__{b}`` the fraction of O elements equal bit for bit
    between methods a and b at the base point; the axes ``gaps``, ``ties``, ``neg_fracs``."""
    device = _device(cfg)
    out: dict = {"gaps": np.array(cfg.gaps, dtype=float), "ties": np.array(cfg.ties, dtype=float),
                 "neg_fracs": np.array(cfg.neg_fracs, dtype=float), "device_used": device}
    # which methods run here: try each once on a few rows
    s0, v0, _ = make_rows(cfg.base, 4, cfg.seed)
    live = []
    for name in cfg.methods:
        try:
            run_method(name, s0, v0, device, cfg.n_query)
            live.append(name)
            out[f"available_{name}"] = True
        except Exception as e:  # noqa: BLE001 - any failure to run is reported, with its message
            out[f"available_{name}"] = False
            out[f"unavailable_{name}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    out["methods_run"] = ",".join(live)

    def sweep(specs, shape, prefix):
        acc = {(m, st): np.full(shape + (2,), np.nan) for m in live for st in STATS + ONES}
        for pos, spec, seed in specs:
            s, v, ties = make_rows(spec, cfg.n_rows, seed)
            o_true = truth(s, v)
            for m in live:
                o, pbar = run_method(m, s, v, device, cfg.n_query)
                st = point_stats(o, o_true, pbar, ties)
                for key in STATS:
                    acc[(m, key)][pos] = st[key]
                for key in ONES:
                    acc[(m, key)][pos] = (st[key], np.nan)
        for (m, key), arr in acc.items():
            out[f"{prefix}_{m}_{key}"] = arr[..., 0]
            if key not in ONES:
                out[f"{prefix}_{m}_{key}_ci"] = arr[..., 1]

    grid = [((i, j), dataclasses.replace(cfg.base, gap=float(g), n_ties=int(t)), cfg.seed + 1000 * (i * 10 + j + 1))
            for i, g in enumerate(cfg.gaps) for j, t in enumerate(cfg.ties)]
    sweep(grid, (len(cfg.gaps), len(cfg.ties)), "grid")
    neg = [((i,), dataclasses.replace(cfg.base, neg_frac=float(f)), cfg.seed + 7 + 1000 * i)
           for i, f in enumerate(cfg.neg_fracs)]
    sweep(neg, (len(cfg.neg_fracs),), "neg")

    # bit-for-bit agreement of every pair at the base point: which mimic reproduces which back end
    s, v, _ = make_rows(cfg.base, cfg.match_rows, cfg.seed + 99)
    outs = {m: run_method(m, s, v, device, cfg.n_query)[0] for m in live}
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            out[f"match_{a}__{b}"] = float((outs[a] == outs[b]).double().mean())
    return out


@experiment("prod_kernels", config=ProdKernelsConfig, gpu=True,
            description="bias of production attention kernels (SDPA back ends, Triton) on tied rows (ch. 6)")
def prod_kernels_experiment(cfg: ProdKernelsConfig) -> dict:
    return measure(cfg)


@dataclass(frozen=True)
class ProdKernelsCPUConfig(ProdKernelsConfig):
    """What a CPU machine can measure now: the reference, the mimics, SDPA's math back end and PyTorch's CPU
    flash kernel (not the CUDA one); fewer rows, to keep it to a minute or two."""

    n_rows: int = 400
    methods: tuple = ("sdpa_flash", "sdpa_math", "ref_PAPER_BF16", "ref_FA2_BF16", "mimic_exp_sub",
                      "mimic_exp2_sub", "mimic_exp2_fma", "mimic_exp2_fma_roundfirst", "math_mimic")
    device: str = "cpu"


#: The methods chapter 6's lab page compares PyTorch's CPU back ends with, bit for bit.
CPU_CLOSEST = ("ref_PAPER_BF16", "ref_FA2_BF16", "mimic_exp2_fma_roundfirst", "mimic_exp2_fma")


def cpu_headline(res) -> dict:
    """What chapter 6's lab page states from a `prod_kernels_cpu` result that does not depend on the machine: that
    SDPA's CPU flash kernel ran, and on which side the CPU math back end is — its error toward larger |O| at the
    base rows significantly below 0 ("FA2", as FlashAttention-2's order), above 0 ("paper") or neither — and the
    method of `CPU_CLOSEST` it agrees with most bit for bit.

    The page prints more, and the rest depends on the machine (measured 2026-12-04 on the default config):

    * the CPU *flash* kernel's side depends on ATen's CPU capability. Its AVX2 and AVX-512 builds round as the
      paper's order (toward larger |O| +13.67 ± 0.29 ×10⁻⁴, 99.6 % bit for bit with ``ref_PAPER_BF16``: the stored
      result, and the page's sentence "the CPU flash kernel is on the paper's side"); its portable build, which
      the pins select (``ATEN_CPU_CAPABILITY=default``), rounds as FlashAttention-2's order (−9.73 ± 0.29, 99.8 %
      with ``ref_FA2_BF16``). oneDNN's instruction set, the thread count and the nudge do not change the side.
    * the errors themselves (``+.2f``) and the agreement (``.1%``): the math back end reads −9.66 pinned and −9.81
      under the second setting of tools/cpu_invariance.py (stored −9.80); ATen's AVX-512 kernels alone give −9.75,
      ``MKL_CBWR=AUTO`` alone −9.74; its agreement with ``ref_FA2_BF16`` is 99.75 % vs 99.71 %."""
    out = {"sdpa_flash_available": bool(res.get("available_sdpa_flash", False))}
    row = next((r for r in summary(res) if r["method"] == "sdpa_math"), None)
    if row is None or not row["available"]:
        out["sdpa_math"] = "not available"
        return out
    away, ci = row["away"], row["away_ci"]
    out["sdpa_math_side"] = "paper" if away - ci > 0 else "FA2" if away + ci < 0 else "neither"
    agree = {o: float(res.get(f"match_sdpa_math__{o}", res.get(f"match_{o}__sdpa_math", float("nan"))))
             for o in CPU_CLOSEST}
    out["sdpa_math_closest"] = max(CPU_CLOSEST, key=lambda o: agree[o])
    return out


def cpu_check(cfg: ProdKernelsCPUConfig) -> ProdKernelsCPUConfig:
    """The two-settings check's config: every method, as many rows, on the base rows (gap 16, two ties) and one
    tie at the same gap; one neg_frac (the base's 90 %); the bit-for-bit comparison as stored (about 5 s)."""
    return dataclasses.replace(cfg, gaps=(16.0,), ties=(1, 2), neg_fracs=(0.9,))


@experiment("prod_kernels_cpu", config=ProdKernelsCPUConfig, headline=cpu_headline, check=cpu_check,
            description="prod_kernels' CPU part: reference, mimics, CPU math and CPU flash back ends (ch. 6)")
def prod_kernels_cpu_experiment(cfg: ProdKernelsCPUConfig) -> dict:
    return measure(cfg)


def summary(res) -> list[dict]:
    """One row per method at the base point (gap, ties and neg_frac of the config's base, when on the
    axes): mean signed error and error toward larger |O| with CIs, P̄ = 1 fraction, or the reason it is
    unavailable. For chapter 6's table."""
    rows = []
    gaps, ties = list(res["gaps"]), list(res["ties"])
    names = [k[len("available_"):] for k in res if k.startswith("available_")]
    base = RowSpec()
    gi = gaps.index(base.gap) if base.gap in gaps else 0
    ti = ties.index(base.n_ties) if base.n_ties in ties else 0
    for m in names:
        if not bool(res[f"available_{m}"]):
            rows.append({"method": m, "available": False, "reason": str(res[f"unavailable_{m}"])})
            continue
        g = lambda key: float(np.asarray(res[f"grid_{m}_{key}"])[gi, ti])  # noqa: E731
        rows.append({"method": m, "available": True, "signed": g("signed"), "signed_ci": g("signed_ci"),
                     "away": g("away"), "away_ci": g("away_ci"), "p_one": g("p_one"), "pbar_one": g("pbar_one")})
    return rows


# -- the normaliser's source: how much of the tied-row bias is ℓ summed from the unrounded P? ----------------------
@dataclass(frozen=True)
class NormaliserConfig:
    """Rows of chapter 4's generator at (gap, n_ties) points: n_ties = 1 is a row without a tie (one maximum at
    the gap), gap 2 a row without a dominant key. Every production back end beside our kernel, the reference and
    the FlashAttention-2 mimic, each with ℓ from P (as they are) and from P̄ (l_from="pbar")."""

    n_rows: int = 2000
    seed: int = 25
    base: RowSpec = RowSpec()                                # 512 keys, 90 % negative V, d = 64
    points: tuple = ((16.0, 1), (16.0, 2), (16.0, 3), (16.0, 4), (8.0, 1), (8.0, 2), (2.0, 1))
    methods: tuple = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "triton_sub", "triton_sub_lpbar",
                      "triton_fma", "triton_fma_lpbar", "ref_FA2_BF16", "ref_FA2_BF16_lpbar", "mimic_exp2_fma",
                      "mimic_exp2_fma_lpbar")
    n_query: int = 16
    device: str = "auto"


#: (method with ℓ from P, its twin with ℓ from P̄): the normaliser's share is measured on these pairs
NORMALISER_PAIRS = (("triton_sub", "triton_sub_lpbar"), ("triton_fma", "triton_fma_lpbar"),
                    ("ref_FA2_BF16", "ref_FA2_BF16_lpbar"), ("mimic_exp2_fma", "mimic_exp2_fma_lpbar"))


def measure_normaliser(cfg: NormaliserConfig) -> dict:
    """Per method available here: ``{m}_signed`` and ``{m}_away`` (len(points),) with ``_ci``; the axes
    ``gaps``, ``ties`` (one entry per point); ``available_{m}`` / ``unavailable_{m}`` as in `measure`."""
    device = _device(cfg)
    gaps = np.array([float(g) for g, _ in cfg.points])
    out: dict = {"gaps": gaps, "ties": np.array([float(t) for _, t in cfg.points]), "device_used": device}
    s0, v0, _ = make_rows(cfg.base, 4, cfg.seed)
    live = []
    for name in cfg.methods:
        try:
            run_method(name, s0, v0, device, cfg.n_query)
            live.append(name)
            out[f"available_{name}"] = True
        except Exception as e:  # noqa: BLE001 - any failure to run is reported, with its message
            out[f"available_{name}"] = False
            out[f"unavailable_{name}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    out["methods_run"] = ",".join(live)
    stats = {(m, st): np.full((len(cfg.points), 2), np.nan) for m in live for st in STATS}
    for i, (gap, n_ties) in enumerate(cfg.points):
        spec = dataclasses.replace(cfg.base, gap=float(gap), n_ties=int(n_ties))
        s, v, ties = make_rows(spec, cfg.n_rows, cfg.seed + 1000 * (i + 1))
        o_true = truth(s, v)
        for m in live:
            st = point_stats(run_method(m, s, v, device, cfg.n_query)[0], o_true, None, ties)
            for key in STATS:
                stats[(m, key)][i] = st[key]
    for (m, key), arr in stats.items():
        out[f"{m}_{key}"], out[f"{m}_{key}_ci"] = arr[:, 0], arr[:, 1]
    return out


@experiment("prod_normaliser", config=NormaliserConfig, gpu=True,
            description="the second biased path: ℓ from P or from P̄, production back ends beside (ch. 6; GPU)")
def prod_normaliser_experiment(cfg: NormaliserConfig) -> dict:
    return measure_normaliser(cfg)


def normaliser_summary(res, stat: str = "signed") -> list[dict]:
    """One row per point with ties (n_ties ≥ 2) and per pair of NORMALISER_PAIRS measured: the pair's errors with ℓ
    from P and from P̄, their difference (what the normaliser's mismatch contributes), and that difference as a share
    of each production back end's error at the point (`shares`: back end → share, NaN where it is not measured).
    Rows without ties (n_ties = 1) appear with ``tied=False`` and no shares (their bias is the normaliser's alone
    or none)."""
    gaps, ties = np.asarray(res["gaps"]), np.asarray(res["ties"])
    backends = [f"sdpa_{b}" for b in SDPA_BACKENDS if bool(res.get(f"available_sdpa_{b}", False))]
    rows = []
    for a, b in NORMALISER_PAIRS:
        if not (bool(res.get(f"available_{a}", False)) and bool(res.get(f"available_{b}", False))):
            continue
        ea, eb = np.asarray(res[f"{a}_{stat}"]), np.asarray(res[f"{b}_{stat}"])
        for i in range(len(gaps)):
            part = float(ea[i] - eb[i])
            shares = {be: part / float(res[f"{be}_{stat}"][i]) if ties[i] >= 2 else math.nan for be in backends}
            rows.append({"pair": f"{a}/{b}", "gap": float(gaps[i]), "n_ties": int(ties[i]), "tied": ties[i] >= 2,
                         "from_p": float(ea[i]), "from_p_ci": float(res[f"{a}_{stat}_ci"][i]), "from_pbar": float(eb[i]),
                         "from_pbar_ci": float(res[f"{b}_{stat}_ci"][i]), "normaliser_part": part, "shares": shares})
    return rows
