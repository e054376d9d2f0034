"""odc-pp: zero-bubble pipeline parallelism composed with On-Demand Communication data parallelism."""

__version__ = "0.1.0"
__all__ = ["__version__"]
