"""Adapters that serve environments written for other libraries.

Each lives in its own subpackage and needs its own extra:
``openenv.adapters.gymnasium`` (``pip install 'openenv-scale[gymnasium]'``) serves
any Gymnasium environment.
"""
