"""Typed errors of the simulated chip. Each names what was wrong and what to do."""


class AiuSimError(Exception):
    """Base class of every error aiu_sim raises on purpose."""


class ConfigError(AiuSimError, ValueError):
    """A hardware configuration value is impossible (names the field and the allowed range)."""


class ProgramError(AiuSimError, ValueError):
    """A KernelProgram is malformed (names the kernel and the argument)."""


class BundleError(ProgramError):
    """A kernel bundle is not a run of consecutive kernel steps (names the bundle and the step that breaks it)."""

    def __init__(self, message: str, bundle: str, step: str) -> None:
        super().__init__(message)
        self.bundle = bundle
        self.step = step


class ExecutionError(AiuSimError, RuntimeError):
    """A program could not be run (missing input, missing host function, ...)."""
