"""models.zoo: every HuggingFace model type as a tiny random-weight model, run on emulated Spyre and classified.

    zoo.model_types()                      every type of the installed transformers' base MODEL_MAPPING
    zoo.build(model_type, variant, seed)   a ZooModel: fp32 eval() model, inputs, metadata (recipes.py)
    zoo.run_one(model_type, variant)       one JSON-able record: the class and why (classify.py)

See docs/zoo.md for the recipe, the variants, the classes and the tolerance.
"""

from models.zoo.catalog import CI_SUBSET, VARIANTS, model_types
from models.zoo.recipes import LEVELS, ZooBuildError, ZooModel, build

__all__ = ["CI_SUBSET", "LEVELS", "VARIANTS", "ZooBuildError", "ZooModel", "build", "model_types", "run_one"]


def __getattr__(name):
    # classify imports the emulated stack; `from models.zoo import build` should not need it
    if name in ("run_one", "CLASSES"):
        from models.zoo import classify

        return getattr(classify, name)
    raise AttributeError(name)
