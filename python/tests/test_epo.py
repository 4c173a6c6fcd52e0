"""Tests of the Python module `epo` (python/epo_module.cpp), run by Debian's pytest."""
import json
import os
import pathlib

import pytest
import yaml

import epo

SOURCE = pathlib.Path(os.environ.get("EPO_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
QWEN = SOURCE / "tests" / "data" / "bridge-qwen3-30b-a3b-run_config.yaml"
TINY = "recipe: tiny-moe\nmodel:\n  expert_model_parallel_size: 2\ncomm:\n  gpus_per_node: 2\n"


def ids(findings):
    return [f["id"] for f in findings]


def test_validate_takes_yaml_text_and_returns_findings_as_dicts():
    findings = epo.validate(TINY)
    assert all(f["severity"] == "warning" for f in findings)
    assert all(set(f) == {"id", "field", "value", "message", "fix", "severity"} for f in findings)
    bad = epo.validate(TINY + "train:\n  global_batch_size: 3\n")
    errors = [f for f in bad if f["severity"] == "error"]
    assert "LY004" in ids(errors)
    f = errors[0]
    assert set(f) >= {"id", "field", "value", "message", "fix"}


def test_validate_takes_a_path_and_a_pathlike():
    assert not [f for f in epo.validate(str(QWEN)) if f["severity"] == "error"]
    assert not [f for f in epo.validate(QWEN) if f["severity"] == "error"]


def test_validate_takes_a_bridge_dict_as_to_dict_gives_it():
    config = yaml.safe_load(QWEN.read_text())
    assert "_target_" in config["model"]
    assert not [f for f in epo.validate(config) if f["severity"] == "error"]
    # MC001: 16 GPUs cannot hold ETP 1 x EP 32 x PP 1.
    findings = epo.validate(config, gpu="h100", num_gpus=16, gpus_per_node=4,
                            overrides=["model.expert_model_parallel_size=32"])
    assert "MC001" in ids(findings)


def test_errors_raise_with_the_clis_message():
    with pytest.raises(epo.Error, match="unknown key 'model.hiden_size'; did you mean"):
        epo.validate("model:\n  hiden_size: 3\n")
    with pytest.raises(ValueError, match="-ng/--num_gpus 12"):
        epo.validate(QWEN, gpu="h100", num_gpus=12)


def test_plan_is_the_same_as_the_clis_json():
    plan = epo.plan(QWEN, gpu="h100", num_gpus=16)
    assert plan["runs"][0]["name"] == "baseline"
    binary = os.environ.get("EPO_BIN")
    if binary:
        import subprocess
        out = subprocess.run([binary, "plan", str(QWEN), "-ng", "16", "-g", "h100", "--json"],
                             check=True, capture_output=True, text=True).stdout
        assert json.loads(out) == plan


def test_plan_carries_the_runtime_note_as_the_clis_json_does():
    plan = epo.plan(QWEN, gpu="h100", num_gpus=16,
                    overrides=["model.tensor_model_parallel_size=2",
                               "model.sequence_parallel=false"])
    assert plan["runtime"]["can_run_on_cpu"] is False
    # TP runs with sequence parallelism (the recipe's aux loss too); its MoE layers without it
    # do not (RT040).
    assert "RT040" in plan["runtime"]["gaps"]
    assert plan["runtime"]["note"].startswith("the epo runtime cannot run this configuration")
    assert plan["runtime"]["note"] in plan["validation"]["notes"]


def test_plan_of_an_invalid_config_raises():
    with pytest.raises(epo.Error, match="LY004"):
        epo.plan(TINY + "train:\n  global_batch_size: 3\n")


def test_load_run_reads_metrics_json(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"version": 1, "runs": []}))
    assert epo.load_run(tmp_path) == {"version": 1, "runs": []}
    with pytest.raises(epo.Error, match="no metrics.json"):
        epo.load_run(tmp_path / "missing")
