"""Muon for the hidden matrices, AdamW for everything else, in one `torch.optim.Optimizer`.

Used by `lpfail.train` when ``TrainConfig.optimizer == "muon"`` (issue 3 sweeps the optimizer as one of the
axes of the small-scale failure search). References: K. Jordan et al., "Muon: an optimizer for hidden layers
in neural networks" (2024 blog post; the quintic Newton–Schulz coefficients below are theirs), and
Loshchilov & Hutter, "Decoupled weight decay regularization" (AdamW). Written for this project.

Muon, for a 2-D weight W with gradient G (one step)::

    M ← μ·M + G                          momentum buffer
    U ← G + μ·M  (Nesterov) or M
    O ← NS(U) ≈ U (UᵀU)^(-1/2)           the nearest semi-orthogonal matrix: every singular value → ≈ 1
    W ← W·(1 − lr·wd) − lr·√max(1, rows/cols)·O

NS is five steps of X ← a·X + (b·A + c·A²)·X with A = X Xᵀ, started from X = U / ‖U‖_F, with (a, b, c) =
(3.4445, −4.7750, 2.0315): a quintic chosen to push small singular values up fast; it leaves them in about
[0.7, 1.2] rather than exactly at 1, which is enough. It runs in BF16 on CUDA (as Muon's authors do) and in
FP32 on the CPU (where BF16 matmuls are slow).

The other parameters (embeddings, the tied output head, LayerNorm gains) get plain AdamW, written out here
so that the two halves share one state dict (checkpoints resume bit-exactly).
"""
from __future__ import annotations

import math

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)


@torch.no_grad()
def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None,
                  eps: float = 1e-7) -> torch.Tensor:
    """The Newton–Schulz approximation of U Vᵀ for g = U Σ Vᵀ (2-D), returned in g's dtype."""
    if g.ndim != 2:
        raise ValueError(f"orthogonalize takes a matrix (got shape {tuple(g.shape)})")
    a, b, c = NS_COEFFS
    dtype = dtype or (torch.bfloat16 if g.is_cuda else torch.float32)
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # iterate on the wide orientation: A = X Xᵀ is the smaller square
    x = x / (x.norm() + eps)  # spectral norm ≤ Frobenius norm ≤ 1: inside NS's basin
    for _ in range(steps):
        A = x @ x.T  # (r, r)
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if tall:
        x = x.T
    return x.to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Muon on param groups marked ``muon=True`` (2-D weights), AdamW on the others.

    Group keys: all groups ``lr``, ``weight_decay``; Muon groups ``momentum``, ``nesterov``, ``ns_steps``;
    AdamW groups ``betas``, ``eps``. Build the groups with `muon_param_groups`.
    """

    def __init__(self, param_groups, lr: float = 0.02):
        super().__init__(param_groups, dict(lr=lr, weight_decay=0.0, muon=False, momentum=0.95,
                                            nesterov=True, ns_steps=5, betas=(0.9, 0.95), eps=1e-8))
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon groups take 2-D weights only; put the others in an AdamW group")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if group["muon"]:
                    if not state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"]
                    mu = group["momentum"]
                    buf.mul_(mu).add_(g)
                    u = g.add(buf, alpha=mu) if group["nesterov"] else buf
                    o = orthogonalize(u, group["ns_steps"])
                    scale = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
                    p.mul_(1.0 - lr * wd)
                    p.add_(o, alpha=-lr * scale)
                else:
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    b1, b2 = group["betas"]
                    state["step"] += 1
                    t = state["step"].item()
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    m.lerp_(g, 1.0 - b1)
                    v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                    denom = (v.sqrt() / math.sqrt(1.0 - b2 ** t)).add_(group["eps"])
                    p.mul_(1.0 - lr * wd)
                    p.addcdiv_(m, denom, value=-lr / (1.0 - b1 ** t))
        return loss


def muon_param_groups(model: torch.nn.Module, muon_lr: float, adam_lr: float, weight_decay: float,
                      momentum: float, ns_steps: int, betas: tuple[float, float], eps: float) -> list[dict]:
    """Muon for the 2-D weights inside the transformer blocks (attention and MLP projections); AdamW for the
    embeddings (and so the tied head) and the LayerNorm gains. Weight decay on 2-D tensors only."""
    hidden, matrices, vectors = [], [], []
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        if p.ndim == 2 and ".h." in f".{name}":
            hidden.append(p)
        elif p.ndim >= 2:
            matrices.append(p)
        else:
            vectors.append(p)
    groups = [dict(params=hidden, muon=True, lr=muon_lr, weight_decay=weight_decay, momentum=momentum,
                   nesterov=True, ns_steps=ns_steps)]
    for params, wd in ((matrices, weight_decay), (vectors, 0.0)):
        if params:
            groups.append(dict(params=params, muon=False, lr=adam_lr, weight_decay=wd, betas=tuple(betas),
                               eps=eps))
    return groups
