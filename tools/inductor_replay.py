"""Replay inductor's generated GPU code for the paper's official attention on a CPU, and compare it bit for bit
with our reference under given policies (issue 16, notes/official_check.md).

Input: the log that ``TORCH_LOGS=output_code`` wrote while the experiment ``official_check`` compiled the official
code on a GPU (`tools/gpu_batch.sh official` keeps it as ``inductor_output_code.log.gz``, outside the repository; the
generated code is derived from the official code and is never committed). Each compiled graph (AOT ID
``N_forward`` / ``N_backward``) is executed here as inductor wrote it: its Triton kernels run in Triton's
interpreter (``TRITON_INTERPRET=1``, numpy), its ``extern_kernels.bmm`` calls as torch.bmm on the CPU.

What the replay keeps: every kernel boundary, every buffer's dtype (what is rounded to BF16 on a store and what
stays FP32 in registers), the order of the elementwise operations. What it cannot keep: the GPU's FP32 division
(Triton's ``/`` is ``div.full.f32``, approximate, unless inductor's ``eager_numerics.division_rounding``), FMA
contraction (``enable_fp_fusion``), CUDA's ``expf``/``logf`` (numpy's here) and the reduction order of ``tl.sum``
and of cuBLAS (numpy's and the CPU's here). Two fixes to the interpreter: FP32 → BF16 rounds to nearest even (the
interpreter truncates; the GPU's ``cvt.rn.bf16.f32`` does not), and ``triton_helpers.max2`` runs as ``tl.max``
(the same maximum without NaN inputs; the interpreter's generic reduction is far too slow).

Usage (CPU, a few seconds per case)::

    python tools/inductor_replay.py LOG.gz --graphs 0,1,2 --policies "PAPER_BF16_COMPILED;PAPER_BF16"
    python tools/inductor_replay.py LOG.gz --graphs 4 --policies PAPER_BF16_COMPILED_OFFICIAL_FIX

A graph's shape is read from its code; its inputs are the experiment's (`official_check.make_case`, seed
100·shape index + q-scale index, shapes and q scales of `OfficialCheckConfig`). Whether a graph was compiled with
the fix (STABLE=1) cannot be read from the log reliably: compare it with the fix presets yourself.
"""
from __future__ import annotations

import argparse
import gzip
import math
import os
import re
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as _interp  # noqa: E402

_PREFIX = re.compile(r"^.*?\[__output_code\] ?")
_orig_convert = _interp._convert_float


def _convert_rne(data, src, dst, rounding_mode):
    """FP32 → BF16 to nearest even, as the GPU converts (the interpreter truncates)."""
    if src == tl.float32 and dst == tl.bfloat16:
        t = torch.from_numpy(np.ascontiguousarray(data).view(np.float32)).bfloat16()
        return t.view(torch.int16).numpy().view(np.uint16)
    return _orig_convert(data, src, dst, rounding_mode)


_interp._convert_float = _convert_rne


def split_graphs(log_path: str) -> dict[str, str]:
    """{AOT ID (e.g. "1_forward"): the generated Python module's source} from an output_code log."""
    opener = gzip.open if log_path.endswith(".gz") else open
    graphs: dict[str, list[str]] = {}
    current = None
    with opener(log_path, "rt") as f:
        for line in f:
            if "[__output_code]" not in line:
                continue
            text = _PREFIX.sub("", line.rstrip("\n"))
            m = re.match(r"# AOT ID: \['([^']+)'\]", text)
            if m:
                current = m.group(1)
                graphs[current] = []
            elif text.startswith("Output code"):
                continue
            elif current is not None:
                graphs[current].append(text)
    return {k: "\n".join(v) for k, v in graphs.items()}


class _Launcher:
    """Runs one generated kernel over its grid with fixed block sizes (no autotuning)."""

    def __init__(self, fn, src: str):
        self.fn = fn
        sig = re.search(r"def \w+\((.*?)\):", src).group(1)
        self.params = [p.split(":")[0].strip() for p in sig.split(",")]
        self.persistent = "R0_BLOCK: tl.constexpr = " in src

    def run(self, *args, stream=None):
        kw = dict(zip([p for p in self.params if not p.endswith("BLOCK")], args))
        if "r0_numel" in kw and not self.persistent:
            raise NotImplementedError("looped reductions are not replayed (none in the official code's graphs)")
        if "ynumel" in kw:
            xn, yn = kw["xnumel"], kw["ynumel"]
            xb, yb = min(64, triton.next_power_of_2(xn)), 64
            while yn % yb:
                yb //= 2
            self.fn[(math.ceil(xn / xb), math.ceil(yn / yb))](*args, YBLOCK=yb, XBLOCK=xb)
        else:
            xn = kw["xnumel"]
            xb = 8 if self.persistent else 8192
            while xn % xb:
                xb //= 2
            self.fn[(math.ceil(xn / xb),)](*args, XBLOCK=xb)


def _compile_kernel(name: str, src: str, folder: str) -> _Launcher:
    src = re.sub(r"@triton_heuristics\.\w+\(.*?\)\n@triton.jit", "@triton.jit", src, flags=re.S)
    src = (src.replace("triton_helpers.set_driver_to_gpu()", "").replace("libdevice.exp(", "tl.exp(")
           .replace("tl_math.log(", "tl.log(").replace("triton_helpers.max2(", "tl.max("))
    if re.search(r"libdevice\.|tl_math\.", src):
        raise NotImplementedError(f"{name}: a libdevice/tl_math function this replay does not map")
    path = os.path.join(folder, f"{name}.py")           # triton's interpreter needs the source on disk
    with open(path, "w") as f:
        f.write(src)
    ns: dict = {}
    exec(compile(src, path, "exec"), ns)
    return _Launcher(ns[name], src)


def load_call(source: str, folder: str):
    """The generated module's ``call`` function, wired to the CPU."""
    start = source.find("async_compile = AsyncCompile()")
    body = source[start + len("async_compile = AsyncCompile()"): source.find("def get_args():")]
    body = body.replace("del async_compile", "")

    class _AsyncCompile:
        def triton(self, name, src, device_str=None):
            return _compile_kernel(name, src, folder)

        def wait(self, scope):
            pass

    class _Extern:
        @staticmethod
        def bmm(a, b, out):
            torch.bmm(a, b, out=out)

    class _Guard:
        def __init__(self, index):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    torch.cuda._DeviceGuard = _Guard
    torch.cuda.set_device = lambda index: None
    ns = dict(torch=torch, triton=triton, tl=tl, math=math, async_compile=_AsyncCompile(), extern_kernels=_Extern,
              empty_strided_cuda=lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype),
              reinterpret_tensor=lambda t, size, stride, off: torch.as_strided(t, size, stride,
                                                                               t.storage_offset() + off),
              assert_size_stride=lambda *a: None, assert_alignment=lambda *a: None, get_raw_stream=lambda i: None)
    exec(compile(body, "<inductor graph>", "exec"), ns)
    return ns["call"]


def graph_shape(forward_source: str) -> tuple[int, ...]:
    m = re.search(r"assert_size_stride\(primals_1, \(([\d, ]+)\)", forward_source)
    return tuple(int(x) for x in m.group(1).split(","))


def replay(graphs: dict[str, str], n: int, q, k, v, do, folder: str):
    """(O, dQ, dK, dV) of compiled graph n (forward, then backward with dO)."""
    fw = load_call(graphs[f"{n}_forward"], folder)
    bw = load_call(graphs[f"{n}_backward"], folder)
    outs = fw([q.clone(), k.clone(), v.clone()])
    o = outs[0].clone()
    grads = bw(list(outs[1:]) + [do.clone()])
    return (o, *grads[:3])


def main(argv=None) -> int:
    from lpfail.experiments import official_check as oc
    from lpfail.precision import Precision

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--graphs", default="0", help="comma-separated graph numbers (AOT IDs N_forward/N_backward)")
    parser.add_argument("--policies", default="PAPER_BF16_COMPILED", help="';'-separated policies")
    args = parser.parse_args(argv)
    graphs = split_graphs(args.log)
    cfg = oc.OfficialCheckConfig()
    with tempfile.TemporaryDirectory() as folder:
        for n in (int(x) for x in args.graphs.split(",")):
            shape = graph_shape(graphs[f"{n}_forward"])
            si = cfg.shapes.index(shape)
            n_tiles = math.ceil(shape[2] / 512)
            for j, s in enumerate(cfg.q_scales):
                q, k, v, do = oc.make_case(*shape, s, cfg.seed + 100 * si + j)
                theirs = replay(graphs, n, q, k, v, do, folder)
                for p in args.policies.split(";"):
                    ours = oc.run_policy(Precision.parse(p), q, k, v, do)
                    a, t = oc.agreement(ours, theirs), oc.tile_agreement(ours, theirs, n_tiles)
                    print(f"graph {n} {'x'.join(map(str, shape))} q*{s:g} {p}\n"
                          f"   O dQ dK dV % {' '.join(f'{x:.3f}' for x in a)}; per query tile: "
                          f"O {' '.join(f'{x:.3f}' for x in t[0])}, dQ {' '.join(f'{x:.3f}' for x in t[1])}",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
