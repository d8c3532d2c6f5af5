"""Muon for the hidden matrices, AdamW for everything else: `torch.optim.Muon` and `torch.optim.AdamW` behind
one optimizer-like object, `MuonAdamW`.

Used by `lpfail.train` when ``TrainConfig.optimizer == "muon"`` (chapter 1's symptom search sweeps the
optimizer as one of the axes of the small-scale failure search). References: K. Jordan et al., "Muon: an
optimizer for hidden layers in neural networks" (2024 blog post), and Loshchilov & Hutter, "Decoupled weight decay
regularization" (AdamW).

Which parameter gets which (`muon_param_groups`): Muon takes the 2-D weights inside the transformer blocks
(attention and MLP projections); AdamW takes the embeddings (and so the tied head) and the LayerNorm gains.
Weight decay on 2-D tensors only.

The TrainConfig knobs, as passed to torch (every argument explicit, torch's defaults are not ours)::

    Muon   lr=muon_lr, momentum=muon_momentum, ns_steps=ns_steps, weight_decay=weight_decay (torch's default
           is 0.1), nesterov=True, adjust_lr_fn=None (Keller Jordan's √max(1, rows/cols) scale, not Moonshot's
           "match_rms_adamw" 0.2·√max(rows, cols)), NS coefficients and eps (1e-7) torch's defaults
    AdamW  lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay on matrices and 0 on vectors

torch's Muon, for a 2-D weight W with gradient G (one step)::

    B ← μ·B + (1 − μ)·G                  momentum buffer (an average)
    U ← (1 − μ)·G + μ·B  (Nesterov)
    O ← NS(U) ≈ U (UᵀU)^(-1/2)           the nearest semi-orthogonal matrix: every singular value → ≈ 1
    W ← W·(1 − lr·wd) − lr·√max(1, rows/cols)·O

NS is five steps of X ← a·X + (b·A + c·A²)·X with A = X Xᵀ on the wide orientation, started from
X = U / max(‖U‖_F, eps), with (a, b, c) = (3.4445, −4.7750, 2.0315): a quintic that pushes small singular
values up fast and leaves them in about [0.7, 1.2] rather than exactly at 1.

Differences from the hand-written Muon this module held before (same algorithm; not the same bits):

- the momentum buffer is an average, B = (1 − μ)·M of the former sum M ← μ·M + G, so U is (1 − μ) times the
  former U. NS divides by ‖U‖_F first, so the update O is the same up to rounding and the eps term
  (max(‖U‖, eps) here, ‖U‖ + eps before);
- NS runs in BF16 on every device (the former one used BF16 on CUDA but FP32 on the CPU), and O is added to
  the FP32 weight from BF16;
- depending on the torch version, the NS step is fused into ``addmm`` calls or written as separate products
  (``use_addmm``, not passed here: torch 2.11 and 2.13 differ in whether they take it);
- the √max(1, rows/cols) scale, the decoupled weight decay W·(1 − lr·wd) and the NS coefficients are unchanged.

Runs made before this change (none is stored: every stored result trained with AdamW) would not repeat bit for
bit, and their checkpoints (one optimizer state dict) do not load into `MuonAdamW` (a ``{"muon", "adamw"}``
pair): `MuonAdamW.load_state_dict` says so.
"""
from __future__ import annotations

import torch


class MuonAdamW:
    """`torch.optim.Muon` on the param groups marked ``muon=True`` (2-D weights), `torch.optim.AdamW` on the
    others, used as one optimizer: `param_groups` (both optimizers' groups, Muon's first, each still marked with
    ``muon`` and carrying any extra key such as ``base_lr``; setting ``g["lr"]`` changes that optimizer's lr),
    `step`, `zero_grad`, and `state_dict` / `load_state_dict` as ``{"muon": ..., "adamw": ...}``, both halves
    checkpointed, so a resumed run is bit-identical to an uninterrupted one.

    Each group carries its own hyper-parameters (build them with `muon_param_groups`); the keyword arguments are
    only the defaults for keys a group leaves out.
    """

    def __init__(self, param_groups, *, lr: float = 0.02, adam_lr: float = 1e-3, weight_decay: float = 0.0,
                 momentum: float = 0.95, ns_steps: int = 5, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8):
        groups = [dict(g) for g in param_groups]
        muon = [g for g in groups if g.get("muon")]
        adamw = [g for g in groups if not g.get("muon")]
        for g in muon:
            if any(p.ndim != 2 for p in g["params"]):
                raise ValueError("Muon groups take 2-D weights only; put the others in an AdamW group")
        self.muon = torch.optim.Muon(muon, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=True,
                                     ns_steps=ns_steps, adjust_lr_fn=None) if muon else None
        self.adamw = torch.optim.AdamW(adamw, lr=adam_lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay) if adamw else None
        for g in self.param_groups:
            g["muon"] = bool(g.get("muon"))

    def _parts(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return [(name, opt) for name, opt in (("muon", self.muon), ("adamw", self.adamw)) if opt is not None]

    @property
    def param_groups(self) -> list[dict]:
        """The underlying optimizers' group dicts themselves (a new list each time: `load_state_dict` replaces
        them)."""
        return [g for _, opt in self._parts() for g in opt.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, opt in self._parts():
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._parts():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self._parts()}

    def load_state_dict(self, state_dict: dict) -> None:
        names = [name for name, _ in self._parts()]
        if set(state_dict) != set(names):
            raise ValueError(f"MuonAdamW.load_state_dict takes a dict of {names} (got keys {sorted(state_dict)}): "
                             "a checkpoint of the hand-written Muon optimizer before torch.optim.Muon, or of "
                             "AdamW alone, cannot be resumed under optimizer='muon'")
        for name, opt in self._parts():
            opt.load_state_dict(state_dict[name])

    def __repr__(self) -> str:
        return f"MuonAdamW({', '.join(f'{name}={opt!r}' for name, opt in self._parts())})"


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
    groups = []
    if hidden:
        groups.append(dict(params=hidden, muon=True, lr=muon_lr, weight_decay=weight_decay, momentum=momentum,
                           nesterov=True, ns_steps=ns_steps))
    for params, wd in ((matrices, weight_decay), (vectors, 0.0)):
        if params:
            groups.append(dict(params=params, muon=False, lr=adam_lr, weight_decay=wd, betas=tuple(betas),
                               eps=eps))
    return groups
