"""The version of mucudnn (one place: the package, the command line and the build read it)."""

__version__ = "0.2.0"
