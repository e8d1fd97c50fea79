"""Errors and warnings raised by ``aiu_sim.numerics``.

Every error names what it was given and says what to pass instead, so a user can fix the call without
reading this package's source.
"""


class NumericsError(Exception):
    """Base class of every error raised by ``aiu_sim.numerics``."""


class UnknownFormatError(NumericsError, ValueError):
    """A number-format name (or host dtype name) that this package does not know."""


class UnsupportedInputError(NumericsError, ValueError):
    """An argument this package cannot take: wrong dtype, wrong shape, or an invalid parameter value."""


class Int64RangeError(NumericsError, ValueError):
    """int64 values that do not fit the device's int32 (Spyre narrows int64 to int32; we never wrap)."""


class Int64NarrowingWarning(UserWarning):
    """Issued once per process when int64 data is narrowed to the device's int32, as torch-spyre does."""
