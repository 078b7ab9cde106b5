"""The fast unit layer: pure parts, no repository, no pytest run (seconds in all)."""
