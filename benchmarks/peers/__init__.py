"""The peers of ``benchmarks/bench_peer.py``: their pinned requirements, their environment, and
the programs that run them (under ``.bench-peers/venv``, never the project's ``.venv``)."""
