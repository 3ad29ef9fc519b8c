"""Run a verbose pip build of the extension and show its progress, not its wall of flags.

Usage: python3 scripts/build_progress.py LOG -- COMMAND...   (`make build` runs it)

COMMAND is `pip install -v ...`: pip shows the build's output only with -v, and then it is every
compiler command in full. This keeps, one line each, what a person watching wants to see:

  - setup.py's build configuration (printed once, although pip runs setup.py twice),
  - ninja's progress, one line per file as it finishes compiling, shortened to the source file:
    ``[12/40] csrc/nms/cpu/nms_cpu.cpp  (1:05)`` (files compiled / total, time since the start),
  - the link step, compiler and pip warnings and errors (their first line),
  - pip's result.

Everything goes to LOG in full. When the build fails, the failure is printed in full: ninja's
output from its first ``FAILED:`` (the command and the compiler's messages), or the whole log
when the build failed before ninja ran; then pip's errors. The exit status is COMMAND's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]\s+(.*)$")
SOURCE = re.compile(r"\s-c\s+(\S+\.(?:cpp|cc|cxx|c|cu))(?:\s|$)")
LINK = re.compile(r"^\s*\S*(?:g\+\+|c\+\+|gcc|clang\+\+)\s(?:.*\s)?-shared\s.*\s-o\s+(\S+)")
DIAGNOSTIC = re.compile(r"\b(?:warning|error|FAILED)\b", re.IGNORECASE)
RESULT = re.compile(r"^Successfully installed\b")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CONFIG_HEADER = "opforge build configuration:"


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def short_path(path: str) -> str:
    """A source path relative to the current folder (the repository) when it lies inside it."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


class Filter:
    """Turns the build's output lines into the lines to show (and remembers what it needs)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.config_blocks: set[str] = set()
        self.block: list[str] | None = None  # the configuration block being read
        self.block_indent = 0
        self.compiled = 0

    def feed(self, raw: str) -> list[str]:
        line = ANSI.sub("", raw.rstrip("\n"))
        shown: list[str] = []
        if self.block is not None:
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent > self.block_indent:
                self.block.append(line[self.block_indent :])
                return shown
            shown += self.end_block()
        stripped = line.strip()
        if stripped == CONFIG_HEADER:
            self.block = [stripped]
            self.block_indent = len(line) - len(line.lstrip())
            return shown
        m = PROGRESS.match(line)
        if m:
            done, total, command = m.groups()
            sources = SOURCE.findall(command)
            what = short_path(sources[-1]) if sources else command.split()[0]
            self.compiled = int(done)
            shown.append(f"[{done}/{total}] {what}  ({clock(time.monotonic() - self.start)})")
            return shown
        m = LINK.match(line)
        if m:
            shown.append(f"linking {os.path.basename(m.group(1))}  ({clock(time.monotonic() - self.start)})")
        elif RESULT.match(stripped) or DIAGNOSTIC.search(stripped):
            shown.append(stripped)
        return shown

    def end_block(self) -> list[str]:
        """The configuration block just read, unless the same one was shown already."""
        block, self.block = self.block or [], None
        text = "\n".join(block)
        if text in self.config_blocks:
            return []
        self.config_blocks.add(text)
        return block


def failure_lines(log: list[str]) -> list[str]:
    """What to print of a failed build: ninja's output from its first failure to its end (other
    files' progress lines shortened), then pip's errors; the whole log when ninja did not fail."""
    plain = [ANSI.sub("", line) for line in log]
    first = next((i for i, line in enumerate(plain) if line.lstrip().startswith("FAILED:")), None)
    if first is None:
        return log
    stop = next(
        (i for i in range(first, len(plain)) if plain[i].lstrip().startswith("ninja: build stopped")), None
    )
    if stop is None:
        return log[first:]
    shown: list[str] = []
    for line, text in zip(log[first : stop + 1], plain[first : stop + 1], strict=True):
        m = PROGRESS.match(text)
        sources = SOURCE.findall(m.group(3)) if m else []
        shown.append(f"  [{m.group(1)}/{m.group(2)}] {short_path(sources[-1])}" if m and sources else line)
    return shown + [line for line in log[stop + 1 :] if line.startswith("ERROR:")]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: build_progress.py LOG -- COMMAND...")
    log_path, command = argv[0], argv[2:]
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    filt = Filter()
    log: list[str] = []
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1
        )
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.append(raw.rstrip("\n"))
            log_file.write(raw)
            for shown in filt.feed(raw):
                print(shown, flush=True)
        rc = proc.wait()
    for shown in filt.end_block():
        print(shown)
    elapsed = clock(time.monotonic() - filt.start)
    if rc == 0:
        print(f"build done in {elapsed} (min:s), {filt.compiled} files compiled; full log: {log_path}")
        return 0
    print(f"\nthe build failed (exit {rc}) after {elapsed}; its output from the failure on:\n", flush=True)
    for line in failure_lines(log):
        print(line)
    print(f"\nthe build failed (exit {rc}); full log: {log_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
