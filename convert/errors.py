"""The one exception type the converter raises for bad input; the CLI prints it on one line."""


class ConvertError(Exception):
    """Bad input or environment: unsupported model, inconsistent config, bad tensors, I/O."""
