"""The package version, kept in one place for the build backend and for ``lightning_hetero.__version__``."""

__version__ = "0.2.0"
