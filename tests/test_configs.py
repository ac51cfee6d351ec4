"""Config tests: every shipped config file composes against the typed schema and passes `validate`.

The configs are composed the way `python -m heatinv.train` composes them: from the installed
package `heatinv.configs` (not from a path relative to the tests), with the schema registered
and Hydra's own config returned, so `${hydra:...}` interpolations resolve
(`HydraConfig().set_config`). The parametrized cases are enumerated from the YAML files in
each group folder, so a new file is covered without touching this module.
"""

from __future__ import annotations

from importlib import resources

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf, open_dict, read_write

from heatinv.config import CHOICES, ConfigError, register, validate
from heatinv.lrp import COMPOSITES

# Groups every config must have a file for; any other folder of YAML files is tested too.
CORE_GROUPS = ("data", "model", "target", "init", "loss", "lrp", "optimizer", "trainer")

# Choices that validate only together with other values: the file they point at, or the task
# they belong to. A new file that needs a partner fails its case until it is listed here.
REQUIRED_OVERRIDES = {
    ("model", "file"): ["model.path=/nonexistent/model.keras"],
    ("data", "npz"): ["data.path=/nonexistent/data.npz"],
    ("data", "folder"): ["data.path=/nonexistent/images"],
    ("data", "csv"): ["data.path=/nonexistent/table.csv", "data.label_column=label"],
    ("target", "suppress_feature"): ["data=tabular", "target.feature=mean radius"],
    ("target", "swap_features"): ["data=tabular", "target.feature=mean radius", "target.like=mean texture"],
    ("target", "suppress_token"): ["data=protected_text", "target.token=foreign"],
    ("target", "tokens"): ["data=protected_text", "target.positions=[0]"],
    ("target", "file"): ["target.path=/nonexistent/heatmap.npy"],
    ("target", "swap"): ["task=dataset"],
    ("target", "suppress"): ["task=dataset"],
    ("task", "dataset"): ["target=pattern"],
}


def config_groups() -> list[str]:
    """Every folder of ``heatinv.configs`` holding YAML files, except Hydra's own ``hydra`` group."""
    root = resources.files("heatinv.configs")
    return sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir() and entry.name != "hydra" and any(f.name.endswith(".yaml") for f in entry.iterdir())
    )


def group_choices(group: str) -> list[str]:
    """The choices of a config group: the stems of ``heatinv.configs/<group>/*.yaml``."""
    folder = resources.files("heatinv.configs") / group
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


GROUPS = config_groups()
CASES = [pytest.param(group, choice, id=f"{group}={choice}") for group in GROUPS for choice in group_choices(group)]


@pytest.fixture
def compose_train(tmp_path, monkeypatch):
    """``compose_train(*overrides)``: the ``train`` config with Hydra's node, set as the global Hydra config.

    Runs in ``tmp_path`` (so ``paths.root``, derived from the working directory, lands there)
    and sets ``hydra.runtime.output_dir`` to ``tmp_path / "run"``, which Hydra fills in only
    when it launches a job. Clears ``GlobalHydra`` afterwards.
    """
    monkeypatch.chdir(tmp_path)
    register()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):

        def compose_(*overrides: str):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
            with open_dict(cfg):
                cfg.hydra.runtime.output_dir = str(tmp_path / "run")
            HydraConfig().set_config(cfg)
            return cfg

        yield compose_
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # later in-process runs must not read this test's overrides as their own


def test_every_core_group_has_choices():
    # Guards the enumeration: an empty or renamed group folder would silently drop cases.
    for group in CORE_GROUPS:
        assert group in GROUPS, f"no YAML files found in heatinv.configs/{group}"


@pytest.mark.parametrize(("group", "choice"), CASES)
def test_group_choice_composes_and_validates(compose_train, group, choice):
    cfg = compose_train(f"{group}={choice}", *REQUIRED_OVERRIDES.get((group, choice), []))
    assert HydraConfig.get().runtime.choices[group] == choice
    validate(cfg)  # raises ConfigError on any out-of-range value
    # Every interpolation of the job config resolves (paths.* read Hydra's global config).
    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    container = OmegaConf.to_container(job, resolve=True, throw_on_missing=True)
    assert container["paths"]["output_dir"] == HydraConfig.get().runtime.output_dir


@pytest.mark.parametrize("group", ["model", "target"])
def test_file_choices_need_a_path(compose_train, group):
    # Composing is fine, but validate names the key that must be given.
    cfg = compose_train(f"{group}=file")
    with pytest.raises(ConfigError, match=rf"{group}\.path="):
        validate(cfg)


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["model.path=mine.keras"], "model.path", "model=file model.path=mine.keras"),
        (["model=file", "model.path=m.keras", "model.weights=w.weights.h5"], "model.weights", "model.weights=w.weights.h5"),
        (["data.path=shapes"], "data.path", "data.path=shapes"),
        (["data=tabular", "data.path=t.csv"], "data.path", "data.path=t.csv"),
        (["target.path=map.npy"], "target.path", "target=file target.path=map.npy"),
        (["target=pattern", "target.path=p.png"], "target.path", "target.pattern=file target.path=p.png"),
        (["target.image=x.npy"], "target.image", "target=file target.path=<heatmap>.npy target.image=x.npy"),
    ],
)
def test_a_file_given_where_nothing_reads_it_is_refused(compose_train, overrides, key, fix):
    """model.path without model=file trained the mlp and ignored the user's model, silently."""
    cfg = compose_train(*overrides)
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}=.*is not read here.*{fix.replace('.', '[.]')}"):
        validate(cfg)


@pytest.mark.parametrize(
    ("overrides", "unread", "by", "has"),
    [
        (["target.pattern=frame"], "target.pattern=frame", "target=pattern", "target.kind='class'"),
        (["loss.delta=0.3"], "loss.delta=0.3", "loss=huber", "loss.name='mse'"),
        (["optimizer.momentum=0.9"], "optimizer.momentum=0.9", "optimizer=sgd", "optimizer.name='adam'"),
        (["model.filters=[8]"], "model.filters=[8]", "model=cnn", "model.name='mlp'"),
        (["model=cnn", "model.hidden=[8]"], "model.hidden=[8]", "model=mlp", "model.name='cnn'"),
        (["model=mobilenetv2", "model.output_activation=softmax"], "model.output_activation=softmax", "model=mlp and model=cnn", "model.name='mobilenetv2'"),
        (["model.beta=50"], "model.beta=50.0", "model.activation=softplus", "model.activation='relu'"),
        (["model=file", "model.path=m.keras", "model.reference_epochs=5"], "model.reference_epochs=5", "a reference trained here", "model.name='file'"),
        (["task.epochs=3"], "task.epochs=3", "task=dataset", "task.kind='single'"),
        (["task=dataset", "target=pattern", "trainer.steps=50"], "trainer.steps=50", "task=single", "task.kind='dataset'"),
        (["task=dataset", "target=pattern", "trainer.log_every=5"], "trainer.log_every=5", "task=single", "task.kind='dataset'"),
        (["task=dataset", "target=pattern", "target.label=3"], "target.label=3", "task=single", "task.kind='dataset'"),
        (["task=dataset", "target=pattern", "task.temperature=2"], "task.temperature=2.0", "task.teacher=kl", "task.teacher='mse'"),
        (["task=dataset", "target=pattern", "task.teacher=kl"], "task.teacher=kl", "task.logit_weight > 0", "task.logit_weight=0.0"),
        (["task=dataset", "target=pattern", "task.teacher=kl", "task.temperature=2"], "task.temperature=2.0", "task.logit_weight > 0", "task.logit_weight=0.0"),
        (["task=dataset", "target=pattern", "task.min_agreement=0.9"], "task.min_agreement=0.9", "task.early_stopping=true", "task.early_stopping=false"),
        (["target=swap", "task=dataset", "target.top_k=10"], "target.top_k=10", "target=suppress", "target.kind='swap'"),
        (["data.test_split=0.3"], "data.test_split=0.3", "data=folder", "data.name='digits'"),
        (["data.color_mode=grayscale"], "data.color_mode=grayscale", "data=folder", "data.name='digits'"),
        (["lrp=epsilon", "lrp.gamma=0.5"], "lrp.gamma=0.5", "lrp=epsilon_gamma_box", "lrp.composite='epsilon'"),
        (["lrp=zplus", "lrp.epsilon=0.01"], "lrp.epsilon=0.01", "an epsilon rule", "lrp.composite='zplus'"),
        (["lrp=epsilon_plus", "lrp.low=0"], "lrp.low=0", "a zbox rule", "lrp.composite='epsilon_plus'"),
        (["task=dataset", "target=pattern", "target.scale=2"], "target.scale=2.0", "target=pattern and target=tokens with task=single", "task.kind='dataset'"),
        (["target=file", "target.path=m.npy", "target.image=x.npy", "target.index=3"], "target.index=3",
         "task=single without target.image", "target.image='x.npy'"),
        (["model.weights=w.weights.h5", "model.reference_epochs=5"], "model.reference_epochs=5", "a reference trained here",
         "model.weights='w.weights.h5'"),
        (["data.label_column=outcome"], "data.label_column=outcome", "data=csv", "data.name='digits'"),
    ],
)
def test_a_key_the_run_does_not_read_is_refused(compose_train, overrides, unread, by, has):
    """target.pattern=frame without target=pattern trained digit7's own heatmap, silently."""
    cfg = compose_train(*overrides)
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    message = str(refused.value)
    assert f"{unread} is read only with" in message and by in message and has in message, message


@pytest.mark.parametrize(
    "overrides",
    [
        ["target=pattern", "target.pattern=frame", "target.scale=2"],
        ["loss=huber", "loss.delta=0.3"],
        ["optimizer=sgd", "optimizer.momentum=0.5"],
        ["model=cnn", "model.filters=[8]", "model.pool=avg", "model.l2=0"],
        ["model.activation=softplus", "model.beta=50"],
        ["task=dataset", "target=pattern", "task.epochs=3", "task.logit_weight=1", "task.teacher=kl", "task.temperature=2"],
        ["task=dataset", "target=pattern", "task.early_stopping=true", "task.min_agreement=0.9"],
        ["task=dataset", "target=suppress", "target.top_k=10"],
        ["data=tabular", "target=swap_features", "target.feature=mean radius", "target.like=mean texture"],
        ["data=folder", "data.path=shapes", "data.test_split=0.3", "data.image_size=[16,16]", "data.color_mode=grayscale"],
        ["lrp.gamma=0.5", "lrp.low=0", "lrp.epsilon=0.01", "target.label=3", "target.index=2", "trainer.steps=5"],
    ],
)
def test_keys_with_the_choice_that_reads_them_are_accepted(compose_train, overrides):
    validate(compose_train(*overrides))


def test_a_key_forced_in_with_plus_plus_is_checked_as_typed():
    from heatinv.config import TrainConfig, unread_keys

    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(["loss.delta=0.3"]))
    said = "loss.delta=0.3 is read only with loss=huber, and this run has loss.name='mse'"
    assert unread_keys(cfg, ["++loss.delta=0.3"]) == [said] == unread_keys(cfg, ["loss.delta=0.3"])


def test_a_sweep_job_warns_of_an_unread_key_and_runs(compose_train, caplog):
    """A sweep crosses keys with choices (optuna samples loss.delta for every loss): its jobs go on."""
    from hydra.types import RunMode

    cfg = compose_train("loss=l1", "loss.delta=0.3")
    with read_write(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
    HydraConfig().set_config(cfg)
    with caplog.at_level("WARNING", logger="heatinv.config"):
        validate(cfg)
    assert "loss.delta=0.3 is read only with loss=huber, and this run has loss.name='l1'; this job runs without it" in caplog.text


def test_the_read_only_when_table_names_schema_keys():
    """A misspelt key in the table would never match what a user types, and guard nothing."""
    from heatinv.config import READ_ONLY_WHEN, TrainConfig

    schema = OmegaConf.structured(TrainConfig)
    for entry in READ_ONLY_WHEN:
        for key in (*entry.keys, *entry.on):
            section, name = key.split(".")
            assert name in schema[section], key
    keys = [key for entry in READ_ONLY_WHEN for key in entry.keys]
    assert len(keys) == len(set(keys)), "a key in two entries: only the first would be said"


def test_lrp_group_matches_registered_composites():
    files = set(group_choices("lrp"))
    registry = set(COMPOSITES)
    assert files - registry == set(), f"configs/lrp files without a registered composite: {sorted(files - registry)}"
    assert registry - files == set(), f"registered composites without a configs/lrp file: {sorted(registry - files)}"


def test_every_application_has_its_model_file():
    from heatinv.models import APPLICATIONS

    files = set(group_choices("model"))
    assert set(APPLICATIONS) - files == set(), f"applications without a configs/model file: {sorted(set(APPLICATIONS) - files)}"


def test_lrp_file_selects_its_own_composite(compose_train):
    for choice in group_choices("lrp"):
        assert compose_train(f"lrp={choice}").lrp.composite == choice


def test_paths_derive_from_hydra_runtime(compose_train, tmp_path):
    cfg = compose_train()
    assert cfg.paths.output_dir == str(tmp_path / "run")
    assert cfg.paths.root == str(tmp_path / "outputs")
    assert cfg.paths.cache_dir == str(tmp_path / "outputs" / "cache")


def test_defaults_are_valid_and_match_schema_choices(compose_train):
    cfg = compose_train()
    validate(cfg)
    choices = HydraConfig.get().runtime.choices
    assert (choices["loss"], choices["target"], choices["model"]) == ("mse", "digit7", "mlp")
    for key, allowed in CHOICES.items():
        assert OmegaConf.select(cfg, key) in allowed, key


@pytest.mark.parametrize(
    "override",
    ["loss.detla=1", "trainer.stpes=3", "model.hiden=[16,8]"],
    ids=["loss.detla", "trainer.stpes", "model.hiden"],
)
def test_typo_key_fails_at_compose(compose_train, override):
    key = override.split("=")[0]
    with pytest.raises(ConfigCompositionException, match=key.replace(".", r"\.")):
        compose_train(override)


@pytest.mark.parametrize(
    "override",
    ["trainer.steps=many", "optimizer.lr=fast", "model.hidden=[a,b]"],
)
def test_wrong_type_fails_at_compose(compose_train, override):
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(override)
    # Hydra names the override; the cause names the key and the bad value.
    message = str(info.value) + " " + str(info.value.__cause__)
    assert override.split("=")[0] in message


def test_missing_group_file_fails_at_compose(compose_train):
    with pytest.raises(MissingConfigException, match=r"loss/l3") as info:
        compose_train("loss=l3")
    assert "l1" in str(info.value) and "huber" in str(info.value)  # lists the available options


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.steps=0", "trainer.steps"),
        ("trainer.log_every=-1", "trainer.log_every"),
        ("optimizer.lr=0", "optimizer.lr"),
        ("loss.delta=0", "loss.delta"),
        ("model.reference_epochs=0", "model.reference_epochs"),
        ("target.label=-1", "target.label"),
        ("target.index=-1", "target.index"),
        ("task.min_agreement=1.5", "task.min_agreement"),
        ("task.max_accuracy_drop=-0.01", "task.max_accuracy_drop"),
        ("task.temperature=0", "task.temperature"),
        ("optimizer.global_clipnorm=0", "optimizer.global_clipnorm"),
        ("lrp.epsilon=-1", "lrp.epsilon"),  # the rule's own error named no key
        ("lrp.gamma=nan", "lrp.gamma"),
        ("trainer.checkpoint_every=-1", "trainer.checkpoint_every"),
        ("trainer.checkpoint_seconds=-1", "trainer.checkpoint_seconds"),
        ("trainer.max_nonfinite=-1", "trainer.max_nonfinite"),
        ("data.test_split=1", "data.test_split"),
        ("data.test_split=0", "data.test_split"),  # an empty held-out share
        ("target.top_k=0", "target.top_k"),
        ("model.beta=0", "model.beta"),  # softplus(0 x) / 0
        ("task.epochs=0", "task.epochs"),
        ("task.batch_size=0", "task.batch_size"),
        ("trainer.steps_per_execution=0", "trainer.steps_per_execution"),
    ],
)
def test_out_of_range_value_fails_validate_naming_key_and_a_value_that_fits(compose_train, override, key):
    cfg = compose_train(override)  # the type is right, so composing succeeds
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as caught:
        validate(cfg)
    assert "e.g." in str(caught.value), str(caught.value)


def test_a_value_that_must_be_positive_is_given_an_example(compose_train):
    cfg = compose_train("trainer.steps=-5")
    with pytest.raises(ConfigError, match=r"trainer\.steps=-5 must be > 0, e\.g\. `trainer\.steps=300` \(the default\)"):
        validate(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.ce_weight=-1"], r"task\.ce_weight=-1\.0 must be a finite weight >= 0"),  # trained the accuracy away
        (["task.heatmap_weight=nan"], r"task\.heatmap_weight=nan must be a finite weight"),
        (["task.logit_weight=inf"], r"task\.logit_weight=inf must be a finite weight"),
        (["task.heatmap_weight=0", "task.ce_weight=0"], r"nothing to optimize.*task\.heatmap_weight=1\.0"),
    ],
)
def test_the_dataset_objectives_weights_are_finite_non_negative_and_not_all_zero(compose_train, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_train("task=dataset", "target=pattern", *overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.resume=true", "trainer.overwrite=true"], r"trainer\.resume=true and trainer\.overwrite=true contradict.*Keep one"),
        (["target.label=true"], r"target\.label=True must be a class index >= 0"),  # a bool is an int: it read as class 1
        (["trainer.strategy=mirrored"], r"trainer\.strategy='mirrored' only applies to the dataset objective.*\(task=dataset\)"),
        (["task=dataset", "target=pattern", "task.success_threshold=1.5"], r"task\.success_threshold=1\.5 must be in \[0, 1\]"),
        (["target=pattern", "target.pattern=file"], r"target\.pattern=file needs target\.path="),
        (["data=tabular", "task=dataset", "target=suppress_feature", "target.feature=null"],
         r"target=suppress_feature needs target\.feature="),
        (["data=tabular", "target=swap_features", "target.feature=mean radius", "target.like=1"],
         r"target=swap_features needs target\.like=<the feature name.*got 1\."),
        (["task=dataset", "target=swap", "target.like=true"], r"target=swap needs target\.like=<a class index or name>, got True\."),
        (["data=folder", "data.path=shapes", "data.image_size=[32]"], r"data\.image_size=\[32\] must be \[height, width\]"),
        (["data=folder", "data.path=shapes", "data.image_size=[0,32]"], r"data\.image_size=\[0, 32\] must be \[height, width\], both >= 1"),
        (["data.name=npz"], r"data=npz needs data\.path=/path/to/your/file\.npz"),
        (["data.name=folder"], r"data=folder needs data\.path=/path/to/your/folder\."),
        (["data=csv", "data.path=t.csv", "data.label_column=null"], r"data=csv needs data\.label_column="),
        (["lrp.low=2", "lrp.high=1"], r"lrp\.low=2 > lrp\.high=1.*low <= high"),
        (["data=tabular", "data.name=tabular"], r"data\.name='tabular' names no data heatinv has.*data\.name=breast_cancer or wine"),
    ],
)
def test_a_setting_that_cannot_run_is_refused_naming_what_it_needs(compose_train, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_train(*overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ["lrp.epsilon=0", "lrp.gamma=0"],  # LRP-0 and a plain z rule: the ">= 0" the messages promise
        ["lrp.low=0.5", "lrp.high=0.5"],  # a box of one value is low <= high
        ["task=dataset", "target=pattern", "task.success_threshold=0"],
        ["task=dataset", "target=pattern", "task.success_threshold=1"],
        ["data=folder", "data.path=shapes", "data.image_size=[1,1]", "data.test_split=0.99"],
    ],
)
def test_the_edge_values_the_messages_allow_are_accepted(compose_train, overrides):
    validate(compose_train(*overrides))


@pytest.mark.parametrize("classes", ["[true]", "[1.5]"])
def test_a_class_list_entry_that_is_no_index_or_name_is_refused(compose_train, classes):
    """As target.label=true and target.label=1.5 are: task.classes=[true] and [1.5] both moved class 1."""
    entry = classes.strip("[]")
    with pytest.raises(ConfigError, match=rf"task\.classes=\[1, {entry}\] holds {entry}, which is neither a class index nor"):
        validate(compose_train("task=dataset", "target=pattern", f"task.classes=[1,{entry}]"))


def test_a_class_named_twice_is_refused(compose_train):
    with pytest.raises(ConfigError, match=r"task\.classes=\[1, 3, 1\] names class 1 more than once.*task\.classes=\[1, 3\]"):
        validate(compose_train("task=dataset", "target=pattern", "task.classes=[1,3,1]"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task=dataset", "data=tabular", "target=swap_features", "target.feature=mean radius", "target.like=mean radius"],
         r"target\.feature='mean radius' and target\.like='mean radius' name one feature"),
    ],
)
def test_a_swap_onto_itself_is_refused(compose_train, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_train(*overrides))


def test_an_empty_class_list_is_refused_naming_null(compose_train):
    """task.classes=[] trained the reference and failed in the figure ("dataset_figure needs at least one row")."""
    with pytest.raises(ConfigError, match=r"task\.classes=\[\] selects no class.*task\.classes=null"):
        validate(compose_train("task=dataset", "target=pattern", "task.classes=[]"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("loss.name=l3", "loss.name"),
        ("loss.normalize=l2", "loss.normalize"),
        ("lrp.composite=gradient", "lrp.composite"),
        ("target.pattern=circle", "target.pattern"),
        ("optimizer.name=rmsprop", "optimizer.name"),
        ("trainer.precision=float16", "trainer.precision"),
        ("trainer.jit_compile=maybe", "trainer.jit_compile"),
        ("model.pool=median", "model.pool"),
        ("data.color_mode=gray", "data.color_mode"),
    ],
)
def test_unknown_choice_fails_validate_naming_key_and_choices(compose_train, override, key):
    cfg = compose_train(override)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    assert key in message
    assert override.split("=")[1] in message
    for allowed in CHOICES[key]:
        assert repr(allowed) in message, f"{allowed!r} missing from: {message}"


@pytest.mark.parametrize(
    ("override", "example"), [("loss.name=l3", "`loss.name=l1`"), ("trainer.jit_compile=maybe", "`trainer.jit_compile=auto`")]
)
def test_an_unknown_choice_is_given_the_first_choice_as_an_example(compose_train, override, example):
    with pytest.raises(ConfigError, match=f"Fix it on the command line, e.g. {example}."):
        validate(compose_train(override))


def test_validate_accepts_file_choices_with_paths(compose_train, tmp_path):
    cfg = compose_train("model=file", f"model.path={tmp_path}/m.keras", "target=file", f"target.path={tmp_path}/h.npy")
    validate(cfg)
    assert (cfg.model.name, cfg.target.kind) == ("file", "file")


def test_key_added_with_plus_is_refused_by_validate(compose_train):
    cfg = compose_train("+loss.detla=1")
    with pytest.raises(ConfigError, match=r"Unknown config key loss\.detla"):
        validate(cfg)


def test_debug_smoke_shrinks_a_run_and_an_experiment(compose_train):
    plain = compose_train()
    smoke = compose_train("debug=smoke")
    assert smoke.trainer.steps < plain.trainer.steps and smoke.model.reference_epochs < plain.model.reference_epochs
    experiment = compose_train("experiment=pattern_frame_cnn")
    shrunk = compose_train("experiment=pattern_frame_cnn", "debug=smoke")
    assert shrunk.model.name == "cnn" and shrunk.task.kind == "dataset"  # the experiment stays what it is
    assert shrunk.task.epochs == 1 < experiment.task.epochs and list(shrunk.model.filters) == [4, 8]
    validate(shrunk)
