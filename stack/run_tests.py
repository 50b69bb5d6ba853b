#!/usr/bin/env python3
"""make test's runner: the test binaries that share the stack run beside each other, the ones
that take the stack down run alone after them. Standard library only.

  run_tests.py [CARGO TEST ARGS...]     e.g. --workspace --features likes/failpoints

`cargo test` runs its test binaries one after another, and most of their time is waiting on
the stack (sessions, drains, restarts), not the CPU: on 2 cores the serial run took 26 min.
Here, in phase 1, the shared-stack binary (`tests/stack/`, whose tests already run side by
side in their own keyspaces and topics) and every other binary that leaves the stack
standing run two at a time (two workers, each taking the next binary as it finishes one); in
phase 2, the binaries that kill -9 Kafka or Cassandra (ALONE) run one at a time with nothing
beside them, since an outage would reach any test running then. When the two-datacenter
Cassandra of `make up-regions` is up, the binaries of its tests (REGIONS, ignored without
it) run in phase 1 too, one after another. Each binary is its own process, so a fail point
or a skewed clock never crosses from one to another (docs/testing.md, "Testing").

Writes each binary's output to $LIKES_CACHE/test-logs/, all of it in order to
$LIKES_CACHE/last-test.log, prints a line per binary as it ends and the failing tests' output
at the end, and exits non-zero if a test failed or a binary could not run. The tally
(`tests: N passed, M failed`, a binary that died before its own tally counted as a failure)
is its closing line and $LIKES_CACHE/test-summary, which CI prints last.
"""
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

# Binaries that take the shared stack down (kill -9 of the broker or of Cassandra): alone.
ALONE = ["kafka_outage", "cassandra_kill9", "stack_kill9"]
# The binary of the tests that share the stack (tests/stack/main.rs): the long pole, started
# first, with 4 test threads: its tests spend their time waiting on the stack and the stages
# they start (its own process used 58 s of CPU in a 616 s run at the default 2 threads).
SHARED = "stack"
SHARED_THREADS = "4"
# The binaries whose tests need the two-datacenter Cassandra (`make up-regions`); ignored
# without it. When it is up, they run with --include-ignored in phase 1, one after another
# (they kill only its nodes and their own stages, never the shared broker or Cassandra).
# Never more than two binaries at once: three on 2 cores (load average 28) pushed writes past
# their 2 s deadline and schema changes past 5 s.
REGIONS = ["regions", "regions_down", "regions_count", "regions_import"]

CACHE = Path(os.environ.get("LIKES_CACHE", Path.home() / ".cache" / "likes"))
LOGS = CACHE / "test-logs"
RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")
print_lock = threading.Lock()


def say(line):
    with print_lock:
        print(f"make test: {line}", flush=True)


def binaries(cargo_args):
    """Builds the tests (as `cargo test --no-run`) and lists each binary: (name, path, package dir)."""
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "test", *cargo_args, "--all-targets", "--no-run", "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"make test: the test build failed: {' '.join(cmd)}")
    found = []
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{target['name']} ({kind})"
        found.append((name, msg["executable"], str(Path(msg["manifest_path"]).parent)))
    return found


class Tally:
    def __init__(self):
        self.runs = []  # (order, name, log, rc, passed, failed, seconds)
        self.lock = threading.Lock()

    def add(self, *run):
        with self.lock:
            self.runs.append(run)


def run_one(order, name, exe, pkg_dir, tally, args=()):
    """Runs one test binary as cargo would (its package dir as cwd and CARGO_MANIFEST_DIR)."""
    log = LOGS / f"{order:02d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.log"
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg_dir)
    started = time.monotonic()
    with open(log, "w") as f:
        f.write(f"     Running {name} ({exe})\n")
        f.flush()
        rc = subprocess.run([exe, *args], cwd=pkg_dir, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - started
    passed = failed = 0
    seen_result = False
    for line in log.read_text(errors="replace").splitlines():
        m = RESULT.match(line)
        if m:
            seen_result = True
            passed += int(m.group(1))
            failed += int(m.group(2))
    if rc != 0 and not seen_result:
        failed += 1  # the binary died before its tally (a panic outside a test, a signal)
    tally.add(order, name, log, rc, passed, failed, seconds)
    outcome = "ok" if rc == 0 else f"FAILED (exit {rc})"
    say(f"{name}: {passed} passed, {failed} failed in {seconds:.0f} s: {outcome}")


def stream(runs, tally, args=()):
    for order, name, exe, pkg_dir in runs:
        extra = ["--test-threads", SHARED_THREADS] if name == SHARED else list(args)
        run_one(order, name, exe, pkg_dir, tally, extra)


def regions_up():
    """Whether both nodes of the two-datacenter Cassandra run (stack/stack.sh's pid files)."""
    state = Path(os.environ.get("LIKES_STACK_DIR", CACHE / "stack"))
    for node in ("cassandra-region-a", "cassandra-region-b"):
        try:
            pid = (state / f"{node}.pid").read_text().strip()
        except OSError:
            return False
        if not pid or not Path(f"/proc/{pid}").exists():
            return False
    return True


def main():
    cargo_args = sys.argv[1:]
    found = binaries(cargo_args)
    names = [n for n, _, _ in found]
    missing = [n for n in ALONE + [SHARED] + REGIONS if n not in names]
    if missing:
        sys.exit(f"make test: no test binary named {missing} (stack/run_tests.py's lists are stale)")
    LOGS.mkdir(parents=True, exist_ok=True)
    for old in LOGS.glob("*.log"):
        old.unlink()

    ordered = [(i, n, exe, d) for i, (n, exe, d) in enumerate(sorted(found, key=lambda b: b[0]))]
    shared = [r for r in ordered if r[1] == SHARED]
    alone = sorted((r for r in ordered if r[1] in ALONE), key=lambda r: ALONE.index(r[1]))
    with_regions = regions_up()
    regions = [r for r in ordered if r[1] in REGIONS] if with_regions else []
    beside = [r for r in ordered if r[1] != SHARED and r[1] not in ALONE and r not in regions]

    # Phase 1's work, in the order it is taken: two workers take the next item as each
    # finishes one, so no more than two binaries ever run at once. The shared-stack binary
    # first (the longest), then the two-region chain (its binaries one after another: one
    # takes a regional node down, which the others must not see), then the rest.
    work = queue.SimpleQueue()
    work.put((shared, ()))
    if regions:
        work.put((regions, ["--include-ignored"]))
    for r in beside:
        work.put(([r], ()))

    def worker():
        while True:
            try:
                runs, args = work.get_nowait()
            except queue.Empty:
                return
            stream(runs, tally, args)

    tally = Tally()
    started = time.monotonic()
    say(f"phase 1: {SHARED} and {len(beside)} other binaries, two at a time"
        + (f"; {', '.join(REGIONS)} with their ignored tests, one after another: the "
           "two-datacenter Cassandra is up" if with_regions else
           f"; {', '.join(REGIONS)} keep their tests ignored: the two-datacenter Cassandra is "
           "not up (`make up-regions` starts it, or `make test-regions` runs only them)"))
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phase1 = time.monotonic() - started
    say(f"phase 2: {', '.join(ALONE)}, each alone (they kill -9 Kafka or Cassandra)")
    stream(alone, tally)
    total = time.monotonic() - started

    runs = sorted(tally.runs)
    with open(CACHE / "last-test.log", "w") as out:
        for _, _, log, *_ in runs:
            out.write(log.read_text(errors="replace"))
    failing = [r for r in runs if r[3] != 0 or r[5] > 0]
    for _, name, log, rc, _, _, _ in failing:
        with print_lock:
            print(f"\n===== make test: {name} failed (exit {rc}); its output ({log}):", flush=True)
            print(log.read_text(errors="replace"), flush=True)
    say(f"phase 1 {phase1:.0f} s, phase 2 {total - phase1:.0f} s, total {total:.0f} s; the longest: "
        + ", ".join(f"{r[1]} {r[6]:.0f} s" for r in sorted(runs, key=lambda r: -r[6])[:6]))
    summary = f"tests: {sum(r[4] for r in runs)} passed, {sum(r[5] for r in runs)} failed"
    (CACHE / "test-summary").write_text(summary + "\n")
    print(summary, flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
