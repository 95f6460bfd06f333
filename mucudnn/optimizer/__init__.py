"""Batch-size policies, benchmarking through a Backend, the benchmark cache, WR and WD.

>>> from mucudnn.optimizer import batch_sizes
>>> batch_sizes("powerOfTwo", 100)
[100, 64, 32, 16, 8, 4, 2, 1]
"""

from .api import DEFAULT_WORKSPACE_LIMIT, optimize, optimize_kernels, optimize_network
from .benchmark import benchmark
from .cache import (BenchmarkCache, CacheArgumentError, CacheFileError, CacheWarning,
                    default_cache_path)
from .dp import optimize_wr, pareto_front
from .ilp import optimize_wd
from .offline import CachedBackend, CacheMissError
from .planner import Planner, PlanKey, zero_workspace_plan
from .policies import DEFAULT_POLICY, POLICIES, batch_sizes
from .options import PlanOptions, check_devices, check_ordinals, plan_options
from .spread import benchmark_many

__all__ = [
    "BenchmarkCache", "CacheArgumentError", "CacheFileError", "CacheMissError", "CacheWarning",
    "CachedBackend", "DEFAULT_POLICY", "DEFAULT_WORKSPACE_LIMIT", "POLICIES", "batch_sizes",
    "PlanOptions", "plan_options",
    "benchmark", "benchmark_many", "check_devices", "check_ordinals", "default_cache_path", "optimize",
    "optimize_kernels", "optimize_network", "optimize_wd",
    "optimize_wr", "pareto_front", "Planner", "PlanKey", "zero_workspace_plan",
]
