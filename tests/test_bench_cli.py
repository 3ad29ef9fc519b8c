"""`opforge bench` usability: --help, the noise rule (re-measure, then mark), how the table reads
(ratio direction, one time unit, the noisy marker) and the plot's units and directions. Synthetic
timings only: no real benchmark runs here."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from opforge.bench import SPECS, harness
from opforge.bench.harness import Case, Samples
from opforge.cli import main

OPTIONS = ("--full", "--device", "--ops", "--out", "--rounds", "--retries", "--no-plot")


def _help(capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_help_describes_the_bench_and_every_default(capsys):
    out = _help(capsys)
    assert out.startswith("usage: opforge bench")
    flat = " ".join(out.split())  # the description is wrapped
    assert "Benchmark opforge's ops against their baselines in one run" in flat
    assert " ".join(harness.RATIO_LINE.split()) in flat
    assert "results.json, results.md and results.png" in flat and "more than 15%" in flat
    for name, spec in SPECS.items():  # every op, with what it is timed against
        assert spec.about and re.search(rf"^  {name} +{re.escape(spec.about.split()[0])}", out, re.M), name
    options = out[out.index("\noptions:") :]
    blocks = {b.split()[0]: " ".join(b.split()) for b in re.split(r"\n  (?=-)", options)[1:]}
    assert set(blocks) == {"-h,", *OPTIONS}
    for option in OPTIONS:
        assert "(default: " in blocks[option], blocks[option]
    assert (
        f"(default: {harness.default_rounds(False)}, {harness.default_rounds(True)} with --full)"
        in (blocks["--rounds"])
    )
    assert f"(default: {harness.NOISE_RETRIES})" in blocks["--retries"]
    assert "(default: auto:" in blocks["--device"] and "bench-out/<device>" in blocks["--out"]
    assert "(default: all: " + ",".join(SPECS) in blocks["--ops"].replace(", ", ",")


@pytest.mark.parametrize(("option", "value"), [("--rounds", "0"), ("--retries", "-1"), ("--rounds", "x")])
def test_bad_counts_are_refused_by_name(capsys, option, value):
    with pytest.raises(SystemExit) as done:
        main(["bench", "--device", "cpu", "--ops", "vector_add", option, value])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {option} " in err and (f"got {value!r}" in err or f"got {value}" in err)


def _attempts(*attempts: Samples) -> tuple[Callable[[], Samples], list[int]]:
    """An attempt function that returns ``attempts`` in turn; the list counts the calls."""
    calls: list[int] = []

    def attempt() -> Samples:
        calls.append(1)
        return attempts[len(calls) - 1]

    return attempt, calls


def test_round_spread():
    assert harness.round_spread({"a": [1.0, 1.1, 1.05], "b": [2.0, 3.0]}) == pytest.approx(1.5)
    assert harness.round_spread({"a": [1.0], "b": [2.0]}) is None  # one round: nothing to compare
    assert harness.round_spread({}) is None


def test_steady_row_is_measured_once():
    attempt, calls = _attempts({"opforge": [1.0, 1.05], "torch.add": [2.0, 2.1]})
    got = harness.measure(attempt)
    assert len(calls) == 1 and got.attempts == 1 and not got.noisy
    assert got.spread == pytest.approx(1.05)


def test_disagreeing_row_is_measured_again_and_the_steady_attempt_kept():
    """The issue's case: a neighbour slowed one round 50-fold (the row read 0.02x); measured
    again, the rounds agree and that attempt is the one kept."""
    disturbed = {"opforge": [1.0, 50.0], "torch.add": [1.0, 1.01]}
    steady = {"opforge": [1.0, 1.02], "torch.add": [1.01, 1.0]}
    attempt, calls = _attempts(disturbed, steady)
    retried: list[tuple[float, int]] = []
    got = harness.measure(attempt, on_retry=lambda spread, n: retried.append((spread, n)))
    assert len(calls) == 2 and got.attempts == 2 and not got.noisy
    assert got.samples is steady and retried == [(50.0, 2)]


def test_row_that_stays_noisy_is_marked_with_its_steadiest_attempt():
    first = {"opforge": [1.0, 3.0]}
    best = {"opforge": [1.0, 1.4]}
    last = {"opforge": [1.0, 2.0]}
    attempt, calls = _attempts(first, best, last)
    got = harness.measure(attempt, retries=2)
    assert len(calls) == 3 and got.attempts == 3  # bounded: the first and two more
    assert got.noisy and got.samples is best and got.spread == pytest.approx(1.4)
    attempt, calls = _attempts(first, best)
    assert harness.measure(attempt, retries=0).noisy and len(calls) == 1  # --retries 0: no retry


def test_threshold_is_the_named_constant():
    over = {"opforge": [1.0, harness.NOISE_SPREAD * 1.01]}
    under = {"opforge": [1.0, harness.NOISE_SPREAD * 0.99]}
    assert harness.measure(_attempts(over, over, over)[0]).noisy
    assert not harness.measure(_attempts(under)[0]).noisy
    assert not harness.measure(_attempts({"opforge": [1.0]})[0]).noisy  # one round: never noisy
    with pytest.raises(ValueError, match="retries must be >= 0"):
        harness.measure(_attempts(under)[0], retries=-1)


def _fake_timer(times: dict[str, list[float]], impls: dict[str, Callable[[], object]]):
    """A timer that returns each implementation's next planted time instead of timing it."""
    name_of = {id(fn): name for name, fn in impls.items()}
    left = {name: list(values) for name, values in times.items()}

    def timer(fn: Callable[[], object]) -> float:
        return left[name_of[id(fn)]].pop(0)

    return timer, left


def _case(name: str = "tiny") -> Case:
    return Case("vector_add", name, {"opforge": lambda: None, "torch.add": lambda: None}, bytes=3 << 20)


def test_run_case_re_measures_a_disturbed_row():
    case = _case()
    # rounds=2, interleaved; attempt 1: opforge's second round 50x slow; attempt 2 steady.
    timer, left = _fake_timer(
        {"opforge": [1.0, 50.0, 1.0, 1.02], "torch.add": [1.0, 1.0, 1.01, 1.0]}, case.impls
    )
    row = harness.run_case(case, timer, rounds=2)
    assert left == {"opforge": [], "torch.add": []}  # two attempts ran
    assert row["attempts"] == 2 and row["noisy"] is False and row["spread"] == pytest.approx(1.02)
    assert row["impls"]["opforge"]["rounds_ms"] == [1.0, 1.02]
    assert row["impls"]["opforge"]["spread"] == pytest.approx(1.02)  # which implementation wavered
    assert row["impls"]["torch.add"]["speedup_of_opforge"] == pytest.approx(1.005 / 1.01)
    timer, left = _fake_timer(
        {"opforge": [1.0, 1.01, 9.0, 9.0], "torch.add": [2.0, 2.0, 9.0, 9.0]}, case.impls
    )
    row = harness.run_case(case, timer, rounds=2)
    assert row["attempts"] == 1 and row["noisy"] is False and left["opforge"] == [9.0, 9.0]  # left alone


def _result(rows: list[dict], **meta) -> dict:
    base = {
        "device": "D",
        "device_type": "cpu",
        "torch": "x",
        "cuda": None,
        "python": "3",
        "mode": "quick",
        "date": "d",
        "commit": "c",
        "copy_gbps": 50.0,
        "rounds": 2,
        "retries": harness.NOISE_RETRIES,
        "noise_spread": harness.NOISE_SPREAD,
    }
    return {"meta": {**base, **meta}, "rows": rows}


def _row(op: str, case: str, key: str | None, ms: dict[str, float], noisy: bool = False, spread=1.01) -> dict:
    ours = next(iter(ms.values()))
    impls = {}
    for name, t in ms.items():
        entry = {"ms": t, "speedup_of_opforge": t / ours}
        if key is not None:
            entry[key] = 1.0 / t
        impls[name] = entry
    return {
        "op": op,
        "case": case,
        "params": {},
        "bytes": None,
        "error": None,
        "impls": impls,
        "spread": spread,
        "attempts": 3 if noisy else 1,
        "noisy": noisy,
    }


def test_table_says_how_the_ratio_reads_and_marks_noisy_rows(tmp_path):
    rows = [
        _row("vector_add", "steady", "gbps", {"opforge": 0.0094, "torch.add": 0.0188}),
        _row("nms", "shaky", None, {"opforge": 244.0, "torchvision": 2.0}, noisy=True, spread=1.4),
    ]
    result = _result(rows)
    table = harness.to_table(result)
    lines = table.splitlines()
    assert lines[0] == harness.RATIO_LINE and "above 1 opforge is faster" in lines[0]
    assert "time (ms)" in table and "lower is better" in table and "higher is better" in table
    assert " us " not in table and "0.00940" in table and "244" in table  # one time unit: ms
    steady = next(line for line in lines if line.lstrip().startswith("torch.add"))
    assert steady.rstrip().endswith(" 2.00x")  # baseline 2x slower: opforge is faster, unmarked
    shaky = next(line for line in lines if line.lstrip().startswith("torchvision"))
    assert shaky.rstrip().endswith(f" {harness.NOISY_MARK}0.01x")
    assert f"{harness.NOISY_MARK} noisy (40%)" in table
    note = next(line for line in lines if line.startswith(f"{harness.NOISY_MARK} noisy (N%)"))
    assert "15%" in note and f"{harness.NOISE_RETRIES + 1} attempts" in note
    md = harness.to_markdown(result)
    assert f"| {harness.NOISY_MARK}0.01x |" in md and note in md and "| time (ms) |" in md
    harness.write(result, str(tmp_path), make_plot=False)
    saved = json.load(open(tmp_path / "results.json"))["rows"]
    assert [r["noisy"] for r in saved] == [False, True]
    calm = harness.to_table(_result(rows[:1]))
    assert harness.NOISY_MARK not in calm and "noisy" not in calm  # no marker, no footnote
    assert "noise check off" in harness.to_table(_result(rows[:1], rounds=1))


def test_one_unit_per_rate():
    """A rate keeps its unit at every size (no GFLOP/s beside TFLOP/s, no 'k tokens/s')."""
    small = {"ms": 1.0, "tflops": 0.05}
    large = {"ms": 1.0, "tflops": 120.0}
    assert harness._metric(small) == "0.0500 TFLOP/s" and harness._metric(large) == "120 TFLOP/s"
    assert harness._metric({"ms": 1.0, "tps": 23456.0}) == "23456 tokens/s"
    assert harness._metric({"ms": 1.0, "fps": 12.5, "gbps": 3.0}) == "12.5 frames/s, 3.00 GB/s"


def test_plot_panels_carry_units_and_directions(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        _row("nms", "1k", None, {"opforge": 0.2, "torchvision": 0.4}, noisy=True, spread=1.3),
        _row("vector_add", "1M", "gbps", {"opforge": 0.1, "torch.add": 0.1}),
        _row("attention", "causal", "tflops", {"opforge": 1.0, "sdpa": 1.1}),
        _row("attention", "decode", "gbps", {"opforge": 1.0, "sdpa": 1.1}),  # another rate: its own panel
    ]
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    assert harness.plot(_result(rows), str(tmp_path / "results.png"))
    axes = figs[0].axes
    assert [ax.get_ylabel() for ax in axes] == ["time (ms)", "GB/s", "TFLOP/s", "GB/s"]
    titles = [ax.get_title() for ax in axes]
    assert "lower is better" in titles[0] and all("higher is better" in t for t in titles[1:])
    assert titles[2].startswith("attention: TFLOP/s") and titles[3].startswith("attention: GB/s")
    assert f"{harness.NOISY_MARK} noisy" in axes[0].get_xticklabels()[0].get_text()
    assert "noisy" not in axes[1].get_xticklabels()[0].get_text()


def test_serving_grid_plots_each_rows_opforge_as_one_series(tmp_path, monkeypatch):
    """serving_grid.png: every row's first implementation (opforge, or opforge on the pages) is the one
    "opforge" series, each peer's ratio is its time over that row's opforge; no serving rows, no plot."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from opforge.bench.serving import write_grid

    rows = [
        _row("serving", "decode", "gbps", {"opforge": 0.1, "SDPA": 0.08}),
        _row("serving", "paged", "gbps", {"opforge paged": 0.2, "opforge contiguous": 0.1}),
        _row("attention", "causal", "tflops", {"opforge": 1.0}),
    ]
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    assert write_grid(_result(rows), str(tmp_path)) == [str(tmp_path / "serving_grid.png")]
    top, bottom = figs[0].axes
    series = {line.get_label(): line for line in top.get_lines() if not line.get_label().startswith("_")}
    assert list(series) == ["opforge", "SDPA", "opforge contiguous"]
    assert list(series["opforge"].get_xdata()) == [0, 1]
    assert list(series["opforge"].get_ydata()) == [pytest.approx(10 / 50), pytest.approx(5 / 50)]
    ratios = {
        line.get_label(): list(line.get_ydata()) for line in bottom.get_lines() if line.get_label()[0] != "_"
    }
    assert ratios == {"SDPA": [pytest.approx(0.8)], "opforge contiguous": [pytest.approx(0.5)]}
    assert write_grid(_result(rows[2:]), str(tmp_path)) == []
