"""heatinv.cluster: which cluster a process belongs to, from TF_CONFIG or Slurm's variables alone."""

from __future__ import annotations

import json

import pytest

from heatinv.cluster import NoClusterError, cluster_resolver, describe_cluster


def _tf_config(cluster: dict, kind: str, index: int) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})}


@pytest.mark.parametrize(
    "cluster, kind, index, want",
    [
        ({"worker": ["a:1", "b:1"]}, "worker", 0, (0, 2, True)),
        ({"worker": ["a:1", "b:1"]}, "worker", 1, (1, 2, False)),
        ({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "chief", 0, (0, 3, True)),
        ({"chief": ["c:1"], "worker": ["a:1", "b:1"]}, "worker", 0, (1, 3, False)),
    ],
)
def test_tf_config_names_the_worker_and_the_chief(cluster, kind, index, want):
    found = describe_cluster(_tf_config(cluster, kind, index))
    assert (found.source, found.index, found.workers, found.chief) == ("TF_CONFIG", *want)


def test_slurm_job_step_names_the_worker():
    found = describe_cluster({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "7"})
    assert (found.source, found.index, found.workers, found.chief) == ("Slurm", 1, 2, False)
    assert "worker 1 of 2 (Slurm; not the chief" in str(found)


def test_tf_config_comes_before_slurm():
    environ = {**_tf_config({"worker": ["a:1", "b:1"]}, "worker", 1), "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    assert describe_cluster(environ).source == "TF_CONFIG"


def test_without_a_cluster_the_error_says_what_to_set():
    # a Slurm allocation outside srun (sbatch's own shell) has no job step: no cluster either
    with pytest.raises(NoClusterError, match=r"set TF_CONFIG on every worker.*srun.*trainer.strategy=mirrored"):
        describe_cluster({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})


@pytest.mark.parametrize(
    "value, expected",
    [("{not json", "is not a cluster"), ('{"cluster": {"worker": ["a:1"]}}', "is not a cluster"),
     ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "not among its cluster's jobs")],
)
def test_a_tf_config_that_is_no_cluster_is_refused_by_value(value, expected):
    with pytest.raises(NoClusterError, match=expected):
        describe_cluster({"TF_CONFIG": value})


def test_slurm_variables_give_the_cluster_in_slurms_order():
    """The resolver the strategy gets under srun, from a faked job step (no Slurm needed): the tasks in the
    node list's order, as Slurm numbers them (node9 before node10, which a sort by name would swap)."""
    step = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "node[9-10]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "1"}
    resolver = cluster_resolver(step)
    assert resolver.cluster_spec().as_dict() == {"worker": ["node9:8888", "node10:8888"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)


def test_two_tasks_on_one_slurm_node_listen_on_consecutive_ports():
    step = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NODELIST": "b1,a7",
            "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_PORT_BASE": "9000"}
    resolver = cluster_resolver(step)
    assert resolver.cluster_spec().as_dict() == {"worker": ["b1:9000", "b1:9001", "a7:9000"]}
    assert resolver.task_id == 1


def test_a_slurm_step_whose_counts_disagree_is_refused():
    step = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    with pytest.raises(NoClusterError, match="lists 2 tasks .* SLURM_STEP_NUM_TASKS=4"):
        cluster_resolver(step)


def test_tf_config_gives_tensorflows_tf_config_resolver(monkeypatch):
    import os

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}))
    resolver = cluster_resolver(os.environ)
    assert type(resolver).__name__ == "TFConfigClusterResolver"
    assert resolver.cluster_spec().as_dict() == {"worker": ["localhost:1", "localhost:2"]}
