"""False rejections on real history: real changes of real projects, replayed as honest agents
under the gate spellings projects write; how many the plugin refuses, and why. The figure to
hold is 0.

Each real change is two consecutive releases of a project on the package registry whose
sdist holds its tests (cachetools, a src layout; more-itertools, a flat one): the older
release is the base, and an honest agent writes the newer one's files into its workspace.
The test files the release changed are named on the task (``allow_changed``), as a task
that changes tests on purpose says so; the tests it adds are the agent's own. For each gate
spelling the same command is first run by hand in a checkout of each release: only a
spelling whose tests pass plainly at both is replayed (one that fails by hand is listed as
such, never counted). Last, four replays run at once as separate processes on one
repository, each a dry run judged against the same base, so the base's results are made by
one process and used by the others.

    python bench/false_rejections.py           # both projects, every spelling, 4 at once
    python bench/false_rejections.py --quick   # a small src-layout project made here, offline
    AGENTGATE_BENCH_UNDECLARED=1 python bench/false_rejections.py   # tasks that do not say so

Exits 1 when any replay that passes by hand was refused.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

PY = sys.executable
BIN = os.path.dirname(PY)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
}  # fmt: skip
#: (distribution, older release, newer release, the folder the code is imported from).
PROJECTS = (("cachetools", "5.4.0", "5.5.0", "src"), ("more-itertools", "10.4.0", "10.5.0", "."))
#: Files of an sdist that are the build's, not the project's.
_BUILT = ("PKG-INFO",)
QUIET = "-q -p no:cacheprovider"


def spellings(path: str) -> dict[str, str]:
    """Each gate spelling, for code imported from ``path`` (``src`` or ``.``)."""
    return {
        "-o pythonpath": f"{PY} -m pytest {QUIET} -o pythonpath={path} tests",
        "env PYTHONPATH": f"env PYTHONPATH={path} {PY} -m pytest {QUIET} tests",
        "sh -c PYTHONPATH": f"sh -c 'echo gate; PYTHONPATH={path} python -m pytest {QUIET} tests'",
        "Makefile": "make -f agentgate.mk test",
        "tox setenv": "tox -q -c agentgate-tox.ini -e py",
        "--import-mode=importlib": (
            f"{PY} -m pytest {QUIET} --import-mode=importlib -o pythonpath={path} tests"
        ),
    }


def harness_files(path: str) -> dict[str, str]:
    """The recipe files the Makefile and tox spellings run (the project's own)."""
    return {
        "agentgate.mk": f"test:\n\tPYTHONPATH={path} python -m pytest {QUIET} tests\n",
        "agentgate-tox.ini": textwrap.dedent(
            f"""\
            [tox]
            env_list = py
            [testenv]
            skip_install = true
            system_site_packages = true
            pass_env = AGENTGATE_RESULTS, PYTEST_PLUGINS, PYTHONPATH
            setenv = PYTHONPATH = {path}{{:}}{{env:PYTHONPATH:}}
            commands = python -m pytest {QUIET} tests
            """
        ),
    }


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def fetch(name: str, version: str, cache: Path) -> Path:
    """The unpacked sdist of ``name==version`` (downloaded once into ``cache``)."""
    unpacked = cache / f"{name}-{version}"
    if unpacked.is_dir():
        return unpacked
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [PY, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"{name}=={version}", "-d", str(cache)],
        check=True, capture_output=True,
    )  # fmt: skip
    archive = next(
        p for p in cache.iterdir()
        if p.name.lower().replace("_", "-").startswith(f"{name}-{version}".lower())
        and p.name.endswith(".tar.gz")
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        shutil.move(str(top), unpacked)
    return unpacked


def files_of(release: Path) -> dict[str, bytes]:
    found = {}
    for path in sorted(release.rglob("*")):
        rel = path.relative_to(release).as_posix()
        if path.is_file() and rel not in _BUILT and ".egg-info/" not in rel:
            found[rel] = path.read_bytes()
    return found


def lay(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def passes_by_hand(files: dict[str, bytes], command: str, tmp: Path) -> bool:
    checkout = Path(tempfile.mkdtemp(dir=tmp))
    lay(checkout, files)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", command], cwd=checkout, env=env, capture_output=True, check=False
    )
    return done.returncode == 0


def base_repo(files: dict[str, bytes], root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    lay(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the older release")
    return repo


def replay(
    repo: Path, old: dict[str, bytes], new: dict[str, bytes], command: str, promote: bool
) -> tuple[str, str]:
    """One honest agent writes the newer release over the older one: (status, reason)."""
    from pytest_agentgate import Engine, GateSpec
    from pytest_agentgate.judge.base_tests import TestFiles

    tests = TestFiles(folders=frozenset({"tests"}))  # both projects keep their tests there
    changed_tests = tuple(p for p in old if p in new and old[p] != new[p] and p in tests)
    if os.environ.get("AGENTGATE_BENCH_UNDECLARED"):  # the task does not say it changes tests
        changed_tests = ()
    gate = GateSpec(
        commands=(command,), timeout=600, allow_changed=changed_tests,
        env={"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    e = Engine.open(
        repo, "main", promote=promote, workdir=repo.parent / f"work-{os.getpid()}", gate=gate
    )
    try:
        ws = e.fork(task="the newer release")
        for rel in old:
            if rel not in new:
                (ws.path / rel).unlink()
        lay(ws.path, new)
        done = e.run_attempt(ws, task="the newer release")
        return done.verdict.status, done.verdict.reason
    finally:
        e.close()


def quick_project() -> tuple[dict[str, bytes], dict[str, bytes], str]:
    """A small src-layout project and a real-looking release of it: a new function, its
    test, and an existing test module changed (named as such)."""
    store = (
        "class Store:\n    def __init__(self):\n        self.rows = []\n\n"
        "    def add(self, x):\n        self.rows.append(x)\n"
    )
    test = (
        "from ledger.store import Store\n\n\ndef test_add():\n    s = Store()\n"
        "    s.add(1)\n    assert s.rows == [1]\n"
    )
    old = {
        "src/ledger/__init__.py": b"",
        "src/ledger/store.py": store.encode(),
        "tests/test_store.py": test.encode(),
        "pyproject.toml": b'[project]\nname = "ledger"\nversion = "1"\n',
    }
    new = dict(old)
    new["src/ledger/store.py"] = (
        store + "\n    def total(self):\n        return sum(self.rows)\n"
    ).encode()
    new["tests/test_store.py"] = (
        test + "\n\ndef test_total():\n    s = Store()\n    s.add(2)\n    assert s.total() == 2\n"
    ).encode()
    new["tests/test_more.py"] = b"def test_more():\n    assert True\n"
    return old, new, "src"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a project made here, offline")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "agentgate-bench")
    parser.add_argument("--at-once", type=int, default=4, help="replays at once as processes")
    parser.add_argument(
        "--worker", nargs=3, metavar=("REPO", "RELEASES", "COMMAND"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(*args.worker)
    if args.quick:
        old, new, path = quick_project()
        projects = [("made here", old, new, path)]
    else:
        projects = []
        for name, older, newer, path in PROJECTS:
            old = files_of(fetch(name, older, args.cache))
            new = files_of(fetch(name, newer, args.cache))
            projects.append((f"{name} {older} -> {newer}", old, new, path))
    rows, refused = [], 0
    with tempfile.TemporaryDirectory(prefix="agentgate-false-") as tmp:
        for label, older, newer, path in projects:
            recipes = {k: v.encode() for k, v in harness_files(path).items()}
            old, new = {**older, **recipes}, {**newer, **recipes}
            for spelling, command in spellings(path).items():
                if args.quick and spelling not in ("-o pythonpath", "sh -c PYTHONPATH"):
                    continue
                if not (
                    passes_by_hand(old, command, Path(tmp))
                    and passes_by_hand(new, command, Path(tmp))
                ):
                    rows.append((label, spelling, "fails by hand", "-", 0.0, ""))
                    continue
                root = Path(tempfile.mkdtemp(dir=tmp))
                repo = base_repo(old, root)
                begin = time.perf_counter()
                status, reason = replay(repo, old, new, command, promote=True)
                refused += status != "promoted"
                rows.append(
                    (label, spelling, "passes", status, time.perf_counter() - begin, reason)
                )
            if args.at_once > 1:
                rows.append(
                    _at_once(
                        old,
                        new,
                        spellings(path)["sh -c PYTHONPATH"],
                        label,
                        args.at_once,
                        Path(tmp),
                    )
                )
                refused += rows[-1][3] != "promoted"
    print(f"{'change':<34} {'gate spelling':<24} {'by hand':<14} {'verdict':<10} {'s':>6}  why")
    for label, spelling, by_hand, status, seconds, reason in rows:
        print(
            f"{label:<34} {spelling:<24} {by_hand:<14} {status:<10} {seconds:6.1f}  {reason[:160]}"
        )
    judged = sum(1 for r in rows if r[3] != "-")
    print(f"\nrefused: {refused} of {judged} honest replays that pass by hand")
    return 1 if refused else 0


def _at_once(
    old: dict[str, bytes], new: dict[str, bytes], command: str, label: str, n: int, tmp: Path
) -> tuple[str, str, str, str, float, str]:
    """``n`` replays at once, as separate processes, dry runs on one repository."""
    import json

    repo = base_repo(old, Path(tempfile.mkdtemp(dir=tmp)))
    releases = Path(tempfile.mkdtemp(dir=tmp)) / "releases.json"
    releases.write_text(
        json.dumps(
            {
                "old": {k: v.decode("latin-1") for k, v in old.items()},
                "new": {k: v.decode("latin-1") for k, v in new.items()},
            }
        )
    )
    begin = time.perf_counter()
    procs = [
        subprocess.Popen(
            [PY, __file__, "--worker", str(repo), str(releases), command],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    outcomes = [p.communicate()[0].strip().splitlines()[-1] for p in procs]
    bad = [o for o in outcomes if not o.startswith("promoted")]
    status = "promoted" if not bad else bad[0].split(" ", 1)[0]
    return (
        label,
        f"{n} at once (sh -c)",
        "passes",
        status,
        time.perf_counter() - begin,
        "; ".join(bad)[:300],
    )


def _worker(repo: str, releases: str, command: str) -> int:
    import json

    data = json.loads(Path(releases).read_text())
    old = {k: v.encode("latin-1") for k, v in data["old"].items()}
    new = {k: v.encode("latin-1") for k, v in data["new"].items()}
    status, reason = replay(Path(repo), old, new, command, promote=False)
    # A dry run's verdict for a passing attempt is "passed".
    print(("promoted" if status == "passed" else status) + " " + reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
