"""``python -m heatinv.doctor <the same overrides as train>``: diagnose what train would run.

Prints a readable report, writes ``doctor.json`` (the findings) in the run directory, and
exits 0 when it could diagnose (findings or not), non-zero when it could not run.
"""

from __future__ import annotations

import os
import sys

import hydra
import keras
from omegaconf import DictConfig

from heatinv.config import ConfigError, register, validate
from heatinv.data import load_dataset
from heatinv.doctor import HeatmapObjective, diagnose, format_report
from heatinv.lrp import UnsupportedLayerError
from heatinv.train import build_models, explainer_for, make_target, write_json


def run_doctor(cfg) -> list:
    """Build the run's student and target as :func:`heatinv.train.run` would, and diagnose them."""
    validate(cfg)
    keras.backend.clear_session()
    keras.utils.set_random_seed(cfg.trainer.seed)
    dataset = load_dataset(cfg.data.name, cfg.data.path)
    models = build_models(cfg, dataset)
    target = make_target(cfg, dataset, models.reference)
    explainer = explainer_for(models.student, cfg)
    objective = HeatmapObjective(target.heatmap, explainer, cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    findings = diagnose(models.student, target.image, target.label, objective, cfg.trainer.precision)
    os.makedirs(cfg.paths.output_dir, exist_ok=True)
    write_json(os.path.join(cfg.paths.output_dir, "doctor.json"), [f.as_dict() for f in findings])
    print(format_report(findings, f"{cfg.init.kind} student, {target.source}"), flush=True)
    return findings


@hydra.main(version_base="1.3", config_path="pkg://heatinv.configs", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run_doctor(cfg)
    except (ConfigError, FileNotFoundError, UnsupportedLayerError, ValueError, TypeError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"heatinv doctor: could not run: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    register()
    _hydra_main()


if __name__ == "__main__":
    main()
