"""Which folder names say they hold tests (their other files are then the base's in the
first session): whole words, never a part of one, and a package only by a word of tests."""

from __future__ import annotations

import pytest

from pytest_agentgate.judge.base_tests import _names_tests


@pytest.mark.parametrize(
    ("name", "package"),
    [
        ("tests", True), ("test", False), ("unit_tests", False), ("regression_tests", False),
        ("test_suite", False), ("unittests", False), ("testcases", False), ("e2e", True),
        ("integration", False), ("qa", False), ("it", False), ("Tests", False),
        ("testing", False),
    ],
)  # fmt: skip
def test_names_of_folders_of_tests(name: str, package: bool) -> None:
    assert _names_tests(name, package)


@pytest.mark.parametrize(
    ("name", "package"),
    [
        ("contests", True), ("latest", False), ("attestation", False), ("checks", False),
        ("openapi_spec", True), ("e2e_helpers", False), ("app", False), ("testing", True),
        ("testdata", False), ("", False),
    ],
)  # fmt: skip
def test_names_of_folders_of_code(name: str, package: bool) -> None:
    assert not _names_tests(name, package)
