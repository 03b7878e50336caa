"""Where the Monte-Carlo audit's time goes: one in-process run of check-grad --samples, as its child runs it.

    python benchmarks/profile_montecarlo.py MODEL_DIR [--target FILE::NAME] [--samples N] [--device cuda]
        [--profile] [--top 40]

Prints the progress messages with the time each came, the report (its rows), the wall time, and with
--profile the functions with the most cumulative and internal time under cProfile. On a GPU the time of a
function that waits for the device (`.item()`, `.tolist()`) holds the device work queued before it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_TARGET = "tests/audit/data/verl_style.py::kl_penalty"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--samples", type=int, default=None, help="default: chosen by the pilot (auto)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true", help="run under cProfile and print its tables")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    import torch  # noqa: F401 - imported before the clock starts

    from klaudit.audit import runner

    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"  {time.perf_counter() - start:7.2f} s  {message}", flush=True)

    def interrupted(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # a time limit's SIGTERM still prints the profile so far
    profile = cProfile.Profile()
    if args.profile:
        profile.enable()
    try:
        report = runner.audit_target(runner.parse_target(args.target), model_dir=args.model_dir, device=args.device,
                                     progress=progress, monte_carlo=runner.MonteCarlo(args.samples))
        print(report.to_text())
        print(f"{len(report.results)} rows, errors {report.errors}, {time.perf_counter() - start:.1f} s wall "
              f"(the model's load included)")
    except KeyboardInterrupt:
        print(f"interrupted after {time.perf_counter() - start:.1f} s")
    profile.disable()
    if not args.profile:
        return
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(args.top)
        print(text.getvalue())


if __name__ == "__main__":
    main()
