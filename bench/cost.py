"""What a gate costs over the tests it runs: a synthetic suite of N tests, its pytest command
run plainly in a checkout and run as a gate (a later attempt's gate step: the first computes
the base's results once, the second is where the plugin compiles the base's modules once),
side by side, rounds interleaved so that a busy moment of the machine falls on both.

    python bench/cost.py                 # 50,000 tests, 3 rounds (several minutes)
    python bench/cost.py --tests 62000   # packaging's size
    python bench/cost.py --quick         # 500 tests, 1 round (the smoke run)

It prints each round and the medians, gated against plain with no bytecode yet (cold: a
fresh clone, as the first gate on a base is) and with the bytecode of the run before
(warm). The gate runs in the sandbox the machine has (``--sandbox none`` to leave it out);
the plain run has none. No test asserts any of it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_agentgate import Engine, GateSpec
from pytest_agentgate.sandbox.containment import Settings

COMMAND = "python -m pytest -q -p no:cacheprovider tests"
PER_MODULE = 100


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@e",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@e"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


def suite(root: Path, tests: int) -> Path:
    """A repository holding a small package and ``tests`` fast tests of it."""
    repo = root / "project"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    for m in range(0, tests, PER_MODULE):
        body = "from pkg import double\n" + "".join(
            f"\n\ndef test_{n}():\n    assert double({n}) == {2 * n}\n"
            for n in range(m, min(m + PER_MODULE, tests))
        )
        (repo / "tests" / f"test_m{m // PER_MODULE:04d}.py").write_text(body)
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a large suite")
    return repo


def plain(checkout: Path, cold: bool) -> float:
    """The command run by hand in a checkout of the same commit (seconds): ``cold`` with no
    bytecode yet (a fresh clone, as a CI job has it, and as the first gate on a base has
    it), else with the bytecode of the run before (a person's second run; a later gate is
    given bytecode the plugin compiled from the base, see ``judge/bytecode.py``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTGATE_"))}
    if cold:
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="agentgate-cost-pyc-")
    begin = time.perf_counter()
    done = subprocess.run(COMMAND.split(), cwd=checkout, env=env, capture_output=True, check=False)
    took = time.perf_counter() - begin
    if done.returncode != 0:
        raise RuntimeError(f"the plain run failed: {done.stdout.decode()[-2000:]}")
    return took


def gated(engine: Engine, n: int) -> float:
    """One attempt's gate step (seconds), its change a new module the tests do not touch."""
    ws = engine.fork(task=f"change {n}")
    (ws.path / "pkg" / f"extra_{n}.py").write_text(f"X = {n}\n")
    attempt = engine.run_attempt(ws, task=f"change {n}")
    if attempt.verdict.status != "passed":
        raise RuntimeError(f"the gated run did not pass: {attempt.verdict}")
    engine.release(ws)
    return attempt.timings["gate"] / 1000


def _row(label: str, cold: float, warm: float, gate: float) -> str:
    return (
        f"  {label:>5}  {cold:13.2f}  {warm:13.2f}  {gate:8.2f}  "
        f"{(gate / cold - 1) * 100:+9.1f}%  {(gate / warm - 1) * 100:+9.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto")
    parser.add_argument("--quick", action="store_true", help="500 tests, one round")
    args = parser.parse_args(argv)
    tests, rounds = (500, 1) if args.quick else (args.tests, args.rounds)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's machine has it
    with tempfile.TemporaryDirectory(prefix="agentgate-cost-") as tmp:
        root = Path(tmp)
        repo = suite(root, tests)
        checkout = root / "by-hand"
        git(root, "clone", "-q", str(repo), str(checkout))
        engine = Engine.open(
            repo, "main", promote=False, workdir=root / "work", sandbox=Settings(mode=args.sandbox),
            gate=GateSpec(commands=(COMMAND,), timeout=3600),
        )  # fmt: skip
        try:
            print(
                f"gate cost: {tests:,} tests, `{COMMAND}`; {platform.platform()}, Python "
                f"{platform.python_version()}, {os.cpu_count()} cores; sandbox {args.sandbox}"
            )
            first = gated(engine, 0)  # computes the base's results once, as a first gate does
            # The next attempt stands on the first (the dry run's target moved): its gate is
            # where the plugin compiles the modules of a base it has not seen, once, as the
            # plain column's first run compiles them for the runs after it.
            once = gated(engine, 1)
            plain(checkout, cold=False)  # the files in the page cache, bytecode written
            print(f"  first gate (with the base's results computed): {first:7.2f} s")
            print(f"  next gate (the plugin compiles the base's modules once): {once:7.2f} s")
            print(f"  {'round':>5}  {'plain, cold s':>13}  {'plain, warm s':>13}  {'gated s':>8}  "
                  f"{'gated/cold':>10}  {'gated/warm':>10}")  # fmt: skip
            rows: list[tuple[float, float, float]] = []
            for r in range(rounds):
                rows.append((plain(checkout, True), plain(checkout, False), gated(engine, r + 2)))
                print(_row(str(r + 1), *rows[-1]))
            medians = [statistics.median(column) for column in zip(*rows, strict=True)]
            print(_row("median", *medians))
            if args.quick:  # two more gates of the whole suite: the smoke run has no need
                print("  another engine of this process: left out of a --quick run")
            else:
                again = _another(repo, root, args)
                print(f"  another engine of this process, its first gate: {again:7.2f} s (the "
                      f"first engine's: {first:.2f} s)")  # fmt: skip
        finally:
            engine.close()
            shutil.rmtree(root / "work", ignore_errors=True)
    return 0


def _another(repo: Path, root: Path, args: argparse.Namespace) -> float:
    """The first gate of a second engine in this process (an orchestrator's next repository,
    a test suite's next test): the base's results computed again, as in the first engine's
    first gate, and given at once the environment's bytecode this process compiled of the
    modules it imported itself (a pytest run has pytest's; this script, only the plugin's)."""
    engine = Engine.open(
        repo, "main", promote=False, workdir=root / "work-2", sandbox=Settings(mode=args.sandbox),
        gate=GateSpec(commands=(COMMAND,), timeout=3600),
    )  # fmt: skip
    try:
        return gated(engine, 10_000)
    finally:
        engine.close()
        shutil.rmtree(root / "work-2", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
