"""What one step computes, and the settings it runs under: deterministic numerics without TF32
(`deterministic_numerics`), the process group (`Dist`), the optimizer and its learning-rate schedule
(`build_optimizer`, `lr_factor`), the loss (`_loss`, `cross_entropy`, `z_loss_term`), the step itself in its two
forms (`EagerStep`, and `CapturedStep`: the same kernels replayed from one CUDA graph), the diagnostics and the
held-out loss, and which errors count as non-finite values met in a step (`nonfinite_error`). Part of
`lpfail.train`.

Both forms of the step drive the model's stochastic-rounding stream (`lpfail.sr_stream.SRStream`, the GPT's
``sr_stream``) the same way: before each micro-batch's forward its global index (rank · micro-batches + i) is set
as a Python int — the same value the eager step uses is baked into the captured graph — and after the step its
step buffer is advanced in place, so every replay of a captured graph reads the current step. The bits of an
"sr" policy's roundings are therefore the same captured or not, and a run resumed from a checkpoint (which holds
the step buffer) continues the stream."""
from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass

import numpy as np
import torch

from lpfail.attention import NonFiniteInputError
from lpfail.model import GPT, head_query_norms, logit_capture, weight_spectral_norms
from lpfail.train.batches import step_rows
from lpfail.train.config import TrainConfig
from lpfail.train.log import DELTA_KEYS


@dataclass
class Dist:
    """The process group a run is in: its rank, world size and local rank (1 process without torchrun)."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    created: bool = False  # whether train() initialized the process group (and so destroys it)

    @classmethod
    def from_env(cls, use_cuda: bool) -> "Dist":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if use_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                device_id=torch.device("cuda", local) if use_cuda else None)
        return cls(rank, world, local, created=True)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()


@contextlib.contextmanager
def deterministic_numerics(cfg: TrainConfig, device: torch.device):
    """Deterministic algorithms (restored afterwards) and no TF32 for FP32 matmuls."""
    was_det = torch.are_deterministic_algorithms_enabled()
    was_prec = torch.get_float32_matmul_precision()
    was_cudnn = torch.backends.cudnn.allow_tf32
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS' reproducible workspace
        torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("highest")  # FP32 matmuls in FP32, not TF32 (the paper: TF32 off)
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_det)
        torch.set_float32_matmul_precision(was_prec)
        torch.backends.cudnn.allow_tf32 = was_cudnn


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of the peak lr at `step`: linear warm-up to 1, then 1 or a cosine to min_lr / lr."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    floor = cfg.min_lr / cfg.lr
    end = cfg.decay_steps or cfg.max_steps
    progress = min(1.0, (step - cfg.warmup) / max(1, end - cfg.warmup))
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module):
    """The optimizer `cfg` names (AdamW, or Muon on the hidden matrices with AdamW on the rest) over `model`."""
    if cfg.optimizer == "muon":
        from lpfail.optim import muon_param_groups

        groups = muon_param_groups(model, cfg.muon_lr, cfg.lr, cfg.weight_decay, cfg.muon_momentum,
                                   cfg.ns_steps, (cfg.beta1, cfg.beta2), cfg.eps)
    else:
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        groups = [dict(params=decay, weight_decay=cfg.weight_decay), dict(params=no_decay, weight_decay=0.0)]
        groups = [g for g in groups if g["params"]]
    for g in groups:
        g["base_lr"] = cfg.muon_lr if g.get("muon") else cfg.lr
    if cfg.optimizer == "muon":
        from lpfail.optim import MuonAdamW
        return MuonAdamW(groups, lr=cfg.muon_lr, adam_lr=cfg.lr, weight_decay=cfg.weight_decay,
                         momentum=cfg.muon_momentum, ns_steps=cfg.ns_steps, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    capturable = cfg.cuda_graph and any(p.is_cuda for p in model.parameters())
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, capturable=capturable)
    if capturable:
        device_lr(opt)
    return opt


def device_lr(optimizer):
    """Each group's lr as a 0-d FP32 tensor on the parameters' device (what a captured step reads)."""
    for g in optimizer.param_groups:
        g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=g["params"][0].device)


def set_lr(group: dict, value: float):
    """Set a parameter group's learning rate (a tensor lr in place)."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)  # in place: a captured graph reads this memory
    else:
        group["lr"] = value


def apply_hparams(cfg: TrainConfig, optimizer):
    """The config's hyper-parameters in every group (after loading a checkpoint made under another config)."""
    for g in optimizer.param_groups:
        g["base_lr"] = cfg.muon_lr if g.get("muon") else cfg.lr
        if g.get("muon"):
            g.update(momentum=cfg.muon_momentum, ns_steps=cfg.ns_steps)
        else:
            g.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        g["weight_decay"] = cfg.weight_decay if any(p.ndim >= 2 for p in g["params"]) else 0.0


def _clip(cfg: TrainConfig) -> float:
    return cfg.grad_clip if cfg.grad_clip > 0 else math.inf  # 0: no clipping (the norm is still computed)


def _loss(cfg: TrainConfig, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if cfg.loss_impl == "written":
        loss = cross_entropy(logits, y)
    else:
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())  # FP32 like `cross_entropy`
    if cfg.z_loss:
        loss = loss + z_loss_term(logits, cfg.z_loss)
    return loss


def z_loss_term(logits: torch.Tensor, coef: float) -> torch.Tensor:
    """coef · mean over positions of (log Σ exp logits)², in FP32: the z-loss (Chowdhery et al. 2022, PaLM),
    which keeps the output softmax's normaliser near 1. A non-precision control in experiment `cures`."""
    return coef * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in FP32, as logsumexp − the target's logit (`loss_impl="written"`).
    Written out because PyTorch's documentation lists NLLLoss on CUDA among the operations that may raise
    under torch.use_deterministic_algorithms; on the H200 with torch 2.11, F.cross_entropy ran and repeated
    bit for bit there (results/train_speed.json), so it is the default and this is the fallback."""
    logits = logits.float()  # (b, T, vocab): the loss of a BF16 model is still taken in FP32
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (b, T)
    return (torch.logsumexp(logits, dim=-1) - picked).mean()


def _sr_stream(model):
    """The model's stochastic-rounding stream (through a DDP wrapper), or None for a model without one."""
    return getattr(getattr(model, "module", model), "sr_stream", None)


def _set_micro(stream, index: int) -> None:
    if stream is not None:
        stream.micro = index


def _advance(stream) -> None:
    if stream is not None:
        stream.advance()


class EagerStep:
    """One training step as plain PyTorch runs it: forward and backward over this rank's micro-batches (DDP
    all-reduces the gradients after the last one only), the loss averaged over micro-batches and ranks, the
    gradient norm before clipping, the clip. The update is the loop's (after its non-finite check)."""

    def __init__(self, model, raw: GPT, params, cfg: TrainConfig, n_micro: int, micro: int, dist: Dist, device,
                 amp):
        self.model, self.raw, self.params, self.cfg = model, raw, params, cfg
        self.n_micro, self.micro, self.dist, self.device, self.amp = n_micro, micro, dist, device, amp

    def run(self, tokens, offsets, capture: bool) -> tuple[float, float, object]:
        """(loss, gradient norm, the logit capture of the first micro-batch when `capture`, else None)."""
        cfg, model, n_micro, micro, device, amp = self.cfg, self.model, self.n_micro, self.micro, self.device, self.amp
        world = self.dist.world
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        cap_rec = None
        stream = _sr_stream(self.raw)
        for i in range(n_micro):
            _set_micro(stream, self.dist.rank * n_micro + i)
            x, y = step_rows(tokens, offsets[i * micro:(i + 1) * micro], cfg.block_size)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sync = model.no_sync() if (world > 1 and i < n_micro - 1) else contextlib.nullcontext()
            with sync:
                with amp:
                    logits, _ = model(x)  # (b, T, vocab)
                loss = _loss(cfg, logits, y)
                (loss / n_micro).backward()
            loss_sum += loss.detach().double()
            if capture and i == 0:
                cap_rec = capture_logits(self.raw, x, cfg, amp)
        loss_t = self.dist.all_sum(loss_sum) / (n_micro * world)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, _clip(cfg), foreach=True)
        _advance(stream)
        return loss_t.item(), grad_norm.item(), cap_rec


#: Eager steps before a step is captured as a CUDA graph (torch.cuda.graphs: warm up on a side stream first).
GRAPH_WARMUP = 3


def capture_logits(raw: GPT, x: torch.Tensor, cfg: TrainConfig, amp):
    """The diagnostic forward pass of a step: logit statistics of its first `diag_rows` sequences."""
    with torch.no_grad(), amp, logit_capture(raw) as cap:
        raw(x[:cfg.diag_rows])
    return cap


class CapturedStep:
    """One training step — forward and backward over the micro-batches, the loss, the clip, the AdamW update —
    captured once as a CUDA graph and replayed for every later step, with the batch copied into static
    inputs first. Same kernels in the same order as the eager step, so the same bits."""

    def __init__(self, model, optimizer, params, cfg: TrainConfig, n_micro: int, micro: int, device, amp):
        self.n_micro, self.micro, self.T = n_micro, micro, cfg.block_size
        self.x = torch.zeros((n_micro, micro, cfg.block_size), dtype=torch.long, device=device)
        self.y = torch.zeros_like(self.x)
        optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients itself
        self.stream = _sr_stream(model)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for i in range(n_micro):
                _set_micro(self.stream, i)  # one process (rank 0): the eager step's index
                with amp:
                    logits, _ = model(self.x[i])  # (b, T, vocab)
                loss = _loss(cfg, logits, self.y[i])
                (loss / n_micro).backward()
                loss_sum += loss.detach().double()
            self.loss = loss_sum / n_micro
            self.grad_norm = torch.nn.utils.clip_grad_norm_(params, _clip(cfg), foreach=True)
            optimizer.step()

    def run(self, tokens, offsets) -> tuple[float, float]:
        for i in range(self.n_micro):
            x, y = step_rows(tokens, offsets[i * self.micro:(i + 1) * self.micro], self.T)
            self.x[i].copy_(x)
            self.y[i].copy_(y)
        self.graph.replay()
        _advance(self.stream)
        return self.loss.item(), self.grad_norm.item()


def delta_record(raw: GPT, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, step: int, amp) -> dict:
    """The δ signature of every layer (`lpfail.gradient_error.delta_signature`) on the rows x → y, under the run's
    reference policy, with the weights the step is about to use: {"delta_tied", "delta_all", "delta_n_tied"}, each
    (layers, heads). A stochastic-rounding policy draws its bits from a key of the run's seed and the step, so the
    diagnostic takes nothing from any generator; the model's gradients are left as they were."""
    from lpfail.gradient_error import capture_layer, delta_signature
    from lpfail.sr_stream import RoundingKey

    policy = cfg.attention_table()[0][2].policy
    key = RoundingKey(cfg.init_seed, step, (DELTA_SITE,))
    out: dict[str, list] = {k: [] for k in DELTA_KEYS}
    for layer in range(len(raw.transformer.h)):
        with amp:
            cap = capture_layer(raw, x, y, layer)
        sig = delta_signature(cap, policy, key.at(layer))
        for k in out:
            out[k].append(sig[k])
    return out


#: The call-site word of the δ signature's stochastic roundings (no attention call of the model uses it).
DELTA_SITE = 0xDE17A


def diagnostics(model: GPT, cap) -> dict:
    """One diagnostic record: weight spectral norms, per-head query norms and, from `cap`, the logit statistics."""
    hq = head_query_norms(model)
    rec = {"spectral": weight_spectral_norms(model), "wq": hq["wq"].tolist(), "wqk": hq["wqk"].tolist()}
    if cap is not None:
        st = cap.stats()
        rec.update(max_logit=st.max_logit.tolist(), tied_frac=st.tied_frac.tolist(),
                   max_logit_per_head=st.max_logit_per_head.tolist(),
                   tied_frac_per_head=st.tied_frac_per_head.tolist(), diag_rows=st.rows)
    return rec


@torch.no_grad()
def validation_loss(model, val_tokens: np.ndarray, offsets: np.ndarray, cfg: TrainConfig, rows: int, device,
                    amp) -> float:
    """Mean next-token cross-entropy (nats per token, FP32 loss of the model's own arithmetic) over the
    validation windows, `rows` windows per forward pass. NaN or inf when the model produces them."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(offsets), rows):
        x, y = step_rows(val_tokens, offsets[i:i + rows], cfg.block_size)
        x, y = x.to(device), y.to(device)
        with amp:
            logits, _ = model(x)  # (b, T, vocab)
        total += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                                   reduction="sum").double()
    return total.item() / (len(offsets) * cfg.block_size)


def is_finite(x: float) -> bool:
    """Whether `x` is neither infinite nor NaN."""
    return math.isfinite(x)


_NONFINITE_MESSAGE = re.compile(r"non-?finite|returned nan values", re.IGNORECASE)


def is_nonfinite_message(text: str) -> bool:
    """Whether an error message reports non-finite values (the one test, also for the symptom search's
    reading of a crashed run's last error line)."""
    return bool(_NONFINITE_MESSAGE.search(text))


def nonfinite_error(e: BaseException) -> str | None:
    """"Type: message" when `e` (or an exception it was raised from) reports non-finite values met in the step:
    lpfail.attention's `NonFiniteInputError`, or a ValueError / RuntimeError saying "non-finite" (torch.linalg,
    the kernels) or autograd's anomaly mode's "returned nan values"; else None (the error is re-raised)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NonFiniteInputError) or (isinstance(e, (ValueError, RuntimeError))
                                                   and is_nonfinite_message(str(e))):
            return f"{type(e).__name__}: {e}"
        e = e.__cause__
    return None
