"""The version of aiocubie (the package's metadata says the same)."""

__version__ = "0.2.0.dev0"
