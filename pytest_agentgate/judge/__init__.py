"""What decides an attempt.

Owns the checks and the verdict (``gate``, its values in ``spec``, what it says beside a
failure in ``notes``), the harness rules (``harness``; the new modules that would take the
place of the tree's own: ``own_modules``), which tree each of a gate's two
sessions runs (``base_tests``), where a gate's pytest stops looking for its configuration
(``boundary``), what the environment has installed (``environment``), the check that nothing
a gate runs changes a tracked byte (``tamper``), per-test results and their comparison
(``results``), the results channel and the collector every gate's pytest loads (``channel``,
``collector``: the latter is copied into each gate command's folder and imports nothing of
the package), the bytecode a command is given (``bytecode``; one file at a time:
``pycfiles``), baselines (``baseline``) and
benchmark grading (``grading``, ``grader``). May use: ``git``, ``sandbox``, ``workspace``,
``store`` and the shared modules.
"""
