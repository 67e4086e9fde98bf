"""The benchmark environment: a step that takes as long as the action asks."""

from benchmark_env.client import BenchmarkEnv
from benchmark_env.models import BenchAction, BenchObservation

__all__ = ["BenchAction", "BenchObservation", "BenchmarkEnv"]
