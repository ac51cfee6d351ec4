"""heatinv: differentiable LRP for Keras 3 and its inverse problem.

``heatinv.invert(model, x, target)`` (:mod:`heatinv.inversion`) runs the inversion from Python;
``heatinv.keras.ExplanationTrainer`` trains with an explanation term through Keras's ``fit``;
``heatinv.lrp`` is the LRP engine. The trainer is imported when first used, so that importing
``heatinv.lrp`` alone stays light.
"""

__all__ = ["Inversion", "invert"]


def __getattr__(name: str):
    if name in __all__:
        from heatinv import inversion

        return getattr(inversion, name)
    if name == "keras":
        import importlib

        return importlib.import_module("heatinv.keras")
    raise AttributeError(f"module 'heatinv' has no attribute {name!r}")
