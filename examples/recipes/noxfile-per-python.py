"""A noxfile shaped like pypa/packaging's: a session per Python version that installs the
project and its test tools, then runs pytest. Left as it is: the gate runs one session of
it in the environment the gate already has (see docs/recipes.md), since the sandbox has no
network to build virtual environments and install into them."""

import nox

PYTHON_VERSIONS = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14"]


@nox.session(python=PYTHON_VERSIONS)
def tests(session: nox.Session) -> None:
    session.install(".", "pytest")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests")
