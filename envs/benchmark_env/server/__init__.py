"""The benchmark environment's server side."""
