"""The base's tests judge the attempt's code, in a session that loads none of the agent's
test files; the agent's added and changed test modules run in a second session and must pass.

Each cheat breaks the code (the store drops what it is given) and edits the tests so that
they pass anyway; each honest change edits the tests as an honest agent does. Both sandbox
modes run the cheats a test module plays inside the runner's process.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from helpers import SERVICE, git, write
from test_judging import BROKEN_STORE, GOOD_STORE, attempt, engine

#: Each test judges attempts on the service's base: its results are computed once a worker.
pytestmark = pytest.mark.shared_baselines

TESTS = textwrap.dedent(SERVICE["tests/test_ledger.py"]).lstrip("\n")

#: The assertions turned into a try/except that swallows them.
WEAKENED = TESTS.replace(
    "    assert handle([1, 2]) == [1, 2, 0]",
    "    try:\n        assert handle([1, 2]) == [1, 2, 0]\n    except AssertionError:\n        pass",
).replace(
    "    assert build([3]).entries() == [3]",
    "    try:\n        assert build([3]).entries() == [3]\n    except AssertionError:\n        pass",
)

#: A new test module that patches the code in the runner's process, so the base's tests pass.
MONKEYPATCH = """
import ledger.store


def _add(self, amount):
    self._rows.append(amount)


ledger.store.Store.add_entry = _add


def test_compat():
    assert True
"""

CHEATS = {
    "an assertion weakened": {"tests/test_ledger.py": WEAKENED},
    "a test module that monkeypatches the code": {"tests/test_aaa_compat.py": MONKEYPATCH},
    "the failing tests marked xfail": {
        "tests/test_ledger.py": "import pytest\npytestmark = pytest.mark.xfail\n" + TESTS
    },
    "a helper under tests/ that patches on import": {
        "tests/__init__.py": "",
        "tests/test_ledger.py": "from tests import compat  # noqa\n" + TESTS,
        "tests/compat.py": MONKEYPATCH,
    },
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_test_cheat_is_rejected_by_default(service: Path, sandbox_mode: str, cheat: str) -> None:
    e = engine(service, sandbox=sandbox_mode)
    before = git(service, "rev-parse", "main")
    verdict = attempt(e, {"ledger/store.py": BROKEN_STORE, **CHEATS[cheat]}).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "no longer pass" in verdict.reason or "changes protected paths" in verdict.reason
    assert git(service, "rev-parse", "main") == before


def test_the_monkeypatching_module_is_named_in_the_record(service: Path) -> None:
    e = engine(service, sandbox="none")
    done = attempt(
        e, {"ledger/store.py": BROKEN_STORE, **CHEATS["a test module that monkeypatches the code"]}
    )
    assert done.verdict.status == "rejected"  # type: ignore[attr-defined]
    assert "tests/test_ledger.py::test_handle" in done.verdict.reason  # type: ignore[attr-defined]
    message = git(service, "log", "-1", "--format=%B", done.record_ref)  # type: ignore[attr-defined]
    assert "Test files changed (1): tests/test_aaa_compat.py" in message


NEW_FEATURE = GOOD_STORE + "\n    def total(self):\n        return sum(self._rows)\n"
NEW_TEST = """from ledger.store import Store


def test_total():
    s = Store()
    s.add_entry(2)
    s.add_entry(3)
    assert s.total() == 5
"""


@pytest.mark.parametrize("where", ["a new test module", "an existing test module"])
def test_an_honest_feature_with_its_tests_is_promoted(
    service: Path, sandbox_mode: str, where: str
) -> None:
    e = engine(service, sandbox=sandbox_mode)
    tests = (
        {"tests/test_total.py": NEW_TEST}
        if where == "a new test module"
        else {
            "tests/test_ledger.py": TESTS
            + "\n\n"
            + NEW_TEST.replace(
                "from ledger.store import Store\n\n\n", "from ledger.store import Store\n"
            )
        }
    )
    done = attempt(e, {"ledger/store.py": NEW_FEATURE, **tests}, task="add total")
    assert done.verdict.status == "promoted", done.verdict  # type: ignore[attr-defined]
    assert done.results["changed_tests"] == sorted(tests)  # type: ignore[attr-defined]
    assert done.results["new"] >= 1  # type: ignore[attr-defined]
    assert git(service, "show", "main:ledger/store.py").count("def total") == 1


def test_a_new_test_that_fails_rejects_with_its_session_named(service: Path) -> None:
    e = engine(service, sandbox="none")
    failing = NEW_TEST.replace("== 5", "== 6")
    verdict = attempt(e, {"ledger/store.py": NEW_FEATURE, "tests/test_total.py": failing}).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected"
    assert "the attempt's own test files" in verdict.reason
    assert "tests/test_total.py::test_total" in verdict.reason


def test_the_second_session_collects_only_the_agents_modules(service: Path) -> None:
    """A base test module that cannot even be imported in the second session is never
    collected there: that session runs what the agent wrote, nothing else."""
    e = engine(service, sandbox="none")
    marker = service.parent / "imported"
    spy = f"import pathlib\n\npathlib.Path({str(marker)!r}).open('a').write('x')\n\n\ndef test_it():\n    pass\n"
    done = attempt(e, {"tests/test_total.py": spy})
    assert done.verdict.status == "promoted", done.verdict  # type: ignore[attr-defined]
    # Imported by the second session alone (the first session has no such file).
    assert marker.read_text() == "x"


STORE_TEST = """
from ledger.store import Store


def test_add_entry():
    s = Store()
    s.add_entry(1)
    assert s.entries() == [1]
"""
STORE_TEST_RENAMED = STORE_TEST.replace("s.add_entry(1)", "s.add(1)")
RENAMED_STORE = GOOD_STORE.replace("def add_entry", "def add")
RENAMED = {
    "ledger/store.py": RENAMED_STORE,
    "ledger/report.py": textwrap.dedent(SERVICE["ledger/report.py"]).replace("add_entry", "add"),
    "ledger/api.py": textwrap.dedent(SERVICE["ledger/api.py"]).replace("add_entry", "add"),
    "tests/test_ledger.py": TESTS
    + "\n\ndef test_add_is_the_name():\n    assert handle([]) == [0]\n",
}


def test_a_task_that_changes_tests_on_purpose_says_so(service: Path) -> None:
    """A rename that the base's tests see break is refused, unless the task names the test
    files it changes on purpose."""
    e = engine(service, sandbox="none")
    # The base's tests use no add_entry directly: they pass; a base test that did would not.
    write(service, {"tests/test_store.py": STORE_TEST})
    git(service, "add", "tests/test_store.py")
    git(service, "commit", "-qm", "a test of the store's method")
    renamed = {**RENAMED, "tests/test_store.py": STORE_TEST_RENAMED}
    e = engine(service, sandbox="none")
    refused = attempt(e, renamed, task="rename add_entry").verdict  # type: ignore[attr-defined]
    assert refused.status == "rejected"
    assert "tests/test_store.py::test_add_entry" in refused.reason
    e = engine(service, sandbox="none", allow_changed=("tests/test_store.py",))
    assert attempt(e, renamed, task="rename add_entry again").verdict.status == "promoted"  # type: ignore[attr-defined]


def test_a_test_id_named_as_changed_is_not_required_of_the_base_session(service: Path) -> None:
    write(service, {"tests/test_store.py": STORE_TEST})
    git(service, "add", "tests/test_store.py")
    git(service, "commit", "-qm", "a test of the store's method")
    renamed = {**RENAMED, "tests/test_store.py": STORE_TEST_RENAMED}
    e = engine(service, sandbox="none", allow_changed=("tests/test_store.py::test_add_entry",))
    verdict = attempt(e, renamed).verdict  # type: ignore[attr-defined]
    assert verdict.status == "promoted", verdict


def test_the_attempts_tests_judge_when_asked(service: Path) -> None:
    """tests_of="attempt": one session of the attempt's whole tree, its tests as it left
    them: the weakened assertion is then the attempt's to make (and lands)."""
    e = engine(service, sandbox="none", tests_of="attempt")
    verdict = attempt(
        e, {"ledger/store.py": BROKEN_STORE, **CHEATS["an assertion weakened"]}
    ).verdict  # type: ignore[attr-defined]
    assert verdict.status == "promoted", verdict


@pytest.mark.shared_baselines(False)  # it counts the results this test kept
def test_no_test_file_changed_is_one_session(service: Path) -> None:
    """An attempt that leaves the tests alone is judged once: its results are its tree's,
    kept as that tree's baseline."""
    e = engine(service, sandbox="none")
    done = attempt(e, {"ledger/store.py": GOOD_STORE + "\n# a comment\n"})
    assert done.verdict.status == "promoted"  # type: ignore[attr-defined]
    assert "changed_tests" not in (done.results or {})  # type: ignore[attr-defined]
    kept = git(service, "for-each-ref", "--format=%(refname)", "refs/agentgate/results/")
    assert len(kept.splitlines()) == 2  # the base's baseline, and the attempt's tree's


def test_a_python_of_the_gate_named_by_path_still_reports(service: Path) -> None:
    """The second session's selection works for a pytest the plugin starts with a path."""
    e = engine(
        service, sandbox="none", command=f"{sys.executable} -m pytest -q -p no:cacheprovider tests/"
    )
    done = attempt(e, {"ledger/store.py": NEW_FEATURE, "tests/test_total.py": NEW_TEST})
    assert done.verdict.status == "promoted", done.verdict  # type: ignore[attr-defined]
    assert done.results["passed"] == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["tests/__init__.py", "tests/conftest.py"])
def test_a_change_that_runs_the_same_code_is_not_a_harness_change(service: Path, name: str) -> None:
    """Found replaying cachetools 5.4.0 -> 5.5.0: a blank line removed from tests/__init__.py
    was refused as a change of the harness. A blank line, a comment or a docstring changes
    nothing that runs; a statement still does."""
    write(service, {name: '"""The tests."""\n\nimport os\n'})
    git(service, "add", "-A")
    git(service, "commit", "-qm", f"a {name}")
    e = engine(service, sandbox="none")
    cosmetic = attempt(e, {name: '"""The tests, reworded."""\nimport os  # needed\n'}, "tidy")
    assert cosmetic.verdict.status == "promoted", cosmetic.verdict  # type: ignore[attr-defined]
    real = attempt(e, {name: '"""The tests."""\n\nimport os\nos.environ["X"] = "1"\n'}, "code")
    assert real.verdict.status == "rejected"  # type: ignore[attr-defined]
    assert "changes protected paths" in real.verdict.reason  # type: ignore[attr-defined]


# -- the second round: attacks by a reader of the two-session code ----------------------

_T = textwrap.dedent(SERVICE["tests/test_ledger.py"])
_WEAK_T = _T.replace("assert handle", "handle").replace("assert build", "build")
_FALLBACK = "try:\n    from {module} import Store\nexcept ImportError:\n" + textwrap.indent(
    GOOD_STORE, "    "
)
_HELPED = (
    "from helpers import assert_entries\nfrom ledger.api import handle\n"
    "from ledger.report import build\n\n\ndef test_handle():\n"
    "    assert_entries(handle([1, 2]), [1, 2, 0])\n\n\ndef test_build():\n"
    "    assert_entries(build([3]).entries(), [3])\n"
)
_HELPER = "def assert_entries(got, expected):\n    assert got == expected\n"
_DOC = ">>> from ledger.api import handle\n>>> handle([1, 2])\n[1, 2, 0]\n"
_COMPARE = "def same_entries(a, b):\n    return list(a) == list(b)\n"

#: name -> (the base's extra files, the base's removed files, the gate's test path, the
#: attempt's files): each landed a broken change before it was closed.
SECOND_ROUND: dict[str, tuple[dict[str, str], tuple[str, ...], str, dict[str, str]]] = {
    "code the package imports, added below a testing folder": (
        {}, (), "tests",
        {"ledger/store.py": _FALLBACK.format(module="ledger.testing.impl"),
         "ledger/testing/impl.py": BROKEN_STORE},
    ),
    "code the package imports, added as a module named like a test": (
        {}, (), "tests",
        {"ledger/store.py": _FALLBACK.format(module="ledger.store_impl_test"),
         "ledger/store_impl_test.py": BROKEN_STORE},
    ),
    "code in a package's testing folder": (
        {"ledger/testing/__init__.py": "", "ledger/testing/compare.py": _COMPARE,
         "tests/test_compare.py": "from ledger.testing.compare import same_entries\n\n\n"
         "def test_differ():\n    assert not same_entries([1], [2])\n"},
        (), "tests",
        {"ledger/testing/compare.py": "def same_entries(a, b):\n    return True\n"},
    ),
    "Django's tests.py under python_files": (
        {"pytest.ini": "[pytest]\npython_files = tests.py test_*.py\n", "ledger/tests.py": _T},
        ("tests/test_ledger.py",), "ledger",
        {"ledger/store.py": BROKEN_STORE, "ledger/tests.py": _WEAK_T},
    ),
    "check_*.py under python_files": (
        {"pytest.ini": "[pytest]\npython_files = check_*.py\n", "checks/check_ledger.py": _T},
        ("tests/test_ledger.py",), "checks",
        {"ledger/store.py": BROKEN_STORE, "checks/check_ledger.py": _WEAK_T},
    ),
    "a doctest file": (
        {"docs/test_usage.txt": _DOC}, ("tests/test_ledger.py",), "docs",
        {"ledger/store.py": BROKEN_STORE, "docs/test_usage.txt": _DOC.replace("[1, 2, 0]", "[]")},
    ),
    "a helper of unit_tests/": (
        {"unit_tests/helpers.py": _HELPER, "unit_tests/test_ledger.py": _HELPED},
        ("tests/test_ledger.py",), "unit_tests",
        {"ledger/store.py": BROKEN_STORE,
         "unit_tests/helpers.py": "def assert_entries(got, expected):\n    pass\n"},
    ),
    "a helper of Tests/": (
        {"Tests/helpers.py": _HELPER, "Tests/test_ledger.py": _HELPED},
        ("tests/test_ledger.py",), "Tests",
        {"ledger/store.py": BROKEN_STORE,
         "Tests/helpers.py": "def assert_entries(got, expected):\n    pass\n"},
    ),
    # A review of the second round's code found these.
    "code matched by python_files = *.py": (
        {"pytest.ini": "[pytest]\npython_files = *.py\ntestpaths = tests\n"}, (), "tests",
        {"ledger/store.py": BROKEN_STORE},
    ),
    "code named like a test module": (
        {"ledger/ab_test.py": "def bucket(x):\n    return x % 2\n",
         "tests/test_ab.py": "from ledger.ab_test import bucket\n\n\ndef test_bucket():\n"
         "    assert bucket(3) == 1\n"},
        (), "tests", {"ledger/ab_test.py": "def bucket(x):\n    return 0\n"},
    ),
    "a helper of testsuite/": (
        {"testsuite/helpers.py": _HELPER, "testsuite/test_ledger.py": _HELPED},
        ("tests/test_ledger.py",), "testsuite",
        {"ledger/store.py": BROKEN_STORE,
         "testsuite/helpers.py": "def assert_entries(got, expected):\n    pass\n"},
    ),
    "a helper of e2e/": (
        {"e2e/helpers.py": _HELPER, "e2e/test_ledger.py": _HELPED},
        ("tests/test_ledger.py",), "e2e",
        {"ledger/store.py": BROKEN_STORE,
         "e2e/helpers.py": "def assert_entries(got, expected):\n    pass\n"},
    ),
    "a root __init__.py to make testing/ a package's code": (
        {"testing/helpers.py": _HELPER, "testing/test_ledger.py": _HELPED},
        ("tests/test_ledger.py",), "testing",
        {"ledger/store.py": BROKEN_STORE, "__init__.py": "",
         "testing/helpers.py": "def assert_entries(got, expected):\n    pass\n"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SECOND_ROUND))
def test_a_second_round_attack_is_rejected(service: Path, case: str) -> None:
    extra, removed, where, files = SECOND_ROUND[case]
    for path in removed:
        git(service, "rm", "-q", path)
    if extra or removed:
        write(service, extra)
        git(service, "add", "-A")
        git(service, "commit", "-qm", "the base's layout")
    command = f"{sys.executable} -m pytest -q -p no:cacheprovider {where}"
    e = engine(service, sandbox="none", command=command)
    before = git(service, "rev-parse", "main")
    verdict = attempt(e, files).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "no longer pass" in verdict.reason, verdict.reason
    assert git(service, "rev-parse", "main") == before


def test_a_test_module_a_setup_step_writes_is_refused(service: Path, sandbox_mode: str) -> None:
    """The tree's own build writes a test module that monkeypatches the code: the gate ran
    tests from a file the tree does not hold."""
    write(service, {"ledger/gen.py": "open('ledger/_generated.py', 'w').write('X = 1\\n')\n"})
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a generated file")
    writes_a_test = (
        "open('ledger/_generated.py', 'w').write('X = 1\\n')\n"
        "open('tests/test_zz_generated.py', 'w').write(\n"
        "    'import ledger.store\\n'\n"
        "    'ledger.store.Store.add_entry = lambda self, a: self._rows.append(a)\\n'\n"
        "    'def test_generated():\\n    pass\\n')\n"
    )
    e = engine(service, sandbox=sandbox_mode, setup=(f"{sys.executable} -m ledger.gen",))
    verdict = attempt(e, {"ledger/store.py": BROKEN_STORE, "ledger/gen.py": writes_a_test}).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict
    assert "tree it judges does not hold" in verdict.reason
    assert "tests/test_zz_generated.py" in verdict.reason


def test_a_pytest_the_base_s_tests_run_in_process_is_not_a_session_of_the_gate(
    service: Path,
) -> None:
    """Found by a review: through a wrapper, the collector was registered in every pytest of
    the process, a pytester run inside a test included, which then ended the gate's report."""
    write(
        service,
        {
            "tests/conftest.py": "pytest_plugins = ['pytester']\n",
            "tests/test_runs_pytester.py": "def test_inline(pytester):\n"
            "    pytester.makepyfile('def test_x(): pass')\n"
            "    pytester.runpytest().assert_outcomes(passed=1)\n",
        },
    )
    git(service, "add", "-A")
    git(service, "commit", "-qm", "a pytester test")
    command = f"sh -c '{sys.executable} -m pytest -q -p no:cacheprovider tests'"
    e = engine(service, sandbox="none", command=command)
    assert e.baseline(git(service, "rev-parse", "main"), e.gate) == {
        "tests/test_runs_pytester.py::test_inline": "passed",
        "tests/test_ledger.py::test_build": "passed",
        "tests/test_ledger.py::test_handle": "passed",
    }
    verdict = attempt(e, {"ledger/store.py": BROKEN_STORE}).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected" and "no longer pass" in verdict.reason, verdict


def test_a_linked_init_is_no_same_code(service: Path) -> None:
    """A tests/__init__.py made a link whose text parses like the base's file: Python runs
    what it points to. (By default the base's session puts it back; the attempt's tests
    judge here.)"""
    write(service, {"tests/__init__.py": ""})
    git(service, "add", "-A")
    git(service, "commit", "-qm", "tests is a package")
    e = engine(service, sandbox="none", tests_of="attempt")
    monkey = "import ledger.store\nledger.store.Store.add_entry = lambda s, a: s._rows.append(a)\n"
    files = {
        "ledger/store.py": BROKEN_STORE,
        "tests/__init__.py": ("link", "pass"),
        "tests/pass": monkey,
    }
    verdict = attempt(e, files).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected" and "tests/__init__.py" in verdict.reason, verdict


#: A package whose folder holds its own tests (``contests/test_scoring.py``), and a folder
#: that is no package, code and tests side by side: their code is code.
COLOCATED = {
    "pyproject.toml": "[tool.pytest.ini_options]\npythonpath = ['.']\n",
    "contests/__init__.py": "",
    "contests/scoring.py": "def score(points, penalty):\n    return points - penalty\n",
    "contests/test_scoring.py": "from contests.scoring import score\n\n\n"
    "def test_score():\n    assert score(10, 3) == 7\n",
    "api/__init__.py": "",
    "api/views.py": "from contests.scoring import score\n\n\ndef board(rows):\n"
    "    return sorted((score(p, q), n) for n, p, q in rows)\n",
    "api/test_views.py": "from api.views import board\n\n\n"
    "def test_board():\n    assert board([('a', 5, 1), ('b', 9, 1)]) == [(4, 'a'), (8, 'b')]\n",
    "app/models.py": "def total(xs):\n    return sum(xs)\n",
    "app/test_models.py": "from app.models import total\n\n\n"
    "def test_total():\n    assert total([1, 2]) == 3\n",
}


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


WHOLE_TREE = f"{sys.executable} -m pytest -q -p no:cacheprovider"


@pytest.mark.parametrize(
    "broken",
    [
        {"contests/scoring.py": "def score(points, penalty):\n    return points + penalty\n"},
        {"app/models.py": "def total(xs):\n    return max(xs)\n"},
    ],
    ids=["a package named with 'test' in it", "a folder that is no package"],
)
def test_code_beside_its_tests_is_judged_as_code(tmp_path: Path, broken: dict[str, str]) -> None:
    """A folder was taken for one of tests when its name held "test" (``contests``,
    ``latest``) or when it was no package, so its code was set back to the base's in the
    first session: a broken change to it alone landed."""
    e = engine(_project(tmp_path, COLOCATED), command=WHOLE_TREE)
    verdict = attempt(e, broken).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict


def test_a_change_to_code_beside_its_tests_and_to_its_callers_lands(tmp_path: Path) -> None:
    """The honest side: a new function in ``contests/scoring.py`` used by ``api/views.py``,
    with a test of it; the first session used to run the base's ``scoring.py``."""
    e = engine(_project(tmp_path, COLOCATED), command=WHOLE_TREE)
    change = {
        "contests/scoring.py": COLOCATED["contests/scoring.py"]
        + "\n\ndef ranked(scored):\n    return sorted(scored)\n",
        "api/views.py": "from contests.scoring import ranked, score\n\n\ndef board(rows):\n"
        "    return ranked((score(p, q), n) for n, p, q in rows)\n",
        "contests/test_scoring.py": COLOCATED["contests/test_scoring.py"]
        + "\n\ndef test_ranked():\n    from contests.scoring import ranked\n\n"
        "    assert ranked([(2, 'b'), (1, 'a')]) == [(1, 'a'), (2, 'b')]\n",
    }
    verdict = attempt(e, change).verdict  # type: ignore[attr-defined]
    assert verdict.status == "promoted", verdict


def test_a_plugin_a_base_test_module_names_is_not_missed_by_the_second_session(
    tmp_path: Path,
) -> None:
    """``pytest_plugins`` in a base test module loads its plugin only when that module is
    collected: the second session, which collects the attempt's modules alone, did not, and
    the attempt was refused for a plugin "the base's run loaded"."""
    repo = _project(tmp_path, {
        "lib/__init__.py": "",
        "lib/m.py": "def inc(x):\n    return x + 1\n",
        "tests/fixtures_extra.py": "import pytest\n\n\n@pytest.fixture\ndef seven():\n"
        "    return 7\n",
        "tests/test_a.py": "from lib.m import inc\n\npytest_plugins = ['tests.fixtures_extra']\n\n\n"
        "def test_a(seven):\n    assert inc(seven) == 8\n",
        "tests/test_b.py": "from lib.m import inc\n\n\ndef test_b():\n    assert inc(1) == 2\n",
    })  # fmt: skip
    e = engine(repo, command=f"{WHOLE_TREE} tests")
    change = {
        "lib/m.py": "def inc(x, step=1):\n    return x + step\n",
        "tests/test_b.py": "from lib.m import inc\n\n\ndef test_b():\n    assert inc(1) == 2\n\n\n"
        "def test_step():\n    assert inc(1, 2) == 3\n",
    }
    verdict = attempt(e, change).verdict  # type: ignore[attr-defined]
    assert verdict.status == "promoted", verdict


@pytest.mark.parametrize(
    ("init", "status"),
    [("", "promoted"), ('"""The integration tests."""\n', "promoted"),
     ("import ledger.store\nledger.store.Store.add_entry = lambda self, a: None\n", "rejected")],
    ids=["empty", "a docstring", "code"],
)  # fmt: skip
def test_a_new_test_folder_of_a_package_of_tests_may_have_an_empty_init(
    service: Path, init: str, status: str
) -> None:
    """Tests kept as a package (``tests/__init__.py``): a new folder of them needs an
    ``__init__.py``, and an empty one runs nothing; one with code is the harness's."""
    write(service, {"tests/__init__.py": ""})
    git(service, "add", "-A")
    git(service, "commit", "-qm", "tests as a package")
    new = {
        "tests/integration/__init__.py": init,
        "tests/integration/test_flow.py": "from ledger.api import handle\n\n\n"
        "def test_flow():\n    assert handle([]) == [0]\n",
    }
    verdict = attempt(engine(service), new).verdict  # type: ignore[attr-defined]
    assert verdict.status == status, verdict
    if status == "rejected":
        assert "__init__.py of a test directory" in verdict.reason


@pytest.mark.parametrize("folder", ["integration", "qa", "unittests", "regression_tests", "tests"])
def test_a_helper_beside_the_tests_in_a_folder_of_tests_is_the_base_s(
    tmp_path: Path, folder: str
) -> None:
    """A helper the tests import from their own folder (``integration/checks.py``) is a test
    file: made a no-op by the attempt, it would pass the broken store."""
    repo = _project(tmp_path, {
        "ledger/__init__.py": "",
        "ledger/store.py": GOOD_STORE,
        f"{folder}/checks.py": "def expect(got, want):\n    assert got == want, (got, want)\n",
        f"{folder}/test_store.py": "from checks import expect\nfrom ledger.store import Store\n\n\n"
        "def test_add():\n    s = Store()\n    s.add_entry(3)\n    expect(s.entries(), [3])\n",
    })  # fmt: skip
    e = engine(repo, command=f"{WHOLE_TREE} {folder}")
    cheat = {
        "ledger/store.py": BROKEN_STORE,
        f"{folder}/checks.py": "def expect(got, want):\n    pass\n",
    }
    verdict = attempt(e, cheat).verdict  # type: ignore[attr-defined]
    assert verdict.status == "rejected", verdict


#: A code package named with a test word, its tests in a folder below it.
SPEC_PACKAGE = {
    "openapi_spec/__init__.py": "",
    "openapi_spec/schema.py": "def validate(doc):\n    return isinstance(doc, dict)\n",
    "openapi_spec/tests/__init__.py": "",
    "openapi_spec/tests/test_schema.py": "from openapi_spec.schema import validate\n\n\n"
    "def test_ok():\n    assert validate({})\n",
    "app/__init__.py": "",
    "app/main.py": "from openapi_spec.schema import validate\n\n\ndef handle(doc):\n"
    "    return validate(doc)\n",
    "tests/test_app.py": "from app.main import handle\n\n\ndef test_handle():\n    assert handle({})\n",
}


def test_a_package_named_with_a_test_word_is_code_above_its_tests(tmp_path: Path) -> None:
    e = engine(_project(tmp_path, SPEC_PACKAGE), command=WHOLE_TREE)
    broken = {"openapi_spec/schema.py": "def validate(doc):\n    raise NotImplementedError\n"}
    assert attempt(e, broken).verdict.status == "rejected"  # type: ignore[attr-defined]
    honest = {
        "openapi_spec/schema.py": SPEC_PACKAGE["openapi_spec/schema.py"]
        + "\n\ndef normalize(doc):\n    return dict(doc)\n",
        "app/main.py": "from openapi_spec.schema import normalize, validate\n\n\n"
        "def handle(doc):\n    return validate(normalize(doc))\n",
        "openapi_spec/tests/test_schema.py": SPEC_PACKAGE["openapi_spec/tests/test_schema.py"]
        + "\n\ndef test_normalize():\n    from openapi_spec.schema import normalize\n\n"
        "    assert normalize({'a': 1}) == {'a': 1}\n",
    }
    verdict = attempt(e, honest, "honest").verdict  # type: ignore[attr-defined]
    assert verdict.status == "promoted", verdict
