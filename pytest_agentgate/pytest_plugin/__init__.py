"""The pytest face: hooks, options, settings, the marker, reports.

Owns the plugin pytest loads (``hooks``), the option table (``options``), the run's settings
(``settings``), the ``gated`` marker (``marker``), hook specifications (``hookspecs``), what a
run reports (``report``, ``progress``) and run directories (``rundirs``). Loaded in every
pytest run of every suite with the plugin installed: it imports only pytest and the standard
library until a gated test is collected. May use: the engine and every layer below.
"""
