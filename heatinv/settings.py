"""A run's config from Python: the ``train`` config composed as the command line composes it, keyword settings on it.

:func:`heatinv.invert` and :func:`heatinv.manipulate` take the config's keys as keywords by
their last name (``epsilon=1e-3`` is ``lrp.epsilon``, ``log_every=10`` is ``trainer.log_every``).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile

from omegaconf.errors import ValidationError

from heatinv.config import ConfigError, register

SINGLE_GROUPS = ("trainer", "lrp", "loss", "optimizer", "target")
"""The config groups whose keys :func:`heatinv.invert` takes by their last name."""
DATASET_GROUPS = (*SINGLE_GROUPS, "task")
"""The config groups whose keys :func:`heatinv.manipulate` takes by their last name."""


def compose_train(groups: list[str]):
    """The ``train`` config as the command line composes it with these group choices (``"lrp=epsilon_plus"``).

    A Hydra application calling this keeps its own Hydra state.

    Example:
    >>> compose_train(["loss=l1"]).loss.name
    'l1'
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register()
    held = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
            cfg = compose("train", overrides=groups)
    finally:
        GlobalHydra.instance().clear()
        if held is not None:
            GlobalHydra.instance().initialize(held)
    return cfg


def apply_settings(cfg, settings: dict, caller: str, groups: tuple[str, ...]) -> None:
    """Each setting ``name=value`` on the one key of ``groups`` whose last name it is.

    Raises:
        ConfigError: a name no group has (the nearest names suggested), one several groups have,
            or a value of the wrong type; ``caller`` names the function in the message.

    Example:
    >>> cfg = compose_train([])
    >>> apply_settings(cfg, {"epsilon": 1e-3, "log_every": 10}, "invert()", SINGLE_GROUPS)
    >>> cfg.lrp.epsilon, cfg.trainer.log_every
    (0.001, 10)
    """
    keys = {group: list(cfg[group].keys()) for group in groups}
    for name, value in settings.items():
        owners = [group for group, names in keys.items() if name in names]
        if len(owners) != 1:
            every = sorted({key for names in keys.values() for key in names})
            near = difflib.get_close_matches(name, every, n=3)
            what = f"is a key of {' and '.join(owners)}: set that group's" if owners else "is no key of " + ", ".join(groups)
            hint = f" Did you mean {', '.join(near)}?" if near and not owners else ""
            raise ConfigError(
                f"{caller} setting {name}={value!r} {what}.{hint} Settings are the keys of those config groups by their "
                f"last name ({', '.join(every)})."
            )
        try:
            cfg[owners[0]][name] = value
        except ValidationError as error:  # OmegaConf's type check, said in the setting's terms
            raise ConfigError(f"{caller} setting {name}={value!r} does not fit {owners[0]}.{name}: {error}") from None


@contextlib.contextmanager
def run_folder(logdir: str | None, prefix: str):
    """``logdir`` (made where missing), or a temporary folder removed at the end."""
    if logdir is not None:
        os.makedirs(logdir, exist_ok=True)
        yield os.path.abspath(logdir)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as out:
        yield out
