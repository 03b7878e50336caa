"""Choose the fused exact-KL kernels' launch parameters (klaudit.kernels.token_kl.Launch) on this GPU.

For each dtype and vocabulary size, every candidate (block, warps) of the forward kernel and of
the backward kernel is first checked on the rows of the timed problem against the KL and its gradient
computed in float64 by enumerating the vocabulary (a candidate that is wrong is reported and never
chosen), then timed alone: the median of CUDA-event timings (triton.testing.do_bench) over [rows, V]
random logits of scale 2. Each kernel's time is set beside its own bandwidth floor: the bytes it must
move (forward: read both rows; backward: read both rows and write the gradient) at the device-to-device
copy bandwidth measured in the same run.

Prints a table per (dtype, V) and the fastest candidate of each kernel; `--json FILE` writes every
timing and the choice, which `bench_exact_token_kl.py --device cuda --launch FILE` then applies.

    python benchmarks/tune_token_kl.py [--rows 8192] [--vocab 152064 32000] [--dtype float32 bfloat16]
        [--json FILE] [--quick]

Without a GPU it runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, a tiny problem and
two candidates): a check of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import

from klaudit.kernels import token_kl  # noqa: E402
from klaudit.kernels.token_kl import Launch  # noqa: E402

# Stages are left at their default: the kernels' loops feed no matrix product, and Triton (3.6 to 3.9)
# compiles them for sm_90 without software pipelining (no cp.async in their PTX), so stages change nothing.
FORWARD_CANDIDATES = [Launch(block, warps) for block, warps in
                      ((1024, 4), (1024, 8), (2048, 8), (4096, 8), (4096, 16), (8192, 16))]
BACKWARD_CANDIDATES = [Launch(block, warps) for block, warps in
                       ((1024, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 8), (8192, 16))]
QUICK = ([Launch(1024, 4), Launch(2048, 8)], [Launch(2048, 4), Launch(4096, 8)])
CHECKED_ROWS = 4  # rows compared with float64 enumeration, per candidate
# float32 accumulation over V terms of size <= ~30: well under 1e-3 on the KL; the gradient is rounded to
# the input's dtype (relative 2^-8 for bfloat16), so 1e-2 of the largest entry bounds both dtypes
KL_TOLERANCE, GRADIENT_TOLERANCE = 1e-3, 1e-2


def milliseconds(step, device: str) -> float:
    """Median milliseconds of step(): CUDA events through do_bench on a GPU, a host clock otherwise."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median"))
    step()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_bandwidth(tensor: torch.Tensor) -> float:
    """Bytes per second of a device-to-device copy (one read and one write)."""
    target = torch.empty_like(tensor)
    return 2 * tensor.numel() * tensor.element_size() / (milliseconds(lambda: target.copy_(tensor), "cuda") / 1e3)


def exact_rows(logits: torch.Tensor, ref_logits: torch.Tensor, grad_kl: torch.Tensor):
    """(KL, grad_kl * d KL / d logits) of the first CHECKED_ROWS rows, enumerated in float64."""
    x, r = logits[:CHECKED_ROWS].double(), ref_logits[:CHECKED_ROWS].double()
    log_p, log_q = torch.log_softmax(x, -1), torch.log_softmax(r, -1)
    p = log_p.exp()
    kl = (p * (log_p - log_q)).sum(-1)
    gradient = p * (log_p - log_q - kl.unsqueeze(-1)) * grad_kl[:CHECKED_ROWS].double().unsqueeze(-1)
    return kl, gradient


def relative_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    return float((value.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30))


def tune_case(dtype_name: str, vocab: int, rows: int, candidates: tuple[list, list], device: str) -> dict:
    """Every candidate of both kernels on one problem: its error against float64 and its time."""
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = (2 * torch.randn(rows, vocab, generator=generator, device=device)).to(dtype)
    ref_logits = (2 * torch.randn(rows, vocab, generator=generator, device=device)).to(dtype)
    grad_kl = torch.rand(rows, generator=generator, device=device)
    exact_kl, exact_gradient = exact_rows(logits, ref_logits, grad_kl)
    row_bytes = logits.numel() * logits.element_size()
    bandwidth = copy_bandwidth(logits) if device == "cuda" else float("nan")
    floors = {"forward": 2 * row_bytes / bandwidth * 1e3, "backward": 3 * row_bytes / bandwidth * 1e3}
    _, stats = token_kl.forward(logits, ref_logits)
    results: dict[str, list[dict]] = {"forward": [], "backward": []}
    for kernel, options in zip(("forward", "backward"), candidates):
        for launch in options:
            if kernel == "forward":
                def step(launch=launch):
                    return token_kl.forward(logits, ref_logits, launch=launch)

                error = relative_error(step()[0][:CHECKED_ROWS], exact_kl)
                tolerance = KL_TOLERANCE
            else:
                def step(launch=launch):
                    return token_kl.backward(logits, ref_logits, stats, grad_kl, want_logits=True, want_ref=False,
                                             launch=launch)

                error = relative_error(step()[0][:CHECKED_ROWS], exact_gradient)
                tolerance = GRADIENT_TOLERANCE
            entry = {"launch": dataclasses.asdict(launch), "error": error, "right": error < tolerance}
            entry["ms"] = milliseconds(step, device) if entry["right"] else None
            results[kernel].append(entry)
    chosen = {kernel: min((entry for entry in entries if entry["right"]), key=lambda entry: entry["ms"], default=None)
              for kernel, entries in results.items()}
    return {"dtype": dtype_name, "vocab": vocab, "rows": rows, "copy_bandwidth": bandwidth, "floors_ms": floors,
            "results": results, "chosen": chosen}


def print_case(case: dict) -> None:
    print(f"\n{case['dtype']}, V = {case['vocab']:,}, {case['rows']} rows; copy bandwidth "
          f"{case['copy_bandwidth'] / 1e12:.2f} TB/s")
    print("| kernel | block | warps | stages | max rel. error | ms | x its floor |")
    print("|---|---|---|---|---|---|---|")
    for kernel, entries in case["results"].items():
        for entry in sorted(entries, key=lambda entry: (entry["ms"] is None, entry["ms"] or 0.0)):
            launch = entry["launch"]
            time_text = "wrong" if entry["ms"] is None else f"{entry['ms']:.3f}"
            ratio = "" if entry["ms"] is None else f"{entry['ms'] / case['floors_ms'][kernel]:.2f}"
            print(f"| {kernel} | {launch['block']} | {launch['warps']} | {launch['stages']} | {entry['error']:.1e} | "
                  f"{time_text} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--vocab", type=int, nargs="+", default=[152064, 32000])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path, default=None, help="write every timing and the choice here")
    parser.add_argument("--quick", action="store_true", help="two candidates per kernel")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    candidates = QUICK if args.quick or device == "cpu" else (FORWARD_CANDIDATES, BACKWARD_CANDIDATES)
    if device == "cpu":
        args.rows, args.vocab = min(args.rows, 8), [min(vocab, 3000) for vocab in args.vocab]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton's interpreter: not a measurement)"
    print(f"fused exact-KL kernels on {name}, torch {torch.__version__}")
    cases = []
    for dtype_name in args.dtype:
        for vocab in args.vocab:
            cases.append(tune_case(dtype_name, vocab, args.rows, candidates, device))
            print_case(cases[-1])
            if args.json:  # after each case, so that a run cut short keeps what it measured
                args.json.write_text(json.dumps({"device": name, "torch": torch.__version__, "cases": cases}, indent=1))
    print("\nfastest right candidate:")
    for case in cases:
        print(f"  {case['dtype']:>8} V = {case['vocab']:>7,}: forward {case['chosen']['forward']['launch']}, "
              f"backward {case['chosen']['backward']['launch']}")


if __name__ == "__main__":
    main()
