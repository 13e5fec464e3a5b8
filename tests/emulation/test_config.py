import pytest

from lightning_hetero.emulation.config import DEFAULT_CONTAINERS, ConfigError, load_config
from lightning_hetero.emulation.presets import Allocation

USER_CONFIG = """
variant: bsp
containers: [a, b, c, d]
host_cpus: 4
levels:
  one_slow: ["0", "1", 0.25, {cpuset: "3", cpus: 0.5}]
schedule:
  unit: seconds
  steps:
    - {start: 0, level: HL1}
    - {start: 30, level: one_slow}
"""


def test_yaml_with_user_level_and_schedule(tmp_path):
    path = tmp_path / "emulate.yaml"
    path.write_text(USER_CONFIG)
    config = load_config(path)
    assert config.containers == ("a", "b", "c", "d")
    assert config.levels["one_slow"] == (
        Allocation(cpuset="0"),
        Allocation(cpuset="1"),
        Allocation(cpus=0.25),
        Allocation(cpuset="3", cpus=0.5),
    )
    assert config.schedule.unit == "seconds"
    assert config.schedule.level_at(31) == "one_slow"
    assert config.resolve_level("one_slow", host_cpus=4).name == "one_slow"


def test_overrides_apply_on_top_of_the_file(tmp_path):
    path = tmp_path / "emulate.yaml"
    path.write_text(USER_CONFIG)
    config = load_config(path, ["schedule=null", "level=one_slow", "containers=[w,x,y,z]", "cluster.image=img:1"])
    assert (config.level, config.schedule, config.containers) == ("one_slow", None, ("w", "x", "y", "z"))
    assert config.cluster.image == "img:1"
    assert config.cluster.network == "lightning-hetero"  # untouched siblings keep their defaults


def test_named_schedule_and_asp_defaults():
    config = load_config(overrides=["variant=asp", "schedule=omnilearn-resnet50"])
    assert config.containers == DEFAULT_CONTAINERS["asp"]
    assert config.schedule.level_at(80) == "HL8"
    assert len(config.resolve_level("HL8", host_cpus=48).allocations) == 5


def test_overrides_can_add_a_user_level():
    config = load_config(overrides=["levels.half=[0.5,0.5,0.5,0.5]", "level=half"])
    assert config.resolve_level("half", 2).allocations[0] == Allocation(cpus=0.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["levle=HL2"], "levle: unknown key"),
        (["cluster.imag=x"], "cluster.imag: unknown key"),
        (["level"], "level: overrides are key=value"),
        (["variant=sync"], "variant: expected one of bsp, asp"),
        (["allocation=pinned"], "allocation: expected one of auto, cpuset, quota"),
        (["host_cpus=0"], "host_cpus: expected a positive integer"),
        (["host_cpus=two"], "host_cpus: expected a positive integer"),
        (["cpu_period_us=10"], "cpu_period_us: the kernel accepts"),
        (["poll_interval_s=0"], "poll_interval_s: expected a positive number"),
        (["containers=[a,a,b,c]"], "containers: names must be unique"),
        (["containers=[a,b]", "level=HL1"], r"containers: preset HL1 \(bsp\) needs 4 containers, got 2"),
        (["level=HL2", "schedule=omnilearn-resnet18"], "level: set either level"),
        (["schedule=resnet"], "schedule: unknown schedule 'resnet'"),
        (["schedule.steps=[{start: 0, level: HL9}]"], r"schedule.steps\[0\].level: unknown level 'HL9'"),
        (["schedule.steps=[{start: -1, level: HL1}]"], r"schedule.steps\[0\].start: expected a number >= 0"),
        (["schedule.steps=[{start: 3, level: HL1}]"], "schedule: the first step must start at 0"),
        (["schedule.unit=hours", "schedule.steps=[{start: 0, level: HL1}]"], "schedule: unit must be one of"),
        (["schedule.every=3"], "schedule.every: unknown key"),
        (["levels.x=[1,1,1]"], "levels.x: 3 allocations for 4 containers"),
        (["levels.x=[1,1,1,-1]"], r"levels.x\[3\].cpus: expected a positive number"),
        (["levels.pin=[0,1,2,3]"], r"levels.pin\[0\].cpus: expected a positive number, got 0; .* quote it"),
        (["progress_timeout_s=0"], "progress_timeout_s: expected a positive number"),
        (["levels.x=[1,1,1,'9-1']"], r"levels.x\[3\].cpuset: invalid cpuset"),
        (["levels.x=[1,1,1,{cores: 2}]"], r"levels.x\[3\].cores: unknown key"),
        (["levels.HL2=[1,1,1,1]"], "levels.HL2: the name is taken by a preset"),
        (["cluster.command=[]"], "cluster.command: expected a non-empty list of arguments"),
        (["cluster.progress_mount=progress"], "cluster.progress_mount: must be an absolute path"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_bad_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of keys at the top level"):
        load_config(path)
    path.write_text("level: HL2\nlevels: {x: [1,1,1,1]}\ntypo: 1\n")
    with pytest.raises(ConfigError, match="typo: unknown key"):
        load_config(path)
    path.write_text("level: [HL2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: while parsing"):
        load_config(path.rename(tmp_path / "bad.yaml"))


@pytest.mark.parametrize("override", ["schedule={unit:seconds,steps:[[0,HL2]]}", "schedule={unit: seconds, steps: [}"])
def test_malformed_yaml_in_an_override_names_the_key_and_the_fix(override):
    with pytest.raises(ConfigError, match=r"^schedule: not valid YAML .*put a space after each ':'"):
        load_config(None, [override])


def test_the_schema_is_written_once_defaults_come_from_the_dataclass_fields():
    from dataclasses import fields

    from lightning_hetero.emulation.config import DEFAULTS, ClusterConfig, EmulationConfig

    assert list(DEFAULTS) == [f.name for f in fields(EmulationConfig)]
    assert list(DEFAULTS["cluster"]) == [f.name for f in fields(ClusterConfig)]
    config = load_config()
    assert (config.cpu_period_us, config.cluster.image) == (100_000, "lightning-hetero-worker:latest")
    assert config.cluster.command == ("sleep", "infinity")
