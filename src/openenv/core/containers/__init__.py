"""``openenv.core.containers``: OpenEnv 0.10's container import path (see ``runtime``)."""
