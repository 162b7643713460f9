"""Every IPUConfig option path of seed 004:1475-1904: type, default, checks, docstring, and
TF-IPU's configure-time rules; the enums, get_attribute_metadata, configure_ipu_system and
get_ipu_config as the seeds call them."""

import copy

import numpy as np
import pytest

import ipu_node
from ipu_node.config import (AttributeMetadata, DeviceConnectionType, ExecutionProfileType,
                             IPUConfig, MergeRemoteBuffersBehaviour, SchedulingAlgorithm,
                             SelectionOrder, configure_ipu_system, get_ipu_config)

_SEL = "typing.Union[int, typing.List[int], typing.Tuple[int, ]]"

# (path, type, default) exactly as seed 004:1475-1904 prints them (the oracle).
SEED_OPTIONS = [
    ("allow_recompute", "bool", False),
    ("selection_order", "SelectionOrder", SelectionOrder.AUTO),
    ("serialization_output_folder", "str", ""),
    ("compilation_poplar_options", "dict", {}),
    ("gcl_poplar_options", "dict", {}),
    ("auto_select_ipus", _SEL, []),
    ("select_ipus", _SEL, []),
    ("convolutions.poplar_options", "dict", {}),
    ("device_connection.type", "DeviceConnectionType", DeviceConnectionType.ALWAYS),
    ("device_connection.version", "str", ""),
    ("device_connection.enable_remote_buffers", "bool", False),
    ("experimental.always_rearrange_copies_on_the_host", "bool", False),
    ("experimental.enable_remote_buffer_embedding", "bool", False),
    ("experimental.multi_replica_distribution.process_index", "int", 0),
    ("experimental.multi_replica_distribution.process_count", "int", 0),
    ("floating_point_behaviour.inv", "bool", False),
    ("floating_point_behaviour.div0", "bool", False),
    ("floating_point_behaviour.oflo", "bool", False),
    ("floating_point_behaviour.esr", "bool", False),
    ("floating_point_behaviour.nanoo", "bool", False),
    ("floating_point_behaviour.set_all", "bool", False),
    ("io_tiles.num_io_tiles", "int", 0),
    ("io_tiles.place_ops_on_io_tiles", "bool", False),
    ("io_tiles.available_memory_proportion", "float", 0.9),
    ("ipu_model.compile_ipu_code", "bool", True),
    ("ipu_model.tiles_per_ipu", "int", 0),
    ("ipu_model.version", "str", "ipu2"),
    ("matmuls.clear_pass_type", "bool", False),
    ("matmuls.poplar_options", "dict", {}),
    ("norms.use_stable_statistics", "bool", False),
    ("norms.experimental.distributed_batch_norm_replica_group_size", "int", 1),
    ("optimizations.prefetch_data_streams", "bool", True),
    ("optimizations.combine_embedding_lookups", "bool", False),
    ("optimizations.combine_matmuls", "bool", False),
    ("optimizations.enable_graph_outlining", "bool", True),
    ("optimizations.merge_infeed_io_copies", "bool", False),
    ("optimizations.maximum_cross_replica_sum_buffer_size", "int", 0),
    ("optimizations.maximum_reduce_scatter_buffer_size", "int", 0),
    ("optimizations.maximum_inter_ipu_copies_buffer_size", "int", 0),
    ("optimizations.maximum_send_recv_cluster_size", "int", 0),
    ("optimizations.minimum_remote_tensor_size", "int", 128),
    ("optimizations.merge_remote_buffers", "MergeRemoteBuffersBehaviour",
     MergeRemoteBuffersBehaviour.IF_BENEFICIAL),
    ("optimizations.enable_gather_simplifier", "bool", True),
    ("optimizations.triangular_solve_expander_block_size", "int", 0),
    ("optimizations.cholesky_block_size", "int", 0),
    ("optimizations.enable_fast_math", "bool", False),
    ("pooling.poplar_options", "dict", {}),
    ("scheduling.algorithm", "SchedulingAlgorithm", SchedulingAlgorithm.CHOOSE_BEST),
    ("scheduling.maximum_scheduler_lookahead_depth", "int", 5),
    ("scheduling.maximum_scheduler_search_space_size", "int", 64),
]

# a value of the wrong type for each seed type (TF-IPU's strict types: no bool for int)
WRONG = {"bool": 1, "int": True, "str": 2, "dict": [("a", "b")], "float": 1,
         "SelectionOrder": 0, "DeviceConnectionType": "ALWAYS",
         "MergeRemoteBuffersBehaviour": False, "SchedulingAlgorithm": "CHOOSE_BEST",
         _SEL: "/device:IPU:0"}


def _get(cfg, path):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg, path, value):
    *groups, name = path.split(".")
    for g in groups:
        cfg = getattr(cfg, g)
    setattr(cfg, name, value)


def test_all_fifty_seed_option_paths_are_there():
    assert len(SEED_OPTIONS) == 50 == len({p for p, _, _ in SEED_OPTIONS})
    cfg = IPUConfig()
    missing = [p for p, _, _ in SEED_OPTIONS if not _has(cfg, p)]
    assert missing == []


def _has(cfg, path):
    try:
        cfg.get_attribute_metadata(path)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("path,seed_type,default", SEED_OPTIONS, ids=[p for p, _, _ in SEED_OPTIONS])
def test_option_has_the_seeds_type_default_and_a_docstring(path, seed_type, default):
    cfg = IPUConfig()
    meta = cfg.get_attribute_metadata(path)
    assert isinstance(meta, AttributeMetadata)
    assert meta.name == path
    shown = meta.type.replace("typing.Tuple[int, ...]", "typing.Tuple[int, ]")
    if path == "floating_point_behaviour.esr":   # later SDKs also take an enum
        assert shown.startswith("typing.Union[bool")
    else:
        assert shown == seed_type
    assert _get(cfg, path) == default and type(_get(cfg, path)) is type(default)
    assert meta.default == default
    assert not meta.deprecated and meta.deprecated_msg is None
    doc = meta.__doc__
    assert "seed 004:" in doc and "ipupod:" in doc
    assert "acts" in doc or "no effect" in doc or "checked" in doc


@pytest.mark.parametrize("path,seed_type,default", SEED_OPTIONS, ids=[p for p, _, _ in SEED_OPTIONS])
def test_a_wrong_type_is_tf_ipus_type_error(path, seed_type, default):
    cfg = IPUConfig()
    bad = WRONG[seed_type]
    if path == "floating_point_behaviour.esr":
        bad = 1
    with pytest.raises(TypeError, match=rf"^Trying to set {path} to .*, but it must be of type"):
        _set(cfg, path, bad)
    with pytest.raises(TypeError, match=rf"Trying to set {path} to"):
        cfg.get_attribute_metadata(path).check_type(bad)
    assert cfg.get_attribute_metadata(path).check_type(default) is True
    assert _get(cfg, path) == default            # a refused value changes nothing
    assert not cfg.explicit_options()


@pytest.mark.parametrize("path,value,message", [
    ("ipu_model.tiles_per_ipu", -1, "ipu_model.tiles_per_ipu must be an int >= 0, got -1"),
    ("ipu_model.version", "ipu3", "ipu_model.version must be one of 'ipu1', 'ipu2'"),
    ("device_connection.version", "mk2", "device_connection.version must be one of '', "
                                         "'ipu1', 'ipu2'"),
    ("io_tiles.num_io_tiles", -4, "io_tiles.num_io_tiles must be an int >= 0"),
    ("io_tiles.available_memory_proportion", 1.5, "must be between 0 and 1, got 1.5"),
    ("norms.experimental.distributed_batch_norm_replica_group_size", 0,
     "distributed_batch_norm_replica_group_size must be an int >= 1"),
    ("optimizations.maximum_cross_replica_sum_buffer_size", -1, "must be an int >= 0"),
    ("scheduling.maximum_scheduler_lookahead_depth", 0, "must be an int >= 1"),
    ("experimental.multi_replica_distribution.process_count", -2, "must be an int >= 0"),
    ("auto_select_ipus", [1, -1], "auto_select_ipus entries must be >= 0"),
    ("matmuls.poplar_options", {"availableMemoryProportion": 0.3}, "Poplar options are "
                                                                   "strings"),
])
def test_a_value_out_of_range_names_the_option(path, value, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(
            "[", r"\[")):
        _set(IPUConfig(), path, value)


def test_unknown_options_are_tf_ipus_error_with_a_suggestion():
    cfg = IPUConfig()
    with pytest.raises(ValueError, match=r"'num_io_tile' is not a valid attribute of this "
                                         r"config. Did you mean 'io_tiles.num_io_tiles'\?"):
        cfg.io_tiles.num_io_tile = 2
    with pytest.raises(AttributeError, match="valid options: available_memory_proportion"):
        cfg.io_tiles.num_io_tile = 2
    with pytest.raises(ValueError, match="Could not get attribute metadata for 'io_tile.x'"):
        cfg.get_attribute_metadata("io_tile.x")
    with pytest.raises(TypeError, match="io_tiles is a category and cannot be assigned to"):
        cfg.io_tiles = 3


def test_metadata_of_a_category_and_relative_to_a_group():
    cfg = IPUConfig()
    meta = cfg.get_attribute_metadata("norms.experimental")
    assert (meta.name, meta.type, meta.default) == ("norms.experimental", None, None)
    inner = cfg.norms.get_attribute_metadata("experimental.distributed_batch_norm_replica_group_size")
    assert inner.name == "norms.experimental.distributed_batch_norm_replica_group_size"


def test_a_group_copied_into_another_config_takes_its_new_name():
    a, b = IPUConfig(), IPUConfig()
    a.io_tiles.num_io_tiles = 16
    b.io_tiles = a.io_tiles
    b.io_tiles.num_io_tiles = 32           # a copy: the first config keeps its value
    assert a.io_tiles.num_io_tiles == 16
    with pytest.raises(TypeError, match="Trying to set io_tiles.num_io_tiles"):
        b.io_tiles.num_io_tiles = "x"


def test_the_enums_have_the_seeds_members():
    assert [m.name for m in SchedulingAlgorithm] == ["CHOOSE_BEST", "CLUSTERING", "POST_ORDER",
                                                    "LOOK_AHEAD", "SHORTEST_PATH"]
    assert [m.name for m in DeviceConnectionType] == ["ALWAYS", "ON_DEMAND", "PRE_COMPILE",
                                                     "NEVER"]
    assert [m.name for m in ExecutionProfileType] == ["NO_PROFILE", "DEVICE_PROFILE",
                                                     "IPU_PROFILE", "TILE_PROFILE"]
    assert SelectionOrder.AUTO.value == SchedulingAlgorithm.CHOOSE_BEST.value == 0
    assert DeviceConnectionType.ALWAYS.value == MergeRemoteBuffersBehaviour.NO_MERGING.value == 0


def test_explicit_options_lists_what_a_program_set():
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.optimizations.maximum_cross_replica_sum_buffer_size = 1 << 20
    cfg.experimental.multi_replica_distribution.job_token = "secret"
    assert cfg.explicit_options() == {
        "auto_select_ipus": 2, "optimizations.maximum_cross_replica_sum_buffer_size": 1 << 20,
        "experimental.multi_replica_distribution.job_token": "secret"}
    from collectives.run_report import options_set
    shown = options_set(cfg)
    assert shown["experimental.multi_replica_distribution.job_token"] == "<set>"
    assert "secret" not in repr(cfg)


# -- TF-IPU's checks when configuring -----------------------------------------------------

@pytest.mark.parametrize("setup,message", [
    (lambda c: (setattr(c, "auto_select_ipus", 1), setattr(c, "select_ipus", 0)),
     "Only one of `auto_select_ipus` and `select_ipus` can be set"),
    (lambda c: setattr(c, "select_ipus", [0, 0]),
     "All MultiIPU indices in `select_ipus` must be unique."),
    (lambda c: (setattr(c, "auto_select_ipus", 1),
                setattr(c.io_tiles, "place_ops_on_io_tiles", True)),
     "Cannot place ops on I/O tiles when io_tiles.num_io_tiles == 0"),
    (lambda c: (setattr(c, "auto_select_ipus", 1), setattr(c.io_tiles, "num_io_tiles", 32),
                setattr(c.norms.experimental, "distributed_batch_norm_replica_group_size", 2)),
     "distributed_batch_norm_replica_group_size is not supported with I/O tiles."),
    (lambda c: (setattr(c, "auto_select_ipus", 1),
                setattr(c.device_connection, "type", DeviceConnectionType.NEVER)),
     "device_connection.version must be set when device_connection.type is "
     "DeviceConnectionType.NEVER or DeviceConnectionType.PRE_COMPILE"),
    (lambda c: (setattr(c, "auto_select_ipus", 1), setattr(c.io_tiles, "num_io_tiles", 1472)),
     r"io_tiles.num_io_tiles \(1472\) leaves no compute tiles"),
    (lambda c: (setattr(c, "auto_select_ipus", 1),
                setattr(c.experimental.multi_replica_distribution, "process_count", 2),
                setattr(c.experimental.multi_replica_distribution, "process_index", 2)),
     r"process_index must be in the range \[0, "),
])
def test_configuring_checks_tf_ipus_rules(setup, message):
    cfg = IPUConfig()
    setup(cfg)
    with pytest.raises(ipu_node.IPUConfigError, match=message):
        cfg.configure_ipu_system()


def test_configure_and_get_ipu_config_as_the_seeds_call_them():
    cfg = IPUConfig()
    cfg.auto_select_ipus = [1, 2]
    try:
        assert configure_ipu_system(cfg, device="cpu", reset_configuration=True) is not None
        got = get_ipu_config()
        assert len(got) == 2 and all(g.auto_select_ipus == [1, 2] for g in got)
        assert got[0] is not cfg                     # copies
        same = copy.deepcopy(cfg)
        assert configure_ipu_system(same, reset_configuration=False) is ipu_node.get_system()
        other = IPUConfig()
        other.auto_select_ipus = 1
        with pytest.raises(ipu_node.AlreadyConfiguredError, match="reset_configuration=True"):
            configure_ipu_system(other, reset_configuration=False)
        with pytest.raises(TypeError, match="`config` must be an IPUConfig"):
            configure_ipu_system({"auto_select_ipus": 1})
    finally:
        ipu_node.reset_ipu_configuration()
    with pytest.raises(RuntimeError, match="No IPU devices configured."):
        get_ipu_config()


# -- options that act ------------------------------------------------------------------------

def test_io_tiles_take_memory_and_compute_from_the_ipus():
    from ipu_node import clock
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.io_tiles.num_io_tiles = 128
    cfg.io_tiles.place_ops_on_io_tiles = True
    try:
        system = cfg.configure_ipu_system()
        ipu = system.devices[0].ipus[0]
        assert system.memory[ipu.id].capacity_bytes == (1472 - 128) * 624 * 1024
        assert clock.compute_efficiency() == pytest.approx(0.5 * (1472 - 128) / 1472)
    finally:
        ipu_node.reset_ipu_configuration()


def test_never_attaches_nothing_and_refuses_to_run(isolated_occupancy):
    from ipu_node import ipu_compiler, scopes
    from ipu_node.runtime import occupancy
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.device_connection.type = DeviceConnectionType.NEVER
    cfg.device_connection.version = "ipu1"
    try:
        system = cfg.configure_ipu_system()
        assert system.devices[0].ipus[0].version == "ipu1"
        held = occupancy.Occupancy(system.model.name).holders()
        assert held == []
        with pytest.raises(ipu_node.DeviceNotAttachedError,
                           match="device_connection.type is DeviceConnectionType.NEVER"):
            system.run_replicas(lambda: 1, [()] * 2, [{}] * 2)
        with scopes.ipu_scope("/device:IPU:0"):
            with pytest.raises(ipu_node.DeviceNotAttachedError):
                ipu_compiler.compile(lambda: np.ones(2))
    finally:
        ipu_node.reset_ipu_configuration()


def test_on_demand_attaches_at_the_first_run(isolated_occupancy):
    from ipu_node.runtime import occupancy
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.device_connection.type = DeviceConnectionType.ON_DEMAND
    try:
        system = cfg.configure_ipu_system()
        occ = occupancy.Occupancy(system.model.name)
        assert occ.holders() == []
        assert system.run_replicas(lambda: 7, [()], [{}]) == [7]
        assert [h.ipu_id for h in occ.holders()] == [system.devices[0].ipus[0].id]
    finally:
        ipu_node.reset_ipu_configuration()


@pytest.mark.parametrize("option,expression,event", [
    ("div0", lambda: np.float32(1) / np.zeros(2, np.float32), "divide"),
    ("inv", lambda: np.zeros(2) / np.zeros(2), "invalid"),
    ("oflo", lambda: np.full(2, 3e38, np.float32) * np.float32(10), "overflow"),
])
def test_floating_point_exceptions_stop_replicas(option, expression, event):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    try:
        system = cfg.configure_ipu_system()
        def quiet_fn():
            with np.errstate(all="ignore"):
                return expression()
        quiet = system.run_replicas(quiet_fn, [()] * 2, [{}] * 2)
        assert not np.isfinite(quiet[0]).all()
        setattr(cfg.floating_point_behaviour, option, True)
        system = cfg.configure_ipu_system()
        with pytest.raises(ipu_node.IPUFloatingPointError,
                           match=rf"{event}.*floating_point_behaviour {option}"):
            system.run_replicas(expression, [()] * 2, [{}] * 2)
        assert isinstance(ipu_node.IPUFloatingPointError("x"), FloatingPointError)
    finally:
        ipu_node.reset_ipu_configuration()


def test_set_all_turns_on_the_three_exceptions():
    cfg = IPUConfig()
    cfg.floating_point_behaviour.set_all = True
    assert cfg.floating_point_behaviour.errstate() == {"invalid": "raise", "divide": "raise",
                                                       "over": "raise"}


@pytest.fixture
def isolated_occupancy(tmp_path, monkeypatch):
    monkeypatch.setenv("IPUPOD_OCCUPANCY_DIR", str(tmp_path / "occ"))
    yield
