"""What decides an attempt.

Owns the checks and the verdict (``gate``), the harness rules (``harness``), per-test results
and their comparison (``results``), the results channel and the collector every gate's pytest
loads (``channel``, ``collector``: the latter is copied into each gate command's folder and
imports nothing of the package), baselines (``baseline``) and benchmark grading (``grading``,
``grader``). May use: ``git``, ``sandbox``, ``workspace``, ``store`` and the shared modules.
"""
