"""How the kernels are scheduled, never what they compute: `Tuning` and the tunings the package names
(`ALL_LEVERS`, `NEXT_LEVERS`, `DEFAULT_TUNING`). The autotune spaces it selects are in `fwd.py` and `bwd.py`."""
from __future__ import annotations

from dataclasses import dataclass, fields


def cached_hash(self) -> int:
    """A frozen dataclass's hash over its fields, computed once and kept on the instance (`KernelPolicy` and `Tuning`
    key every launch's caches); a class takes it with ``__hash__ = cached_hash``."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, f.name) for f in fields(self)))
        object.__setattr__(self, "_hash", h)
    return h


def state_without_hash(self) -> dict:
    """The pickled state of a `cached_hash` class: without the kept hash (a pickle must not carry this process's
    string hashes)."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class Tuning:
    """How the kernels are scheduled and tuned, never what they compute (speed levers, measured side by side by
    ``tools/gpu_kernels_tune.py``). Every lever keeps O and L bit for bit, except where said:

    * ``tma``      read Q, K, V (and dO in the backward) and write O through Hopper tensor descriptors
                   (`tl.make_tensor_descriptor`: the tensor memory accelerator copies whole tiles) instead of
                   pointer tiles and cp.async; tensors that are not 16-byte aligned run without it. ``"bwd"``: in
                   the backward only (measured: TMA sped up the d 64 backward by 5–10 % and slowed the d 64
                   forward at N ≤ 2k by 12–18 %; notes/kernels.md).
    * ``space``    the autotune space: ``"v1"`` (6 forward, 3 + 3 backward configs: the first space, and ``Tuning()``'s)
                   or ``"sm90"`` (v1 plus deeper pipelines, 256-row forward tiles at head dim ≤ 64 and configs
                   capped at 128 registers per thread; `fwd.FWD_SPACES`, `bwd.DKDV_SPACES` of this package).
                   The backward's FP32 sums follow its tiles: gradients change in their last bits with the pick.
    * ``order``    the causal grid order: ``"head"`` (the longest query blocks first within each (batch, head))
                   or ``"lpt"`` (longest first over all heads, in the forward and both backward kernels).
    * ``bwd``      ``"split"``: a dK/dV kernel and a dQ kernel, no atomics (7 matmuls per tile pair,
                   deterministic); ``"atomic"``: one kernel adds dQ into an FP32 buffer with atomics (5 matmuls,
                   FlashAttention-2's way; dQ's last FP32 bits vary run to run). Needs ``grad_acc="fp32"``;
                   ``"fused"``: the split backward's two halves in one launch, no atomics — program j makes dK_j,
                   dV_j and then dQ_j, which under the causal mask gives every program the same work (n + 1
                   blocks); the bits of the split backward with the same tiles (deterministic, any grad_acc);
                   ``"dq_atomic"``: the five-matmul backward (`bwd.launch_dq_atomic`): dQ's partials added into
                   an FP32 buffer by TMA reduce-add where descriptors are on (``tma``), else pointer atomics, and
                   an epilogue kernel; not deterministic, so it gives way to ``"fused"`` under
                   `deterministic` and for a 16-bit grad_acc (which it cannot round as the policy says).
    * ``tie``      the fix's tie test: ``"max2"`` (a (max, second max) reduction) or ``"count"`` (a count of the
                   scores at or above r_m − ε after the max, no second running value); same m' bit for bit;
                   ``"auto"``: count at head dim ≤ 64, max2 above (the cheaper form for each as measured on a GPU,
                   with both fixes). The two-pass emulation path (policy blocks > 128
                   keys) always uses max2.
    * ``ftz_exp``  the backward's P = exp(S − L) in sub mode through ex2.approx.ftz (the forward's and FMA mode's
                   exp already are): three instructions fewer per score; P below 2^−126 becomes 0.
    """

    tma: bool | str = False
    space: str = "v1"
    order: str = "head"
    bwd: str = "split"
    tie: str = "max2"
    ftz_exp: bool = False

    _CHOICES = {"space": ("v1", "sm90"), "order": ("head", "lpt"), "bwd": ("split", "atomic", "fused", "dq_atomic"),
                "tie": ("max2", "count", "auto")}

    __hash__ = cached_hash            # computed once: it keys every launch's caches
    __getstate__ = state_without_hash

    def __post_init__(self):
        for name, allowed in self._CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Tuning.{name} must be one of {list(allowed)} (got {getattr(self, name)!r})")
        if not isinstance(self.tma, bool) and self.tma != "bwd":
            raise ValueError(f"Tuning.tma must be True, False or 'bwd' (got {self.tma!r})")
        if not isinstance(self.ftz_exp, bool):
            raise ValueError(f"Tuning.ftz_exp must be True or False (got {self.ftz_exp!r})")

    def __str__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) != f.default]
        return ",".join(parts) or "default"

    @classmethod
    def parse(cls, text: str) -> "Tuning":
        """Inverse of ``str(tuning)`` ("default", or "tma=True,space=sm90,…"); unknown keys raise ValueError."""
        if text.strip() in ("", "default"):
            return cls()
        kw, names = {}, [f.name for f in fields(cls)]
        for item in text.split(","):
            key, _, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if key not in names:
                raise ValueError(f"unknown Tuning key {key!r} in {text!r}; valid keys: {names}")
            kw[key] = {"True": True, "False": False}.get(value, value) if key in ("tma", "ftz_exp") else value
        return cls(**kw)


#: Every lever on (measured lever by lever: the LPT order and the atomic backward lost; notes/kernels.md).
ALL_LEVERS = Tuning(tma=True, space="sm90", order="lpt", bwd="atomic", tie="count", ftz_exp=True)
#: The levers that did not lose in ALL_LEVERS's measurement (TMA in the backward only, the sm90 space, the FTZ exp)
#: and the ones added after it (the fused backward, the tie test's form chosen per head dim); not the LPT order or
#: the atomic backward, which lost (notes/kernels.md).
NEXT_LEVERS = Tuning(tma="bwd", space="sm90", bwd="fused", tie="auto", ftz_exp=True)
#: What every call runs unless it passes ``tuning=``: NEXT_LEVERS (in the subtract form, the drop-in's arithmetic,
#: it ran fwd+bwd 16–27 % faster than ``Tuning()`` at N ≥ 2k in both tuning measurements; notes/kernels.md).
#: ``Tuning()`` (every lever off) is the kernels as first written, before any lever; ``str(tuning)``
#: and `Tuning.parse` name fields against ``Tuning()``, so "default" is that, not DEFAULT_TUNING.
DEFAULT_TUNING = NEXT_LEVERS
