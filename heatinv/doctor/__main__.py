"""``python -m heatinv.doctor <the same overrides as train>``: diagnose what train would run.

Prints a readable report, writes ``doctor.json`` (the findings) in the run directory, and
exits 0 when it could diagnose (findings or not), non-zero when it could not run.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from heatinv.atomic import write_json
from heatinv.build import build_parts, explainer_for, single_target
from heatinv.config import ConfigError, register, validate
from heatinv.doctor import HeatmapObjective, diagnose, format_report
from heatinv.lrp import UnsupportedLayerError


def run_doctor(cfg) -> list:
    """Build the run's student and target as :func:`heatinv.train.run` would (:mod:`heatinv.build`), and diagnose them.

    Returns:
        The findings, also written to ``doctor.json`` in the run directory.
    """
    validate(cfg)
    parts = build_parts(cfg)
    target = single_target(cfg, parts.dataset, parts.reference)
    explainer = explainer_for(parts.student, cfg)
    objective = HeatmapObjective(target.heatmap, explainer, cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    findings = diagnose(parts.student, target.image, target.label, objective, cfg.trainer.precision)
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
