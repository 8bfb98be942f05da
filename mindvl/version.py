"""mindvl's version, in a leaf module: checkpoints, packages and converted encoders record it, and reading
it must not import the package's lazy API (mindvl/__init__.py)."""
__version__ = "0.1.0"
