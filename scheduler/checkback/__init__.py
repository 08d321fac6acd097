"""Check-back by callback: a producer group registers a URL, and the engine POSTs its due
transaction checks there instead of waiting for a poll.

One job per module:

- ``policy.py``: the allow-list (``EngineConfig.transaction_callback_allowed_hosts``) and the
  URL checks: which hosts and ports may be called back.
- ``registry.py``: ``CallbackRegistry``, the persistent group -> URL (and secret) map.
- ``client.py``: ``CheckbackClient``, one POST with its caps (timeout, answer size, no
  redirects) and the answer it reads (``CheckAnswer``); never raises for HTTP trouble.
- ``dispatcher.py``: ``CheckbackDispatcher``, the thread that claims due checks as a poll
  does and hands them to a small pool of POSTing workers.

The payload and the signature are in docs/transactions.md.
"""
