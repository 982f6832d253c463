"""The HTTP API of a node and its operator console (``docs/api.md``, ``docs/console.md``)."""
