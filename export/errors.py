"""The one error type of export and packages: a message naming the graph, the op or the file, and the fix."""


class PackageError(RuntimeError):
    """A package that cannot be written, read or trusted, or a key that cannot be used."""
