"""What the GPU experiments cost, and what the paper's full setting would cost, from the stored results.

The appendix (``book/appendix_gpu.ipynb``) quotes no measured number by hand: every wall time, tokens/s rate
and GPU-hour estimate on it comes from a function here applied to a stored result (``lpfail.results.load``).
The functions take plain mappings (a ``Result`` or its ``.meta``), so ``tests/test_costs.py`` checks them on
the stored results and on fabricated ones.

* ``cost_row(name, meta)`` — the measured wall time, the GPUs used and the device of one experiment;
  ``symptom_search(confs)`` and ``peak_parallel(log)`` — the run counts and the concurrency of chapter 1's
  search.
* ``ddp_checks(res)``, ``throughput_rows(res)``, ``speed_rows(res)`` — the tables of ``train_ddp`` and
  ``train_speed``.
* ``full_setting(rates)`` — GPU-hours to the paper's explosion, replays of a window, the whole schedule.
* ``stored_at_commit(name, commit)`` — an earlier stored result, read from the git history.
* ``provenance_html(*results)`` and ``html_table(header, rows)`` — what the chapters show instead of printed
  lines and reprs: provenance as short lines that wrap, numbers as small tables (they fit the text column).
"""
from __future__ import annotations

import hashlib
import html
import io
import json
import re
import subprocess
from pathlib import Path
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from lpfail import results, sweep
from lpfail.book.text import md_table, nowrap_numbers
from lpfail.model import GPT
from lpfail.train import PRESETS, TrainConfig

#: Cited from the paper {cite}`qiu2026why`: GPT-2 small's loss explodes after about 3.5 B tokens. (Its
#: schedule, 600,000 steps of 524,288 tokens, is the preset ``gpt2-small`` of ``lpfail.train.PRESETS``.)
PAPER_TOKENS_TO_FAILURE = 3.5e9

#: Experiments that run one process on one GPU (``cuda:0``); the others record how many they used.
SINGLE_GPU = ("bench_kernels", "bench_step", "train_speed")

#: The attentions of the full-setting estimate, in the order of the page's table.
FULL_SETTING_ATTENTIONS = ("reference(PAPER_BF16)", "triton(PAPER_BF16)", "sdpa")


# -- formatting -------------------------------------------------------------------------------------------
def fmt_seconds(s: float) -> str:
    """``102.6 s`` below 1,000 s, ``1,501 s`` from there on."""
    s = float(s)
    if not np.isfinite(s) or s < 0:
        raise ValueError(f"not a wall time: {s!r}")
    return f"{s:.1f} s" if s < 1000 else f"{s:,.0f} s"


def fmt_duration(hours: float) -> str:
    """``≈ 1.7 h`` from one hour on, ``≈ 35 min`` below."""
    hours = float(hours)
    if not np.isfinite(hours) or hours < 0:
        raise ValueError(f"not a duration: {hours!r}")
    return f"≈ {hours:.1f} h" if hours >= 1 else f"≈ {hours * 60:.0f} min"


def short_device(device: str) -> str:
    """``NVIDIA H200`` → ``H200``."""
    return re.sub(r"^NVIDIA\s+", "", str(device)).strip()


def torch_version(meta: Mapping) -> str:
    """``2.11`` from ``versions.torch = 2.11.0+cu130``."""
    v = str(meta.get("versions", {}).get("torch") or "?").split("+")[0]
    return ".".join(v.split(".")[:2])


def date_of(meta: Mapping) -> str:
    """The day a result was computed (``created``, UTC): ``2026-11-29``."""
    return str(meta["created"])[:10]


def provenance_short(meta: Mapping) -> str:
    """``NVIDIA H200, torch 2.11, 2026-11-29`` from a result's meta."""
    return f"{meta['device']}, torch {torch_version(meta)}, {date_of(meta)}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown table whose cells cannot break it (`lpfail.book.text.md_table`: ``|`` escaped, ragged rows
    refused, numbers kept on one line)."""
    return md_table(header, rows)


_TABLE = "<table class='lpfail-table' style='font-size:0.85em;border-collapse:collapse'>"


def _cell(x, tag="td"):
    return f"<{tag} style='padding:2px 8px;border-bottom:1px solid #ddd;text-align:left'>{x}</{tag}>"


def html_table(header: Sequence[str], rows: Sequence[Sequence], caption: str | None = None,
               escape: bool = True) -> str:
    """A small HTML table in the style of the book's tables: what a chapter shows instead of a printed dict or
    a column layout made of spaces. Cells are escaped, unless ``escape=False`` (cells already HTML)."""
    esc = (lambda x: nowrap_numbers(html.escape(str(x)))) if escape else (lambda x: nowrap_numbers(str(x)))
    out = [_TABLE]
    if caption:
        out.append(f"<caption style='text-align:left;caption-side:top'>{html.escape(caption)}</caption>")
    out.append("<tr>" + "".join(_cell(html.escape(str(h)), "th") for h in header) + "</tr>")
    out += ["<tr>" + "".join(_cell(esc(c)) for c in r) + "</tr>" for r in rows]
    return "".join(out) + "</table>"


def _small_lines(texts) -> str:
    """Plain-text lines, escaped, one <div> each, in small type that wraps at the column's edge."""
    lines = "".join(f"<div>{html.escape(t)}</div>" for t in texts)
    return f"<div class='lpfail-provenance' style='font-size:0.8em;color:#555;overflow-wrap:anywhere'>{lines}</div>"


def provenance_html(*results_) -> str:
    """Where and when each result was computed (``Result.provenance``), one short line each, in small type that
    wraps at the column's edge (a printed line would have to be scrolled sideways)."""
    return _small_lines(r.provenance for r in results_)


def parts_html(parts) -> str:
    """The part files a result was assembled from (``{"file", "device", "created", "git"}`` each), one short
    line each, in the same small wrapping type as `provenance_html`."""
    return _small_lines(f"part {m['file']}: {m['device']}, {m['created']}, git {str(m['git'])[:12]}"
                        for m in parts)


# -- what each GPU experiment costs -----------------------------------------------------------------------
def gpus_used(name: str, meta: Mapping) -> int:
    """GPUs an experiment used: the driver's GPU list for the symptom search (``runs_gpus``), the config's
    ``nproc`` for ``train_ddp``, one for the single-process experiments."""
    if meta.get("runs_gpus") is not None:
        return len(meta["runs_gpus"])
    nproc = meta.get("config", {}).get("nproc")
    if nproc is not None:
        return int(nproc)
    if name in SINGLE_GPU:
        return 1
    raise ValueError(f"{name}: the stored result does not say how many GPUs it used")


def wall_seconds(meta: Mapping) -> float:
    """The measured wall time: the driver's (``runs_wall_s``) for a search collected from run logs, whose own
    ``wall_s`` is only the collection; the experiment's ``wall_s`` otherwise."""
    w = meta.get("runs_wall_s")
    if w is None:
        w = meta.get("wall_s")
    if w is None:
        raise ValueError(f"{meta.get('name')}: no wall time stored (neither runs_wall_s nor wall_s)")
    return float(w)


def cost_row(name: str, meta: Mapping) -> dict:
    """One experiment's measured cost: wall time, GPUs, device, date, the key and file it is read from."""
    key = "runs_wall_s" if meta.get("runs_wall_s") is not None else "wall_s"
    return {"name": name, "wall_s": wall_seconds(meta), "gpus": gpus_used(name, meta),
            "device": meta["device"], "created": date_of(meta), "key": key,
            "source": f"results/{name}.json"}


def gpu_cell(row: dict) -> str:
    """``2 × H200``."""
    return f"{row['gpus']} × {short_device(row['device'])}"


def wall_cell(row: dict) -> str:
    """``102.6 s (`results/bench_kernels.json`)``."""
    return f"{fmt_seconds(row['wall_s'])} (`{row['source']}`)"


def symptom_search(confs) -> dict:
    """Run counts of chapter 1's search from its configurations (``symptom_report.configurations``): runs at
    the default, around it, repeats of a configuration on another implementation (a point that sets
    ``impl``), and the steps per run."""
    if not confs:
        raise ValueError("no configurations")
    n = [len(c.variants) * len(c.seeds) for c in confs]
    steps = {int(c.config["max_steps"]) for c in confs}
    if len(steps) != 1:
        raise ValueError(f"the configurations run different numbers of steps: {sorted(steps)}")
    repeats = sum(k for c, k in zip(confs[1:], n[1:]) if "impl=" in c.overrides)
    return {"runs": sum(n), "default": n[0], "around": sum(n[1:]), "repeats": repeats, "steps": steps.pop()}


_START = re.compile(r"^sweep: start (\S+) on GPU")
_END = re.compile(r"^sweep: (\S+) (done|failed|stopped) \(rc")


def peak_parallel(log: str) -> int:
    """The most runs that were going at once, from the driver's log (``sweep: start NAME on GPU g`` and
    ``sweep: NAME done|failed|stopped (rc …)`` lines)."""
    running, peak = set(), 0
    for line in log.splitlines():
        if m := _START.match(line):
            running.add(m.group(1))
            peak = max(peak, len(running))
        elif m := _END.match(line):
            running.discard(m.group(1))
    if peak == 0:
        raise ValueError("the log records no started run")
    return peak


# -- train_ddp: 1 vs N GPUs, and GPT-2 small tokens/s -----------------------------------------------------
def ddp_checks(res: Mapping) -> dict:
    """The numbers of the 1-GPU-vs-N-GPU comparison of ``train_ddp``."""
    diff = np.asarray(res["loss_abs_diff"], dtype=np.float64)
    noise = np.asarray(res["noise_abs_diff"], dtype=np.float64)
    return {"deterministic": bool(res["deterministic_1gpu"]), "diff_step0": float(diff[0]),
            "diff_first_10": float(np.max(diff[:10])), "diff_max": float(np.max(diff)),
            "diff_argmax": int(np.argmax(diff)), "noise_first_10": float(np.max(noise[:10])),
            "noise_max": float(np.max(noise)), "noise_argmax": int(np.argmax(noise)),
            "diff_last": float(diff[-1]), "noise_last": float(noise[-1]),
            "final_1gpu": float(np.asarray(res["loss_1gpu"])[-1]),
            "final_multi": float(np.asarray(res["loss_multi"])[-1]), "steps": int(len(diff))}


def ddp_setting(cfg: Mapping) -> dict:
    """The small model of the comparison, from the stored config."""
    per_step = int(cfg["batch_size"]) * int(cfg["block_size"])
    nproc = int(cfg["nproc"])
    return {"n_layer": int(cfg["n_layer"]), "n_embd": int(cfg["n_embd"]), "T": int(cfg["block_size"]),
            "tokens_per_step": per_step, "lr": float(cfg["lr"]), "steps": int(cfg["steps"]),
            "micro_batch": int(cfg["micro_batch"]), "accum_1gpu": int(cfg["batch_size"]) // int(cfg["micro_batch"]),
            "nproc": nproc, "accum_multi": int(cfg["batch_size"]) // (int(cfg["micro_batch"]) * nproc)}


def bench_rates(res: Mapping) -> dict[str, float]:
    """GPT-2 small tokens/s per attention on one GPU (``train_ddp``'s ``bench_*`` arrays); a failed
    implementation (NaN) is left out."""
    names = [str(a) for a in res["bench_attention"]]
    tps = np.asarray(res["bench_tokens_per_s"], dtype=np.float64)
    if len(names) != len(tps):
        raise ValueError(f"{len(names)} attentions but {len(tps)} rates")
    return {a: float(t) for a, t in zip(names, tps) if np.isfinite(t) and t > 0}


def throughput_rows(res: Mapping) -> list[dict]:
    """Per attention: tokens/s (the mean over the timed steps) and the median ms per step."""
    names = [str(a) for a in res["bench_attention"]]
    return [{"attention": a, "tokens_per_s": float(t), "step_ms": float(ms)}
            for a, t, ms in zip(names, np.asarray(res["bench_tokens_per_s"]), np.asarray(res["bench_step_ms"]))]


def speed_rows(res: Mapping) -> list[dict]:
    """``train_speed``: per variant (``deterministic,written`` …), tokens/s, median ms per step, whether the
    runs repeated bit for bit (``None`` in a result that ran each variant once and has no ``identical``)."""
    variants = [str(v) for v in res["variants"]]
    same = list(np.asarray(res["identical"])) if "identical" in res else [None] * len(variants)
    out = []
    for v, t, ms, sm in zip(variants, np.asarray(res["tokens_per_s"]), np.asarray(res["step_ms"]), same):
        det, loss = v.split(",")
        out.append({"variant": v, "deterministic": det == "deterministic", "loss": loss,
                    "tokens_per_s": float(t), "step_ms": float(ms), "identical": None if sm is None else bool(sm)})
    return out


def speed_of(rows: list[dict], variant: str) -> dict:
    for r in rows:
        if r["variant"] == variant:
            return r
    raise KeyError(f"no variant {variant!r}; there are {[r['variant'] for r in rows]}")


def relative_difference(a: float, b: float) -> float:
    """|a − b| relative to the larger of the two."""
    a, b = float(a), float(b)
    if not (a > 0 and b > 0):
        raise ValueError(f"rates must be positive (got {a!r}, {b!r})")
    return abs(a - b) / max(a, b)


# -- the paper's full setting -----------------------------------------------------------------------------
def paper_schedule() -> dict:
    """Steps and tokens per step of the paper's run, from the preset ``gpt2-small``."""
    p = PRESETS["gpt2-small"]
    return {"steps": int(p["max_steps"]), "tokens_per_step": int(p["batch_size"]) * int(p["block_size"])}


def gpu_hours(tokens: float, tokens_per_s: float) -> float:
    """GPU-hours to train ``tokens`` tokens at a single-GPU rate (linear scaling over GPUs assumed)."""
    if not (np.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"not a rate: {tokens_per_s!r}")
    if tokens < 0:
        raise ValueError(f"negative token count {tokens!r}")
    return float(tokens) / float(tokens_per_s) / 3600.0


def full_setting(rates: Mapping[str, float], gpus: int = 8, window_steps: int = 300,
                 tokens_to_failure: float = PAPER_TOKENS_TO_FAILURE, schedule: Mapping | None = None,
                 attentions: Sequence[str] = FULL_SETTING_ATTENTIONS) -> dict:
    """The estimate of the appendix from the single-GPU rates ``rates`` (attention → tokens/s): per attention
    the GPU-hours to ``tokens_to_failure`` and the wall time on ``gpus`` GPUs; the GPU-minutes of replaying a
    window of ``window_steps`` steps; the GPU-hours of the whole schedule; the fraction of the schedule
    before the failure."""
    sched = dict(schedule or paper_schedule())
    missing = [a for a in attentions if a not in rates]
    if missing:
        raise KeyError(f"no stored rate for {missing}; stored: {sorted(rates)}")
    window_tokens = window_steps * sched["tokens_per_step"]
    total_tokens = sched["steps"] * sched["tokens_per_step"]
    rows = []
    for a in attentions:
        h = gpu_hours(tokens_to_failure, rates[a])
        rows.append({"attention": a, "tokens_per_s": float(rates[a]), "gpu_hours": h,
                     "wall_hours": h / gpus, "window_gpu_min": gpu_hours(window_tokens, rates[a]) * 60,
                     "schedule_gpu_hours": gpu_hours(total_tokens, rates[a])})
    return {"rows": rows, "gpus": gpus, "window_steps": window_steps, "window_tokens": window_tokens,
            "total_tokens": total_tokens, "failure_fraction": tokens_to_failure / total_tokens,
            "tokens_to_failure": tokens_to_failure}


def row_of(est: dict, attention: str) -> dict:
    for r in est["rows"]:
        if r["attention"] == attention:
            return r
    raise KeyError(f"no estimate for {attention!r}")


def checkpoint_gb(preset: str = "gpt2-small") -> float:
    """Size of a training checkpoint of a preset in GB (10⁹ bytes), an estimate: FP32 weights and AdamW's two
    moments, 12 bytes per parameter (counted on PyTorch's meta device, tied embeddings once)."""
    cfg = TrainConfig.preset(preset)
    if not cfg.vocab_size:
        raise ValueError(f"preset {preset!r} takes its vocabulary from the tokenizer: no fixed size to count")
    with torch.device("meta"):
        model = GPT(cfg.gpt_config(cfg.vocab_size))
    return 12 * sum(p.numel() for p in model.parameters()) / 1e9


# -- an earlier stored result, from the git history -------------------------------------------------------
def stored_at_commit(name: str, commit: str) -> dict:
    """The result ``name`` as stored at ``commit`` (``git show``): its arrays and scalars and its meta
    (``{"meta": …, **arrays, **scalars}``), the ``.npz`` checked against the hash in its ``.json``. Raises
    ``RuntimeError`` where there is no git history (a copy of the tree without ``.git``)."""
    def show(path: str) -> bytes:
        try:
            proc = subprocess.run(["git", "show", f"{commit}:results/{path}"], cwd=results.REPO_ROOT,
                                  capture_output=True, check=False)
        except OSError as e:
            raise RuntimeError(f"git is not available: {e}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"git show {commit}:results/{path} failed: {proc.stderr.decode()[-300:]}")
        return proc.stdout

    meta = json.loads(show(f"{name}.json"))
    npz = show(f"{name}.npz")
    if hashlib.sha256(npz).hexdigest() != meta["npz_sha256"]:
        raise RuntimeError(f"{name}.npz at {commit} does not match the hash in its .json")
    with np.load(io.BytesIO(npz), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return {"meta": meta, **arrays, **meta.get("scalars", {})}


# -- the quick profiles (lpfail.sweep.quick): each grid's headline on one GPU in minutes ----------------------------
def quick_rows(directory=None) -> list[dict]:
    """One row per registered grid (`lpfail.sweep.names`): the chapter that shows it (its declaration's,
    `lpfail.sweep.register_grid`), its quick profile's headline and number of runs (None without a profile), and,
    where ``results/quick_NAME.json`` stores a measurement, its wall time, device, date, value and whether it fell
    inside the interval the stored seeds predict; "not yet measured on an H200" otherwise."""
    out = []
    d = Path(directory) if directory is not None else results.results_dir()
    for name in sweep.names():
        grid = sweep.get(name)
        q = grid.quick() if hasattr(grid, "quick") else None
        p = d / f"quick_{name}.json"
        rec = json.loads(p.read_text()) if p.is_file() else None
        out.append({"grid": name, "chapter": results.get(name).chapter, "headline": q.label if q else None,
                    "runs": len(q.runs) if q else None, "measured": rec is not None,
                    "wall_s": rec.get("wall_s") if rec else None, "device": rec.get("device") if rec else None,
                    "created": str(rec.get("created", ""))[:10] if rec else None,
                    "value": rec.get("value") if rec else None, "inside": rec.get("inside") if rec else None,
                    "bit_identical": (f"{rec['bit_identical_runs']} of {rec['runs']}"
                                      if rec and "bit_identical_runs" in rec else None)})
    return out


def quick_table(rows: list[dict]) -> str:
    """Markdown: per grid, its quick profile (headline, runs) and its measured time, or what it lacks."""
    body = []
    for r in rows:
        if r["headline"] is None:
            body.append([f"`{r['grid']}`", "no quick profile", "—", "—"])
            continue
        if r["measured"]:
            same = (f"{r['bit_identical']} runs bit-identical" if r["bit_identical"]
                    else "bit-identity of its runs not recorded")
            t = (f"{fmt_seconds(r['wall_s'])} on an {short_device(r['device'])}, {r['created']}; "
                 f"{'inside' if r['inside'] else 'outside'} the stored seeds' interval, {same}")
        else:
            t = "not yet measured on an H200"
        body.append([f"`{r['grid']}`", r["headline"], f"{r['runs']}", t])
    return md_table(["grid", "headline (one seed)", "runs", "measured time"], body)


# -- the rerun check (appendix): do the stored runs come out again, bit for bit? -----------------------------------
_RERUN_WORDS = ("bit-identical", "different", "cut off", "failed", "pending")


def rerun_rows(res: Mapping) -> list[tuple]:
    """Per grid of the stored ``rerun_check``: the runs checked, and how many of them each outcome
    (`lpfail.sweep.rerun.word`), with the cards they were stored from and rerun on (a row of an older check, which
    did not record it, was rerun on that check's device)."""
    from lpfail.sweep import rerun

    per: dict[str, dict] = {}
    last = str((getattr(res, "meta", None) or {}).get("device") or "")  # an older check's rows name no card: its own
    for r in res["rows"]:
        g = per.setdefault(r["grid"], {"n": 0, "cards": set(), "here": set(), **{w: 0 for w in _RERUN_WORDS}})
        g["n"] += 1
        g[rerun.word(r)] += 1
        if r.get("card"):
            g["cards"].add(short_device(r["card"]))
        if rerun.word(r) != "pending" and (r.get("rerun_card") or last):
            g["here"].add(short_device(r.get("rerun_card") or last))
    return [(f"`{name}`", g["n"], *(g[w] for w in _RERUN_WORDS), ", ".join(sorted(g["cards"])) or "not recorded",
             ", ".join(sorted(g["here"])) or "—") for name, g in per.items()]


def rerun_table(res: Mapping) -> str:
    return markdown_table(("grid", "runs", "bit-identical", "different", "cut off", "failed", "pending",
                           "stored on", "rerun on"), rerun_rows(res))


def rerun_words(res: Mapping) -> str:
    """The rerun check in a sentence: its counts over every row, and the cards the pending rows wait for."""
    from lpfail.sweep import rerun

    words = [rerun.word(r) for r in res["rows"]]
    n = {w: words.count(w) for w in _RERUN_WORDS}
    text = (f"Of the {len(words)} runs the check covers, {n['bit-identical']} came out bit-identical and "
            f"{n['different']} different")
    if n["cut off"] or n["failed"]:
        text += (f"; {n['cut off']} {'was' if n['cut off'] == 1 else 'were'} cut off by the call's budget and "
                 f"{n['failed']} failed (run again next time)")
    if n["pending"]:
        cards = sorted({short_device(r.get("card") or "?") for r in res["rows"] if rerun.word(r) == "pending"})
        text += (f"; {n['pending']} {'waits' if n['pending'] == 1 else 'wait'} for a machine with the card "
                 f"{'it was' if n['pending'] == 1 else 'they were'} trained on ({', '.join(cards)})")
    return text + "."
