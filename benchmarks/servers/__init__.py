"""The servers the benchmark compares; each module exposes an ASGI ``app`` or a ``main()``."""
