"""A nox gate: ``nox -s tests``, in the environment the gate already has (the sandbox has
no network to build another); ``session.run`` keeps the environment, results channel and all."""

import nox

nox.options.default_venv_backend = "none"


@nox.session
def tests(session: nox.Session) -> None:
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
