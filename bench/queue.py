"""How many agents can land at once: the merge queue against N agents, each a distinct passing
change, with a gate that sleeps 1 s (or, with --gate-kind cpu, computes for 1 s of CPU).

For N = 4, 8 and 16 agents, as N separate pytest processes started together and as one run
under pytest-xdist (``-n 2``, ``-n 4``), it prints the wall time from the first process's start
to the last one's exit, in gate durations; the gate runs (each agent's own first run, and the
re-tests of merges); the landings; and the attempts lost (always 0: an attempt is landed,
rejected, or reported). A last row puts one culprit among the separate processes: an agent
whose change breaks the gate only together with another's, and one row does by hand what the
queue does: each change in turn rebased onto the target, tested and pushed. No test asserts
any of it.

    python bench/queue.py            # the table, a few minutes
    python bench/queue.py --quick    # 4 agents, separate processes and -n 2, a 0.3 s gate (the smoke run)
"""

from __future__ import annotations

import sys

# This file is named as the issue names it, like the standard library's queue module: keep
# its own folder off the import path, so nothing imported below takes it for that module.
sys.path[:] = [p for p in sys.path if p and not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

GATE_S = 1.0
#: "sleep" (the gate waits: gate-bound) or "cpu" (it computes: CPU-bound).
GATE_KIND = "sleep"
#: How long each agent works before it writes its change (seconds; a real agent waits on
#: its model for minutes).
AGENT_S = 0.0
#: The smoke run's gate: long enough to overlap, short enough for the test suite.
QUICK_GATE_S = 0.3

GATE = textwrap.dedent(
    """
    import os, pathlib, sys, time
    pathlib.Path(os.environ["QUEUE_BENCH_LOG"]).open("a").write("run\\n")
    if {cpu}:  # a CPU-bound suite: the gate's time is a core's
        end = time.process_time() + {gate_s}
        while time.process_time() < end:
            pass
    else:  # a gate-bound one: waiting (a service, a sleep), no core used
        time.sleep({gate_s})
    here = pathlib.Path(".")
    culprit = os.environ.get("QUEUE_BENCH_CULPRIT")
    if culprit:
        a, b = culprit.split(",")
        sys.exit(1 if (here / f"agent-{{a}}.txt").exists() and (here / f"agent-{{b}}.txt").exists() else 0)
    """
)

AGENT = textwrap.dedent(
    """
    import pytest

    @pytest.mark.gated(task="agent {n}", agent="agent-{n}")
    def test_agent_{n}(agent_workspace):
        import time; time.sleep({agent_s})  # the agent at work: waiting on its model
        (agent_workspace.path / "agent-{n}.txt").write_text("{n}\\n")
    """
)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@e",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@e"}  # fmt: skip
    out = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, check=True)
    return out.stdout.decode().strip()


def setup(root: Path, n: int) -> tuple[Path, Path, Path]:
    """A small repository, the gate script, and a suite of ``n`` agent tests."""
    repo = root / "service"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.txt").write_text("a small service\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "start")
    git(repo, "checkout", "-q", "--detach")  # promotion moves main; nothing checked out follows
    gate = root / "gate.py"
    gate.write_text(GATE.format(gate_s=GATE_S, cpu=GATE_KIND == "cpu"))
    suite = root / "suite"
    suite.mkdir()
    for i in range(n):
        (suite / f"test_agent_{i}.py").write_text(AGENT.format(n=i, agent_s=AGENT_S))
    return repo, gate, suite


def run(n: int, mode: str, culprit: tuple[int, int] | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="agentgate-queue-") as tmp:
        root = Path(tmp)
        repo, gate, suite = setup(root, n)
        logs = root / "logs"
        logs.mkdir()
        log = logs / "gate.log"
        # Bytecode on, as a user's install has it (see write_bytecode).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "AGENTGATE_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env["QUEUE_BENCH_LOG"] = str(log)
        if culprit:
            env["QUEUE_BENCH_CULPRIT"] = f"{culprit[0]},{culprit[1]}"
        common = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--agentgate-repo={repo}", "--agentgate-target=main", "--agentgate-promote",
            f"--agentgate-gate-exit-code={sys.executable} {gate}",
            "--agentgate-gate-env=QUEUE_BENCH_LOG", "--agentgate-gate-env=QUEUE_BENCH_CULPRIT",
            f"--agentgate-sandbox-bind={gate}", f"--agentgate-sandbox-bind={logs}:rw",
        ]  # fmt: skip
        changes = prepare_by_hand(repo, n) if mode == "by hand" else []
        begin = time.perf_counter()
        if mode == "by hand":
            codes = by_hand(repo, changes, gate, env)
        elif mode == "two machines":
            codes, repo = two_machines(root, repo, suite, n, env, common)
        elif mode == "separate":
            procs = [
                subprocess.Popen(
                    [*common, f"test_agent_{i}.py", f"--basetemp={root / f'tmp-{i}'}"],
                    cwd=suite,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for i in range(n)
            ]
            codes = [p.wait(timeout=900) for p in procs]
        else:
            codes = [
                subprocess.run(
                    [*common, "-n", mode.rsplit(maxsplit=1)[-1], f"--basetemp={root / 'tmp'}"],
                    cwd=suite, env=env, capture_output=True, check=False, timeout=900,
                ).returncode
            ]  # fmt: skip
        wall = time.perf_counter() - begin
        on_main = set(git(repo, "ls-tree", "--name-only", "main").splitlines())
        landed = sum(1 for i in range(n) if f"agent-{i}.txt" in on_main)
        # Every attempt has a record; those not on main were rejected.
        attempts = len(
            git(
                repo, "for-each-ref", "--format=%(refname)", "refs/agentgate/attempts/"
            ).splitlines()
        )
        if mode == "by hand":  # no attempt records: every change is landed or refused
            attempts = n
        runs = len(log.read_text().splitlines()) if log.exists() else 0
        git(repo, "fsck", "--strict", "--no-progress")
        return {
            "agents": n,
            "wall_s": wall,
            "gate_durations": wall / GATE_S,
            "gate_runs": runs,
            "retests": runs - n,
            "landed": landed,
            "rejected": attempts - landed,
            "lost": n - attempts,
            "failed_processes": sum(1 for c in codes if c != 0),
        }


def write_bytecode() -> None:
    """Compile the plugin before the clock starts, as pip does when it installs a wheel.

    An editable install under PYTHONDONTWRITEBYTECODE (set on this project's machines) has
    no bytecode, so every process would compile each module again: about 0.17 s of CPU a
    pytest process here, which sixteen processes on two cores pay in wall time, and which no
    user's installed plugin costs.
    """
    import compileall

    import pytest_agentgate

    compileall.compile_dir(Path(pytest_agentgate.__file__).parent, quiet=2)


def prepare_by_hand(repo: Path, n: int) -> list[str]:
    """Each agent's change as a person would get it: a commit on the base, on a branch."""
    base = git(repo, "rev-parse", "main")
    changes = []
    for i in range(n):
        git(repo, "checkout", "-q", "--detach", base)
        (repo / f"agent-{i}.txt").write_text(f"{i}\n")
        git(repo, "add", f"agent-{i}.txt")
        git(repo, "commit", "-q", "-m", f"agent {i}")
        changes.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "--detach", base)
    return changes


def by_hand(repo: Path, changes: list[str], gate: Path, env: dict[str, str]) -> list[int]:
    """What a person does without the queue, one change after another: rebase it onto the
    target's tip, run the gate on the result, and push it (the ref moves from the tip it
    was rebased on)."""
    codes = []
    for change in changes:
        tip = git(repo, "rev-parse", "main")
        git(repo, "checkout", "-q", "--detach", tip)
        git(repo, "cherry-pick", "--allow-empty", change)
        code = subprocess.run(
            [sys.executable, str(gate)], cwd=repo, env=env, check=False
        ).returncode
        codes.append(code)
        if code == 0:
            git(repo, "update-ref", "refs/heads/main", "HEAD", tip)
    git(repo, "checkout", "-q", "--detach", "main")
    return codes


def signing_keys(root: Path, machines: int) -> list[list[str]]:
    """A signing key for each machine and one allowed-signers file naming them all: the
    flags each machine's run gets (its posts on the server's queue are signed, and checked)."""
    allowed = root / "allowed_signers"
    lines, flags = [], []
    for side in range(machines):
        key = root / f"key-{side}"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"m{side}", "-f", str(key)],
            check=True,
        )
        lines.append(f"machine-{side} " + " ".join(Path(f"{key}.pub").read_text().split()[:2]))
        flags.append([f"--agentgate-signing-key={key}", f"--agentgate-allowed-signers={allowed}"])
    allowed.write_text("\n".join(lines) + "\n")
    return flags


def two_machines(
    root: Path, repo: Path, suite: Path, n: int, env: dict[str, str], common: list[str]
) -> tuple[list[int], Path]:
    """Two clones of a bare repository served by a real ``git daemon`` (two machines),
    each running ``-n 2`` over half of the agents, at once; the server, to count from."""
    import socket

    server = root / "server" / "service.git"
    server.parent.mkdir()
    git(root, "clone", "-q", "--bare", str(repo), str(server))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    daemon = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
         "--enable=receive-pack", f"--base-path={server.parent}", str(server.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(200):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        url = f"git://127.0.0.1:{port}/{server.name}"
        keys = signing_keys(root, 2)
        procs = []
        for side in (0, 1):
            work = root / f"machine-{side}"
            git(root, "clone", "-q", url, str(work))
            mine = [f"test_agent_{i}.py" for i in range(n) if i % 2 == side]
            argv = [
                a.replace(f"--agentgate-repo={repo}", f"--agentgate-repo={work}")
                for a in common if a != "--agentgate-target=main"
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [*argv, "--agentgate-remote=origin", "--agentgate-target=main", "-n", "2",
                     *keys[side], *mine, f"--basetemp={root / f'tmp-m{side}'}"],
                    cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    # What landed is counted on the server; every record is there too.
    return codes, server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 agents only: a smoke run")
    parser.add_argument(
        "--case", action="append", default=[],
        help="only this row, as AGENTS:HOW (HOW: separate, '-n 2', '-n 4', 'by hand'); may repeat",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="run each row this many times")
    parser.add_argument(
        "--gate-kind", choices=("sleep", "cpu"), default="sleep",
        help="a gate that waits (sleep: gate-bound) or computes (cpu: CPU-bound) for its time",
    )  # fmt: skip
    parser.add_argument(
        "--agent-s", type=float, default=0.0, help="each agent works this long (seconds)"
    )
    args = parser.parse_args(argv)
    global GATE_S, GATE_KIND, AGENT_S
    GATE_KIND, AGENT_S = args.gate_kind, args.agent_s
    if args.quick:
        GATE_S = QUICK_GATE_S
    sizes = [4] if args.quick else [4, 8, 16]
    modes = ["separate", "-n 2"] if args.quick else ["separate", "-n 2", "-n 4"]
    print(f"merge queue: agents landing distinct passing changes, gate = {GATE_KIND} {GATE_S:g} s, "
          f"agent = {AGENT_S:g} s; "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'agents':>6}  {'how':<24} {'wall s':>7} {'in gates':>9} {'gate runs':>10} "
          f"{'re-tests':>9} {'landed':>7} {'rejected':>9} {'lost':>5}")  # fmt: skip
    plan: list[tuple[int, str, tuple[int, int] | None]] = [
        (n, mode, None) for n in sizes for mode in modes
    ]
    if not args.quick:
        plan.append((16, "by hand", None))
        plan.append((16, "separate", (3, 11)))
        plan.append((8, "two machines", None))
    if args.case:
        plan = [(int(c.split(":", 1)[0]), c.split(":", 1)[1], None) for c in args.case]
    plan = [step for step in plan for _ in range(max(1, args.repeat))]
    write_bytecode()
    for n, mode, culprit in plan:
        row = run(n, mode, culprit)
        how = mode if mode != "separate" else "separate processes"
        if mode == "-n 0":
            how = "one process, in turn"
        if mode == "two machines":
            how = "two machines, -n 2 each"
        if mode == "by hand":
            how = "by hand, one at a time"
        if culprit:
            how += ", one culprit"
        print(
            f"{n:>6}  {how:<24} {row['wall_s']:>7.1f} {row['gate_durations']:>9.1f} "
            f"{row['gate_runs']:>10} {row['retests']:>9} {row['landed']:>7} {row['rejected']:>9} "
            f"{row['lost']:>5}"
        )
        if row["lost"]:
            print("LOST ATTEMPTS: the queue lost work", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
