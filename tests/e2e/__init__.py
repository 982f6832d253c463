"""End-to-end: real nodes on real PostgreSQL, a real HTTP receiver, the real CLI."""
