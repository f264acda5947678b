"""The config loader: defaults < file < --set, typed, and every mistake named with a fix."""

from __future__ import annotations

import pytest
import yaml

from lab.errors import ConfigError
from lab.run import config
from tests.conftest import lab


def test_precedence_defaults_then_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 0.05\n  global_batch_size: 64\nmodel:\n  width: 16\n")
    cfg = config.load(path, ["train.lr=0.3", "model.norm=group"])
    assert (cfg.train.lr, cfg.train.global_batch_size, cfg.model.width, cfg.model.norm) == (0.3, 64, 16, "group")
    assert cfg.train.momentum == config.TrainConfig().momentum  # untouched keys keep their defaults


def test_configs_are_frozen():
    cfg = config.load(None)
    with pytest.raises(AttributeError):
        cfg.train.lr = 1.0


@pytest.mark.parametrize("name", config.shipped_names())
def test_every_shipped_config_loads(name):
    assert config.load(name).origin.endswith(f"{name}.yaml")


def test_shipped_configs_include_the_documented_ones():
    assert {"smoke", "baseline", "ddp", "workshop-cpu", "workshop-gpu"} <= set(config.shipped_names())


def test_set_keeps_text_fields_as_text():
    assert config.load(None, ["run.id=0042"]).run.id == "0042"


def test_int_accepted_for_float_fields():
    assert config.load(None, ["train.lr=1"]).train.lr == 1.0


def test_scientific_notation_is_a_number_in_files_and_overrides(tmp_path):
    # YAML 1.1 reads 5e-4 (no dot) as text; the course writes weight decay that way
    (tmp_path / "c.yaml").write_text("train:\n  weight_decay: 5e-4\n")
    assert config.load(tmp_path / "c.yaml").train.weight_decay == 5e-4
    assert config.load(None, ["train.weight_decay=5E-4"]).train.weight_decay == 5e-4
    with pytest.raises(ConfigError, match="expected a number"):
        config.load(None, ["train.lr=fast"])


@pytest.mark.parametrize(
    "yaml_text, overrides, expected",
    [
        ("train:\n  lrr: 0.1\n", [], "c.yaml: train.lrr: unknown key; did you mean lr?"),
        ("trian:\n  lr: 0.1\n", [], "c.yaml: trian: unknown key; did you mean train?"),
        ("train:\n  lr: fast\n", [], "c.yaml: train.lr: expected a number >= 0, got text 'fast'"),
        (
            "train:\n  global_batch_size: -4\n",
            [],
            "train.global_batch_size: -4 is out of range; expected an integer >= 1",
        ),
        ("train:\n  global_batch_size: 2.5\n", [], "train.global_batch_size: expected an integer >= 1, got float 2.5"),
        ("model:\n  norm: layer\n", [], "model.norm: 'layer' is not allowed; expected one of batch, group"),
        ("run:\n  deterministic: 1\n", [], "run.deterministic: expected true or false, got int 1"),
        ("train: [1, 2]\n", [], "c.yaml: train: must be a mapping of keys, got a list"),
        ("- 1\n- 2\n", [], "c.yaml: top level must be a mapping of sections"),
        ("train:\n  lr: 0.1\n lr: 2\n", [], "c.yaml: line 3, column 2: invalid YAML"),
        ("", ["train.epochs=0"], "--set train.epochs: 0 is out of range; expected an integer >= 1"),
        ("", ["train.nope=1"], "--set train.nope: unknown key"),
        ("", ["lr=1"], "--set lr=1: expected section.key=value"),
        ("", ["train.momentum=1.5"], "--set train.momentum: 1.5 is out of range; expected a number in [0, 1]"),
        (
            "",
            ["train.global_batch_size=100", "train.grad_accum_steps=3"],
            "train.global_batch_size: 100 is not divisible by world size 1 x train.grad_accum_steps 3 = 3; "
            "use a multiple of 3 such as 99 or 102",
        ),
        ("", ["data.uneven=join", "train.grad_accum_steps=2"], "data.uneven: join needs train.grad_accum_steps=1"),
        (
            "",
            ["model.sync_batchnorm=true", "data.uneven=join"],
            "model.sync_batchnorm: true cannot be combined with data.uneven=join (Join does not cover SyncBatchNorm's "
            "all-gather: the other ranks hang); use data.uneven=pad or drop, or model.sync_batchnorm=false",
        ),
    ],
)
def test_bad_input_is_named_with_what_would_be_valid(tmp_path, yaml_text, overrides, expected):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        config.load(path, overrides)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_lists_shipped_configs(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found; give a path or one of: .*smoke"):
        config.load(tmp_path / "nope.yaml")


def test_layout_needs_the_world_size():
    cfg = config.load(None, ["train.global_batch_size=96"])
    config.check_layout(cfg, 3)
    assert config.batch_size_per_rank(cfg, 3) == 32
    with pytest.raises(ConfigError, match="not divisible by world size 5 x train.grad_accum_steps 1 = 5"):
        config.check_layout(cfg, 5)


def test_describe_documents_every_key_as_yaml():
    text = config.describe()
    assert yaml.safe_load(text)["train"]["global_batch_size"] == config.TrainConfig().global_batch_size
    for section, cls in config.SECTIONS.items():
        for field in cls.__dataclass_fields__:
            assert f"  {field}: " in text, (section, field)


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_sync_batchnorm_goes_with_padding_or_dropping(uneven):
    assert config.load(None, ["model.sync_batchnorm=true", f"data.uneven={uneven}"]).model.sync_batchnorm


def test_lab_train_refuses_sync_batchnorm_with_join_in_one_line(tmp_path):
    """Join shadows DDP's all-reduce, not SyncBatchNorm's all-gather: the pair would hang until NCCL's watchdog."""
    proc = lab(
        "train",
        "--set",
        "model.sync_batchnorm=true",
        "--set",
        "data.uneven=join",
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "model.sync_batchnorm" in lines[0] and "data.uneven=join" in lines[0]
    assert "data.uneven=pad or drop, or model.sync_batchnorm=false" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_help_config_says_sync_batchnorm_makes_the_host_wait():
    line = next(x for x in config.describe().splitlines() if x.startswith("  sync_batchnorm: "))
    assert "the host waits for the GPU in every BatchNorm layer of every step" in line
    assert "Not with data.uneven=join" in line


def test_a_cuda_run_with_sync_batchnorm_is_told_its_loop_waits():
    """No GPU here: the decision takes the device object only, so a cuda device object (never used) is enough."""
    import torch

    synced = config.load(None, ["model.sync_batchnorm=true"])
    warning = config.host_sync_warning(synced, torch.device("cuda", 0))
    assert warning.startswith("model.sync_batchnorm=true on CUDA: the host waits for the GPU")
    assert "\n" not in warning
    assert config.host_sync_warning(synced, torch.device("cpu")) is None
    assert config.host_sync_warning(config.load(None), torch.device("cuda", 0)) is None
