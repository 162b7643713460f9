"""The seeds' deprecated utils configuration API mapped onto IPUConfig, reset_ipu_seed's
per-replica streams, and Graphcore's environment flags."""

import json
import logging
import warnings

import numpy as np
import pytest

import ipu_node
from ipu_node import flags, rand_ops, utils
from ipu_node.config import (DeviceConnectionType, ExecutionProfileType, IPUConfig,
                             MergeRemoteBuffersBehaviour, SchedulingAlgorithm, SelectionOrder)


@pytest.fixture(autouse=True)
def _reset():
    yield
    ipu_node.reset_ipu_configuration()


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(*args, **kwargs)


def test_the_seeds_multi_worker_lines_configure_a_device_of_two_ipus():
    with pytest.warns(DeprecationWarning, match="THIS FUNCTION IS DEPRECATED.*SDK 2.1"):
        config = utils.create_ipu_config()
    with pytest.warns(DeprecationWarning, match="auto_select_ipus"):
        config = utils.auto_select_ipus(config, num_ipus=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # these two are not deprecated in the seeds
        system = utils.configure_ipu_system(config)
        utils.move_variable_initialization_to_cpu()
    assert isinstance(config, IPUConfig)
    assert [len(d.ipus) for d in system.devices] == [2]
    assert utils.get_num_of_ipus_in_device("/device:IPU:0") == 2


@pytest.mark.parametrize("call,path,value", [
    (lambda o: utils.select_ipus(o, indices=[24, 25]), "select_ipus", [24, 25]),
    (lambda o: utils.set_compilation_options(o, {"debug.allowOutOfMemory": "true"}),
     "compilation_poplar_options", {"debug.allowOutOfMemory": "true"}),
    (lambda o: utils.set_convolution_options(o, {"availableMemoryProportion": "0.1"}),
     "convolutions.poplar_options", {"availableMemoryProportion": "0.1"}),
    (lambda o: utils.set_matmul_options(o, {"availableMemoryProportion": "0.5"}, True),
     "matmuls.clear_pass_type", True),
    (lambda o: utils.set_pooling_options(o, {"poolUseIntrospectiveMapping": "false"}),
     "pooling.poplar_options", {"poolUseIntrospectiveMapping": "false"}),
    (lambda o: utils.set_serialization_options(o, "/tmp/my_network"),
     "serialization_output_folder", "/tmp/my_network"),
    (lambda o: utils.set_ipu_connection_type(o, DeviceConnectionType.NEVER, "ipu2", True),
     "device_connection.type", DeviceConnectionType.NEVER),
    (lambda o: utils.set_ipu_model_options(o, False, 8, "ipu1"), "ipu_model.tiles_per_ipu", 8),
    (lambda o: utils.set_io_tile_options(o, 32, True, 0.5), "io_tiles.num_io_tiles", 32),
    (lambda o: utils.set_floating_point_behaviour_options(o), "floating_point_behaviour.oflo",
     True),
    (lambda o: utils.set_gcl_options(o, {"method": "clockwise_ring"}), "gcl_poplar_options",
     {"method": "clockwise_ring"}),
    (lambda o: utils.set_norm_options(o, True, 2),
     "norms.experimental.distributed_batch_norm_replica_group_size", 2),
    (lambda o: utils.set_optimization_options(o, max_cross_replica_sum_buffer_size=1024,
                                              merge_remote_buffers=True),
     "optimizations.merge_remote_buffers", MergeRemoteBuffersBehaviour.MERGE),
    (lambda o: utils.set_optimization_options(o, max_reduce_scatter_buffer_size=64),
     "optimizations.maximum_reduce_scatter_buffer_size", 64),
    (lambda o: utils.set_recomputation_options(o), "allow_recompute", True),
    (lambda o: utils.set_experimental_multi_replica_distribution_options(o, 4, 3),
     "experimental.multi_replica_distribution.process_index", 3),
])
def test_each_setter_sets_its_ipu_config_option_and_warns(call, path, value):
    opts = _quiet(utils.create_ipu_config)
    with pytest.warns(DeprecationWarning, match="is deprecated: THIS FUNCTION IS DEPRECATED"):
        assert call(opts) is opts
    target = opts
    for part in path.split("."):
        target = getattr(target, part)
    assert target == value
    assert path in opts.explicit_options()


def test_create_ipu_config_maps_its_arguments():
    opts = _quiet(utils.create_ipu_config, profiling=True, report_directory="/tmp/r",
                  scheduler_selection=SchedulingAlgorithm.LOOK_AHEAD,
                  disable_graph_outlining=True, max_inter_ipu_copies_buffer_size=4096,
                  selection_order=SelectionOrder.SNAKE,
                  enable_experimental_remote_buffer_embedding=True)
    assert opts.compilation_poplar_options == {"autoReport.all": "true",
                                               "autoReport.directory": "/tmp/r"}
    assert opts.scheduling.algorithm is SchedulingAlgorithm.LOOK_AHEAD
    assert opts.optimizations.enable_graph_outlining is False
    assert opts.optimizations.maximum_inter_ipu_copies_buffer_size == 4096
    assert opts.selection_order is SelectionOrder.SNAKE
    assert opts.experimental.enable_remote_buffer_embedding is True
    # the old API's default (seed 004:1100), the only option a bare call sets
    assert _quiet(utils.create_ipu_config).explicit_options() == {
        "optimizations.merge_remote_buffers": MergeRemoteBuffersBehaviour.NO_MERGING}


@pytest.mark.parametrize("call,error,message", [
    (lambda: utils.create_ipu_config(profiling=True, enable_ipu_events=True), ValueError,
     "`profiling` and `enable_ipu_events` are mutually exclusive"),
    (lambda: utils.create_ipu_config(profile_execution=ExecutionProfileType.IPU_PROFILE),
     ValueError, "`profiling` is required when `profile_execution` is set"),
    (lambda: utils.create_ipu_config(profiling=True, profile_execution="yes"), TypeError,
     "`profile_execution` must be True, False, or an ExecutionProfileType instance"),
    (lambda: utils.auto_select_ipus(utils.auto_select_ipus(utils.create_ipu_config(), 1), 1),
     ValueError, "IPU devices have already been configured."),
    (lambda: utils.auto_select_ipus(utils.create_ipu_config(), "2"), TypeError,
     "`num_ipus` must be an integer, list or tuple."),
    (lambda: utils.select_ipus(utils.create_ipu_config(), 3), TypeError,
     "`indices` must be a list or tuple."),
    (lambda: utils.select_ipus(utils.create_ipu_config(), [1, 1]), ValueError,
     "All device indices in `indices` must be unique."),
    (lambda: utils.set_convolution_options(utils.create_ipu_config(), "x"), TypeError,
     "`convolution_options` must be a dictionary"),
    (lambda: utils.set_experimental_multi_replica_distribution_options(
        utils.create_ipu_config(), 2, 2), ValueError, "0 <= process_index < process_count"),
    (lambda: utils.set_verification_options(utils.create_ipu_config(), {}), TypeError,
     "`verification_options` must be of type VerificationOptions"),
    (lambda: utils.set_gcl_options({}, {}), TypeError, "opts must be the configuration "
                                                       "create_ipu_config"),
    (lambda: utils.set_ipu_model_options(utils.create_ipu_config(), ipu_model_version="ipu3"),
     ValueError, "ipu_model.version must be one of"),
])
def test_the_utils_errors_are_tf_ipus(call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace("`", ".")):
        _quiet(call)


def test_running_on_ipu_model_reads_tf_poplar_flags(monkeypatch):
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    assert utils.running_on_ipu_model() is False
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--max_infeed_threads=8 --use_ipu_model")
    assert utils.running_on_ipu_model() is True


# -- reset_ipu_seed ----------------------------------------------------------------------------

def _draws(strategy_replicas, seed, identical=False):
    cfg = IPUConfig()
    cfg.auto_select_ipus = strategy_replicas
    system = cfg.configure_ipu_system()
    utils.reset_ipu_seed(seed, experimental_identical_replicas=identical)
    n = system.num_local_replicas
    return system.run_replicas(lambda: rand_ops.generator().random(3), [()] * n, [{}] * n)


def test_reset_ipu_seed_gives_each_replica_its_own_stream_or_identical_ones():
    own = _draws(4, seed=7)
    assert all(not np.array_equal(own[0], o) for o in own[1:])
    for r, draw in enumerate(own):    # a function of (seed, global replica): any layout
        np.testing.assert_array_equal(draw, np.random.default_rng([7, r]).random(3))
    same = _draws(4, seed=7, identical=True)
    assert all(np.array_equal(same[0], s) for s in same)
    again = _draws(2, seed=7)             # another layout: replicas 0 and 1 draw the same
    np.testing.assert_array_equal(again[1], own[1])


def test_dropout_draws_from_the_replica_stream():
    x = np.ones((4, 8), np.float32)
    ipu_node.rand_ops.reset_seed(3)
    a = rand_ops.dropout(x, rate=0.25)
    ipu_node.rand_ops.reset_seed(3)
    b = rand_ops.dropout(x, rate=0.25)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        rand_ops.dropout(x, rate=1.0)
    with pytest.raises(TypeError, match="seed must be an int"):
        utils.reset_ipu_seed("7")
    with pytest.raises(ValueError, match="replicas on /device:IPU:0"):
        utils.reset_ipu_seed(1, device="/device:IPU:1")


# -- environment flags ------------------------------------------------------------------------

def test_tf_poplar_flags_known_unknown_and_bad_values(monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model --executable_cache_path=/tmp/c "
                                          "--show_progress_bar=false "
                                          "--max_compilation_threads=2 --max_infeed_threads=4")
    got = flags.poplar_flags()
    assert (got.use_ipu_model, got.executable_cache_path, got.show_progress_bar,
            got.max_compilation_threads, got.max_infeed_threads) == (True, "/tmp/c", "false",
                                                                     2, 4)
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model --no_such_flag=1")
    with pytest.raises(ipu_node.IPUConfigError,
                       match="Unknown flag in TF_POPLAR_FLAGS: --no_such_flag=1"):
        flags.poplar_flags()
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--max_infeed_threads=many")
    with pytest.raises(ipu_node.IPUConfigError, match="--max_infeed_threads='many' is not an "
                                                      "int"):
        flags.poplar_flags()
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--show_progress_bar=maybe")
    with pytest.raises(ipu_node.IPUConfigError, match="must be true, false or auto"):
        flags.poplar_flags()


def test_the_flags_act_when_configuring(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TF_POPLAR_FLAGS",
                       f"--use_ipu_model --ipu_model_tiles=8 --executable_cache_path={cache}")
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    system = cfg.configure_ipu_system()
    assert cache.is_dir() and system.ipu_model and system.devices[0].ipus[0].tiles == 8
    cfg.experimental.multi_replica_distribution.process_count = 2
    with pytest.raises(ipu_node.IPUConfigError, match="Multi-replica distribution is not "
                                                      "supported on the IPU model."):
        cfg.configure_ipu_system()
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--bogus")
    with pytest.raises(ipu_node.IPUConfigError, match="Unknown flag in TF_POPLAR_FLAGS"):
        IPUConfig().configure_ipu_system()


def test_poplar_engine_options_ask_for_the_report(monkeypatch, tmp_path):
    from collectives.run_report import report_directory
    monkeypatch.delenv("IPUPOD_REPORT_DIR", raising=False)
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path)}))
    assert flags.auto_report_directory() == str(tmp_path)
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"autoReport.outputExecutionProfile": true}')
    assert flags.auto_report_directory() == "."
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"autoReport.all": "true"')
    with pytest.raises(ipu_node.IPUConfigError, match="POPLAR_ENGINE_OPTIONS is not valid "
                                                      "JSON"):
        flags.engine_options()
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    with pytest.raises(ipu_node.IPUConfigError, match="POPLAR_ENGINE_OPTIONS"):
        cfg.configure_ipu_system()
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS")
    opts = _quiet(utils.create_ipu_config, profiling=True, report_directory=str(tmp_path))
    opts.auto_select_ipus = 1
    assert report_directory(opts.configure_ipu_system()) == str(tmp_path)
    assert report_directory(cfg.configure_ipu_system()) is None


def test_poplar_log_level_and_destination(monkeypatch, tmp_path):
    log = tmp_path / "poplar.log"
    monkeypatch.setenv("POPLAR_LOG_LEVEL", "INFO")
    monkeypatch.setenv("POPLAR_LOG_DEST", str(log))
    monkeypatch.setenv("POPLIBS_LOG_LEVEL", "OFF")
    try:
        cfg = IPUConfig()
        cfg.auto_select_ipus = 1
        cfg.configure_ipu_system()
        logging.getLogger("ipu_node.system").debug("not at INFO")
        logging.getLogger("collectives").error("POPLIBS is OFF")
        text = log.read_text()
        assert "POPLAR [I] Device /device:IPU:0 attached to IPU" in text
        assert "not at INFO" not in text and "POPLIBS" not in text
        monkeypatch.setenv("POPLAR_LOG_LEVEL", "LOUD")
        with pytest.raises(ipu_node.IPUConfigError, match="POPLAR_LOG_LEVEL='LOUD' is not a "
                                                          "Poplar log level"):
            flags.configure_logging()
    finally:
        for name in ("POPLAR_LOG_LEVEL", "POPLIBS_LOG_LEVEL", "POPLAR_LOG_DEST"):
            monkeypatch.delenv(name, raising=False)
        flags.configure_logging()
        for name in ("ipu_node", "collectives"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert logging.getLogger("ipu_node").propagate


def test_replication_index_takes_a_name_and_assume_equal_returns_the_values():
    from collectives import assume_equal_across_replicas, cross_replica_ops, replication_ops
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    system = cfg.configure_ipu_system()
    got = system.run_replicas(lambda: int(replication_ops.replication_index(name="r")),
                              [()] * 2, [{}] * 2)
    assert got == [0, 1]
    x = {"a": np.arange(3.0), "b": [np.ones(2)]}
    same = cross_replica_ops.assume_equal_across_replicas(x, inplace=True)
    assert same is x
    copied = assume_equal_across_replicas(x)
    assert copied["a"] is not x["a"] and np.array_equal(copied["a"], x["a"])
    assert isinstance(copied["b"], list)
