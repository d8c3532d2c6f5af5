"""Chapter 3 ("The gradient error"): the paper's Eq. 1–3, each line computed from captured tensors and checked
against autograd.

Notation (the paper's Sec. 3, our shapes): one attention layer, heads h, X (B, T, C) the input of the QKV
projection (after LayerNorm), Q^h = X W_Q^hᵀ (B, T, D), α = D^-1/2, S = α QKᵀ (causal), P = softmax(S),
O = PV, dO the gradient of the loss with respect to O, δ = rowsum(dO ∘ O), dP = dO Vᵀ, dS = P ∘ (dP − δ),
dQ = α dS K, dW_Q^h = Σ_{b,T} dQ[b,T]ᵀ X[b,T] (a D × C matrix). "hp" is the exact value (float64 here; the
paper's FP32), "lp" the value under a policy (PAPER_BF16: A's arithmetic). Δδ = δ_lp − δ_hp per row.

    Eq. 1   dQ_hp − dQ_lp  = α · diag(Δδ) · (P K)                       when only δ differs
    Eq. 2   dW_Q,hp − dW_Q,lp = α Σ_{b,T} Δδ[b,T] · (PK)[b,T]ᵀ X[b,T]    a weighted sum of rank-one D × C terms
    Eq. 3   ≈ α (Σ Δδ) · R̄                                               R̄ = the mean rank-one term

How each line is checked (`derivation_check`):

* Eq. 1 and 2 against **autograd**, independently of the formula: the gradient of the scalar
  ⟨O(W_Q), dO⟩ with respect to S is P ∘ (dP − δ_hp); adding −Σ Δδ[T]·logsumexp(S[T]) (Δδ held constant)
  adds −Δδ[T]·P[T] to it, i.e. turns δ_hp into δ_lp. So autograd of the two scalars, in float64, gives
  dQ and dW_Q with the exact and with the low-precision δ; their differences must equal the formulas to
  float64 rounding (tolerance `TOL`).
* Eq. 2's share of the *whole* low-precision error: the full backward under the policy (`flash_backward`,
  every cast of A, from A's own forward) gives dW_Q,lp^full; the cosine between dW_Q,hp − dW_Q,lp^full and
  the δ-term, and the ratio of their norms, say how much of A's gradient error the δ channel is.
* Eq. 3 is an approximation, measured (not checked): the mean pairwise cosine of the rank-one terms, and the
  relative error of α (Σ Δδ) R̄ against Eq. 2.

Public surface::

    delta_lp(do, o, policy)                            δ as the policy's backward computes it from a stored O
    derivation_check(x, w_q, w_k, w_v, do, policy)     every line, per head → dict of numbers
    capture_layer(model, idx, targets, layer)          X, W_Q, W_K, W_V, dO of one layer from a model
    synthetic_inputs(...)                              large-logit inputs with tied maxima, for the CPU
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from lpfail.attention import _wider, flash_backward, flash_forward
from lpfail.precision import PAPER_BF16, Precision

#: Relative tolerance of the autograd checks of Eq. 1 and 2 (both sides in float64; measured ≈ 1e-13 on
#: synthetic inputs with logits in the thousands: the difference of two nearly equal gradients).
TOL = 1e-9

#: Length of the stored random projections of R̄ and of the δ-term (`derivation_check`'s sketches).
SKETCH_DIM = 256


def delta_lp(do: torch.Tensor, o: torch.Tensor, policy: Precision) -> torch.Tensor:
    """δ = rowsum(dO ∘ O) as `lpfail.attention`'s backward forms it for delta="dO.O": each product rounded to
    `delta_prod` (widened to the operands' dtype), summed in FP32 (FP64 for FP64 operands). (…, T, 1)."""
    prod_dt = _wider(policy.dtype("delta_prod"), do.dtype, o.dtype)
    op = torch.float64 if prod_dt == torch.float64 else torch.float32
    return (do.to(prod_dt) * o.to(prod_dt)).to(op).sum(dim=-1, keepdim=True)


def _causal(t: int, device) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


def _heads(x: torch.Tensor, w: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) @ (C_out, C)ᵀ → (B, H, T, D)."""
    b, t, _ = x.shape
    return (x @ w.T).view(b, t, n_head, -1).transpose(1, 2)


def derivation_check(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, do: torch.Tensor,
                     policy: Precision = PAPER_BF16, n_head: int = 1, input_dtype=torch.bfloat16,
                     n_pairs: int = 2000, seed: int = 0, qkv: tuple | None = None, sketch_dim: int = SKETCH_DIM
                     ) -> dict:
    """Every line of Eq. 1–3 for one layer, per head.

    x (B, T, C) the QKV projection's input; w_q, w_k, w_v (C, C) its three weight blocks (rows = heads ×
    head size); do (B, H, T, D) the gradient of the attention output. q, k, v are formed in float64 and
    rounded to `input_dtype` (BF16: what autocast feeds the attention) before the lp forward, unless `qkv`
    gives the (B, H, T, D) q, k, v the model's attention actually received (then used as they are; the
    gradient with respect to W_Q still flows through X W_Qᵀ). Returns per-head
    lists: the relative errors of Eq. 1 and 2 against autograd, Eq. 3's cosine and relative error, the δ-term's
    share of the policy's full dW_Q error, and Σ Δδ with the fraction of positive Δδ; Σ Δδ split by whether
    the row's BF16 scores have a tied maximum (`sum_dd_tied`, `sum_dd_untied`, `frac_tied`: the paper's claim
    that tied rows carry the bias); and `sketch_rbar` / `sketch_dterm` (per head, `sketch_dim` numbers each):
    the unit mean rank-one term R̄ and the unit δ-term of Eq. 2 projected on fixed random directions (seed 0),
    so that their cosine *across steps* (the paper's Fig. 4) can be computed from stored records (the
    projection keeps cosines to about ±2/√sketch_dim)."""
    b, t, c, d = _check_shapes(x, w_q, w_k, w_v, do, n_head)
    alpha = d ** -0.5
    x64, wq64, wk64, wv64 = (a.detach().double() for a in (x, w_q, w_k, w_v))
    mask = _causal(t, x.device)
    f = _forwards(x64, wq64, wk64, wv64, do, policy, n_head, input_dtype, qkv, alpha, mask)
    dd, pk = f.dd, f.pk
    # autograd: dQ and dW_Q with δ_hp and with δ_lp (through the logsumexp term), as functions of W_Q
    dq_hp, dw_hp = _autograd_grads(x64, wq64, f, alpha, mask, n_head, with_lp=False)
    dq_lp, dw_lp = _autograd_grads(x64, wq64, f, alpha, mask, n_head, with_lp=True)
    xh = x64.unsqueeze(1)                                                            # (B, 1, T, C)
    out = {k: [] for k in ("eq1_rel_err", "eq2_rel_err", "eq3_rel_err", "eq3_cos_mean", "share_cos",
                           "share_norm", "sum_dd", "frac_dd_pos", "dd_abs_mean", "dw_err_norm", "sum_dd_tied",
                           "sum_dd_untied", "frac_tied", "sketch_rbar", "sketch_dterm")}
    tied = tied_rows(f.q_in, f.k_in, alpha, mask)                                    # (B, H, T) bool
    proj = sketch_matrix(d * c, sketch_dim)                                          # (D·C, k)
    g = torch.Generator().manual_seed(seed)
    dq_full64 = f.dq_full.double()
    for h in range(n_head):
        rows = slice(h * d, (h + 1) * d)
        # Eq. 1
        lhs1 = dq_hp[:, h] - dq_lp[:, h]
        rhs1 = alpha * dd[:, h] * pk[:, h]
        out["eq1_rel_err"].append(_rel(lhs1, rhs1))
        # Eq. 2: Σ_{b,T} Δδ (PK)ᵀ X
        lhs2 = dw_hp[rows] - dw_lp[rows]
        rhs2 = alpha * torch.einsum("bt,btd,btc->dc", dd[:, h, :, 0], pk[:, h], xh[:, 0])
        out["eq2_rel_err"].append(_rel(lhs2, rhs2))
        # Eq. 3: rank-one terms r = (PK)[T]ᵀ X[T], their similarity and the mean-term approximation
        terms = torch.einsum("btd,btc->btdc", pk[:, h], xh[:, 0]).reshape(b * t, -1)   # (B·T, D·C)
        unit = terms / terms.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        i = torch.randint(0, b * t, (n_pairs,), generator=g)
        j = torch.randint(0, b * t, (n_pairs,), generator=g)
        keep = i != j
        out["eq3_cos_mean"].append(float((unit[i[keep]] * unit[j[keep]]).sum(-1).mean()))
        r_bar = terms.mean(0).view(d, c)
        approx = alpha * dd[:, h].sum() * r_bar
        out["eq3_rel_err"].append(_rel(rhs2, approx))
        # the δ channel's share of the policy's whole dW_Q error
        full = (dq_hp[:, h] - dq_full64[:, h])                                     # (B, T, D)
        full_w = torch.einsum("btd,btc->dc", full, xh[:, 0])
        out["share_cos"].append(_cos(full_w, rhs2))
        out["share_norm"].append(float(rhs2.norm() / full_w.norm()) if full_w.norm() > 0 else float("nan"))
        out["dw_err_norm"].append(float(full_w.norm()))
        out["sum_dd"].append(float(dd[:, h].sum()))
        out["frac_dd_pos"].append(float((dd[:, h] > 0).double().mean()))
        out["dd_abs_mean"].append(float(dd[:, h].abs().mean()))
        out["sum_dd_tied"].append(float(dd[:, h, :, 0][tied[:, h]].sum()))
        out["sum_dd_untied"].append(float(dd[:, h, :, 0][~tied[:, h]].sum()))
        out["frac_tied"].append(float(tied[:, h].double().mean()))
        out["sketch_rbar"].append(_sketch(r_bar, proj))
        out["sketch_dterm"].append(_sketch(rhs2, proj))
    out["tol"] = TOL
    out["max_logit"] = float(f.s64.masked_fill(~mask, -math.inf).amax())
    out["dd"] = dd[..., 0].float()                                                   # (B, H, T) for plots
    return out


def _check_shapes(x, w_q, w_k, w_v, do, n_head: int) -> tuple[int, int, int, int]:
    """(B, T, C, D) of `derivation_check`'s inputs, or a ValueError naming the shape that does not fit."""
    if x.dim() != 3 or do.dim() != 4:
        raise ValueError(f"x must be (B, T, C) and do (B, H, T, D); got {tuple(x.shape)}, {tuple(do.shape)}")
    b, t, c = x.shape
    if c % n_head or tuple(w_q.shape) != (c, c) or w_k.shape != w_q.shape or w_v.shape != w_q.shape:
        raise ValueError(f"w_q, w_k, w_v must be ({c}, {c}) with n_head ({n_head}) dividing {c}")
    d = c // n_head
    if tuple(do.shape) != (b, n_head, t, d):
        raise ValueError(f"do must be (B, H, T, D) = {(b, n_head, t, d)}; got {tuple(do.shape)}")
    return b, t, c, d


class _Forwards(NamedTuple):
    """What `derivation_check` compares: the q, k, v (B, H, T, D) and dO the low-precision attention received,
    its dQ under the policy, and the exact forward from the same rounded q, k, v."""

    q_in: torch.Tensor
    k_in: torch.Tensor
    v_in: torch.Tensor
    do64: torch.Tensor  # the dO both sides use, in float64
    dq_full: torch.Tensor  # the policy's whole backward: dQ from A's own forward
    q64: torch.Tensor
    k64: torch.Tensor
    v64: torch.Tensor
    s64: torch.Tensor  # exact scores (B, H, T, T), causal
    dd: torch.Tensor  # Δδ = δ_lp − δ_hp (B, H, T, 1)
    pk: torch.Tensor  # P K (B, H, T, D)


def _forwards(x64, wq64, wk64, wv64, do, policy: Precision, n_head: int, input_dtype, qkv, alpha: float,
              mask) -> _Forwards:
    """The low-precision forward and backward under `policy`, and the exact forward from the same inputs."""
    # the low-precision forward and backward, as A computes them (q, k, v rounded to the input dtype)
    if qkv is None:
        q_in, k_in, v_in = (_heads(x64, w, n_head).to(input_dtype) for w in (wq64, wk64, wv64))
    else:
        q_in, k_in, v_in = (a.detach() for a in qkv)
        if q_in.shape != do.shape or k_in.shape != do.shape or v_in.shape != do.shape:
            raise ValueError(f"qkv must be three tensors of do's shape {tuple(do.shape)}")
        input_dtype = q_in.dtype
    do_in = do.detach().to(input_dtype)  # the dO both sides use (what the attention's backward receives)
    do64 = do_in.double()
    fwd = flash_forward(q_in, k_in, v_in, policy)
    d_lp = delta_lp(do_in, fwd.o, policy).double()                                    # (B, H, T, 1)
    dq_full, _, _ = flash_backward(q_in, k_in, v_in, fwd.o, fwd.lse, do_in, policy)

    # exact forward from the *same* rounded q, k, v (so that only the arithmetic differs)
    q64, k64, v64 = q_in.double(), k_in.double(), v_in.double()
    s64 = (q64 @ k64.transpose(-1, -2) * alpha).masked_fill(~mask, -math.inf)
    p64 = torch.softmax(s64, dim=-1)                                                 # (B, H, T, T)
    o64 = p64 @ v64
    d_hp = (do64 * o64).sum(-1, keepdim=True)                                        # (B, H, T, 1)
    dd = (d_lp - d_hp)                                                               # Δδ (B, H, T, 1)
    pk = p64 @ k64                                                                   # (B, H, T, D)
    return _Forwards(q_in, k_in, v_in, do64, dq_full, q64, k64, v64, s64, dd, pk)


def _autograd_grads(x64, wq64, f: _Forwards, alpha: float, mask, n_head: int, with_lp: bool):
    """(dQ, dW_Q) by autograd in float64 with δ_hp, or with δ_lp (`with_lp`: through the logsumexp term)."""
    wq = wq64.clone().requires_grad_()
    q_lin = _heads(x64, wq, n_head)
    q = f.q64 + (q_lin - q_lin.detach())  # the value A's attention saw (rounded), the gradient of X W_Qᵀ
    q.retain_grad()
    s = (q @ f.k64.transpose(-1, -2) * alpha).masked_fill(~mask, -math.inf)
    objective = (torch.softmax(s, dim=-1) @ f.v64 * f.do64).sum()
    if with_lp:
        objective = objective - (f.dd[..., 0] * torch.logsumexp(s, dim=-1)).sum()
    objective.backward()
    return q.grad, wq.grad


def sketch_matrix(n: int, k: int = SKETCH_DIM, seed: int = 0) -> torch.Tensor:
    """(n, k) fixed Gaussian projection scaled by 1/√k (float64, seeded): ⟨Pa, Pb⟩ ≈ ⟨a, b⟩."""
    if n < 1 or k < 1:
        raise ValueError(f"sketch_matrix: need n, k >= 1 (got {n}, {k})")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)


def _sketch(a: torch.Tensor, proj: torch.Tensor) -> list[float]:
    v = a.reshape(-1).double()
    n = float(v.norm())
    return [float(x) for x in (v / n) @ proj] if n > 0 else [0.0] * proj.shape[1]


def sketch_cos(a, b) -> float:
    """Cosine of two stored sketches (≈ the cosine of the matrices they project)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return _cos(a, b)


def tied_rows(q: torch.Tensor, k: torch.Tensor, alpha: float, mask: torch.Tensor) -> torch.Tensor:
    """(B, H, T) bool: rows whose BF16 scores, as A forms them (QKᵀ rounded to BF16, times α rounded to BF16),
    hold their maximum more than once among the allowed keys."""
    s = (q.double() @ k.double().transpose(-1, -2)).to(torch.bfloat16).double()
    s = (s * alpha).to(torch.bfloat16).double().masked_fill(~mask, -math.inf)
    return (s == s.amax(dim=-1, keepdim=True)).sum(dim=-1) > 1


def delta_term(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, do: torch.Tensor,
               policy: Precision = PAPER_BF16, n_head: int = 1, qkv: tuple | None = None,
               input_dtype=torch.bfloat16) -> dict:
    """Eq. 2's right side alone (no autograd): per head the D × C matrix α Σ_{b,T} Δδ[b,T] (PK)[b,T]ᵀ X[b,T]
    with Δδ = δ under `policy` (from its own forward's O) − the exact δ, and Σ Δδ. The same arithmetic as
    `derivation_check`'s δ-term, cheap enough for every step of a window (`accumulation_run`).
    Returns {"term": (H, D, C) float64, "sum_dd": [H floats]}."""
    return delta_terms(x, w_q, w_k, w_v, do, {"policy": policy}, n_head, qkv, input_dtype)["policy"]


def delta_terms(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, do: torch.Tensor,
                policies: dict, n_head: int = 1, qkv: tuple | None = None, input_dtype=torch.bfloat16) -> dict:
    """`delta_term` for several policies (name → Precision) on the same tensors: the exact softmax, PK and the
    exact δ are computed once and shared; {name: {"term", "sum_dd"}}."""
    if x.dim() != 3 or do.dim() != 4:
        raise ValueError(f"x must be (B, T, C) and do (B, H, T, D); got {tuple(x.shape)}, {tuple(do.shape)}")
    b, t, c = x.shape
    d = c // n_head
    if c % n_head or tuple(do.shape) != (b, n_head, t, d):
        raise ValueError(f"do must be (B, H, T, D) = {(b, n_head, t, d)} with n_head dividing {c}")
    alpha = d ** -0.5
    x64 = x.detach().double()
    if qkv is None:
        qkv = tuple(_heads(x64, w.detach().double(), n_head).to(input_dtype) for w in (w_q, w_k, w_v))
    errors, p64 = _delta_errors(qkv, do, policies)
    pk = p64 @ qkv[1].detach().double()
    out = {}
    for name, dd in errors.items():                                                  # (B, H, T)
        term = alpha * torch.einsum("bht,bhtd,btc->hdc", dd, pk, x64)
        out[name] = {"term": term, "sum_dd": [float(v) for v in dd.sum(dim=(0, 2))]}
    return out


def _delta_errors(qkv: tuple, do: torch.Tensor, policies: dict, sr_key=None) -> tuple[dict, torch.Tensor]:
    """({name: δ under the policy (from its own forward's O) − the exact δ, (B, H, T) float64}, the exact
    softmax P (B, H, T, T) float64), for causal attention of q, k, v (B, H, T, D: their dtype is the input's) and
    dO; `sr_key`: the bits of a stochastic-rounding policy's forward."""
    q_in, k_in, v_in = (a.detach() for a in qkv)
    do_in = do.detach().to(q_in.dtype)
    q64, k64, v64 = q_in.double(), k_in.double(), v_in.double()
    alpha = q_in.shape[-1] ** -0.5
    mask = _causal(q_in.shape[-2], q_in.device)
    p64 = torch.softmax((q64 @ k64.transpose(-1, -2) * alpha).masked_fill(~mask, -math.inf), dim=-1)
    d_hp = (do_in.double() * (p64 @ v64)).sum(-1)                                      # (B, H, T) exact δ
    errors = {}
    for name, policy in policies.items():
        fwd = flash_forward(q_in, k_in, v_in, policy, sr_key=sr_key)
        errors[name] = delta_lp(do_in, fwd.o, policy).double()[..., 0] - d_hp
    return errors, p64


def delta_signature(cap: dict, policy: Precision, sr_key=None) -> dict:
    """The paper's δ error in one captured layer (`capture_layer`), split by the tie at the row maximum: per head,
    Σ (δ_lp − δ_hp) over the rows whose BF16 maximum is tied (`tied_rows`), the same over all rows, and the
    number of tied rows. The paper's mechanism predicts the tied rows' sum to keep one sign (positive in its
    failing layer) step after step; an unbiased rounding, none. δ_lp is the run's own arithmetic (`policy`) on the
    captured q, k, v and dO; `sr_key` gives a stochastic-rounding policy its bits (the caller's, so that the
    diagnostic draws nothing from torch's generators). Returns {"delta_tied", "delta_all", "delta_n_tied"}: H
    floats each."""
    q, k, _ = cap["qkv"]
    errors, _ = _delta_errors(cap["qkv"], cap["do"], {"run": policy}, sr_key)
    dd = errors["run"]                                                                  # (B, H, T)
    tied = tied_rows(q, k, q.shape[-1] ** -0.5, _causal(q.shape[-2], q.device))
    return {"delta_tied": [float(v) for v in (dd * tied).sum(dim=(0, 2))],
            "delta_all": [float(v) for v in dd.sum(dim=(0, 2))],
            "delta_n_tied": [int(v) for v in tied.sum(dim=(0, 2))]}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / max(‖a‖, ‖b‖) (0 when both vanish)."""
    den = max(float(a.norm()), float(b.norm()))
    return float((a - b).norm()) / den if den > 0 else 0.0


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else float("nan")


def capture_layer(model, idx: torch.Tensor, targets: torch.Tensor, layer: int) -> dict:
    """X, W_Q, W_K, W_V and dO of one attention layer of `model` (a `lpfail.model.GPT`) for one batch: X is the
    input of the layer's QKV projection, dO the gradient of the loss with respect to the attention output
    (before c_proj), both from an ordinary forward and backward of the model as it is set up (its attention
    backends, its dtype). Nothing in the model is changed; gradients of its parameters are left as they were."""
    attn = model.transformer.h[layer].attn
    store: dict = {}
    orig = attn.attend

    def attend(q, k, v):
        store["qkv"] = (q.detach().clone(), k.detach().clone(), v.detach().clone())
        y = orig(q, k, v)
        y.retain_grad()
        store["y"] = y
        return y

    def pre(_mod, args):
        store["x"] = args[0].detach().clone()

    handle = attn.register_forward_pre_hook(pre)
    attn.attend = attend
    saved = [p.grad for p in model.parameters()]
    try:
        _, loss = model(idx, targets)
        (y_grad,) = torch.autograd.grad(loss, [store["y"]])
    finally:
        handle.remove()
        del attn.attend
        for p, gr in zip(model.parameters(), saved):
            p.grad = gr
    c = attn.n_embd
    w = attn.c_attn.weight.detach()
    return {"x": store["x"], "w_q": w[:c].clone(), "w_k": w[c:2 * c].clone(), "w_v": w[2 * c:].clone(),
            "do": y_grad.detach().clone(), "qkv": store["qkv"], "n_head": attn.n_head, "loss": float(loss.detach())}


def synthetic_inputs(b: int = 2, t: int = 128, c: int = 64, n_head: int = 1, logit_scale: float = 8.0,
                     seed: int = 0) -> dict:
    """Inputs with large logits and many tied maxima, in float64: X is low-rank (each row one of a few
    combinations of 4 shared directions, plus small noise, so rows repeat and their scores tie), W_K ≈ W_Q
    scaled so that the scores reach tens, W_V random, dO small and random."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(4, c, generator=g, dtype=torch.float64)
    coef = torch.randint(0, 3, (b, t, 4), generator=g).double()  # few distinct rows → ties in S
    x = coef @ basis + 0.05 * torch.randn(b, t, c, generator=g, dtype=torch.float64)
    w_q = torch.randn(c, c, generator=g, dtype=torch.float64) * logit_scale / math.sqrt(c)
    w_k = w_q + 0.1 * torch.randn(c, c, generator=g, dtype=torch.float64) / math.sqrt(c)
    w_v = torch.randn(c, c, generator=g, dtype=torch.float64) / math.sqrt(c)
    do = 1e-2 * torch.randn(b, n_head, t, c // n_head, generator=g, dtype=torch.float64)
    return {"x": x, "w_q": w_q, "w_k": w_k, "w_v": w_v, "do": do, "n_head": n_head}


def accumulation_toy(bias: float = 0.5, rank: int = 1, steps: int = 1000, d: int = 16, noise: float = 0.3,
                     reps: int = 64, seed: int = 0) -> dict:
    """Chapter 3's toy of Eq. 3 over steps: each step adds Σ_T c_T r_T to an error matrix, with rank-one-like terms
    r_T = R_k + noise around one of `rank` shared unit directions R_k (d × d), and coefficients c_T of mean `bias`
    and standard deviation 1 (32 tokens per step). Returns the root-mean-square over `reps` independent runs of
    the accumulated error's norm after each step, and its fitted growth exponent: ≈ 1 (∝ K) when biased, ≈ ½
    (∝ √K, a random walk) when `bias` = 0."""
    if steps < 10 or rank < 1 or d < 2 or reps < 1:
        raise ValueError("accumulation_toy: need steps >= 10, rank >= 1, d >= 2, reps >= 1")
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(rank, d * d, generator=g, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)                                        # (rank, d·d) unit
    tokens = 32
    incs = []
    for s0 in range(0, steps, 64):  # the steps' increments, 64 steps at a time (memory), summed below
        n = min(64, steps - s0)
        k = torch.randint(0, rank, (n, reps, tokens), generator=g)
        terms = dirs[k] + noise * torch.randn(n, reps, tokens, d * d, generator=g, dtype=torch.float64) / d
        c = bias + torch.randn(n, reps, tokens, generator=g, dtype=torch.float64)
        incs.append(torch.einsum("srt,srtj->srj", c, terms))                           # (n, reps, d·d)
    err = torch.cat(incs).cumsum(dim=0)                                                  # (steps, reps, d·d)
    norms = err.norm(dim=2).pow(2).mean(dim=1).sqrt()                                    # RMS over runs
    ks = torch.arange(1, steps + 1, dtype=torch.float64)
    tail = slice(steps // 10, None)  # fit log‖E‖ = a + p·log K after the first tenth
    lx, ly = ks[tail].log(), norms[tail].log()
    p = float(((lx - lx.mean()) * (ly - ly.mean())).sum() / ((lx - lx.mean()) ** 2).sum())
    return {"norm": norms.numpy(), "k": ks.numpy(), "exponent": p, "bias": bias, "rank": rank}


# -- chapter 3's item 3: is the accumulated δ error coherent? (`experiments.gradient_error.accumulation_run`) ------
def coherence_ratio(norm, norm_signs):
    """ρ_K = ‖E_K‖ / RMS over random signs of ‖Σ_{k≤K} ±t_k‖, per K (rows) and head (columns).

    `norm` (K, H): ‖E_K‖ of the accumulated terms t_k as they are; `norm_signs` (K, H): the root-mean-square
    norm of the same terms summed with random signs, ≈ √(Σ_{k≤K} ‖t_k‖²) (E‖Σ ±t_k‖² = Σ ‖t_k‖²). So ρ_K
    removes the terms' own growth: it stays of order 1 when the terms' directions are incoherent (or their
    signs unbiased), and grows like √K when they share one direction with one sign (ρ_K = √K for K equal,
    parallel terms), whatever the terms' sizes do over the window."""
    import numpy as np

    n, s = np.asarray(norm, dtype=np.float64), np.asarray(norm_signs, dtype=np.float64)
    if n.ndim != 2 or n.shape != s.shape or n.shape[0] < 1:
        raise ValueError(f"coherence_ratio: need two (K, H) arrays of one shape (got {n.shape}, {s.shape})")
    if not (np.isfinite(n).all() and np.isfinite(s).all()) or (s <= 0).any() or (n < 0).any():
        raise ValueError("coherence_ratio: norms must be finite, ≥ 0, and the random-sign norms > 0")
    return n / s


def coherence_exponent(rho) -> list[float]:
    """Per head, the slope of log ρ_K against log K after the first tenth of the window (as the accumulation's
    exponents are fitted): ≈ 0 for incoherent terms, ≈ ½ for a shared direction with one sign."""
    import numpy as np

    r = np.asarray(rho, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] < 10 or not (r > 0).all():
        raise ValueError(f"coherence_exponent: need a (K ≥ 10, H) array of positive ratios (got {r.shape})")
    return tail_slopes(r)


def tail_slopes(y) -> list[float]:
    """Per column of y (K, H), all > 0: the slope of log y_K against log K, fitted after the first tenth of the
    K values (the growth exponent; `coherence_exponent`, `accumulation_run`)."""
    import numpy as np

    y = np.asarray(y, dtype=np.float64)
    ks = np.arange(1, y.shape[0] + 1)
    tail = slice(max(1, y.shape[0] // 10), None)
    lx = np.log(ks[tail])
    return [float(np.polyfit(lx, np.log(y[tail, h]), 1)[0]) for h in range(y.shape[1])]


def term_sizes(norm_signs):
    """(K, H) sizes a_k ≈ ‖t_k‖ of the accumulated terms, from the random-sign RMS norms (≈ √(Σ_{k≤K} a_k²)):
    a power law c·K^p fitted to them per head (log–log, after the first tenth, as the exponents are), and
    a_k² = c²(k^{2p} − (k−1)^{2p}). The raw increments of the squared norms are too noisy with 16 sign draws
    (often negative) to use one by one."""
    import numpy as np

    s = np.asarray(norm_signs, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 10 or not (s > 0).all():
        raise ValueError(f"term_sizes: need a (K >= 10, H) array of positive norms (got {s.shape})")
    ks = np.arange(1, s.shape[0] + 1, dtype=np.float64)
    tail = slice(max(1, s.shape[0] // 10), None)
    out = np.empty_like(s)
    for h in range(s.shape[1]):
        p, logc = np.polyfit(np.log(ks[tail]), np.log(s[tail, h]), 1)
        out[:, h] = np.exp(logc) * np.sqrt(np.clip(ks ** (2 * p) - (ks - 1) ** (2 * p), 0, None))
    return out


def coherent_ratio(norm_signs):
    """(K, H): ρ_K if every term pointed along one direction with one sign, for the terms' sizes (`term_sizes`):
    Σ a_k / √(Σ a_k²), which is √K for equal sizes and less when a few late terms dominate."""
    import numpy as np

    a = term_sizes(norm_signs)
    return np.cumsum(a, axis=0) / np.sqrt(np.cumsum(a ** 2, axis=0))


def coherence_null(norm_signs, n_signs: int = 16, reps: int = 2000, q=(0.025, 0.975), seed: int = 0):
    """The band of ρ_K that unbiased signs give, for the widest case: all terms along one direction (for orthogonal
    terms ρ_K = 1 exactly). With the terms' sizes a_k (`term_sizes`), each of `reps` draws sums them with random
    signs (the "observed" sum) and divides by the RMS of `n_signs` further random-sign sums (as
    `accumulation_run` estimates the denominator). Returns (lo, hi), each (K, H): the `q` quantiles at each K."""
    import numpy as np

    s = np.asarray(norm_signs, dtype=np.float64)
    if n_signs < 1 or reps < 10:
        raise ValueError("coherence_null: need n_signs >= 1, reps >= 10")
    a = term_sizes(s)
    rng = np.random.default_rng(seed)
    lo, hi = np.empty_like(s), np.empty_like(s)
    for h in range(s.shape[1]):
        signs = rng.choice((-1.0, 1.0), size=(reps, n_signs + 1, s.shape[0]))
        sums = np.abs(np.cumsum(signs * a[:, h], axis=2))                       # (reps, 1 + n_signs, K)
        den = np.sqrt((sums[:, 1:] ** 2).mean(axis=1))
        rho = sums[:, 0] / np.where(den > 0, den, np.inf)
        lo[:, h], hi[:, h] = np.quantile(rho, q[0], axis=0), np.quantile(rho, q[1], axis=0)
    return lo, hi
