"""heatinv: differentiable LRP for Keras 3 and its inverse problem.

``heatinv.invert(model, x, target)`` (:mod:`heatinv.inversion`) runs the inversion from Python,
``heatinv.manipulate(model, data, target="swap")`` (:mod:`heatinv.manipulation`) the dataset task;
``heatinv.keras.ExplanationTrainer`` trains with an explanation term through Keras's ``fit``;
``heatinv.lrp`` is the LRP engine. The trainer is imported when first used, so that importing
``heatinv.lrp`` alone stays light.
"""

__all__ = ["Inversion", "invert", "manipulate"]


def __getattr__(name: str):
    if name in ("Inversion", "invert"):
        from heatinv import inversion

        return getattr(inversion, name)
    if name == "manipulate":
        from heatinv import manipulation

        return manipulation.manipulate
    if name == "keras":
        import importlib

        return importlib.import_module("heatinv.keras")
    raise AttributeError(f"module 'heatinv' has no attribute {name!r}")
