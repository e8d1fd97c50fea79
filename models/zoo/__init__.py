"""models.zoo: every HuggingFace model type as a tiny random-weight model, run on emulated Spyre and classified.

    zoo.model_types()                      every type of the installed transformers' base MODEL_MAPPING
    zoo.build(model_type, variant, seed)   a ZooModel: fp32 eval() model, inputs, metadata (recipes.py)
    zoo.run_one(model_type, variant)       one JSON-able record: the class and why (classify.py)

See docs/zoo.md for the recipe, the variants, the classes and the tolerance.
"""

from models.zoo.catalog import CI_SUBSET, VARIANTS, model_types

__all__ = ["CI_SUBSET", "LEVELS", "VARIANTS", "ZooBuildError", "ZooModel", "build", "model_types", "run_one"]


def __getattr__(name):
    # Imported on first use: recipes imports torch and transformers, classify the emulated stack too, and the CLI
    # reads catalog's names (`from models.zoo import build` should not need the stack; `spyre-emu info` neither).
    if name in ("LEVELS", "ZooBuildError", "ZooModel", "build"):
        from models.zoo import recipes

        return getattr(recipes, name)
    if name in ("run_one", "CLASSES"):
        from models.zoo import classify

        return getattr(classify, name)
    raise AttributeError(f"module 'models.zoo' has no attribute {name!r}")
