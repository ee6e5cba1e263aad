"""A warm start (`study start --warm-start-from`) on the simulated host, by the real command line:
what is carried and said, what the sampler does with it, a refusal, and a resume without the
source. The source is the recorded study (tests/helpers/sim_study.py): trial 0 an NCCL error
(NCCL_ALGO=Tree), trial 1 an OOM (mem_fraction_static 0.95), trial 2 measured (Ring, 0.92)."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import yaml

from autotune.config.space import load_space
from autotune.config.study import StudyConfig
from autotune.search.samplers import CrashAwareTPESampler
from autotune.study import warm_start
from tests.helpers.cli import autotune, show
from tests.helpers.sim_study import ALGO, MFS, RECORDED, RECORDED_LOAD, write_study

SPACE = {"NCCL_ALGO": ALGO, "mem_fraction_static": MFS}
HOST = "8x NVIDIA RTX PRO 6000 Blackwell Workstation Edition, pcie without P2P"


def _copy(recorded: Path, tmp: Path) -> Path:
    shutil.copy(recorded / "studies.db", tmp / "studies.db")
    return tmp


def test_a_warm_start_carries_the_hosts_facts_and_measures_the_best_first(recorded_study: Path, tmp_path: Path) -> None:
    tmp = _copy(recorded_study, tmp_path)
    cfg = write_study(tmp, "again", SPACE, baseline={"mem_fraction_static": 0.85}, trials=2, overrides=RECORDED_LOAD)
    proc = autotune("study", "start", str(cfg), "--warm-start-from", RECORDED, cwd=tmp)
    said = proc.stdout + proc.stderr
    assert f"warm start from study {RECORDED}: same host ({HOST}), same engine (sim), same model" in said, said
    assert "carried as facts: nccl-error (trials 0); oom (trials 1)" in said, said
    assert "to confirm: trial 2's whole configuration (mem_fraction_static=0.92)" in said, said

    doc = show(tmp, "again")
    first, hinted = doc["trials"]
    assert first["baseline"] and first["params"]["mem_fraction_static"] == 0.85
    assert hinted["params"] == {"NCCL_ALGO": "Ring", "mem_fraction_static": 0.92}, hinted
    assert hinted["proposed"]["by"] == "warm-start" and hinted["proposed"]["study"] == RECORDED
    assert hinted["proposed"]["trial"] == 2 and hinted["outcome"] == "ok"
    assert doc["warm_start"]["carried"] == {"failures": 2, "runs": 1}
    text = autotune("study", "show", "again", "--storage", f"sqlite:///{tmp}/studies.db", cwd=tmp).stdout
    assert "carried as facts" in text and f"study {RECORDED} trial 2's whole configuration" in text, text

    # The sampler reads the stored prior: NCCL_ALGO=Tree failed on this host; this study never ran it.
    study = optuna.load_study(study_name="again", storage=f"sqlite:///{tmp}/studies.db")
    prior = warm_start.restore(study.user_attrs[warm_start.ATTR]).prior
    tree = {"NCCL_ALGO": "Tree", "mem_fraction_static": 0.85}
    assert CrashAwareTPESampler(0, prior=prior).worth(study, tree) == 0.0
    assert CrashAwareTPESampler(0).worth(study, tree) == 1.0  # a cold start knows nothing of it


def test_the_study_s_own_run_outweighs_the_prior(recorded_study: Path, tmp_path: Path) -> None:
    """A region of the prior where this study measured a trial is weighed by this study alone."""
    tmp = _copy(recorded_study, tmp_path)
    cfg = write_study(tmp, "tree", SPACE, baseline={"NCCL_ALGO": "Tree", "mem_fraction_static": 0.85}, trials=1,
                      overrides=RECORDED_LOAD)
    autotune("study", "start", str(cfg), "--warm-start-from", RECORDED, cwd=tmp)
    study = optuna.load_study(study_name="tree", storage=f"sqlite:///{tmp}/studies.db")
    (baseline,) = study.trials
    prior = warm_start.restore(study.user_attrs[warm_start.ATTR]).prior
    if baseline.user_attrs.get("outcome") == "ok":  # Tree at 0.85 served here: the prior's region is lifted
        assert CrashAwareTPESampler(0, prior=prior).worth(study, {"NCCL_ALGO": "Tree", "mem_fraction_static": 0.8}) == 1.0
    else:  # Tree fails here too: the region stands
        assert baseline.user_attrs.get("failure_kind") == "nccl-error", baseline.user_attrs
        assert CrashAwareTPESampler(0, prior=prior).worth(study, {"NCCL_ALGO": "Tree", "mem_fraction_static": 0.8}) == 0.0


def test_a_source_on_another_host_is_refused_unless_forced(recorded_study: Path, tmp_path: Path) -> None:
    tmp = _copy(recorded_study, tmp_path)
    cfg = write_study(tmp, "elsewhere", SPACE, overrides=RECORDED_LOAD)
    data = yaml.safe_load(cfg.read_text())
    data["target"]["scenario"] = "h200-nvlink-llama70b"
    cfg.write_text(yaml.safe_dump(data))
    refused = autotune("study", "start", str(cfg), "--warm-start-from", RECORDED, cwd=tmp, check=False)
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"study '{RECORDED}' ran on another host" in line and "--force" in line, line
    storage = f"sqlite:///{tmp}/studies.db"
    assert "elsewhere" not in optuna.get_all_study_names(storage)  # refused before anything was written

    forced = autotune("study", "start", str(cfg), "--warm-start-from", RECORDED, "--force", cwd=tmp)
    said = forced.stdout + forced.stderr
    assert f"warm start from study {RECORDED}, forced: host: {HOST}, now 8x " in said, said
    assert "not carried: oom (trials 1)" in said, said  # another model: its memory boundary stays behind
    assert show(tmp, "elsewhere")["warm_start"]["sources"][0]["forced"] is True
    bad = autotune("study", "start", str(cfg), "--force", "--name", "x", cwd=tmp, check=False)
    assert bad.returncode == 2 and "--force is for --warm-start-from" in bad.stderr, bad.stderr


def test_another_model_is_not_hinted_the_source_s_memory_settings(recorded_study: Path, tmp_path: Path) -> None:
    """The source's best (Ring, 0.92) differs from this baseline in its memory setting alone: on
    the same model it is hinted; on another model, a setting the space declares monotone for OOM
    stays behind with the memory boundary, and nothing is left to hint (planned here, not run)."""
    tmp = _copy(recorded_study, tmp_path)
    space = {"NCCL_ALGO": ALGO, "mem_fraction_static": {**MFS, "monotone": {"oom": "up"}}}
    said = {}
    for name, scenario in (("same", None), ("kimi", "rtx6000-pcie-kimi-eagle3")):
        data = yaml.safe_load(write_study(tmp, name, space, baseline={"mem_fraction_static": 0.85}).read_text())
        data["target"]["scenario"] = scenario or data["target"]["scenario"]
        data["warm_start"] = [{"study": RECORDED}]
        cfg = StudyConfig.from_mapping(data)
        loaded = load_space(cfg.space)
        said[name] = "\n".join(warm_start.prepare_new(cfg, loaded, loaded.complete(cfg.baseline), {}).lines)
    assert "to confirm: trial 2's whole configuration (mem_fraction_static=0.92)" in said["same"], said["same"]
    assert "same host" in said["kimi"] and "another model" in said["kimi"], said["kimi"]
    assert "to confirm" not in said["kimi"] and "not carried: oom (trials 1)" in said["kimi"], said["kimi"]


def test_a_resume_reads_the_warm_start_without_its_source(recorded_study: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    _copy(recorded_study, source)
    cfg = write_study(tmp_path, "later", SPACE, baseline={"mem_fraction_static": 0.85}, trials=1, overrides=RECORDED_LOAD)
    autotune("study", "start", str(cfg), "--warm-start-from", f"{RECORDED}@sqlite:///{source}/studies.db", cwd=tmp_path)
    shutil.rmtree(source)
    proc = autotune("study", "resume", "later", "--trials", "2", "--storage", f"sqlite:///{tmp_path}/studies.db",
                    cwd=tmp_path)
    assert "warm start from" not in proc.stdout + proc.stderr  # said once, when it was planned
    doc = show(tmp_path, "later")
    assert [t["proposed"]["by"] if t["proposed"] else None for t in doc["trials"]] == [None, "warm-start"]
    assert doc["warm_start"]["carried"]["failures"] == 2


def test_a_missing_source_is_one_line(tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "orphan", SPACE, overrides=RECORDED_LOAD)
    proc = autotune("study", "start", str(cfg), "--warm-start-from", "nowhere", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "error: warm_start: no study named 'nowhere'" in proc.stderr, proc.stderr
