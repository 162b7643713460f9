"""The PopTorch release whose API ipupod's poptorch emulates."""

__all__ = ["__version__"]

__version__ = "3.4.0+ipupod"
