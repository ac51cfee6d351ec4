"""``python -m heatinv.doctor <the same overrides as train>``: diagnose what train would run.

Prints a readable report, writes ``doctor.json`` (the findings) in the run directory, and
exits 0 when it could diagnose (findings or not), non-zero when it could not run.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
import numpy as np
from omegaconf import DictConfig

from heatinv.atomic import write_json
from heatinv.build import DATASET_EXAMPLES, Parts, build_parts, dataset_problem, explainer_for, moved_examples, single_target
from heatinv.config import ConfigError, register, validate
from heatinv.doctor import HeatmapObjective, diagnose, format_report
from heatinv.lrp import UnsupportedLayerError

log = logging.getLogger(__name__)


def run_doctor(cfg) -> list:
    """Build the run's student and target as :func:`heatinv.train.run` would (:mod:`heatinv.build`), and diagnose them.

    ``task=single`` diagnoses its one image's heatmap loss; ``task=dataset`` the heatmap term
    of its objective on the first :data:`DATASET_EXAMPLES` held-out examples whose heatmaps the
    target moves (the cross-entropy and teacher terms have gradients of their own).

    Returns:
        The findings, also written to ``doctor.json`` in the run directory.
    """
    validate(cfg)
    parts = build_parts(cfg)
    if cfg.task.kind == "dataset":
        x, labels, targets, what = dataset_examples(cfg, parts)
    else:
        target = single_target(cfg, parts.dataset, parts.reference)
        x, labels, targets, what = target.image, target.label, target.heatmap, target.source
    explainer = explainer_for(parts.student, cfg)
    objective = HeatmapObjective(targets, explainer, cfg.loss.name, cfg.loss.delta, cfg.loss.normalize)
    findings = diagnose(parts.student, x, labels, objective, cfg.trainer.precision)
    os.makedirs(cfg.paths.output_dir, exist_ok=True)
    write_json(os.path.join(cfg.paths.output_dir, "doctor.json"), [f.as_dict() for f in findings])
    report = format_report(findings, f"{cfg.init.kind} student, {what}")
    print(report, flush=True)
    log.info(report, extra={"file_only": True})  # the run's doctor.log keeps it beside doctor.json
    return findings


def dataset_examples(cfg, parts: Parts) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The dataset task's first :data:`DATASET_EXAMPLES` held-out examples that its target moves.

    Returns:
        ``(x [n, *input_shape], labels [n], targets [n, *map_shape], description)``.
    """
    problem = dataset_problem(cfg, parts.dataset, parts.reference)
    x, labels, targets = moved_examples(problem, parts.dataset, DATASET_EXAMPLES)
    return x, labels, targets, f"the {problem.description} target's heatmap term on {len(x)} held-out examples"


@hydra.main(version_base="1.3", config_path="pkg://heatinv.configs", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run_doctor(cfg)
    except (ConfigError, FileNotFoundError, UnsupportedLayerError, ValueError, TypeError) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"heatinv doctor: could not run: {error}", file=sys.stderr, flush=True)
        log.error(f"heatinv doctor: could not run: {error}", extra={"file_only": True})
        sys.exit(2)


def main() -> None:
    """Console entry point (``python -m heatinv.doctor``); its log is ``doctor.log`` (Hydra names it after the module: ``__main__``)."""
    register()
    if not any(arg.startswith("hydra.job.name=") for arg in sys.argv[1:]):
        sys.argv.append("hydra.job.name=doctor")
    _hydra_main()


if __name__ == "__main__":
    main()
