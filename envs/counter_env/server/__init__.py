"""The counter environment's server side."""
