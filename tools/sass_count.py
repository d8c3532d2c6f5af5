"""Static SASS instruction counts of the kernels' variants for an H100/H200 (sm_90), compiled on a machine without
a GPU (as tools/compile_check.py, with the launcher's own constexprs). A cost model, not a timing: it says how
many instructions of each kind a variant's code holds (the inner loop dominates), so two designs of the same
arithmetic can be compared before a device call. Counts per opcode class over the whole kernel.

    python tools/sass_count.py [--d 64] [--kernel fwd] [--tunings default,count] [--config 0]
                               [--variants FA2_BF16,FA2_BF16+robust,fma,fma+robust]
"""
from __future__ import annotations

import argparse
import collections
import re
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import compile_check as cc  # noqa: E402

CLASSES = ("HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSET", "FSEL", "SHFL", "F2FP", "BAR",
           "UTMALDG", "LDGSTS", "RED")


def sass(fn_jit, consts, options) -> str:
    return cc.compile_kernel(fn_jit, consts, options).asm["sass"]


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
    ap.add_argument("--kernel", default="fwd", choices=("fwd", "dkdv", "dq", "dqa"))
    ap.add_argument("--variants", default="FA2_BF16,FA2_BF16+fix,FA2_BF16+robust,fma,fma+fix,fma+robust")
    ap.add_argument("--tunings", default="default", help=f"comma-separated names of {list(cc.TUNINGS)}")
    ap.add_argument("--config", type=int, default=0, help="index into the kernel's pruned autotune configs")
    args = ap.parse_args(argv)
    policies = {n: cc.POLICIES[n] for n in args.variants.split(",")}
    cols = ("regs", "spills", "total") + CLASSES
    print(f"{'variant':26s} {'config':24s} " + " ".join(f"{k[:6]:>6s}" for k in cols))
    for tname in args.tunings.split(","):
        index = collections.Counter()
        for (name, t, d, kern, cfg), fn, consts, options in cc.variants(policies, (tname,), every=True):
            if kern != args.kernel or d != args.d:
                continue
            index[name] += 1
            if index[name] - 1 != args.config:
                continue
            c = counts(sass(fn, consts, options))
            tag = f"{cfg.kwargs.get('BLOCK_M')}x{cfg.kwargs.get('BLOCK_N', '')} w{cfg.num_warps} s{cfg.num_stages}" \
                  + (f" r{cfg.maxnreg}" if cfg.maxnreg else "")
            print(f"{name + ' ' + tname:26s} {tag:24s} " + " ".join(
                f"{c[k if k in ('regs', 'spills', 'total') else 'class:' + k]:6d}" for k in cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
