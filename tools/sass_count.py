"""Static SASS instruction counts of the forward kernel's variants for an H100/H200 (sm_90), compiled on a
machine without a GPU (as tools/compile_check.py). A cost model, not a timing: it says how many instructions of
each kind a variant's code holds (the inner loop dominates), so two designs of the same arithmetic can be
compared before a device call. Counts per opcode class over the whole kernel.

    python tools/sass_count.py [--d 64] [--variants FA2_BF16,FA2_BF16+robust,fma,fma+robust]
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

from triton.backends.compiler import GPUTarget

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import compile_check as cc  # noqa: E402

import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

CLASSES = ("HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSET", "FSEL", "SHFL", "F2FP", "BAR")


def sass(fn_jit, consts, warps, stages, target=GPUTarget("cuda", 90, 32)) -> str:
    fn = fn_jit.fn
    consts = cc._launch_constants(fn, consts)
    src = ASTSource(fn, cc._signature(fn, consts), constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                    attrs=cc._divisibility(fn, consts))
    k = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
    return k.asm["sass"]


def counts(text: str) -> collections.Counter:
    c = collections.Counter()
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 2 or not parts[1].strip():
            continue
        toks = parts[1].split()
        if toks[0].startswith("@"):
            toks = toks[1:]
        m = re.match(r"([A-Z][A-Z0-9_]*)", toks[0]) if toks else None
        if m:
            op = m.group(1)
            c[op] += 1
            for k in CLASSES:
                if op == k:
                    c["class:" + k] += 1
    c["total"] = sum(v for k, v in c.items() if not k.startswith("class:"))
    regs = [int(r) for r in re.findall(r"\bR(\d+)\b", text)]
    c["regs"] = max(regs) + 1 if regs else 0            # highest register named + 1: the per-thread budget used
    c["spills"] = c["STL"] + c["LDL"]                   # local-memory stores/loads: register spills
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--variants", default="FA2_BF16,FA2_BF16+fix,FA2_BF16+robust,fma,fma+fix,fma+robust")
    ap.add_argument("--config", type=int, default=0, help="index into fwd._fwd_configs()")
    args = ap.parse_args(argv)
    want = args.variants.split(",")
    seen = set()
    print(f"{'variant':18s} " + " ".join(f"{k:>6s}" for k in ("regs", "spills", "total") + CLASSES))
    for (name, d, kern, cfg), fn, consts, warps, stages in cc.variants():
        if kern != "fwd" or d != args.d or name not in want or name in seen:
            continue
        from kernels import fwd
        if cfg is not fwd._fwd_configs()[args.config] and str(cfg) != str(fwd._fwd_configs()[args.config]):
            continue
        seen.add(name)
        c = counts(sass(fn, consts, warps, stages))
        print(f"{name:18s} " + " ".join(f"{c[k if k in ('regs', 'spills', 'total') else 'class:' + k]:6d}"
                                        for k in ("regs", "spills", "total") + CLASSES),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
