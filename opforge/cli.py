"""The ``opforge`` command line: ``opforge bench [--full] [--device D] [--ops a,b] [--out DIR]
[--rounds N] [--retries N] [--no-plot]`` and
``opforge demo detect [VIDEO] [--device D] [--batch N] [--weights PATH] [--save out.png] [--graph]``."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable


def _bench(args: argparse.Namespace) -> int:
    import torch

    from opforge.bench import SPECS, harness

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("opforge bench: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    names = list(SPECS) if not args.ops else [s.strip() for s in args.ops.split(",") if s.strip()]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        print(f"opforge bench: unknown op(s) {unknown}; known: {sorted(SPECS)}", file=sys.stderr)
        return 2
    specs = [SPECS[n] for n in names]
    result = harness.run(specs, device, full=args.full, rounds=args.rounds, retries=args.retries)
    print(harness.to_table(result))
    out = args.out or f"bench-out/{harness.device_slug(device)}"
    paths = harness.write(result, out, make_plot=not args.no_plot, specs=specs)
    print(f"\nwrote {', '.join(paths)}")
    return 1 if any(row["error"] for row in result["rows"]) else 0


def _int_at_least(option: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, the error naming ``option``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} takes an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{option} must be >= {minimum}, got {value}")
        return value

    return parse


def _bench_description() -> str:
    """What ``opforge bench`` does: the ops and their baselines (from the specs), the noise rule,
    what the ratio means and where the results go."""
    from opforge.bench import SPECS, harness

    width = 88
    intro = textwrap.fill(
        "Benchmark opforge's ops against their baselines in one run. Each case is checked against its "
        "reference, then opforge and every baseline are timed interleaved over several rounds (CPU: "
        "torch.utils.benchmark; CUDA: CUDA events, the L2 flushed before every call). A row whose "
        f"rounds disagree by more than {harness.NOISE_SPREAD - 1:.0%} (slowest / fastest round of "
        "an implementation) is measured again, up to --retries more times, and the steadiest attempt "
        f"kept; a row still over it is marked '{harness.NOISY_MARK} noisy'.",
        width,
    )
    table = textwrap.fill(
        f"The table prints every time in {harness.TIME_UNIT} (lower is better) and each rate in one "
        f"unit (higher is better); {harness.RATIO_LINE}. Results go to --out: results.json, "
        "results.md and results.png (and ladder.png for CUDA matmul rows).",
        width,
    )
    name_width = max(len(name) for name in SPECS) + 2
    ops = "\n".join(
        textwrap.fill(
            spec.about or "(no description)",
            width,
            initial_indent=f"  {name:<{name_width}}",
            subsequent_indent=" " * (name_width + 2),
        )
        for name, spec in SPECS.items()
    )
    return f"{intro}\n\n{table}\n\nops (--ops) and what each times against:\n{ops}"


def main(argv: list[str] | None = None) -> int:
    from opforge.bench import SPECS, harness

    parser = argparse.ArgumentParser(prog="opforge", description="opforge: fast custom PyTorch operators")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="benchmark the ops against their baselines, in one run",
        description=_bench_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the op list's lines kept
        epilog="examples:\n"
        "  opforge bench --device cpu --ops vector_add   a quick look at one op\n"
        "  opforge bench --full                          every size (as in benchmarks/results/)",
    )
    bench.add_argument(
        "--full", action="store_true", help="every size and dtype (default: off: a quick subset of sizes)"
    )
    bench.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:N or auto (default: auto: cuda when a GPU is present, else cpu)",
    )
    # (", " between the ops: a wrapped help line breaks at the spaces, not inside a name)
    bench.add_argument("--ops", default="", help=f"comma-separated ops (default: all: {', '.join(SPECS)})")
    bench.add_argument(
        "--out",
        default="",
        help="results folder (default: bench-out/<device>, such as bench-out/cpu-2core)",
    )
    bench.add_argument(
        "--rounds",
        type=_int_at_least("--rounds", 1),
        default=None,
        help="interleaved timing rounds per case; the noise check compares them, so 1 turns it off "
        f"(default: {harness.default_rounds(False)}, {harness.default_rounds(True)} with --full)",
    )
    bench.add_argument(
        "--retries",
        type=_int_at_least("--retries", 0),
        default=harness.NOISE_RETRIES,
        help=f"more attempts for a row whose rounds are over {(harness.NOISE_SPREAD - 1) * 100:.0f}%% apart "
        f"(default: {harness.NOISE_RETRIES})",
    )
    bench.add_argument(
        "--no-plot", action="store_true", help="skip the PNG charts (default: off: the charts are drawn)"
    )
    demo = sub.add_parser("demo", help="demos: `opforge demo detect --help`")
    demo.add_argument("name", choices=["detect"], help="detect: video -> FrameStream -> detector -> NMS")
    demo.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own arguments")
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    if args.command == "demo":
        from opforge.video import demo as demo_module

        return demo_module.main(args.rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
