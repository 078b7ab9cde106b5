"""The server as the one record and the one queue, for a target on a server.

Owns the branch's lease (``lease``), the queue shared across machines with its signed posts
(``server_queue``) and the records pushed there (``server_records``). May use: ``git``,
``store``, ``workspace`` and the shared modules.
"""
