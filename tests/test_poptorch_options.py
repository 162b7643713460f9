"""poptorch.Options: the OptionsDict mechanics and the reference's option oracles
(poptorch reference §2, §11.12, §11.14)."""

import copy
import json

import pytest
import torch

import poptorch
from poptorch import enums


def test_setters_store_snake_case_keys_and_chain():
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    opts.Training.gradientAccumulation(4)
    assert (opts.device_iterations, opts.replication_factor) == (3, 2)
    assert opts.Training.gradient_accumulation == 4
    assert opts.Distributed.processId == 0 and opts.Distributed.numProcesses == 1


def test_construction_defaults():
    opts = poptorch.Options()
    assert opts.output_mode == enums.OutputMode.Default == 4
    assert opts.connection_type == 0 and opts.sync_pattern == 0 and opts.log_dir == "."
    assert opts.max_repeat_logs == 4 and opts.auto_round_num_ipus is False
    assert opts.Training.accumulation_and_replication_reduction_type == enums.ReductionType.Mean
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == \
        enums.MeanReductionStrategy.Post
    assert not opts.exists("random_seed")


def test_unknown_attribute_and_option_errors():
    with pytest.raises(AttributeError, match=r"^Invalid attribute fooBar\.$"):
        poptorch.Options().fooBar(1)
    with pytest.raises(AssertionError, match=r"Invalid option foo, valid options are dict_keys"):
        poptorch.Options().foo = 1
    with pytest.raises(AttributeError, match="Invalid private attribute _bar"):
        poptorch.Options()._bar = 1


def test_wrong_value_type_names_the_option():
    with pytest.raises(AssertionError) as info:
        poptorch.Options().deviceIterations(2.5)
    assert str(info.value) == ("Unexpected type <class 'float'> for option device_iterations. "
                               "Expected <class 'int'>")
    poptorch.Options().deviceIterations(True)  # isinstance: bool passes for int


def test_freezing_clone_and_deepcopy():  # reference §11.14
    opts = poptorch.Options()
    model = poptorch.trainingModel(torch.nn.Linear(2, 2), opts)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.randomSeed(42)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.Training.gradientAccumulation(2)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts._Popart.set("autoRecomputation", 3)
    assert opts.clone().deviceIterations(5).device_iterations == 5
    copied = copy.deepcopy(opts)
    copied.Distributed.configureProcessId(1, 3)
    copied.TensorLocations.setWeightLocation(
        poptorch.TensorLocationSettings().useIOTilesToStore(True))
    assert opts.Distributed.numProcesses == 1
    model.destroy()


def test_one_options_for_training_and_inference_resolves_output_modes():  # §11.12
    opts = poptorch.Options()
    training = poptorch.trainingModel(torch.nn.Linear(2, 2), opts)
    inference = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    assert training.options.output_mode == enums.OutputMode.Final
    assert inference.options.output_mode == enums.OutputMode.All
    assert opts.defaultOutputMode()


def test_to_dict_needs_an_output_mode():
    with pytest.raises(AssertionError, match="An output mode must be picked before serialisation"):
        poptorch.Options().toDict()
    merged = poptorch.Options().outputMode(enums.OutputMode.All).toDict()
    assert merged["output_mode"] == 2 and merged["gradient_accumulation"] == 1
    assert merged["rearrangeAnchorsOnHost"] is False


def test_output_mode_every_n_needs_a_period():
    with pytest.raises(AssertionError, match="EveryN anchor must have output_return_period"):
        poptorch.Options().outputMode(enums.OutputMode.EveryN)
    opts = poptorch.Options().outputMode(enums.OutputMode.EveryN, 5)
    assert (opts.output_mode, opts.output_return_period) == (1, 5)
    assert poptorch.Options().anchorMode(poptorch.AnchorMode.Sum).output_mode == 3


def test_reduction_type_and_group_setters_check_their_arguments():
    with pytest.raises(ValueError, match="must be set to poptorch.ReductionType.Mean or "
                                         "poptorch.ReductionType.Sum"):
        poptorch.Options().Training.accumulationAndReplicationReductionType(
            enums.ReductionType.NoReduction)
    with pytest.raises(ValueError, match="should be eithertorch.float or torch.half"):
        poptorch.Options().Precision.setPartialsType(torch.int32)
    with pytest.raises(AssertionError, match="enableFloatingPointExceptions needs to be set"):
        poptorch.Options().Precision.enableFloatingPointExceptions(1)
    with pytest.raises(AssertionError, match="numIOTiles must be an even number between 32"):
        poptorch.Options().TensorLocations.numIOTiles(33)
    with pytest.raises(AssertionError, match="Invalid key: GPU0"):
        poptorch.Options().setAvailableMemoryProportion({"GPU0": 0.5})
    with pytest.raises(ValueError, match=r"traceModel\(True\) is no longer supported"):
        poptorch.Options().Jit.traceModel(True)


def test_input_replica_grouping():  # §2.2
    opts = poptorch.Options().replicationFactor(4)
    with pytest.raises(ValueError, match="input_group_type cannot be All"):
        opts.inputReplicaGrouping(2, enums.CommGroupType.All)
    with pytest.raises(ValueError, match="must be a factor of replication_factor"):
        opts.inputReplicaGrouping(3, enums.CommGroupType.Consecutive)
    with pytest.raises(ValueError, match="cannot be larger than replication_factor"):
        opts.inputReplicaGrouping(8, enums.CommGroupType.Consecutive)
    opts.inputReplicaGrouping(4, enums.CommGroupType.NoGrouping)
    assert (opts.input_group_size, opts.input_cgt) == (1, enums.CommGroupType.Consecutive)


def test_random_seed_seeds_torch_and_creates_the_key():
    opts = poptorch.Options().randomSeed(123)
    first = torch.rand(3)
    poptorch.Options().randomSeed(123)
    assert torch.equal(first, torch.rand(3)) and opts.random_seed == 123


def test_popart_options_are_validated_lazily():  # §11.14
    opts = poptorch.Options()
    opts._Popart.set("asdfasdf", True)  # accepted now
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    with pytest.raises(poptorch.Error, match="Unknown bool option asdfasdf"):
        model(torch.zeros(1, 2))
    from poptorch.options._popart_options import validate
    with pytest.raises(poptorch.Error, match="Unknown uint64 option enableStableNorm"):
        validate({"enableStableNorm": 1})
    with pytest.raises(poptorch.Error, match="Unknown value type"):
        validate({"enableStableNorm": object()})
    validate({"enableStableNorm": True, "engineOptions": {}, "syntheticDataMode": 2})


def test_from_json_and_the_default_options_variable(monkeypatch):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", json.dumps({
        "deviceIterations": 2, "Precision.enableFloatingPointExceptions": True,
        "connectionType": "ConnectionType.OnDemand", "_Popart.set": ["enableStableNorm", True]}))
    opts = poptorch.Options()
    assert opts.device_iterations == 2 and opts.connection_type == 1
    assert opts._Popart.options["enableFloatingPointChecks"] is True
    assert opts._Popart.options["enableStableNorm"] is True


def test_load_from_file(tmp_path):
    path = tmp_path / "opts.conf"
    path.write_text("# comment\ndeviceIterations(3)\nTraining.gradientAccumulation(2)\n")
    opts = poptorch.Options().loadFromFile(str(path))
    assert opts.device_iterations == 3 and opts.Training.gradient_accumulation == 2
    path.write_text("deviceIterations(3\n")
    with pytest.raises(poptorch.ConfigFileError, match="SyntaxError at line 1 of opts.conf"):
        poptorch.Options().loadFromFile(str(path))


def test_enum_values():  # §2.6
    assert [m.value for m in enums.OutputMode] == [0, 1, 2, 3, 4]
    assert (enums.ReductionType.Sum, enums.ReductionType.Mean) == (0, 1)
    assert enums.ConnectionType.Never == 2 and enums.DataLoaderMode.AsyncRebatched == 2
    assert enums.CommGroupType.NoGrouping == 3 and enums.VariableRetrievalMode.AllReplicas == 2
    assert enums.MatMulSerializationMode.Disabled.value == "none"


def test_the_report_splits_acted_on_from_recorded_options():
    from poptorch.modelling._report import describe_options
    opts = poptorch.Options().deviceIterations(2).enableSyntheticData(True)
    opts.Precision.enableStochasticRounding(True)
    described = describe_options(opts)
    assert described["acted_on"]["device_iterations"] == 2
    assert described["not_acted_on"]["_Popart.syntheticDataMode"] == 2
    assert described["not_acted_on"]["_Popart.enableStochasticRounding"] is True


def test_distributed_defaults_read_open_mpi_then_the_launcher(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (3, 4)
    assert opts.Distributed.disable().numProcesses == 1
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "1")
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 2)
    monkeypatch.setenv("MY_N", "5")
    assert poptorch.Options().Distributed.setEnvVarNames("MY_N", "MY_ID").numProcesses == 5


def test_set_log_level():
    poptorch.setLogLevel("DEBUG")
    poptorch.setLogLevel(3)
    with pytest.raises(ValueError, match="Unknown log level: LOUD. Valid values are DEBUG, ERR, "
                                         "INFO, OFF, TRACE and WARN"):
        poptorch.setLogLevel("LOUD")
    poptorch.setLogLevel("WARN")


def test_the_run_report_lists_models_and_is_written_at_exit(tmp_path, monkeypatch):
    from poptorch.modelling import _report
    opts = poptorch.Options().enableStableNorm(True)
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    model(torch.zeros(1, 2))
    entry = [m for m in _report.report()["models"] if m["options"]["not_acted_on"]
             .get("_Popart.enableStableNorm")]
    assert entry and entry[-1]["attached"] and entry[-1]["sram_bytes"]
    monkeypatch.setenv("IPUPOD_REPORT_DIR", str(tmp_path / "out"))
    _report._write_at_exit()
    written = json.loads((tmp_path / "out" / "report-0.json").read_text())
    assert any(m["options"]["not_acted_on"].get("_Popart.enableStableNorm")
               for m in written["sections"]["poptorch"]["models"])
    model.destroy()
