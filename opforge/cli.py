"""The ``opforge`` command line: ``opforge bench [--full] [--device D] [--ops a,b] [--out DIR]`` and
``opforge demo detect [VIDEO] [--device D] [--batch N] [--weights PATH] [--save out.png] [--graph]``."""

from __future__ import annotations

import argparse
import sys


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
    result = harness.run(specs, device, full=args.full, rounds=args.rounds)
    print(harness.to_table(result))
    out = args.out or f"bench-out/{harness.device_slug(device)}"
    paths = harness.write(result, out, make_plot=not args.no_plot, specs=specs)
    print(f"\nwrote {', '.join(paths)}")
    return 1 if any(row["error"] for row in result["rows"]) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description="opforge: fast custom PyTorch operators")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmark the ops against their baselines, in one run")
    bench.add_argument("--full", action="store_true", help="all sizes and dtypes (default: a quick subset)")
    bench.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (the best present)")
    bench.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    bench.add_argument("--out", default="", help="results folder (default: bench-out/<device>)")
    bench.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per case")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG charts")
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
