"""The package's version, in a module of its own: modules inside the package read it from here,
not from ``panqueue`` (the package that imports them)."""

__version__ = "0.1.0"
