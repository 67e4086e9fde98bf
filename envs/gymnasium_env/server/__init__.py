"""The Gymnasium environment's server side."""
