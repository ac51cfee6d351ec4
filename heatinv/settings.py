"""A run started from Python: the ``train`` config composed as the command line composes it, keyword settings on it, and its run.

:func:`heatinv.invert` and :func:`heatinv.manipulate` take the config's keys as keywords by
their last name (``epsilon=1e-3`` is ``lrp.epsilon``, ``log_every=10`` is ``trainer.log_every``).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from heatinv.checkpoints import RunDirectoryError, guard_run_directory, held_run_directory
from heatinv.config import ConfigError, register, validate

SINGLE_GROUPS = ("trainer", "lrp", "loss", "optimizer", "target")
"""The config groups whose keys :func:`heatinv.invert` takes by their last name."""
DATASET_GROUPS = (*SINGLE_GROUPS, "task")
"""The config groups whose keys :func:`heatinv.manipulate` takes by their last name."""


def compose_train(groups: list[str]):
    """The ``train`` config as the command line composes it with these group choices (``"lrp=epsilon_plus"``).

    A Hydra application calling this keeps its own Hydra state.

    Examples:
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


def configured(groups: list[str], values: dict, settings: dict, caller: str, setting_groups: tuple[str, ...], refused: dict):
    """The validated config: ``groups`` chosen, ``values`` (dotted keys) set, then the caller's keyword ``settings``."""
    cfg = compose_train(groups)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False)
    apply_settings(cfg, settings, caller, setting_groups, refused)
    validate(cfg)
    return cfg


def run_held(cfg, parts, task, out: str, logdir: str | None, caller: str) -> dict:
    """:func:`heatinv.train.run_task` of a built task in ``out``, held against a second run and an existing one."""
    from heatinv.train import announce_files, run_task

    with held_run_directory(out):
        guard_logdir(out, logdir, cfg.trainer.overwrite, caller)
        metrics = run_task(cfg, parts, task=task)
    if logdir is not None:
        announce_files(out)
    return metrics


def apply_settings(cfg, settings: dict, caller: str, groups: tuple[str, ...], refused: dict[str, str]) -> None:
    """Each setting ``name=value`` on the one key of ``groups`` whose last name it is.

    ``refused``: keys the caller takes otherwise or cannot use, each with what to do instead
    (a key that would be accepted and then do nothing is refused, not ignored).

    Raises:
        ConfigError: a refused name, a name no group has (the nearest names suggested), one
            several groups have, or a value of the wrong type; ``caller`` names the function.

    Examples:
        >>> cfg = compose_train([])
        >>> apply_settings(cfg, {"epsilon": 1e-3, "log_every": 10}, "invert()", SINGLE_GROUPS, {})
        >>> cfg.lrp.epsilon, cfg.trainer.log_every
        (0.001, 10)
    """
    keys = {group: list(cfg[group].keys()) for group in groups}
    for name, value in settings.items():
        if name in refused:
            raise ConfigError(f"{caller} setting {name}={value!r} is not taken here: {refused[name]}")
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


IN_MEMORY = "(in memory)"
"""What a run's config says for a model or target given as an object, not a file."""

NO_RESUME = "a run started from Python does not resume; start it again (overwrite=True to replace a finished one)."
"""Why ``resume`` is refused as a setting."""


@contextlib.contextmanager
def run_folder(logdir: str | None, prefix: str):
    """``logdir`` (made where missing), or a temporary folder removed at the end.

    Examples:
        >>> with run_folder(None, "heatinv-example-") as out:
        ...     os.path.isdir(out)
        True
    """
    if logdir is not None:
        os.makedirs(logdir, exist_ok=True)
        yield os.path.abspath(logdir)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as out:
        yield out


def guard_logdir(out: str, logdir: str | None, overwrite: bool, caller: str) -> None:
    """Refuse to start over a run in ``logdir`` unless ``overwrite``, in the caller's terms."""
    try:
        guard_run_directory(out, False, overwrite)
    except RunDirectoryError:
        raise RunDirectoryError(
            f"{caller} logdir={logdir!r} holds a run already (its results or checkpoints); pass overwrite=True to replace "
            "it, or give another logdir."
        ) from None
