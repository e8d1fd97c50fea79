"""slow_where: a parametrize list whose chosen values are marked slow, the others left in the default suite."""

import pytest


def slow_where(values, slow) -> list:
    return [pytest.param(v, marks=pytest.mark.slow) if v in slow else v for v in values]
